//! What a rollout's status counts and names (revisions, ready pods, conditions), phase by phase.

use super::*;

#[test]
fn status_names_the_revisions_during_a_canary() {
    let mut s = two_sets();
    s.stabilise();
    assert_eq!(s.status.stable_revision.as_deref(), Some("rev-redis:1"));
    assert_eq!(s.status.canary_revision, None);
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.reconcile();
    assert_eq!(s.status.canary_revision.as_deref(), Some("rev-redis:2"));
    assert_eq!(s.status.source_revision.as_deref(), Some("abc"));
}

#[test]
fn conditions_keep_their_transition_time_while_unchanged() {
    let mut s = two_sets();
    s.stabilise();
    let t1 = s.status.conditions.clone();
    s.tick();
    let p = s.reconcile();
    assert_eq!(p.status.conditions, t1);
    assert_eq!(p.status, s.status);
}

#[test]
fn handoff_claims_are_bound_by_volume_name_and_not_owned() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.image = "redis:2".into();
    let mut created = None;
    for _ in 0..50 {
        let p = s.reconcile();
        if let Some(Action::CreateClaim(c)) = p
            .actions
            .iter()
            .find(|a| matches!(a, Action::CreateClaim(_)))
        {
            created = Some(c.clone());
            break;
        }
        s.tick();
    }
    let c = created.expect("a handoff claim");
    assert_eq!(c.metadata.name.as_deref(), Some("data-redis-canary-2"));
    assert!(c.metadata.owner_references.is_none());
    let spec = c.spec.unwrap();
    assert!(spec.volume_name.is_some());
    assert_eq!(spec.storage_class_name.as_deref(), Some("local"));
}

/// Regression (issue 69): Failed mid-canary, `linnet get` said `0 canary ready` while the
/// canary pod was Ready, and the write-back subject `3 on redis:1` while 2 ran redis:1 and 1
/// ran redis:2. The counts come from what the pods run, in every phase.
#[test]
fn a_failed_canary_counts_what_its_pods_run() {
    use crate::api::{CanaryStatefulSet, RolloutView};
    for mut s in [partition(), two_sets()] {
        s.stabilise();
        let stable = CanaryStatefulSet {
            metadata: Default::default(),
            spec: s.spec.clone(),
            status: Some(s.status.clone()),
        };
        assert_eq!(stable.serving(), "3 on redis:1");
        s.spec.image = "redis:2".into();
        s.generation += 1;
        s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
        s.spec.container = Some("sidecar".into());
        s.generation += 1;
        let p = s.reconcile();
        assert_eq!(p.status.phase, Some(Phase::Failed));
        // The set's revision moves on under the Failed rollout (its template changed): its
        // canary pod no longer runs the update revision, but still runs the canary image.
        let single = s.sets.get_mut("redis").map(|set| {
            set.image = "redis:2-patched".into();
            set.hash = "patched".into();
        });
        let p = if single.is_some() { s.reconcile() } else { p };
        assert_eq!(p.status.phase, Some(Phase::Failed));
        let running = |image: &str| {
            s.pods
                .values()
                .filter(|p| p.ready && p.image.as_deref() == Some(image))
                .count() as i32
        };
        assert_eq!(
            (running("redis:1"), running("redis:2")),
            (2, 1),
            "{:?}",
            s.pods
        );
        assert_eq!(p.status.canary_ready_replicas, 1);
        let r = CanaryStatefulSet {
            metadata: Default::default(),
            spec: s.spec.clone(),
            status: Some(p.status.clone()),
        };
        assert_eq!(r.serving(), "2 on redis:1, 1 on redis:2");
        assert_eq!(r.canary_ready_replicas(), Some(1));
    }
}

/// Issue 72: `/scale` reads `status.replicas` and `status.selector`; an autoscaler's new
/// count is run and shown.
#[test]
fn status_gives_scale_the_pods_run_and_their_selector() {
    let mut s = two_sets();
    s.stabilise();
    assert_eq!(s.status.replicas, s.spec.replicas);
    assert_eq!(
        s.status.selector.as_deref(),
        Some("rollouts.linnet.dev/rollout=redis")
    );
    s.spec.replicas -= 1;
    let want = s.spec.replicas;
    s.run_until("the new count", |s| {
        s.status.replicas == want && s.status.ready_replicas == want
    });
}
