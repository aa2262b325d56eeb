//! Reading and writing the source's inventory ([`crate::sync::inventory`]) in the cluster,
//! and bringing it up to date after a sync.

use k8s_openapi::api::core::v1::ConfigMap;

use super::*;
use crate::sync::inventory::{self, INVENTORY_LABEL, Inventory};

/// The inventory as this process knows it.
#[derive(Default)]
pub(crate) struct InventoryState {
    pub(super) entries: Inventory,
    /// Read from the cluster (or found absent there); until then nothing is pruned, and the
    /// inventory is not written (it would drop what it does not know yet).
    pub(super) loaded: bool,
    /// Shards written last, to delete the ones no longer needed.
    shards: usize,
    /// Changed since last written (a write failed).
    dirty: bool,
}

impl Syncer {
    /// Reads the inventory once, if it is not read yet. An inventory kept only in memory
    /// (no namespace configured: the engine's tests) starts empty.
    pub(super) async fn load_inventory(&self, state: &mut InventoryState) {
        if state.loaded {
            return;
        }
        let Some(namespace) = &self.inventory_namespace else {
            state.loaded = true;
            return;
        };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default().labels(&format!("{INVENTORY_LABEL}={}", self.source));
        match api.list(&params).await {
            Ok(list) => {
                let mut entries = Inventory::new();
                let mut skipped = 0;
                let owners: std::collections::BTreeSet<&str> = list
                    .items
                    .iter()
                    .filter_map(|cm| {
                        cm.metadata
                            .annotations
                            .as_ref()?
                            .get(inventory::OWNER_ANNOTATION)
                    })
                    .map(String::as_str)
                    .filter(|owner| !owner.is_empty() && *owner != self.inventory_owner)
                    .collect();
                if !owners.is_empty() {
                    tracing::info!(
                        namespace,
                        previous = ?owners,
                        owner = %self.inventory_owner,
                        "the inventory was written by another installation of this source, which \
                         no longer holds its claim: this one takes it over"
                    );
                }
                for cm in &list.items {
                    let text = cm
                        .data
                        .as_ref()
                        .and_then(|d| d.get("entries"))
                        .map(String::as_str)
                        .unwrap_or_default();
                    skipped += inventory::decode(text, &mut entries);
                }
                if skipped > 0 {
                    tracing::warn!(skipped, "inventory lines that do not read were skipped");
                }
                if list.items.is_empty() {
                    tracing::info!(
                        namespace,
                        source = %self.source,
                        "no inventory yet: starting one. Objects an earlier linnet applied and Git has \
                         dropped since are not pruned; delete those by hand \
                         (kubectl get all -A -l rollouts.linnet.dev/source={})",
                        self.source
                    );
                    // Written after this sync even if nothing changed: the next start knows.
                    state.dirty = true;
                } else {
                    tracing::debug!(entries = entries.len(), "inventory read");
                }
                state.entries = entries;
                state.shards = list.items.len();
                state.loaded = true;
            }
            Err(e) => tracing::warn!(
                namespace,
                error = %kube_message(&e),
                "cannot read the inventory; nothing is pruned until it can be read"
            ),
        }
    }

    /// Writes the inventory if it changed. A failure is retried after the next sync.
    pub(super) async fn save_inventory(&self, state: &mut InventoryState, before: &Inventory) {
        if !state.loaded || (!state.dirty && state.entries == *before) {
            return;
        }
        let Some(namespace) = &self.inventory_namespace else {
            return;
        };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let maps = inventory::encode(
            &self.source,
            namespace,
            &self.inventory_owner,
            &state.entries,
        );
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for (i, cm) in maps.iter().enumerate() {
            let name = inventory::shard_name(&self.source, i);
            if let Err(e) = api.patch(&name, &params, &Patch::Apply(cm)).await {
                tracing::warn!(
                    namespace,
                    config_map = name,
                    error = %kube_message(&e),
                    "cannot write the inventory; retried after the next sync (until then a \
                     restarted agent would not prune what this one applied since)"
                );
                state.dirty = true;
                return;
            }
        }
        for i in maps.len()..state.shards {
            let name = inventory::shard_name(&self.source, i);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::warn!(config_map = name, error = %kube_message(&e), "cannot delete an inventory shard no longer needed");
                    state.dirty = true;
                    return;
                }
            }
        }
        state.shards = maps.len();
        state.dirty = false;
    }
}

