//! The InfluxDB metric provider's spec (issue 75): an InfluxQL query by InfluxDB's documented
//! HTTP API (`GET /query?db=&q=`), which InfluxDB 1.x serves, and 2.x and 3.x through their
//! v1 compatibility API. The credentials are read from a file the agent is given (a mounted
//! Secret), never from Git.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An InfluxQL query; `result` is one column of the first row of its first series.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InfluxDbMetric {
    /// The server, e.g. `http://influxdb.monitoring:8086`.
    pub address: String,
    /// The database the query reads (`db`; a 2.x bucket mapped to it).
    #[schemars(length(min = 1, max = 256))]
    pub database: String,
    /// InfluxQL, e.g. `SELECT sum("errors") / sum("requests") FROM "http" WHERE "version" =
    /// 'canary' AND time > now() - 5m`; `{{ args.NAME }}` and `{{ rollout.FIELD }}` are
    /// replaced first. Only `SELECT` and `SHOW` queries are sent.
    #[schemars(length(max = 4096))]
    pub query: String,
    /// The column of the first row that is the result, e.g. `mean`; when omitted, the row's
    /// only number (the `time` column aside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// A file in the agent's pod sent as `Authorization: Token <content>`: `username:password`
    /// for InfluxDB 1.x, an API token for 2.x and 3.x. None: no credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// How long a query may take, e.g. `10s` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub timeout: Option<String>,
    /// A PEM file in the agent's pod with the CA that signs the server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

impl InfluxDbMetric {
    /// The server's address, without a trailing `/`.
    pub fn address(&self) -> &str {
        self.address.trim_end_matches('/')
    }
}

/// Whether `query` only reads: one `SELECT` (without `INTO`, which writes) or `SHOW`
/// statement. InfluxDB 1.x runs other statements sent by `GET /query` too (`DROP DATABASE`
/// after a `;`, with a deprecation warning), so linnet sends nothing else, whoever wrote the
/// template. The check is on the raw text, not on a reading of InfluxQL (whose regex
/// literals, quotes and comments can hide a `;` from a reader that differs from InfluxDB's
/// in one detail): no control character but tabs and line ends, no `;` but one at the end,
/// no letters `INTO` after a `SELECT`, even quoted, and a first keyword (after blanks and
/// comments) of `SELECT` or `SHOW`.
pub fn influxql_read_only(query: &str) -> Result<(), NotReadOnly> {
    // InfluxDB's scanner ends a `--` comment at a NUL as at a line end.
    let control = |c: char| c.is_control() && !matches!(c, '\t' | '\n' | '\r');
    if query.chars().any(control) {
        return Err(NotReadOnly::ControlCharacter);
    }
    let body = query.trim_end();
    let body = body.strip_suffix(';').unwrap_or(body);
    if body.contains(';') {
        return Err(NotReadOnly::TwoStatements);
    }
    let first = first_keyword(body).to_ascii_uppercase();
    match first.as_str() {
        "SELECT" | "SHOW" => {}
        "" => return Err(NotReadOnly::Empty),
        other => return Err(NotReadOnly::Statement(other.to_string())),
    }
    // The letters, not the word: InfluxDB reads `1.0INTO` as a number, then INTO.
    if first == "SELECT" && body.to_ascii_uppercase().contains("INTO") {
        return Err(NotReadOnly::SelectInto);
    }
    Ok(())
}

/// The first word of `text` after InfluxDB's blanks (space, tab, line ends) and comments
/// (`--` to a line end, `\n` or `\r`; `/* ... */`); empty if none.
fn first_keyword(text: &str) -> &str {
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([' ', '\t', '\n', '\r']);
        if let Some(comment) = rest.strip_prefix("--") {
            rest = comment.find(['\n', '\r']).map_or("", |end| &comment[end..]);
        } else if let Some(comment) = rest.strip_prefix("/*") {
            rest = comment.find("*/").map_or("", |end| &comment[end + 2..]);
        } else {
            break;
        }
    }
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// Why an InfluxQL query is not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReadOnly {
    #[error("only SELECT and SHOW queries are sent to InfluxDB, not {0}")]
    Statement(String),
    #[error("the query is empty")]
    Empty,
    #[error("one statement only: the query has a `;` before its end (even quoted)")]
    TwoStatements,
    #[error("SELECT ... INTO writes: a SELECT with the letters INTO anywhere is not sent")]
    SelectInto,
    #[error("the query has a control character (only tabs and line ends are taken)")]
    ControlCharacter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_select_or_show_is_sent() {
        for q in [
            "SELECT mean(\"rate\") FROM \"errors\" WHERE time > now() - 5m",
            "select last(value) from errors;",
            "SHOW MEASUREMENTS",
            "-- the error rate\nSELECT 1 /* a comment */",
            "/* first */ SHOW MEASUREMENTS",
            "SELECT mean(v) FROM m WHERE host =~ /web-[0-9]+/ AND time > now() - 5m",
        ] {
            assert_eq!(influxql_read_only(q), Ok(()), "{q}");
        }
    }

    /// Regression found on the real server: InfluxDB 1.8 ran `DROP DATABASE` sent by `GET
    /// /query` after a `SELECT` (a deprecation warning, and the database gone).
    #[test]
    fn anything_that_writes_or_a_second_statement_is_refused() {
        for (q, says) in [
            ("SELECT 1; DROP DATABASE app", "one statement only"),
            ("DROP DATABASE app", "not DROP"),
            ("  create user x with password 'p'", "not CREATE"),
            ("SELECT * INTO copy FROM errors", "INTO writes"),
            ("SELECT 1 ;; SHOW DATABASES", "one statement only"),
            ("", "empty"),
            ("-- only a comment", "empty"),
            ("SELECT 1 /* ; DROP DATABASE app", "one statement only"),
            // Found by review: InfluxDB reads `/.../` after `=~` as a regex literal, in which
            // `--` and `'` are plain characters, and ends a `--` comment at `\r` too.
            (
                "SELECT v FROM m WHERE t =~ /--/; DROP DATABASE app",
                "one statement only",
            ),
            (
                "SELECT v FROM m WHERE t =~ /'/; DROP DATABASE app; SELECT v FROM m WHERE t =~ /'/",
                "one statement only",
            ),
            ("SELECT v -- x\r; DROP DATABASE app", "one statement only"),
            ("SELECT v -- x\rINTO y FROM m", "INTO"),
            ("-- x\rDROP DATABASE app", "not DROP"),
            ("/* SELECT */ DROP DATABASE app", "not DROP"),
            ("SELECT * FROM \"into\"", "INTO"),
            ("SELECT * FROM m WHERE t = 'a;b'", "one statement only"),
            // Found by the second review: a NUL ends a `--` comment for InfluxDB, and
            // `1.0INTO` is a number, then INTO.
            (
                "-- \0DROP DATABASE app /*\nSELECT 1 */",
                "control character",
            ),
            ("SELECT v*1.0INTO copy FROM m", "INTO"),
            ("SELECT v*.5INTO copy FROM m", "INTO"),
            ("\u{feff}DROP DATABASE app", "empty"),
            ("\u{a0}DROP DATABASE app", "empty"),
        ] {
            let why = influxql_read_only(q).unwrap_err().to_string();
            assert!(why.contains(says), "{q}: {why}");
        }
    }
}
