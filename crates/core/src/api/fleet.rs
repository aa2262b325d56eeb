//! `Fleet` (issue 73): the waves a change moves through across clusters. Every agent of the
//! fleet reads it from Git, and no agent applies it to a cluster: the agents share no API,
//! only the repository, where each writes its own cluster's status files and reads the
//! others'. Also this agent's identity in a fleet ([`ClusterIdentity`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kind's name in Git.
pub const FLEET_KIND: &str = "Fleet";

/// A fleet: which rollouts move in waves, and the waves.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fleet {
    pub api_version: String,
    pub kind: String,
    pub metadata: FleetMeta,
    pub spec: FleetSpec,
}

/// A fleet's name (it is never applied, so it has no namespace, labels or annotations).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetMeta {
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetSpec {
    /// The rollouts that move in waves, by namespace and name (and kind, when two kinds share
    /// a name); every rollout of the source when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollouts: Vec<FleetRollout>,
    /// In order: a cluster starts a new image only once every cluster of every earlier wave
    /// has it Stable (or Completed) and baked. A cluster is in the first wave that names or
    /// selects it.
    #[schemars(length(min = 1, max = 50))]
    pub waves: Vec<Wave>,
    /// A cluster of an earlier wave that has not reported the new image this long after the
    /// first cluster did is named as not reporting (it holds the next wave either way).
    #[serde(default = "default_report_deadline")]
    #[schemars(range(min = 1))]
    pub report_deadline_seconds: i64,
    /// What the fleet does when a cluster fails an image (its rollout rolled back).
    #[serde(default)]
    pub on_failure: FleetFailurePolicy,
    /// Approvals of waves with `approval: manual`, added by a person (by hand or by merging a
    /// pull request): the wave may start this image once the waves before it are baked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<WaveApproval>,
}

fn default_report_deadline() -> i64 {
    600
}

/// One rollout of the fleet.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetRollout {
    /// `CanaryStatefulSet` or `CanaryDeployment`; either when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A wave: its clusters, by name or by their `--cluster-label`s, and what must hold before the
/// next wave starts.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Wave {
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Clusters by their `--cluster` name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    /// Clusters whose labels include all of these (`{}`: every cluster not in an earlier wave).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    /// How long each of this wave's clusters must have had the image Stable before the next
    /// wave starts it.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub bake_seconds: i64,
    /// `manual`: this wave starts an image only once `spec.approvals` has it for this wave.
    #[serde(default)]
    pub approval: WaveApprovalMode,
    /// AnalysisTemplates run in each of this wave's clusters as a gate after the rollout's
    /// last step or batch (beside a gate of its own there; a rolling CanaryDeployment runs
    /// them in the background): the cluster completes the image only once they pass, so the
    /// next wave starts only then. A failure rolls that cluster back, and the fleet's failure
    /// policy keeps the image from every later wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<crate::api::AnalysisRef>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum WaveApprovalMode {
    /// The wave starts as soon as the waves before it are baked.
    #[default]
    Automatic,
    /// The wave waits for an approval in Git as well.
    Manual,
}

/// A person's approval of one image for one wave.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaveApproval {
    pub wave: String,
    pub image: String,
}

/// What a failure in one cluster does to the rest of the fleet.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum FleetFailurePolicy {
    /// No later wave starts the failed image (the failed cluster rolls back as its rollout
    /// says); the clusters that have it keep it.
    #[default]
    Stop,
    /// As `stop`, and the failed cluster's revert (its rollout's `onFailure.revert`) may put
    /// the good image back in a Kustomize base the fleet's overlays share, when that is where
    /// the image is set: one commit or pull request then puts every wave back. Without it, a
    /// revert edits only the cluster's own overlay.
    Revert,
}

impl Wave {
    /// Whether this wave names or selects `cluster`.
    pub fn has(&self, cluster: &ClusterIdentity) -> bool {
        self.clusters.contains(&cluster.name)
            || self.match_labels.as_ref().is_some_and(|want| {
                want.iter()
                    .all(|(k, v)| cluster.labels.get(k).is_some_and(|x| x == v))
            })
    }
}

impl FleetSpec {
    /// The index of the wave `cluster` is in: the first that names or selects it.
    pub fn wave_of(&self, cluster: &ClusterIdentity) -> Option<usize> {
        self.waves.iter().position(|w| w.has(cluster))
    }

    /// Whether the rollout `kind` `namespace/name` moves in this fleet's waves.
    pub fn moves(&self, kind: &str, namespace: &str, name: &str) -> bool {
        self.rollouts.is_empty()
            || self.rollouts.iter().any(|r| {
                r.namespace == namespace
                    && r.name == name
                    && r.kind.as_deref().is_none_or(|k| k == kind)
            })
    }

    /// Whether a person approved `image` for wave `wave`.
    pub fn approved(&self, wave: &str, image: &str) -> bool {
        self.approvals
            .iter()
            .any(|a| a.wave == wave && a.image == image)
    }

