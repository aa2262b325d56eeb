//! The plan of a sync: which objects to create, update, leave alone or prune. Pure: it compares
//! the desired set with live objects, and renders readable per-object diffs for `linnet diff`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::desired::{APPLIED_HASH_ANNOTATION, DesiredObject};
use super::inventory::{Inventory, may_prune};
use crate::api::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, REVISION_ANNOTATION, SOURCE_LABEL, SOURCE_PATH_ANNOTATION,
};

pub use crate::api::ADOPT_ANNOTATION;
use crate::specs::ObjectKey;

/// What a sync does with one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    Create,
    Update,
    Unchanged,
    /// Linnet applied it earlier, Git no longer has it, and pruning is on.
    Prune,
    /// It would be pruned, but it holds data (a PersistentVolumeClaim or PersistentVolume),
    /// and linnet never deletes those.
    KeepVolume,
}

/// One object's planned change.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedChange {
    pub key: ObjectKey,
    pub change: Change,
    /// What Git wants (absent for prunes).
    pub desired: Option<DesiredObject>,
    /// What the cluster has (absent for creates).
    pub live: Option<Value>,
    /// The live object's uid (absent for creates): what the source's inventory records.
    pub uid: Option<String>,
}

/// What a sync may prune.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prune<'a> {
    /// Pruning is on (`--prune`).
    pub enabled: bool,
    /// Files Git still has but that have an error now: an error blocks only its own file, and
    /// must not delete what the file applied earlier.
    pub blocked_files: &'a [String],
    /// What this source applied ([`super::inventory`]): only these objects, with the uid
    /// recorded, are pruned.
    pub applied: &'a Inventory,
}

/// An inventory with nothing in it: nothing can be pruned.
static NOTHING_APPLIED: Inventory = Inventory::new();

impl Prune<'_> {
    /// Nothing is pruned.
    pub const OFF: Prune<'static> = Prune {
        enabled: false,
        blocked_files: &[],
        applied: &NOTHING_APPLIED,
    };

    /// What left Git is pruned, of what `applied` records.
    pub fn on(applied: &Inventory) -> Prune<'_> {
        Prune {
            enabled: true,
            blocked_files: &[],
            applied,
        }
    }

    /// Whether `live`, which Git no longer declares, stays: it came from a blocked file.
    fn keeps(&self, live: &Value) -> bool {
        live.pointer("/metadata/annotations")
            .and_then(|a| a.get(SOURCE_PATH_ANNOTATION))
            .and_then(Value::as_str)
            .is_some_and(|file| {
                self.blocked_files.iter().any(|b| {
                    // A blocked directory (`dir/`, `./` for the whole root) keeps all below it.
                    b == file || b == "./" || (b.ends_with('/') && file.starts_with(b.as_str()))
                })
            })
    }
}

/// Plans a sync. `live` holds the live version of every desired object that exists, and every
/// object this source manages (by label); `unchanged` names the desired objects already found
/// unchanged when they were listed, whose live version is kept only by its identity. Takes the
/// desired objects (a clone of 1,000 was 10 MB of a full sync's peak).
pub fn plan_changes(
    desired: Vec<DesiredObject>,
    live: &BTreeMap<ObjectKey, Value>,
    unchanged: &std::collections::BTreeSet<ObjectKey>,
    prune: Prune<'_>,
) -> Vec<PlannedChange> {
    let mut changes = Vec::new();
    let mut wanted = std::collections::BTreeSet::new();
    for d in desired {
        let live_object = live.get(&d.key);
        let change = match live_object {
            None => Change::Create,
            Some(_) if unchanged.contains(&d.key) => Change::Unchanged,
            Some(l) if is_unchanged(&d, l) => Change::Unchanged,
            Some(_) => Change::Update,
        };
        wanted.insert(d.key.clone());
        changes.push(PlannedChange {
            key: d.key.clone(),
            change,
            desired: Some(d),
            // Kept only where a diff is shown; at 1,000 unchanged rollouts it doubled the peak.
            live: if change == Change::Unchanged {
                None
            } else {
                live_object.cloned()
            },
            uid: live_object.and_then(uid_of),
        });
    }
    if prune.enabled {
        for (key, l) in live {
            // A rollout's own children are repaired by its controller, never pruned, whatever
            // labels an older linnet or a person put on them.
            if wanted.contains(key) || owned_by_a_controller(l) {
                continue;
            }
            if !may_prune(prune.applied, key, uid_of(l).as_deref()) {
                tracing::debug!(object = %key, "not pruning: labelled as this source's, but not what it applied (not in its inventory, or another uid)");
                continue;
            }
            if prune.keeps(l) {
                tracing::warn!(object = %key, "not pruning: its file has an error");
                continue;
            }
            let change = if matches!(
                key.kind.as_str(),
                "PersistentVolumeClaim" | "PersistentVolume"
            ) {
                Change::KeepVolume
            } else {
                Change::Prune
            };
            changes.push(PlannedChange {
                key: key.clone(),
                change,
                desired: None,
                live: Some(l.clone()),
                uid: uid_of(l),
            });
        }
    }
    changes
}

