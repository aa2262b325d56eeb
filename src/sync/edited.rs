//! Rollouts whose spec in the cluster is not the one the sync applied from Git, as their
//! controllers find them (`rollouts.linnet.dev/spec-hash`): the source loop compares every
//! object at once and puts each such rollout's spec back whole ([`super::Syncer::restore_spec`]),
//! since server-side apply keeps fields that Git leaves out and someone else set.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::specs::ObjectKey;

/// The rollouts found edited, and a wake-up for the source loop.
#[derive(Debug, Default)]
pub struct EditedRollouts {
    keys: Mutex<BTreeSet<ObjectKey>>,
    wake: Notify,
}

impl EditedRollouts {
    /// A controller found rollout `key` edited in the cluster. One key per rollout: what this
    /// holds is bounded by the rollouts that exist.
    pub fn found(&self, key: ObjectKey) {
        if let Ok(mut keys) = self.keys.lock() {
            keys.insert(key);
        }
        self.wake.notify_one();
    }

    /// Resolves once a rollout was found edited since the last call.
    pub async fn notified(&self) {
        self.wake.notified().await;
    }

    /// The rollouts found edited, emptied.
    pub fn take(&self) -> Vec<ObjectKey> {
        self.keys
            .lock()
            .map(|mut keys| std::mem::take(&mut *keys).into_iter().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_rollout_found_edited_wakes_the_source_once_and_is_taken_once() {
        let edited = EditedRollouts::default();
        let key = ObjectKey::new(
            crate::api::API_VERSION,
            "CanaryStatefulSet",
            "shop",
            "redis",
        );
        edited.found(key.clone());
        edited.found(key.clone());
        tokio::time::timeout(std::time::Duration::from_secs(1), edited.notified())
            .await
            .unwrap_or_else(|_| panic!("not woken"));
        assert_eq!(edited.take(), vec![key]);
        assert!(edited.take().is_empty());
    }
}
