//! Blue-green without a gateway (`strategy.blueGreen.activeService`): the switch points a
//! Service of the user's at one version by the version label in its selector, rather than
//! weighing routes. The Service is the user's: linnet owns only that key of its selector (and
//! its rollout label, so that its EndpointSlices wake the rollout), and hands it back as it
//! was once the rollout no longer names it.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::{Recorded, Sides, TrafficStep, Want};
use crate::api::VERSION_LABEL;
use crate::plan::actions::Action;

/// How long after the active Service's endpoints are all the switched version's pods linnet
/// waits before it stops pods that lost their traffic: kube-proxy (or a gateway following
/// the EndpointSlices) applies them a moment later. As `trafficRouting.settleSeconds`' default.
pub const SWITCH_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// The Services a blue-green rollout switches by their selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Switched<'a> {
    pub active: &'a str,
    pub preview: Option<&'a str>,
}

/// Ready pods of each side, from their Deployments, and the labels of the new version's pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SideReady {
    pub stable: i32,
    pub canary: i32,
    pub canary_labels: BTreeMap<String, String>,
}

/// How often a rollout looks again for a Service it names that is not there (nothing else
/// wakes it: an unlabelled Service's EndpointSlices are not watched).
pub const MISSING_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

fn version(side: &BTreeMap<String, String>) -> &str {
    side.get(VERSION_LABEL).map_or("", String::as_str)
}

/// Points the active Service at the version `want` sends every request to (the canary at
/// weight 100, else the stable one), the preview Service at the canary, and hands back the
/// Services in `released`; says what it waits for.
#[allow(clippy::too_many_arguments)]
pub fn service_switch_step(
    (rollout, namespace): (&str, &str),
    switched: Option<Switched>,
    released: &[String],
    sides: &Sides,
    (want, ready): (Want, SideReady),
    view: &super::TrafficView,
    recorded: Recorded,
    now: Timestamp,
) -> TrafficStep {
    let mut out = TrafficStep::default();
    let owner = format!("CanaryDeployment/{rollout}");
    hand_back(released, view, &owner, &mut out.actions);
    let Some(switched) = switched else {
        return out;
    };
    let (stable, canary) = (version(&sides.stable), version(&sides.canary));
    let active = view.services.iter().find(|s| s.name == switched.active);
    out.now = seen_now(active, (stable, canary), recorded, now);
    let (target, lost) = match switch_target((want, &ready), (stable, canary), switched.active) {
        Target::Select(target, lost) => (target, lost),
        Target::Hold(why) => {
            out.waiting = Some(why);
            return out;
        }
    };
    let mut waiting: Vec<String> = lost.into_iter().collect();
    let new_pods = (target == canary && canary != stable).then_some(&ready.canary_labels);
    let active = (switched.active, target, new_pods);
    // The old version of a rollout that was Rolling has no version label: the Service keeps
    // its own selector (every version's pods) until the switch.
    if target != UNVERSIONED {
        match point(view, active, (namespace, &owner), &mut out) {
            Pointed::At(s) if !all_of(s, target) => waiting.push(endpoints_behind(s, target)),
            Pointed::At(_) => {}
            Pointed::Waiting(why) => waiting.push(why),
        }
    }
    if let Some(preview) = switched.preview {
        let preview = (preview, canary, Some(&ready.canary_labels));
        // Only the preview stage waits for it.
        if let Pointed::Waiting(why) = point(view, preview, (namespace, &owner), &mut out)
            && want.header
        {
            waiting.push(why);
        }
    }
    if waiting.is_empty()
        && want.settle
        && let Some(left) = super::settle_remaining(SWITCH_SETTLE, out.now.since, now)
    {
        waiting.push(format!(
            "letting kube-proxy apply Service {}'s endpoints ({}s more)",
            switched.active,
            left.as_secs_f64().ceil()
        ));
        out.recheck_after = Some(left);
    }
    out.waiting = (!waiting.is_empty()).then(|| waiting.join("; "));
    out
}

