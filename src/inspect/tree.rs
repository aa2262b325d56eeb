//! The tree `linnet get` prints for one rollout: its summary, its sets or Deployments, their
//! pods with image, readiness and volume, and its last events. Pure: built from objects a
//! caller read, so it is tested without a cluster.

use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::object::RolloutObject;
use super::table::{Table, printable};
use crate::api::{CanaryDeployment, CanaryStatefulSet, Condition, ROLE_LABEL, RolloutView};

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
        let (summary, workloads) = match &self.rollout {
            RolloutObject::StatefulSet(r) => (sts_summary(r), self.sts_workloads(r)),
            RolloutObject::Deployment(r) => (deploy_summary(r), self.deploy_workloads(r)),
        };
        let mut out = String::new();
        for (name, value) in &summary.lines {
            header(&mut out, name, value);
        }
        out.push('\n');
        let mut table = Table::new(&["NAME", "KIND", "STATUS", "IMAGE", "VOLUME", "AGE"]);
        row(
            &mut table,
            "",
            &summary.name,
            summary.kind,
            &summary.phase,
            "",
            "",
            created(summary.created, now),
        );
        for (i, w) in workloads.iter().enumerate() {
            let last = i + 1 == workloads.len();
            row(
                &mut table,
                branch(last),
                &w.name,
                w.kind,
                &w.status,
                &w.image,
                "",
                created(w.created, now),
            );
            self.render_pods(&w.pods, if last { "    " } else { "│   " }, now, &mut table);
        }
        out.push_str(&table.render());
        self.render_events(now, &mut out);
        out
    }

    fn sts_workloads<'s>(&'s self, r: &CanaryStatefulSet) -> Vec<Workload<'s>> {
        let mut sets: Vec<&StatefulSet> = self.stateful_sets.iter().collect();
        sets.sort_by_key(|s| s.name_any());
        sets.into_iter()
            .map(|set| {
                let spec = set.spec.as_ref();
                let role = set.labels().get(ROLE_LABEL).cloned().unwrap_or_default();
                let ready = format!(
                    "{}/{}",
                    set.status
                        .as_ref()
                        .and_then(|s| s.ready_replicas)
                        .unwrap_or(0),
                    spec.and_then(|s| s.replicas).unwrap_or(0)
                );
                let name = set.name_any();
                Workload {
                    kind: "StatefulSet",
                    status: format!("{ready} {role}"),
                    image: template_image(spec.map(|s| &s.template), r.spec.container.as_deref()),
                    created: set.metadata.creation_timestamp.as_ref(),
                    pods: self.pods_where(|p| {
                        p.owner_references()
                            .iter()
                            .any(|o| o.kind == "StatefulSet" && o.name == name)
                    }),
                    name,
                }
            })
            .collect()
    }

    fn deploy_workloads<'s>(&'s self, r: &CanaryDeployment) -> Vec<Workload<'s>> {
        let mut deployments: Vec<&Deployment> = self.deployments.iter().collect();
        deployments.sort_by_key(|d| d.name_any());
        deployments
            .into_iter()
            .map(|d| {
                let spec = d.spec.as_ref();
                let ready = format!(
                    "{}/{}",
                    d.status
                        .as_ref()
                        .and_then(|s| s.available_replicas)
                        .unwrap_or(0),
                    spec.and_then(|s| s.replicas).unwrap_or(0)
                );
                let selector = spec
                    .and_then(|s| s.selector.match_labels.clone())
                    .unwrap_or_default();
                Workload {
                    name: d.name_any(),
                    kind: "Deployment",
                    status: ready,
                    image: template_image(spec.map(|s| &s.template), r.spec.container.as_deref()),
                    created: d.metadata.creation_timestamp.as_ref(),
                    pods: self.pods_where(|p| {
                        !selector.is_empty()
                            && selector.iter().all(|(k, v)| p.labels().get(k) == Some(v))
                    }),
                }
            })
            .collect()
    }

    fn pods_where(&self, belongs: impl Fn(&Pod) -> bool) -> Vec<&Pod> {
        let mut pods: Vec<&Pod> = self.pods.iter().filter(|p| belongs(p)).collect();
        pods.sort_by_key(|p| p.name_any());
        pods
    }

    fn render_pods(&self, pods: &[&Pod], indent: &str, now: jiff::Timestamp, out: &mut Table) {
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

/// The lines above the tree and its root row.
struct Summary<'a> {
    name: String,
    kind: &'static str,
    phase: String,
    created: Option<&'a Time>,
    lines: Vec<(&'static str, String)>,
}

/// A set or Deployment of the rollout, with its pods.
struct Workload<'a> {
    name: String,
    kind: &'static str,
    status: String,
    image: String,
    created: Option<&'a Time>,
    pods: Vec<&'a Pod>,
}

