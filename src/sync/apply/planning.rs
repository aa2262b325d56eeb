//! Planning a sync: what to create, update, leave or prune, from the specs and the live objects
//! (listed in full, or read one by one for an incremental sync), and what the policy or the
//! source's rights refuse.

use super::listing::LiveRead;
use super::*;

impl Syncer {
    /// Plans a sync of `specs` at `revision`, reading the cluster but writing nothing.
    pub async fn plan(
        &self,
        specs: &SpecSet,
        revision: &str,
        prune: bool,
    ) -> (Vec<PlannedChange>, Vec<(ObjectKey, String)>) {
        let desired = desired_set(specs, &self.source, revision);
        let mut inventory = self.inventory.lock().await;
        self.load_inventory(&mut inventory).await;
        let prune = Prune {
            enabled: prune && inventory.loaded,
            blocked_files: &specs.blocked_files,
            applied: &inventory.entries,
        };
        let (plan, errors, _) = self.plan_full(desired, prune, None).await;
        (plan, located(errors, specs))
    }

    /// [`Syncer::plan`] for a desired set already built. `previous`: what the last sync
    /// applied, if known (where to look for a kind only the source may list). Also returns
    /// the inventory entries found gone (or no longer labelled, or another object by now),
    /// of kinds listed in full.
    pub(super) async fn plan_full(
        &self,
        desired: Vec<DesiredObject>,
        prune: Prune<'_>,
        previous: Option<&BTreeMap<ObjectKey, String>>,
    ) -> (Vec<PlannedChange>, Vec<(ObjectKey, String)>, Vec<ObjectKey>) {
        let mut read = LiveRead::default();
        // Each live object is kept only as far as the diff looks at it: the fields its desired
        // object sets, or its identity when Git no longer has it.
        let by_key: HashMap<&ObjectKey, &DesiredObject> =
            desired.iter().map(|d| (&d.key, d)).collect();
        let listed_in_full = self
            .list_managed(&desired, &prune, previous, &by_key, &mut read)
            .await;
        let wanted: BTreeSet<&ObjectKey> = desired.iter().map(|d| &d.key).collect();
        let forgotten: Vec<ObjectKey> = prune
            .applied
            .iter()
            .filter(|(key, uid)| {
                !wanted.contains(key)
                    && listed_in_full.contains(&(key.api_version.clone(), key.kind.clone()))
                    && read.live.get(*key).and_then(uid_of).as_deref() != Some(uid.as_str())
            })
            .map(|(key, _)| key.clone())
            .collect();
        let listed = self.list_unlabelled(&desired, &by_key, &mut read).await;
        let servable = self.read_desired(desired, &listed, &mut read).await;
        let LiveRead {
            mut live,
            unchanged,
            mut errors,
        } = read;
        let servable = self.refuse(servable, &mut live, &mut errors).await;
        let servable = self
            .refuse_missing_namespaces(servable, &live, &mut errors)
            .await;
        (
            plan_changes(servable, &live, &unchanged, prune),
            errors,
            forgotten,
        )
    }

    /// Leaves out, with an error each, objects to create in a namespace that does not exist
    /// and that the revision does not create: the source's account gets a 403 there, whose
    /// advice (grant a RoleBinding) sends the user the wrong way (issue 47). One read per
    /// such namespace, only for objects to create; an agent that may not read namespaces
    /// (an older ClusterRole) skips the check.
    pub(super) async fn refuse_missing_namespaces(
        &self,
        desired: Vec<DesiredObject>,
        live: &BTreeMap<ObjectKey, Value>,
        errors: &mut Vec<(ObjectKey, String)>,
    ) -> Vec<DesiredObject> {
        let created: std::collections::BTreeSet<String> = desired
            .iter()
            .filter(|d| d.key.kind == "Namespace" && d.key.api_version == "v1")
            .map(|d| d.key.name.clone())
            .collect();
        let to_check: std::collections::BTreeSet<String> = desired
            .iter()
            .filter(|d| !d.key.namespace.is_empty() && !live.contains_key(&d.key))
            .map(|d| d.key.namespace.clone())
            .filter(|ns| !created.contains(ns))
            .collect();
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let mut missing = std::collections::BTreeSet::new();
        for ns in to_check {
            if let Ok(None) = namespaces.get_opt(&ns).await {
                missing.insert(ns);
            }
        }
        if missing.is_empty() {
            return desired;
        }
        desired
            .into_iter()
            .filter(|d| {
                if !missing.contains(&d.key.namespace) {
                    return true;
                }
                errors.push((d.key.clone(), missing_namespace(&d.key.namespace)));
                false
            })
            .collect()
    }

