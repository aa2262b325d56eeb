//! Every phase transition, walked through on the simulated cluster.

use super::*;

/// Regression: a first sync wrote each new rollout's status again when the StatefulSet
/// controller gave its set a revision, and when a pod was ready before the set said so.
#[test]
fn a_new_rollouts_status_changes_only_with_its_sets_ready_count() {
    let mut s = two_sets();
    s.spec.image = "redis:broken".into();
    let first = s.reconcile();
    assert_eq!(first.status.phase, Some(Phase::Initializing));
    s.tick();
    let observed = s.observed();
    assert!(observed.stable.as_ref().unwrap().current_revision.is_some());
    assert_eq!(observed.pods.len(), 1);
    let second = s.reconcile();
    assert_eq!(second.status, first.status, "nothing it shows has changed");
    assert_eq!(second.status.stable_revision, None);
}

#[test]
fn initializing_counts_ready_replicas_from_its_set_without_the_pods() {
    let mut s = two_sets();
    s.reconcile();
    s.tick();
    let mut observed = s.observed();
    assert_eq!(observed.stable.as_ref().unwrap().ready_replicas, 1);
    observed.pods.clear();
    let p = plan(&s.rollout(), &observed, s.now);
    assert_eq!(p.status.phase, Some(Phase::Initializing));
    assert_eq!(p.status.ready.as_deref(), Some("1/3"));
    assert_eq!(p.status.ready_replicas, 1);
}

#[test]
fn only_a_plan_that_starts_or_runs_a_canary_reads_the_pods() {
    assert!(!reads_pods(None));
    assert!(!reads_pods(Some(Phase::Initializing)));
    assert!(!reads_pods(Some(Phase::Stable)));
    for phase in [
        Phase::ScalingDownStable,
        Phase::CanaryActive,
        Phase::Promoting,
        Phase::RollingBack,
        Phase::RolledBack,
        Phase::Failed,
    ] {
        assert!(reads_pods(Some(phase)), "{phase:?}");
    }
    let (stable, canary) = (Some(Phase::Stable), Some(Phase::ScalingDownStable));
    assert!(plans_again_with_pods(stable, canary));
    assert!(!plans_again_with_pods(None, stable));
    assert!(
        !plans_again_with_pods(canary, canary),
        "it had the pods already"
    );
}

#[test]
fn initializing_creates_the_stable_set_and_becomes_stable() {
    let mut s = two_sets();
    let first = s.reconcile();
    assert_eq!(first.status.phase, Some(Phase::Initializing));
    assert!(
        matches!(&first.actions[..], [Action::ApplySet(set)] if set.metadata.name.as_deref() == Some("redis-stable"))
    );
    s.stabilise();
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:1"));
    assert_eq!(s.status.ready.as_deref(), Some("3/3"));
    assert_eq!(s.status.phase, Some(Phase::Stable));
    // An ordinary start is not announced (issue 51: one write less per new rollout).
    assert!(s.events.is_empty(), "{:?}", s.events);
    // Stable and nothing changed: no actions at all.
    assert!(s.reconcile().actions.is_empty());
}

#[test]
fn a_stable_set_scaled_by_hand_is_put_back() {
    // Issue 18: the set's own hash was all `ensure` compared, so 3 -> 1 by hand stayed.
    for mut s in [two_sets(), partition()] {
        s.stabilise();
        let name = s.sets.keys().next().unwrap().clone();
        s.sets.get_mut(&name).unwrap().replicas = 1;
        let p = s.reconcile();
        assert!(
            p.actions.iter().any(|a| matches!(a, Action::ApplySet(set)
                if set.spec.as_ref().and_then(|s| s.replicas) == Some(3))),
            "{:?}",
            p.actions
        );
        assert!(
            p.status
                .message
                .as_deref()
                .unwrap_or("")
                .contains("changed outside Git"),
            "{:?}",
            p.status.message
        );
        s.stabilise();
        assert_eq!(s.sets[&name].replicas, 3);
        assert!(s.reconcile().actions.is_empty());
    }
}

