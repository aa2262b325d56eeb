//! Traffic shifting through the Gateway API, without I/O: the two Services of a rollout with
//! `trafficRouting`, the HTTPRoute and GRPCRoute rules that weigh them, and whether the routes, as the
//! gateway has accepted them, are at what a phase needs. The phase machines ask for a weight
//! with [`traffic_step`] before any step that would take pods from the side serving traffic.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use super::actions::Action;
use super::objects::{RolloutRef, stamp};
use crate::api::{
    CHILD_HASH_ANNOTATION, RouteKind, TrafficRouting, canary_service_name, stable_service_name,
};

mod rules;
pub mod service_switch;
use rules::has_header_rule;
pub use rules::{RouteError, Split, baseline_weight, current_weight, route_rules, weighed_rules};

/// One of the rollout's two Services, as observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceView {
    pub name: String,
    /// The hash linnet stamped on it when it last applied it.
    pub applied_hash: Option<String>,
    /// Ready endpoints in its EndpointSlices.
    pub ready_endpoints: i32,
    /// A Service of the user's (`blueGreen.activeService`): its selector (None: it has none)
    /// and the version that names.
    pub selector: Option<BTreeMap<String, String>>,
    pub selector_version: Option<String>,
    /// Whether it carries the rollout's label (a Service of the user's that linnet switches).
    pub labelled: bool,
    /// The rollout that switches it (`<Kind>/<name>`, its traffic annotation), if one does.
    pub switched_by: Option<String>,
    /// Its ready endpoints by the version of their pod ([`service_switch::pod_version`]).
    pub endpoint_versions: BTreeMap<String, i32>,
}

impl ServiceView {
    /// Whether a Service of the user's still carries what a switch put on it (the version key
    /// or the rollout label): one to hand back.
    pub fn switch_marked(&self) -> bool {
        self.selector_version.is_some() || self.labelled
    }
}

/// An HTTPRoute or GRPCRoute the rollout weighs, as observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteView {
    pub kind: RouteKind,
    pub name: String,
    /// `spec.rules`.
    pub rules: Value,
    pub generation: i64,
    /// The oldest generation any parent (Gateway) has accepted; None before any has.
    pub accepted_generation: Option<i64>,
    pub resource_version: Option<String>,
}

/// What the planner sees of a rollout's traffic objects (routes not found are absent).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrafficView {
    pub services: Vec<ServiceView>,
    pub routes: Vec<RouteView>,
}

/// The pods each Service selects (labels, all of which must match).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sides {
    pub stable: BTreeMap<String, String>,
    pub canary: BTreeMap<String, String>,
    /// A CanaryDeployment's baseline pods (`strategy.baseline`) while a rollout has them: the
    /// routes give their Service the canary's share (at most half), taken from the stable one.
    pub baseline: Option<BTreeMap<String, String>>,
    /// Whether the kind has a baseline Service (a CanaryDeployment): a `<name>-baseline`
    /// backend in a rule is then linnet's, taken out when `baseline` is None. For the other
    /// kind it is someone else's backend, and the rule is not weighed.
    pub baseline_service: bool,
}

/// What a phase wants of the routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    /// Percent to the canary.
    pub weight: i32,
    /// Whether the header route sends matching requests to the canary.
    pub header: bool,
    /// Ready endpoints the canary Service must have before it gets any traffic.
    pub canary_endpoints: i32,
    /// Whether pods that lose traffic by this change stop next: then the routes must have
    /// been so for `settleSeconds` before the step may go on.
    pub settle: bool,
}

impl Want {
    /// Everything to the stable Service.
    pub fn stable() -> Want {
        Want {
            weight: 0,
            header: false,
            canary_endpoints: 0,
            settle: true,
        }
    }
}

mod record;
pub use record::{Recorded, TrafficRecord};

/// Finishes a plan's traffic, for both kinds: the traffic actions of phases the plan left
/// behind give way to `step`'s (the routes moved to what the phase it stopped in asks), and
/// the status records the routes as `step` leaves them; without traffic routing (`None`),
/// the record is cleared.
pub fn settle(
    actions: &mut Vec<Action>,
    status: &mut impl TrafficRecord,
    step: Option<TrafficStep>,
) {
    actions.retain(|a| !a.is_traffic());
    match step {
        Some(step) => {
            actions.extend(step.actions);
            status.record(step.now);
        }
        None => status.record(Recorded::default()),
    }
}