/// What a sync's outcome changes in the inventory: written objects are recorded with the
/// uid the API server answered, unchanged ones with their live uid, pruned and kept volumes
/// and objects found gone are forgotten.
pub(super) fn record(
    entries: &mut Inventory,
    plan: &[PlannedChange],
    written: &BTreeMap<ObjectKey, String>,
    report: &SyncReport,
    forgotten: &[ObjectKey],
) {
    let failed: std::collections::BTreeSet<&ObjectKey> =
        report.errors.iter().map(|(k, _)| k).collect();
    for change in plan {
        let key = &change.key;
        match change.change {
            Change::Create | Change::Update => {
                if let Some(uid) = written.get(key) {
                    record_uid(entries, key, uid);
                }
            }
            Change::Unchanged => {
                if let Some(uid) = &change.uid {
                    record_uid(entries, key, uid);
                }
            }
            Change::Prune if !failed.contains(key) => {
                entries.remove(key);
            }
            Change::Prune => {}
            Change::KeepVolume => {
                entries.remove(key);
            }
        }
    }
    for key in forgotten {
        entries.remove(key);
    }
}

/// Records `uid` under the spec set's own `key`: an entry read back from the cluster after a
/// restart has a key of its own, which the inventory would otherwise hold besides the spec
/// set's for every object (about 2 MiB at 10,000).
fn record_uid(entries: &mut Inventory, key: &ObjectKey, uid: &str) {
    match entries.get_key_value(key) {
        Some((held, held_uid)) if held.shares_parts(key) && held_uid == uid => {}
        Some((held, _)) if held.shares_parts(key) => {
            entries.insert(key.clone(), uid.to_string());
        }
        _ => {
            entries.remove(key);
            entries.insert(key.clone(), uid.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("v1", "ConfigMap", "apps", name)
    }

    fn change(name: &str, change: Change, uid: Option<&str>) -> PlannedChange {
        PlannedChange {
            key: key(name),
            change,
            desired: None,
            live: None,
            uid: uid.map(String::from),
        }
    }

    #[test]
    fn a_sync_records_what_it_wrote_and_forgets_what_it_pruned() {
        let mut entries = Inventory::from([
            (key("pruned"), "u1".to_string()),
            (key("failed-prune"), "u2".to_string()),
            (key("gone"), "u3".to_string()),
            (key("updated"), "old".to_string()),
        ]);
        let plan = vec![
            change("created", Change::Create, None),
            change("updated", Change::Update, Some("old")),
            change("unchanged", Change::Unchanged, Some("u5")),
            change("pruned", Change::Prune, Some("u1")),
            change("failed-prune", Change::Prune, Some("u2")),
            change("refused", Change::Create, None),
        ];
        let written = BTreeMap::from([
            (key("created"), "u4".to_string()),
            (key("updated"), "new".to_string()),
        ]);
        let report = SyncReport {
            errors: vec![
                (key("failed-prune"), "delete failed".into()),
                (key("refused"), "apply refused".into()),
            ],
            ..SyncReport::default()
        };
        record(&mut entries, &plan, &written, &report, &[key("gone")]);
        let names: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, u)| (k.name.as_str(), u.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("created", "u4"),
                ("failed-prune", "u2"),
                ("unchanged", "u5"),
                ("updated", "new"),
            ]
        );
    }

    #[test]
    fn an_inventory_read_back_after_a_restart_holds_the_spec_sets_keys_once_synced() {
        let mut entries = Inventory::new();
        crate::sync::inventory::decode(
            "v1 ConfigMap apps same u1\nv1 ConfigMap apps moved u2\n",
            &mut entries,
        );
        let plan = vec![
            change("same", Change::Unchanged, Some("u1")),
            change("moved", Change::Unchanged, Some("u3")),
        ];
        record(
            &mut entries,
            &plan,
            &BTreeMap::new(),
            &SyncReport::default(),
            &[],
        );
        for c in &plan {
            let (held, _) = entries.get_key_value(&c.key).unwrap();
            assert!(held.shares_parts(&c.key), "{} is held apart", c.key);
        }
        assert_eq!(entries[&key("moved")], "u3");
        assert_eq!(entries.len(), 2);
    }
}
