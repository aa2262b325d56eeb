//! The tree `linnet get` prints for one rollout: its summary, its sets or Deployments, their
//! pods with image, readiness and volume, and its last events. Pure: built from objects a
//! caller read, so it is tested without a cluster.

use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::ResourceExt;

use crate::api::{CanaryDeployment, CanaryStatefulSet, Condition, ROLE_LABEL};

/// The rollout, either kind.
#[derive(Clone, Debug)]
pub enum RolloutObject {
    StatefulSet(Box<CanaryStatefulSet>),
    Deployment(Box<CanaryDeployment>),
}

/// What one `linnet get` shows: the rollout and what it made, as read from the cluster.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub rollout: RolloutObject,
    /// The rollout's StatefulSets (a CanaryStatefulSet) or Deployments (a CanaryDeployment).
    pub stateful_sets: Vec<StatefulSet>,
    pub deployments: Vec<Deployment>,
    /// Pods of those workloads.
    pub pods: Vec<Pod>,
    /// Claims in the namespace, to show each pod's volume.
    pub claims: Vec<PersistentVolumeClaim>,
    /// Events about the rollout, any order.
    pub events: Vec<Event>,
}

/// How many events the tree shows.
const EVENTS_SHOWN: usize = 6;

impl Snapshot {
    /// The tree as text, `now` for ages.
    pub fn render(&self, now: jiff::Timestamp) -> String {
        let mut out = String::new();
        match &self.rollout {
            RolloutObject::StatefulSet(r) => self.render_sts(r, now, &mut out),
            RolloutObject::Deployment(r) => self.render_deploy(r, now, &mut out),
        }
        self.render_events(now, &mut out);
        out
    }

    fn render_sts(&self, r: &CanaryStatefulSet, now: jiff::Timestamp, out: &mut String) {
        let st = r.status.clone().unwrap_or_default();
        header(out, "Name", &r.name_any());
        header(out, "Namespace", &r.namespace().unwrap_or_default());
        header(
            out,
            "Kind",
            &format!("CanaryStatefulSet ({:?})", r.spec.strategy.type_),
        );
        header(
            out,
            "Phase",
            &phase_text(st.phase.map(|p| format!("{p:?}"))),
        );
        header(out, "Message", st.message.as_deref().unwrap_or("-"));
        header(
            out,
            "Images",
            &images(st.stable_image.as_deref(), st.canary_image.as_deref()),
        );
        header(
            out,
            "Replicas",
            &format!(
                "{} ready, {} canary ready (desired {}, canary {})",
                st.ready.as_deref().unwrap_or("-"),
                st.canary_ready_replicas,
                r.spec.replicas,
                r.spec.canary_replicas
            ),
        );
        if let Some(steps) = &r.spec.steps {
            let step = st.current_step.unwrap_or(0) + 1;
            header(out, "Step", &format!("{step}/{} {steps:?}", steps.len()));
        }
        header(out, "Conditions", &conditions(&st.conditions));
        header(
            out,
            "Source",
            &source(r.annotations(), st.source_revision.as_deref()),
        );
        out.push('\n');
        let _ = writeln!(
            out,
            "{:<32} {:<18} {:<14} {:<22} {:<14} AGE",
            "NAME", "KIND", "STATUS", "IMAGE", "VOLUME"
        );
        row(
            out,
            "",
            &r.name_any(),
            "CanaryStatefulSet",
            &phase_text(st.phase.map(|p| format!("{p:?}"))),
            "",
            "",
            created(r.metadata.creation_timestamp.as_ref(), now),
        );
        let mut sets: Vec<&StatefulSet> = self.stateful_sets.iter().collect();
        sets.sort_by_key(|s| s.name_any());
        for (i, set) in sets.iter().enumerate() {
            let last = i + 1 == sets.len();
            let status = set.status.as_ref();
            let ready = format!(
                "{}/{}",
                status.and_then(|s| s.ready_replicas).unwrap_or(0),
                set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
            );
            let role = set.labels().get(ROLE_LABEL).cloned().unwrap_or_default();
            let image = set
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            row(
                out,
                branch(last),
                &set.name_any(),
                "StatefulSet",
                &format!("{ready} {role}"),
                &image,
                "",
                created(set.metadata.creation_timestamp.as_ref(), now),
            );
            let pods = self.pods_of(&set.name_any(), |p| {
                p.owner_references()
                    .iter()
                    .any(|o| o.kind == "StatefulSet" && o.name == set.name_any())
            });
            self.render_pods(&pods, if last { "    " } else { "│   " }, now, out);
        }
    }

