//! `linnet get`'s analysis lines: each run's phase with its metrics' counts and last values
//! (and the judge's evidence against a baseline), then what decides each metric and what it
//! measures.

/// The most recent measurements shown per metric.
const MEASUREMENTS_SHOWN: usize = 5;

/// One line per analysis run: its phase, then each metric's counts and last values (`err`
/// for a measurement that could not be taken).
pub(super) fn analysis_lines(
    runs: &[crate::api::AnalysisRunStatus],
) -> Vec<(&'static str, String)> {
    runs.iter()
        .map(|run| {
            let metrics: Vec<String> = run
                .metrics
                .iter()
                .map(|m| {
                    let last: Vec<&str> = m
                        .measurements
                        .iter()
                        .rev()
                        .take(MEASUREMENTS_SHOWN)
                        .rev()
                        .map(|x| x.value.as_deref().unwrap_or("err"))
                        .collect();
                    // The run's message leaves the error's text out (it would change with
                    // each attempt); here it is.
                    let last_error = match m.measurements.last() {
                        Some(x) if x.phase == crate::api::MeasurementPhase::Error => format!(
                            ", last error: {}",
                            x.message
                                .as_deref()
                                .unwrap_or("")
                                .chars()
                                .take(160)
                                .collect::<String>()
                        ),
                        _ => String::new(),
                    };
                    // A metric judged against a baseline: the judge's evidence, numbers and all.
                    let judged = m
                        .comparison
                        .as_deref()
                        .map(|c| format!(", judged: {c}"))
                        .unwrap_or_default();
                    format!(
                        "{} {}/{} ok, {} failed{} [{}]{judged}{last_error}",
                        m.name,
                        m.successful,
                        m.count,
                        m.failed,
                        if m.errors > 0 {
                            format!(", {} errors", m.errors)
                        } else {
                            String::new()
                        },
                        last.join(" ")
                    )
                })
                .collect();
            (
                "Analysis",
                format!(
                    "{} {}{}: {}",
                    run.name,
                    run.phase,
                    run.score
                        .map(|s| format!(" (score {s})"))
                        .unwrap_or_default(),
                    metrics.join("; ")
                ),
            )
        })
        .chain(rules(runs))
        .collect()
}

/// What decides each metric and what it measures, once per metric however many runs have
/// it: `error-rate: success when result < 0.05; failureLimit 1; query sum(...)`.
fn rules(runs: &[crate::api::AnalysisRunStatus]) -> Vec<(&'static str, String)> {
    let mut seen = std::collections::BTreeSet::new();
    runs.iter()
        .flat_map(|r| &r.metrics)
        .filter(|m| m.condition.is_some() || m.query.is_some())
        .filter(|m| seen.insert(m.name.clone()))
        .map(|m| {
            let parts: Vec<String> = [
                m.condition.clone(),
                m.query.as_ref().map(|q| format!("query {q}")),
            ]
            .into_iter()
            .flatten()
            .collect();
            ("Metric", format!("{}: {}", m.name, parts.join("; ")))
        })
        .collect()
}
