//! The fleet's metrics (issue 73): which cluster this agent is, how its reads of the fleet go,
//! and which of its rollouts the fleet holds, and why. Registered into the agent's registry
//! beside the others ([`super::Metrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::ResultLabel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
    /// `--cluster-label`s, `key=value` joined by commas in key order.
    pub cluster_labels: String,
}

/// One held rollout: the wave it is in here and why it waits.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FleetHoldLabels {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub wave: String,
    pub reason: String,
}

pub struct FleetMetrics {
    /// 1, labelled with `--cluster` and `--cluster-label`.
    pub cluster_info: Family<ClusterLabels, Gauge>,
    /// Reads of the fleet from Git by result: `read` (a branch moved), `unchanged`, `error`.
    pub reads: Family<ResultLabel, Counter>,
    /// Clusters whose status files the last read found.
    pub clusters: Gauge,
    /// 1 for each rollout whose new image the fleet holds here.
    pub held: Family<FleetHoldLabels, Gauge>,
    /// Each held rollout's series, so a rollout let go (or held for another reason) loses it.
    held_now:
        std::sync::Mutex<std::collections::BTreeMap<(String, String, String), FleetHoldLabels>>,
}

impl FleetMetrics {
    pub(super) fn register(registry: &mut Registry) -> FleetMetrics {
        let m = FleetMetrics {
            cluster_info: Default::default(),
            reads: Default::default(),
            clusters: Default::default(),
            held: Default::default(),
            held_now: Default::default(),
        };
        registry.register(
            "cluster_info",
            "This agent's cluster (--cluster) and its labels (--cluster-label), value 1",
            m.cluster_info.clone(),
        );
        registry.register(
            "fleet_reads",
            "Reads of the fleet from Git, by result: read, unchanged, error",
            m.reads.clone(),
        );
        registry.register(
            "fleet_clusters",
            "Clusters whose status files the fleet's last read found",
            m.clusters.clone(),
        );
        registry.register(
            "fleet_held_rollouts",
            "1 for each rollout whose new image the fleet holds in this cluster, by wave and reason",
            m.held.clone(),
        );
        m
    }

    /// Names this cluster, once at start.
    pub fn cluster(&self, name: &str, labels: &std::collections::BTreeMap<String, String>) {
        let joined: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.cluster_info
            .get_or_create(&ClusterLabels {
                cluster: name.to_string(),
                cluster_labels: joined.join(","),
            })
            .set(1);
    }

    /// Records that rollout `kind` `namespace/name` is held in `wave` for `reason`, or (with
    /// `None`) that it is not held.
    pub fn hold(&self, (kind, namespace, name): (&str, &str, &str), held: Option<(&str, &str)>) {
        let key = (kind.to_string(), namespace.to_string(), name.to_string());
        let mut now = self
            .held_now
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let labels = held.map(|(wave, reason)| FleetHoldLabels {
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            wave: wave.to_string(),
            reason: reason.to_string(),
        });
        if now.get(&key) == labels.as_ref() {
            return;
        }
        if let Some(old) = now.remove(&key) {
            self.held.remove(&old);
        }
        if let Some(labels) = labels {
            self.held.get_or_create(&labels).set(1);
            now.insert(key, labels);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_let_go_or_held_for_another_reason_loses_its_old_series() {
        let mut registry = Registry::default();
        let m = FleetMetrics::register(&mut registry);
        let key = ("CanaryDeployment", "shop", "web");
        m.hold(key, Some(("europe", "Baking")));
        m.hold(key, Some(("europe", "AwaitingApproval")));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(out.contains(r#"reason="AwaitingApproval""#), "{out}");
        assert!(!out.contains("Baking"), "{out}");
        m.hold(key, None);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(!out.contains("fleet_held_rollouts{"), "{out}");
        m.cluster("eu-1", &[("region".into(), "eu".into())].into());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains(r#"cluster_info{cluster="eu-1",cluster_labels="region=eu"} 1"#),
            "{out}"
        );
    }
}
