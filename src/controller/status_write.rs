//! Writing a rollout's status: only when it changed, never twice from the same version
//! ([`OwnStatusWrites`]), and with a failed action shown on it.

use super::{Context, Doing, ReconcileError};

/// Writes the planned status with the action that failed marked in it (Stalled, reason
/// ActionFailed, for a refusal; still Reconciling, reason ActionRetrying, for what clears by
/// itself), and hands back the failure for the reconcile to return.
pub(crate) async fn show_action_failure<K, S>(
    ctx: &Context,
    rollout: &K,
    kind: &str,
    planned: &S,
    action: &crate::plan::Action,
    failure: ReconcileError,
    now: jiff::Timestamp,
) -> ReconcileError
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    S: crate::plan::RolloutStatus + Clone + serde::Serialize + PartialEq,
{
    let mut blocked = planned.clone();
    crate::plan::mark_action_failed(
        &mut blocked,
        &action.describe(),
        &failure.failure(),
        failure.permanent(),
        now,
    );
    match write_status(ctx, rollout, kind, Some(planned), &blocked, &[]).await {
        Ok(_) => failure,
        Err(e) => e,
    }
}

/// What [`write_status`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusWrite {
    /// The status was already what the plan says.
    Unchanged,
    /// The status was written.
    Written,
    /// The store has not yet seen this agent's last write, and the plan repeats it: nothing
    /// was written, and the plan's events were already published with that write.
    Repeated,
    /// A new rollout's first status, left for later ([`crate::plan::first_status`]).
    Deferred,
}

/// Writes a rollout's whole status in one JSON patch (`add /status`: fields it no longer has
/// are gone), unless it is unchanged. Not a server-side apply: the API server decodes an apply
/// as YAML and merges it field by field, about a third of a status write's CPU there, and
/// only linnet writes these statuses (issue 51). Called before a plan's actions run: the recorded phase is never
/// behind what was done, so a crash in between only means doing the actions again.
///
/// `rollout` is the object the plan was made from. A reconcile woken by a child's event can
/// start before the watch has delivered this agent's previous status write; it then plans the
/// same transition again, and [`OwnStatusWrites`] keeps it from writing and announcing it twice.
/// `events`, the plan's, are published just before the write, each once ([`announce_once`]).
pub(crate) async fn write_status<K, S>(
    ctx: &Context,
    rollout: &K,
    kind: &str,
    old: Option<&S>,
    new: &S,
    events: &[crate::plan::PlanEvent],
) -> Result<StatusWrite, ReconcileError>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    S: serde::Serialize + PartialEq,
{
    let name = rollout.meta().name.clone().unwrap_or_default();
    let ns = rollout.meta().namespace.clone().unwrap_or_default();
    let key = format!("{kind}/{ns}/{name}");
    if old == Some(new) {
        // The store shows this status: any write of ours has come back.
        ctx.own_status_writes.forget(&key);
        return Ok(StatusWrite::Unchanged);
    }
    let planned_from = rollout.meta().resource_version.clone().unwrap_or_default();
    let digest = status_digest(new);
    if ctx.own_status_writes.repeats(&key, &planned_from, digest) {
        return Ok(StatusWrite::Repeated);
    }
    let patch = whole_status_patch(new)
        .map_err(kube::Error::SerdeError)
        .doing(|| format!("serializing the status of {kind} {ns}/{name}"))?;
    announce_once(ctx, rollout, old, events).await;
    let api: kube::Api<K> = kube::Api::namespaced(ctx.client.clone(), &ns);
    api.patch_status(
        &name,
        &kube::api::PatchParams {
            field_manager: Some(crate::sync::FIELD_MANAGER.to_string()),
            ..Default::default()
        },
        &kube::api::Patch::<()>::Json(patch),
    )
    .await
    .doing(|| format!("writing the status of {kind} {ns}/{name}"))?;
    ctx.own_status_writes.record(&key, &planned_from, digest);
    Ok(StatusWrite::Written)
}

/// Publishes a plan's events (a phase change's) each exactly once, before the status that
/// records the change is written: a `kill -9` after the write would lose them, and one
/// before it has the next leader plan the same change from the same status again. Each is
/// keyed by that status, which only a status write changes, so the second publish is refused.
pub(crate) async fn announce_once<K, S>(
    ctx: &Context,
    rollout: &K,
    old: Option<&S>,
    events: &[crate::plan::PlanEvent],
) where
    K: kube::Resource<DynamicType = ()>,
    S: serde::Serialize,
{
    if events.is_empty() {
        return;
    }
    let object = rollout.object_ref(&());
    let from = serde_json::to_vec(&old).unwrap_or_default();
    let name = rollout.meta().name.as_deref().unwrap_or_default();
    let ns = rollout.meta().namespace.as_deref().unwrap_or_default();
    for (i, e) in events.iter().enumerate() {
        tracing::info!(rollout = %format!("{ns}/{name}"), reason = e.reason, "{}", e.message);
        let key = [from.as_slice(), &(i as u64).to_be_bytes()].concat();
        ctx.recorder
            .publish_once(&object, &key, e.warning, e.reason, &e.message)
            .await;
    }
}

