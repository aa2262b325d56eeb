//! The HTTPRoute and GRPCRoute rules that weigh a rollout's two Services: the weight and header rule they
//! hold now, and the rules rewritten to a new weight, other rules kept as they are.

use serde_json::{Value, json};

use crate::api::{HeaderRoute, RouteKind};

/// Whether `rules` has linnet's header rule (a rule whose only backend is the canary).
pub(super) fn has_header_rule(rules: &Value, canary: &str) -> bool {
    rules.as_array().is_some_and(|rules| {
        rules.iter().any(|r| {
            let refs = backends(r);
            !refs.is_empty() && refs.iter().all(|b| is_service(b, canary))
        })
    })
}

fn is_service(backend: &Value, name: &str) -> bool {
    let s = |k: &str| backend.get(k).and_then(Value::as_str);
    s("name") == Some(name)
        && s("group").unwrap_or("").is_empty()
        && s("kind").unwrap_or("Service") == "Service"
}

/// The baseline Service of the rollout whose stable Service is `stable`
/// (`<rollout>-stable` → `<rollout>-baseline`): linnet's own backend, never another's.
fn baseline_of(stable: &str) -> String {
    let rollout = stable.strip_suffix("-stable").unwrap_or(stable);
    crate::api::baseline_service_name(rollout)
}

fn backends(rule: &Value) -> &[Value] {
    rule.get("backendRefs")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The canary's weight in `rules`: its share in the first rule that weighs it against the
/// stable Service (and the baseline's, when it has that backend too).
pub fn current_weight(rules: &Value, stable: &str, canary: &str) -> Option<i32> {
    share_of(rules, (stable, canary), canary)
}

/// The baseline Service's share in the same rule; 0 without a baseline backend.
pub fn baseline_weight(rules: &Value, stable: &str, canary: &str) -> Option<i32> {
    share_of(rules, (stable, canary), &baseline_of(stable))
}

/// The share of Service `of` among the rollout's own backends in the first rule that sends to
/// its stable Service.
fn share_of(rules: &Value, (stable, canary): (&str, &str), of: &str) -> Option<i32> {
    let weight = |b: &Value| b.get("weight").and_then(Value::as_i64).unwrap_or(1);
    let baseline = baseline_of(stable);
    rules.as_array()?.iter().find_map(|rule| {
        let refs = backends(rule);
        refs.iter().find(|b| is_service(b, stable))?;
        let ours = |b: &&Value| {
            [stable, canary, baseline.as_str()]
                .iter()
                .any(|n| is_service(b, n))
        };
        let total: i64 = refs.iter().filter(ours).map(weight).sum();
        let part: i64 = refs.iter().filter(|b| is_service(b, of)).map(weight).sum();
        (total > 0).then(|| ((part * 100 + total / 2) / total) as i32)
    })
}

/// Why linnet cannot weigh a route's rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error(
        "rule {rule} sends traffic to {other} as well as to Service {stable}; linnet weighs only rules whose backends are the rollout's two Services"
    )]
    MixedBackends {
        rule: usize,
        other: String,
        stable: String,
    },
    #[error("no rule sends traffic to Service {stable}; point a backendRef at it")]
    NoStableBackend { stable: String },
}

/// `rules` with every rule that routes to the stable Service weighing it against the canary
/// at `weight` percent, and, with `header`, a rule before each that sends requests carrying
/// the headers to the canary (in a GRPCRoute, only when the header route names a header or
/// a cookie: a gRPC request has no query). Rules that route only to the canary are linnet's
/// header rules from before; they are rebuilt. A rule that mixes other backends with the
/// stable Service is refused: its weights would not mean percents.
pub fn route_rules(
    rules: &Value,
    kind: RouteKind,
    names: (&str, &str),
    port: i32,
    weight: i32,
    header: Option<&HeaderRoute>,
) -> Result<Value, RouteError> {
    let split = Split {
        canary: weight,
        baseline: None,
    };
    weighed_rules(rules, kind, names, port, split, header)
}

/// What a weighed rule sends where, in percent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub canary: i32,
    /// For a kind with a baseline Service (a CanaryDeployment): `Some(Some(share))` weighs it,
    /// taken from the stable Service's share; `Some(None)` leaves it out (and takes out a
    /// baseline backend left there). `None`: the kind has none, and a `<name>-baseline`
    /// backend is someone else's.
    pub baseline: Option<Option<i32>>,
}

