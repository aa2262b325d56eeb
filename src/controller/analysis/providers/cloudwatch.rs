//! The CloudWatch provider (issue 75): one expression by `GetMetricData` in CloudWatch's
//! documented JSON protocol (`POST /`, `X-Amz-Target:
//! GraniteServiceVersion20100801.GetMetricData`, `application/x-amz-json-1.0`), signed with
//! AWS Signature Version 4 ([`crate::sigv4`]); `result` is the expression's most recent value.
//! The keys are read from files under `--analysis-files-dir` and sent only under an
//! `--analysis-url-prefix`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::api::{CLOUDWATCH_DEFAULT_PERIOD, CLOUDWATCH_DEFAULT_WINDOW, CloudWatchMetric};
use crate::sigv4;

use super::super::MeasureError;
use super::{client, json_answer_explained, keys_allowed, read_token};

/// The most of an error text from CloudWatch kept in status.
const ERROR_CHARS: usize = 200;
/// The query's id in the request, and the result looked for in the answer.
const QUERY_ID: &str = "linnet";
const TARGET: &str = "GraniteServiceVersion20100801.GetMetricData";
const CONTENT_TYPE: &str = "application/x-amz-json-1.0";

pub(super) async fn cloud_watch(
    ctx: &crate::controller::Context,
    cw: &CloudWatchMetric,
    timeout: Duration,
) -> Result<Value, MeasureError> {
    keys_allowed(ctx, "cloudWatch")?;
    let address = cw.address();
    let url = reqwest::Url::parse(&format!("{address}/")).map_err(|e| MeasureError::BadUrl {
        what: format!("CloudWatch address {address:?}"),
        why: e.to_string(),
    })?;
    ctx.analysis.url(&url)?;
    let host = match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        (None, _) => {
            return Err(MeasureError::BadUrl {
                what: format!("CloudWatch address {address:?}"),
                why: "it has no host".into(),
            });
        }
    };
    let credentials = sigv4::Credentials {
        access_key_id: read_token(ctx, "accessKeyIdFile", &cw.access_key_id_file)?,
        secret_access_key: read_token(ctx, "secretAccessKeyFile", &cw.secret_access_key_file)?,
        session_token: cw
            .session_token_file
            .as_deref()
            .map(|f| read_token(ctx, "sessionTokenFile", f))
            .transpose()?,
    };
    let now = jiff::Timestamp::now();
    let body = serde_json::to_vec(&request_body(cw, now.as_second())).unwrap_or_default();
    let signature = sigv4::sign(
        &sigv4::Request {
            method: "POST",
            host: &host,
            path: url.path(),
            query: &[],
            headers: &[("content-type", CONTENT_TYPE), ("x-amz-target", TARGET)],
            body: &body,
            region: &cw.region,
            service: "monitoring",
        },
        &credentials,
        now,
    );
    let mut request = client(ctx, cw.ca_file.as_deref())?
        .post(url)
        .timeout(timeout)
        .header("content-type", CONTENT_TYPE)
        .header("x-amz-target", TARGET)
        .header("x-amz-date", signature.amz_date)
        .header("authorization", signature.authorization);
    if let Some(token) = signature.security_token {
        request = request.header("x-amz-security-token", token);
    }
    let target = format!("CloudWatch {address}");
    let doc = json_answer_explained(request.body(body), &target, aws_error).await?;
    cloud_watch_result(&doc)
}

/// The `GetMetricData` request: the expression over the last `window`, newest first.
fn request_body(cw: &CloudWatchMetric, now: i64) -> Value {
    let window = crate::plan::analysis::parse_duration(
        cw.window.as_deref().unwrap_or(CLOUDWATCH_DEFAULT_WINDOW),
    )
    .unwrap_or(Duration::from_secs(300));
    let start = now.saturating_sub(i64::try_from(window.as_secs().max(1)).unwrap_or(300));
    json!({
        "MetricDataQueries": [{
            "Id": QUERY_ID,
            "Expression": cw.expression,
            "Period": cw.period.unwrap_or(CLOUDWATCH_DEFAULT_PERIOD),
            "ReturnData": true,
        }],
        "StartTime": start,
        "EndTime": now,
        "ScanBy": "TimestampDescending",
    })
}

