//! The measurement providers: a Prometheus instant query, a web request, a Datadog query, a
//! New Relic NRQL query, a CloudWatch expression and an InfluxQL query, each bounded in time and answer size,
//! with the token files and URLs the policy allows.

use std::time::Duration;

use serde_json::Value;

use crate::api::{PrometheusMetric, WebMethod, WebMetric};
use crate::plan::analysis::{Outcome, ResolvedMetric};

use super::*;

/// The most of an answer read; a metric's answer is a number or a small JSON document.
pub(super) const MAX_ANSWER_BYTES: usize = 256 * 1024;
/// The most of a bearer token file read.
const MAX_TOKEN_BYTES: u64 = 16 * 1024;

mod cloudwatch;
mod datadog;
mod influxdb;
mod newrelic;

pub(super) async fn query(ctx: &crate::controller::Context, m: &ResolvedMetric) -> Outcome {
    let p = &m.metric.provider;
    let result = if let Some(prom) = &p.prometheus {
        prometheus(ctx, prom, m.timeout).await
    } else if let Some(web) = &p.web {
        web_request(ctx, web, m.timeout).await
    } else if let Some(dd) = &p.datadog {
        datadog::datadog(ctx, dd, m.timeout).await
    } else if let Some(nr) = &p.new_relic {
        newrelic::new_relic(ctx, nr, m.timeout).await
    } else if let Some(cw) = &p.cloud_watch {
        cloudwatch::cloud_watch(ctx, cw, m.timeout).await
    } else if let Some(influx) = &p.influxdb {
        influxdb::influxdb(ctx, influx, m.timeout).await
    } else {
        Err(MeasureError::Answer("the metric has no provider".into()))
    };
    match result {
        Ok(v) => Outcome::Value(v),
        // A URL in Git may carry a password; the error is kept in status.
        Err(e) => Outcome::Error(crate::text::redact_credentials(&e.to_string())),
    }
}

/// A metric's measurement: its own query, or with a `baseline` the canary's and the
/// baseline's together (a pair, or the first error).
pub(super) async fn measured(ctx: &crate::controller::Context, m: &ResolvedMetric) -> Outcome {
    let Some(b) = &m.metric.baseline else {
        return query(ctx, m).await;
    };
    let mut base = m.clone();
    base.metric.provider = b.provider.clone();
    base.metric.baseline = None;
    match tokio::join!(query(ctx, m), query(ctx, &base)) {
        (Outcome::Value(canary), Outcome::Value(baseline)) => Outcome::Pair { canary, baseline },
        (Outcome::Error(e), _) => Outcome::Error(e),
        (_, Outcome::Error(e)) => Outcome::Error(format!("the baseline's query: {e}")),
        _ => Outcome::Error("a query gave no single answer".into()),
    }
}

/// A request to `target` that got no (whole) answer. A timeout is the metric's own, not the
/// agent's Git one that `net::explain_http` names.
fn unreachable(target: &str, e: &reqwest::Error) -> MeasureError {
    let why = if e.is_timeout() {
        format!(
            "no answer within the metric's timeout (its provider's `timeout`, 10s unless set): {}",
            crate::error::error_chain(e)
        )
    } else {
        crate::net::explain_http(e).1
    };
    MeasureError::Unreachable {
        target: target.to_string(),
        why,
    }
}

