//! What a rollout's status keeps of its routes, for both kinds: the canary's weight, the
//! header route, the baseline's share, and since when the routes are so.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// What the rollout's status recorded of the routes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Recorded {
    pub weight: Option<i32>,
    pub header: bool,
    /// The baseline Service's share (a CanaryDeployment's; None when it has none).
    pub baseline: Option<i32>,
    pub since: Option<Timestamp>,
}

/// A rollout status's record of its routes (a StatefulSet has no baseline).
pub trait TrafficRecord {
    fn recorded(&self) -> Recorded;
    fn record(&mut self, now: Recorded);
}

impl TrafficRecord for crate::api::CanaryStatefulSetStatus {
    fn recorded(&self) -> Recorded {
        Recorded {
            weight: self.canary_weight,
            header: self.header_routed,
            baseline: None,
            since: self.traffic_since.as_ref().map(|t| t.0),
        }
    }
    fn record(&mut self, now: Recorded) {
        self.canary_weight = now.weight;
        self.header_routed = now.header;
        self.traffic_since = now.since.map(Time);
    }
}

impl TrafficRecord for crate::api::CanaryDeploymentStatus {
    fn recorded(&self) -> Recorded {
        Recorded {
            weight: self.canary_weight,
            header: self.header_routed,
            baseline: self.baseline_weight,
            since: self.traffic_since.as_ref().map(|t| t.0),
        }
    }
    fn record(&mut self, now: Recorded) {
        self.canary_weight = now.weight;
        self.header_routed = now.header;
        self.baseline_weight = now.baseline;
        self.traffic_since = now.since.map(Time);
    }
}
