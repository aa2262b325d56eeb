//! The InfluxDB provider (issue 75): an InfluxQL query by InfluxDB's documented HTTP API,
//! `GET /query?db=&q=&epoch=ms`, which 1.x serves and 2.x and 3.x serve for compatibility.
//! `result` is `field` of the first row of the first series, or that row's only number
//! besides `time`. Only a single `SELECT` or `SHOW` is sent ([`influxql_read_only`]): 1.x runs
//! a write sent this way too. The credentials, `Authorization: Token <file>`, are read from a
//! file under `--analysis-files-dir` and sent only under an `--analysis-url-prefix`.

use std::time::Duration;

use serde_json::Value;

use crate::api::{InfluxDbMetric, influxql_read_only};

use super::super::MeasureError;
use super::{client, json_answer_explained, keys_allowed, read_token};

/// The most of an error text from InfluxDB kept in status.
const ERROR_CHARS: usize = 200;

pub(super) async fn influxdb(
    ctx: &crate::controller::Context,
    influx: &InfluxDbMetric,
    timeout: Duration,
) -> Result<Value, MeasureError> {
    // The query as sent: after its arguments were filled in.
    influxql_read_only(&influx.query)
        .map_err(|why| MeasureError::Refused(format!("the InfluxQL query is refused: {why}")))?;
    let url = reqwest::Url::parse_with_params(
        &format!("{}/query", influx.address()),
        &[
            ("db", influx.database.as_str()),
            ("q", influx.query.as_str()),
            ("epoch", "ms"),
        ],
    )
    .map_err(|e| MeasureError::BadUrl {
        what: format!("InfluxDB address {:?}", influx.address()),
        why: e.to_string(),
    })?;
    ctx.analysis.url(&url)?;
    let client = client(ctx, influx.ca_file.as_deref())?;
    let mut request = client.get(url).timeout(timeout);
    if let Some(file) = &influx.token_file {
        keys_allowed(ctx, "influxdb.tokenFile")?;
        let token = read_token(ctx, "tokenFile", file)?;
        request = request.header("Authorization", format!("Token {token}"));
    }
    let target = format!("InfluxDB {}", influx.address());
    // A refusal (400, 401) says why in `error`.
    let doc = json_answer_explained(request, &target, |doc| {
        doc["error"]
            .as_str()
            .map(|e| e.chars().take(ERROR_CHARS).collect())
    })
    .await?;
    influxdb_result(&doc, influx.field.as_deref())
}

/// `result` from a query answer: `field` of the first row of the first series, or that row's
/// only number besides `time`.
pub fn influxdb_result(doc: &Value, field: Option<&str>) -> Result<Value, MeasureError> {
    let answer = |text: String| MeasureError::Answer(text);
    let first = &doc["results"][0];
    if let Some(why) = doc["error"].as_str().or(first["error"].as_str()) {
        let why: String = why.chars().take(ERROR_CHARS).collect();
        return Err(answer(format!("the query failed: {why}")));
    }
    let series = &first["series"][0];
    let columns: Vec<&str> = series["columns"]
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(row) = series["values"].as_array().and_then(|rows| rows.first()) else {
        return Err(answer(
            "the query returned no rows (no points in its time range?)".into(),
        ));
    };
    let cell = |i: usize| row.get(i).filter(|v| v.is_number()).cloned();
    if let Some(field) = field {
        let at = columns.iter().position(|c| *c == field);
        return at.and_then(cell).ok_or_else(|| {
            answer(format!(
                "the first row has no number in column {field:?} (its columns: {})",
                columns.join(", ")
            ))
        });
    }
    let numbers: Vec<Value> = (0..columns.len())
        .filter(|&i| columns[i] != "time")
        .filter_map(cell)
        .collect();
    match numbers.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(answer(format!(
            "the first row has no number (its columns: {})",
            columns.join(", ")
        ))),
        _ => Err(answer(format!(
            "the first row has more than one number ({}): name one with `field`",
            columns.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn series(columns: Value, values: Value) -> Value {
        json!({"results": [{"statement_id": 0, "series": [
            {"name": "http", "columns": columns, "values": values}]}]})
    }

    /// The answer's shape as InfluxDB 1.8 gives it (its `/query` with `epoch=ms`).
    #[test]
    fn the_only_number_or_the_named_column_of_the_first_row_is_the_result() {
        let one = series(
            json!(["time", "mean"]),
            json!([[1_700_000_000_000_u64, 0.02]]),
        );
        assert_eq!(influxdb_result(&one, None).unwrap(), json!(0.02));
        let two = series(
            json!(["time", "errors", "requests"]),
            json!([[0, 0.3, 1200], [1, 0.1, 1000]]),
        );
        assert_eq!(influxdb_result(&two, Some("errors")).unwrap(), json!(0.3));
        let why = influxdb_result(&two, None).unwrap_err().to_string();
        assert!(
            why.contains("time, errors, requests") && why.contains("`field`"),
            "{why}"
        );
    }

    #[test]
    fn errors_no_rows_and_nulls_say_so() {
        let failed = json!({"results": [{"statement_id": 0, "error": "database not found: app"}]});
        assert_eq!(
            influxdb_result(&failed, None).unwrap_err().to_string(),
            "the query failed: database not found: app"
        );
        let empty = json!({"results": [{"statement_id": 0}]});
        let why = influxdb_result(&empty, None).unwrap_err().to_string();
        assert!(why.contains("no rows"), "{why}");
        let null = series(json!(["time", "mean"]), json!([[0, null]]));
        let why = influxdb_result(&null, Some("mean"))
            .unwrap_err()
            .to_string();
        assert!(why.contains("\"mean\""), "{why}");
    }
}