/// Whether a Service is pointed at a version.
enum Pointed<'v> {
    /// It is: the Service.
    At(&'v super::ServiceView),
    /// Not yet: why.
    Waiting(String),
}

/// Points Service `name` at `version`, whose pods carry `labels` (when known): the Service
/// when it is there, selects those pods, and is so already; else why not (a missing Service
/// is looked for again, and one whose own selector does not match the pods is left alone).
fn point<'v>(
    view: &'v super::TrafficView,
    (name, version, labels): (&str, &str, Option<&BTreeMap<String, String>>),
    (namespace, owner): (&str, &str),
    out: &mut TrafficStep,
) -> Pointed<'v> {
    let Some(s) = view.services.iter().find(|s| s.name == name) else {
        let again = out
            .recheck_after
            .map_or(MISSING_RECHECK, |r| r.min(MISSING_RECHECK));
        out.recheck_after = Some(again);
        return Pointed::Waiting(format!(
            "Service {name} (strategy.blueGreen) not found in namespace {namespace}: create \
             it, with the pods' labels as its selector; linnet adds {VERSION_LABEL} to it"
        ));
    };
    if let Some(other) = s.switched_by.as_deref().filter(|o| *o != owner) {
        return Pointed::Waiting(format!(
            "Service {name} is switched by {other}: two rollouts cannot switch one Service; \
             name another in strategy.blueGreen"
        ));
    }
    let Some(selector) = &s.selector else {
        return Pointed::Waiting(format!(
            "Service {name} has no selector: linnet switches a Service by adding \
             {VERSION_LABEL} to the selector it has; give it the pods' labels"
        ));
    };
    let foreign: Vec<String> = selector
        .iter()
        .filter(|(k, v)| {
            k.as_str() != VERSION_LABEL && labels.is_some_and(|l| l.get(*k) != Some(v))
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !foreign.is_empty() {
        return Pointed::Waiting(format!(
            "Service {name} selects {} as well, which version {version}'s pods do not carry: \
             add it to the pod template's labels, or take it out of the Service's selector",
            foreign.join(",")
        ));
    }
    if s.selector_version.as_deref() != Some(version) || !s.labelled {
        out.actions.push(Action::SwitchService {
            name: name.to_string(),
            version: Some(version.to_string()),
            owner: owner.to_string(),
        });
        return Pointed::Waiting(format!("pointing Service {name} at version {version}"));
    }
    Pointed::At(s)
}

/// What the active Service is to select.
enum Target<'v> {
    /// This version (the stable one when the new version lost every ready pod: and why).
    Select(&'v str, Option<String>),
    /// What it selects now, until what this says.
    Hold(String),
}

fn switch_target<'v>(
    (want, ready): (Want, &SideReady),
    (stable, canary): (&'v str, &'v str),
    active: &str,
) -> Target<'v> {
    let mut target = if want.weight >= 100 { canary } else { stable };
    let mut lost = None;
    let need = want.canary_endpoints.max(1);
    if target == canary && stable != canary && ready.canary < need {
        let why = format!(
            "waiting for {need} ready pod(s) of version {canary} ({}) before Service {active} selects it",
            ready.canary
        );
        if ready.canary > 0 {
            return Target::Hold(why);
        }
        // None is ready: whatever the new version had goes back to the old one.
        target = stable;
        lost = Some(why);
    }
    // Never a version without a ready pod.
    if target == stable && ready.stable < 1 && stable != UNVERSIONED {
        return Target::Hold(format!(
            "waiting for a ready pod of version {stable} before Service {active} selects it"
        ));
    }
    Target::Select(target, lost)
}

/// Hands back the `released` Services that still carry linnet's marks.
pub fn hand_back(
    released: &[String],
    view: &super::TrafficView,
    owner: &str,
    actions: &mut Vec<Action>,
) {
    for name in released {
        let Some(s) = view.services.iter().find(|s| &s.name == name) else {
            continue;
        };
        if s.switch_marked() {
            actions.push(Action::SwitchService {
                name: name.clone(),
                version: None,
                owner: owner.to_string(),
            });
        }
    }
}

