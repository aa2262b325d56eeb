//! The New Relic metric provider's spec (issue 75): an NRQL query by New Relic's documented
//! NerdGraph API (`POST /graphql`, `actor { account(id) { nrql(query) { results } } }`), with
//! the user API key read from a file the agent is given (a mounted Secret), never from Git.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An NRQL query; `result` is one field of the first row of its results.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewRelicMetric {
    /// NerdGraph's address, e.g. `https://api.eu.newrelic.com` for the EU region;
    /// `https://api.newrelic.com` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The account the query reads.
    #[schemars(range(min = 1))]
    pub account_id: u64,
    /// The NRQL, with its own `SINCE`, e.g. `SELECT percentage(count(*), WHERE error IS true)
    /// AS errors FROM Transaction WHERE appName = 'web' SINCE 5 minutes ago`; `{{ args.NAME }}`
    /// and `{{ rollout.FIELD }}` are replaced first.
    #[schemars(length(max = 4096))]
    pub query: String,
    /// The field of the first row that is the result, e.g. `errors`; when omitted, the row's
    /// only number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// A file in the agent's pod holding a user API key (sent as `API-Key`).
    pub api_key_file: String,
    /// How long a query may take, e.g. `10s` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub timeout: Option<String>,
    /// A PEM file in the agent's pod with the CA that signs the server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// NerdGraph's address (the US region) when a metric names none.
pub const NEW_RELIC_DEFAULT_ADDRESS: &str = "https://api.newrelic.com";

impl NewRelicMetric {
    /// NerdGraph's address, without a trailing `/`.
    pub fn address(&self) -> &str {
        self.address
            .as_deref()
            .unwrap_or(NEW_RELIC_DEFAULT_ADDRESS)
            .trim_end_matches('/')
    }
}