/// The uid of a live object.
pub fn uid_of(object: &Value) -> Option<String> {
    object
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .map(String::from)
}

/// The owner reference of the controller that made `object`, if one did (a pod's ReplicaSet,
/// a StatefulSet's claim's set, a rollout's child's rollout).
pub fn controller_of(object: &Value) -> Option<&Value> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

/// Whether some controller made `object`: then it is not pruned, whatever labels its template
/// gave it.
pub fn owned_by_a_controller(object: &Value) -> bool {
    controller_of(object).is_some()
}

/// Whether a linnet rollout's controller made `object`: it was not applied from Git.
pub fn owned_by_rollout(object: &Value) -> bool {
    let group = format!("{}/", crate::api::GROUP);
    controller_of(object)
        .and_then(|r| r.get("apiVersion"))
        .and_then(Value::as_str)
        .is_some_and(|v| v.starts_with(&group))
}

/// Unchanged when linnet applied this very content last (hash) and nobody has changed any
/// field Git sets since (drift).
pub(crate) fn is_unchanged(desired: &DesiredObject, live: &Value) -> bool {
    is_unchanged_from(&desired.value(), &desired.hash, live)
}

/// [`is_unchanged`] for a desired object already parsed (`want`, whose hash is `hash`).
pub(crate) fn is_unchanged_from(want: &Value, hash: &str, live: &Value) -> bool {
    let live_hash = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(APPLIED_HASH_ANNOTATION))
        .and_then(Value::as_str);
    live_hash == Some(hash)
        && is_subset(&comparable(want, live), live)
        && has_finalizers(want, live)
}

/// The fields Git sets that were changed in the cluster since linnet applied this very content
/// (JSON paths, at most 10): drift to revert and to name in an event. Empty when Git's
/// content changed (an update, not drift) or nothing differs.
pub fn drifted_fields(desired: &DesiredObject, live: &Value) -> Vec<String> {
    let live_hash = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(APPLIED_HASH_ANNOTATION))
        .and_then(Value::as_str);
    if live_hash != Some(desired.hash.as_str()) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let want = desired.value();
    differing_paths(&comparable(&want, live), live, "", &mut out);
    if !has_finalizers(&want, live) {
        out.push("metadata.finalizers".into());
    }
    out.truncate(10);
    out
}

fn differing_paths(want: &Value, have: &Value, at: &str, out: &mut Vec<String>) {
    if out.len() >= 10 || is_subset(want, have) {
        return;
    }
    let join = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            for (k, v) in w {
                differing_paths(v, h.get(k).unwrap_or(&Value::Null), &join(k), out);
            }
        }
        (Value::Array(w), Value::Array(h)) if w.len() == h.len() => {
            for (i, (a, b)) in w.iter().zip(h).enumerate() {
                differing_paths(a, b, &format!("{at}[{i}]"), out);
            }
        }
        _ => out.push(at.to_string()),
    }
}

/// A plan split into what must be applied first, one at a time, and the rest, which may go
/// at once: Namespaces and CRDs to create or update, since other objects may need them. A plan
/// lists objects by key, so a Namespace comes after the ConfigMaps in it. Prunes wait.
pub fn prerequisites_first(plan: &[PlannedChange]) -> (Vec<&PlannedChange>, Vec<&PlannedChange>) {
    plan.iter().partition(|c| {
        matches!(c.change, Change::Create | Change::Update)
            && matches!(
                c.key.kind.as_str(),
                "Namespace" | "CustomResourceDefinition"
            )
    })
}