#[test]
fn two_sets_walkthrough_keeps_every_volume_with_its_replica() {
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();

    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(
        s.phases,
        [
            Phase::Initializing,
            Phase::Stable,
            Phase::ScalingDownStable,
            Phase::DeployingCanary,
            Phase::CanaryActive
        ]
    );
    assert_eq!(s.sets["redis-stable"].replicas, 2);
    assert_eq!(s.sets["redis-canary"].start, 2);
    assert!(s.pods.contains_key("redis-canary-2"));
    assert!(s.claims.contains_key("data-redis-canary-2"));
    assert!(!s.claims.contains_key("data-redis-stable-2"));
    assert_eq!(
        s.volumes_by_ordinal(),
        before,
        "the canary got replica 2's own volume"
    );
    assert_eq!(s.status.canary_image.as_deref(), Some("redis:2"));

    // Manual promotion waits for the annotation.
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::CanaryActive));
    assert!(
        s.status
            .message
            .as_deref()
            .unwrap()
            .contains("waiting for promotion")
    );

    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:2"));
    assert_eq!(s.status.canary_image, None);
    assert!(!s.sets.contains_key("redis-canary"));
    assert_eq!(s.sets["redis-stable"].replicas, 3);
    assert!(
        s.pods
            .values()
            .all(|p| p.revision.as_deref() == Some("rev-redis:2"))
    );
    assert_eq!(s.volumes_by_ordinal(), before, "promotion moved a volume");
    assert!(s.events.contains(&"Promoted"));
    assert_eq!(s.volumes.len(), 3, "a volume was created or lost");
}

/// Regression: volumes left Released by an earlier rollout of the same name in the same
/// namespace carry the same handoff annotation and claimRef names; the handoff picked one and
/// stalled. Only a live claim's volumeName identifies a replica's volume.
#[test]
fn stale_volumes_of_an_earlier_rollout_with_the_same_name_are_ignored() {
    let mut s = two_sets();
    for (name, claim) in [
        ("pv-old-a", "data-redis-canary-2"),
        ("pv-old-b", "data-redis-stable-2"),
    ] {
        s.volumes.insert(
            name.into(),
            VolumeView {
                name: name.into(),
                retain: true,
                claim: Some((claim.into(), Some("uid-of-a-deleted-claim".into()))),
                handoff_to: Some("data-redis-canary-2".into()),
                storage_class: Some("local".into()),
            },
        );
    }
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.promote = Some("redis:2".into());
    s.run_until("promoted", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert_eq!(s.volumes_by_ordinal(), before);
    for stale in ["pv-old-a", "pv-old-b"] {
        assert_eq!(
            s.volumes[stale].claim.as_ref().map(|c| c.1.as_deref()),
            Some(Some("uid-of-a-deleted-claim")),
            "{stale} was touched"
        );
    }
}

#[test]
fn a_promote_annotation_left_from_an_earlier_canary_does_not_promote_the_next() {
    let mut s = two_sets();
    s.stabilise();
    s.promote = Some("true".into());
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::CanaryActive));
    assert!(s.status.message.as_deref().unwrap().contains("already"));
    // Naming the canary's image promotes it.
    s.promote = Some("redis:2".into());
    s.stabilise();
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:2"));
}

#[test]
fn auto_promotion_waits_for_the_bake_time() {
    let mut s = two_sets();
    s.spec.promotion = Promotion {
        type_: PromotionType::Auto,
        bake_seconds: 30,
    };
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::CanaryActive));
    let after = p.requeue_after.expect("a bake timer");
    assert!(
        after <= Duration::from_secs(31) && after >= Duration::from_secs(20),
        "{after:?}"
    );
    s.now += jiff::SignedDuration::from_secs(31);
    s.stabilise();
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:2"));
}

#[test]
fn a_broken_canary_rolls_back_at_the_deadline_with_volumes_back_in_place() {
    let mut s = two_sets();
    s.spec.progress_deadline_seconds = 20;
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:broken".into();
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(s.events.contains(&"ProgressDeadlineExceeded"));
    assert!(s.events.contains(&"RolledBack"));
    assert!(!s.sets.contains_key("redis-canary"));
    assert_eq!(s.sets["redis-stable"].replicas, 3);
    assert_eq!(s.sets["redis-stable"].image, "redis:1");
    assert_eq!(s.volumes_by_ordinal(), before);
    assert_eq!(s.status.canary_image.as_deref(), Some("redis:broken"));
    let stalled = crate::api::find_condition(&s.status.conditions, condition::STALLED).unwrap();
    assert_eq!(stalled.status, "True");
    // It stays rolled back until Git changes the image.
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::RolledBack));
    s.spec.image = "redis:1".into();
    s.stabilise();
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn abort_by_annotation_rolls_back() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(s.events.contains(&"Aborted"));
    assert_eq!(s.sets["redis-stable"].image, "redis:1");
}

