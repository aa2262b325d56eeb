//! The New Relic provider (issue 75): an NRQL query by New Relic's documented NerdGraph API,
//! `POST /graphql` with the `API-Key` header and the query and account passed as GraphQL
//! variables (never spliced into the GraphQL text). `result` is `field` of the first row of
//! `data.actor.account.nrql.results`, or that row's only number. The key is read from a file
//! under `--analysis-files-dir` and sent only under an `--analysis-url-prefix`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::api::NewRelicMetric;

use super::super::MeasureError;
use super::{client, json_answer, keys_allowed, read_token};

/// The most of an error text from New Relic kept in status.
const ERROR_CHARS: usize = 200;

/// The NerdGraph document: the account and the NRQL are variables.
const NRQL_DOCUMENT: &str = "query($accountId: Int!, $nrql: Nrql!, $timeout: Seconds) { actor { \
     account(id: $accountId) { nrql(query: $nrql, timeout: $timeout) { results } } } }";

pub(super) async fn new_relic(
    ctx: &crate::controller::Context,
    nr: &NewRelicMetric,
    timeout: Duration,
) -> Result<Value, MeasureError> {
    keys_allowed(ctx, "newRelic")?;
    let url = reqwest::Url::parse(&format!("{}/graphql", nr.address())).map_err(|e| {
        MeasureError::BadUrl {
            what: format!("New Relic address {:?}", nr.address()),
            why: e.to_string(),
        }
    })?;
    ctx.analysis.url(&url)?;
    let client = client(ctx, nr.ca_file.as_deref())?;
    let api_key = read_token(ctx, "apiKeyFile", &nr.api_key_file)?;
    let target = format!("New Relic {}", nr.address());
    let request = json!({
        "query": NRQL_DOCUMENT,
        "variables": {
            "accountId": nr.account_id,
            "nrql": nr.query,
            // NerdGraph's own limit on the query, within ours on the request.
            "timeout": timeout.as_secs().clamp(1, 120),
        },
    });
    let request = client
        .post(url)
        .timeout(timeout)
        .header("API-Key", api_key)
        .json(&request);
    let doc = json_answer(request, &target).await?;
    new_relic_result(&doc, nr.field.as_deref())
}

/// `result` from a NerdGraph answer: `field` of the first row, or the row's only number. A
/// value that is an object with one number (`percentile(duration, 95)` gives `{"95": 0.2}`)
/// is that number.
pub fn new_relic_result(doc: &Value, field: Option<&str>) -> Result<Value, MeasureError> {
    let answer = |text: String| MeasureError::Answer(text);
    if let Some(errors) = doc["errors"].as_array().filter(|e| !e.is_empty()) {
        let why: String = errors
            .iter()
            .filter_map(|e| e["message"].as_str())
            .collect::<Vec<_>>()
            .join("; ")
            .chars()
            .take(ERROR_CHARS)
            .collect();
        return Err(answer(format!("the query failed: {why}")));
    }
    let Some(row) = doc["data"]["actor"]["account"]["nrql"]["results"]
        .as_array()
        .and_then(|rows| rows.first())
        .and_then(Value::as_object)
    else {
        return Err(answer(
            "the query returned no results (no data since its SINCE?)".into(),
        ));
    };
    let number = |v: &Value| -> Option<Value> {
        match v {
            Value::Number(_) => Some(v.clone()),
            Value::Object(inner) if inner.len() == 1 => {
                inner.values().find(|v| v.is_number()).cloned()
            }
            _ => None,
        }
    };
    if let Some(field) = field {
        return row.get(field).and_then(number).ok_or_else(|| {
            answer(format!(
                "the first row has no number in field {field:?} (its fields: {})",
                names(row)
            ))
        });
    }
    let numbers: Vec<Value> = row.values().filter_map(number).collect();
    match numbers.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(answer(format!(
            "the first row has no number (its fields: {})",
            names(row)
        ))),
        _ => Err(answer(format!(
            "the first row has more than one number ({}): name one with `field`",
            names(row)
        ))),
    }
}

fn names(row: &serde_json::Map<String, Value>) -> String {
    let mut names: Vec<&str> = row.keys().map(String::as_str).take(10).collect();
    names.sort_unstable();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn answer(rows: Value) -> Value {
        json!({"data": {"actor": {"account": {"nrql": {"results": rows}}}}})
    }

    /// The answer's shape as New Relic documents it (NerdGraph tutorial: query your data
    /// using NRQL).
    #[test]
    fn the_only_number_or_the_named_field_of_the_first_row_is_the_result() {
        let doc = answer(json!([{"count": 1000}]));
        assert_eq!(new_relic_result(&doc, None).unwrap(), json!(1000));
        let two = answer(json!([{"errors": 0.02, "count": 1000, "appName": "web"}]));
        assert_eq!(new_relic_result(&two, Some("errors")).unwrap(), json!(0.02));
        let percentile = answer(json!([{"percentile.duration": {"95": 0.25}}]));
        assert_eq!(new_relic_result(&percentile, None).unwrap(), json!(0.25));
    }

    #[test]
    fn errors_no_rows_and_ambiguous_rows_say_so() {
        let failed =
            json!({"errors": [{"message": "NRQL Syntax Error: Error at line 1"}], "data": null});
        assert_eq!(
            new_relic_result(&failed, None).unwrap_err().to_string(),
            "the query failed: NRQL Syntax Error: Error at line 1"
        );
        let empty = answer(json!([]));
        assert!(
            new_relic_result(&empty, None)
                .unwrap_err()
                .to_string()
                .contains("no results")
        );
        let two = answer(json!([{"errors": 0.02, "count": 1000}]));
        let why = new_relic_result(&two, None).unwrap_err().to_string();
        assert!(
            why.contains("count, errors") && why.contains("`field`"),
            "{why}"
        );
        let why = new_relic_result(&two, Some("p95")).unwrap_err().to_string();
        assert!(why.contains("\"p95\""), "{why}");
    }
}
