//! Planning a sync: what to create, update, leave or prune, from the specs and the live objects
//! (listed in full, or read one by one for an incremental sync), and what the policy or the
//! source's rights refuse.

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
        let mut errors = Vec::new();
        let mut live: BTreeMap<ObjectKey, Value> = BTreeMap::new();
        let mut unchanged = std::collections::BTreeSet::new();

        // One labelled list per kind finds everything this source manages: the common kinds,
        // Git's, and every kind the inventory holds (a Role Git no longer declares).
        let mut kinds: Vec<(String, String)> = PRUNABLE_KINDS
            .iter()
            .map(|(a, k)| (a.to_string(), k.to_string()))
            .collect();
        for key in desired.iter().map(|d| &d.key).chain(prune.applied.keys()) {
            let k = (key.api_version.clone(), key.kind.clone());
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        let mut listed_in_full = std::collections::BTreeSet::new();
        let params = ListParams::default().labels(&self.selector());
        // Each live object is kept only as far as the diff looks at it: the fields its desired
        // object sets, or its identity when Git no longer has it.
        let by_key: HashMap<&ObjectKey, &DesiredObject> =
            desired.iter().map(|d| (&d.key, d)).collect();
        for (api_version, kind) in &kinds {
            let Ok((ar, caps)) = self.resource(api_version, kind).await else {
                continue; // not served; desired objects of this kind report it below
            };
            // A cluster-scoped kind the policy refuses: nothing of it is applied or pruned
            // (its desired objects report the refusal below).
            if caps.scope == Scope::Cluster && self.policy.cluster_kind_refusal(kind).is_some() {
                continue;
            }
            // After a full sync that succeeded, the rollouts are as fresh in the agent's watch
            // as in a list (`watched.rs`).
            if previous.is_some()
                && let Some(n) =
                    self.keep_watched((api_version, kind), &by_key, (&mut live, &mut unchanged))
            {
                tracing::debug!(kind, rollouts = n, "read from the watch instead of a list");
                continue;
            }
            let namespaces: Vec<&str> =
                if self.namespaces.is_empty() || caps.scope == Scope::Cluster {
                    vec![""]
                } else {
                    self.namespaces.iter().map(String::as_str).collect()
                };
            let declared = desired
                .iter()
                .any(|d| d.key.api_version == *api_version && d.key.kind == *kind);
            let list_key =
                |ns: &str| ObjectKey::new(api_version.clone(), kind.clone(), ns.to_string(), "*");
            let cannot_list = |e: &kube::Error| {
                format!(
                    "cannot list: {}",
                    kube_message_hinted(e, READ_FORBIDDEN_HINT)
                )
            };
            let errors_before = errors.len();
            let mut in_full = true;
            for ns in namespaces {
                let api = self.api(&ar, &caps, ns);
                match list_live(
                    &api,
                    &params,
                    &ar,
                    &by_key,
                    false,
                    (&mut live, &mut unchanged),
                )
                .await
                {
                    Ok(()) => {}
                    // A kind only the source may read (e.g. Secrets): its account lists it
                    // where Git has it and where this source applied it before.
                    Err(kube::Error::Api(s))
                        if s.code == 403 && self.apply_as != ApplyAs::Client =>
                    {
                        let source_namespaces: std::collections::BTreeSet<&str> = if ns.is_empty() {
                            desired
                                .iter()
                                .map(|d| &d.key)
                                .chain(previous.into_iter().flat_map(BTreeMap::keys))
                                .filter(|k| k.api_version == *api_version && k.kind == *kind)
                                .map(|k| k.namespace.as_str())
                                .collect()
                        } else {
                            [ns].into()
                        };
                        for source_ns in source_namespaces {
                            let listed = match self.writer_api(&ar, &caps, source_ns) {
                                Ok(api) => {
                                    list_live(
                                        &api,
                                        &params,
                                        &ar,
                                        &by_key,
                                        false,
                                        (&mut live, &mut unchanged),
                                    )
                                    .await
                                }
                                Err(e) => {
                                    errors.push((list_key(source_ns), e.to_string()));
                                    continue;
                                }
                            };
                            match listed {
                                Ok(()) => {}
                                Err(kube::Error::Api(s)) if s.code == 403 && !declared => {
                                    in_full = false;
                                    tracing::debug!(
                                        kind,
                                        namespace = source_ns,
                                        "the source may not list; nothing of this kind to prune"
                                    );
                                }
                                Err(e) => errors.push((list_key(source_ns), cannot_list(&e))),
                            }
                        }
                    }
                    // A kind Git does not declare and linnet may not list cannot hold anything
                    // linnet applied with its own identity.
                    Err(kube::Error::Api(s)) if s.code == 403 && !declared => {
                        in_full = false;
                        tracing::debug!(kind, "not allowed to list; nothing of this kind to prune");
                    }
                    Err(e) => errors.push((list_key(ns), cannot_list(&e))),
                }
            }
            if in_full && errors.len() == errors_before {
                listed_in_full.insert((api_version.clone(), kind.clone()));
            }
        }
        let wanted: std::collections::BTreeSet<&ObjectKey> =
            desired.iter().map(|d| &d.key).collect();
        let forgotten: Vec<ObjectKey> = prune
            .applied
            .iter()
            .filter(|(key, uid)| {
                !wanted.contains(key)
                    && listed_in_full.contains(&(key.api_version.clone(), key.kind.clone()))
                    && live.get(*key).and_then(uid_of).as_deref() != Some(uid.as_str())
            })
            .map(|(key, _)| key.clone())
            .collect();
        // Desired objects that may exist without linnet's labels (adopted on first sync). Where
        // many of one kind in one namespace are unlabelled, as in a first sync, one list of
        // that kind finds them all; one get each made a first sync of 1,000 rollouts 1,000
        // requests longer.
        let mut unlabelled: BTreeMap<(&str, &str, &str), usize> = BTreeMap::new();
        for d in desired.iter().filter(|d| !live.contains_key(&d.key)) {
            let group = (
                d.key.api_version.as_str(),
                d.key.kind.as_str(),
                d.key.namespace.as_str(),
            );
            *unlabelled.entry(group).or_default() += 1;
        }
        let mut listed = std::collections::BTreeSet::new();
        for ((api_version, kind, ns), count) in unlabelled {
            if count < ADOPT_BY_LIST {
                continue;
            }
            let Ok((ar, caps)) = self.resource(api_version, kind).await else {
                continue;
            };
            let api = self.api(&ar, &caps, ns);
            let everything = ListParams::default();
            match list_live(
                &api,
                &everything,
                &ar,
                &by_key,
                true,
                (&mut live, &mut unchanged),
            )
            .await
            {
                Ok(()) => {
                    listed.insert((api_version.to_string(), kind.to_string(), ns.to_string()));
                }
                // One get each, below.
                Err(e) => tracing::debug!(kind, namespace = ns, error = %e, "cannot list"),
            }
        }
        let mut servable = Vec::new();
        for d in desired {
            match self.resource(&d.key.api_version, &d.key.kind).await {
                // The policy before any read: a kind the loader did not know to be
                // cluster-scoped (a CSIDriver written with a namespace) is refused here.
                Ok((_, caps)) if let Some(why) = self.scope_refusal(&d.key, &caps) => {
                    live.remove(&d.key);
                    errors.push((d.key.clone(), why));
                }
                Ok((ar, caps)) => {
                    let unread = !live.contains_key(&d.key)
                        && !listed.contains(&(
                            d.key.api_version.clone(),
                            d.key.kind.clone(),
                            d.key.namespace.clone(),
                        ));
                    if unread {
                        match self.get_live(&ar, &caps, &d.key).await {
                            Ok(Some(object)) => {
                                live.insert(d.key.clone(), to_value(object, &ar));
                            }
                            Ok(None) => {}
                            Err(e) => {
                                errors.push((d.key.clone(), e.to_string()));
                                continue;
                            }
                        }
                    }
                    servable.push(d);
                }
                Err(e) => errors.push((d.key.clone(), e.to_string())),
            }
        }
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
}

/// Why an object in namespace `ns`, which does not exist, is not applied.
pub fn missing_namespace(ns: &str) -> String {
    format!(
        "namespace {ns} does not exist: a cluster admin creates it and lets the source deploy \
         there (a RoleBinding to ClusterRole linnet-source, docs/getting-started.md), or the \
         revision creates it (a Namespace in Git, with --allow-cluster-kind Namespace)"
    )
}
