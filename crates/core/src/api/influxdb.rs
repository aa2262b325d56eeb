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
/// with a deprecation warning), so linnet sends nothing else whoever wrote the template.
/// Quoted text and comments are skipped; a `;` ends the statement, and only blank text or
/// comments may follow it.
pub fn influxql_read_only(query: &str) -> Result<(), NotReadOnly> {
    let words = influxql_words(query)?;
    let first = words.first().map(|w| w.to_ascii_uppercase());
    match first.as_deref() {
        Some("SELECT" | "SHOW") => {}
        Some(other) => return Err(NotReadOnly::Statement(other.to_string())),
        None => return Err(NotReadOnly::Empty),
    }
    if words.iter().any(|w| w == ";") {
        return Err(NotReadOnly::TwoStatements);
    }
    let into = words.iter().any(|w| w.eq_ignore_ascii_case("INTO"));
    if first.as_deref() == Some("SELECT") && into {
        return Err(NotReadOnly::SelectInto);
    }
    Ok(())
}

/// Why an InfluxQL query is not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReadOnly {
    #[error("only SELECT and SHOW queries are sent to InfluxDB, not {0}")]
    Statement(String),
    #[error("the query is empty")]
    Empty,
    #[error("one statement only: the query has a `;` followed by more")]
    TwoStatements,
    #[error("SELECT ... INTO writes; it is not sent")]
    SelectInto,
    #[error("a {0} is not closed")]
    Unclosed(&'static str),
}

/// The words and `;`s of `query` outside quotes and comments; a trailing `;` is dropped.
fn influxql_words(query: &str) -> Result<Vec<String>, NotReadOnly> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = query.chars().peekable();
    let flush = |word: &mut String, words: &mut Vec<String>| {
        if !word.is_empty() {
            words.push(std::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                flush(&mut word, &mut words);
                // A quoted string or identifier: `\` escapes the next character.
                let mut closed = false;
                while let Some(q) = chars.next() {
                    if q == '\\' {
                        chars.next();
                    } else if q == c {
                        closed = true;
                        break;
                    }
                }
                if !closed {
                    return Err(NotReadOnly::Unclosed(if c == '"' { "\"" } else { "'" }));
                }
                words.push("<quoted>".into());
            }
            '-' if chars.peek() == Some(&'-') => {
                flush(&mut word, &mut words);
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                flush(&mut word, &mut words);
                chars.next();
                let mut last = ' ';
                let mut closed = false;
                for n in chars.by_ref() {
                    if last == '*' && n == '/' {
                        closed = true;
                        break;
                    }
                    last = n;
                }
                if !closed {
                    return Err(NotReadOnly::Unclosed("/* comment"));
                }
            }
            ';' => {
                flush(&mut word, &mut words);
                words.push(";".into());
            }
            c if c.is_alphanumeric() || c == '_' => word.push(c),
            _ => flush(&mut word, &mut words),
        }
    }
    flush(&mut word, &mut words);
    if words.last().is_some_and(|w| w == ";") {
        words.pop();
    }
    Ok(words)
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
            "SELECT * FROM \"into\" WHERE tag = 'DROP; INTO'",
            "-- the error rate\nSELECT 1 /* ; DROP */",
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
            ("SELECT 'unclosed", "not closed"),
            ("SELECT 1 /* ; DROP DATABASE app", "not closed"),
        ] {
            let why = influxql_read_only(q).unwrap_err().to_string();
            assert!(why.contains(says), "{q}: {why}");
        }
    }
}