    /// Reads `key` as the agent; a kind the agent may not read (e.g. a Secret) is read as the
    /// source, which is about to write it anyway.
    pub(super) async fn get_live(
        &self,
        ar: &ApiResource,
        caps: &ApiCapabilities,
        key: &ObjectKey,
    ) -> Result<Option<DynamicObject>, ObjectError> {
        match self.api(ar, caps, &key.namespace).get_opt(&key.name).await {
            Err(kube::Error::Api(s)) if s.code == 403 && self.apply_as != ApplyAs::Client => {
                let namespace = scoped(caps, &key.namespace);
                self.writer_api(ar, caps, namespace)?
                    .get_opt(&key.name)
                    .await
                    .map_err(|e| self.write_error("read", "get", &e, ar, namespace))
            }
            other => other.map_err(ObjectError::Read),
        }
    }

    /// Leaves out, with an error each, the desired objects this source may not write: a
    /// cluster-scoped kind the policy does not allow (the loader knows only the common ones),
    /// and existing objects that are not its to take over ([`takeover_refusal`]). A refused
    /// object leaves `live` too: it is not this source's, so never a candidate for pruning.
    pub(super) async fn refuse(
        &self,
        desired: Vec<DesiredObject>,
        live: &mut BTreeMap<ObjectKey, Value>,
        errors: &mut Vec<(ObjectKey, String)>,
    ) -> Vec<DesiredObject> {
        let mut allowed = Vec::with_capacity(desired.len());
        for d in desired {
            if let Ok((_, caps)) = self.resource(&d.key.api_version, &d.key.kind).await
                && let Some(why) = self.scope_refusal(&d.key, &caps)
            {
                live.remove(&d.key);
                errors.push((d.key.clone(), why));
                continue;
            }
            if let Some(why) = live
                .get(&d.key)
                .and_then(|l| takeover_refusal(l, &self.source, self.adopt))
            {
                live.remove(&d.key);
                errors.push((d.key.clone(), why));
                continue;
            }
            allowed.push(d);
        }
        allowed
    }

    /// Why the policy refuses `key`, of a kind the cluster serves as `caps`: a cluster-scoped
    /// kind `--allow-cluster-kind` does not name, whatever namespace the file gave it.
    pub(super) fn scope_refusal(&self, key: &ObjectKey, caps: &ApiCapabilities) -> Option<String> {
        if caps.scope != Scope::Cluster {
            return None;
        }
        let why = self.policy.cluster_kind_refusal(&key.kind)?;
        Some(if key.namespace.is_empty() {
            why
        } else {
            format!(
                "{why} (the cluster serves {} without namespaces: metadata.namespace {:?} does \
                 not apply)",
                key.kind, key.namespace
            )
        })
    }

    /// Plans only what changed since the last sync: the objects whose hash differs
    /// (`changed`, read with one get each) and the pruning of those it applied that Git no
    /// longer has (`gone`; pruned only if still labelled as this source's and in its
    /// inventory). Returns the plan, read errors, and the inventory entries found gone.
    pub(super) async fn plan_incremental(
        &self,
        changed: Vec<DesiredObject>,
        gone: &[ObjectKey],
        prune: Prune<'_>,
    ) -> (Vec<PlannedChange>, Vec<(ObjectKey, String)>, Vec<ObjectKey>) {
        let mut forgotten = Vec::new();
        let mut errors = Vec::new();
        let mut live: BTreeMap<ObjectKey, Value> = BTreeMap::new();
        let gone: &[ObjectKey] = if prune.enabled { gone } else { &[] };
        let mut servable = Vec::new();
        for d in changed {
            if let Ok((_, caps)) = self.resource(&d.key.api_version, &d.key.kind).await
                && let Some(why) = self.scope_refusal(&d.key, &caps)
            {
                errors.push((d.key.clone(), why));
                continue;
            }
            match self.read_one(&d.key).await {
                Ok(Some(object)) => {
                    live.insert(d.key.clone(), object);
                    servable.push(d);
                }
                Ok(None) => servable.push(d),
                Err(e) => errors.push((d.key.clone(), e.to_string())),
            }
        }
        let labels = [
            (MANAGED_BY_LABEL, MANAGED_BY_VALUE),
            (SOURCE_LABEL, self.source.as_str()),
        ];
        for key in gone {
            match self.read_one(key).await {
                Ok(Some(object)) => {
                    let ours = labels.iter().all(|(k, v)| {
                        object
                            .pointer("/metadata/labels")
                            .and_then(|l| l.get(*k))
                            .and_then(Value::as_str)
                            == Some(*v)
                    });
                    let recorded = prune.applied.get(key);
                    if recorded.is_some() && recorded.cloned() != uid_of(&object) {
                        forgotten.push(key.clone());
                    }
                    if ours {
                        live.insert(key.clone(), object);
                    } else if recorded.is_some() {
                        forgotten.push(key.clone());
                    }
                }
                Ok(None) => forgotten.push(key.clone()),
                Err(e) => errors.push((key.clone(), e.to_string())),
            }
        }
        let servable = self.refuse(servable, &mut live, &mut errors).await;
        let servable = self
            .refuse_missing_namespaces(servable, &live, &mut errors)
            .await;
        (
            plan_changes(servable, &live, &Default::default(), prune),
            errors,
            forgotten,
        )
    }