/// The summary lines both kinds share, around `middle` (replicas, step or batch).
fn summary<'a, R: RolloutView>(
    r: &'a R,
    strategy: &str,
    middle: Vec<(&'static str, String)>,
) -> Summary<'a> {
    let meta = r.meta();
    let phase = r
        .phase_name()
        .map_or_else(|| "(no status yet)".into(), str::to_string);
    let mut lines = vec![
        ("Name", meta.name.clone().unwrap_or_default()),
        ("Namespace", meta.namespace.clone().unwrap_or_default()),
        ("Kind", format!("{} ({strategy})", R::KIND)),
        ("Phase", phase.clone()),
        ("Message", r.message().unwrap_or("-").to_string()),
        ("Images", images(r.stable_image(), r.canary_image())),
    ];
    if let Some(traffic) = r.traffic() {
        lines.push(("Traffic", traffic));
    }
    lines.extend(middle);
    lines.push(("Conditions", conditions(r.conditions())));
    lines.push((
        "Source",
        source(meta.annotations.as_ref(), r.source_revision()),
    ));
    if let Some(trace) = r.trace_id() {
        lines.push(("Trace", trace.to_string()));
    }
    Summary {
        name: meta.name.clone().unwrap_or_default(),
        kind: R::KIND,
        phase,
        created: meta.creation_timestamp.as_ref(),
        lines,
    }
}

fn sts_summary(r: &CanaryStatefulSet) -> Summary<'_> {
    let st = r.status.as_ref();
    let mut middle = vec![(
        "Replicas",
        format!(
            "{} ready, {} canary ready (desired {}, canary {})",
            r.ready().unwrap_or("-"),
            st.map_or(0, |s| s.canary_ready_replicas),
            r.spec.replicas,
            r.spec.canary_replicas
        ),
    )];
    if let Some(steps) = &r.spec.steps {
        let step = st.and_then(|s| s.current_step).unwrap_or(0) + 1;
        middle.push(("Step", format!("{step}/{} {steps:?}", steps.len())));
    }
    middle.extend(analysis_lines(st.map_or(&[][..], |s| &s.analysis)));
    summary(r, r.spec.strategy.type_.as_str(), middle)
}

fn deploy_summary(r: &CanaryDeployment) -> Summary<'_> {
    let st = r.status.as_ref();
    let mut middle = vec![(
        "Replicas",
        format!(
            "{} ready (desired {})",
            r.ready().unwrap_or("-"),
            r.spec.replicas
        ),
    )];
    if let Some(st) = st
        && let Some(batch) = &st.batch
    {
        let states: Vec<String> = st
            .batches
            .iter()
            .map(|b| format!("{}:{}", b.batch, b.state))
            .collect();
        middle.push(("Batch", format!("{batch} [{}]", states.join(" "))));
    }
    middle.extend(analysis_lines(st.map_or(&[][..], |s| &s.analysis)));
    summary(r, r.spec.strategy.type_.as_str(), middle)
}

/// The rolled-out container's image in a workload's pod template.
fn template_image(template: Option<&PodTemplateSpec>, container: Option<&str>) -> String {
    crate::plan::observed::container_image(template.and_then(|t| t.spec.as_ref()), container)
        .unwrap_or_default()
}

fn header(out: &mut String, name: &str, value: &str) {
    let _ = writeln!(out, "{:<12} {}", format!("{name}:"), printable(value));
}

#[allow(clippy::too_many_arguments)]
fn row(
    table: &mut Table,
    prefix: &str,
    name: &str,
    kind: &str,
    status: &str,
    image: &str,
    volume: &str,
    age: String,
) {
    table.push(vec![
        format!("{prefix}{name}"),
        kind.to_string(),
        status.to_string(),
        image.to_string(),
        volume.to_string(),
        age,
    ]);
}

fn branch(last: bool) -> &'static str {
    if last { "└── " } else { "├── " }
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
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    revision: Option<&str>,
) -> String {
    let path = annotations
        .and_then(|a| a.get(crate::api::SOURCE_PATH_ANNOTATION))
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

fn created(t: Option<&Time>, now: jiff::Timestamp) -> String {
    t.map_or("-".into(), |t| age(now, t.0))
}

/// A short age as kubectl prints it: 45s, 3m, 2h, 4d.
pub(super) fn age(now: jiff::Timestamp, then: jiff::Timestamp) -> String {
    let secs = now.duration_since(then).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

mod analysis;
use analysis::analysis_lines;

#[cfg(test)]
mod tests;
