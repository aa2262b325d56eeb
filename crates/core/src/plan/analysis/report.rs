//! The evidence of a metric in words (issue 75): what decides it, what it measures (with a
//! link to the provider's graph), and what its measurements showed. Set in the status when
//! a run is brought up to date, so every reader (`linnet get`, the dashboard, notifications,
//! promotion and revert pull requests) shows the same from the status alone. Only the
//! template's text and the values measured appear: credentials are files the agent reads,
//! never text, and a web metric's URL shows its password (or token) as `***` and loses its
//! query string.

use super::*;
use crate::api::{MetricProvider, WorseWhen};
use crate::text::redact_credentials;

/// Measured values shown per metric, newest last.
const VALUES_SHOWN: usize = 5;

/// The most of a query kept in status: a provider's text may be 64 KiB once filled in, and
/// every metric of every run carries its own in the rollout's status.
const QUERY_CHARS: usize = 1024;
/// The longest graph link kept (a longer one is left out: no browser takes it anyway).
const GRAPH_CHARS: usize = 2048;

/// Sets what `m` decides by and measures on its status `st`.
pub(super) fn describe(st: &mut MetricStatus, m: &ResolvedMetric) {
    st.condition = Some(condition(&m.metric));
    let canary = query(&m.metric.provider, &m.template);
    let base = m
        .metric
        .baseline
        .as_ref()
        .and_then(|b| query(&b.provider, &m.template));
    st.query = match (canary, base) {
        (Some(q), Some(base)) => Some(format!("canary: {q}; baseline: {base}")),
        (q, _) => q,
    }
    .map(|q| crate::text::one_line(&q, QUERY_CHARS));
    st.graph = m
        .metric
        .provider
        .prometheus
        .as_ref()
        .map(|p| {
            format!(
                "{}/graph?g0.expr={}&g0.tab=0",
                redact_credentials(&p.address).trim_end_matches('/'),
                crate::text::percent_encoded(&p.query)
            )
        })
        .filter(|g| g.len() <= GRAPH_CHARS);
}

/// What decides a measurement of `m`, e.g. `success when result < 0.05; failureLimit 1`.
fn condition(m: &Metric) -> String {
    if let Some(b) = &m.baseline {
        let worse = match b.worse {
            WorseWhen::Higher => "higher",
            WorseWhen::Lower => "lower",
        };
        return format!(
            "judged against the baseline (Mann-Whitney U): {worse} is worse, {} % tolerated, \
             {} % confidence, at least {} samples a side",
            b.tolerance_percent,
            b.confidence_percent.clamp(50, 99),
            b.min_samples.max(1)
        );
    }
    let mut parts = Vec::new();
    if let Some(c) = &m.success_condition {
        parts.push(format!("success when {c}"));
    }
    if let Some(c) = &m.failure_condition {
        parts.push(format!("failure when {c}"));
    }
    if m.provider.job.is_some() && parts.is_empty() {
        parts.push("success when the Job succeeds".into());
    }
    parts.push(format!("failureLimit {}", m.failure_limit));
    parts.join("; ")
}

/// What `p` measures, without anything secret.
fn query(p: &MetricProvider, template: &str) -> Option<String> {
    if let Some(prom) = &p.prometheus {
        return Some(prom.query.clone());
    }
    if let Some(web) = &p.web {
        return Some(format!(
            "{} {}",
            format!("{:?}", web.method).to_uppercase(),
            without_query(&redact_credentials(&web.url))
        ));
    }
    if let Some(dd) = &p.datadog {
        return Some(format!(
            "Datadog {} over the last {} at {}",
            dd.query,
            dd.window
                .as_deref()
                .unwrap_or(crate::api::DATADOG_DEFAULT_WINDOW),
            redact_credentials(dd.address())
        ));
    }
    if let Some(nr) = &p.new_relic {
        return Some(format!(
            "New Relic account {} {}{} at {}",
            nr.account_id,
            nr.query,
            nr.field
                .as_deref()
                .map(|f| format!(" (field {f})"))
                .unwrap_or_default(),
            redact_credentials(nr.address())
        ));
    }
    if let Some(cw) = &p.cloud_watch {
        return Some(format!(
            "CloudWatch {} over the last {} every {}s at {}",
            cw.expression,
            cw.window
                .as_deref()
                .unwrap_or(crate::api::CLOUDWATCH_DEFAULT_WINDOW),
            cw.period.unwrap_or(crate::api::CLOUDWATCH_DEFAULT_PERIOD),
            redact_credentials(&cw.address())
        ));
    }
    if let Some(influx) = &p.influxdb {
        return Some(format!(
            "InfluxDB {}{} on database {} at {}",
            influx.query,
            influx
                .field
                .as_deref()
                .map(|f| format!(" (field {f})"))
                .unwrap_or_default(),
            influx.database,
            redact_credentials(influx.address())
        ));
    }
    p.job
        .as_ref()
        .map(|_| format!("a Job from AnalysisTemplate {template}"))
}

