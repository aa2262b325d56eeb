//! Baseline pods (`strategy.baseline`): started with each batch on the stable image, as many
//! as the batch's new pods, waited for, never taken for the stable version, and deleted when
//! the rollout ends, rolls back or stops asking for them.

use super::*;

fn with_baseline() -> Sim {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::Never);
    s.spec.strategy.baseline = true;
    s.completed_on("web:1");
    s
}

fn baseline(s: &Sim) -> Option<(String, i32)> {
    s.deployments
        .get("web-baseline")
        .map(|d| (d.image.clone().unwrap_or_default(), d.replicas))
}

#[test]
fn a_baseline_starts_with_each_batch_on_the_stable_image_and_goes_at_the_end() {
    let mut s = with_baseline();
    assert_eq!(baseline(&s), None, "no baseline at rest");
    s.spec.image = "web:2".into();
    let mut seen = Vec::new();
    for _ in 0..60 {
        s.reconcile();
        s.tick();
        let now = (s.status.current_batch, baseline(&s));
        if now.1.is_some() && seen.last() != Some(&now) {
            seen.push(now);
        }
        if s.phase() == Some(Phase::Completed) {
            break;
        }
    }
    assert_eq!(s.phase(), Some(Phase::Completed));
    assert_eq!(
        seen,
        vec![
            (Some(1), Some(("web:1".to_string(), 1))),
            (Some(2), Some(("web:1".to_string(), 4))),
        ],
        "the baseline is the stable image, as many as each batch's new pods"
    );
    assert_eq!(baseline(&s), None, "deleted once the rollout completed");
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".into(), 4)]));
    assert_eq!(s.status.stable_image.as_deref(), Some("web:2"));
}

#[test]
fn a_batch_waits_for_its_baseline() {
    let mut s = with_baseline();
    s.spec.image = "web:2".into();
    s.run_until("the baseline made", |s| baseline(s).is_some());
    // Its pods do not come up: the batch waits, and says for what.
    for _ in 0..3 {
        if let Some(d) = s.deployments.get_mut("web-baseline") {
            d.available = 0;
        }
        s.reconcile();
        assert_eq!(s.status.current_batch, Some(1));
        assert!(
            s.status
                .message
                .as_deref()
                .unwrap_or_default()
                .contains("baseline: 0/1 replica(s) on web:1 available"),
            "{:?}",
            s.status.message
        );
    }
    s.tick();
    s.completed_on("web:2");
}

#[test]
fn an_abort_at_either_batch_deletes_the_baseline_and_serves_the_stable_version() {
    for batch in [1, 2] {
        let mut s = with_baseline();
        s.spec.image = "web:2".into();
        s.run_until("the batch's baseline ready", |s| {
            s.status.current_batch == Some(batch)
                && s.deployments
                    .get("web-baseline")
                    .is_some_and(|d| d.available == batch::target(4, 2, batch))
        });
        s.abort = Some("true".into());
        s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
        assert_eq!(baseline(&s), None, "batch {batch}");
        assert_eq!(
            s.by_image(),
            BTreeMap::from([("web:1".into(), 4)]),
            "batch {batch}"
        );
        // The stable version is its own Deployment, not the baseline renamed.
        assert!(s.deployments.keys().all(|name| name != "web-baseline"));
    }
}

#[test]
fn a_baseline_no_longer_asked_for_is_deleted_and_the_rollout_goes_on() {
    let mut s = with_baseline();
    s.spec.image = "web:2".into();
    s.run_until("the baseline made", |s| baseline(s).is_some());
    s.spec.strategy.baseline = false;
    let p = s.reconcile_partial(Some(usize::MAX));
    assert!(
        p.actions.contains(&Action::DeleteDeployment {
            name: "web-baseline".into()
        }),
        "{:?}",
        p.actions
    );
    s.tick();
    s.completed_on("web:2");
    assert_eq!(baseline(&s), None);
}

#[test]
fn a_rolling_update_never_makes_a_baseline() {
    let mut s = Sim::new(Strategy::Rolling, 1, PauseMode::Never);
    s.spec.strategy.baseline = true;
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.completed_on("web:2");
    assert!(s.max_asked.keys().all(|name| name != "web-baseline"));
}

#[test]
fn the_baseline_selector_selects_the_baseline_pods_or_else_the_stable_ones() {
    let mut s = with_baseline();
    s.spec.image = "web:2".into();
    s.run_until("Progressing", |s| s.phase() == Some(Phase::Progressing));
    let b = analysis_builtins("web", "ns", &s.spec, &s.status);
    assert_eq!(
        b.baseline_selector.as_deref(),
        Some("rollouts.linnet.dev/rollout=web,rollouts.linnet.dev/version=baseline")
    );
    s.spec.strategy.baseline = false;
    let b = analysis_builtins("web", "ns", &s.spec, &s.status);
    assert_eq!(b.baseline_selector, b.stable_selector);
    assert!(b.baseline_selector.is_some());
}

#[test]
fn a_baseline_that_never_becomes_available_meets_the_deadline_by_its_name() {
    let mut s = with_baseline();
    s.spec.rollback_on_failure = true;
    s.spec.image = "web:2".into();
    s.run_until("the baseline made", |s| baseline(s).is_some());
    // Its pods never come up (no room for them, say): the deadline, naming them, rolls back.
    let mut message = String::new();
    for _ in 0..700 {
        if s.phase() != Some(Phase::Progressing) {
            break;
        }
        s.now += jiff::SignedDuration::from_secs(1);
        if let Some(d) = s.deployments.get_mut("web-baseline") {
            d.available = 0;
            d.status_fresh = true;
        }
        let p = s.reconcile();
        if let Some(e) = p
            .events
            .iter()
            .find(|e| e.reason == "ProgressDeadlineExceeded")
        {
            message = e.message.clone();
        }
    }
    assert_eq!(s.phase(), Some(Phase::RollingBack), "{message}");
    assert!(
        message
            .contains("baseline pods on web:1 were not available within progressDeadlineSeconds"),
        "{message}"
    );
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(baseline(&s), None);
}
