//! What Git wants: every valid spec object, labelled and annotated as linnet's, with a hash
//! of its content so an unchanged object is recognised without a write.

use serde_json::{Map, Value};

pub use crate::hash::content_hash;

use crate::api::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, REVISION_ANNOTATION, SOURCE_LABEL, SOURCE_PATH_ANNOTATION,
    SPEC_HASH_ANNOTATION,
};
use crate::specs::{LoadedObject, Location, ObjectKey, Spec, SpecSet};

/// Annotation with the hash of the object as linnet last applied it (without the revision).
pub const APPLIED_HASH_ANNOTATION: &str = "rollouts.linnet.dev/applied-hash";

/// One object as linnet will apply it.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredObject {
    pub key: ObjectKey,
    /// The full object to apply, labels and annotations included, as compact JSON text:
    /// parsed where it is compared or sent. As a `Value` each of 10,000 rollouts held several
    /// times its text for the whole of a full sync, the agent's highest peaks (issue 51).
    pub object: Spec,
    /// Hash of the object's content; equal hashes mean nothing to apply.
    pub hash: String,
    /// The file it came from.
    pub source_path: String,
    /// Where in that file its document starts.
    pub location: Location,
}

impl DesiredObject {
    /// The object to apply, parsed.
    pub fn value(&self) -> Value {
        self.object.to_json()
    }
}

/// Builds the desired set from loaded specs. `source` names this agent's source (label);
/// `revision` is the Git revision being synced.
pub fn desired_set(specs: &SpecSet, source: &str, revision: &str) -> Vec<DesiredObject> {
    specs
        .objects
        .values()
        .map(|loaded| desired_object(loaded, source, revision))
        .collect()
}

/// One object as linnet will apply it.
pub fn desired_object(loaded: &LoadedObject, source: &str, revision: &str) -> DesiredObject {
    let (mut object, hash) = labelled(loaded, source);
    if let Some(metadata) = object.get_mut("metadata") {
        set_entry(metadata, "annotations", APPLIED_HASH_ANNOTATION, &hash);
        set_entry(metadata, "annotations", REVISION_ANNOTATION, revision);
    }
    DesiredObject {
        key: loaded.key.clone(),
        object: Spec::new(&object),
        hash,
        source_path: loaded.location.file.to_string(),
        location: loaded.location.clone(),
    }
}

/// The object with linnet's labels and source annotation, and its hash (before the revision
/// and the hash itself are added).
fn labelled(loaded: &LoadedObject, source: &str) -> (Value, String) {
    let mut object = loaded.spec.to_json();
    if let Value::Object(map) = &mut object {
        map.remove("status");
        let metadata = map
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        set_entry(metadata, "labels", MANAGED_BY_LABEL, MANAGED_BY_VALUE);
        set_entry(metadata, "labels", SOURCE_LABEL, source);
        set_entry(
            metadata,
            "annotations",
            SOURCE_PATH_ANNOTATION,
            &loaded.location.file,
        );
        if let Some(hash) = rollout_spec_hash(loaded) {
            set_entry(metadata, "annotations", SPEC_HASH_ANNOTATION, &hash);
        }
    }
    let hash = content_hash(&object);
    (object, hash)
}

/// For a rollout, the hash of its spec as its controller will read it back
/// ([`crate::api::spec_hash`]).
fn rollout_spec_hash(loaded: &LoadedObject) -> Option<String> {
    if loaded.key.api_version != crate::api::API_VERSION {
        return None;
    }
    let object = loaded.spec.to_json();
    spec_hash_of(&loaded.key.kind, &object, gits_replicas(&object))
}

/// Whether Git's rollout `object` sets `spec.replicas`. When it does not, the count is
/// `/scale`'s (a HorizontalPodAutoscaler's): left out of the spec hash and never put back.
pub fn gits_replicas(object: &Value) -> bool {
    object.pointer("/spec/replicas").is_some()
}

