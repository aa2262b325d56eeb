//! The status files linnet writes to Git: `.linnet/status/<cluster>/<namespace>/<xx>/<name>.yaml`,
//! one per rollout and cluster (so that the agents of a fleet never write the same file), one
//! `.linnet/status/<cluster>/_cluster.yaml` per cluster (its labels, which a fleet's waves
//! select by), and the commit message that says what changed. Pure: rollout status in, file
//! text out. The text changes only when the rollout does (no clocks, no counters that tick),
//! so an unchanged rollout never makes a commit.

use serde::Serialize;

pub use crate::api::status_paths::{
    CLUSTER_KIND, ClusterDocument, STATUS_DIR, cluster_path, fan_out, flat_path, path,
    unclustered_path,
};
use crate::api::{CanaryDeployment, CanaryStatefulSet, ClusterIdentity, Condition, RolloutView};

/// One rollout's status file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusFile {
    /// `.linnet/status/<cluster>/<namespace>/<xx>/<name>.yaml` ([`path`]).
    pub path: String,
    /// Where earlier linnets wrote this file ([`unclustered_path`], [`flat_path`]): a write
    /// removes it there.
    pub replaces: Vec<String>,
    pub content: String,
    /// For the commit message, e.g. `default/redis CanaryActive (2 on redis:7.2, 1 on redis:7.4; 3/3 ready)`.
    pub summary: String,
}

/// The file's schema (documented in docs/write-back.md; keep it stable).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    api_version: &'static str,
    kind: &'static str,
    /// The cluster (`--cluster`) whose rollout this is.
    cluster: &'a str,
    namespace: &'a str,
    name: &'a str,
    /// The Git commit that last set the spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    source_revision: Option<&'a str>,
    phase: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<String>,
    images: Images<'a>,
    replicas: Replicas,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<&'a str>,
    /// Percent of the routes' requests the canary gets (with traffic routing).
    #[serde(skip_serializing_if = "Option::is_none")]
    canary_weight: Option<i32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    conditions: Vec<DocCondition<'a>>,
}

#[derive(Serialize)]
struct Images<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    stable: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    canary: Option<&'a str>,
    /// What the spec asks for, started or not (a fleet's wave may hold it).
    wanted: &'a str,
}

#[derive(Serialize)]
struct Replicas {
    desired: i32,
    ready: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    canary: Option<i32>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DocCondition<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    status: &'a str,
    reason: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    last_transition_time: String,
}

fn conditions(cs: &[Condition]) -> Vec<DocCondition<'_>> {
    cs.iter()
        .map(|c| DocCondition {
            type_: &c.type_,
            status: &c.status,
            reason: &c.reason,
            message: &c.message,
            last_transition_time: c.last_transition_time.0.to_string(),
        })
        .collect()
}

fn render(doc: &Document<'_>, summary: String) -> StatusFile {
    let body = serde_saphyr::to_string(doc).unwrap_or_default();
    StatusFile {
        path: path(doc.cluster, doc.namespace, doc.name),
        replaces: vec![
            unclustered_path(doc.namespace, doc.name),
            flat_path(doc.namespace, doc.name),
        ],
        content: format!("# Written by linnet: the rollout's progress. Do not edit.\n{body}"),
        summary,
    }
}

/// The file that says who this cluster is.
pub fn cluster_file(cluster: &ClusterIdentity) -> StatusFile {
    let doc = ClusterDocument {
        api_version: crate::api::API_VERSION.into(),
        kind: CLUSTER_KIND.into(),
        cluster: cluster.clone(),
    };
    let body = serde_saphyr::to_string(&doc).unwrap_or_default();
    StatusFile {
        path: cluster_path(&cluster.name),
        replaces: Vec::new(),
        content: format!(
            "# Written by linnet: this cluster's name and labels. Do not edit.\n{body}"
        ),
        summary: format!("cluster {} is here", cluster.name),
    }
}

/// The status file of a CanaryStatefulSet; `None` before it has a status.
pub fn for_statefulset(o: &CanaryStatefulSet, cluster: &str) -> Option<StatusFile> {
    status_file(o, cluster)
}

/// The status file of a CanaryDeployment; `None` before it has a status.
pub fn for_deployment(o: &CanaryDeployment, cluster: &str) -> Option<StatusFile> {
    status_file(o, cluster)
}

