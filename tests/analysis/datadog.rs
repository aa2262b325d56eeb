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
use linnet::api::{AnalysisPhase, AnalysisTemplate, CanaryDeployment, DeploymentPhase};
use serde_json::json;

use super::{completed_on, deploy_phase, run, support, template, web};
use support::rollout::Fixture;

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

/// Passing, failing, refused (400) and timed-out Datadog queries through a gate: the gate
/// passes, rolls back naming the value, and holds while the query errs, naming the error;
/// it goes on by itself once the query answers again.
#[tokio::test]
async fn a_datadog_query_passes_fails_errs_and_times_out_through_a_gate() {
    let authorized = Arc::new(AtomicUsize::new(0));
    let port = datadog_stand_in(authorized.clone()).await;
    let keys = tempfile::tempdir().unwrap();
    std::fs::write(keys.path().join("api"), "api-k3y\n").unwrap();
    std::fs::write(keys.path().join("app"), "app-k3y").unwrap();
    let patch = json!({"pause": "None", "analysis": {
        "gates": [{"after": 1, "templates": [{"templateName": "datadog"}]}],
    }});
    let mut f = Fixture::prepare("an-datadog", |ns| web(ns, patch)).await;
    let ns = f.ns.name.clone();
    let keys_dir = keys.path().display().to_string();
    let datadog = |query: &str| {
        template(
            &ns,
            "datadog",
            json!({"name": "errors", "interval": "1s", "count": 2,
                "successCondition": "result < 0.05", "consecutiveErrorLimit": 0,
                "provider": {"datadog": {"address": format!("http://127.0.0.1:{port}"),
                    "query": query, "window": "5m", "timeout": "1s",
                    "apiKeyFile": format!("{keys_dir}/api"),
                    "applicationKeyFile": format!("{keys_dir}/app")}}}),
        )
    };
    f.write_file("templates.yaml", &[datadog("pass")]);
    f.start_agent_with(&[
        format!("--analysis-url-prefix=http://127.0.0.1:{port}/"),
        format!("--analysis-files-dir={keys_dir}"),
    ])
    .await;
    f.wait_for("Completed on nginx:1.27", 120, |d: &CanaryDeployment| {
        completed_on(d, "nginx:1.27")
    })
    .await;

    // Passing: the gate's two measurements are the last point, 0.01.
    f.patch_spec(json!({"image": "nginx:1.28"}));
    let done = f
        .wait_for("Completed on nginx:1.28", 120, |d: &CanaryDeployment| {
            completed_on(d, "nginx:1.28")
        })
        .await;
    let runs = done.status.unwrap().analysis;
    let metric = &run(&runs, "after-1").metrics[0];
    assert_eq!(metric.successful, 2, "{metric:#?}");
    assert_eq!(metric.measurements[0].value.as_deref(), Some("0.01"));
    assert!(
        metric
            .query
            .as_deref()
            .is_some_and(|q| q.starts_with("Datadog pass over the last 5m at http://127.0.0.1:")),
        "{metric:#?}"
    );
    assert!(authorized.load(Ordering::Relaxed) >= 2);

    // Failing: 0.3, rolled back with the value and the condition.
    let templates = f.api::<AnalysisTemplate>();
    let with = |query: &'static str| {
        let api = templates.clone();
        async move {
            support::eventually(
                &format!("the {query} template in the cluster"),
                Duration::from_secs(60),
                || {
                    let api = api.clone();
                    async move {
                        let t = api.get("datadog").await.ok()?;
                        let provider = serde_json::to_value(&t.spec.metrics[0].provider).ok()?;
                        (provider["datadog"]["query"] == query).then_some(())
                    }
                },
            )
            .await
        }
    };
    f.write_file("templates.yaml", &[datadog("fail")]);
    with("fail").await;
    f.patch_spec(json!({"image": "nginx:1.29"}));
    let back = f
        .wait_for("RolledBack from 1.29", 120, |d: &CanaryDeployment| {
            deploy_phase(d) == Some(DeploymentPhase::RolledBack)
        })
        .await;
    let gate = run(&back.status.as_ref().unwrap().analysis, "after-1").clone();
    assert_eq!(gate.phase, AnalysisPhase::Failed, "{gate:#?}");
    let message = gate.message.unwrap_or_default();
    assert!(
        message.starts_with("errors 0.3 failed result < 0.05"),
        "{message}"
    );

    // Refused by the API (400): the gate holds, the measurement naming the answer.
    f.write_file("templates.yaml", &[datadog("refused")]);
    with("refused").await;
    f.patch_spec(json!({"image": "nginx:1.30"}));
    let erring = |what: &'static str| {
        move |d: &CanaryDeployment| {
            d.status.as_ref().is_some_and(|s| {
                s.analysis.iter().any(|r| {
                    r.name == "after-1"
                        && r.phase == AnalysisPhase::Error
                        && r.metrics[0]
                            .measurements
                            .last()
                            .and_then(|m| m.message.as_deref())
                            .is_some_and(|m| m.contains(what))
                })
            })
        }
    };
    let held = f
        .wait_for(
            "the gate erring on a 400",
            120,
            erring("answered 400 Bad Request"),
        )
        .await;
    assert_eq!(
        held.status.unwrap().stable_image.as_deref(),
        Some("nginx:1.28")
    );

    // Timing out (the answer after 3 s, the metric's timeout 1 s): still held, said so.
    f.write_file("templates.yaml", &[datadog("slow")]);
    with("slow").await;
    f.wait_for(
        "the gate erring on a timeout",
        120,
        erring("no answer within the metric's timeout"),
    )
    .await;

    // Answering again: the held gate goes on by itself and the canary completes.
    f.write_file("templates.yaml", &[datadog("pass")]);
    f.wait_for("Completed on nginx:1.30", 120, |d: &CanaryDeployment| {
        completed_on(d, "nginx:1.30")
    })
    .await;
}
