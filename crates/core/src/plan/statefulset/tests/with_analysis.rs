//! The simulation with analysis: background runs, gates, holds, and their deadlines.

use super::*;

fn error_rate_analysis(background: bool, gate: Option<i32>, count: Option<i32>) -> Resolved {
    analysis::testing::error_rate(background, gate, count)
}

fn with_auto_promotion(s: &mut Sim, bake_seconds: i64) {
    s.spec.promotion = Promotion {
        type_: PromotionType::Auto,
        bake_seconds,
    };
}

#[test]
fn a_failing_background_analysis_rolls_back_and_names_the_metric() {
    let mut s = two_sets();
    with_auto_promotion(&mut s, 600);
    s.analysis = error_rate_analysis(true, None, None);
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    let good = s.measurements;
    s.answer = Outcome::Value(serde_json::json!(0.31));
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    // failureLimit 1: the second failed measurement rolls back, 10 s after the first.
    assert_eq!(s.measurements - good, 2);
    assert!(s.events.contains(&"AnalysisFailed"), "{:?}", s.events);
    let run = &s.status.analysis[0];
    assert_eq!(run.phase, crate::api::AnalysisPhase::Failed);
    let message = run.message.as_deref().unwrap();
    assert!(
        message.starts_with("error-rate 0.31 failed result < 0.05 (2 failed, failureLimit 1)"),
        "{message}"
    );
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:1"));
    // Nothing is measured once the canary is over.
    let after = s.measurements;
    for _ in 0..30 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.measurements, after);
}

#[test]
fn a_passing_gate_promotes_without_the_human_and_is_measured_count_times() {
    let mut s = two_sets();
    s.analysis = error_rate_analysis(false, Some(1), Some(3));
    s.stabilise();
    s.spec.image = "redis:2".into();
    // Manual promotion, no annotation: the gate replaces the human.
    s.run_until("promoted", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert_eq!(s.measurements, 3);
    assert!(s.phases.contains(&Phase::CanaryActive));
}

#[test]
fn an_auto_promotion_waits_for_the_least_evidence() {
    let mut s = two_sets();
    with_auto_promotion(&mut s, 0);
    s.analysis = error_rate_analysis(true, None, None);
    s.stabilise();
    s.spec.analysis = Some(Box::new(
        serde_json::from_value(serde_json::json!({
            "background": {"templates": [{"templateName": "error-rate"}]},
            "minMeasurements": 4,
        }))
        .unwrap(),
    ));
    s.spec.image = "redis:2".into();
    s.run_until("a wait for evidence", |s| {
        s.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("waiting for evidence before promotion: error-rate"))
    });
    assert_eq!(s.phase(), Some(Phase::CanaryActive));
    s.run_until("promoted", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert!(s.measurements >= 4, "{}", s.measurements);
}

#[test]
fn a_gate_does_not_count_against_the_progress_deadline() {
    let mut s = two_sets();
    s.spec.progress_deadline_seconds = 15;
    s.analysis = error_rate_analysis(false, Some(1), Some(4));
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("promoted", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert!(
        !s.events.contains(&"ProgressDeadlineExceeded"),
        "{:?}",
        s.events
    );
}

#[test]
fn an_unmeasurable_background_holds_the_canary_and_goes_on_when_measurable() {
    let mut s = two_sets();
    with_auto_promotion(&mut s, 60);
    s.analysis = error_rate_analysis(true, None, None);
    s.stabilise();
    s.answer = Outcome::Error("Prometheus http://prometheus:9090: connection refused".into());
    s.spec.image = "redis:2".into();
    s.run_until("held", |s| {
        s.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("holds the canary"))
    });
    for _ in 0..60 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::CanaryActive));
    assert!(
        !matches!(
            s.phase(),
            Some(Phase::RollingBack | Phase::RolledBack | Phase::Promoting | Phase::Stable)
        ),
        "{:?}",
        s.phase()
    );
    let message = s.status.message.clone().unwrap();
    assert!(message.contains("could not be measured"), "{message}");
    assert!(
        message.contains("rollouts.linnet.dev/promote: \"true\""),
        "{message}"
    );
    s.answer = Outcome::Value(serde_json::json!(0.0));
    s.run_until("promoted", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
}

#[test]
fn a_failed_gate_rolls_back() {
    let mut s = partition();
    s.analysis = error_rate_analysis(false, Some(1), Some(3));
    s.stabilise();
    s.answer = Outcome::Value(serde_json::json!(0.5));
    s.spec.image = "redis:2".into();
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(s.measurements, 2);
    assert_eq!(s.status.analysis[0].name, "after-1");
}