/// Reads at most [`MAX_ANSWER_BYTES`] of a body; more is an error.
async fn body(mut r: reqwest::Response, target: &str) -> Result<Vec<u8>, MeasureError> {
    let mut out = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| unreachable(target, &e))? {
        if out.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(MeasureError::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A token or key from the file `field` names, `path` in the template (inside
/// `--analysis-files-dir`), at most [`MAX_TOKEN_BYTES`], trimmed.
fn read_token(
    ctx: &crate::controller::Context,
    field: &'static str,
    path: &str,
) -> Result<String, MeasureError> {
    use std::io::Read;
    let path = ctx.analysis.file(field, path)?;
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_TOKEN_BYTES).read_to_string(&mut text))
        .map_err(|source| MeasureError::Token {
            field,
            path: path.clone(),
            source,
        })?;
    Ok(text.trim().to_string())
}

/// Sends `request` and reads its answer as JSON: an answer other than 2xx is an error named
/// by its status only (an answer's body is not for the rollout's status).
async fn json_answer(
    request: reqwest::RequestBuilder,
    target: &str,
) -> Result<Value, MeasureError> {
    json_answer_explained(request, target, |_| None).await
}

/// As [`json_answer`], with what `explain` reads from a refusal's JSON (a documented error
/// code, say) after its status.
async fn json_answer_explained(
    request: reqwest::RequestBuilder,
    target: &str,
    explain: impl Fn(&Value) -> Option<String>,
) -> Result<Value, MeasureError> {
    let answer = request.send().await.map_err(|e| unreachable(target, &e))?;
    let status = answer.status();
    let bytes = body(answer, target).await?;
    let doc = serde_json::from_slice::<Value>(&bytes);
    if !status.is_success() {
        let why = doc
            .ok()
            .as_ref()
            .and_then(explain)
            .map(|why| format!(": {why}"))
            .unwrap_or_default();
        return Err(MeasureError::Answer(format!(
            "{target} answered {status}{why}"
        )));
    }
    doc.map_err(|_| MeasureError::Answer(format!("{target} answered {status} with no JSON")))
}

/// Keys go only where the operator said queries may go: refused without an
/// `--analysis-url-prefix`.
fn keys_allowed(ctx: &crate::controller::Context, provider: &str) -> Result<(), MeasureError> {
    if ctx.analysis.url_prefixes.is_empty() {
        return Err(MeasureError::Refused(format!(
            "{provider} is refused: the agent sends API keys only under --analysis-url-prefix, \
             and none is set"
        )));
    }
    Ok(())
}

/// The HTTP client for a provider, trusting its `caFile` (inside `--analysis-files-dir`).
fn client(
    ctx: &crate::controller::Context,
    ca_file: Option<&str>,
) -> Result<reqwest::Client, MeasureError> {
    let ca_file = ca_file
        .map(|f| ctx.analysis.file("caFile", f))
        .transpose()?;
    ctx.http.get(ca_file.as_deref())
}

async fn prometheus(
    ctx: &crate::controller::Context,
    p: &PrometheusMetric,
    timeout: Duration,
) -> Result<Value, MeasureError> {
    let client = client(ctx, p.ca_file.as_deref())?;
    let url = reqwest::Url::parse_with_params(
        &format!("{}/api/v1/query", p.address.trim_end_matches('/')),
        &[("query", p.query.as_str())],
    )
    .map_err(|e| MeasureError::BadUrl {
        what: format!("Prometheus address {:?}", p.address),
        why: e.to_string(),
    })?;
    // The URL as it will be requested (parsed and normalised), not as written.
    ctx.analysis.url(&url)?;
    let mut request = client.get(url).timeout(timeout);
    if let Some(file) = &p.bearer_token_file {
        // A token goes only where the operator said queries may go.
        if ctx.analysis.url_prefixes.is_empty() {
            return Err(MeasureError::Refused(
                "bearerTokenFile is refused: the agent sends tokens only under --analysis-url-prefix, and none is set"
                    .into(),
            ));
        }
        request = request.bearer_auth(read_token(ctx, "bearerTokenFile", file)?);
    }
    let target = format!("Prometheus {}", p.address);
    let answer = request.send().await.map_err(|e| unreachable(&target, &e))?;
    let status = answer.status();
    let bytes = body(answer, &target).await?;
    let doc: Value = serde_json::from_slice(&bytes)
        .map_err(|_| MeasureError::Answer(format!("{target} answered {status} with no JSON")))?;
    prometheus_result(&doc)
}

/// `result` from a Prometheus query answer.
pub fn prometheus_result(doc: &Value) -> Result<Value, MeasureError> {
    let answer = |text: String| MeasureError::Answer(text);
    if doc["status"] != "success" {
        return Err(answer(format!(
            "the query failed: {} {}",
            doc["errorType"].as_str().unwrap_or(""),
            doc["error"].as_str().unwrap_or("")
        )));
    }
    let number = |sample: &Value| -> Result<Value, MeasureError> {
        let text = sample[1].as_str().unwrap_or("");
        let x: f64 = text
            .parse()
            .map_err(|_| answer(format!("the query gave {text:?}, not a number")))?;
        serde_json::Number::from_f64(x)
            .map(Value::Number)
            .ok_or_else(|| answer(format!("the query gave {text} (no traffic yet?)")))
    };
    let data = &doc["data"];
    match data["resultType"].as_str() {
        Some("scalar") => number(&data["result"]),
        Some("vector") => {
            let samples = data["result"].as_array().cloned().unwrap_or_default();
            match samples.as_slice() {
                [] => Err(answer("the query returned no samples".into())),
                [one] => number(&one["value"]),
                many => many
                    .iter()
                    .map(|s| number(&s["value"]))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::Array),
            }
        }
        other => Err(answer(format!(
            "the query gave a {}, not a scalar or an instant vector",
            other.unwrap_or("nothing")
        ))),
    }
}

async fn web_request(
    ctx: &crate::controller::Context,
    w: &WebMetric,
    timeout: Duration,
) -> Result<Value, MeasureError> {
    let url = reqwest::Url::parse(&w.url).map_err(|e| MeasureError::BadUrl {
        what: format!("url {:?}", w.url),
        why: e.to_string(),
    })?;
    ctx.analysis.url(&url)?;
    let client = client(ctx, w.ca_file.as_deref())?;
    let mut request = match w.method {
        WebMethod::Get => client.get(url),
        WebMethod::Post => client.post(url).body(w.body.clone().unwrap_or_default()),
    }
    .timeout(timeout);
    for h in &w.headers {
        request = request.header(&h.key, &h.value);
    }
    let doc = json_answer(request, &w.url).await?;
    match &w.json_path {
        None => Ok(doc),
        Some(path) => {
            use jsonpath_rust::JsonPath;
            let found = doc
                .query(path)
                .map_err(|e| MeasureError::Answer(format!("jsonPath {path}: {e}")))?;
            match found.as_slice() {
                [] => Err(MeasureError::Answer(format!(
                    "jsonPath {path} matched nothing in the answer"
                ))),
                [one] => Ok((*one).clone()),
                many => Ok(Value::Array(many.iter().map(|v| (*v).clone()).collect())),
            }
        }
    }
}
