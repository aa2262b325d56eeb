//! The CloudWatch metric provider's spec (issue 75): one expression (a Metrics Insights query
//! or metric math) over the last `window`, by CloudWatch's documented `GetMetricData` action
//! in its JSON protocol, signed with AWS Signature Version 4 from key files the agent is
//! given (a mounted Secret), never from Git.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A `GetMetricData` expression; `result` is its most recent value.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudWatchMetric {
    /// The AWS region, e.g. `eu-west-1`.
    #[schemars(regex(pattern = r"^[a-z0-9-]{1,32}$"))]
    pub region: String,
    /// The endpoint; `https://monitoring.<region>.amazonaws.com` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// A Metrics Insights query or a metric math expression, e.g. `SELECT AVG(Errors) FROM
    /// SCHEMA("AWS/ApplicationELB", LoadBalancer)`; `{{ args.NAME }}` and `{{ rollout.FIELD }}`
    /// are replaced first.
    #[schemars(length(max = 4096))]
    pub expression: String,
    /// The period of the expression's data points in seconds (60 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub period: Option<u32>,
    /// How far back the query reads, e.g. `5m` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub window: Option<String>,
    /// A file in the agent's pod holding the access key id.
    pub access_key_id_file: String,
    /// A file in the agent's pod holding the secret access key.
    pub secret_access_key_file: String,
    /// A file in the agent's pod holding a session token, with temporary credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token_file: Option<String>,
    /// How long a query may take, e.g. `10s` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub timeout: Option<String>,
    /// A PEM file in the agent's pod with the CA that signs the server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// How far back a query reads when a metric does not say.
pub const CLOUDWATCH_DEFAULT_WINDOW: &str = "5m";

/// The period of the data points when a metric does not say.
pub const CLOUDWATCH_DEFAULT_PERIOD: u32 = 60;

impl CloudWatchMetric {
    /// The endpoint, without a trailing `/`.
    pub fn address(&self) -> String {
        match &self.address {
            Some(a) => a.trim_end_matches('/').to_string(),
            None => format!("https://monitoring.{}.amazonaws.com", self.region),
        }
    }
}
