//! Issue 75: the CloudWatch provider against a stand-in for CloudWatch, not AWS itself. The
//! stand-in implements `GetMetricData` in CloudWatch's JSON protocol as AWS documents it
//! (<https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_GetMetricData.html>):
//! `POST /` with `X-Amz-Target: GraniteServiceVersion20100801.GetMetricData`, a request
//! signed with Signature Version 4 (checked here by signing the same request again with the
//! stand-in's copy of the secret: 403 `InvalidSignatureException` if it differs), 400
//! `InvalidParameterValueException` for an expression it refuses, and `MetricDataResults`
//! whose `Values` are newest first.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use linnet::sigv4;
use serde_json::{Value, json};

use super::provider_gate::{Provider, passes_fails_errs_and_times_out};
use super::support;

const ACCESS_KEY: &str = "AKIDLINNETTEST";
const SECRET_KEY: &str = "s3cret/linnet+test";
const SESSION_TOKEN: &str = "session-t0ken";
const REGION: &str = "eu-west-1";

/// Why the signature of a request is not the one the stand-in computes, if it is not.
fn signature_problem(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let amz_date = header("x-amz-date");
    let Some(at) = amz_date
        .get(..15)
        .map(|d| {
            format!(
                "{}-{}-{}T{}:{}:{}Z",
                &d[..4],
                &d[4..6],
                &d[6..8],
                &d[9..11],
                &d[11..13],
                &d[13..15]
            )
        })
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
    else {
        return Some(format!("x-amz-date {amz_date:?} is not a time"));
    };
    let expected = sigv4::sign(
        &sigv4::Request {
            method: "POST",
            host: header("host"),
            path: "/",
            query: &[],
            headers: &[
                ("content-type", header("content-type")),
                ("x-amz-target", header("x-amz-target")),
            ],
            body,
            region: REGION,
            service: "monitoring",
        },
        &sigv4::Credentials {
            access_key_id: ACCESS_KEY.into(),
            secret_access_key: SECRET_KEY.into(),
            session_token: Some(SESSION_TOKEN.into()),
        },
        at,
    );
    (header("authorization") != expected.authorization
        || header("x-amz-security-token") != SESSION_TOKEN)
        .then(|| format!("got {:?}", header("authorization")))
}

/// The answers by expression: `pass` 0.01, `fail` 0.3 (newest first, an older 0.9 after),
/// `refused` a 400, `slow` after 3 s.
async fn cloudwatch_stand_in(signed: Arc<AtomicUsize>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let get_metric_data = move |headers: HeaderMap, body: axum::body::Bytes| {
        let signed = signed.clone();
        async move {
            let error = |status: StatusCode, kind: &str, message: String| {
                (
                    status,
                    axum::Json(
                        json!({"__type": format!("com.amazonaws.cloudwatch#{kind}"), "message": message}),
                    ),
                )
            };
            if headers.get("x-amz-target").and_then(|v| v.to_str().ok())
                != Some("GraniteServiceVersion20100801.GetMetricData")
            {
                return error(
                    StatusCode::BAD_REQUEST,
                    "UnknownOperationException",
                    String::new(),
                );
            }
            if let Some(problem) = signature_problem(&headers, &body) {
                return error(StatusCode::FORBIDDEN, "InvalidSignatureException", problem);
            }
            signed.fetch_add(1, Ordering::Relaxed);
            let request: Value = serde_json::from_slice(&body).unwrap_or_default();
            let query = &request["MetricDataQueries"][0];
            let (Some(start), Some(end)) =
                (request["StartTime"].as_i64(), request["EndTime"].as_i64())
            else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "MissingRequiredParameterException",
                    "StartTime and EndTime".into(),
                );
            };
            let value = match query["Expression"].as_str().unwrap_or_default() {
                "pass" => 0.01,
                "fail" => 0.3,
                "slow" => {
                    // Past the metric's 1 s timeout: time is what this answer tests.
                    let why = "the stand-in answers a slow query after 3 s";
                    support::let_time_pass(why, Duration::from_secs(3)).await;
                    0.01
                }
                other => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "InvalidParameterValueException",
                        format!("Invalid metrics insights query: {other}"),
                    );
                }
            };
            (
                StatusCode::OK,
                axum::Json(json!({"MetricDataResults": [{
                    "Id": query["Id"], "Label": "errors", "StatusCode": "Complete",
                    "Timestamps": [end, start], "Values": [value, 0.9],
                }], "Messages": []})),
            )
        }
    };
    let router = axum::Router::new().route("/", axum::routing::post(get_metric_data));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

/// Passing, failing, refused (400) and timed-out CloudWatch expressions through a gate, every
/// request signed with temporary credentials.
#[tokio::test]
async fn a_cloudwatch_query_passes_fails_errs_and_times_out_through_a_gate() {
    let signed = Arc::new(AtomicUsize::new(0));
    let port = cloudwatch_stand_in(signed.clone()).await;
    let provider = move |query: &str, keys: &str| {
        json!({"cloudWatch": {"address": format!("http://127.0.0.1:{port}"),
            "region": REGION, "expression": query, "period": 60, "window": "5m",
            "timeout": "1s",
            "accessKeyIdFile": format!("{keys}/id"),
            "secretAccessKeyFile": format!("{keys}/secret"),
            "sessionTokenFile": format!("{keys}/token")}})
    };
    passes_fails_errs_and_times_out(Provider {
        prefix: "an-cloudwatch",
        port,
        scheme: "http",
        key_files: &[("id", &format!("{ACCESS_KEY}\n")), ("secret", SECRET_KEY), ("token", SESSION_TOKEN)],
        provider: &provider,
        query_shown: "CloudWatch pass over the last 5m every 60s at http://127.0.0.1:",
        refusal: "answered 400 Bad Request: InvalidParameterValueException Invalid metrics insights query",
    })
    .await;
    assert!(signed.load(Ordering::Relaxed) >= 2);
}