/// The hash of the spec of a rollout of `kind` given as JSON, read as its Rust type reads it,
/// with `replicas` or without ([`crate::api::spec_stamp`]); `None` for another kind or an
/// object that does not read as one.
pub fn spec_hash_of(kind: &str, object: &Value, with_replicas: bool) -> Option<String> {
    use crate::api::{CanaryDeployment, CanaryStatefulSet, spec_stamp};
    use serde::Deserialize as _;
    match kind {
        "CanaryStatefulSet" => CanaryStatefulSet::deserialize(object)
            .ok()
            .map(|r| spec_stamp(&r.spec, with_replicas)),
        "CanaryDeployment" => CanaryDeployment::deserialize(object)
            .ok()
            .map(|r| spec_stamp(&r.spec, with_replicas)),
        _ => None,
    }
}

/// Each object's hash, kept for as long as its spec text is the same: a sync after a
/// one-file push hashes that file's objects, not every object of the repository. The spec
/// text is shared with the snapshot, so an unchanged object is recognised by its pointer.
#[derive(Debug, Default)]
pub struct DesiredHashes {
    by_key: std::collections::HashMap<ObjectKey, (Spec, std::sync::Arc<str>, String)>,
}

impl DesiredHashes {
    /// The hash [`desired_object`] gives `loaded` for `source`.
    pub fn hash(&mut self, loaded: &LoadedObject, source: &str) -> &str {
        let known = matches!(
            self.by_key.get(&loaded.key),
            Some((spec, file, _)) if spec.same_text(&loaded.spec) && *file == loaded.location.file
        );
        if !known {
            let (_, hash) = labelled(loaded, source);
            self.remember(loaded, &hash);
        }
        self.by_key
            .get(&loaded.key)
            .map_or("", |(_, _, hash)| hash.as_str())
    }

    /// Records the hash of an object built in full.
    pub fn remember(&mut self, loaded: &LoadedObject, hash: &str) {
        self.by_key.insert(
            loaded.key.clone(),
            (
                loaded.spec.clone(),
                loaded.location.file.clone(),
                hash.to_string(),
            ),
        );
    }

    /// Forgets objects Git no longer has, once they are as many as those it has.
    pub fn trim(&mut self, specs: &SpecSet) {
        if self.by_key.len() > 2 * specs.objects.len() + 64 {
            self.by_key.retain(|k, _| specs.objects.contains_key(k));
        }
    }
}

/// What changed in Git since a sync that applied `applied` (key to hash).
#[derive(Debug, Default, PartialEq)]
pub struct ChangesSince {
    /// The objects whose hash differs, or that are new, built in full.
    pub changed: Vec<DesiredObject>,
    /// The objects the last sync applied that Git no longer has.
    pub gone: Vec<ObjectKey>,
}

/// The objects of `specs` whose hash differs from `applied`, and the keys of `applied` that
/// Git no longer has. Hashes come from `cache`, so unchanged objects cost a lookup each and
/// nothing is allocated for them. With `candidates` (the keys a patched spec set replaced,
/// and those whose last write failed), only those are looked at, as long as the keys add up:
/// every key of `specs` is in `applied` or among the candidates. Otherwise every object is.
pub fn changes_since(
    applied: &std::collections::BTreeMap<ObjectKey, String>,
    specs: &SpecSet,
    cache: &mut DesiredHashes,
    candidates: Option<&[&ObjectKey]>,
    (source, revision): (&str, &str),
) -> ChangesSince {
    if let Some(keys) = candidates {
        let mut seen = std::collections::BTreeSet::new();
        let objects = keys
            .iter()
            .filter(|k| seen.insert(**k))
            .filter_map(|k| specs.objects.get(*k));
        let (changes, new_keys) = changed_among(applied, objects, cache, source, revision);
        // A patch keeps the set's keys: when the counts add up, none has come or gone.
        if applied.len() + new_keys == specs.objects.len() {
            return changes;
        }
    }
    let (mut changes, new_keys) =
        changed_among(applied, specs.objects.values(), cache, source, revision);
    // Git's keys are those applied before and the new ones: when the counts add up, none
    // of those applied has left.
    if applied.len() + new_keys != specs.objects.len() {
        changes.gone = applied
            .keys()
            .filter(|k| !specs.objects.contains_key(*k))
            .cloned()
            .collect();
    }
    changes
}

