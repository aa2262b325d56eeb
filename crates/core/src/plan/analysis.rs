//! Analysis decisions, pure: fill a template's metrics with their arguments, judge a result by
//! the metric's CEL conditions, record a measurement in a rollout's status, and read a run's
//! verdict from those records. The controller only takes the measurements the records say are
//! due; everything that decides (how many failed, whether a gate passed) is here, so a restarted
//! agent decides the same from the status it finds.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use crate::api::{
    AnalysisArg, AnalysisPhase, AnalysisRef, AnalysisRunStatus, AnalysisTemplateSpec, Measurement,
    MeasurementPhase, Metric, MetricStatus, RolloutAnalysis,
};

/// The name of the run that lasts the whole canary.
pub const BACKGROUND: &str = "background";
/// Measurements kept per metric in status (the counts cover all of them).
pub const MEASUREMENTS_KEPT: usize = 10;
/// A result longer than this is cut in status and messages.
const VALUE_CHARS: usize = 64;
/// The longest CEL condition (the CRD says the same).
const CONDITION_CHARS: usize = 512;
/// The longest text of a provider once its `{{ … }}` are filled in.
const MAX_FILLED_CHARS: usize = 64 * 1024;
/// How long a query may take when its metric does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a query may take, whatever its metric says: measurements run inside a
/// reconcile.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// The name of the gate run after step or batch `after`.
pub fn gate_run(after: i32) -> String {
    format!("after-{after}")
}

/// Records one measurement of `m` in `st` and brings the metric's phase up to date.
pub fn record(
    m: &ResolvedMetric,
    st: &mut MetricStatus,
    outcome: Outcome,
    gate: bool,
    now: Timestamp,
) {
    let (phase, value, message) = match (outcome, &m.metric.baseline) {
        (Outcome::Pair { canary, baseline }, Some(b)) => {
            baseline::record_pair(b, st, &canary, &baseline)
        }
        (Outcome::Value(_), Some(_)) | (Outcome::Pair { .. }, None) => (
            MeasurementPhase::Error,
            None,
            Some("a baseline metric is measured in pairs, canary and baseline".into()),
        ),
        (Outcome::Value(v), None) => {
            let (phase, message) = judge(&m.metric, &v);
            (phase, Some(shown(&v)), message)
        }
        (Outcome::Error(e), _) => (MeasurementPhase::Error, None, Some(e)),
    };
    match phase {
        MeasurementPhase::Error => {
            st.errors += 1;
            st.consecutive_errors += 1;
        }
        other => {
            st.count += 1;
            st.consecutive_errors = 0;
            match other {
                MeasurementPhase::Successful => st.successful += 1,
                MeasurementPhase::Failed => st.failed += 1,
                _ => st.inconclusive += 1,
            }
        }
    }
    st.measurements.push(Measurement {
        phase,
        value,
        at: Time(now),
        message: message.map(|m| m.chars().take(300).collect()),
    });
    let extra = st.measurements.len().saturating_sub(MEASUREMENTS_KEPT);
    st.measurements.drain(..extra);
    st.phase = metric_phase(&m.metric, st, gate);
}

/// Measurements a metric takes: its count; without one, once in a gate and until the canary
/// ends in the background.
pub(crate) fn wanted(metric: &Metric, gate: bool) -> Option<i32> {
    metric.count.or(gate.then_some(1))
}

/// A metric's phase from its counts (with a baseline, from the judge's verdict).
pub fn metric_phase(metric: &Metric, st: &MetricStatus, gate: bool) -> AnalysisPhase {
    if let Some(b) = &metric.baseline {
        return baseline::phase(metric, b, st, gate);
    }
    if st.failed > metric.failure_limit.max(0) {
        AnalysisPhase::Failed
    } else if st.inconclusive > metric.inconclusive_limit.max(0) {
        AnalysisPhase::Inconclusive
    } else if st.consecutive_errors > metric.consecutive_error_limit.max(0) {
        AnalysisPhase::Error
    } else if wanted(metric, gate).is_some_and(|n| st.count >= n) {
        AnalysisPhase::Successful
    } else {
        AnalysisPhase::Running
    }
}

fn finished(phase: AnalysisPhase) -> bool {
    matches!(
        phase,
        AnalysisPhase::Successful | AnalysisPhase::Failed | AnalysisPhase::Inconclusive
    )
}

/// Whether the controller measures a run in `phase`: Error goes on measuring, so the rollout
/// goes on by itself once the provider answers again.
pub fn measuring(phase: AnalysisPhase) -> bool {
    matches!(phase, AnalysisPhase::Running | AnalysisPhase::Error)
}

