//! A run's judged metrics scored together (issue 75, `spec.analysis.scoring`).

use super::*;
use crate::api::Scoring;

/// A metric judged against a baseline, `count` measurements, with `extra` merged into its
/// `baseline` (weight, critical).
fn judged(name: &str, count: i32, extra: Value) -> ResolvedMetric {
    let mut baseline = json!({"provider": {"web": {"url": "http://metrics/baseline"}}});
    if let (Some(b), Some(e)) = (baseline.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    resolved_metric(metric(json!({
        "name": name,
        "interval": "10s",
        "count": count,
        "provider": {"web": {"url": "http://metrics/canary"}},
        "baseline": baseline,
    })))
}

const BOUNDS: Scoring = Scoring {
    pass: 95,
    marginal: 75,
};

/// Measures `metrics` `n` times, metric `j` around `levels[j]` (canary, baseline), ±10 %,
/// and returns the run after each round with its verdict.
fn scored(
    metrics: &[ResolvedMetric],
    levels: &[(f64, f64)],
    n: usize,
    scoring: Option<Scoring>,
) -> Vec<(AnalysisRunStatus, Verdict)> {
    let resolved = Resolved {
        runs: BTreeMap::from([(BACKGROUND.to_string(), Ok(metrics.to_vec()))]),
        scoring,
    };
    let mut runs = Vec::new();
    run_verdict(&mut runs, BACKGROUND, &resolved, false, t0());
    let mut out = Vec::new();
    for i in 0..n {
        let wobble = 1.0 + ((i * 37) % 21) as f64 / 100.0 - 0.1;
        let at = t0() + Duration::from_secs(10 * (i as u64 + 1));
        for (m, (canary, base)) in metrics.iter().zip(levels) {
            let Some(st) = runs[0].metrics.iter_mut().find(|s| s.name == m.metric.name) else {
                continue;
            };
            if measuring(st.phase) {
                let outcome = Outcome::Pair {
                    canary: json!(canary * wobble),
                    baseline: json!(base * (2.0 - wobble)),
                };
                record(m, st, outcome, false, at);
            }
        }
        let verdict = run_verdict(&mut runs, BACKGROUND, &resolved, false, at);
        out.push((runs[0].clone(), verdict));
        if !matches!(out[out.len() - 1].1, Verdict::Measuring(_)) {
            break;
        }
    }
    out
}

const GOOD: (f64, f64) = (0.005, 0.005);
const BAD: (f64, f64) = (0.02, 0.005);

#[test]
fn one_of_two_equal_metrics_failing_scores_50_and_rolls_back_at_once() {
    let metrics = [
        judged("errors", 12, json!({})),
        judged("latency", 12, json!({})),
    ];
    let rounds = scored(&metrics, &[GOOD, BAD], 12, Some(BOUNDS));
    let (run, verdict) = rounds.last().unwrap();
    // Both have a verdict at 10 samples: decided then, two measurements before the count.
    assert_eq!(rounds.len(), 10, "{verdict:?}");
    assert_eq!(run.phase, AnalysisPhase::Failed);
    assert_eq!(run.score, Some(50));
    let Verdict::Failed(why) = verdict else {
        panic!("{verdict:?}")
    };
    assert!(why.starts_with("score 50 of 100, below marginal 75: errors Pass (weight 1, 10 samples), latency Fail (weight 1, 10 samples)"), "{why}");
}

#[test]
fn a_light_metric_failing_leaves_a_passing_score() {
    let metrics = [
        judged("errors", 12, json!({"weight": 19})),
        judged("latency", 12, json!({"weight": 1})),
    ];
    let rounds = scored(&metrics, &[GOOD, BAD], 12, Some(BOUNDS));
    // The failing metric measures on to its count: the score, not one metric, decides.
    assert!(
        rounds[..11]
            .iter()
            .all(|(_, v)| matches!(v, Verdict::Measuring(_)))
    );
    let (run, verdict) = rounds.last().unwrap();
    assert_eq!(*verdict, Verdict::Passed, "{run:#?}");
    assert_eq!(run.score, Some(95));
    let message = run.message.as_deref().unwrap_or_default();
    assert!(
        message.starts_with(
            "passed: errors 12/12, latency 12/12 successful; score 95 of 100, pass 95"
        ),
        "{message}"
    );
    assert_eq!(run.metrics[1].phase, AnalysisPhase::Failed);
}

#[test]
fn a_score_between_the_bounds_holds_for_a_person() {
    let metrics = [
        judged("errors", 12, json!({"weight": 4})),
        judged("latency", 12, json!({"weight": 1})),
    ];
    let (run, verdict) = scored(&metrics, &[GOOD, BAD], 12, Some(BOUNDS))
        .pop()
        .unwrap();
    assert_eq!(run.score, Some(80));
    assert_eq!(run.phase, AnalysisPhase::Inconclusive);
    let Verdict::Held(why) = verdict else {
        panic!("{verdict:?}")
    };
    assert!(
        why.starts_with("score 80 of 100, marginal: at least 75, below pass 95"),
        "{why}"
    );
}

#[test]
fn a_critical_metric_fails_the_run_whatever_the_score() {
    let metrics = [
        judged("errors", 12, json!({"weight": 19})),
        judged("latency", 12, json!({"critical": true})),
    ];
    let (run, verdict) = scored(&metrics, &[GOOD, BAD], 12, Some(BOUNDS))
        .pop()
        .unwrap();
    assert_eq!(run.phase, AnalysisPhase::Failed);
    assert_eq!(run.score, None);
    let Verdict::Failed(why) = verdict else {
        panic!("{verdict:?}")
    };
    assert!(why.starts_with("latency canary "), "{why}");
}

#[test]
fn too_few_samples_to_score_hold() {
    let metrics = [
        judged("errors", 3, json!({})),
        judged("latency", 3, json!({})),
    ];
    let (run, verdict) = scored(&metrics, &[GOOD, BAD], 3, Some(BOUNDS))
        .pop()
        .unwrap();
    assert_eq!(run.phase, AnalysisPhase::Inconclusive);
    assert_eq!(run.score, Some(0));
    assert!(
        matches!(&verdict, Verdict::Held(why) if why.starts_with("not enough data to score: errors NotEnoughData")),
        "{verdict:?}"
    );
}

#[test]
fn without_scoring_each_metric_decides_alone() {
    let metrics = [
        judged("errors", 12, json!({"weight": 19})),
        judged("latency", 12, json!({})),
    ];
    let (run, verdict) = scored(&metrics, &[GOOD, BAD], 12, None).pop().unwrap();
    assert_eq!(run.score, None);
    assert!(matches!(verdict, Verdict::Failed(_)), "{verdict:?}");
}

proptest! {
    /// Whatever the metrics, their weights and the bounds: a scored run passes only at a
    /// score of at least `pass`, and rolls back only below `marginal` (or on a critical one).
    #[test]
    fn a_run_passes_only_at_its_pass_score(
        bad in proptest::collection::vec(any::<bool>(), 1..4),
        weights in proptest::collection::vec(0i32..5, 4),
        pass in 50i32..=100,
        below in 0i32..50,
    ) {
        let metrics: Vec<ResolvedMetric> = bad
            .iter()
            .enumerate()
            .map(|(i, _)| judged(&format!("m{i}"), 12, json!({"weight": weights[i]})))
            .collect();
        let levels: Vec<(f64, f64)> = bad.iter().map(|b| if *b { BAD } else { GOOD }).collect();
        let bounds = Scoring { pass, marginal: pass - below };
        let (run, verdict) = scored(&metrics, &levels, 12, Some(bounds)).pop().unwrap();
        match verdict {
            Verdict::Passed => prop_assert!(run.score.is_some_and(|s| s >= pass), "{run:#?}"),
            Verdict::Failed(_) => prop_assert!(run.score.is_some_and(|s| s < pass - below), "{run:#?}"),
            Verdict::Held(_) => prop_assert!(run.score.is_some_and(|s| s < pass), "{run:#?}"),
            Verdict::Measuring(_) => prop_assert!(false, "still measuring after the count: {run:#?}"),
        }
    }
}