/// An AWS JSON error's type (after its namespace's `#`) and message.
fn aws_error(doc: &Value) -> Option<String> {
    let kind = doc["__type"].as_str()?.rsplit('#').next()?;
    let message: String = doc["message"]
        .as_str()
        .or(doc["Message"].as_str())
        .unwrap_or("")
        .chars()
        .take(ERROR_CHARS)
        .collect();
    Some(format!("{kind} {message}").trim_end().to_string())
}

/// `result` from a `GetMetricData` answer: the first (newest) value of this query's result.
pub fn cloud_watch_result(doc: &Value) -> Result<Value, MeasureError> {
    let answer = |text: String| MeasureError::Answer(text);
    let Some(result) = doc["MetricDataResults"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["Id"] == QUERY_ID))
    else {
        return Err(answer("the answer has no result for the expression".into()));
    };
    let status = result["StatusCode"].as_str().unwrap_or("");
    if status == "InternalError" || status == "Forbidden" {
        let messages: String = result["Messages"]
            .as_array()
            .into_iter()
            .chain(doc["Messages"].as_array())
            .flatten()
            .filter_map(|m| m["Value"].as_str())
            .collect::<Vec<_>>()
            .join("; ")
            .chars()
            .take(ERROR_CHARS)
            .collect();
        return Err(answer(format!(
            "the expression's status is {status}: {messages}"
        )));
    }
    result["Values"]
        .as_array()
        .and_then(|v| v.first())
        .filter(|v| v.is_number())
        .cloned()
        .ok_or_else(|| answer("the expression has no data points in the window".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer's shape as CloudWatch documents `GetMetricData`'s response.
    #[test]
    fn the_newest_value_of_the_expressions_result_is_the_result() {
        let doc = json!({"MetricDataResults": [
            {"Id": "other", "Values": [9.0]},
            {"Id": "linnet", "Label": "errors", "StatusCode": "Complete",
             "Timestamps": [1700000300, 1700000240], "Values": [0.02, 0.5]}
        ], "Messages": []});
        assert_eq!(cloud_watch_result(&doc).unwrap(), json!(0.02));
    }

    #[test]
    fn no_data_a_failed_status_and_an_aws_error_say_so() {
        let empty = json!({"MetricDataResults": [{"Id": "linnet", "Values": [], "StatusCode": "Complete"}]});
        assert!(
            cloud_watch_result(&empty)
                .unwrap_err()
                .to_string()
                .contains("no data points")
        );
        let failed = json!({"MetricDataResults": [{"Id": "linnet", "StatusCode": "Forbidden",
            "Messages": [{"Code": "Forbidden", "Value": "not authorized for AWS/ELB"}]}]});
        assert_eq!(
            cloud_watch_result(&failed).unwrap_err().to_string(),
            "the expression's status is Forbidden: not authorized for AWS/ELB"
        );
        let refused = json!({"__type": "com.amazonaws.cloudwatch#InvalidParameterValueException",
            "message": "Invalid metrics insights query"});
        assert_eq!(
            aws_error(&refused).as_deref(),
            Some("InvalidParameterValueException Invalid metrics insights query")
        );
    }

    #[test]
    fn the_request_reads_the_window_newest_first() {
        let cw: CloudWatchMetric = serde_json::from_value(json!({
            "region": "eu-west-1", "expression": "SELECT AVG(Errors) FROM x", "window": "10m",
            "accessKeyIdFile": "a", "secretAccessKeyFile": "s"}))
        .unwrap();
        let body = request_body(&cw, 1_700_000_600);
        assert_eq!(body["StartTime"], json!(1_700_000_000));
        assert_eq!(body["EndTime"], json!(1_700_000_600));
        assert_eq!(body["MetricDataQueries"][0]["Period"], json!(60));
        assert_eq!(body["ScanBy"], json!("TimestampDescending"));
        assert_eq!(cw.address(), "https://monitoring.eu-west-1.amazonaws.com");
    }
}
