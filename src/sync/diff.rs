//! The plan of a sync: which objects to create, update, leave alone or prune. Pure: it compares
//! the desired set with live objects, and renders readable per-object diffs for `linnet diff`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::desired::{APPLIED_HASH_ANNOTATION, DesiredObject};
use crate::api::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, REVISION_ANNOTATION, SOURCE_LABEL, SOURCE_PATH_ANNOTATION,
};

/// Annotation by which a cluster user lets linnet take over an object it did not apply.
pub const ADOPT_ANNOTATION: &str = "rollouts.linnet.dev/adopt";
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
}

/// What a sync may prune.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Prune<'a> {
    /// Pruning is on (`--prune`).
    pub enabled: bool,
    /// Files Git still has but that have an error now: an error blocks only its own file, and
    /// must not delete what the file applied earlier.
    pub blocked_files: &'a [String],
}

impl Prune<'_> {
    /// Nothing is pruned.
    pub const OFF: Prune<'static> = Prune {
        enabled: false,
        blocked_files: &[],
    };
    /// What left Git is pruned.
    pub const ON: Prune<'static> = Prune {
        enabled: true,
        blocked_files: &[],
    };

    /// Whether `live`, which Git no longer declares, stays: it came from a blocked file.
    fn keeps(&self, live: &Value) -> bool {
        live.pointer("/metadata/annotations")
            .and_then(|a| a.get(SOURCE_PATH_ANNOTATION))
            .and_then(Value::as_str)
            .is_some_and(|file| self.blocked_files.iter().any(|b| b == file))
    }
}