/// Whether `live` still has every finalizer `desired` lists. Controllers add their own, so
/// more is not drift; a missing one is.
fn has_finalizers(desired: &Value, live: &Value) -> bool {
    let listed = |o: &Value| {
        o.pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let have = listed(live);
    listed(desired).iter().all(|f| have.contains(f))
}

/// The desired object without the annotations that change on every revision, and without its
/// finalizers, which [`has_finalizers`] compares as a set.
fn comparable(object: &Value, live: &Value) -> Value {
    let mut o = object.clone();
    // Fields linnet's controllers own (a rollout's weights on a route): counted as changes,
    // every full sync put Git's rules back and the rollout its own.
    super::ownership::without(&mut o, &super::ownership::controller_owned(live));
    if let Some(Value::Object(meta)) = o.get_mut("metadata") {
        meta.remove("finalizers");
        if let Some(Value::Object(a)) = meta.get_mut("annotations") {
            a.remove(REVISION_ANNOTATION);
            // Git's spec as this API server stores it, once a whole restore found them to
            // differ (`Syncer::restore_spec`): not drift.
            a.remove(crate::api::SPEC_HASH_ANNOTATION);
        }
    }
    o
}

/// Whether every field set in `want` has the same value in `have`. The API server adds
/// defaults and status, so `have` may hold more.
pub fn is_subset(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Null, _) => true,
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| v.is_null() || h.get(k).is_some_and(|hv| is_subset(v, hv))),
        (Value::Object(w), Value::Null) => w.values().all(Value::is_null),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| is_subset(a, b))
        }
        (Value::Array(w), Value::Null) => w.is_empty(),
        // `port: "80"` in Git and `80` in the cluster are the same to a user.
        (Value::String(s), Value::Number(n)) | (Value::Number(n), Value::String(s)) => {
            s == &n.to_string()
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// `have`, cut down to the fields `want` sets, so a diff shows only what Git controls.
/// `is_subset(want, &project(want, have))` equals `is_subset(want, have)`.
pub fn project(want: &Value, have: &Value) -> Value {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => Value::Object(
            w.iter()
                .filter_map(|(k, wv)| h.get(k).map(|hv| (k.clone(), project(wv, hv))))
                .collect(),
        ),
        (Value::Array(w), Value::Array(h)) => Value::Array(
            h.iter()
                .enumerate()
                .map(|(i, hv)| {
                    w.get(i)
                        .map(|wv| project(wv, hv))
                        .unwrap_or_else(|| hv.clone())
                })
                .collect(),
        ),
        _ => have.clone(),
    }
}

/// [`project`], keeping what deciding ownership needs: the object's owners, linnet's labels,
/// the adoption and traffic annotations, and the `managedFields` of linnet's controllers.
pub fn project_owned(want: &Value, have: &Value) -> Value {
    let mut kept = project(want, have);
    if let (Some(Value::Object(meta)), Some(have_meta)) =
        (kept.get_mut("metadata"), have.get("metadata"))
    {
        for field in ["ownerReferences", "uid"] {
            if let Some(v) = have_meta.get(field) {
                meta.insert(field.into(), v.clone());
            }
        }
        // What tells the fields linnet's controllers own: dropped, a weighed route's rules
        // were drift again (issue 69).
        if let Some(entries) = super::ownership::controller_entries(have) {
            meta.insert("managedFields".into(), entries);
        }
        for (map_name, key) in [
            ("labels", MANAGED_BY_LABEL),
            ("labels", SOURCE_LABEL),
            ("annotations", ADOPT_ANNOTATION),
            ("annotations", crate::api::TRAFFIC_ANNOTATION),
        ] {
            if let Some(v) = have_meta.get(map_name).and_then(|m| m.get(key)) {
                let map = meta
                    .entry(map_name)
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Value::Object(m) = map {
                    m.insert(key.to_string(), v.clone());
                }
            }
        }
    }
    super::ownership::keep_switched_version(&mut kept, have); // a Git change keeps it
    kept
}