    fn render_deploy(&self, r: &CanaryDeployment, now: jiff::Timestamp, out: &mut String) {
        let st = r.status.clone().unwrap_or_default();
        header(out, "Name", &r.name_any());
        header(out, "Namespace", &r.namespace().unwrap_or_default());
        header(
            out,
            "Kind",
            &format!("CanaryDeployment ({:?})", r.spec.strategy.type_),
        );
        header(
            out,
            "Phase",
            &phase_text(st.phase.map(|p| format!("{p:?}"))),
        );
        header(out, "Message", st.message.as_deref().unwrap_or("-"));
        header(
            out,
            "Images",
            &images(st.stable_image.as_deref(), st.canary_image.as_deref()),
        );
        header(
            out,
            "Replicas",
            &format!(
                "{} ready (desired {})",
                st.ready.as_deref().unwrap_or("-"),
                r.spec.replicas
            ),
        );
        if let Some(batch) = &st.batch {
            let states: Vec<String> = st
                .batches
                .iter()
                .map(|b| format!("{}:{:?}", b.batch, b.state))
                .collect();
            header(out, "Batch", &format!("{batch} [{}]", states.join(" ")));
        }
        header(out, "Conditions", &conditions(&st.conditions));
        header(
            out,
            "Source",
            &source(r.annotations(), st.source_revision.as_deref()),
        );
        out.push('\n');
        let _ = writeln!(
            out,
            "{:<32} {:<18} {:<14} {:<22} {:<14} AGE",
            "NAME", "KIND", "STATUS", "IMAGE", "VOLUME"
        );
        row(
            out,
            "",
            &r.name_any(),
            "CanaryDeploy",
            &phase_text(st.phase.map(|p| format!("{p:?}"))),
            "",
            "",
            created(r.metadata.creation_timestamp.as_ref(), now),
        );
        let mut deployments: Vec<&Deployment> = self.deployments.iter().collect();
        deployments.sort_by_key(|d| d.name_any());
        for (i, d) in deployments.iter().enumerate() {
            let last = i + 1 == deployments.len();
            let spec = d.spec.as_ref();
            let ready = format!(
                "{}/{}",
                d.status
                    .as_ref()
                    .and_then(|s| s.available_replicas)
                    .unwrap_or(0),
                spec.and_then(|s| s.replicas).unwrap_or(0)
            );
            let image = spec
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            row(
                out,
                branch(last),
                &d.name_any(),
                "Deployment",
                &ready,
                &image,
                "",
                created(d.metadata.creation_timestamp.as_ref(), now),
            );
            let selector = spec
                .and_then(|s| s.selector.match_labels.clone())
                .unwrap_or_default();
            let pods = self.pods_of(&d.name_any(), |p| {
                !selector.is_empty() && selector.iter().all(|(k, v)| p.labels().get(k) == Some(v))
            });
            self.render_pods(&pods, if last { "    " } else { "│   " }, now, out);
        }
    }

    fn pods_of(&self, _owner: &str, belongs: impl Fn(&Pod) -> bool) -> Vec<&Pod> {
        let mut pods: Vec<&Pod> = self.pods.iter().filter(|p| belongs(p)).collect();
        pods.sort_by_key(|p| p.name_any());
        pods
    }

