//! A run's judged metrics scored together (issue 75, `spec.analysis.scoring`), as Kayenta
//! scores a canary: each metric with a `baseline` gets the judge's verdict, the run's score is
//! the weighted share that passed, and the bounds decide: at least `pass` passes, at least
//! `marginal` holds for a person, below rolls back. A `critical` metric that fails rolls back
//! whatever the score. Pure, from the status alone, so a restarted agent scores the same.

use super::*;
use crate::api::Scoring;
use crate::plan::compare::{self, Classification, Judged, Overall};

/// Whether the score, not the metric itself, decides `m`: a judged metric, not critical.
pub(super) fn left_to_score(m: &Metric, scoring: Option<&Scoring>) -> bool {
    scoring.is_some() && m.baseline.as_ref().is_some_and(|b| !b.critical)
}

/// A metric left to the score measures until its count even when its verdict is Fail now:
/// the score, not one metric, decides.
pub(super) fn phase(
    m: &Metric,
    st: &MetricStatus,
    gate: bool,
    phase: AnalysisPhase,
) -> AnalysisPhase {
    let done = wanted(m, gate).is_some_and(|n| st.count >= n);
    if phase == AnalysisPhase::Failed && !done {
        AnalysisPhase::Running
    } else {
        phase
    }
}

/// The run's decision from its score, when it has one now: rolled back below `marginal` as
/// soon as every judged metric has a verdict; once nothing measures, passed at `pass`, held
/// between, held without enough data. `None`: not scored, or not decided yet.
pub(super) fn decision(
    statuses: &[MetricStatus],
    metrics: &[ResolvedMetric],
    scoring: &Scoring,
    measuring: bool,
) -> Option<(AnalysisPhase, String, i32)> {
    let judged: Vec<(&ResolvedMetric, &MetricStatus, Classification)> = statuses
        .iter()
        .filter_map(|st| {
            let m = metrics.iter().find(|m| m.metric.name == st.name)?;
            let b = m.metric.baseline.as_ref()?;
            Some((m, st, baseline::verdict(b, st).classification))
        })
        .collect();
    if judged.is_empty() {
        return None;
    }
    let parts: Vec<Judged> = judged
        .iter()
        .map(|(m, _, classification)| Judged {
            classification: *classification,
            weight: m
                .metric
                .baseline
                .as_ref()
                .map_or(1.0, |b| f64::from(b.weight.max(0))),
            critical: false,
        })
        .collect();
    let pass = u8::try_from(scoring.pass.clamp(0, 100)).unwrap_or(100);
    let marginal = u8::try_from(scoring.marginal.clamp(0, 100)).unwrap_or(pass);
    let score = compare::score(&parts, pass, marginal.min(pass));
    let verdicts = judged
        .iter()
        .map(|(m, st, c)| {
            let weight = m.metric.baseline.as_ref().map_or(1, |b| b.weight);
            format!(
                "{} {c:?} (weight {weight}, {} samples)",
                st.name,
                st.canary_samples.len()
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let s = i32::from(score.score);
    match (score.overall, measuring) {
        (Overall::Fail, _) => Some((
            AnalysisPhase::Failed,
            format!("score {s} of 100, below marginal {marginal}: {verdicts}"),
            s,
        )),
        (_, true) => None,
        (Overall::Pass, false) => Some((
            AnalysisPhase::Successful,
            format!("score {s} of 100, pass {pass}: {verdicts}"),
            s,
        )),
        (Overall::Marginal, false) => Some((
            AnalysisPhase::Inconclusive,
            format!(
                "score {s} of 100, marginal: at least {marginal}, below pass {pass}; a person \
                 decides: {verdicts}"
            ),
            s,
        )),
        (Overall::NotEnoughData, false) => Some((
            AnalysisPhase::Inconclusive,
            format!("not enough data to score: {verdicts}"),
            0,
        )),
    }
}