    pub(super) async fn read_one(&self, key: &ObjectKey) -> Result<Option<Value>, ObjectError> {
        let (ar, caps) = self.resource(&key.api_version, &key.kind).await?;
        self.get_live(&ar, &caps, key)
            .await
            .map(|o| o.map(|o| to_value(o, &ar)))
    }

    /// An incremental sync's plan: only the objects whose hash changed are built in full;
    /// the others' hashes are remembered from when their text was last seen.
    pub(super) async fn plan_changed(
        &self,
        a: &Applied,
        specs: &SpecSet,
        revision: &str,
        prune: Prune<'_>,
    ) -> SyncPlan {
        // A set patched from the one last synced says which objects it replaced.
        let candidates: Option<Vec<&ObjectKey>> = specs
            .lineage
            .changed_since(a.generation)
            .map(|keys| keys.iter().chain(&a.unapplied).collect());
        let changes = match self.desired_hashes.lock() {
            Ok(mut cache) => {
                let changes = changes_since(
                    &a.hashes,
                    specs,
                    &mut cache,
                    candidates.as_deref(),
                    (&self.source, revision),
                );
                cache.trim(specs);
                changes
            }
            Err(_) => changes_since(
                &a.hashes,
                specs,
                &mut DesiredHashes::default(),
                candidates.as_deref(),
                (&self.source, revision),
            ),
        };
        let skipped = specs.objects.len() - changes.changed.len();
        let hashes: Vec<(ObjectKey, String)> = changes
            .changed
            .iter()
            .map(|d| (d.key.clone(), d.hash.clone()))
            .collect();
        let (plan, read_errors, forgotten) = self
            .plan_incremental(changes.changed, &changes.gone, prune)
            .await;
        let next = NextApplied::Changes {
            hashes,
            gone: changes.gone,
        };
        SyncPlan {
            plan,
            read_errors,
            forgotten,
            skipped,
            next,
        }
    }

    /// A full sync's plan: every object built and compared with the cluster.
    pub(super) async fn plan_everything(
        &self,
        specs: &SpecSet,
        revision: &str,
        prune: Prune<'_>,
        previous: Option<&BTreeMap<ObjectKey, String>>,
    ) -> SyncPlan {
        let desired = desired_set(specs, &self.source, revision);
        if let Ok(mut cache) = self.desired_hashes.lock() {
            for d in &desired {
                if let Some(loaded) = specs.objects.get(&d.key) {
                    cache.remember(loaded, &d.hash);
                }
            }
            cache.trim(specs);
        }
        let hashes: BTreeMap<ObjectKey, String> = desired
            .iter()
            .map(|d| (d.key.clone(), d.hash.clone()))
            .collect();
        let (plan, read_errors, forgotten) = self.plan_full(desired, prune, previous).await;
        SyncPlan {
            plan,
            read_errors,
            forgotten,
            skipped: 0,
            next: NextApplied::All(hashes),
        }
    }
}

/// Why an object in namespace `ns`, which does not exist, is not applied.
pub fn missing_namespace(ns: &str) -> String {
    format!(
        "namespace {ns} does not exist: a cluster admin creates it and lets the source deploy \
         there (a RoleBinding to ClusterRole linnet-source, docs/getting-started.md), or the \
         revision creates it (a Namespace in Git, with --allow-cluster-kind Namespace)"
    )
}

/// A sync's plan, what reading the cluster for it failed on, the inventory entries found
/// gone, how many objects an incremental sync left unread, and what it applies if it works.
pub(super) struct SyncPlan {
    pub(super) plan: Vec<PlannedChange>,
    pub(super) read_errors: Vec<(ObjectKey, String)>,
    pub(super) forgotten: Vec<ObjectKey>,
    pub(super) skipped: usize,
    pub(super) next: NextApplied,
}

/// What the sync applied, for the next incremental one. An object the API server refused is
/// left out, so the next sync retries it (incrementally: one refused object must not make
/// every retry a full sync).
pub(super) fn remember_applied(
    applied: &mut Option<Applied>,
    next: NextApplied,
    report: &SyncReport,
    specs: &SpecSet,
) {
    match (next, applied.as_mut()) {
        (NextApplied::Changes { hashes, gone }, Some(a)) => {
            for (key, _) in &hashes {
                a.unapplied.remove(key);
            }
            a.hashes.extend(hashes);
            for key in &gone {
                a.hashes.remove(key);
            }
            for (key, _) in &report.errors {
                a.hashes.remove(key);
                a.unapplied.insert(key.clone());
            }
            a.generation = specs.lineage.generation;
        }
        // An incremental sync starts from what was applied; were it gone, the next is full.
        (NextApplied::Changes { .. }, None) => *applied = None,
        (NextApplied::All(mut hashes), _) => {
            let mut unapplied = std::collections::BTreeSet::new();
            for (key, _) in &report.errors {
                hashes.remove(key);
                unapplied.insert(key.clone());
            }
            *applied = Some(Applied {
                hashes,
                full_at: Instant::now(),
                generation: specs.lineage.generation,
                unapplied,
            });
        }
    }
}