/// The outcome of [`traffic_step`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrafficStep {
    pub actions: Vec<Action>,
    /// What the routes are not yet at, or None when every route is at the wanted state,
    /// accepted by its gateway, and has been for the settle time.
    pub waiting: Option<String>,
    /// What to record: the routes as observed, and since when they are so.
    pub now: Recorded,
    /// When the settle time is up.
    pub recheck_after: Option<std::time::Duration>,
}

/// The weight of step (or batch) `index` (0-based): the spec's, else the canary's share of
/// `replicas` (`size` of them), rounded.
pub fn step_weight(routing: &TrafficRouting, index: usize, size: i32, replicas: i32) -> i32 {
    match routing.weights.as_ref().and_then(|w| w.get(index)) {
        Some(w) => (*w).clamp(0, 100),
        None if replicas > 0 => (size.clamp(0, replicas) * 100 + replicas / 2) / replicas,
        None => 0,
    }
}

/// The `appProtocol` of the Services' port: cleartext HTTP/2 when GRPCRoutes send to them
/// (the Gateway API's way to say so; without it some gateways speak HTTP/1.1 to the pods).
pub fn app_protocol(routing: &TrafficRouting) -> Option<&'static str> {
    (!routing.gateway_api.grpc_routes.is_empty()).then_some("kubernetes.io/h2c")
}