/// Why the switch to `target` is not done: the Service's endpoints are not all its pods yet.
fn endpoints_behind(s: &super::ServiceView, target: &str) -> String {
    let others: i32 = s
        .endpoint_versions
        .iter()
        .filter(|(v, _)| !same_version(v, target))
        .map(|(_, n)| n)
        .sum();
    format!(
        "waiting for Service {}'s endpoints to be version {target}'s pods ({} ready of {target}, {others} of other versions)",
        s.name,
        ready_of(s, target),
    )
}

/// Whether every ready endpoint of `s` is a pod of `version`, and one is.
fn all_of(s: &super::ServiceView, version: &str) -> bool {
    let of = ready_of(s, version);
    of > 0
        && s.endpoint_versions
            .iter()
            .all(|(v, n)| same_version(v, version) || *n == 0)
}

fn ready_of(s: &super::ServiceView, version: &str) -> i32 {
    let of = s
        .endpoint_versions
        .iter()
        .filter(|(v, _)| same_version(v, version));
    of.map(|(_, n)| n).sum()
}

/// The active Service as seen now: 100 when it selects the new version, 0 the old one; since
/// when its endpoints are all of the version it selects (the settle clock).
fn seen_now(
    active: Option<&super::ServiceView>,
    (stable, canary): (&str, &str),
    recorded: Recorded,
    now: Timestamp,
) -> Recorded {
    let selected = active.and_then(|s| s.selector_version.as_deref());
    let weight = match selected {
        Some(v) if v == stable => Some(0),
        Some(v) if v == canary => Some(100),
        _ => None,
    };
    let accepted = active.is_some_and(|s| selected.is_some_and(|v| all_of(s, v)));
    Recorded {
        weight,
        header: false,
        baseline: None,
        since: super::settle_since(accepted, weight == recorded.weight, recorded, now),
    }
}

/// The Services linnet has switched after this plan's writes: the ones named, and the ones
/// released that still carry its marks.
pub fn still_switched(
    switched: Option<Switched>,
    released: &[String],
    view: &super::TrafficView,
) -> Vec<String> {
    let mut names: Vec<String> = switched
        .into_iter()
        .flat_map(|s| std::iter::once(s.active).chain(s.preview))
        .map(str::to_string)
        .collect();
    names.extend(
        released
            .iter()
            .filter(|n| {
                view.services
                    .iter()
                    .any(|s| &&s.name == n && s.switch_marked())
            })
            .cloned(),
    );
    names
}

/// The version of a Deployment's pod from its name (`<rollout>-<version>-<replicaset>-<pod>`);
/// "" for a pod of none. Kubernetes cuts a pod's generated prefix at 58 characters, so for a
/// rollout name of 49 or 50 characters the version runs into the random suffix or is cut:
/// the first 8 characters at most, and [`same_version`] accepts a cut one.
pub fn pod_version<'a>(rollout: &str, pod: &'a str) -> &'a str {
    let rest = pod
        .strip_prefix(rollout)
        .and_then(|p| p.strip_prefix('-'))
        .unwrap_or("");
    let end = rest.find('-').unwrap_or(rest.len()).min(VERSION_LEN);
    rest.get(..end).unwrap_or("")
}

/// The version of a Deployment without one (a rollout that was Rolling: `<name>`).
pub const UNVERSIONED: &str = "none";

/// The length of a version (its hash's first 8 characters, or `baseline`).
const VERSION_LEN: usize = 8;

/// Whether an endpoint's version, read from its pod's name, is `version`.
fn same_version(of_endpoint: &str, version: &str) -> bool {
    !of_endpoint.is_empty() && version.starts_with(of_endpoint)
}

#[cfg(test)]
mod tests;
