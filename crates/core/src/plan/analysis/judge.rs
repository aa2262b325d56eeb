//! Judging one measurement: what may be wrong with a metric before it runs, its CEL conditions
//! (compiled with bounds on what Git may ask of them), and the phase a result gets.

use super::*;

/// Why a condition cannot be compiled or evaluated.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConditionError {
    #[error("longer than {CONDITION_CHARS} characters")]
    TooLong,
    #[error("{condition:?} is not CEL: {why}")]
    NotCel { condition: String, why: String },
    #[error(
        "{condition:?} nests list macros (all, exists, map, filter) inside each other; use one"
    )]
    Nested { condition: String },
    #[error("the result cannot be given to CEL: {0}")]
    Result(String),
    #[error("{condition} gave {got}, not true or false")]
    NotBool { condition: String, got: String },
    #[error("{condition}: {why}")]
    Failed { condition: String, why: String },
}

/// What is wrong with a metric before any argument is filled in: `(field, problem)`.
pub fn metric_problems(m: &Metric) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let p = &m.provider;
    if p.named().len() != 1 {
        out.push((
            "provider".into(),
            "set exactly one of prometheus, web, datadog, newRelic, cloudWatch, influxdb or job"
                .into(),
        ));
    }
    let timeout = p.timeout();
    for (field, text) in [
        ("interval", Some(m.interval.as_str())),
        ("initialDelay", m.initial_delay.as_deref()),
        (
            timeout.map_or("provider.timeout", |(field, _)| field),
            timeout.map(|(_, t)| t),
        ),
        (
            "provider.datadog.window",
            p.datadog.as_ref().and_then(|d| d.window.as_deref()),
        ),
        (
            "provider.cloudWatch.window",
            p.cloud_watch.as_ref().and_then(|c| c.window.as_deref()),
        ),
    ] {
        if let Some(Err(e)) = text.map(parse_duration) {
            out.push((field.into(), e.to_string()));
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
            out.push((field.into(), e.to_string()));
        }
    }
    if let Some(b) = &m.baseline {
        out.extend(super::baseline::problems(m, b));
    }
    if let Some(Err(why)) = p
        .influxdb
        .as_ref()
        .map(|i| crate::api::influxql_read_only(&i.query))
    {
        out.push(("provider.influxdb.query".into(), why.to_string()));
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

pub(super) fn compile(condition: &str) -> Result<cel::Program, ConditionError> {
    if condition.len() > CONDITION_CHARS {
        return Err(ConditionError::TooLong);
    }
    let program = cel::Program::compile(condition).map_err(|e| ConditionError::NotCel {
        condition: condition.to_string(),
        why: e.to_string(),
    })?;
    // CEL has no cost limit here, and a result can be a list of thousands: one macro such as
    // `result.all(x, x < 0.05)` is linear, but nested ones multiply.
    if comprehension_depth(program.expression()) > 1 {
        return Err(ConditionError::Nested {
            condition: condition.to_string(),
        });
    }
    Ok(program)
}

/// How deeply comprehensions (the list macros) nest in `e`.
pub(super) fn comprehension_depth(e: &cel::IdedExpr) -> usize {
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

pub(super) fn holds(condition: &str, result: &Value) -> Result<bool, ConditionError> {
    let program = compile(condition)?;
    let mut context = cel::Context::default();
    let value = cel::to_value(result).map_err(|e| ConditionError::Result(e.to_string()))?;
    context.add_variable_from_value("result", value);
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(ConditionError::NotBool {
            condition: condition.to_string(),
            got: format!("{other:?}"),
        }),
        Err(e) => Err(ConditionError::Failed {
            condition: condition.to_string(),
            why: e.to_string(),
        }),
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
            Err(e) => return (Error, Some(e.to_string())),
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
            Err(e) => (Error, Some(e.to_string())),
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
    /// A metric with a baseline: the canary's sample and the baseline's.
    Pair {
        canary: Value,
        baseline: Value,
    },
    /// The measurement could not be taken.
    Error(String),
}

pub(super) fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > VALUE_CHARS {
        let cut: String = text.chars().take(VALUE_CHARS).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// Which metric decided and how, e.g. `error-rate 0.31 failed result < 0.05 (2 failed,
/// failureLimit 1)`.
pub fn decided_by(metric: &Metric, st: &MetricStatus) -> String {
    if metric.baseline.is_some()
        && matches!(
            st.phase,
            AnalysisPhase::Failed | AnalysisPhase::Inconclusive
        )
    {
        return format!("{} {}", st.name, st.comparison.as_deref().unwrap_or("?"));
    }
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
