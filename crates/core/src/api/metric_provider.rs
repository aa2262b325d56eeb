//! Where an analysis metric's measurements come from: the `provider` block and the built-in
//! providers' specs (Prometheus, web, Job). Datadog, New Relic, CloudWatch and InfluxDB have
//! their own modules.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a measurement comes from: exactly one of these.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricProvider {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusMetric>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web: Option<WebMetric>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobMetric>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datadog: Option<super::DatadogMetric>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_relic: Option<super::NewRelicMetric>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_watch: Option<super::CloudWatchMetric>,
    /// InfluxQL, as Argo Rollouts and Flagger name this provider.
    #[serde(default, rename = "influxdb", skip_serializing_if = "Option::is_none")]
    pub influxdb: Option<super::InfluxDbMetric>,
}

impl MetricProvider {
    /// The providers named, in the order the CRD lists them.
    pub fn named(&self) -> Vec<&'static str> {
        [
            ("prometheus", self.prometheus.is_some()),
            ("web", self.web.is_some()),
            ("job", self.job.is_some()),
            ("datadog", self.datadog.is_some()),
            ("newRelic", self.new_relic.is_some()),
            ("cloudWatch", self.cloud_watch.is_some()),
            ("influxdb", self.influxdb.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }

    /// The provider's own `timeout`, with its field's path.
    pub fn timeout(&self) -> Option<(&'static str, &str)> {
        [
            (
                "provider.prometheus.timeout",
                self.prometheus.as_ref().and_then(|p| p.timeout.as_deref()),
            ),
            (
                "provider.web.timeout",
                self.web.as_ref().and_then(|w| w.timeout.as_deref()),
            ),
            (
                "provider.datadog.timeout",
                self.datadog.as_ref().and_then(|d| d.timeout.as_deref()),
            ),
            (
                "provider.newRelic.timeout",
                self.new_relic.as_ref().and_then(|n| n.timeout.as_deref()),
            ),
            (
                "provider.cloudWatch.timeout",
                self.cloud_watch.as_ref().and_then(|c| c.timeout.as_deref()),
            ),
            (
                "provider.influxdb.timeout",
                self.influxdb.as_ref().and_then(|i| i.timeout.as_deref()),
            ),
        ]
        .into_iter()
        .find_map(|(field, t)| Some((field, t?)))
    }
}

/// An instant query; `result` is the number of a scalar or one-sample vector, else the list
/// of the samples' numbers.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrometheusMetric {
    /// The server, e.g. `http://prometheus.monitoring:9090`.
    pub address: String,
    /// PromQL; `{{ args.NAME }}` and `{{ rollout.FIELD }}` are replaced first.
    #[schemars(length(max = 4096))]
    pub query: String,
    /// How long a query may take, e.g. `10s` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub timeout: Option<String>,
    /// A file in the agent's pod whose content is sent as a bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
    /// A PEM file in the agent's pod with the CA that signs the server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// An HTTP request whose JSON answer (or the part `jsonPath` picks) is `result`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebMetric {
    pub url: String,
    #[serde(default)]
    pub method: WebMethod,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub headers: Vec<WebHeader>,
    /// The request body of a POST.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8192))]
    pub body: Option<String>,
    /// A JSONPath into the answer, e.g. `$.data.ok`; the whole answer when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_path: Option<String>,
    /// How long a request may take, e.g. `10s` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub timeout: Option<String>,
    /// A PEM file in the agent's pod with the CA that signs the server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WebMethod {
    #[default]
    #[serde(rename = "GET")]
    Get,
    #[serde(rename = "POST")]
    Post,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebHeader {
    pub key: String,
    pub value: String,
}

/// A Job run in the rollout's namespace; the measurement is Successful when it completes and
/// Failed when it fails (`result` is `true` or `false`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobMetric {
    /// The Job's spec (a `batch/v1` JobSpec).
    #[schemars(schema_with = "super::embedded_object")]
    pub spec: k8s_openapi::api::batch::v1::JobSpec,
}
