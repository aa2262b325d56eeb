//! What a source applied: a reference with the uid of every object it created or updated, as
//! Flux's kustomize-controller keeps in a Kustomization's status. Pruning deletes only these,
//! and only while the live object's uid is the one recorded: a copied manifest that carries
//! linnet's labels, or an object of another agent with the same source name, is never this
//! source's to delete (issue 45).
//!
//! Kept in the cluster as ConfigMaps in the agent's namespace, so a restarted agent (its
//! cache is an emptyDir) prunes exactly as the one before: `linnet-inventory-<source>`, then
//! `-1`, `-2`, ... when one would pass [`ENTRIES_PER_SHARD`]. This module is pure: encoding,
//! decoding and the ConfigMaps' shape; `apply.rs` reads and writes them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::specs::ObjectKey;

/// The label on every inventory ConfigMap: the source whose inventory it is.
pub const INVENTORY_LABEL: &str = "rollouts.linnet.dev/inventory";
/// The agent installation that wrote the inventory: the holder of the source's claim
/// ([`crate::runtime::claim`]), e.g. `linnet/lease/linnet-default`.
pub const OWNER_ANNOTATION: &str = "rollouts.linnet.dev/owner";

/// The data key that holds the entries.
const ENTRIES_KEY: &str = "entries";

/// Entries per ConfigMap: about 120 bytes each, well under a ConfigMap's 1 MiB.
pub const ENTRIES_PER_SHARD: usize = 4000;

/// Object key to uid, for every object the source applied and has not pruned.
pub type Inventory = BTreeMap<ObjectKey, String>;

/// The name of shard `index` of `source`'s inventory.
pub fn shard_name(source: &str, index: usize) -> String {
    if index == 0 {
        format!("linnet-inventory-{source}")
    } else {
        format!("linnet-inventory-{source}-{index}")
    }
}

/// One line per entry: `apiVersion kind namespace name uid`, a `-` for no namespace. None of
/// these may hold a space (Kubernetes names and kinds do not).
fn line(key: &ObjectKey, uid: &str) -> String {
    let ns = if key.namespace.is_empty() {
        "-"
    } else {
        key.namespace.as_str()
    };
    format!("{} {} {ns} {} {uid}", key.api_version, key.kind, key.name)
}

/// The entries of one ConfigMap's text; a line that does not read is skipped (and counted).
pub fn decode(text: &str, into: &mut Inventory) -> usize {
    let mut skipped = 0;
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = l.split(' ').collect();
        let [api_version, kind, ns, name, uid] = fields.as_slice() else {
            skipped += 1;
            continue;
        };
        let namespace = if *ns == "-" { "" } else { ns };
        let key = ObjectKey::new(*api_version, *kind, namespace, *name);
        into.insert(key, uid.to_string());
    }
    skipped
}

/// The ConfigMaps that hold `inventory`, in order: shard 0 always (an empty inventory is
/// still one, so a restart knows pruning has started from it).
/// `owner` is the agent installation holding the source's claim ([`OWNER_ANNOTATION`]).
pub fn encode(source: &str, namespace: &str, owner: &str, inventory: &Inventory) -> Vec<Value> {
    let lines: Vec<String> = inventory.iter().map(|(k, uid)| line(k, uid)).collect();
    let mut shards: Vec<&[String]> = lines.chunks(ENTRIES_PER_SHARD).collect();
    if shards.is_empty() {
        shards.push(&[]);
    }
    shards
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let mut text = chunk.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": shard_name(source, i),
                    "namespace": namespace,
                    "labels": {
                        INVENTORY_LABEL: source,
                        "app.kubernetes.io/managed-by": crate::api::MANAGED_BY_VALUE,
                    },
                    "annotations": {
                        "rollouts.linnet.dev/note": "what this linnet source applied and may prune; written by the agent, do not edit",
                        OWNER_ANNOTATION: owner,
                    },
                },
                "data": {ENTRIES_KEY: text},
            })
        })
        .collect()
}

/// The entries text of an inventory ConfigMap.
pub fn entries_of(config_map: &Value) -> &str {
    config_map
        .pointer("/data/entries")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Whether `live` (an object Git no longer has) may be pruned by this inventory: it was
/// applied by this source, and is the very object applied (same uid).
pub fn may_prune(inventory: &Inventory, key: &ObjectKey, live_uid: Option<&str>) -> bool {
    matches!((inventory.get(key), live_uid), (Some(recorded), Some(live)) if recorded == live)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: &str, ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new("v1", kind, ns, name)
    }

    #[test]
    fn an_inventory_reads_back_as_written_across_shards() {
        let mut inv = Inventory::new();
        for i in 0..(ENTRIES_PER_SHARD + 10) {
            inv.insert(
                key("ConfigMap", "apps", &format!("c{i}")),
                format!("uid-{i}"),
            );
        }
        inv.insert(key("Namespace", "", "apps"), "uid-ns".into());
        let maps = encode("default", "linnet", "linnet/lease/linnet-default", &inv);
        assert_eq!(maps.len(), 2);
        assert_eq!(
            maps[1].pointer("/metadata/name").and_then(Value::as_str),
            Some("linnet-inventory-default-1")
        );
        let mut back = Inventory::new();
        for m in &maps {
            assert_eq!(decode(entries_of(m), &mut back), 0);
        }
        assert_eq!(back, inv);
    }

    #[test]
    fn an_empty_inventory_is_still_one_config_map() {
        let maps = encode("s", "linnet", "", &Inventory::new());
        assert_eq!(maps.len(), 1);
        assert_eq!(entries_of(&maps[0]), "");
    }

    #[test]
    fn a_copied_manifest_with_linnets_labels_is_not_pruned() {
        // Issue 45: a hand-made ConfigMap carrying the two labels was deleted by the first sync.
        let mut inv = Inventory::new();
        let applied = key("ConfigMap", "apps", "settings");
        inv.insert(applied.clone(), "uid-1".into());
        assert!(may_prune(&inv, &applied, Some("uid-1")));
        assert!(!may_prune(
            &inv,
            &key("ConfigMap", "apps", "copy"),
            Some("uid-2")
        ));
        // The same name made again by someone else: another object.
        assert!(!may_prune(&inv, &applied, Some("uid-9")));
        assert!(!may_prune(&inv, &applied, None));
    }

    #[test]
    fn a_line_that_does_not_read_is_skipped() {
        let mut inv = Inventory::new();
        let skipped = decode("v1 ConfigMap apps a uid-1\nbroken line\n\n", &mut inv);
        assert_eq!((inv.len(), skipped), (1, 1));
    }
}