    fn render_pods(&self, pods: &[&Pod], indent: &str, now: jiff::Timestamp, out: &mut String) {
        for (i, pod) in pods.iter().enumerate() {
            let last = i + 1 == pods.len();
            let image = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            let volume = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .map(|c| {
                    let bound = self
                        .claims
                        .iter()
                        .find(|claim| claim.name_any() == c.claim_name)
                        .and_then(|claim| claim.spec.as_ref())
                        .and_then(|s| s.volume_name.clone());
                    bound.unwrap_or_else(|| format!("({} unbound)", c.claim_name))
                })
                .collect::<Vec<_>>()
                .join(",");
            let status = if pod.metadata.deletion_timestamp.is_some() {
                "Terminating".to_string()
            } else if pod_ready(pod) {
                "Ready".to_string()
            } else {
                pod.status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Pending".into())
            };
            let prefix = format!("{indent}{}", branch(last));
            row(
                out,
                &prefix,
                &pod.name_any(),
                "Pod",
                &status,
                &image,
                &volume,
                created(pod.metadata.creation_timestamp.as_ref(), now),
            );
        }
    }

    fn render_events(&self, now: jiff::Timestamp, out: &mut String) {
        let mut events: Vec<&Event> = self.events.iter().collect();
        events.sort_by_key(|e| event_time(e));
        let shown: Vec<&&Event> = events.iter().rev().take(EVENTS_SHOWN).collect();
        out.push_str("\nEvents:\n");
        if shown.is_empty() {
            out.push_str("  (none)\n");
        }
        for e in shown.into_iter().rev() {
            let age = event_time(e).map_or("-".into(), |t| age(now, t));
            let _ = writeln!(
                out,
                "  {:>5}  {:<7}  {:<22} {}",
                age,
                printable(e.type_.as_deref().unwrap_or("")),
                printable(e.reason.as_deref().unwrap_or("")),
                printable(e.message.as_deref().unwrap_or(""))
            );
        }
    }
}

fn header(out: &mut String, name: &str, value: &str) {
    let _ = writeln!(out, "{:<12} {}", format!("{name}:"), printable(value));
}

/// `text` without control characters: what the tree prints comes from the cluster (event
/// messages, images, annotations), and an escape sequence there must not reach the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn row(
    out: &mut String,
    prefix: &str,
    name: &str,
    kind: &str,
    status: &str,
    image: &str,
    volume: &str,
    age: String,
) {
    let _ = writeln!(
        out,
        "{:<32} {:<18} {:<14} {:<22} {:<14} {age}",
        printable(&format!("{prefix}{name}")),
        kind,
        printable(status),
        printable(image),
        printable(volume)
    );
}

fn branch(last: bool) -> &'static str {
    if last { "└── " } else { "├── " }
}

fn phase_text(phase: Option<String>) -> String {
    phase.unwrap_or_else(|| "(no status yet)".into())
}

fn images(stable: Option<&str>, canary: Option<&str>) -> String {
    match (stable, canary) {
        (Some(s), Some(c)) if s != c => format!("{s} (stable), {c} (canary)"),
        (Some(s), _) => format!("{s} (stable)"),
        (None, Some(c)) => format!("{c} (canary)"),
        (None, None) => "-".into(),
    }
}

fn conditions(conditions: &[Condition]) -> String {
    if conditions.is_empty() {
        return "-".into();
    }
    conditions
        .iter()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect::<Vec<_>>()
        .join(" ")
}

