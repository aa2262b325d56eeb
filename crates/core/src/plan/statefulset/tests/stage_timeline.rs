//! `status.stages`: the canary's timeline, as whole rollouts in the model write it.

use super::*;
use crate::api::Stage;

/// Each stage as `stage step: opened_by -> closed_by`.
fn timeline(s: &Sim) -> Vec<String> {
    s.status
        .stages
        .iter()
        .map(|st| {
            let step = st.step.map(|n| format!(" {n}")).unwrap_or_default();
            format!(
                "{:?}{step}: {} -> {}",
                st.stage,
                st.opened_by,
                st.closed_by.as_deref().unwrap_or("open")
            )
        })
        .collect()
}

#[test]
fn a_stepped_canary_records_each_step_and_its_promotion() {
    let mut s = two_sets();
    s.spec.canary_replicas = 2;
    s.spec.steps = Some(vec![1, 2]);
    s.stabilise();
    assert!(s.status.stages.is_empty(), "no canary yet");
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(
        timeline(&s),
        [
            "Step 1: CanaryStarted -> StepComplete",
            "Step 2: StepComplete -> open"
        ]
    );
    let first = &s.status.stages[0];
    assert_eq!(first.canary_replicas, Some(1));
    assert_eq!(first.commit.as_deref(), Some("abc"));
    assert!(first.detail.contains("redis:2"), "{}", first.detail);
    assert!(first.finished_at.as_ref().unwrap().0 >= first.started_at.0);
    assert_eq!(s.status.stages[1].canary_replicas, Some(2));
    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(
        timeline(&s),
        [
            "Step 1: CanaryStarted -> StepComplete",
            "Step 2: StepComplete -> PromotionStarted",
            "Promotion: PromotionStarted -> Promoted"
        ]
    );
    // Stable again: the last canary's timeline stays until the next starts, unchanged.
    let kept = s.status.stages.clone();
    s.reconcile();
    assert_eq!(s.status.stages, kept);
}

#[test]
fn a_broken_canary_records_why_it_rolled_back() {
    let mut s = two_sets();
    s.spec.progress_deadline_seconds = 20;
    s.stabilise();
    s.spec.image = "redis:broken".into();
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(
        timeline(&s),
        [
            "Step 1: CanaryStarted -> ProgressDeadlineExceeded",
            "Rollback: ProgressDeadlineExceeded -> RolledBack"
        ]
    );
}

#[test]
fn the_next_canary_starts_a_new_timeline() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.spec.image = "redis:3".into();
    s.run_until("CanaryActive on 3", |s| {
        s.phase() == Some(Phase::CanaryActive)
            && s.status.canary_image.as_deref() == Some("redis:3")
    });
    assert_eq!(timeline(&s), ["Step 1: CanaryStarted -> open"]);
    assert!(s.status.stages[0].detail.contains("redis:3"));
}

#[test]
fn a_migration_is_its_own_stage() {
    let mut s = two_sets();
    s.spec.migration = Some(Box::new(Migration {
        template: serde_json::from_value(serde_json::json!({
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "migrate", "image": "migrate:1"}]}}}
        }))
        .unwrap(),
    }));
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.promote = Some("true".into());
    s.stabilise();
    let stages: Vec<Stage> = s.status.stages.iter().map(|st| st.stage).collect();
    assert_eq!(stages, [Stage::Step, Stage::Migration, Stage::Promotion]);
    assert!(s.status.stages.iter().all(|st| st.finished_at.is_some()));
}

/// The charts' points: the ready pods of each image as they changed, from the canary's start.
#[test]
fn the_series_follows_the_ready_pods_of_each_image_from_the_canarys_start() {
    let mut s = two_sets();
    s.spec.canary_replicas = 2;
    s.spec.steps = Some(vec![1, 2]);
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    let canary_ready: Vec<i32> = s
        .status
        .series
        .iter()
        .map(|p| {
            p.ready
                .iter()
                .find(|r| r.image == "redis:2")
                .map_or(0, |r| r.replicas)
        })
        .collect();
    assert_eq!(canary_ready.first(), Some(&0), "{:?}", s.status.series);
    assert_eq!(canary_ready.last(), Some(&2), "{:?}", s.status.series);
    assert!(
        canary_ready.contains(&1),
        "step 1 is a point: {canary_ready:?}"
    );
    assert!(
        s.status
            .series
            .windows(2)
            .all(|w| w[0] != w[1] && w[0].at.0 <= w[1].at.0),
        "a point per change, in order"
    );
    assert!(s.status.series[0].at.0 >= s.status.stages[0].started_at.0);
    s.promote = Some("true".into());
    s.stabilise();
    let last = s.status.series.last().unwrap();
    assert_eq!(
        last.ready,
        vec![crate::api::ImageReplicas {
            image: "redis:2".into(),
            replicas: 3
        }]
    );
    // A stable rollout adds nothing, scaled or not; a new canary starts a new series.
    let kept = s.status.series.clone();
    s.reconcile();
    assert_eq!(s.status.series, kept);
    s.spec.replicas = 4;
    s.stabilise();
    assert_eq!(
        s.status.series, kept,
        "a scale of a settled rollout is no canary's point"
    );
    s.spec.replicas = 3;
    s.stabilise();
    s.spec.image = "redis:3".into();
    s.run_until("CanaryActive on 3", |s| {
        s.phase() == Some(Phase::CanaryActive)
    });
    assert!(
        s.status
            .series
            .iter()
            .all(|p| p.at.0 >= s.status.stages[0].started_at.0)
    );
}
