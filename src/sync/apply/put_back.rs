//! Rollouts edited in the cluster, put back without a full sync: their controllers find them
//! (`rollouts.linnet.dev/spec-hash`, from the watch they already run), so only those are
//! read, re-applied and restored. A full comparison of every object at 10,000 rollouts, for
//! one `kubectl edit`, was the drift check's cliff (issue 51).

use super::*;

impl Syncer {
    /// Puts back the rollouts `keys` found edited: each is planned against its live object
    /// (one get), applied where Git's fields drifted (a `DriftReverted` event naming them, as
    /// in a full sync), then its spec restored whole ([`Syncer::restore_spec`]). Nothing else
    /// is read, and nothing is pruned. Keys Git no longer has are skipped: the next sync of
    /// the revision that dropped them handles them.
    pub async fn put_back_edited(
        &self,
        specs: &SpecSet,
        revision: &str,
        keys: &[ObjectKey],
    ) -> SyncReport {
        let desired: Vec<DesiredObject> = keys
            .iter()
            .filter_map(|key| specs.objects.get(key))
            .map(|loaded| super::super::desired::desired_object(loaded, &self.source, revision))
            .collect();
        if desired.is_empty() {
            return SyncReport::default();
        }
        // In the order of a sync's locks, so that a put-back never interleaves with one.
        let _applied = self.applied.lock().await;
        let mut inventory = self.inventory.lock().await;
        self.load_inventory(&mut inventory).await;
        let before = inventory.entries.clone();
        let prune = Prune {
            enabled: false,
            blocked_files: &specs.blocked_files,
            applied: &before,
        };
        let (plan, read_errors, forgotten) =
            self.plan_incremental(desired.clone(), &[], prune).await;
        let (mut report, written) = self.apply_recording(&plan).await;
        inventory_store::record(&mut inventory.entries, &plan, &written, &report, &forgotten);
        self.save_inventory(&mut inventory, &before).await;
        drop(inventory);
        report.errors.extend(read_errors);
        for d in &desired {
            if report.errors.iter().any(|(key, _)| *key == d.key) {
                continue;
            }
            if let Err(e) = self.restore_spec(d).await {
                report.errors.push((d.key.clone(), e.to_string()));
            }
        }
        report.errors = located(std::mem::take(&mut report.errors), specs);
        report
    }

    /// Puts a rollout's spec back to Git's whole, when its controller found another in the
    /// cluster (`rollouts.linnet.dev/spec-hash`): server-side apply keeps fields that Git
    /// leaves out and someone else set (`kubectl patch` of `promotion`), so the spec is
    /// merge-patched with Git's values and a null for every key Git lacks, at the version read.
    /// If the API server still stores it otherwise (an older CRD pruning a field, a mutating
    /// webhook), the annotation is set to the hash of what it stores: that is Git's spec as
    /// this cluster keeps it, and the rollout goes on from it. Written as the source.
    pub async fn restore_spec(&self, desired: &DesiredObject) -> Result<(), ObjectError> {
        use super::super::desired::{gits_replicas, spec_hash_of};
        use crate::api::SPEC_HASH_ANNOTATION;
        let key = &desired.key;
        let (ar, caps) = self.resource(&key.api_version, &key.kind).await?;
        let Some(live) = self
            .api(&ar, &caps, &key.namespace)
            .get_opt(&key.name)
            .await
            .map_err(ObjectError::Read)?
        else {
            return Ok(());
        };
        let live = to_value(live, &ar);
        let desired_value = desired.value();
        let git = desired_value.get("spec").cloned().unwrap_or(Value::Null);
        let with_replicas = gits_replicas(&desired_value);
        let wanted = spec_hash_of(&key.kind, &desired_value, with_replicas);
        if spec_hash_of(&key.kind, &live, with_replicas) == wanted {
            return Ok(());
        }
        let mut spec = with_nulls(&git, live.get("spec").unwrap_or(&Value::Null));
        if !with_replicas && let Some(fields) = spec.as_object_mut() {
            // Git leaves the count to `/scale` (an autoscaler): not Git's to put back.
            fields.remove("replicas");
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": live.pointer("/metadata/resourceVersion")},
            "spec": spec,
        });
        let request = |e: kube::Error| ObjectError::Request {
            what: "restore",
            refused: matches!(&e, kube::Error::Api(s) if s.code == 403),
            text: kube_message(&e),
        };
        let writer = self.writer_api(&ar, &caps, &key.namespace)?;
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        let restored = writer
            .patch(&key.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(request)?;
        let restored = to_value(restored, &ar);
        let stored = spec_hash_of(&key.kind, &restored, with_replicas);
        tracing::info!(object = %format!("{}/{}/{}", key.kind, key.namespace, key.name), "put Git's spec back whole: it was edited in the cluster");
        if stored != wanted
            && let Some(stored) = stored
        {
            tracing::warn!(object = %format!("{}/{}/{}", key.kind, key.namespace, key.name), "the API server stores this rollout's spec otherwise than Git gives it (an older CRD pruning a field, or a mutating webhook?); going on from what it stores");
            let note =
                serde_json::json!({"metadata": {"annotations": {SPEC_HASH_ANNOTATION: stored}}});
            writer
                .patch(&key.name, &params, &Patch::Merge(&note))
                .await
                .map_err(request)?;
        }
        Ok(())
    }
}