/// A Service of the rollout selecting `selector`, on the routing's port (with its
/// `appProtocol`).
pub fn service(
    rollout: &RolloutRef,
    kind: &str,
    name: &str,
    (port, app_protocol): (i32, Option<&str>),
    selector: &BTreeMap<String, String>,
) -> Service {
    let mut s = Service {
        metadata: rollout.meta(name, kind, rollout.labels()),
        spec: Some(ServiceSpec {
            selector: Some(selector.clone()),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port,
                target_port: Some(IntOrString::Int(port)),
                protocol: Some("TCP".into()),
                app_protocol: app_protocol.map(str::to_string),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    stamp(&mut s.metadata, &s.spec);
    s
}

fn applied(s: &Service) -> Option<&String> {
    s.metadata.annotations.as_ref()?.get(CHILD_HASH_ANNOTATION)
}

/// Applies the two Services, then, if both sides can take what `want` sends them, moves every
/// route to it.
#[allow(clippy::too_many_arguments)]
pub fn traffic_step(
    rollout: &RolloutRef,
    kind: &str,
    routing: &TrafficRouting,
    sides: &Sides,
    want: Want,
    view: &TrafficView,
    recorded: Recorded,
    now: Timestamp,
) -> TrafficStep {
    let mut out = TrafficStep::default();
    let port = routing.gateway_api.port;
    let stable_name = stable_service_name(&rollout.name);
    let canary_name = canary_service_name(&rollout.name);
    let mut ready = |name: &str, selector: &BTreeMap<String, String>| {
        let port = (port, app_protocol(routing));
        ready_endpoints(view, service(rollout, kind, name, port, selector), &mut out)
    };
    let stable_ready = ready(&stable_name, &sides.stable);
    let canary_ready = ready(&canary_name, &sides.canary);
    let baseline_name = crate::api::baseline_service_name(&rollout.name);
    let baseline_ready = sides.baseline.as_ref().map(|s| ready(&baseline_name, s));
    let with_baseline = sides.baseline_service;
    let names = (stable_name.as_str(), canary_name.as_str(), with_baseline);
    out.now = seen_now(routing, view, names, recorded, now);
    let mut weight = want.weight.clamp(0, 100);
    let mut header_on = want.header;
    let to_canary = weight > 0 || header_on;
    let need_canary = want.canary_endpoints.max(1);
    let mut lost = None;
    if to_canary && canary_ready < need_canary {
        let why = format!(
            "waiting for Service {canary_name} to have {need_canary} ready endpoint(s) ({canary_ready}) before it gets traffic"
        );
        if canary_ready > 0 {
            // Some are ready: the routes stay as they are (the step before keeps its share).
            out.waiting = Some(why);
            return out;
        }
        // None is: whatever the canary had goes back to stable until it has some again.
        (weight, header_on) = (0, false);
        lost = Some(why);
    }
    if weight < 100 && stable_ready < 1 {
        out.waiting = Some(format!(
            "waiting for Service {stable_name} to have a ready endpoint before it gets traffic"
        ));
        return out;
    }
    let header = header_on.then_some(routing.header_route.as_ref()).flatten();
    let services = (stable_name.as_str(), canary_name.as_str());
    let baseline =
        with_baseline.then(|| baseline_ready.map(|r| baseline_share(weight, r, need_canary)));
    let split = Split {
        canary: weight,
        baseline,
    };
    let mut waiting = move_routes(
        rollout,
        kind,
        routing,
        view,
        services,
        (split, header),
        &mut out.actions,
    );
    if let Some(why) = lost {
        waiting.insert(0, why);
    }
    if waiting.is_empty()
        && want.settle
        && let Some((why, left)) = settling(routing, out.now.since, now)
    {
        waiting.push(why);
        out.recheck_after = Some(left);
    }
    out.waiting = (!waiting.is_empty()).then(|| waiting.join("; "));
    out
}

/// Asks every route the rollout names to be at `weight` (and the header rule); says what
/// each one not there yet waits for.
fn move_routes(
    rollout: &RolloutRef,
    kind: &str,
    routing: &TrafficRouting,
    view: &TrafficView,
    services: (&str, &str),
    (split, header): (Split, Option<&crate::api::HeaderRoute>),
    actions: &mut Vec<Action>,
) -> Vec<String> {
    let weight = split.canary;
    let owner = format!("{kind}/{}", rollout.name);
    let port = routing.gateway_api.port;
    let mut waiting = Vec::new();
    for (kind, name) in routing.gateway_api.routes() {
        let Some(route) = view
            .routes
            .iter()
            .find(|r| r.kind == kind && &r.name == name)
        else {
            waiting.push(format!(
                "{} {name} not found in namespace {}",
                kind.kind(),
                rollout.namespace
            ));
            continue;
        };
        match route_update(route, services, port, (split, header), &owner) {
            RouteChange::Update(update) => {
                waiting.push(format!(
                    "setting {} {name} to {weight}% canary",
                    kind.kind()
                ));
                actions.push(update);
            }
            RouteChange::AtWeight => {}
            RouteChange::Waiting(why) => waiting.push(why),
        }
    }
    waiting
}

/// The baseline's share at canary weight `weight`: the canary's (never more than half) once
/// it has as many ready pods as the canary needs (`need`); until then, none.
fn baseline_share(weight: i32, ready: i32, need: i32) -> i32 {
    if ready >= need {
        weight.min(100 - weight)
    } else {
        0
    }
}

/// The ready endpoints of the Service `desired` as it is applied; 0, and an apply, if it is
/// not yet as desired.
fn ready_endpoints(view: &TrafficView, desired: Service, out: &mut TrafficStep) -> i32 {
    let name = desired.metadata.name.as_deref().unwrap_or_default();
    match view.services.iter().find(|s| s.name == name) {
        Some(s) if s.applied_hash.as_ref() == applied(&desired) => s.ready_endpoints,
        _ => {
            out.actions.push(Action::ApplyService(Box::new(desired)));
            0
        }
    }
}

/// The routes as seen now, and since when: the settle time counts from when every route the
/// rollout names was seen accepted at its generation as it is now (a change not accepted yet
/// has no start).
fn seen_now(
    routing: &TrafficRouting,
    view: &TrafficView,
    (stable_name, canary_name, with_baseline): (&str, &str, bool),
    recorded: Recorded,
    now: Timestamp,
) -> Recorded {
    let named = |r: &&RouteView| {
        routing
            .gateway_api
            .routes()
            .any(|(k, n)| (k, n) == (r.kind, &r.name))
    };
    let first = view.routes.iter().find(named);
    let weight = first.and_then(|r| current_weight(&r.rules, stable_name, canary_name));
    let header = first.is_some_and(|r| has_header_rule(&r.rules, canary_name));
    // Any route's baseline share (most): removing it restarts the settle clock as well.
    let baseline = view
        .routes
        .iter()
        .filter(|_| with_baseline)
        .filter(named)
        .filter_map(|r| rules::baseline_weight(&r.rules, stable_name, canary_name))
        .max()
        .filter(|w| *w > 0);
    let accepted = routing.gateway_api.routes().all(|(kind, name)| {
        view.routes
            .iter()
            .find(|r| r.kind == kind && &r.name == name)
            .is_some_and(|r| r.accepted_generation >= Some(r.generation))
    });
    let as_recorded =
        (weight, header, baseline) == (recorded.weight, recorded.header, recorded.baseline);
    let since = settle_since(accepted, as_recorded, recorded, now);
    Recorded {
        weight,
        header,
        baseline,
        since,
    }
}

/// What a route needs to be at a weight.
enum RouteChange {
    /// An update of its rules.
    Update(Action),
    /// Nothing: it is there, accepted by the gateway.
    AtWeight,
    /// Nothing linnet can do now: why it waits (rules it cannot rewrite, the gateway not
    /// accepting them yet).
    Waiting(String),
}

/// What puts `route` at `weight` (and the header rule).
fn route_update(
    route: &RouteView,
    (stable_name, canary_name): (&str, &str),
    port: i32,
    (split, header): (Split, Option<&crate::api::HeaderRoute>),
    owner: &str,
) -> RouteChange {
    let (kind, name) = (route.kind, &route.name);
    let sides = (stable_name, canary_name);
    let rules = match weighed_rules(&route.rules, kind, sides, port, split, header) {
        Ok(rules) => rules,
        Err(why) => return RouteChange::Waiting(format!("{} {name}: {why}", kind.kind())),
    };
    if rules != route.rules {
        return RouteChange::Update(Action::UpdateRoute {
            kind,
            name: name.clone(),
            rules,
            resource_version: route.resource_version.clone(),
            owner: owner.to_string(),
        });
    }
    if route.accepted_generation < Some(route.generation) {
        return RouteChange::Waiting(format!(
            "waiting for the gateway to accept {} {name} (generation {})",
            kind.kind(),
            route.generation
        ));
    }
    RouteChange::AtWeight
}

/// How long the gateway is still given to apply the routes changed at `since` (None: no
/// time left, or no change seen accepted yet).
pub fn settle_left(
    routing: &TrafficRouting,
    since: Option<Timestamp>,
    now: Timestamp,
) -> Option<std::time::Duration> {
    since.and_then(|since| settling(routing, Some(since), now).map(|(_, left)| left))
}

/// What is left of `settle` counted from `since` (all of it before there is a `since`); None
/// once it is over. Both ways of switching (routes, a Service's selector) wait so.
fn settle_remaining(
    settle: std::time::Duration,
    since: Option<Timestamp>,
    now: Timestamp,
) -> Option<std::time::Duration> {
    let d = now.duration_since(since.unwrap_or(now));
    let passed = if d.is_negative() {
        std::time::Duration::ZERO
    } else {
        d.unsigned_abs()
    };
    settle.checked_sub(passed).filter(|left| !left.is_zero())
}

/// Since when the traffic has been as seen now, for the settle clock: none before it is
/// accepted (by the gateways, or the EndpointSlices), the recorded start while it is as
/// recorded, else now.
fn settle_since(
    accepted: bool,
    as_recorded: bool,
    recorded: Recorded,
    now: Timestamp,
) -> Option<Timestamp> {
    match recorded.since {
        _ if !accepted => None,
        Some(t) if as_recorded => Some(t),
        _ => Some(now),
    }
}

/// How long the gateway is still given to apply the routes, counted from `since`.
fn settling(
    routing: &TrafficRouting,
    since: Option<Timestamp>,
    now: Timestamp,
) -> Option<(String, std::time::Duration)> {
    let settle = std::time::Duration::from_secs(routing.settle_seconds.max(0) as u64);
    let left = settle_remaining(settle, since, now)?;
    let why = format!(
        "letting the gateway apply the routes ({}s more)",
        left.as_secs_f64().ceil()
    );
    Some((why, left))
}

#[cfg(test)]
mod tests;
