//! Rollbacks of a CanaryDeployment: from the middle of batches, of a rolling update, and of
//! a version whose image cannot be read.

use super::*;
use BatchState::Finished;

#[test]
fn rollback_from_the_middle_of_batches_scales_the_old_version_back() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    s.spec.strategy.type_ = Strategy::Rollback;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    assert_eq!(s.deployments.len(), 1);
    let rb = s.status.rollback.clone().unwrap();
    assert_eq!(
        (rb.from_image.as_str(), rb.to_image.as_str(), rb.state),
        ("web:2", "web:1", Finished)
    );
}

#[test]
fn a_rolling_rollback_sets_the_image_back() {
    let mut s = Sim::new(Strategy::Rolling, 1, PauseMode::Never);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.completed_on("web:2");
    s.spec.strategy.type_ = Strategy::Rollback;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    assert!(s.deployments.contains_key("web"));
}

/// Regression (issue 71): a Deployment being drained in a rollback whose image could not be
/// read (no container of `spec.container`'s name) was applied with an empty image.
#[test]
fn a_rollback_scales_down_a_version_whose_image_cannot_be_read_without_touching_it() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    // The new version's container is not readable any more (renamed by hand).
    let new = s
        .deployments
        .values_mut()
        .find(|d| d.image.as_deref() == Some("web:2"))
        .unwrap();
    new.image = None;
    let new = new.name.clone();
    s.spec.strategy.type_ = Strategy::Rollback;
    let mut asked = Vec::new();
    for _ in 0..50 {
        let p = s.reconcile();
        asked.extend(p.actions.iter().map(Action::describe));
        for a in &p.actions {
            if let Action::ApplyDeployment(d) = a {
                let image = d
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .map(|p| p.containers[0].image.clone());
                assert_ne!(
                    image,
                    Some(Some(String::new())),
                    "applied with an empty image"
                );
            }
        }
        if s.phase() == Some(Phase::RolledBack) {
            break;
        }
        s.tick();
    }
    assert!(
        asked.contains(&format!("scale Deployment {new} to 0")),
        "{asked:#?}"
    );
    assert_eq!(s.phase(), Some(Phase::RolledBack));
}

/// Issue 72: an autoscaler sets `replicas` through `/scale`; the status gives `/scale` the
/// pods the rollout runs and a selector of all of them, and the batches follow the new count.
#[test]
fn an_autoscaled_count_is_followed_and_shown_to_scale() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    assert_eq!(s.status.replicas, 4);
    assert_eq!(
        s.status.selector.as_deref(),
        Some("rollouts.linnet.dev/rollout=web")
    );
    s.spec.replicas = 6;
    s.run_until("6 pods", |s| {
        s.status.replicas == 6 && s.by_image()["web:1"] == 6
    });
    s.spec.batches = 3;
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    let targets: Vec<i32> = s.status.batches.iter().map(|b| b.target).collect();
    assert_eq!(targets, [1, 3, 6], "three batches of 6");
    s.spec.replicas = 9;
    s.reconcile();
    let targets: Vec<i32> = s.status.batches.iter().map(|b| b.target).collect();
    assert_eq!(
        targets,
        [1, 4, 9],
        "the autoscaler's new count, mid-rollout"
    );
    s.spec.current_batch = 3;
    s.completed_on("web:2");
    assert_eq!(s.by_image()["web:2"], 9);
}

/// Issue 73: a fleet's hold keeps the serving version on its image, for a Completed rollout
/// and for a rolled-back one, until the wave may start the new image.
#[test]
fn a_fleet_hold_keeps_the_old_version_serving_until_the_wave_may_start() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::Never);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.fleet_hold = Some("wave eu waits for web:2 in eu-1 (canary: Progressing)".into());
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::Completed));
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    let message = s.status.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("web:2 held on web:1: wave eu waits"),
        "{message}"
    );
    s.fleet_hold = None;
    s.completed_on("web:2");

    s.spec.image = "web:3".into();
    s.run_until("Progressing", |s| s.phase() == Some(Phase::Progressing));
    s.spec.strategy.type_ = Strategy::Rollback;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    s.spec.strategy.type_ = Strategy::Batches;
    s.spec.image = "web:4".into();
    s.fleet_hold = Some("wave eu waits for web:4".into());
    for _ in 0..3 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::RolledBack));
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".into(), 4)]));
    s.fleet_hold = None;
    s.completed_on("web:4");
}

/// Regression (found by the blue-green proptest): the status is written before the actions,
/// so a `kill -9` after a rollback wrote RolledBack and before it deleted the emptied new
/// version left that Deployment (0 replicas) for good; RolledBack deletes it, as Completed
/// deletes a rollout's leftovers.
#[test]
fn a_rollback_cut_off_before_its_deletion_deletes_the_emptied_version_later() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    s.abort = Some("true".into());
    let mut cut_off = false;
    for _ in 0..100 {
        let p = s.plan();
        let deletes = p
            .actions
            .iter()
            .position(|a| matches!(a, Action::DeleteDeployment { .. }));
        if p.status.phase == Some(Phase::RolledBack)
            && let Some(at) = deletes
        {
            s.reconcile_partial(Some(at));
            cut_off = true;
            break;
        }
        s.reconcile();
        s.tick();
    }
    assert!(cut_off, "the rollback's deletion was never planned");
    s.tick();
    assert_eq!(s.deployments.len(), 2, "the leftover: {:?}", s.by_image());
    s.reconcile();
    s.tick();
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    assert_eq!(s.deployments.len(), 1);
}