/// The objects among `objects` whose hash differs from `applied`, and how many of them
/// `applied` does not have.
fn changed_among<'a>(
    applied: &std::collections::BTreeMap<ObjectKey, String>,
    objects: impl Iterator<Item = &'a LoadedObject>,
    cache: &mut DesiredHashes,
    source: &str,
    revision: &str,
) -> (ChangesSince, usize) {
    let mut changes = ChangesSince::default();
    let mut new_keys = 0;
    for loaded in objects {
        let hash = cache.hash(loaded, source);
        match applied.get(&loaded.key) {
            Some(h) if h == hash => continue,
            Some(_) => {}
            None => new_keys += 1,
        }
        changes
            .changed
            .push(desired_object(loaded, source, revision));
    }
    (changes, new_keys)
}

fn set_entry(metadata: &mut Value, map_name: &str, key: &str, value: &str) {
    if let Value::Object(meta) = metadata {
        let entry = meta
            .entry(map_name)
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        if let Value::Object(m) = entry {
            m.insert(key.to_string(), Value::String(value.to_string()));
        }
    }
}

/// Whether `key` is a kind whose controller cleans up before it lets the object go (a
/// CanaryStatefulSet scales its sets down and keeps its claims).
pub fn has_cleanup(key: &ObjectKey) -> bool {
    key.kind == "CanaryStatefulSet"
        && key
            .api_version
            .split_once('/')
            .is_some_and(|(group, _)| group == crate::api::GROUP)
}