/// The status file of any rollout; `None` before it has a status.
pub fn status_file<R: RolloutView>(o: &R, cluster: &str) -> Option<StatusFile> {
    let phase = o.phase_name()?;
    let namespace = o.meta().namespace.as_deref()?;
    let name = o.meta().name.as_deref()?;
    let summary = o.summary()?;
    let doc = Document {
        api_version: crate::api::API_VERSION,
        kind: R::KIND,
        cluster,
        namespace,
        name,
        source_revision: o.source_revision(),
        phase,
        message: o.message(),
        since: o.phase_since().map(|t| t.0.to_string()),
        images: Images {
            stable: o.stable_image(),
            canary: o.canary_image(),
            wanted: o.spec_image(),
        },
        replicas: Replicas {
            desired: o.desired_replicas(),
            ready: o.ready_replicas(),
            canary: o.canary_ready_replicas(),
        },
        step: o.step(),
        batch: o.batch(),
        canary_weight: o.canary_weight(),
        conditions: conditions(o.conditions()),
    };
    Some(render(&doc, summary))
}

/// The longest line of a commit message linnet writes.
const MAX_SUMMARY_CHARS: usize = 200;

/// The commit message for a set of changed files: `linnet: <summary>; <summary>`.
pub fn commit_message(changed: &[&StatusFile]) -> String {
    // A summary quotes the spec (an image): one bounded line each, so it cannot add lines
    // or trailers to the message.
    let mut parts: Vec<String> = changed
        .iter()
        .map(|f| crate::text::one_line(&f.summary, MAX_SUMMARY_CHARS))
        .collect();
    parts.sort_unstable();
    let mut message = format!("linnet: {}", parts.join("; "));
    if parts.len() == 1 {
        message = crate::text::one_line(&message, MAX_SUMMARY_CHARS);
    } else if message.chars().count() > MAX_SUMMARY_CHARS {
        message = format!(
            "linnet: status of {} rollouts\n\n{}",
            parts.len(),
            parts.join("\n")
        );
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CanaryStatefulSetStatus, StatefulSetPhase};

    fn redis(phase: StatefulSetPhase) -> CanaryStatefulSet {
        let mut o: CanaryStatefulSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1",
            "kind": "CanaryStatefulSet",
            "metadata": {"name": "redis", "namespace": "default"},
            "spec": {"replicas": 3, "image": "redis:7.4", "template": {
                "selector": {"matchLabels": {"app": "redis"}},
                "template": {"spec": {"containers": [{"name": "redis"}]}}
            }}
        }))
        .unwrap();
        o.status = Some(CanaryStatefulSetStatus {
            phase: Some(phase),
            stable_image: Some("redis:7.2".into()),
            canary_image: Some("redis:7.4".into()),
            ready: Some("1/3".into()),
            ready_replicas: 3,
            canary_ready_replicas: 1,
            source_revision: Some("abc123".into()),
            ..Default::default()
        });
        o
    }

    #[test]
    fn a_status_file_says_where_the_rollout_is() {
        let f = for_statefulset(&redis(StatefulSetPhase::CanaryActive), "default").unwrap();
        // `printf %s redis | sha256sum | cut -c1-2` is 34, as docs/write-back.md says.
        assert_eq!(f.path, ".linnet/status/default/default/34/redis.yaml");
        assert_eq!(
            f.replaces,
            [
                ".linnet/status/default/34/redis.yaml",
                ".linnet/status/default/redis.yaml"
            ]
        );
        assert_eq!(
            f.summary,
            "default/redis CanaryActive (2 on redis:7.2, 1 on redis:7.4; 1/3 ready)"
        );
        for line in [
            "kind: CanaryStatefulSet",
            "sourceRevision: abc123",
            "phase: CanaryActive",
            "stable: redis:7.2",
            "canary: redis:7.4",
            "wanted: redis:7.4",
            "cluster: default",
            "desired: 3",
        ] {
            assert!(f.content.contains(line), "no {line:?} in\n{}", f.content);
        }
        assert_eq!(
            commit_message(&[&f]),
            "linnet: default/redis CanaryActive (2 on redis:7.2, 1 on redis:7.4; 1/3 ready)"
        );
    }

    #[test]
    fn an_image_with_a_newline_cannot_forge_a_trailer_or_grow_the_message() {
        // Issue 20: a newline in a spec's image put `Signed-off-by:` into linnet's commit.
        let mut o = redis(StatefulSetPhase::CanaryActive);
        if let Some(s) = o.status.as_mut() {
            s.canary_image = Some(format!(
                "redis:7.4\n\nSigned-off-by: Mallory <m@example.com>{}",
                "x".repeat(60_000)
            ));
        }
        let f = for_statefulset(&o, "default").unwrap();
        let message = commit_message(&[&f]);
        assert!(!message.contains('\n'), "{message}");
        assert!(message.chars().count() <= 200, "{}", message.len());
        let many: Vec<StatusFile> = (0..5).map(|_| f.clone()).collect();
        let message = commit_message(&many.iter().collect::<Vec<_>>());
        assert!(message.lines().all(|l| l.chars().count() <= 200));
        assert!(!message.lines().any(|l| l.starts_with("Signed-off-by")));
    }

    #[test]
    fn a_cluster_says_who_it_is_in_a_file_no_rollout_can_have() {
        let eu = ClusterIdentity {
            name: "eu-1".into(),
            labels: [("region".to_string(), "eu".to_string())].into(),
        };
        let f = cluster_file(&eu);
        assert_eq!(f.path, ".linnet/status/eu-1/_cluster.yaml");
        let body: ClusterDocument = serde_saphyr::from_str(&f.content).unwrap();
        assert_eq!((body.kind.as_str(), body.cluster), (CLUSTER_KIND, eu));
        let rollout = for_statefulset(&redis(StatefulSetPhase::Stable), "eu-1").unwrap();
        assert_eq!(rollout.path, ".linnet/status/eu-1/default/34/redis.yaml");
    }

    #[test]
    fn the_same_status_gives_the_same_text() {
        let a = for_statefulset(&redis(StatefulSetPhase::Stable), "default").unwrap();
        let b = for_statefulset(&redis(StatefulSetPhase::Stable), "default").unwrap();
        assert_eq!(a, b);
        assert_ne!(
            a,
            for_statefulset(&redis(StatefulSetPhase::Promoting), "default").unwrap()
        );
    }

    #[test]
    fn a_subject_names_the_image_each_replica_count_runs() {
        // Issue 18: `RolledBack (3/3 on redis:broken)` named the image no replica ran.
        let mut o = redis(StatefulSetPhase::RolledBack);
        let status = o.status.as_mut().unwrap();
        status.canary_image = Some("redis:broken".into());
        status.canary_ready_replicas = 0;
        status.ready = Some("3/3".into());
        let f = for_statefulset(&o, "default").unwrap();
        assert_eq!(
            f.summary,
            "default/redis RolledBack (3 on redis:7.2; 3/3 ready)"
        );

        let mut d: CanaryDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1",
            "kind": "CanaryDeployment",
            "metadata": {"name": "app", "namespace": "default"},
            "spec": {"replicas": 6, "image": "app:v2", "template": {
                "selector": {"matchLabels": {"app": "app"}},
                "template": {"spec": {"containers": [{"name": "app"}]}}
            }}
        }))
        .unwrap();
        d.status = Some(crate::api::CanaryDeploymentStatus {
            phase: Some(crate::api::DeploymentPhase::Paused),
            stable_image: Some("app:v1".into()),
            canary_image: Some("app:v2".into()),
            batch: Some("1/3".into()),
            ready: Some("6/6".into()),
            available_replicas: 6,
            available_by_image: vec![
                crate::api::ImageReplicas {
                    image: "app:v1".into(),
                    replicas: 4,
                },
                crate::api::ImageReplicas {
                    image: "app:v2".into(),
                    replicas: 2,
                },
            ],
            ..Default::default()
        });
        let f = for_deployment(&d, "default").unwrap();
        assert_eq!(
            f.summary,
            "default/app Paused (batch 1/3: 4 on app:v1, 2 on app:v2; 6/6 ready)"
        );
    }

    #[test]
    fn no_status_no_file() {
        let mut o = redis(StatefulSetPhase::Stable);
        o.status = None;
        assert!(for_statefulset(&o, "default").is_none());
    }
}
