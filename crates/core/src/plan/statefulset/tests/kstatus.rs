//! What kstatus (Flux health checks, kpt) reads from every phase of a CanaryStatefulSet.

use super::*;

/// What kstatus (Flux health checks, kpt) must read from each phase once the status is
/// current: Ready only when settled on Git's image, Failed only when Git must change.
fn kstatus_expected(phase: Phase, ready: bool) -> &'static str {
    match phase {
        Phase::Stable if ready => "Current",
        Phase::RolledBack | Phase::Failed => "Failed",
        _ => "InProgress",
    }
}

#[test]
fn flux_kstatus_reads_every_phase_as_meant() {
    let mut histories = Vec::new();
    // A canary promoted by hand, then a broken image rolled back by its deadline.
    let mut s = two_sets();
    s.spec.progress_deadline_seconds = 20;
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.generation += 1;
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.promote = Some("true".into());
    s.stabilise();
    s.promote = None;
    s.spec.image = "redis:broken".into();
    s.generation += 1;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    s.spec.container = Some("sidecar".into());
    s.generation += 1;
    s.run_until("Failed", |s| s.phase() == Some(Phase::Failed));
    histories.push(s.written);
    // A migration that fails, and a canary aborted while the stable set scales down.
    let mut s = two_sets();
    s.spec.migration = Some(Box::new(Migration {
        template: serde_json::from_value(
            serde_json::json!({"spec": {"template": {"spec": {"containers": []}}}}),
        )
        .unwrap(),
    }));
    s.job_fails = true;
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.generation += 1;
    s.promote = Some("redis:2".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    histories.push(s.written);
    let mut s = two_sets();
    s.spec.migration = Some(Box::new(Migration {
        template: serde_json::from_value(serde_json::json!({
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "migrate:1"}]}}}
        }))
        .unwrap(),
    }));
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.generation += 1;
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.promote = Some("true".into());
    s.stabilise();
    histories.push(s.written);
    let mut s = partition();
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.generation += 1;
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    histories.push(s.written);

    let mut cases: Vec<(String, serde_json::Value, &str)> = Vec::new();
    let object = |generation: i64, status: &CanaryStatefulSetStatus| {
        serde_json::json!({
            "apiVersion": crate::api::API_VERSION, "kind": "CanaryStatefulSet",
            "metadata": {"name": "redis", "namespace": "shop", "generation": generation},
            "status": status,
        })
    };
    let mut seen = std::collections::BTreeSet::new();
    for (generation, status) in histories.into_iter().flatten() {
        let phase = status.phase.unwrap();
        let ready = status.ready_replicas >= 3;
        if !seen.insert((format!("{phase:?}"), ready)) {
            continue;
        }
        cases.push((
            format!("{phase:?} ready={ready}"),
            object(generation, &status),
            kstatus_expected(phase, ready),
        ));
        // A status not yet updated for a new generation is in progress, whatever it says.
        cases.push((
            format!("{phase:?} ready={ready}, generation ahead"),
            object(generation + 1, &status),
            "InProgress",
        ));
    }
    // An action the API server refuses is Failed; one that failed in a way that clears by
    // itself (a conflict) is still in progress.
    for (what, failure, permanent, want) in [
        (
            "action refused",
            "apply StatefulSet redis-stable: forbidden",
            true,
            "Failed",
        ),
        (
            "action conflicted",
            "patch PersistentVolume pv-1: the object has been modified (Conflict, HTTP 409)",
            false,
            "InProgress",
        ),
    ] {
        let mut status = CanaryStatefulSetStatus {
            phase: Some(Phase::Stable),
            observed_generation: Some(1),
            ..Default::default()
        };
        crate::plan::mark_action_failed(
            &mut status,
            "an action",
            failure,
            permanent,
            Timestamp::UNIX_EPOCH,
        );
        cases.push((what.into(), object(1, &status), want));
    }

    let phases: std::collections::BTreeSet<&str> = seen.iter().map(|(p, _)| p.as_str()).collect();
    for phase in [
        "Initializing",
        "Stable",
        "ScalingDownStable",
        "DeployingCanary",
        "CanaryActive",
        "AwaitingMigration",
        // MigratingData: the model's Job finishes within the plan that starts it.
        "MigrationFailed",
        "Promoting",
        "RollingBack",
        "RolledBack",
        "Failed",
    ] {
        assert!(phases.contains(phase), "no {phase} in {phases:?}");
    }
    crate::plan::machine::tests::assert_kstatus_reads(&cases);
}
