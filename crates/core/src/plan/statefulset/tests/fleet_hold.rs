//! A fleet's hold on a CanaryStatefulSet (issue 73).

use super::*;

/// Issue 73: while a fleet holds the spec's new image, the stable set stays on its image and
/// says why; once the hold lifts, the canary starts as it would have. The same after a
/// rollback: the next image waits for its wave too.
#[test]
fn a_fleet_hold_keeps_the_stable_set_until_the_wave_may_start() {
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.fleet_hold = Some("wave eu waits for redis:2 in eu-1 (canary: CanaryActive)".into());
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::Stable));
    assert!(!s.sets.contains_key("redis-canary"));
    assert_eq!(s.sets["redis-stable"].image, "redis:1");
    let message = s.status.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("redis:2 held on redis:1: wave eu waits"),
        "{message}"
    );
    s.fleet_hold = None;
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(s.status.canary_image.as_deref(), Some("redis:2"));

    s.spec.image = "redis:1".into();
    s.run_until("Stable on 1", |s| s.phase() == Some(Phase::Stable));
    s.spec.progress_deadline_seconds = 20;
    s.spec.image = "redis:broken".into();
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    s.spec.image = "redis:3".into();
    s.fleet_hold = Some("wave eu waits for redis:3".into());
    for _ in 0..3 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::RolledBack));
    assert!(!s.sets.contains_key("redis-canary"));
    assert_eq!(s.volumes_by_ordinal(), before);
}
