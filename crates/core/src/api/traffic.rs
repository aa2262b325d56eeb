//! `trafficRouting`, on both rollout kinds: the Gateway API HTTPRoutes and GRPCRoutes whose
//! backends linnet weighs between the rollout's stable and canary Services, the weight of
//! each step or batch, and a header route that sends matching requests to the canary
//! whatever the weight.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a rollout moves traffic, not only pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrafficRouting {
    /// The Gateway API routes whose backends linnet weighs.
    #[serde(rename = "gatewayAPI")]
    pub gateway_api: GatewayApiRouting,
    /// Percent of requests sent to the canary: one per entry of `steps` (CanaryStatefulSet;
    /// one when it has no steps) or one per batch (CanaryDeployment). Without it the weight
    /// follows the canary's share of the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub weights: Option<Vec<i32>>,
    /// While a canary serves, requests with every one of these headers go to it whatever
    /// the weight (for testers, or one tenant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_route: Option<HeaderRoute>,
    /// How long after the gateway accepted a route change linnet waits before it stops pods
    /// that no longer get traffic: a gateway applies an accepted route a moment later (Argo
    /// Rollouts' `scaleDownDelaySeconds` is the same wait).
    #[serde(default = "default_settle_seconds")]
    #[schemars(range(min = 0, max = 600))]
    pub settle_seconds: i64,
}

fn default_settle_seconds() -> i64 {
    10
}

/// The HTTPRoutes and GRPCRoutes (in the rollout's namespace) that linnet weighs, at least
/// one. Each must send its traffic to the Service `<rollout>-stable`; linnet adds
/// `<rollout>-canary` beside it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayApiRouting {
    /// Names of HTTPRoutes in the rollout's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub http_routes: Vec<String>,
    /// Names of GRPCRoutes in the rollout's namespace. With any, the Services' port says
    /// `appProtocol: kubernetes.io/h2c` (the gateway speaks cleartext HTTP/2 to the pods); the
    /// header route matches their headers and cookie (a gRPC request has no query).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub grpc_routes: Vec<String>,
    /// The port of the two Services, and of the pods behind them (`targetPort`).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

impl GatewayApiRouting {
    /// Every route named, HTTPRoutes first.
    pub fn routes(&self) -> impl Iterator<Item = (RouteKind, &String)> {
        let http = self.http_routes.iter().map(|n| (RouteKind::Http, n));
        http.chain(self.grpc_routes.iter().map(|n| (RouteKind::Grpc, n)))
    }
}

/// The two kinds of Gateway API route linnet weighs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    #[default]
    Http,
    Grpc,
}

impl RouteKind {
    /// Its `kind`.
    pub fn kind(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
        }
    }

    /// Its resource's plural.
    pub fn plural(self) -> &'static str {
        match self {
            RouteKind::Http => "httproutes",
            RouteKind::Grpc => "grpcroutes",
        }
    }

    /// The `spec.trafficRouting.gatewayAPI` field that names routes of this kind.
    pub fn field(self) -> &'static str {
        match self {
            RouteKind::Http => "httpRoutes",
            RouteKind::Grpc => "grpcRoutes",
        }
    }
}

/// Requests that go to the canary whatever the weight: those that carry every header, query
/// parameter and cookie named here (at least one).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderRoute {
    /// Every header must be present with exactly this value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub headers: Vec<HeaderMatch>,
    /// Every query parameter must be present with exactly this value (`?beta=on`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub query_params: Vec<HeaderMatch>,
    /// A cookie the request must carry with exactly this value, matched in its `Cookie`
    /// header by a regular expression (the Gateway API has no cookie match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<CookieMatch>,
}

/// One header or query parameter a request must carry.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderMatch {
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+\-.^_|~`]+$")
    )]
    pub name: String,
    #[schemars(length(min = 1, max = 4096))]
    pub value: String,
}

/// One cookie a request must carry.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CookieMatch {
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+\-.^_|~`]+$")
    )]
    pub name: String,
    /// The cookie's value: no `;`, `,`, space, quote or backslash (RFC 6265's cookie-octets).
    #[schemars(length(min = 1, max = 1024), regex(pattern = r#"^[^;,\s"\\]+$"#))]
    pub value: String,
}

impl HeaderRoute {
    /// The Gateway API match entries: the headers (the cookie as a `Cookie` header regular
    /// expression) and the query parameters.
    pub fn header_matches(&self) -> Vec<serde_json::Value> {
        let mut out: Vec<serde_json::Value> = self
            .headers
            .iter()
            .map(|x| serde_json::json!({"type": "Exact", "name": x.name, "value": x.value}))
            .collect();
        if let Some(c) = &self.cookie {
            out.push(serde_json::json!({
                "type": "RegularExpression",
                "name": "Cookie",
                "value": cookie_pattern(&c.name, &c.value),
            }));
        }
        out
    }

    pub fn query_param_matches(&self) -> Vec<serde_json::Value> {
        self.query_params
            .iter()
            .map(|x| serde_json::json!({"type": "Exact", "name": x.name, "value": x.value}))
            .collect()
    }
}

/// A regular expression (RE2 and POSIX alike) for a `Cookie` header holding `name=value`
/// among its cookies.
pub fn cookie_pattern(name: &str, value: &str) -> String {
    format!(
        "^(.*;[ ]*)?{}={}(;.*)?$",
        regex_escaped(name),
        regex_escaped(value)
    )
}

fn regex_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Annotation on an HTTPRoute or GRPCRoute whose rules a rollout weighs (`<Kind>/<name>`): the sync does
/// not count its rules as drift from Git.
pub const TRAFFIC_ANNOTATION: &str = "rollouts.linnet.dev/traffic-of";

/// The Service linnet makes for the stable side of a rollout with traffic routing.
pub fn stable_service_name(rollout: &str) -> String {
    format!("{rollout}-stable")
}

/// The Service linnet makes for the canary side.
pub fn canary_service_name(rollout: &str) -> String {
    format!("{rollout}-canary")
}

/// The Service linnet makes for a CanaryDeployment's baseline pods (`strategy.baseline`).
pub fn baseline_service_name(rollout: &str) -> String {
    format!("{rollout}-baseline")
}
