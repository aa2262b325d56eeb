//! What Git wants: every valid spec object, labelled and annotated as linnet's, with a hash
//! of its content so an unchanged object is recognised without a write.

use serde_json::{Map, Value};

pub use crate::hash::content_hash;

use crate::api::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, REVISION_ANNOTATION, SOURCE_LABEL, SOURCE_PATH_ANNOTATION,
};
use crate::specs::{Location, ObjectKey, SpecSet};

/// Annotation with the hash of the object as linnet last applied it (without the revision).
pub const APPLIED_HASH_ANNOTATION: &str = "rollouts.linnet.dev/applied-hash";

/// One object as linnet will apply it.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredObject {
    pub key: ObjectKey,
    /// The full object to apply, labels and annotations included.
    pub object: Value,
    /// Hash of the object's content; equal hashes mean nothing to apply.
    pub hash: String,
    /// The file it came from.
    pub source_path: String,
    /// Where in that file its document starts.
    pub location: Location,
}

/// Builds the desired set from loaded specs. `source` names this agent's source (label);
/// `revision` is the Git revision being synced.
pub fn desired_set(specs: &SpecSet, source: &str, revision: &str) -> Vec<DesiredObject> {
    specs
        .objects
        .values()
        .map(|loaded| {
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
            }
            let hash = content_hash(&object);
            if let Some(metadata) = object.get_mut("metadata") {
                set_entry(metadata, "annotations", APPLIED_HASH_ANNOTATION, &hash);
                set_entry(metadata, "annotations", REVISION_ANNOTATION, revision);
            }
            DesiredObject {
                key: loaded.key.clone(),
                object,
                hash,
                source_path: loaded.location.file.clone(),
                location: loaded.location.clone(),
            }
        })
        .collect()
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

    #[test]
    fn objects_carry_linnets_labels_and_annotations() {
        let d = desired_set(&specs(CM), "prod", "abc123");
        assert_eq!(d.len(), 1);
        let meta = &d[0].object["metadata"];
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
    fn hash_changes_with_content() {
        let a = desired_set(&specs(CM), "prod", "rev1");
        let b = desired_set(&specs(&CM.replace("k: v", "k: w")), "prod", "rev1");
        assert_ne!(a[0].hash, b[0].hash);
    }
}