#[test]
fn reverting_the_image_in_git_rolls_back_then_is_stable() {
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.spec.image = "redis:1".into();
    s.phases.clear();
    s.stabilise();
    assert_eq!(
        s.phases,
        [Phase::RollingBack, Phase::RolledBack, Phase::Stable]
    );
    assert!(s.events.contains(&"Reverted"));
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn a_new_image_during_a_canary_ends_it_before_starting_the_next() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.spec.image = "redis:3".into();
    s.phases.clear();
    s.run_until("CanaryActive on 3", |s| {
        s.phase() == Some(Phase::CanaryActive)
            && s.status.canary_image.as_deref() == Some("redis:3")
    });
    assert!(s.events.contains(&"Superseded"));
    assert_eq!(s.phases[..2], [Phase::RollingBack, Phase::RolledBack]);
    assert_eq!(s.sets["redis-canary"].image, "redis:3");
}

#[test]
fn steps_bring_the_canary_up_in_batches() {
    let mut s = two_sets();
    s.spec.canary_replicas = 2;
    s.spec.steps = Some(vec![1, 2]);
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("step 1 done", |s| s.events.contains(&"StepComplete"));
    assert_eq!(s.sets["redis-canary"].replicas, 1);
    assert_eq!(s.sets["redis-canary"].start, 2);
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(s.sets["redis-canary"].replicas, 2);
    assert_eq!(s.sets["redis-canary"].start, 1);
    assert_eq!(s.sets["redis-stable"].replicas, 1);
    assert_eq!(s.volumes_by_ordinal(), before);
    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn migration_runs_once_then_promotes() {
    let mut s = two_sets();
    s.spec.migration = Some(Box::new(Migration {
        template: serde_json::from_value(serde_json::json!({
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "migrate:1"}]}}}
        }))
        .unwrap(),
    }));
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.promote = None;
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(s.jobs_created, 1);
    for ph in [
        Phase::AwaitingMigration,
        Phase::MigratingData,
        Phase::Promoting,
    ] {
        assert!(s.phases.contains(&ph), "{ph:?} missing from {:?}", s.phases);
    }
}

#[test]
fn a_failed_migration_rolls_back_and_never_runs_again() {
    let mut s = two_sets();
    s.spec.migration = Some(Box::new(Migration {
        template: serde_json::from_value(
            serde_json::json!({"spec": {"template": {"spec": {"containers": []}}}}),
        )
        .unwrap(),
    }));
    s.job_fails = true;
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.promote = Some("redis:2".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(s.phases.contains(&Phase::MigrationFailed));
    assert_eq!(s.jobs_created, 1);
    assert_eq!(s.volumes_by_ordinal(), before);
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.jobs_created, 1);
}

#[test]
fn partition_walkthrough_and_promotion() {
    let mut s = partition();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(s.sets["redis"].partition, 2);
    assert_eq!(s.pods["redis-2"].revision.as_deref(), Some("rev-redis:2"));
    assert_eq!(s.pods["redis-1"].revision.as_deref(), Some("rev-redis:1"));
    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(s.sets["redis"].partition, 0);
    assert!(
        s.pods
            .values()
            .all(|p| p.revision.as_deref() == Some("rev-redis:2"))
    );
    assert_eq!(s.volumes_by_ordinal(), before);
    assert!(
        !s.log
            .iter()
            .any(|a| matches!(a, Action::DeleteClaim { .. }))
    );
}

#[test]
fn partition_rollback_recreates_the_pod_stuck_on_the_bad_revision() {
    let mut s = partition();
    s.spec.progress_deadline_seconds = 10;
    s.stabilise();
    s.spec.image = "redis:broken".into();
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(
        s.log
            .iter()
            .any(|a| matches!(a, Action::DeletePod { name } if name == "redis-2"))
    );
    assert!(
        s.pods
            .values()
            .all(|p| p.ready && p.revision.as_deref() == Some("rev-redis:1"))
    );
}

