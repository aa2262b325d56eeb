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

/// What `{{ rollout.FIELD }}` is replaced with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Builtins {
    pub name: String,
    pub namespace: String,
    pub canary_image: String,
    pub stable_image: String,
    /// A label selector (`k=v,k=v`) of the canary's pods.
    pub canary_selector: String,
    /// A label selector of the stable pods.
    pub stable_selector: String,
}

impl Builtins {
    fn get(&self, field: &str) -> Option<&str> {
        Some(match field {
            "name" => &self.name,
            "namespace" => &self.namespace,
            "canaryImage" => &self.canary_image,
            "stableImage" => &self.stable_image,
            "canarySelector" => &self.canary_selector,
            "stableSelector" => &self.stable_selector,
            _ => return None,
        })
    }
}

/// A metric ready to measure: its provider's text filled in, its durations parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedMetric {
    pub template: String,
    pub metric: Metric,
    pub interval: Duration,
    pub initial_delay: Duration,
    pub timeout: Duration,
}

/// A rollout's analysis, resolved: each run's metrics, or why they cannot be had.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolved {
    pub runs: BTreeMap<String, Result<Vec<ResolvedMetric>, String>>,
}

impl Resolved {
    pub fn has(&self, run: &str) -> bool {
        self.runs.contains_key(run)
    }
}

/// Resolves every run `analysis` asks for; `template` looks an AnalysisTemplate up by name in
/// the rollout's namespace.
pub fn resolve(
    analysis: Option<&RolloutAnalysis>,
    template: &dyn Fn(&str) -> Option<AnalysisTemplateSpec>,
    builtins: &Builtins,
) -> Resolved {
    let mut out = Resolved::default();
    let Some(analysis) = analysis else {
        return out;
    };
    if let Some(background) = &analysis.background {
        out.runs.insert(
            BACKGROUND.into(),
            resolve_run(background, &analysis.args, template, builtins),
        );
    }
    for gate in &analysis.gates {
        let run = AnalysisRef {
            templates: gate.templates.clone(),
            args: gate.args.clone(),
        };
        out.runs.insert(
            gate_run(gate.after),
            resolve_run(&run, &analysis.args, template, builtins),
        );
    }
    out
}

fn resolve_run(
    run: &AnalysisRef,
    shared: &[AnalysisArg],
    template: &dyn Fn(&str) -> Option<AnalysisTemplateSpec>,
    builtins: &Builtins,
) -> Result<Vec<ResolvedMetric>, String> {
    let mut metrics: Vec<ResolvedMetric> = Vec::new();
    for t in &run.templates {
        let name = &t.template_name;
        let spec = template(name).ok_or_else(|| {
            format!(
                "AnalysisTemplate {name} is not in namespace {}; add it to the repository or fix templateName",
                builtins.namespace
            )
        })?;
        let mut args: BTreeMap<&str, Option<&str>> = spec
            .args
            .iter()
            .map(|a| (a.name.as_str(), a.value.as_deref()))
            .collect();
        for a in shared.iter().chain(&run.args) {
            if let Some(slot) = args.get_mut(a.name.as_str()) {
                *slot = Some(a.value.as_str());
            }
        }
        for m in &spec.metrics {
            if let Some((path, problem)) = metric_problems(m).into_iter().next() {
                return Err(format!(
                    "AnalysisTemplate {name}: metric {}: {path}: {problem}",
                    m.name
                ));
            }
            if metrics.iter().any(|r| r.metric.name == m.name) {
                return Err(format!(
                    "metric {} is in two templates of one analysis; rename one",
                    m.name
                ));
            }
            let provider = serde_json::to_value(&m.provider).map_err(|e| e.to_string())?;
            let provider = fill_strings(provider, &|text| fill(text, &args, builtins))
                .map_err(|e| format!("AnalysisTemplate {name}: metric {}: {e}", m.name))?;
            let mut metric = m.clone();
            metric.provider = serde_json::from_value(provider).map_err(|e| e.to_string())?;
            let timeout = metric
                .provider
                .prometheus
                .as_ref()
                .and_then(|p| p.timeout.as_deref())
                .or(metric
                    .provider
                    .web
                    .as_ref()
                    .and_then(|w| w.timeout.as_deref()))
                .map(parse_duration)
                .transpose()?
                .unwrap_or(DEFAULT_TIMEOUT)
                .min(MAX_TIMEOUT);
            metrics.push(ResolvedMetric {
                template: name.clone(),
                interval: parse_duration(&metric.interval)?,
                initial_delay: metric
                    .initial_delay
                    .as_deref()
                    .map(parse_duration)
                    .transpose()?
                    .unwrap_or_default(),
                timeout,
                metric,
            });
        }
    }
    Ok(metrics)
}