/// When `m` next needs a measurement in a run started at `started`, if it does.
pub fn next_measurement(
    m: &ResolvedMetric,
    st: &MetricStatus,
    started: Timestamp,
) -> Option<Timestamp> {
    if finished(st.phase) || st.job.is_some() {
        return None;
    }
    let at = match st.measurements.last() {
        Some(last) => last.at.0.checked_add(m.interval).ok()?,
        None => started.checked_add(m.initial_delay).ok()?,
    };
    Some(at)
}

/// The metrics of `run` due at `now`.
pub fn due<'a>(
    run: &AnalysisRunStatus,
    metrics: &'a [ResolvedMetric],
    now: Timestamp,
) -> Vec<&'a ResolvedMetric> {
    if !measuring(run.phase) {
        return Vec::new();
    }
    metrics
        .iter()
        .filter(|m| {
            let st = run.metrics.iter().find(|s| s.name == m.metric.name);
            let fresh = MetricStatus::default();
            next_measurement(m, st.unwrap_or(&fresh), run.started_at.0).is_some_and(|at| at <= now)
        })
        .collect()
}

/// How long until the next measurement of any measuring run in `runs`.
pub fn next_due(
    runs: &[AnalysisRunStatus],
    resolved: &Resolved,
    now: Timestamp,
) -> Option<Duration> {
    runs.iter()
        .filter(|r| measuring(r.phase))
        .filter_map(|r| Some((r, resolved.runs.get(&r.name)?.as_ref().ok()?)))
        .flat_map(|(r, metrics)| {
            metrics.iter().filter_map(move |m| {
                let st = r.metrics.iter().find(|s| s.name == m.metric.name)?;
                next_measurement(m, st, r.started_at.0)
            })
        })
        .min()
        .map(|at| {
            let d = at.duration_since(now);
            if d.is_negative() {
                Duration::ZERO
            } else {
                d.unsigned_abs()
            }
        })
}

/// What a run says about the rollout.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Every metric met its count.
    Passed,
    /// A metric failed: roll back. The text names the metric, its value and condition.
    Failed(String),
    /// Inconclusive, erring, or not resolvable: hold, and say why.
    Held(String),
    /// Still measuring.
    Measuring(String),
}

/// Brings run `name` into `runs` (started at `now` when absent) and its phase up to date, and
/// says what it decides. A finished run keeps its phase: a gate that passed is never run again.
pub fn run_verdict(
    runs: &mut Vec<AnalysisRunStatus>,
    name: &str,
    resolved: &Resolved,
    gate: bool,
    now: Timestamp,
) -> Verdict {
    // A finished run keeps its verdict even when its templates can no longer be resolved
    // (deleted, or not listed yet after a restart).
    if let Some(run) = runs.iter().find(|r| r.name == name)
        && finished(run.phase)
    {
        return verdict_of(run);
    }
    let metrics = match resolved.runs.get(name) {
        Some(Ok(metrics)) => metrics,
        Some(Err(why)) => return Verdict::Held(format!("analysis {name} cannot run: {why}")),
        None => return Verdict::Passed,
    };
    let index = match runs.iter().position(|r| r.name == name) {
        Some(i) => i,
        None => {
            runs.push(AnalysisRunStatus {
                name: name.to_string(),
                phase: AnalysisPhase::Running,
                started_at: Time(now),
                message: None,
                metrics: Vec::new(),
                score: None,
            });
            runs.len() - 1
        }
    };
    let run = &mut runs[index];
    if !finished(run.phase) && run.phase != AnalysisPhase::Stopped {
        for m in metrics {
            if !run.metrics.iter().any(|s| s.name == m.metric.name) {
                run.metrics.push(MetricStatus {
                    name: m.metric.name.clone(),
                    ..MetricStatus::default()
                });
            }
        }
        // Limits may have changed in Git since the last measurement.
        for st in &mut run.metrics {
            if let Some(m) = metrics.iter().find(|m| m.metric.name == st.name) {
                st.phase = metric_phase(&m.metric, st, gate);
                if scoring::left_to_score(&m.metric, resolved.scoring.as_ref()) {
                    st.phase = scoring::phase(&m.metric, st, gate, st.phase);
                }
                report::describe(st, m);
            }
        }
        let (phase, message, score) = run_phase(&run.metrics, metrics, resolved.scoring.as_ref());
        run.phase = phase;
        run.message = Some(message);
        run.score = score;
    }
    verdict_of(run)
}

fn verdict_of(run: &AnalysisRunStatus) -> Verdict {
    let message = run.message.clone().unwrap_or_default();
    match run.phase {
        AnalysisPhase::Successful => Verdict::Passed,
        AnalysisPhase::Failed => Verdict::Failed(message),
        AnalysisPhase::Inconclusive | AnalysisPhase::Error => Verdict::Held(message),
        AnalysisPhase::Running | AnalysisPhase::Stopped => Verdict::Measuring(message),
    }
}

