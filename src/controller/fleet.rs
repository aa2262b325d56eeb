//! A fleet's hold on this cluster's rollouts (issue 73): the latest [`FleetSnapshot`] the
//! fleet loop read from Git (`runtime::fleet`), and this cluster's identity. A reconcile asks
//! whether its rollout may start its spec's new image; a new snapshot wakes the rollouts whose
//! reports changed (every rollout when the Fleet itself did).

use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;

use crate::api::{ClusterIdentity, RolloutAnalysis};
use crate::plan::fleet::changes::{FleetChange, fleet_change};
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

    /// Each new snapshot's change from the one before (never without a fleet).
    fn changes(&self) -> impl Stream<Item = FleetChange> + Send + 'static {
        let rx = self.snapshot.clone();
        futures::stream::unfold((rx, None), |(rx, last)| async move {
            let mut rx = rx?;
            rx.changed().await.ok()?;
            let now = rx.borrow_and_update().clone();
            let change = match &now {
                Some(s) => fleet_change(last.as_deref(), s),
                None => FleetChange::All,
            };
            Some((change, (Some(rx), now)))
        })
    }

    /// Fires when any rollout's answer may have changed: the Fleet itself, its clusters.
    pub fn changed_all(&self) -> impl Stream<Item = ()> + Send + 'static {
        self.changes()
            .filter_map(|c| async move { (c == FleetChange::All).then_some(()) })
    }

    /// The rollouts of kind `K` whose reports changed in a new snapshot (a status commit of
    /// some cluster): only these are looked at again.
    pub fn changed_rollouts<K>(&self) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
    where
        K: kube::Resource<DynamicType = ()> + 'static,
    {
        self.changes().flat_map(|c| {
            let refs: Vec<ObjectRef<K>> = match c {
                FleetChange::All => Vec::new(),
                FleetChange::Rollouts(ids) => ids
                    .into_iter()
                    .filter(|(kind, _, _)| kind == K::kind(&()).as_ref())
                    .map(|(_, ns, name)| ObjectRef::new(&name).within(&ns))
                    .collect(),
            };
            futures::stream::iter(refs)
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

    #[tokio::test]
    async fn a_status_commit_wakes_the_rollouts_whose_reports_changed_and_the_fleet_wakes_all() {
        use crate::api::CanaryDeployment;
        use crate::plan::fleet::Report;
        let (tx, rx) = watch::channel(None);
        let gates = FleetGates::new(ClusterIdentity::default(), rx);
        let mut rollouts = Box::pin(gates.changed_rollouts::<CanaryDeployment>());
        let mut all = Box::pin(gates.changed_all());
        let waves = "waves:\n- {name: a, clusters: [eu-1]}\n";
        let mut first = snapshot(waves);
        let id = |kind: &str, name: &str| (kind.to_string(), "shop".to_string(), name.to_string());
        let report = |phase: &str| Report {
            phase: phase.into(),
            ..Default::default()
        };
        for name in ["web", "api"] {
            first.reports.insert(
                id("CanaryDeployment", name),
                [("eu-1".into(), report("Completed"))].into(),
            );
        }
        tx.send_replace(Some(Arc::new(first.clone())));
        // The first read looks at every rollout (and is where the next change is told from).
        all.next().await.unwrap();
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), rollouts.next());
        assert!(quiet.await.is_err(), "the first read names no one rollout");
        let mut second = first.clone();
        second.reports.insert(
            id("CanaryDeployment", "web"),
            [("eu-1".into(), report("Progressing"))].into(),
        );
        second.reports.insert(
            id("CanaryStatefulSet", "db"),
            [("eu-1".into(), report("Stable"))].into(),
        );
        tx.send_replace(Some(Arc::new(second)));
        let woken = rollouts.next().await.unwrap();
        assert_eq!(
            (woken.name.as_str(), woken.namespace.as_deref()),
            ("web", Some("shop"))
        );
        // An approval in the Fleet: every rollout again.
        let mut third = first;
        third.spec.report_deadline_seconds = 30;
        tx.send_replace(Some(Arc::new(third)));
        all.next().await.unwrap();
    }
}
