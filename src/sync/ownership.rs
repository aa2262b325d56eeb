//! Which fields of an object applied from Git belong to one of linnet's controllers (a
//! rollout's weights on an HTTPRoute): the drift check neither compares them with Git nor puts
//! Git's values back, so a sync never undoes a controller's write, while every field Git owns
//! stays under drift repair. Pure: read from the object's `managedFields`.

use serde_json::{Map, Value};

use super::desired::{APPLIED_HASH_ANNOTATION, DesiredObject};
use crate::api::TRAFFIC_ANNOTATION;
use crate::api::VERSION_LABEL;
use crate::api::field_managers::ON_GIT_OBJECTS;

/// One step of a field path, as `managedFields` (FieldsV1) names it.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// `f:<name>`: a field of an object.
    Field(String),
    /// `k:{...}`: the element of a list whose key fields have these values.
    Key(Map<String, Value>),
    /// `v:<json>`: the element of a set with this value.
    Value(Value),
    /// `i:<n>`: the element of a list at this index.
    Index(usize),
}

/// A field, from the object's root.
pub type FieldPath = Vec<Step>;

/// The fields of `live` that linnet's controllers own ([`ON_GIT_OBJECTS`]), from its
/// `managedFields`. A route weighed only by an older linnet (whose writes named no manager)
/// has just the rollout's annotation: then its rules are the rollout's. Once a controller's
/// entry is there, it alone says: rules a person edited since are drift again.
pub fn controller_owned(live: &Value) -> Vec<FieldPath> {
    let mut out = Vec::new();
    let mut named = false;
    for entry in entries(live).filter(|e| is_controllers(e)) {
        named = true;
        if let Some(fields) = entry.get("fieldsV1") {
            leaves(fields, &mut Vec::new(), &mut out);
        }
    }
    if named {
        return out;
    }
    let weighed = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(TRAFFIC_ANNOTATION))
        .is_some();
    if weighed {
        out.push(vec![
            Step::Field("spec".into()),
            Step::Field("rules".into()),
        ]);
    }
    out
}

/// The `managedFields` entries of the writers in [`ON_GIT_OBJECTS`], which [`controller_owned`]
/// reads: what a live object cut down to Git's fields keeps of them.
pub fn controller_entries(live: &Value) -> Option<Value> {
    let kept: Vec<Value> = entries(live)
        .filter(|e| is_controllers(e))
        .cloned()
        .collect();
    (!kept.is_empty()).then_some(Value::Array(kept))
}

fn entries(live: &Value) -> impl Iterator<Item = &Value> {
    live.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
        .iter()
}

/// An entry of a writer in [`ON_GIT_OBJECTS`] on the object itself (not its status).
fn is_controllers(entry: &Value) -> bool {
    let manager = entry.get("manager").and_then(Value::as_str);
    let on_subresource = entry
        .get("subresource")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    !on_subresource && manager.is_some_and(|m| ON_GIT_OBJECTS.contains(&m))
}

/// Every owned leaf of a FieldsV1 set (`{}`, or a node the manager owns itself: `"."`).
fn leaves(node: &Value, at: &mut FieldPath, out: &mut Vec<FieldPath>) {
    let mut any = false;
    for (name, child) in node.as_object().into_iter().flatten() {
        let Some(step) = parse_step(name) else {
            continue;
        };
        any = true;
        at.push(step);
        leaves(child, at, out);
        at.pop();
    }
    if !any && !at.is_empty() {
        out.push(at.clone());
    }
}

fn parse_step(name: &str) -> Option<Step> {
    let (kind, rest) = name.split_once(':')?;
    match kind {
        "f" => Some(Step::Field(rest.to_string())),
        "k" => match serde_json::from_str(rest).ok()? {
            Value::Object(m) => Some(Step::Key(m)),
            _ => None,
        },
        "v" => serde_json::from_str(rest).ok().map(Step::Value),
        "i" => rest.parse().ok().map(Step::Index),
        _ => None,
    }
}

/// What a sync applies of `desired` over `live`: all of it when Git's content changed; for a
/// drift repair (the same content), not the fields linnet's controllers own, which a forced
/// apply would take back from them.
pub fn to_apply(desired: &DesiredObject, live: Option<&Value>) -> Value {
    let mut object = desired.value();
    if let Some(live) = live {
        let live_hash = live
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(APPLIED_HASH_ANNOTATION))
            .and_then(Value::as_str);
        if live_hash == Some(desired.hash.as_str()) {
            without(&mut object, &controller_owned(live));
        }
        keep_switched_version(&mut object, live);
    }
    object
}

/// The version a blue-green rollout pointed a Service of Git's at (`blueGreen.activeService`):
/// the key it added to the Service's selector, which carries the rollout's annotation.
pub fn switched_version(live: &Value) -> Option<&Value> {
    live.pointer("/metadata/annotations")?
        .get(TRAFFIC_ANNOTATION)?;
    live.get("spec")?.get("selector")?.get(VERSION_LABEL)
}

/// A Service's selector is an atomic map: Git's, applied whole, would drop the version key a
/// blue-green rollout set, and the Service would select every version until the rollout
/// set it again. The key stays in what is applied.
pub fn keep_switched_version(object: &mut Value, live: &Value) {
    let Some(version) = switched_version(live) else {
        return;
    };
    if let Some(Value::Object(selector)) =
        object.get_mut("spec").and_then(|s| s.get_mut("selector"))
    {
        selector
            .entry(VERSION_LABEL)
            .or_insert_with(|| version.clone());
    }
}

/// `object` without the fields at `paths`: what the sync compares and puts back of it.
pub fn without(object: &mut Value, paths: &[FieldPath]) {
    for path in paths {
        remove(object, path);
    }
}

fn remove(object: &mut Value, path: &[Step]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match (first, object) {
        (Step::Field(name), Value::Object(map)) => {
            if rest.is_empty() {
                map.remove(name);
            } else if let Some(child) = map.get_mut(name) {
                remove(child, rest);
            }
        }
        (Step::Index(i), Value::Array(items)) => {
            if rest.is_empty() {
                if *i < items.len() {
                    items.remove(*i);
                }
            } else if let Some(child) = items.get_mut(*i) {
                remove(child, rest);
            }
        }
        (step @ (Step::Key(_) | Step::Value(_)), Value::Array(items)) => {
            let matches = |item: &Value| match step {
                Step::Key(key) => key.iter().all(|(k, v)| item.get(k) == Some(v)),
                Step::Value(v) => item == v,
                _ => false,
            };
            if rest.is_empty() {
                items.retain(|item| !matches(item));
            } else {
                for item in items.iter_mut().filter(|i| matches(i)) {
                    remove(item, rest);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