/// Whether `rollout` (from the store) predates a status this agent has written: a reconcile
/// woken before the watch delivered that write sees an older status. Measuring from it would
/// take again a measurement already recorded.
pub(crate) fn status_write_pending<K: kube::Resource>(
    ctx: &Context,
    kind: &str,
    rollout: &K,
) -> bool {
    let meta = rollout.meta();
    let key = format!(
        "{kind}/{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    );
    ctx.own_status_writes
        .pending(&key, meta.resource_version.as_deref().unwrap_or_default())
}

/// The JSON patch that sets `status` whole, whether the object has one or not (`add` replaces
/// a member that exists).
fn whole_status_patch(status: &impl serde::Serialize) -> serde_json::Result<json_patch::Patch> {
    serde_json::from_value(serde_json::json!([
        {"op": "add", "path": "/status", "value": status}
    ]))
}

fn status_digest(status: &impl serde::Serialize) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(status)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// The last status this agent wrote to each rollout, with the resourceVersion of the object it
/// was planned from. While a rollout's store still shows that version, the write has not come
/// back through the watch yet, and writing the same status again would change nothing.
#[derive(Debug, Default)]
pub struct OwnStatusWrites {
    last: std::sync::Mutex<std::collections::HashMap<String, (String, u64)>>,
}

impl OwnStatusWrites {
    /// True if the status with `digest`, planned from `planned_from`, is the one last written
    /// from that same version. An entry for an older version is dropped: once the store moves
    /// past it, it never matches again.
    pub fn repeats(&self, key: &str, planned_from: &str, digest: u64) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        match last.get(key) {
            Some((from, d)) if from == planned_from => *d == digest,
            Some(_) => {
                last.remove(key);
                false
            }
            None => false,
        }
    }

    /// Drops what is known of `key`'s last write, once the store shows it: entries are kept
    /// only while a write is on its way back, not for every rollout ever written.
    pub fn forget(&self, key: &str) {
        if let Ok(mut last) = self.last.lock() {
            last.remove(key);
        }
    }

    /// Whether a status this agent wrote from version `planned_from` is still on its way
    /// back: the store's object (at that version) is older than the status written.
    pub fn pending(&self, key: &str, planned_from: &str) -> bool {
        self.last
            .lock()
            .is_ok_and(|last| last.get(key).is_some_and(|(from, _)| from == planned_from))
    }

    /// Remembers a status written from version `planned_from`.
    pub fn record(&self, key: &str, planned_from: &str, digest: u64) {
        if let Ok(mut last) = self.last.lock() {
            last.insert(key.to_string(), (planned_from.to_string(), digest));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_written_whole_in_one_add() {
        let patch = whole_status_patch(&serde_json::json!({"phase": "Stable"}))
            .map(|p| serde_json::to_value(p).unwrap_or_default())
            .unwrap_or_default();
        assert_eq!(
            patch,
            serde_json::json!([{"op": "add", "path": "/status", "value": {"phase": "Stable"}}])
        );
    }

    #[test]
    fn a_status_planned_again_from_the_same_version_is_a_repeat() {
        let writes = OwnStatusWrites::default();
        assert!(!writes.repeats("r", "100", 1), "nothing written yet");
        writes.record("r", "100", 1);
        assert!(
            writes.repeats("r", "100", 1),
            "store still at 100: same status"
        );
        assert!(
            !writes.repeats("r", "100", 2),
            "store still at 100, but the plan changed: write it"
        );
        assert!(!writes.repeats("other", "100", 1), "another rollout");
    }

    #[test]
    fn once_the_store_moves_on_the_entry_is_dropped() {
        let writes = OwnStatusWrites::default();
        writes.record("r", "100", 1);
        assert!(
            !writes.repeats("r", "101", 1),
            "the write came back: compare as usual"
        );
        assert!(
            !writes.repeats("r", "100", 1),
            "the entry is gone, even for a version seen before"
        );
        assert!(writes.last.lock().map(|m| m.is_empty()).unwrap_or(false));
    }

    #[test]
    fn an_entry_is_forgotten_once_the_store_shows_the_write() {
        let writes = OwnStatusWrites::default();
        writes.record("r", "100", 1);
        writes.record("other", "7", 2);
        writes.forget("r");
        assert!(!writes.repeats("r", "100", 1));
        assert!(
            writes.repeats("other", "7", 2),
            "only that rollout's entry goes"
        );
    }
}