/// The first run of the canary that has failed (a gate's or the background's), with why:
/// a failure rolls back wherever the rollout is, even while it waits for pods.
pub fn failed(
    runs: &mut Vec<AnalysisRunStatus>,
    resolved: &Resolved,
    now: Timestamp,
) -> Option<(String, String)> {
    let names: Vec<String> = runs
        .iter()
        .filter(|r| r.phase != AnalysisPhase::Stopped)
        .map(|r| r.name.clone())
        .collect();
    names.into_iter().find_map(|name| {
        let gate = name != BACKGROUND;
        match run_verdict(runs, &name, resolved, gate, now) {
            Verdict::Failed(why) => Some((name, why)),
            _ => None,
        }
    })
}

/// A run's phase from its metrics, worst first, the words for it, and its score (with
/// `scoring`, once the score decided).
fn run_phase(
    statuses: &[MetricStatus],
    metrics: &[ResolvedMetric],
    scoring: Option<&crate::api::Scoring>,
) -> (AnalysisPhase, String, Option<i32>) {
    let spec = |st: &MetricStatus| metrics.iter().find(|m| m.metric.name == st.name);
    // A metric left to the score decides alone only when it cannot be measured.
    let alone = |st: &MetricStatus, phase: AnalysisPhase| {
        phase == AnalysisPhase::Error
            || !spec(st).is_some_and(|m| scoring::left_to_score(&m.metric, scoring))
    };
    for phase in [
        AnalysisPhase::Failed,
        AnalysisPhase::Inconclusive,
        AnalysisPhase::Error,
    ] {
        if let Some(st) = statuses
            .iter()
            .find(|s| s.phase == phase && alone(s, phase))
            && let Some(m) = spec(st)
        {
            return (phase, decided_by(&m.metric, st), None);
        }
    }
    let measuring: Vec<&MetricStatus> = statuses
        .iter()
        .filter(|s| s.phase == AnalysisPhase::Running)
        .collect();
    let scored = scoring
        .and_then(|scoring| scoring::decision(statuses, metrics, scoring, !measuring.is_empty()));
    if let Some((phase, message, score)) = scored.clone()
        && phase != AnalysisPhase::Successful
    {
        return (phase, message, Some(score));
    }
    if measuring.is_empty() {
        let all = statuses
            .iter()
            .map(|s| format!("{} {}/{}", s.name, s.successful, s.count))
            .collect::<Vec<_>>()
            .join(", ");
        let (score, words) = match scored {
            Some((_, message, score)) => (Some(score), format!("; {message}")),
            None => (None, String::new()),
        };
        return (
            AnalysisPhase::Successful,
            format!("passed: {all} successful{words}"),
            score,
        );
    }
    // Names and wanted counts only: this text reaches the rollout's message, and a message
    // that changed with every measurement would make a write-back commit each time.
    let text = measuring
        .iter()
        .map(|s| match spec(s).and_then(|m| m.metric.count) {
            Some(n) => format!("{} ({n} measurements)", s.name),
            None => s.name.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    (AnalysisPhase::Running, format!("measuring {text}"), None)
}

/// Why the canary's analysis failed, if a run did: `analysis NAME failed: WHY`.
pub fn failure(runs: &[AnalysisRunStatus]) -> Option<String> {
    runs.iter()
        .find(|r| r.phase == AnalysisPhase::Failed)
        .map(|r| {
            format!(
                "analysis {} failed: {}",
                r.name,
                r.message.as_deref().unwrap_or("")
            )
        })
}

/// A new canary's runs: the last canary's go, and the background run starts now.
pub fn start(runs: &mut Vec<AnalysisRunStatus>, resolved: &Resolved, now: Timestamp) {
    runs.clear();
    background(runs, resolved, now);
}

/// The background run's verdict, if the rollout has one.
pub fn background(
    runs: &mut Vec<AnalysisRunStatus>,
    resolved: &Resolved,
    now: Timestamp,
) -> Option<Verdict> {
    resolved
        .has(BACKGROUND)
        .then(|| run_verdict(runs, BACKGROUND, resolved, false, now))
}

/// The verdict of the gate after step or batch `after`, if the rollout has one.
pub fn gate(
    runs: &mut Vec<AnalysisRunStatus>,
    after: i32,
    resolved: &Resolved,
    now: Timestamp,
) -> Option<(String, Verdict)> {
    let name = gate_run(after);
    resolved.has(&name).then(|| {
        let verdict = run_verdict(runs, &name, resolved, true, now);
        (name, verdict)
    })
}

/// Ends the runs still measuring: the canary they judge is over.
pub fn stop_runs(runs: &mut [AnalysisRunStatus]) {
    for run in runs.iter_mut().filter(|r| measuring(r.phase)) {
        run.phase = AnalysisPhase::Stopped;
    }
}

/// How long a finished analysis Job stays (unless its spec says): a restarted agent reads
/// the result of a Job that finished while it was down for up to this long.
pub const JOB_TTL_SECONDS: i32 = 86_400;
/// How long an analysis Job may run (unless its spec says) before it fails.
pub const JOB_DEADLINE_SECONDS: i64 = 600;

/// Label on the Jobs of `job` metrics: the run they measure for.
pub const ANALYSIS_RUN_LABEL: &str = "rollouts.linnet.dev/analysis";

/// The Job that takes measurement `ordinal` (1-based) of metric `m` in `run`. Its name is
/// derived from the run's start, so a restarted agent finds the Job it created, and the
/// next canary's run makes new ones.
pub fn analysis_job(
    rollout: &super::objects::RolloutRef,
    kind: &str,
    run: &AnalysisRunStatus,
    m: &ResolvedMetric,
    ordinal: i32,
) -> Option<k8s_openapi::api::batch::v1::Job> {
    use k8s_openapi::api::batch::v1::Job;
    let job = m.metric.provider.job.as_ref()?;
    let key = serde_json::json!([
        rollout.uid,
        run.name,
        run.started_at,
        m.metric.name,
        ordinal
    ]);
    let hash = crate::hash::content_hash(&key);
    let prefix: String = rollout.name.chars().take(40).collect();
    let mut labels = rollout.labels();
    labels.insert(ANALYSIS_RUN_LABEL.into(), run.name.clone());
    let mut spec = job.spec.clone();
    // Finished Jobs go by themselves; the measurement is in the rollout's status.
    spec.ttl_seconds_after_finished
        .get_or_insert(JOB_TTL_SECONDS);
    // A Job that hangs would hold its gate for good.
    spec.active_deadline_seconds
        .get_or_insert(JOB_DEADLINE_SECONDS);
    // Its pods do not carry the rollout's label: they are not the rollout's replicas.
    Some(Job {
        metadata: rollout.meta(
            &format!("{prefix}-{}-{}", run.name, &hash[..10]),
            kind,
            labels,
        ),
        spec: Some(spec),
        status: None,
    })
}

/// What the planners' simulations share: an analysis to run and a stand-in for the
/// controller's measuring.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// One `error-rate` metric (success below 0.05, every 10 s, `count` times, failureLimit
    /// 1, consecutiveErrorLimit 2), in the background and/or as a gate after `gate`.
    pub(crate) fn error_rate(background: bool, gate: Option<i32>, count: Option<i32>) -> Resolved {
        let template: AnalysisTemplateSpec = serde_json::from_value(serde_json::json!({
            "metrics": [{
                "name": "error-rate", "interval": "10s", "count": count,
                "successCondition": "result < 0.05", "failureLimit": 1,
                "consecutiveErrorLimit": 2,
                "provider": {"prometheus": {"address": "http://prometheus:9090", "query": "errors"}}
            }]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let refs = serde_json::json!([{"templateName": "error-rate"}]);
        let mut spec = serde_json::json!({});
        if background {
            spec["background"] = serde_json::json!({"templates": refs});
        }
        if let Some(after) = gate {
            spec["gates"] = serde_json::json!([{"after": after, "templates": refs}]);
        }
        let spec: RolloutAnalysis = serde_json::from_value(spec).unwrap_or_else(|e| panic!("{e}"));
        resolve(
            Some(&spec),
            &|_| Some(template.clone()),
            &Builtins::default(),
        )
    }

    /// [`error_rate`] holding at the first measurement that cannot be taken.
    pub(crate) fn error_rate_without_error_budget(background: bool) -> Resolved {
        let mut resolved = error_rate(background, None, None);
        for metrics in resolved.runs.values_mut().flatten() {
            for m in metrics {
                m.metric.consecutive_error_limit = 0;
            }
        }
        resolved
    }

    /// Records `answer` for every measurement due at `now`, as the controller does before it
    /// plans; returns how many it took.
    pub(crate) fn measure_due(
        runs: &mut [AnalysisRunStatus],
        resolved: &Resolved,
        answer: &Outcome,
        now: Timestamp,
    ) -> usize {
        let mut taken = 0;
        for run in runs.iter_mut() {
            let Some(Ok(metrics)) = resolved.runs.get(&run.name) else {
                continue;
            };
            let gate = run.name != BACKGROUND;
            let due: Vec<ResolvedMetric> = due(run, metrics, now).into_iter().cloned().collect();
            for m in due {
                if let Some(st) = run.metrics.iter_mut().find(|s| s.name == m.metric.name) {
                    record(&m, st, answer.clone(), gate, now);
                    taken += 1;
                }
            }
        }
        taken
    }
}

pub mod baseline;
pub mod evidence;
mod judge;
pub mod report;
mod scoring;
pub use judge::*;

mod resolve;
pub use resolve::*;

#[cfg(test)]
mod tests;
