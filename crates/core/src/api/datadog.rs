//! The Datadog metric provider's spec (issue 75): a metrics query over the last `window`,
//! by Datadog's documented v1 query API (`GET /api/v1/query`), with the API and application
//! keys read from files the agent is given (a mounted Secret), never from Git.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Datadog metrics query; `result` is the last point of the first series.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatadogMetric {
    /// The site's API, e.g. `https://api.datadoghq.eu`; `https://api.datadoghq.com` when
    /// omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The metrics query, e.g. `sum:trace.http.request.errors{service:web}.as_count()`;
    /// `{{ args.NAME }}` and `{{ rollout.FIELD }}` are replaced first.
    #[schemars(length(max = 4096))]
    pub query: String,
    /// How far back the query reads, e.g. `5m` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub window: Option<String>,
    /// A file in the agent's pod holding the API key (sent as `DD-API-KEY`).
    pub api_key_file: String,
    /// A file in the agent's pod holding the application key (`DD-APPLICATION-KEY`).
    pub application_key_file: String,
    /// How long a query may take, e.g. `10s` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub timeout: Option<String>,
    /// A PEM file in the agent's pod with the CA that signs the server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// How far back a query reads when a metric does not say.
pub const DATADOG_DEFAULT_WINDOW: &str = "5m";

/// The site's API when a metric names none.
pub const DATADOG_DEFAULT_ADDRESS: &str = "https://api.datadoghq.com";

impl DatadogMetric {
    /// The API's address, without a trailing `/`.
    pub fn address(&self) -> &str {
        self.address
            .as_deref()
            .unwrap_or(DATADOG_DEFAULT_ADDRESS)
            .trim_end_matches('/')
    }
}