/// `object` with `finalizer` in its `metadata.finalizers` (kept once, after any Git lists).
/// Added at apply time, after the hash: whether the sync adds it changes no object's hash.
pub fn with_finalizer(object: &Value, finalizer: &str) -> Value {
    let mut object = object.clone();
    if let Some(Value::Object(meta)) = object.get_mut("metadata") {
        // Not a list: left as Git has it, for the API server to refuse with its own message.
        if let Value::Array(list) = meta
            .entry("finalizers")
            .or_insert_with(|| Value::Array(Vec::new()))
            && !list.iter().any(|f| f == finalizer)
        {
            list.push(Value::String(finalizer.to_string()));
        }
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::specs::{LoadOptions, load_file};
    use std::collections::BTreeMap;

    fn specs(text: &str) -> SpecSet {
        let mut files = BTreeMap::new();
        files.insert(
            "app.yaml".to_string(),
            load_file("app.yaml", text.as_bytes(), &LoadOptions::default()),
        );
        SpecSet::from_files(files)
    }

    const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n";

    fn web(replicas: &str) -> String {
        format!(
            "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryDeployment\nmetadata:\n  name: web\n  namespace: demo\nspec:\n{replicas}  image: nginx:1.27\n  template:\n    selector:\n      matchLabels: {{app: web}}\n    template:\n      metadata:\n        labels: {{app: web}}\n      spec:\n        containers: [{{name: web, image: nginx:1.27}}]\n"
        )
    }

    fn applied(text: &str) -> Value {
        desired_set(&specs(text), "prod", "abc123")[0].value()
    }

    fn spec_stamp_of(text: &str) -> String {
        applied(text)["metadata"]["annotations"][crate::api::SPEC_HASH_ANNOTATION]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Issue 72: a HorizontalPodAutoscaler sets `replicas` through `/scale` when Git leaves
    /// them out; the spec stamp then leaves them out too, so the count it sets is no edit.
    #[test]
    fn a_rollout_git_leaves_replicas_out_of_is_stamped_without_them() {
        let scaled = spec_stamp_of(&web(""));
        assert!(
            scaled.starts_with(crate::api::SCALED_SPEC_PREFIX),
            "{scaled}"
        );
        assert!(
            applied(&web("")).pointer("/spec/replicas").is_none(),
            "not applied"
        );
        let live = |replicas: i32| {
            let mut r: crate::api::CanaryDeployment =
                serde_json::from_value(applied(&web(""))).unwrap_or_else(|e| panic!("{e}"));
            r.spec.replicas = replicas;
            crate::api::spec_stamp(&r.spec, crate::api::stamp_counts_replicas(Some(&scaled)))
        };
        assert_eq!(live(1), scaled);
        assert_eq!(live(7), scaled, "an autoscaler's count is not Git's");

        let sized = spec_stamp_of(&web("  replicas: 3\n"));
        assert!(
            !sized.starts_with(crate::api::SCALED_SPEC_PREFIX),
            "{sized}"
        );
        assert!(crate::api::stamp_counts_replicas(Some(&sized)));
        assert_ne!(spec_stamp_of(&web("  replicas: 4\n")), sized);
    }

    #[test]
    fn objects_carry_linnets_labels_and_annotations() {
        let d = desired_set(&specs(CM), "prod", "abc123");
        assert_eq!(d.len(), 1);
        let value = d[0].value();
        let meta = &value["metadata"];
        assert_eq!(meta["labels"][MANAGED_BY_LABEL], "linnet");
        assert_eq!(meta["labels"][SOURCE_LABEL], "prod");
        assert_eq!(meta["annotations"][SOURCE_PATH_ANNOTATION], "app.yaml");
        assert_eq!(meta["annotations"][REVISION_ANNOTATION], "abc123");
        assert_eq!(
            meta["annotations"][APPLIED_HASH_ANNOTATION],
            d[0].hash.as_str()
        );
    }

    #[test]
    fn hash_ignores_the_revision_and_key_order() {
        let a = desired_set(&specs(CM), "prod", "rev1");
        let b = desired_set(&specs(CM), "prod", "rev2");
        assert_eq!(a[0].hash, b[0].hash);
        let reordered = "kind: ConfigMap\ndata:\n  k: v\nmetadata:\n  name: a\napiVersion: v1\n";
        assert_eq!(
            desired_set(&specs(reordered), "prod", "rev1")[0].hash,
            a[0].hash
        );
    }

    #[test]
    fn a_remembered_hash_is_the_hash_of_the_object_and_follows_its_text() {
        let set = specs(CM);
        let loaded = set.objects.values().next().unwrap();
        let mut hashes = DesiredHashes::default();
        let full = desired_set(&set, "prod", "rev1");
        assert_eq!(hashes.hash(loaded, "prod"), full[0].hash);
        assert_eq!(hashes.hash(loaded, "prod"), full[0].hash);
        let changed = specs(&CM.replace("k: v", "k: w"));
        let changed = changed.objects.values().next().unwrap();
        assert_eq!(
            hashes.hash(changed, "prod"),
            desired_set(&specs(&CM.replace("k: v", "k: w")), "prod", "r")[0].hash
        );
    }

    /// Two ConfigMaps, `a` and `b`: their text, their set, and their hashes as applied.
    fn two_applied() -> (String, SpecSet, BTreeMap<ObjectKey, String>) {
        let two = format!("{CM}---\n{}", CM.replace("name: a", "name: b"));
        let set = specs(&two);
        let applied = desired_set(&set, "prod", "r1")
            .into_iter()
            .map(|d| (d.key, d.hash))
            .collect();
        (two, set, applied)
    }

    #[test]
    fn changes_since_names_only_changed_new_and_gone_objects() {
        let (_, before, applied) = two_applied();
        let mut cache = DesiredHashes::default();
        let same = changes_since(&applied, &before, &mut cache, None, ("prod", "r2"));
        assert_eq!(same, ChangesSince::default());
        // b changes, c is new, a is gone.
        let after = specs(&format!(
            "{}---\n{}",
            CM.replace("name: a", "name: b").replace("k: v", "k: w"),
            CM.replace("name: a", "name: c")
        ));
        let changes = changes_since(&applied, &after, &mut cache, None, ("prod", "r3"));
        let names: Vec<&str> = changes
            .changed
            .iter()
            .map(|d| d.key.name.as_str())
            .collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(changes.gone.len(), 1);
        assert_eq!(changes.gone[0].name, "a");
        assert!(
            changes
                .changed
                .iter()
                .all(|d| d.value()["metadata"]["annotations"][REVISION_ANNOTATION] == "r3")
        );
    }

    #[test]
    fn hash_changes_with_content() {
        let a = desired_set(&specs(CM), "prod", "rev1");
        let b = desired_set(&specs(&CM.replace("k: v", "k: w")), "prod", "rev1");
        assert_ne!(a[0].hash, b[0].hash);
    }

    #[test]
    fn only_a_canary_statefulset_of_linnets_group_gets_the_cleanup_finalizer() {
        let key =
            |api_version: &str, kind: &str| ObjectKey::new(api_version, kind, "default", "redis");
        assert!(has_cleanup(&key(
            crate::api::API_VERSION,
            "CanaryStatefulSet"
        )));
        assert!(!has_cleanup(&key(
            crate::api::API_VERSION,
            "CanaryDeployment"
        )));
        assert!(!has_cleanup(&key("example.com/v1", "CanaryStatefulSet")));
        assert!(!has_cleanup(&key("apps/v1", "StatefulSet")));
    }

    #[test]
    fn the_finalizer_is_added_once_after_those_git_lists() {
        let f = crate::api::FINALIZER;
        let bare = serde_json::json!({"metadata": {"name": "redis"}});
        assert_eq!(
            with_finalizer(&bare, f)["metadata"]["finalizers"],
            serde_json::json!([f])
        );
        let listed = serde_json::json!({"metadata": {"finalizers": ["example.com/hold"]}});
        let once = with_finalizer(&listed, f);
        assert_eq!(
            once["metadata"]["finalizers"],
            serde_json::json!(["example.com/hold", f])
        );
        assert_eq!(with_finalizer(&once, f), once);
        // Not a list (the API server refuses it): left as Git has it.
        let odd = serde_json::json!({"metadata": {"finalizers": "example.com/hold"}});
        assert_eq!(with_finalizer(&odd, f), odd);
    }

    #[test]
    fn changes_since_looks_only_at_the_candidates_while_the_keys_add_up() {
        let (two, before, applied) = two_applied();
        let key = |name: &str| {
            before
                .objects
                .keys()
                .find(|k| k.name == name)
                .unwrap()
                .clone()
        };
        let (a, b) = (key("a"), key("b"));
        // Both change; only b is a candidate, so only b is looked at.
        let both = specs(&two.replace("k: v", "k: w"));
        let mut cache = DesiredHashes::default();
        let only_b = changes_since(&applied, &both, &mut cache, Some(&[&b]), ("prod", "r2"));
        let names: Vec<&str> = only_b.changed.iter().map(|d| d.key.name.as_str()).collect();
        assert_eq!(names, ["b"]);
        // A candidate named twice counts once.
        let twice = changes_since(&applied, &both, &mut cache, Some(&[&b, &b]), ("prod", "r2"));
        assert_eq!(twice, only_b);
        // a was never applied (its write failed) and is not a candidate: the keys do not add
        // up, and every object is looked at.
        let mut without_a = applied.clone();
        without_a.remove(&a);
        let all = changes_since(&without_a, &both, &mut cache, Some(&[&b]), ("prod", "r2"));
        assert_eq!(
            all,
            changes_since(&without_a, &both, &mut cache, None, ("prod", "r2"))
        );
        assert_eq!(all.changed.len(), 2);
    }
}