#[test]
fn cleanup_scales_down_waits_then_deletes_and_keeps_claims() {
    let mut s = two_sets();
    s.stabilise();
    let claims = s.claims.len();
    for _ in 0..20 {
        let (actions, waiting) = plan_cleanup(&s.observed());
        for a in &actions {
            assert!(!matches!(a, Action::DeleteClaim { .. }));
            s.execute(a);
        }
        if waiting.is_none() && s.sets.is_empty() {
            break;
        }
        s.tick();
    }
    assert!(s.sets.is_empty() && s.pods.is_empty());
    assert_eq!(s.claims.len(), claims);
}

#[test]
fn an_interrupted_handoff_carries_on_after_a_crash_at_every_point() {
    // Crash after each possible number of actions in every plan of a full rollout.
    for crash_at in 0..4 {
        let mut s = two_sets();
        s.stabilise();
        let before = s.volumes_by_ordinal();
        s.spec.image = "redis:2".into();
        s.promote = Some("redis:2".into());
        for round in 0..400 {
            if s.phase() == Some(Phase::Stable)
                && s.status.stable_image.as_deref() == Some("redis:2")
            {
                break;
            }
            if round % 3 == 0 {
                s.reconcile_partial(Some(crash_at));
            } else {
                s.reconcile();
            }
            s.tick();
        }
        assert_eq!(
            s.status.stable_image.as_deref(),
            Some("redis:2"),
            "crash at {crash_at}"
        );
        assert_eq!(s.volumes_by_ordinal(), before, "crash at {crash_at}");
    }
}

#[test]
fn abort_while_scaling_down_the_stable_set_rolls_back() {
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.reconcile();
    assert_eq!(s.phase(), Some(Phase::ScalingDownStable));
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(
        s.phases[2..],
        [
            Phase::ScalingDownStable,
            Phase::RollingBack,
            Phase::RolledBack
        ]
    );
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn a_missing_container_fails_until_the_spec_is_fixed() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.container = Some("sidecar".into());
    s.generation += 1;
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::Failed));
    assert!(p.actions.is_empty());
    assert!(
        p.status
            .message
            .unwrap()
            .contains("\"sidecar\" is not in the template")
    );
    let stalled = crate::api::find_condition(&p.status.conditions, condition::STALLED);
    assert_eq!(stalled.unwrap().status, "True");
    s.spec.container = Some("redis".into());
    s.generation += 1;
    s.stabilise();
    assert_eq!(s.phases[2..], [Phase::Failed, Phase::Stable]);
}

/// Regression (issue 71): a rollout with no recorded version over a set whose container it
/// could not find took the spec's image as the set's version, so the set was applied with
/// the new image on every pod at once, no canary.
#[test]
fn a_set_whose_container_cannot_be_read_stops_the_rollout_instead_of_replacing_every_pod() {
    for mut s in [two_sets(), partition()] {
        s.stabilise();
        let before = s.spec.image.clone();
        // The CR made again over its sets (status gone), the container renamed in Git.
        s.status = CanaryStatefulSetStatus::default();
        let renamed = s.spec.clone();
        rename_container(&mut s.spec, "db");
        s.spec.image = "redis:next".into();
        let mut observed = s.observed();
        if let Some(set) = observed.stable.as_mut() {
            set.image = None;
        }
        let p = plan(&s.rollout(), &observed, s.now);
        assert_eq!(p.status.phase, Some(Phase::Failed));
        let message = p.status.message.clone().unwrap_or_default();
        assert!(
            message.contains("no container named db") && message.contains("spec.container"),
            "{message}"
        );
        assert!(
            p.events.iter().any(|e| e.reason == "UnreadableSet"),
            "{:?}",
            p.events
        );
        assert_eq!(p.actions, Vec::new(), "nothing applied");
        assert_eq!(p.status.stable_image, None, "no version guessed");

        // Put back in Git: the set's version is read, and a canary starts from it.
        s.status = p.status;
        s.spec.template = renamed.template;
        s.spec.container = None;
        s.run_until("a canary", |s| s.status.canary_image.is_some());
        assert_eq!(s.status.stable_image, Some(before));
    }
}

fn rename_container(spec: &mut CanaryStatefulSetSpec, name: &str) {
    let mut value = serde_json::to_value(&*spec).unwrap();
    value["template"]["template"]["spec"]["containers"][0]["name"] = name.into();
    value["container"] = name.into();
    *spec = serde_json::from_value(value).unwrap();
}
