//! Metrics with a `baseline` (issue 75): each measurement is a pair, the canary's sample and
//! the baseline's; both are kept in the metric's status, and the metric's phase is the
//! statistical judge's verdict over all of them ([`crate::plan::compare`]), so a restarted
//! agent judges the same from the status it finds.

use super::*;
use crate::api::{Baseline, WorseWhen};
use crate::plan::compare::{self, Classification, Comparison, MetricVerdict, Worse};

/// Samples kept per side; the judge reads these (a count past it measures on, unjudged).
pub const MAX_SAMPLES: usize = 200;

/// The judge's rule for `b`.
pub fn comparison(b: &Baseline) -> Comparison {
    Comparison {
        worse: match b.worse {
            WorseWhen::Higher => Worse::Higher,
            WorseWhen::Lower => Worse::Lower,
        },
        tolerance: f64::from(b.tolerance_percent.max(0)) / 100.0,
        min_samples: usize::try_from(b.min_samples.max(1)).unwrap_or(1),
        confidence: f64::from(b.confidence_percent.clamp(50, 99)) / 100.0,
    }
}

/// The judge's verdict over the samples in `st`.
pub fn verdict(b: &Baseline, st: &MetricStatus) -> MetricVerdict {
    compare::compare(&st.canary_samples, &st.baseline_samples, &comparison(b))
}

/// Records the pair in `st`: the measurement's phase (Successful once both are numbers: the
/// verdict is the metric's, not the measurement's), what it shows, and why it erred.
pub(super) fn record_pair(
    b: &Baseline,
    st: &mut MetricStatus,
    canary: &Value,
    baseline: &Value,
) -> (MeasurementPhase, Option<String>, Option<String>) {
    let (Some(c), Some(base)) = (number(canary), number(baseline)) else {
        return (
            MeasurementPhase::Error,
            None,
            Some(format!(
                "a baseline metric needs a number from each side; got {} and {}",
                shown(canary),
                shown(baseline)
            )),
        );
    };
    if st.canary_samples.len() < MAX_SAMPLES {
        st.canary_samples.push(c);
        st.baseline_samples.push(base);
    }
    st.comparison = Some(evidence(b, &verdict(b, st)));
    (
        MeasurementPhase::Successful,
        Some(format!("canary {c}, baseline {base}")),
        None,
    )
}

/// A metric's phase from its samples: Failed when the judge says so; once its count is
/// reached, Successful on a pass and Inconclusive without enough data.
pub(super) fn phase(metric: &Metric, b: &Baseline, st: &MetricStatus, gate: bool) -> AnalysisPhase {
    let v = verdict(b, st);
    if v.classification == Classification::Fail {
        return AnalysisPhase::Failed;
    }
    if st.consecutive_errors > metric.consecutive_error_limit.max(0) {
        return AnalysisPhase::Error;
    }
    let done = super::wanted(metric, gate).is_some_and(|n| st.count >= n);
    match (done, v.classification) {
        (true, Classification::Pass) => AnalysisPhase::Successful,
        (true, _) => AnalysisPhase::Inconclusive,
        (false, _) => AnalysisPhase::Running,
    }
}

/// What the judge found, in one line: the medians, the change against the tolerance, the
/// p-value against what it needs, the samples, and the verdict.
pub fn evidence(b: &Baseline, v: &MetricVerdict) -> String {
    let rule = comparison(b);
    let (Some(c), Some(base), Some(change), Some(p)) = (
        v.canary_median,
        v.baseline_median,
        v.relative_change,
        v.p_value,
    ) else {
        return format!(
            "not enough data: {} canary and {} baseline samples, {} needed on each side",
            v.canary_samples, v.baseline_samples, rule.min_samples
        );
    };
    let change = if change.is_infinite() {
        if change > 0.0 {
            "worse (the baseline's median is 0)".to_string()
        } else {
            "better (the baseline's median is 0)".to_string()
        }
    } else if change >= 0.0 {
        format!("{:.0} % worse", change * 100.0)
    } else {
        format!("{:.0} % better", -change * 100.0)
    };
    let verdict = match v.classification {
        Classification::Fail => "Fail",
        Classification::Pass => "Pass",
        Classification::NotEnoughData => "NotEnoughData",
    };
    format!(
        "canary {} vs baseline {} (medians): {change}, tolerated {} %; p {}, needs below {}; \
         {} and {} samples: {verdict}",
        round(c),
        round(base),
        b.tolerance_percent,
        round(p),
        round(1.0 - rule.confidence),
        v.canary_samples,
        v.baseline_samples,
    )
}

/// What is wrong with a metric's baseline: `(field, problem)`.
pub(super) fn problems(m: &Metric, b: &Baseline) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let p = &b.provider;
    if p.named().len() != 1 || p.job.is_some() {
        out.push((
            "baseline.provider".into(),
            "set exactly one of prometheus, web, datadog, newRelic, cloudWatch or influxdb (a job has no \
             number to compare)"
                .into(),
        ));
    }
    if m.provider.job.is_some() {
        out.push((
            "provider".into(),
            "a metric with a baseline needs prometheus, web, datadog, newRelic, cloudWatch or influxdb: a job \
             has no number to compare"
                .into(),
        ));
    }
    if m.success_condition.is_some() || m.failure_condition.is_some() {
        out.push((
            "baseline".into(),
            "the judge decides a metric with a baseline: remove successCondition and \
             failureCondition"
                .into(),
        ));
    }
    out
}

/// A sample: a number, or a list of one number (a one-series Prometheus answer).
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64().filter(|x| x.is_finite()),
        Value::Array(a) if a.len() == 1 => number(&a[0]),
        Value::String(s) => s.trim().parse::<f64>().ok().filter(|x| x.is_finite()),
        _ => None,
    }
}

/// Four significant figures, for a line a person reads.
fn round(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return x.to_string();
    }
    let digits = 3 - x.abs().log10().floor() as i32;
    let factor = 10f64.powi(digits.clamp(0, 12));
    ((x * factor).round() / factor).to_string()
}
