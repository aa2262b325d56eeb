//! The Datadog provider (issue 75): a metrics query over the last `window` by Datadog's
//! documented v1 API, `GET /api/v1/query?from=&to=&query=` with the `DD-API-KEY` and
//! `DD-APPLICATION-KEY` headers; `result` is the last point of the first series that has
//! one. The keys are read from files under `--analysis-files-dir` and sent only under an
//! `--analysis-url-prefix`, like a Prometheus bearer token.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::api::{DATADOG_DEFAULT_WINDOW, DatadogMetric};

use super::super::MeasureError;
use super::{client, json_answer, keys_allowed, read_token};

/// The most of an error text from Datadog kept in status.
const ERROR_CHARS: usize = 200;

pub(super) async fn datadog(
    ctx: &crate::controller::Context,
    d: &DatadogMetric,
    timeout: Duration,
) -> Result<Value, MeasureError> {
    keys_allowed(ctx, "datadog")?;
    let window = crate::plan::analysis::parse_duration(
        d.window.as_deref().unwrap_or(DATADOG_DEFAULT_WINDOW),
    )
    .unwrap_or(Duration::from_secs(300));
    let to = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_secs());
    let from = to.saturating_sub(window.as_secs().max(1));
    let url = reqwest::Url::parse_with_params(
        &format!("{}/api/v1/query", d.address()),
        &[
            ("from", from.to_string()),
            ("to", to.to_string()),
            ("query", d.query.clone()),
        ],
    )
    .map_err(|e| MeasureError::BadUrl {
        what: format!("Datadog address {:?}", d.address()),
        why: e.to_string(),
    })?;
    ctx.analysis.url(&url)?;
    let client = client(ctx, d.ca_file.as_deref())?;
    let api_key = read_token(ctx, "apiKeyFile", &d.api_key_file)?;
    let application_key = read_token(ctx, "applicationKeyFile", &d.application_key_file)?;
    let target = format!("Datadog {}", d.address());
    let request = client
        .get(url)
        .timeout(timeout)
        .header("DD-API-KEY", api_key)
        .header("DD-APPLICATION-KEY", application_key);
    let doc = json_answer(request, &target).await?;
    datadog_result(&doc)
}

/// `result` from a query answer: the last point of the first series that has one.
pub fn datadog_result(doc: &Value) -> Result<Value, MeasureError> {
    let answer = |text: String| MeasureError::Answer(text);
    if doc["status"] == "error" || doc["error"].is_string() {
        let why: String = doc["error"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(ERROR_CHARS)
            .collect();
        return Err(answer(format!("the query failed: {why}")));
    }
    let series = doc["series"].as_array().cloned().unwrap_or_default();
    if series.is_empty() {
        return Err(answer(
            "the query returned no series (no data in the window?)".into(),
        ));
    }
    series
        .iter()
        .find_map(|s| {
            s["pointlist"]
                .as_array()?
                .iter()
                .rev()
                .find_map(|p| p.get(1).filter(|v| v.is_number()).cloned())
        })
        .ok_or_else(|| answer("the query's series have no points".into()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The answer's shape as Datadog documents it (`GET /api/v1/query`).
    #[test]
    fn the_last_point_of_the_first_series_with_one_is_the_result() {
        let doc = json!({
            "status": "ok", "res_type": "time_series", "from_date": 1700000000000u64,
            "to_date": 1700000300000u64, "query": "sum:errors{service:web}",
            "series": [
                {"metric": "errors", "pointlist": [], "scope": "service:db"},
                {"metric": "errors", "scope": "service:web",
                 "pointlist": [[1700000000000.0, 0.5], [1700000060000.0, 0.25], [1700000120000.0, null]]}
            ]
        });
        assert_eq!(datadog_result(&doc).unwrap(), json!(0.25));
    }

    #[test]
    fn an_error_no_series_and_no_points_say_so() {
        let failed = json!({"status": "error", "error": "Rule 'sum:' is invalid"});
        assert_eq!(
            datadog_result(&failed).unwrap_err().to_string(),
            "the query failed: Rule 'sum:' is invalid"
        );
        let empty = json!({"status": "ok", "series": []});
        assert!(
            datadog_result(&empty)
                .unwrap_err()
                .to_string()
                .contains("no series")
        );
        let pointless = json!({"status": "ok", "series": [{"pointlist": [[1.0, null]]}]});
        assert!(
            datadog_result(&pointless)
                .unwrap_err()
                .to_string()
                .contains("no points")
        );
    }
}