/// Plans a sync. `live` holds the live version of every desired object that exists, and every
/// object this source manages (by label). Takes the desired objects (a clone of 1,000 was 10 MB
/// of a full sync's peak).
pub fn plan_changes(
    desired: Vec<DesiredObject>,
    live: &BTreeMap<ObjectKey, Value>,
    prune: Prune<'_>,
) -> Vec<PlannedChange> {
    let mut changes = Vec::new();
    let mut wanted = std::collections::BTreeSet::new();
    for d in desired {
        let live_object = live.get(&d.key);
        let change = match live_object {
            None => Change::Create,
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
        });
    }
    if prune.enabled {
        for (key, l) in live {
            // A rollout's own children are repaired by its controller, never pruned, whatever
            // labels an older linnet or a person put on them.
            if wanted.contains(key) || owned_by_a_controller(l) {
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
            });
        }
    }
    changes
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
fn is_unchanged(desired: &DesiredObject, live: &Value) -> bool {
    let live_hash = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(APPLIED_HASH_ANNOTATION))
        .and_then(Value::as_str);
    live_hash == Some(desired.hash.as_str())
        && is_subset(&comparable(&desired.object), live)
        && has_finalizers(&desired.object, live)
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
    differing_paths(&comparable(&desired.object), live, "", &mut out);
    if !has_finalizers(&desired.object, live) {
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
fn comparable(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(Value::Object(meta)) = o.get_mut("metadata") {
        meta.remove("finalizers");
        if let Some(Value::Object(a)) = meta.get_mut("annotations") {
            a.remove(REVISION_ANNOTATION);
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

/// [`project`], keeping what deciding ownership needs: the object's owners, linnet's labels and
/// the adoption annotation.
pub fn project_owned(want: &Value, have: &Value) -> Value {
    let mut kept = project(want, have);
    if let (Some(Value::Object(meta)), Some(have_meta)) =
        (kept.get_mut("metadata"), have.get("metadata"))
    {
        if let Some(owners) = have_meta.get("ownerReferences") {
            meta.insert("ownerReferences".into(), owners.clone());
        }
        for (map_name, key) in [
            ("labels", MANAGED_BY_LABEL),
            ("labels", SOURCE_LABEL),
            ("annotations", ADOPT_ANNOTATION),
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
    let mut o = comparable(object);
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
        .map(|d| to_yaml(&without_bookkeeping(&d.object)))
        .unwrap_or_default();
    let live = match (&change.desired, &change.live) {
        (Some(d), Some(l)) => to_yaml(&without_bookkeeping(&project(&d.object, l))),
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
mod tests {
    use super::*;
    use serde_json::json;

    fn key(kind: &str, name: &str) -> ObjectKey {
        ObjectKey {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn desired(name: &str, data: Value) -> DesiredObject {
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "annotations": {APPLIED_HASH_ANNOTATION: "h1", REVISION_ANNOTATION: "r2"}},
            "data": data});
        DesiredObject {
            key: key("ConfigMap", name),
            object,
            hash: "h1".into(),
            source_path: "a.yaml".into(),
            location: crate::specs::Location {
                file: "a.yaml".into(),
                line: 1,
                column: 1,
            },
        }
    }

    fn existing(labels: Value, annotations: Value, owners: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a",
            "labels": labels, "annotations": annotations, "ownerReferences": owners}})
    }

    #[test]
    fn an_unlabelled_object_is_taken_over_only_when_allowed() {
        let cm = existing(json!({}), json!({}), json!([]));
        let e = takeover_refusal(&cm, "prod", false).unwrap();
        assert!(e.contains("not managed by linnet"), "{e}");
        assert_eq!(takeover_refusal(&cm, "prod", true), None, "--adopt");
        let annotated = existing(json!({}), json!({ADOPT_ANNOTATION: "true"}), json!([]));
        assert_eq!(takeover_refusal(&annotated, "prod", false), None);
    }

    #[test]
    fn a_source_does_not_take_over_anothers_objects() {
        let theirs = existing(
            json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE, SOURCE_LABEL: "team-b"}),
            json!({}),
            json!([]),
        );
        let e = takeover_refusal(&theirs, "team-a", false).unwrap();
        assert!(e.contains("\"team-b\""), "{e}");
        assert_eq!(takeover_refusal(&theirs, "team-b", false), None);
        // Adopted once by annotation, the annotation stays: it does not open it again.
        let adopted = existing(
            json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE, SOURCE_LABEL: "team-b"}),
            json!({ADOPT_ANNOTATION: "true"}),
            json!([]),
        );
        assert!(takeover_refusal(&adopted, "team-a", false).is_some());
        assert_eq!(takeover_refusal(&adopted, "team-a", true), None, "--adopt");
    }

    #[test]
    fn a_rollouts_own_object_is_never_taken_over() {
        let child = existing(
            json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE, SOURCE_LABEL: "prod"}),
            json!({ADOPT_ANNOTATION: "true"}),
            json!([{"apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
                "name": "db", "uid": "u", "controller": true}]),
        );
        let e = takeover_refusal(&child, "prod", true).unwrap();
        assert!(e.contains("CanaryStatefulSet db"), "{e}");
    }

    #[test]
    fn projection_keeps_what_ownership_needs() {
        let want =
            json!({"metadata": {"name": "a", "labels": {MANAGED_BY_LABEL: "linnet"}}, "data": {}});
        let have = existing(
            json!({SOURCE_LABEL: "x", "other": "y"}),
            json!({ADOPT_ANNOTATION: "true", "note": "n"}),
            json!([{"kind": "Foo"}]),
        );
        let kept = project_owned(&want, &have);
        assert_eq!(kept["metadata"]["labels"][SOURCE_LABEL], "x");
        assert_eq!(kept["metadata"]["annotations"][ADOPT_ANNOTATION], "true");
        assert_eq!(kept["metadata"]["ownerReferences"][0]["kind"], "Foo");
        assert!(kept["metadata"]["labels"].get("other").is_none());
    }

    fn live_of(d: &DesiredObject, revision: &str) -> Value {
        let mut l = d.object.clone();
        l["metadata"]["annotations"][REVISION_ANNOTATION] = json!(revision);
        l["metadata"]["uid"] = json!("123");
        l["metadata"]["resourceVersion"] = json!("9");
        l
    }

    #[test]
    fn missing_object_is_created() {
        let d = desired("a", json!({"k": "v"}));
        let plan = plan_changes(vec![d], &BTreeMap::new(), Prune::OFF);
        assert_eq!(plan[0].change, Change::Create);
    }

    #[test]
    fn same_content_from_an_older_revision_is_unchanged() {
        let d = desired("a", json!({"k": "v"}));
        let live = BTreeMap::from([(d.key.clone(), live_of(&d, "r1"))]);
        let plan = plan_changes(vec![d], &live, Prune::OFF);
        assert_eq!(plan[0].change, Change::Unchanged);
    }

    #[test]
    fn drift_names_the_fields_changed_outside_git_and_a_git_change_is_not_drift() {
        let d = desired("app", json!({"a": "1", "b": "2"}));
        let mut live = d.object.clone();
        live["data"]["b"] = json!("changed");
        live["metadata"]["uid"] = json!("u1");
        assert_eq!(drifted_fields(&d, &live), vec!["data.b".to_string()]);
        assert!(drifted_fields(&d, &d.object).is_empty());
        live["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!("an older content");
        assert!(drifted_fields(&d, &live).is_empty());
    }

    #[test]
    fn drift_in_the_cluster_is_an_update() {
        let d = desired("a", json!({"k": "v"}));
        let mut l = live_of(&d, "r1");
        l["data"]["k"] = json!("edited by hand");
        let live = BTreeMap::from([(d.key.clone(), l)]);
        let plan = plan_changes(vec![d], &live, Prune::OFF);
        assert_eq!(plan[0].change, Change::Update);
        let diff = render_diff(&plan[0]);
        assert!(diff.contains("-  k: edited by hand"), "{diff}");
        assert!(diff.contains("+  k: v"), "{diff}");
        assert!(!diff.contains("resourceVersion"), "{diff}");
    }

    #[test]
    fn a_file_with_an_error_keeps_what_it_applied_earlier() {
        let live = identity_only(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "default",
                "labels": {"rollouts.linnet.dev/source": "prod"},
                "annotations": {SOURCE_PATH_ANNOTATION: "apps/a.yaml", "other": "x"}}}));
        assert!(live["metadata"]["annotations"].get("other").is_none());
        let key = key("ConfigMap", "a");
        let live = BTreeMap::from([(key, live)]);
        assert_eq!(plan_changes(vec![], &live, Prune::ON).len(), 1);
        let other_file = ["apps/b.yaml".to_string()];
        let prune = Prune {
            enabled: true,
            blocked_files: &other_file,
        };
        assert_eq!(
            plan_changes(vec![], &live, prune).len(),
            1,
            "another file's error"
        );
        let its_file = ["apps/a.yaml".to_string()];
        let prune = Prune {
            enabled: true,
            blocked_files: &its_file,
        };
        assert!(
            plan_changes(vec![], &live, prune).is_empty(),
            "pruned although its file only has an error"
        );
    }

    #[test]
    fn prune_never_deletes_what_a_rollout_owns_whatever_its_labels() {
        // Issue 18: `--prune` deleted redis-stable and redis-canary, which carried the
        // source label then. Owned children are skipped even with it.
        let owned = |api_version: &str, controller: bool| {
            identity_only(&json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "redis-stable", "namespace": "ns", "uid": "u",
                    "labels": {"rollouts.linnet.dev/source": "prod"},
                    "ownerReferences": [{"apiVersion": api_version, "kind": "CanaryStatefulSet",
                        "name": "redis", "uid": "r", "controller": controller}]}}))
        };
        let plan_for = |live: Value| {
            let k = ObjectKey {
                api_version: "apps/v1".into(),
                kind: "StatefulSet".into(),
                namespace: "ns".into(),
                name: "redis-stable".into(),
            };
            plan_changes(vec![], &BTreeMap::from([(k, live)]), Prune::ON)
        };
        assert!(plan_for(owned("rollouts.linnet.dev/v1alpha1", true)).is_empty());
        // Issue 19: made by any controller (a pod of a Deployment whose template carried the
        // source label): not Git's to prune either.
        assert!(plan_for(owned("example.com/v1", true)).is_empty());
        // Owned, but not by a controller: Git's to prune as before.
        assert_eq!(
            plan_for(owned("rollouts.linnet.dev/v1alpha1", false))[0].change,
            Change::Prune
        );
    }

    #[test]
    fn finalizers_added_by_controllers_are_not_drift_but_a_removed_one_is() {
        let mut d = desired("a", json!({"k": "v"}));
        d.object["metadata"]["finalizers"] = json!(["example.com/hold"]);
        let plan_for = |finalizers: Value| {
            let mut l = live_of(&d, "r1");
            l["metadata"]["finalizers"] = finalizers;
            let live = BTreeMap::from([(d.key.clone(), l)]);
            plan_changes(vec![d.clone()], &live, Prune::OFF)[0].change
        };
        // Before: the controller's finalizer made the list differ, and every full sync wrote.
        assert_eq!(
            plan_for(json!(["rollouts.linnet.dev/cleanup", "example.com/hold"])),
            Change::Unchanged
        );
        assert_eq!(plan_for(json!(["example.com/hold"])), Change::Unchanged);
        assert_eq!(
            plan_for(json!(["rollouts.linnet.dev/cleanup"])),
            Change::Update
        );
        assert_eq!(plan_for(Value::Null), Change::Update);
    }

    #[test]
    fn namespaces_and_crds_to_apply_come_first_and_prunes_wait() {
        let change = |kind: &str, name: &str, change: Change| PlannedChange {
            key: key(kind, name),
            change,
            desired: None,
            live: None,
        };
        let plan = vec![
            change("ConfigMap", "a", Change::Create),
            change("CustomResourceDefinition", "crd", Change::Update),
            change("Namespace", "gone", Change::Prune),
            change("Namespace", "apps", Change::Create),
        ];
        let (first, rest) = prerequisites_first(&plan);
        let names = |cs: Vec<&PlannedChange>| -> Vec<String> {
            cs.iter().map(|c| c.key.name.clone()).collect()
        };
        assert_eq!(names(first), vec!["crd", "apps"]);
        assert_eq!(names(rest), vec!["a", "gone"]);
    }

    #[test]
    fn new_hash_is_an_update() {
        let d = desired("a", json!({"k": "v"}));
        let mut l = live_of(&d, "r1");
        l["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!("old");
        let live = BTreeMap::from([(d.key.clone(), l)]);
        assert_eq!(
            plan_changes(vec![d], &live, Prune::OFF)[0].change,
            Change::Update
        );
    }

    #[test]
    fn pruning_is_opt_in_and_never_touches_volumes() {
        let cm = key("ConfigMap", "gone");
        let pvc = key("PersistentVolumeClaim", "data-redis-0");
        let live = BTreeMap::from([(cm.clone(), json!({})), (pvc.clone(), json!({}))]);
        assert!(plan_changes(vec![], &live, Prune::OFF).is_empty());
        let plan = plan_changes(vec![], &live, Prune::ON);
        let by_key: BTreeMap<_, _> = plan.iter().map(|c| (c.key.clone(), c.change)).collect();
        assert_eq!(by_key[&cm], Change::Prune);
        assert_eq!(by_key[&pvc], Change::KeepVolume);
    }

    #[test]
    fn subset_allows_server_defaults_but_not_changes() {
        let want = json!({"spec": {"ports": [{"port": 80}]}});
        let have =
            json!({"spec": {"ports": [{"port": 80, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}});
        assert!(is_subset(&want, &have));
        assert!(!is_subset(
            &json!({"spec": {"ports": [{"port": 81}]}}),
            &have
        ));
        assert!(!is_subset(&json!({"spec": {"ports": []}}), &have));
        assert!(is_subset(&json!({"port": "80"}), &json!({"port": 80})));
    }
}