fn source(
    annotations: &std::collections::BTreeMap<String, String>,
    revision: Option<&str>,
) -> String {
    let path = annotations
        .get(crate::api::SOURCE_PATH_ANNOTATION)
        .map_or("(not from Git)", String::as_str);
    match revision {
        Some(r) => format!("{path} @ {}", r.chars().take(12).collect::<String>()),
        None => path.to_string(),
    }
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn event_time(e: &Event) -> Option<jiff::Timestamp> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

fn created(
    t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    now: jiff::Timestamp,
) -> String {
    t.map_or("-".into(), |t| age(now, t.0))
}

/// A short age as kubectl prints it: 45s, 3m, 2h, 4d.
fn age(now: jiff::Timestamp, then: jiff::Timestamp) -> String {
    let secs = now.duration_since(then).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_canary_shows_each_set_its_pods_their_images_and_volumes() {
        let now = jiff::Timestamp::from_second(1_700_000_100).unwrap();
        let t = "2023-11-14T22:13:20Z";
        let rollout: CanaryStatefulSet = from(serde_json::json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
            "metadata": {"name": "redis", "namespace": "demo", "creationTimestamp": t,
                "annotations": {"rollouts.linnet.dev/source-path": "apps/redis/redis.yaml"}},
            "spec": {"replicas": 3, "canaryReplicas": 1, "image": "redis:2",
                "strategy": {"type": "TwoSets"}, "template": {}},
            "status": {"phase": "CanaryActive", "stableImage": "redis:1", "canaryImage": "redis:2",
                "ready": "3/3", "readyReplicas": 3, "canaryReadyReplicas": 1,
                "message": "waiting for promotion",
                "sourceRevision": "0123456789abcdef0123",
                "conditions": [{"type": "Reconciling", "status": "True", "reason": "CanaryActive",
                    "message": "", "lastTransitionTime": t}]}
        }));
        let set = |name: &str, role: &str, n: i32, image: &str| -> StatefulSet {
            from(serde_json::json!({
                "metadata": {"name": name, "namespace": "demo", "labels": {ROLE_LABEL: role}},
                "spec": {"replicas": n, "serviceName": "redis", "selector": {},
                    "template": {"spec": {"containers": [{"name": "redis", "image": image}]}}},
                "status": {"replicas": n, "readyReplicas": n}
            }))
        };
        let pod = |name: &str, set: &str, image: &str, claim: &str| -> Pod {
            from(serde_json::json!({
                "metadata": {"name": name, "namespace": "demo", "creationTimestamp": "2023-11-14T22:13:20Z",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": set, "uid": "u"}]},
                "spec": {"containers": [{"name": "redis", "image": image}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            }))
        };
        let claim = |name: &str, pv: &str| -> PersistentVolumeClaim {
            from(serde_json::json!({"metadata": {"name": name}, "spec": {"volumeName": pv}}))
        };
        let event: Event = from(serde_json::json!({
            "metadata": {"name": "e1"}, "involvedObject": {},
            "type": "Normal", "reason": "CanaryStarted", "message": "canary redis:2 on replica 2",
            "lastTimestamp": t
        }));
        let snapshot = Snapshot {
            rollout: RolloutObject::StatefulSet(Box::new(rollout)),
            stateful_sets: vec![
                set("redis-stable", "stable", 2, "redis:1"),
                set("redis-canary", "canary", 1, "redis:2"),
            ],
            deployments: vec![],
            pods: vec![
                pod("redis-stable-0", "redis-stable", "redis:1", "data-redis-0"),
                pod("redis-stable-1", "redis-stable", "redis:1", "data-redis-1"),
                pod(
                    "redis-canary-2",
                    "redis-canary",
                    "redis:2",
                    "data-redis-canary-2",
                ),
            ],
            claims: vec![
                claim("data-redis-0", "pv-a"),
                claim("data-redis-1", "pv-b"),
                claim("data-redis-canary-2", "pv-c"),
            ],
            events: vec![event],
        };
        let text = snapshot.render(now);
        for want in [
            "Phase:       CanaryActive",
            "Images:      redis:1 (stable), redis:2 (canary)",
            "Conditions:  Reconciling=True",
            "Source:      apps/redis/redis.yaml @ 0123456789ab",
            "├── redis-canary",
            "└── redis-stable",
            "│   └── redis-canary-2",
            "    ├── redis-stable-0",
            "CanaryStarted",
        ] {
            assert!(text.contains(want), "no {want:?} in\n{text}");
        }
        let canary_pod = text.lines().find(|l| l.contains("redis-canary-2")).unwrap();
        assert!(
            canary_pod.contains("redis:2")
                && canary_pod.contains("pv-c")
                && canary_pod.contains("Ready"),
            "{canary_pod}"
        );
        assert!(canary_pod.ends_with("100s"), "{canary_pod}");
    }
}
