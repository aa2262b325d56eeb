//! Issue 75: the New Relic provider against a stand-in for NerdGraph, not New Relic itself.
//! The stand-in implements `POST /graphql` as New Relic documents it for NRQL queries
//! (<https://docs.newrelic.com/docs/apis/nerdgraph/examples/nerdgraph-nrql-tutorial/>): the
//! user key in `API-Key` (401 without it), a GraphQL document reading
//! `actor { account(id) { nrql(query) { results } } }`, and a `200` answer with `errors` for a
//! query NRQL refuses, or with `data.actor.account.nrql.results` rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::provider_gate::{Provider, passes_fails_errs_and_times_out};
use super::support;

/// The account the stand-in serves.
const ACCOUNT: u64 = 4242;

/// The answers by NRQL: `pass` 0.01, `fail` 0.3 (in field `errors`, beside `count`),
/// `refused` a syntax error, `slow` after 3 s.
async fn nerdgraph_stand_in(authorized: Arc<AtomicUsize>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let graphql = move |headers: HeaderMap, axum::Json(request): axum::Json<Value>| {
        let authorized = authorized.clone();
        async move {
            if headers.get("API-Key").and_then(|v| v.to_str().ok()) != Some("NRAK-t3st") {
                return (
                    StatusCode::UNAUTHORIZED,
                    axum::Json(json!({"errors": [{"message": "Invalid API key"}]})),
                );
            }
            let document = request["query"].as_str().unwrap_or_default();
            let variables = &request["variables"];
            if !document.contains("nrql(query: $nrql")
                || variables["accountId"] != json!(ACCOUNT)
                || !variables["timeout"].is_u64()
            {
                return (
                    StatusCode::OK,
                    axum::Json(json!({"errors": [{"message": format!(
                        "the stand-in serves account {ACCOUNT}'s NRQL only: {request}")}]})),
                );
            }
            authorized.fetch_add(1, Ordering::Relaxed);
            let nrql = variables["nrql"].as_str().unwrap_or_default();
            let value = match nrql {
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
                        StatusCode::OK,
                        axum::Json(json!({
                            "data": {"actor": {"account": {"nrql": null}}},
                            "errors": [{"message": format!("NRQL Syntax Error: Error at line 1 position 1, unexpected '{nrql}'"),
                                "path": ["actor", "account", "nrql"]}]
                        })),
                    );
                }
            };
            (
                StatusCode::OK,
                axum::Json(json!({"data": {"actor": {"account": {"nrql": {
                    "results": [{"errors": value, "count": 1200}]
                }}}}})),
            )
        }
    };
    let router = axum::Router::new().route("/graphql", axum::routing::post(graphql));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

/// Passing, failing, refused (an NRQL syntax error) and timed-out New Relic queries through a
/// gate.
#[tokio::test]
async fn a_new_relic_query_passes_fails_errs_and_times_out_through_a_gate() {
    let authorized = Arc::new(AtomicUsize::new(0));
    let port = nerdgraph_stand_in(authorized.clone()).await;
    let provider = move |query: &str, keys: &str| {
        json!({"newRelic": {"address": format!("http://127.0.0.1:{port}"),
            "accountId": ACCOUNT, "query": query, "field": "errors", "timeout": "1s",
            "apiKeyFile": format!("{keys}/key")}})
    };
    passes_fails_errs_and_times_out(Provider {
        prefix: "an-newrelic",
        port,
        scheme: "http",
        key_files: &[("key", "NRAK-t3st\n")],
        provider: &provider,
        query_shown: "New Relic account 4242 pass (field errors) at http://127.0.0.1:",
        refusal: "the query failed: NRQL Syntax Error",
    })
    .await;
    assert!(authorized.load(Ordering::Relaxed) >= 2);
}