fn fill_strings(value: Value, f: &dyn Fn(&str) -> Result<String, String>) -> Result<Value, String> {
    Ok(match value {
        Value::String(s) => Value::String(f(&s)?),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| fill_strings(v, f))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| Ok((k, fill_strings(v, f)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other,
    })
}

/// Replaces `{{ args.NAME }}` and `{{ rollout.FIELD }}` in `text`.
fn fill(
    text: &str,
    args: &BTreeMap<&str, Option<&str>>,
    builtins: &Builtins,
) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("{{{{ without }}}} in {text:?}"))?;
        let key = after[..close].trim();
        let value = if let Some(arg) = key.strip_prefix("args.") {
            match args.get(arg) {
                Some(Some(v)) => *v,
                Some(None) => {
                    return Err(format!(
                        "argument {arg} has no value; set it in spec.analysis.args in Git"
                    ));
                }
                None => {
                    return Err(format!(
                        "{{{{ args.{arg} }}}} is not an argument of the template; add it to spec.args"
                    ));
                }
            }
        } else if let Some(field) = key.strip_prefix("rollout.") {
            builtins.get(field).ok_or_else(|| {
                format!(
                    "{{{{ rollout.{field} }}}} is unknown; use name, namespace, canaryImage, stableImage, canarySelector or stableSelector"
                )
            })?
        } else {
            return Err(format!(
                "{{{{ {key} }}}} is unknown; use {{{{ args.NAME }}}} or {{{{ rollout.FIELD }}}}"
            ));
        };
        // A long argument used many times would make a string of any size.
        if out.len() + value.len() + rest.len() > MAX_FILLED_CHARS {
            return Err(format!(
                "longer than {MAX_FILLED_CHARS} characters once its arguments are filled in"
            ));
        }
        out.push_str(value);
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Parses `30s`, `1m30s`, `500ms`, `2h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration; write e.g. 30s, 1m or 500ms");
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 || digits > 9 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else {
            return Err(bad());
        };
        total += unit * u32::try_from(n).map_err(|_| bad())?;
        rest = &rest[len..];
    }
    Ok(total)
}

/// What is wrong with a metric before any argument is filled in: `(field, problem)`.
pub fn metric_problems(m: &Metric) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let p = &m.provider;
    let providers = [p.prometheus.is_some(), p.web.is_some(), p.job.is_some()]
        .iter()
        .filter(|x| **x)
        .count();
    if providers != 1 {
        out.push((
            "provider".into(),
            "set exactly one of prometheus, web or job".into(),
        ));
    }
    for (field, text) in [
        ("interval", Some(m.interval.as_str())),
        ("initialDelay", m.initial_delay.as_deref()),
        (
            "provider.prometheus.timeout",
            p.prometheus.as_ref().and_then(|p| p.timeout.as_deref()),
        ),
        (
            "provider.web.timeout",
            p.web.as_ref().and_then(|w| w.timeout.as_deref()),
        ),
    ] {
        if let Some(Err(e)) = text.map(parse_duration) {
            out.push((field.into(), e));
        }
    }
    if parse_duration(&m.interval).is_ok_and(|d| d < Duration::from_secs(1)) {
        out.push(("interval".into(), "must be at least 1s".into()));
    }
    for (field, cond) in [
        ("successCondition", &m.success_condition),
        ("failureCondition", &m.failure_condition),
    ] {
        if let Some(c) = cond
            && let Err(e) = compile(c)
        {
            out.push((field.into(), e));
        }
    }
    if let Some(web) = &p.web
        && let Some(path) = &web.json_path
        && let Err(e) = jsonpath_rust::parser::parse_json_path(path)
    {
        out.push((
            "provider.web.jsonPath".into(),
            format!("{path:?} is not a JSONPath: {e}"),
        ));
    }
    out
}

fn compile(condition: &str) -> Result<cel::Program, String> {
    if condition.len() > CONDITION_CHARS {
        return Err(format!("longer than {CONDITION_CHARS} characters"));
    }
    let program =
        cel::Program::compile(condition).map_err(|e| format!("{condition:?} is not CEL: {e}"))?;
    // CEL has no cost limit here, and a result can be a list of thousands: one macro such as
    // `result.all(x, x < 0.05)` is linear, but nested ones multiply.
    if comprehension_depth(program.expression()) > 1 {
        return Err(format!(
            "{condition:?} nests list macros (all, exists, map, filter) inside each other; use one"
        ));
    }
    Ok(program)
}

/// How deeply comprehensions (the list macros) nest in `e`.
fn comprehension_depth(e: &cel::IdedExpr) -> usize {
    use cel::common::ast::{EntryExpr, Expr, MapExpr, StructExpr};
    let deepest = |es: &mut dyn Iterator<Item = &cel::IdedExpr>| {
        es.map(comprehension_depth).max().unwrap_or(0)
    };
    match &e.expr {
        Expr::Comprehension(c) => {
            1 + deepest(
                &mut [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ]
                .into_iter(),
            )
        }
        Expr::Call(c) => deepest(&mut c.target.as_deref().into_iter().chain(&c.args)),
        Expr::List(l) => deepest(&mut l.elements.iter()),
        Expr::Select(s) => comprehension_depth(&s.operand),
        Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => {
            deepest(&mut entries.iter().flat_map(|x| match &x.expr {
                EntryExpr::MapEntry(e) => vec![&e.key, &e.value],
                EntryExpr::StructField(f) => vec![&f.value],
            }))
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => 0,
    }
}

fn holds(condition: &str, result: &Value) -> Result<bool, String> {
    let program = compile(condition)?;
    let mut context = cel::Context::default();
    let value = cel::to_value(result).map_err(|e| e.to_string())?;
    context.add_variable_from_value("result", value);
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("{condition} gave {other:?}, not true or false")),
        Err(e) => Err(format!("{condition}: {e}")),
    }
}

/// Judges `result` by the metric's conditions, as Argo Rollouts does: the failure condition
/// first, then the success condition; with both and neither holding, Inconclusive. Without
/// either, only `false` fails. The message names the condition that decided.
pub fn judge(metric: &Metric, result: &Value) -> (MeasurementPhase, Option<String>) {
    use MeasurementPhase::*;
    if let Some(f) = &metric.failure_condition {
        match holds(f, result) {
            Ok(true) => return (Failed, Some(format!("met failureCondition {f}"))),
            Ok(false) => {}
            Err(e) => return (Error, Some(e)),
        }
    }
    match (&metric.success_condition, &metric.failure_condition) {
        (Some(s), failure) => match holds(s, result) {
            Ok(true) => (Successful, None),
            Ok(false) if failure.is_some() => (
                Inconclusive,
                Some(format!(
                    "neither {s} nor {} held",
                    failure.as_deref().unwrap_or_default()
                )),
            ),
            Ok(false) => (Failed, Some(format!("failed {s}"))),
            Err(e) => (Error, Some(e)),
        },
        (None, Some(_)) => (Successful, None),
        (None, None) if *result == Value::Bool(false) => (Failed, Some("false".into())),
        (None, None) => (Successful, None),
    }
}

/// A provider's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Value(Value),
    /// The measurement could not be taken.
    Error(String),
}

fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > VALUE_CHARS {
        let cut: String = text.chars().take(VALUE_CHARS).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// Records one measurement of `m` in `st` and brings the metric's phase up to date.
pub fn record(
    m: &ResolvedMetric,
    st: &mut MetricStatus,
    outcome: Outcome,
    gate: bool,
    now: Timestamp,
) {
    let (phase, value, message) = match outcome {
        Outcome::Value(v) => {
            let (phase, message) = judge(&m.metric, &v);
            (phase, Some(shown(&v)), message)
        }
        Outcome::Error(e) => (MeasurementPhase::Error, None, Some(e)),
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
fn wanted(metric: &Metric, gate: bool) -> Option<i32> {
    metric.count.or(gate.then_some(1))
}

/// A metric's phase from its counts.
pub fn metric_phase(metric: &Metric, st: &MetricStatus, gate: bool) -> AnalysisPhase {
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
            }
        }
        let (phase, message) = run_phase(&run.metrics, metrics);
        run.phase = phase;
        run.message = Some(message);
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

/// A run's phase from its metrics, worst first, and the words for it.
fn run_phase(statuses: &[MetricStatus], metrics: &[ResolvedMetric]) -> (AnalysisPhase, String) {
    let spec = |st: &MetricStatus| metrics.iter().find(|m| m.metric.name == st.name);
    for phase in [
        AnalysisPhase::Failed,
        AnalysisPhase::Inconclusive,
        AnalysisPhase::Error,
    ] {
        if let Some(st) = statuses.iter().find(|s| s.phase == phase)
            && let Some(m) = spec(st)
        {
            return (phase, decided_by(&m.metric, st));
        }
    }
    let measuring: Vec<&MetricStatus> = statuses
        .iter()
        .filter(|s| s.phase == AnalysisPhase::Running)
        .collect();
    if measuring.is_empty() {
        let all = statuses
            .iter()
            .map(|s| format!("{} {}/{}", s.name, s.successful, s.count))
            .collect::<Vec<_>>()
            .join(", ");
        return (
            AnalysisPhase::Successful,
            format!("passed: {all} successful"),
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
    (AnalysisPhase::Running, format!("measuring {text}"))
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

/// Which metric decided and how, e.g. `error-rate 0.31 failed result < 0.05 (2 failed,
/// failureLimit 1)`.
pub fn decided_by(metric: &Metric, st: &MetricStatus) -> String {
    let last_of = |phase: MeasurementPhase| st.measurements.iter().rev().find(|m| m.phase == phase);
    match st.phase {
        AnalysisPhase::Failed => {
            let m = last_of(MeasurementPhase::Failed);
            format!(
                "{} {} {} ({} failed, failureLimit {})",
                st.name,
                m.and_then(|m| m.value.as_deref()).unwrap_or("?"),
                m.and_then(|m| m.message.as_deref()).unwrap_or("failed"),
                st.failed,
                metric.failure_limit
            )
        }
        AnalysisPhase::Inconclusive => {
            let m = last_of(MeasurementPhase::Inconclusive);
            format!(
                "{} {} inconclusive: {} ({} inconclusive, inconclusiveLimit {})",
                st.name,
                m.and_then(|m| m.value.as_deref()).unwrap_or("?"),
                m.and_then(|m| m.message.as_deref()).unwrap_or(""),
                st.inconclusive,
                metric.inconclusive_limit
            )
        }
        // Not the error's own text: it can differ each time (a Job's name, a request id), and
        // this message reaches status.message, whose every change is a write-back commit.
        AnalysisPhase::Error => format!(
            "{} could not be measured more than {} times in a row (its measurements say why: linnet get)",
            st.name, metric.consecutive_error_limit,
        ),
        _ => st.name.clone(),
    }
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

#[cfg(test)]
mod tests;
