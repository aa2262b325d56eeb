//! A fleet's hold on this cluster's rollouts (issue 73): the latest [`FleetSnapshot`] the
//! fleet loop read from Git (`runtime::fleet`), and this cluster's identity. A reconcile asks
//! whether its rollout may start its spec's new image; each new snapshot wakes every rollout.

use std::sync::Arc;

use futures::Stream;
use tokio::sync::watch;

use crate::api::{ClusterIdentity, RolloutAnalysis};
use crate::plan::fleet::{FleetSnapshot, Gate, Hold, HoldReason, with_wave_analysis};

/// The latest snapshot, `None` until the first read of Git.
pub type SnapshotReceiver = watch::Receiver<Option<Arc<FleetSnapshot>>>;

pub struct FleetGates {
    pub cluster: ClusterIdentity,
    /// `None`: this agent is in no fleet (`--fleet` not given).
    snapshot: Option<SnapshotReceiver>,
}

impl FleetGates {
    /// No fleet: nothing is ever held.
    pub fn off(cluster: ClusterIdentity) -> FleetGates {
        FleetGates {
            cluster,
            snapshot: None,
        }
    }

    pub fn new(cluster: ClusterIdentity, snapshot: SnapshotReceiver) -> FleetGates {
        FleetGates {
            cluster,
            snapshot: Some(snapshot),
        }
    }

    /// Why rollout `kind` `namespace/name`, whose spec asks for `image`, may not start it here
    /// now; `None` when it may. Until the fleet has been read, every new image waits: an agent
    /// restarted mid-wave must not start what its wave may not.
    pub fn hold(
        &self,
        (kind, namespace, name): (&str, &str, &str),
        image: &str,
        now: jiff::Timestamp,
    ) -> Option<Hold> {
        let snapshot = self.snapshot.as_ref()?.borrow().clone();
        let Some(snapshot) = snapshot else {
            return Some(Hold {
                wave: String::new(),
                reason: HoldReason::EarlierWave,
                message: "the fleet has not been read from Git yet".into(),
                recheck_at: None,
            });
        };
        match snapshot.gate(&self.cluster, (kind, namespace, name), image, now) {
            Gate::Hold(h) => Some(h),
            Gate::Open { .. } | Gate::Free(_) => None,
        }
    }

    /// Rollout analysis `own` with the analysis of this cluster's wave joined to it (to the
    /// gate after step `last_gate`), when the fleet has one for rollout `key`; else `own`.
    pub fn analysis<'a>(
        &self,
        key: (&str, &str, &str),
        own: Option<&'a RolloutAnalysis>,
        last_gate: Option<i32>,
    ) -> Option<std::borrow::Cow<'a, RolloutAnalysis>> {
        let snapshot = self.snapshot.as_ref().and_then(|s| s.borrow().clone());
        let wave = snapshot
            .as_ref()
            .and_then(|s| s.wave_analysis(&self.cluster, key));
        match wave {
            Some(w) => Some(std::borrow::Cow::Owned(with_wave_analysis(
                own, w, last_gate,
            ))),
            None => own.map(std::borrow::Cow::Borrowed),
        }
    }

    /// The fleet's snapshots as they are read (`None` without a fleet), for the reverts.
    pub fn snapshots(&self) -> Option<SnapshotReceiver> {
        self.snapshot.clone()
    }

    /// Fires on every new snapshot (never without a fleet).
    pub fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.snapshot.clone();
        futures::stream::unfold(rx, |rx| async move {
            let mut rx = rx?;
            rx.changed().await.ok()?;
            Some(((), Some(rx)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(yaml: &str) -> FleetSnapshot {
        FleetSnapshot {
            name: "shop".into(),
            spec: serde_saphyr::from_str(yaml).unwrap(),
            ..Default::default()
        }
    }

    #[test]
    fn a_fleet_not_read_yet_holds_every_new_image_and_no_fleet_holds_none() {
        let me = ClusterIdentity {
            name: "eu-2".into(),
            ..Default::default()
        };
        let key = ("CanaryDeployment", "shop", "web");
        let now = jiff::Timestamp::UNIX_EPOCH;
        assert_eq!(FleetGates::off(me.clone()).hold(key, "web:2", now), None);
        let (tx, rx) = watch::channel(None);
        let gates = FleetGates::new(me, rx);
        let hold = gates.hold(key, "web:2", now).unwrap();
        assert!(hold.message.contains("not been read"), "{}", hold.message);
        let waves = "waves:\n- {name: a, clusters: [eu-1]}\n- {name: b, clusters: [eu-2]}\n";
        tx.send_replace(Some(Arc::new(snapshot(waves))));
        let hold = gates.hold(key, "web:2", now).unwrap();
        assert_eq!(hold.reason, HoldReason::EarlierWave);
        assert!(
            hold.message.contains("eu-1 (a: no status yet)"),
            "{}",
            hold.message
        );
    }
}