fn answer() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        3 => (0.0f64..0.05).prop_map(|x| Outcome::Value(serde_json::json!(x))),
        1 => (0.05f64..1.0).prop_map(|x| Outcome::Value(serde_json::json!(x))),
        1 => Just(Outcome::Error("timeout".into())),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random measurement histories through the whole machine, with crashes: a canary whose
    /// analysis failed is never promoted, and no metric records more than failureLimit + 1
    /// failures (the one that fails it) before the rollback starts.
    #[test]
    fn a_failed_analysis_is_never_promoted(
        two in any::<bool>(),
        gate in any::<bool>(),
        answers in proptest::collection::vec((answer(), 1usize..15, 0usize..3), 1..20),
    ) {
        let mut s = if two { two_sets() } else { partition() };
        with_auto_promotion(&mut s, 30);
        s.analysis = error_rate_analysis(true, gate.then_some(1), Some(3));
        s.stabilise();
        s.spec.image = "redis:2".into();
        for (a, ticks, crash) in answers {
            s.answer = a;
            for _ in 0..ticks {
                if crash == 0 { s.reconcile_partial(Some(1)); } else { s.reconcile(); }
                s.tick();
            }
        }
        s.answer = Outcome::Value(serde_json::json!(0.0));
        s.run_until("decided", |s| matches!(s.phase(), Some(Phase::Stable | Phase::RolledBack)));
        for (_, status) in &s.written {
            let failed = status.analysis.iter().any(|r| r.phase == crate::api::AnalysisPhase::Failed);
            let promoted = matches!(status.phase, Some(Phase::Promoting))
                || status.phase == Some(Phase::Stable)
                    && status.stable_image.as_deref() == Some("redis:2");
            prop_assert!(!(failed && promoted), "promoted after a failed analysis: {:?}", status);
            for m in status.analysis.iter().flat_map(|r| &r.metrics) {
                prop_assert!(m.failed <= 2, "{} failed measurements with failureLimit 1", m.failed);
            }
        }
        let promoted = s.status.stable_image.as_deref() == Some("redis:2");
        let failed = s.status.analysis.iter().any(|r| r.phase == crate::api::AnalysisPhase::Failed);
        prop_assert!(!(promoted && failed));
    }
}

#[test]
fn a_background_hold_between_steps_is_not_a_missed_deadline() {
    let mut s = two_sets();
    s.spec.canary_replicas = 2;
    s.spec.steps = Some(vec![1, 2]);
    s.spec.progress_deadline_seconds = 15;
    s.analysis = analysis::testing::error_rate_without_error_budget(true);
    s.stabilise();
    s.answer = Outcome::Error("connection refused".into());
    s.spec.image = "redis:2".into();
    s.run_until("held after step 1", |s| {
        s.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("holds the canary"))
    });
    for _ in 0..60 {
        s.reconcile();
        s.tick();
    }
    assert!(
        !s.events.contains(&"ProgressDeadlineExceeded"),
        "{:?}",
        s.events
    );
    assert_eq!(s.phase(), Some(Phase::DeployingCanary));
    assert_eq!(s.status.current_step, Some(0));
    // Measurable again: it goes on (the deadline long past counts for nothing).
    s.answer = Outcome::Value(serde_json::json!(0.0));
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert!(!s.events.contains(&"ProgressDeadlineExceeded"));
}

/// Regression (issue 71): a Partition canary's `{{ rollout.canarySelector }}` was
/// `controller-revision-hash=` until the status recorded the revision, and selected no pod.
#[test]
fn a_partition_canarys_selector_is_known_only_with_its_revision() {
    use crate::api::ROLLOUT_LABEL;
    let s = partition();
    let mut status = s.status.clone();
    status.canary_revision = None;
    let b = analysis_builtins("redis", "ns", &s.spec, &status);
    assert_eq!(b.canary_selector, None);
    status.canary_revision = Some("redis-7c9".into());
    let b = analysis_builtins("redis", "ns", &s.spec, &status);
    assert_eq!(
        b.canary_selector,
        Some(format!(
            "{ROLLOUT_LABEL}=redis,controller-revision-hash=redis-7c9"
        ))
    );
    // TwoSets tells the sides apart by role: known from the start.
    let s = two_sets();
    let b = analysis_builtins("redis", "ns", &s.spec, &Default::default());
    assert!(b.canary_selector.is_some() && b.stable_selector.is_some());
}