/// `url` without its query string or fragment (where an API key may be).
fn without_query(url: &str) -> String {
    url.split(['?', '#']).next().unwrap_or(url).to_string()
}

/// One metric's evidence in a line, e.g. `error-rate: Successful, 12 measurements (12
/// successful, 0 failed, 0 inconclusive), last 0.004, 0.003; success when result < 0.05;
/// failureLimit 1; query sum(rate(...)) (graph: http://...)`.
pub fn metric_line(st: &MetricStatus) -> String {
    let mut line = format!("{}: {:?}", st.name, st.phase);
    if let Some(c) = &st.comparison {
        line.push_str(&format!(", {c}"));
    } else {
        line.push_str(&format!(
            ", {} measurements ({} successful, {} failed, {} inconclusive)",
            st.count, st.successful, st.failed, st.inconclusive
        ));
        let values: Vec<&str> = st
            .measurements
            .iter()
            .filter_map(|m| m.value.as_deref())
            .collect();
        if !values.is_empty() {
            let shown = &values[values.len().saturating_sub(VALUES_SHOWN)..];
            line.push_str(&format!(", last {}", shown.join(", ")));
        }
    }
    if st.errors > 0 {
        line.push_str(&format!(", {} could not be measured", st.errors));
    }
    if let Some(c) = &st.condition {
        line.push_str(&format!("; {c}"));
    }
    if let Some(q) = &st.query {
        line.push_str(&format!("; query {q}"));
    }
    if let Some(g) = &st.graph {
        line.push_str(&format!(" (graph: {g})"));
    }
    line
}

/// A run and its metrics, as Markdown list items: the run's line, then a nested line per
/// metric.
pub fn run_lines(run: &AnalysisRunStatus) -> String {
    let mut out = format!(
        "- analysis {}: {:?}{}",
        run.name,
        run.phase,
        run.message
            .as_deref()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default()
    );
    for st in &run.metrics {
        out.push_str(&format!("\n  - {}", metric_line(st)));
    }
    out
}

/// The runs' lines ([`run_lines`]) joined, at most `max` bytes, cut at a line with a last
/// line that says where the rest is: what a pull request body or a notification carries
/// (each metric's text is bounded, but not the number of metrics a template may have).
pub fn runs_text(runs: &[AnalysisRunStatus], max: usize) -> String {
    const MORE: &str = "- (more in the rollout's status: linnet get)";
    let mut out = String::new();
    for line in runs
        .iter()
        .map(run_lines)
        .flat_map(|r| r.lines().map(str::to_string).collect::<Vec<_>>())
    {
        if out.len() + line.len() + 1 + MORE.len() + 1 > max {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(MORE);
            break;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_loses_its_credentials_and_query_string() {
        assert_eq!(
            without_query(&redact_credentials(
                "https://user:s3cret@api.example:8443/v1/query?api_key=abc#x"
            )),
            "https://user:***@api.example:8443/v1/query"
        );
        assert_eq!(
            without_query(&redact_credentials("https://t0k/en@api.example/q")),
            "https://***@api.example/q"
        );
    }

    /// Regression: a provider's text from Git may be 64 KiB once filled in; the status keeps
    /// a bounded line of it, and no graph link that long.
    #[test]
    fn a_long_query_is_cut_in_status_and_gets_no_graph() {
        let m: Metric = serde_json::from_value(serde_json::json!({
            "name": "long", "interval": "10s",
            "provider": {"prometheus": {"address": "http://p:9090", "query": "x\n".repeat(30_000)}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let resolved = ResolvedMetric {
            template: "t".into(),
            interval: Duration::from_secs(10),
            initial_delay: Duration::ZERO,
            timeout: Duration::from_secs(10),
            metric: m,
        };
        let mut st = MetricStatus::default();
        describe(&mut st, &resolved);
        let q = st.query.unwrap_or_default();
        assert_eq!(q.chars().count(), QUERY_CHARS);
        assert!(!q.contains('\n') && q.ends_with('…'), "{q}");
        assert_eq!(st.graph, None);
    }
}
