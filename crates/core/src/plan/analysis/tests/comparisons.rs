//! Metrics judged against a baseline, and the least evidence before a promotion (issue 75).

use super::*;

fn compared(count: i32) -> Metric {
    metric(json!({
        "name": "error-rate",
        "interval": "10s",
        "count": count,
        "provider": {"web": {"url": "http://metrics/canary"}},
        "baseline": {"provider": {"web": {"url": "http://metrics/baseline"}}},
    }))
}

/// Records `n` pairs around `canary` and `baseline` (±10 %), one every 10 s.
fn record_pairs(m: &ResolvedMetric, st: &mut MetricStatus, n: usize, canary: f64, base: f64) {
    for i in 0..n {
        let wobble = 1.0 + ((i * 37) % 21) as f64 / 100.0 - 0.1;
        let outcome = Outcome::Pair {
            canary: json!(canary * wobble),
            baseline: json!([base * (2.0 - wobble)]),
        };
        let at = t0() + std::time::Duration::from_secs(10 * i as u64);
        record(m, st, outcome, false, at);
    }
}

#[test]
fn a_canary_at_four_times_the_baselines_error_rate_fails_with_the_numbers() {
    let m = resolved_metric(compared(12));
    let mut st = MetricStatus {
        name: "error-rate".into(),
        ..Default::default()
    };
    record_pairs(&m, &mut st, 12, 0.02, 0.005);
    assert_eq!(st.phase, AnalysisPhase::Failed, "{:?}", st.comparison);
    let why = decided_by(&m.metric, &st);
    assert!(
        why.starts_with("error-rate canary 0.0199 vs baseline 0.005025 (medians): 296 % worse"),
        "{why}"
    );
    assert!(why.contains("tolerated 25 %; p 0.0000"), "{why}");
    assert!(why.ends_with("12 and 12 samples: Fail"), "{why}");
    assert_eq!(st.canary_samples.len(), 12);
}

#[test]
fn a_canary_a_fifth_above_the_baseline_passes_at_its_count() {
    let m = resolved_metric(compared(12));
    let mut st = MetricStatus::default();
    record_pairs(&m, &mut st, 11, 0.006, 0.005);
    assert_eq!(st.phase, AnalysisPhase::Running);
    record_pairs(&m, &mut st, 1, 0.006, 0.005);
    assert_eq!(st.phase, AnalysisPhase::Successful, "{:?}", st.comparison);
    assert_eq!(st.successful, 12);
}

#[test]
fn three_pairs_are_not_enough_data_and_hold() {
    let m = resolved_metric(compared(3));
    let mut st = MetricStatus::default();
    record_pairs(&m, &mut st, 3, 0.02, 0.005);
    assert_eq!(st.phase, AnalysisPhase::Inconclusive);
    assert_eq!(
        st.comparison.as_deref(),
        Some("not enough data: 3 canary and 3 baseline samples, 10 needed on each side")
    );
}

#[test]
fn a_pair_that_is_not_two_numbers_is_an_error_measurement() {
    let m = resolved_metric(compared(12));
    let mut st = MetricStatus::default();
    let outcome = Outcome::Pair {
        canary: json!("n/a"),
        baseline: json!(0.1),
    };
    record(&m, &mut st, outcome, false, t0());
    assert_eq!((st.errors, st.count), (1, 0));
    assert!(st.canary_samples.is_empty());
    // A single value where a pair is due is an error too.
    record(&m, &mut st, Outcome::Value(json!(0.1)), false, t0());
    assert_eq!(st.errors, 2);
}

#[test]
fn a_baseline_refuses_conditions_and_jobs() {
    let mut m = compared(3);
    m.success_condition = Some("result < 0.05".into());
    let fields: Vec<String> = metric_problems(&m).into_iter().map(|(f, _)| f).collect();
    assert_eq!(fields, ["baseline"]);
    let m = metric(json!({
        "name": "e", "provider": {"web": {"url": "http://m/c"}},
        "baseline": {"provider": {"job": {"spec": {"template": {"spec": {"containers": []}}}}}},
    }));
    let fields: Vec<String> = metric_problems(&m).into_iter().map(|(f, _)| f).collect();
    assert_eq!(fields, ["baseline.provider"]);
    assert!(metric_problems(&compared(3)).is_empty());
}

fn background_run(started: Timestamp, counts: &[(&str, i32)]) -> AnalysisRunStatus {
    AnalysisRunStatus {
        name: BACKGROUND.into(),
        phase: AnalysisPhase::Running,
        started_at: Time(started),
        message: None,
        metrics: counts
            .iter()
            .map(|(name, count)| MetricStatus {
                name: (*name).into(),
                count: *count,
                ..Default::default()
            })
            .collect(),
        score: None,
    }
}

#[test]
fn the_least_evidence_is_counted_until_it_is_in() {
    let mut spec = analysis(None);
    assert_eq!(evidence::missing(&[], Some(&spec), t0()), None);
    spec.min_measurements = Some(10);
    spec.min_duration = Some("2m".into());
    let runs = [background_run(t0(), &[("error-rate", 3), ("latency", 10)])];
    let later = t0() + std::time::Duration::from_secs(40);
    let (why, left) = evidence::missing(&runs, Some(&spec), later).unwrap();
    assert_eq!(
        why,
        "waiting for evidence before promotion: error-rate 3 of 10 measurements, measured 40 s of 120 s"
    );
    assert_eq!(left, Some(Duration::from_secs(80)));
    let runs = [background_run(t0(), &[("error-rate", 10), ("latency", 12)])];
    let done = t0() + std::time::Duration::from_secs(120);
    assert_eq!(evidence::missing(&runs, Some(&spec), done), None);
    // No background run to count: said, never promoted.
    let (why, _) = evidence::missing(&[], Some(&spec), done).unwrap();
    assert!(why.contains("has not started"), "{why}");
}
