//! Issue 75: the Datadog provider against a stand-in for Datadog's API, not Datadog itself.
//! The stand-in implements `GET /api/v1/query` as Datadog documents it
//! (<https://docs.datadoghq.com/api/latest/metrics/#query-timeseries-points>): the keys in
//! `DD-API-KEY` and `DD-APPLICATION-KEY` (403 without them), `from`, `to` (seconds) and
//! `query` parameters, 400 with `{"errors": [...]}` for a query it refuses, and an answer
//! whose `series[].pointlist` holds `[milliseconds, value]` points.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use serde_json::json;

use super::provider_gate::{Provider, passes_fails_errs_and_times_out};
use super::support;

/// The answers by query: `pass` 0.01, `fail` 0.3, `refused` a 400, `slow` after 3 s.
async fn datadog_stand_in(authorized: Arc<AtomicUsize>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let query = move |headers: HeaderMap, uri: axum::http::Uri| {
        let authorized = authorized.clone();
        async move {
            let params: HashMap<String, String> = reqwest::Url::parse(&format!("http://dd{uri}"))
                .map(|u| u.query_pairs().into_owned().collect())
                .unwrap_or_default();
            let key = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
            if key("DD-API-KEY") != Some("api-k3y") || key("DD-APPLICATION-KEY") != Some("app-k3y")
            {
                return (
                    StatusCode::FORBIDDEN,
                    axum::Json(json!({"errors": ["Forbidden"]})),
                );
            }
            let (Some(from), Some(to)) = (
                params.get("from").and_then(|t| t.parse::<u64>().ok()),
                params.get("to").and_then(|t| t.parse::<u64>().ok()),
            ) else {
                return (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({"errors": ["from and to are required"]})),
                );
            };
            authorized.fetch_add(1, Ordering::Relaxed);
            let q = params.get("query").cloned().unwrap_or_default();
            let value = match q.as_str() {
                "pass" => 0.01,
                "fail" => 0.3,
                "slow" => {
                    // Past the metric's 1 s timeout: time is what this answer tests.
                    let why = "the stand-in answers a slow query after 3 s";
                    support::let_time_pass(why, Duration::from_secs(3)).await;
                    0.01
                }
                _ => {
                    return (
                        StatusCode::BAD_REQUEST,
                        axum::Json(json!({"errors": [format!("Error parsing query: {q}")]})),
                    );
                }
            };
            let point = |secs: u64, v: f64| json!([secs as f64 * 1000.0, v]);
            (
                StatusCode::OK,
                axum::Json(json!({
                    "status": "ok", "res_type": "time_series", "query": q,
                    "from_date": from * 1000, "to_date": to * 1000,
                    "series": [{"metric": "errors", "scope": "service:web",
                        "pointlist": [point(from, 0.9), point(to, value)]}]
                })),
            )
        }
    };
    let router = axum::Router::new().route("/api/v1/query", axum::routing::get(query));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

/// Passing, failing, refused (400) and timed-out Datadog queries through a gate.
#[tokio::test]
async fn a_datadog_query_passes_fails_errs_and_times_out_through_a_gate() {
    let authorized = Arc::new(AtomicUsize::new(0));
    let port = datadog_stand_in(authorized.clone()).await;
    let provider = move |query: &str, keys: &str| {
        json!({"datadog": {"address": format!("http://127.0.0.1:{port}"),
            "query": query, "window": "5m", "timeout": "1s",
            "apiKeyFile": format!("{keys}/api"),
            "applicationKeyFile": format!("{keys}/app")}})
    };
    passes_fails_errs_and_times_out(Provider {
        prefix: "an-datadog",
        port,
        scheme: "http",
        key_files: &[("api", "api-k3y\n"), ("app", "app-k3y")],
        provider: &provider,
        query_shown: "Datadog pass over the last 5m at http://127.0.0.1:",
        refusal: "answered 400 Bad Request",
    })
    .await;
    assert!(authorized.load(Ordering::Relaxed) >= 2);
}