    /// What is wrong with the spec beyond its types: `(field path, message)`.
    pub fn problems(&self) -> Vec<(Vec<String>, String)> {
        let mut found = Vec::new();
        for (i, w) in self.waves.iter().enumerate() {
            let at = |field: &str| vec!["spec".into(), "waves".into(), i.to_string(), field.into()];
            if self.waves[..i].iter().any(|x| x.name == w.name) {
                found.push((at("name"), format!("wave {} is named twice", w.name)));
            }
            if w.clusters.is_empty() && w.match_labels.is_none() {
                found.push((
                    at("name"),
                    format!(
                        "wave {} has no clusters: name them (`clusters`) or select them by label \
                         (`matchLabels`; `{{}}` selects every cluster not in an earlier wave)",
                        w.name
                    ),
                ));
            }
            for c in &w.clusters {
                if let Some(earlier) = self.waves[..i].iter().find(|x| x.clusters.contains(c)) {
                    found.push((
                        at("clusters"),
                        format!("cluster {c} is already in wave {}", earlier.name),
                    ));
                }
                if let Some(why) = cluster_name_problem(c) {
                    found.push((at("clusters"), why));
                }
            }
            if w.analysis.as_ref().is_some_and(|a| a.templates.is_empty()) {
                found.push((
                    at("analysis"),
                    format!(
                        "wave {}'s analysis names no templates (`templates: [{{templateName: ...}}]`)",
                        w.name
                    ),
                ));
            }
        }
        for (i, a) in self.approvals.iter().enumerate() {
            if !self.waves.iter().any(|w| w.name == a.wave) {
                found.push((
                    vec![
                        "spec".into(),
                        "approvals".into(),
                        i.to_string(),
                        "wave".into(),
                    ],
                    format!(
                        "approval for wave {}, which the fleet does not have",
                        a.wave
                    ),
                ));
            }
        }
        found
    }
}

/// Who this agent is in a fleet: `--cluster` and `--cluster-label`s.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterIdentity {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// Why `name` cannot be a cluster's name (it is a directory of the status files): `None` when
/// it can (a DNS label: lowercase letters, digits and `-`, at most 63).
pub fn cluster_name_problem(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    (!ok).then(|| {
        format!(
            "cluster name {name:?} is not a DNS label (lowercase letters, digits and `-`, at most \
             63, starting and ending with a letter or digit)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str, labels: &[(&str, &str)]) -> ClusterIdentity {
        ClusterIdentity {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn spec(yaml: &str) -> FleetSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn a_cluster_is_in_the_first_wave_that_names_or_selects_it() {
        let s = spec(
            "waves:\n- {name: canary, clusters: [eu-1]}\n- {name: eu, matchLabels: {region: eu}}\n- {name: rest, matchLabels: {}}\n",
        );
        assert_eq!(s.wave_of(&cluster("eu-1", &[("region", "eu")])), Some(0));
        assert_eq!(s.wave_of(&cluster("eu-2", &[("region", "eu")])), Some(1));
        assert_eq!(s.wave_of(&cluster("us-1", &[("region", "us")])), Some(2));
        let no_rest = spec("waves:\n- {name: canary, clusters: [eu-1]}\n");
        assert_eq!(no_rest.wave_of(&cluster("us-1", &[])), None);
    }

    #[test]
    fn every_rollout_moves_unless_the_fleet_names_some() {
        let all = spec("waves:\n- {name: a, clusters: [x]}\n");
        assert!(all.moves("CanaryDeployment", "shop", "web"));
        let some = spec(
            "rollouts:\n- {namespace: shop, name: web, kind: CanaryDeployment}\nwaves:\n- {name: a, clusters: [x]}\n",
        );
        assert!(some.moves("CanaryDeployment", "shop", "web"));
        assert!(!some.moves("CanaryStatefulSet", "shop", "web"));
        assert!(!some.moves("CanaryDeployment", "shop", "db"));
        assert_eq!(all.report_deadline_seconds, 600);
        assert_eq!(all.on_failure, FleetFailurePolicy::Stop);
    }

    #[test]
    fn problems_name_the_field() {
        let s = spec(
            "waves:\n- {name: a, clusters: [x, Bad_Name]}\n- {name: a, clusters: [x]}\n- {name: c, analysis: {templates: []}}\napprovals:\n- {wave: d, image: 'r:1'}\n",
        );
        let found: Vec<String> = s
            .problems()
            .into_iter()
            .map(|(p, m)| format!("{}: {m}", p.join(".")))
            .collect();
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("spec.waves.0.clusters: cluster name \"Bad_Name\"")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f == "spec.waves.1.name: wave a is named twice"),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f == "spec.waves.1.clusters: cluster x is already in wave a"),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("spec.waves.2.name: wave c has no clusters")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f
                    .starts_with("spec.waves.2.analysis: wave c's analysis names no templates")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("spec.approvals.0.wave: approval for wave d")),
            "{found:?}"
        );
    }

    #[test]
    fn cluster_names_are_dns_labels() {
        for ok in ["eu-1", "prod", "a"] {
            assert_eq!(cluster_name_problem(ok), None, "{ok}");
        }
        for bad in ["", "EU", "eu_1", "-eu", "eu-", "a/b", "..", &"a".repeat(64)] {
            assert!(cluster_name_problem(bad).is_some(), "{bad:?}");
        }
    }
}