/// Why this source may not write over `live`, an object that exists in the cluster, if it may
/// not: a rollout's controller made it, another source applied it, or nobody told linnet to
/// take it over (`adopt`, or the object's own [`ADOPT_ANNOTATION`]).
pub fn takeover_refusal(live: &Value, source: &str, adopt: bool) -> Option<String> {
    if owned_by_rollout(live) {
        let owner = controller_of(live)
            .map(|r| {
                format!(
                    "{} {}",
                    r.get("kind").and_then(Value::as_str).unwrap_or("rollout"),
                    r.get("name").and_then(Value::as_str).unwrap_or("?")
                )
            })
            .unwrap_or_else(|| "a rollout".into());
        return Some(format!(
            "exists and is managed by the controller of {owner}, which made it; Git may not \
             declare a rollout's own objects: rename this one"
        ));
    }
    let label = |key: &str| {
        live.pointer("/metadata/labels")
            .and_then(|l| l.get(key))
            .and_then(Value::as_str)
    };
    let annotated = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ADOPT_ANNOTATION))
        .and_then(Value::as_str)
        == Some("true");
    match (label(MANAGED_BY_LABEL), label(SOURCE_LABEL)) {
        (Some(MANAGED_BY_VALUE), Some(s)) if s == source => None,
        _ if adopt => None,
        // The annotation opens an object nobody manages, once: after that it carries a
        // source's label, and another source may not take it by the same annotation.
        (_, Some(other)) if annotated => Some(format!(
            "exists and is managed by linnet source {other:?}, not this one; the \
             {ADOPT_ANNOTATION} annotation does not hand over another source's objects (only \
             --adopt does)"
        )),
        _ if annotated => None,
        (Some(MANAGED_BY_VALUE), Some(other)) => Some(format!(
            "exists and is managed by linnet source {other:?}, not this one; a source takes \
             over another's objects only with --adopt, or when the object is annotated \
             {ADOPT_ANNOTATION}=true"
        )),
        _ => Some(format!(
            "exists and is not managed by linnet; to let linnet take it over, annotate it \
             (kubectl annotate ... {ADOPT_ANNOTATION}=true) or run the agent with --adopt"
        )),
    }
}

/// What a diff shows, and pruning needs, of an object Git no longer has: its kind, name,
/// namespace, labels and owners.
pub fn identity_only(object: &Value) -> Value {
    let mut l = object.clone();
    if let Some(Value::Object(m)) = l.pointer_mut("/metadata") {
        m.retain(|k, _| {
            [
                "name",
                "namespace",
                "uid",
                "labels",
                "ownerReferences",
                "annotations",
            ]
            .contains(&k.as_str())
        });
        // Of the annotations, only the file it came from (a blocked file's objects stay).
        if let Some(Value::Object(a)) = m.get_mut("annotations") {
            a.retain(|k, _| k == SOURCE_PATH_ANNOTATION);
        }
    }
    if let Value::Object(m) = &mut l {
        m.retain(|k, _| ["apiVersion", "kind", "metadata"].contains(&k.as_str()));
    }
    l
}

fn without_bookkeeping(object: &Value) -> Value {
    let mut o = comparable(object, &Value::Null);
    if let Some(Value::Object(a)) = o.pointer_mut("/metadata/annotations") {
        a.remove(APPLIED_HASH_ANNOTATION);
        if a.is_empty()
            && let Some(Value::Object(m)) = o.pointer_mut("/metadata")
        {
            m.remove("annotations");
        }
    }
    o
}

fn to_yaml(v: &Value) -> String {
    serde_saphyr::to_string(v).unwrap_or_else(|e| format!("<cannot render: {e}>\n"))
}

/// A unified diff of one change, live (`-`) against Git (`+`), over the fields Git sets.
pub fn render_diff(change: &PlannedChange) -> String {
    let git = change
        .desired
        .as_ref()
        .map(|d| to_yaml(&without_bookkeeping(&d.value())))
        .unwrap_or_default();
    let live = match (&change.desired, &change.live) {
        (Some(d), Some(l)) => to_yaml(&without_bookkeeping(&project(&d.value(), l))),
        (None, Some(l)) => {
            let l = identity_only(l);
            to_yaml(&l)
        }
        _ => String::new(),
    };
    similar::TextDiff::from_lines(&live, &git)
        .unified_diff()
        .context_radius(3)
        .header("live", "git")
        .to_string()
}

#[cfg(test)]
mod interleavings;
#[cfg(test)]
mod tests;