/// [`route_rules`] with a [`Split`]: the stable Service gets what the canary and the
/// baseline do not.
pub fn weighed_rules(
    rules: &Value,
    kind: RouteKind,
    (stable, canary): (&str, &str),
    port: i32,
    split: Split,
    header: Option<&HeaderRoute>,
) -> Result<Value, RouteError> {
    // A name no Service has: nothing matches it.
    let baseline = match split.baseline {
        Some(_) => baseline_of(stable),
        None => String::new(),
    };
    let weight = split.canary;
    let rules = rules.as_array().map_or(&[][..], Vec::as_slice);
    let mut out = Vec::with_capacity(rules.len() + 1);
    let mut weighed = 0;
    for (i, rule) in rules.iter().enumerate() {
        let refs = backends(rule);
        if !refs.is_empty() && refs.iter().all(|b| is_service(b, canary)) {
            continue;
        }
        let Some(base) = refs.iter().find(|b| is_service(b, stable)) else {
            out.push(rule.clone());
            continue;
        };
        if let Some(other) = refs
            .iter()
            .find(|b| !is_service(b, stable) && !is_service(b, canary) && !is_service(b, &baseline))
        {
            return Err(RouteError::MixedBackends {
                rule: i + 1,
                other: other
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("another backend")
                    .to_string(),
                stable: stable.to_string(),
            });
        }
        weighed += 1;
        let mut stable_ref = base.clone();
        stable_ref["port"] = json!(port);
        let baseline_weight = split.baseline.flatten().unwrap_or(0);
        stable_ref["weight"] = json!((100 - weight - baseline_weight).max(0));
        let mut canary_ref = stable_ref.clone();
        canary_ref["name"] = json!(canary);
        canary_ref["weight"] = json!(weight);
        let baseline_ref = split.baseline.flatten().map(|w| {
            let mut b = canary_ref.clone();
            b["name"] = json!(baseline);
            b["weight"] = json!(w);
            b
        });
        if let Some(h) = header
            && let Some(header_rule) = header_rule(rule, kind, h, &canary_ref)
        {
            out.push(header_rule);
        }
        let mut rule = rule.clone();
        let mut refs = vec![stable_ref, canary_ref];
        refs.extend(baseline_ref);
        rule["backendRefs"] = Value::Array(refs);
        out.push(rule);
    }
    if weighed == 0 {
        return Err(RouteError::NoStableBackend {
            stable: stable.to_string(),
        });
    }
    Ok(Value::Array(out))
}

/// The rule that sends requests with the header route's headers, query parameters and cookie
/// to the canary alone: `rule`'s matches (or every path, or every gRPC method) with them
/// added, and the canary as its one backend. None for a GRPCRoute when the header route
/// names only query parameters: the rule would match every request.
fn header_rule(
    rule: &Value,
    kind: RouteKind,
    h: &HeaderRoute,
    canary_ref: &Value,
) -> Option<Value> {
    let mut added = vec![("headers", h.header_matches())];
    let every_request = match kind {
        RouteKind::Http => {
            added.push(("queryParams", h.query_param_matches()));
            json!({"path": {"type": "PathPrefix", "value": "/"}})
        }
        RouteKind::Grpc if added[0].1.is_empty() => return None,
        RouteKind::Grpc => json!({}),
    };
    let mut header_rule = rule.clone();
    // A rule's name must be unique in its route (GEP-995).
    if let Some(o) = header_rule.as_object_mut() {
        o.remove("name");
    }
    let matches = rule
        .get("matches")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .cloned()
        .unwrap_or_else(|| vec![every_request]);
    let with_headers: Vec<Value> = matches
        .into_iter()
        .map(|mut m| {
            for (field, added) in added.iter().cloned() {
                if added.is_empty() {
                    continue;
                }
                let mut all = m
                    .get(field)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                all.extend(added);
                m[field] = Value::Array(all);
            }
            m
        })
        .collect();
    header_rule["matches"] = Value::Array(with_headers);
    let mut only_canary = canary_ref.clone();
    only_canary["weight"] = json!(1);
    header_rule["backendRefs"] = json!([only_canary]);
    Some(header_rule)
}
