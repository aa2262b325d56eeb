//! Cluster I/O of a sync: discover each kind, read the live objects, and apply the plan with
//! server-side apply. A full sync reads one list per kind (by linnet's labels) plus one get
//! for each desired object that is not labelled yet. After a full sync succeeds, later syncs
//! are incremental: only objects whose desired content changed since the last successful sync,
//! or that left Git, are read (one get each) and planned, so a one-file push costs the same at
//! 10 or 1,000 rollouts. A full sync is redone at start, after a failed read, and when the last
//! one is older than the drift interval: it reverts drift in objects Git did not change, with
//! a `DriftReverted` event naming the fields. Writes happen only for creates, updates and
//! prunes.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope, pinned_kind};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::Mutex;

use super::FIELD_MANAGER;
use super::desired::{DesiredObject, desired_set};
use super::diff::{
    Change, PlannedChange, Prune, drifted_fields, identity_only, plan_changes, prerequisites_first,
    project_owned, takeover_refusal,
};
use crate::api::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, SOURCE_LABEL};
use crate::error::{kube_message, kube_message_hinted};
use crate::specs::{Location, ObjectKey, SpecSet};

/// Kinds that are listed for pruning even when Git no longer declares any object of them.
const PRUNABLE_KINDS: &[(&str, &str)] = &[
    ("rollouts.linnet.dev/v1alpha1", "CanaryStatefulSet"),
    ("rollouts.linnet.dev/v1alpha1", "CanaryDeployment"),
    ("rollouts.linnet.dev/v1alpha1", "AnalysisTemplate"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "Secret"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    // Listed so that pruning can say it keeps them.
    ("v1", "PersistentVolumeClaim"),
];

/// Objects per list request in a full sync.
const LIST_PAGE: u32 = 100;

/// Requests in flight while a sync applies its plan (after Namespaces and CRDs).
const APPLY_CONCURRENCY: usize = 16;

/// Unlabelled desired objects of one kind in one namespace from which a full sync lists the
/// kind to find them, instead of reading each.
const ADOPT_BY_LIST: usize = 8;

/// How old the last full sync may be before the next sync is a full one (`--drift-interval`).
pub const DEFAULT_DRIFT_INTERVAL: Duration = Duration::from_secs(180);

/// What the last successful sync applied: each object's content hash, and when the last full
/// sync was.
struct Applied {
    hashes: BTreeMap<ObjectKey, String>,
    full_at: Instant,
}

/// The outcome of a sync.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncReport {
    pub created: Vec<ObjectKey>,
    pub updated: Vec<ObjectKey>,
    pub unchanged: usize,
    pub pruned: Vec<ObjectKey>,
    /// Volumes that pruning left in place.
    pub kept_volumes: Vec<ObjectKey>,
    /// Objects that could not be read or written, with the reason.
    pub errors: Vec<(ObjectKey, String)>,
    /// Objects changed outside Git and put back, with the fields that had drifted.
    pub drift_reverted: Vec<(ObjectKey, Vec<String>)>,
    /// Whether the sync read every managed object (a full sync) or only what changed.
    pub full: bool,
}

impl SyncReport {
    /// Write requests this sync made.
    pub fn writes(&self) -> usize {
        self.created.len() + self.updated.len() + self.pruned.len()
    }
}

/// Applies desired sets to one cluster under linnet's field manager.
pub struct Syncer {
    client: Client,
    source: String,
    /// Namespaces to look in for objects to prune; empty means all namespaces.
    namespaces: Vec<String>,
    discovery: Mutex<HashMap<(String, String), (ApiResource, ApiCapabilities)>>,
    /// None until a full sync succeeds, and again after a sync that could not read.
    applied: Mutex<Option<Applied>>,
    /// How old the last full sync may be before the next is full again.
    drift_interval: Duration,
    recorder: Recorder,
    /// Whose rights Git's objects are written with.
    apply_as: ApplyAs,
    /// The agent's own configuration, from which the impersonating clients are made.
    kube_config: Option<kube::Config>,
    /// One impersonating client per account, made on first use.
    writers: std::sync::Mutex<HashMap<String, Client>>,
    /// Take over objects linnet did not apply.
    adopt: bool,
    policy: crate::specs::Policy,
}

/// Whose rights a sync applies and prunes Git's objects with: the source's, not the agent's.
#[derive(Clone, Debug, PartialEq)]
pub enum ApplyAs {
    /// The client's own identity (the engine's tests, with an admin client).
    Client,
    /// ServiceAccount `name` in each object's namespace; cluster-scoped objects are applied as
    /// the one in `home` (the agent's namespace).
    AccountPerNamespace { name: String, home: String },
    /// One ServiceAccount for every object.
    Account { namespace: String, name: String },
}

impl ApplyAs {
    /// The Kubernetes user name of the account that writes objects in `namespace` (empty for
    /// cluster-scoped objects), or `None` for the client's own identity.
    pub fn user_for(&self, namespace: &str) -> Option<String> {
        match self {
            ApplyAs::Client => None,
            ApplyAs::AccountPerNamespace { name, home } => Some(format!(
                "system:serviceaccount:{}:{name}",
                if namespace.is_empty() {
                    home
                } else {
                    namespace
                }
            )),
            ApplyAs::Account { namespace, name } => {
                Some(format!("system:serviceaccount:{namespace}:{name}"))
            }
        }
    }
}

fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

impl Syncer {
    /// A syncer for objects labelled with `source`.
    pub fn new(client: Client, source: impl Into<String>, namespaces: Vec<String>) -> Self {
        Syncer {
            source: source.into(),
            namespaces,
            discovery: Mutex::new(HashMap::new()),
            applied: Mutex::new(None),
            drift_interval: DEFAULT_DRIFT_INTERVAL,
            apply_as: ApplyAs::Client,
            kube_config: None,
            writers: std::sync::Mutex::new(HashMap::new()),
            adopt: false,
            policy: crate::specs::Policy::default(),
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "linnet".into(),
                    instance: std::env::var("POD_NAME").ok(),
                },
            ),
            client,
        }
    }

    /// Makes a sync full (reverting drift) once the last full one is older than `interval`.
    pub fn with_drift_interval(mut self, interval: Duration) -> Self {
        self.drift_interval = interval;
        self
    }

    /// Applies and prunes as `apply_as`, impersonating it with `config` (the agent's own
    /// configuration, which needs `impersonate` on that account).
    pub fn with_apply_as(mut self, apply_as: ApplyAs, config: kube::Config) -> Self {
        self.apply_as = apply_as;
        self.kube_config = Some(config);
        self
    }

    /// Takes over objects linnet did not apply (`--adopt`).
    pub fn with_adopt(mut self, adopt: bool) -> Self {
        self.adopt = adopt;
        self
    }

    /// The operator's policy; the sync checks what only the cluster knows (a kind's scope).
    pub fn with_policy(mut self, policy: crate::specs::Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The client that writes objects in `namespace` (empty: cluster-scoped) as the source.
    fn writer(&self, namespace: &str) -> Result<Client, String> {
        let Some(user) = self.apply_as.user_for(namespace) else {
            return Ok(self.client.clone());
        };
        let mut writers = self
            .writers
            .lock()
            .map_err(|_| "the writer cache is poisoned".to_string())?;
        if let Some(client) = writers.get(&user) {
            return Ok(client.clone());
        }
        let mut config = self
            .kube_config
            .clone()
            .ok_or_else(|| format!("no configuration to act as {user} with"))?;
        config.auth_info.impersonate = Some(user.clone());
        config.auth_info.impersonate_groups = None;
        let client = crate::kube_client::from_config(config)
            .map_err(|e| format!("cannot make a client acting as {user}: {e}"))?;
        writers.insert(user, client.clone());
        Ok(client)
    }

    /// The `Api` that writes `key` as the source.
    fn writer_api(
        &self,
        ar: &ApiResource,
        caps: &ApiCapabilities,
        namespace: &str,
    ) -> Result<Api<DynamicObject>, String> {
        let namespace = scoped(caps, namespace);
        Ok(api_as(self.writer(namespace)?, ar, namespace))
    }

    /// What a 403 on a write means when the source's account made it.
    fn forbidden_hint(&self, verb: &str, ar: &ApiResource, namespace: &str) -> String {
        match self.apply_as.user_for(namespace) {
            Some(user) => format!(
                "; the source applies as {user}, which may not {verb} {}{}: a cluster admin \
                 grants it (docs/security.md, Permissions), e.g. a RoleBinding to ClusterRole \
                 linnet-source from deploy/source-rbac.yaml",
                ar.plural,
                if namespace.is_empty() {
                    String::new()
                } else {
                    format!(" in namespace {namespace}")
                }
            ),
            None => String::new(),
        }
    }

    async fn resource(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, ApiCapabilities), String> {
        let cache_key = (api_version.to_string(), kind.to_string());
        if let Some(found) = self.discovery.lock().await.get(&cache_key) {
            return Ok(found.clone());
        }
        let (group, version) = split_api_version(api_version);
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let found = pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| match &e {
                kube::Error::Api(s) if s.code == 404 && group == crate::api::GROUP => format!(
                    "the cluster does not serve {kind} in {api_version}: install linnet's CRDs \
                 (kubectl apply -f deploy/crds/crds.yaml)"
                ),
                kube::Error::Api(s) if s.code == 404 => format!(
                    "the cluster does not serve {kind} in {api_version}: install the CRD or API \
                 that provides it, or fix apiVersion"
                ),
                _ => format!(
                    "cannot look up {kind} in {api_version}: {}",
                    kube_message(&e)
                ),
            })?;
        self.discovery.lock().await.insert(cache_key, found.clone());
        Ok(found)
    }

    /// The `Api` that reads objects of `ar` in `namespace` as the agent.
    fn api(&self, ar: &ApiResource, caps: &ApiCapabilities, namespace: &str) -> Api<DynamicObject> {
        api_as(self.client.clone(), ar, scoped(caps, namespace))
    }

    fn selector(&self) -> String {
        format!(
            "{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{SOURCE_LABEL}={}",
            self.source
        )
    }

    /// Plans a sync of `specs` at `revision`, reading the cluster but writing nothing.
    pub async fn plan(
        &self,
        specs: &SpecSet,
        revision: &str,
        prune: bool,
    ) -> (Vec<PlannedChange>, Vec<(ObjectKey, String)>) {
        let desired = desired_set(specs, &self.source, revision);
        let locations = locations_of(&desired);
        let prune = Prune {
            enabled: prune,
            blocked_files: &specs.blocked_files,
        };
        let (plan, errors) = self.plan_full(desired, prune, None).await;
        (plan, located(errors, &locations))
    }

    /// [`Syncer::plan`] for a desired set already built. `previous`: what the last sync
    /// applied, if known (where to look for a kind only the source may list).
    async fn plan_full(
        &self,
        desired: Vec<DesiredObject>,
        prune: Prune<'_>,
        previous: Option<&BTreeMap<ObjectKey, String>>,
    ) -> (Vec<PlannedChange>, Vec<(ObjectKey, String)>) {
        let mut errors = Vec::new();
        let mut live: BTreeMap<ObjectKey, Value> = BTreeMap::new();

        // One labelled list per kind finds everything this source manages.
        let mut kinds: Vec<(String, String)> = PRUNABLE_KINDS
            .iter()
            .map(|(a, k)| (a.to_string(), k.to_string()))
            .collect();
        for d in &desired {
            let k = (d.key.api_version.clone(), d.key.kind.clone());
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        let params = ListParams::default().labels(&self.selector());
        // Each live object is kept only as far as the diff looks at it: the fields its desired
        // object sets, or its identity when Git no longer has it.
        let by_key: HashMap<&ObjectKey, &DesiredObject> =
            desired.iter().map(|d| (&d.key, d)).collect();
        for (api_version, kind) in &kinds {
            let Ok((ar, caps)) = self.resource(api_version, kind).await else {
                continue; // not served; desired objects of this kind report it below
            };
            let namespaces: Vec<&str> =
                if self.namespaces.is_empty() || caps.scope == Scope::Cluster {
                    vec![""]
                } else {
                    self.namespaces.iter().map(String::as_str).collect()
                };
            let declared = desired
                .iter()
                .any(|d| d.key.api_version == *api_version && d.key.kind == *kind);
            let list_key = |ns: &str| ObjectKey {
                api_version: api_version.clone(),
                kind: kind.clone(),
                namespace: ns.to_string(),
                name: "*".into(),
            };
            let cannot_list = |e: &kube::Error| format!("cannot list: {}", kube_message(e));
            for ns in namespaces {
                let api = self.api(&ar, &caps, ns);
                match list_live(&api, &params, &ar, &by_key, false, &mut live).await {
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
                                    list_live(&api, &params, &ar, &by_key, false, &mut live).await
                                }
                                Err(e) => {
                                    errors.push((list_key(source_ns), e));
                                    continue;
                                }
                            };
                            match listed {
                                Ok(()) => {}
                                Err(kube::Error::Api(s)) if s.code == 403 && !declared => {
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
                        tracing::debug!(kind, "not allowed to list; nothing of this kind to prune");
                    }
                    Err(e) => errors.push((list_key(ns), cannot_list(&e))),
                }
            }
        }
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
            match list_live(&api, &everything, &ar, &by_key, true, &mut live).await {
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
                                errors.push((d.key.clone(), e));
                                continue;
                            }
                        }
                    }
                    servable.push(d);
                }
                Err(e) => errors.push((d.key.clone(), e)),
            }
        }
        let servable = self.refuse(servable, &mut live, &mut errors).await;
        (plan_changes(servable, &live, prune), errors)
    }

    /// Reads `key` as the agent; a kind the agent may not read (e.g. a Secret) is read as the
    /// source, which is about to write it anyway.
    async fn get_live(
        &self,
        ar: &ApiResource,
        caps: &ApiCapabilities,
        key: &ObjectKey,
    ) -> Result<Option<DynamicObject>, String> {
        match self.api(ar, caps, &key.namespace).get_opt(&key.name).await {
            Err(kube::Error::Api(s)) if s.code == 403 && self.apply_as != ApplyAs::Client => {
                let namespace = scoped(caps, &key.namespace);
                self.writer_api(ar, caps, namespace)?
                    .get_opt(&key.name)
                    .await
                    .map_err(|e| self.write_error("read", "get", &e, ar, namespace))
            }
            other => other.map_err(|e| format!("cannot read: {}", kube_message(&e))),
        }
    }

    /// Leaves out, with an error each, the desired objects this source may not write: a
    /// cluster-scoped kind the policy does not allow (the loader knows only the common ones),
    /// and existing objects that are not its to take over ([`takeover_refusal`]). A refused
    /// object leaves `live` too: it is not this source's, so never a candidate for pruning.
    async fn refuse(
        &self,
        desired: Vec<DesiredObject>,
        live: &mut BTreeMap<ObjectKey, Value>,
        errors: &mut Vec<(ObjectKey, String)>,
    ) -> Vec<DesiredObject> {
        let mut allowed = Vec::with_capacity(desired.len());
        for d in desired {
            if let Ok((_, caps)) = self.resource(&d.key.api_version, &d.key.kind).await
                && caps.scope == Scope::Cluster
                && let Some(why) = self.policy.cluster_kind_refusal(&d.key.kind)
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

    /// Executes a plan; one object's failure does not stop the others. What other objects
    /// may need goes first, one at a time ([`prerequisites_first`]); the rest go
    /// [`APPLY_CONCURRENCY`] at a time (one at a time, a first sync of 1,000 rollouts spent
    /// 25 s waiting on single requests).
    pub async fn apply(&self, plan: &[PlannedChange]) -> SyncReport {
        let mut report = SyncReport::default();
        let (first, rest) = prerequisites_first(plan);
        let done_first = futures::stream::iter(first).then(|c| self.execute(c));
        let done_rest = futures::stream::iter(rest)
            .map(|c| self.execute(c))
            .buffered(APPLY_CONCURRENCY);
        let done: Vec<(&PlannedChange, Option<Result<(), String>>)> =
            done_first.chain(done_rest).collect().await;
        for (change, result) in done {
            let key = &change.key;
            let Some(result) = result else {
                match change.change {
                    Change::KeepVolume => {
                        tracing::info!(object = %key, "not pruning: linnet never deletes volumes");
                        report.kept_volumes.push(key.clone());
                    }
                    _ => report.unchanged += 1,
                }
                continue;
            };
            match (result, change.change) {
                (Ok(()), Change::Create) => {
                    tracing::info!(object = %key, "created");
                    report.created.push(key.clone())
                }
                (Ok(()), Change::Update) => {
                    let drifted = match (&change.desired, &change.live) {
                        (Some(d), Some(live)) => drifted_fields(d, live),
                        _ => Vec::new(),
                    };
                    if drifted.is_empty() {
                        tracing::info!(object = %key, "updated");
                    } else {
                        tracing::warn!(object = %key, fields = %drifted.join(", "), "reverted changes made outside Git");
                        self.announce_drift(change, &drifted).await;
                        report.drift_reverted.push((key.clone(), drifted));
                    }
                    report.updated.push(key.clone())
                }
                (Ok(()), _) => {
                    tracing::info!(object = %key, "pruned: no longer in Git");
                    report.pruned.push(key.clone())
                }
                (Err(e), _) => {
                    tracing::warn!(object = %key, error = %e, "sync failed for object");
                    report.errors.push((key.clone(), e))
                }
            }
        }
        report
    }

    /// A `DriftReverted` event on an object put back to what Git says.
    async fn announce_drift(&self, change: &PlannedChange, fields: &[String]) {
        let key = &change.key;
        let uid = change
            .live
            .as_ref()
            .and_then(|l| l.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map(String::from);
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(key.api_version.clone()),
            kind: Some(key.kind.clone()),
            namespace: Some(key.namespace.clone()).filter(|n| !n.is_empty()),
            name: Some(key.name.clone()),
            uid,
            ..Default::default()
        };
        let note: String = format!(
            "put back to what Git says; changed outside Git: {}",
            fields.join(", ")
        )
        .chars()
        .take(1000)
        .collect();
        let event = Event {
            type_: EventType::Warning,
            reason: "DriftReverted".into(),
            action: crate::controller::context::event_action(&note),
            note: Some(note),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::debug!(object = %key, error = %e, "could not publish the drift event");
        }
    }

    /// One change's request, if it needs one.
    async fn execute<'c>(
        &self,
        change: &'c PlannedChange,
    ) -> (&'c PlannedChange, Option<Result<(), String>>) {
        let result = match change.change {
            Change::Unchanged | Change::KeepVolume => None,
            Change::Create | Change::Update => Some(self.apply_one(change).await),
            Change::Prune => Some(self.delete_one(&change.key).await),
        };
        (change, result)
    }

    async fn apply_one(&self, change: &PlannedChange) -> Result<(), String> {
        let Some(desired) = &change.desired else {
            return Ok(());
        };
        let key = &desired.key;
        let (ar, caps) = self.resource(&key.api_version, &key.kind).await?;
        self.writer_api(&ar, &caps, &key.namespace)?
            .patch(
                &key.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired.object),
            )
            .await
            .map(|_| ())
            .map_err(|e| self.write_error("apply", "patch", &e, &ar, scoped(&caps, &key.namespace)))
    }

    /// A request the source's account made that failed; a 403 names the account and how to
    /// grant it. `what` is `apply`, `delete` or `read`.
    fn write_error(
        &self,
        what: &str,
        verb: &str,
        e: &kube::Error,
        ar: &ApiResource,
        namespace: &str,
    ) -> String {
        let as_source = self.apply_as.user_for(namespace).is_some();
        let refused = as_source && matches!(e, kube::Error::Api(s) if s.code == 403);
        let text = if as_source {
            kube_message_hinted(e, &self.forbidden_hint(verb, ar, namespace))
        } else {
            kube_message(e)
        };
        match what {
            _ if refused => format!("{what} refused: {text}"),
            "read" => format!("cannot read: {text}"),
            _ => format!("{what} failed: {text}"),
        }
    }

    async fn delete_one(&self, key: &ObjectKey) -> Result<(), String> {
        let (ar, caps) = self.resource(&key.api_version, &key.kind).await?;
        match self
            .writer_api(&ar, &caps, &key.namespace)?
            .delete(&key.name, &DeleteParams::background())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => {
                Err(self.write_error("delete", "delete", &e, &ar, scoped(&caps, &key.namespace)))
            }
        }
    }

    /// Plans only what changed since `applied`: desired objects whose hash differs (read with
    /// one get each) and objects that left Git (pruned only if still labelled as this
    /// source's). Returns the plan, read errors and how many objects were skipped as unchanged.
    async fn plan_incremental(
        &self,
        desired: Vec<DesiredObject>,
        applied: &BTreeMap<ObjectKey, String>,
        prune: Prune<'_>,
    ) -> (Vec<PlannedChange>, Vec<(ObjectKey, String)>, usize) {
        let mut errors = Vec::new();
        let mut live: BTreeMap<ObjectKey, Value> = BTreeMap::new();
        let in_git: std::collections::BTreeSet<ObjectKey> =
            desired.iter().map(|d| d.key.clone()).collect();
        let total = desired.len();
        let changed: Vec<DesiredObject> = desired
            .into_iter()
            .filter(|d| applied.get(&d.key) != Some(&d.hash))
            .collect();
        let skipped = total - changed.len();
        // Objects the last sync applied that Git no longer has.
        let gone: Vec<&ObjectKey> = if prune.enabled {
            applied.keys().filter(|k| !in_git.contains(*k)).collect()
        } else {
            Vec::new()
        };
        let mut servable = Vec::new();
        for d in changed {
            match self.read_one(&d.key).await {
                Ok(Some(object)) => {
                    live.insert(d.key.clone(), object);
                    servable.push(d);
                }
                Ok(None) => servable.push(d),
                Err(e) => errors.push((d.key.clone(), e)),
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
                    if ours {
                        live.insert(key.clone(), object);
                    }
                }
                Ok(None) => {}
                Err(e) => errors.push((key.clone(), e)),
            }
        }
        let servable = self.refuse(servable, &mut live, &mut errors).await;
        (plan_changes(servable, &live, prune), errors, skipped)
    }

    async fn read_one(&self, key: &ObjectKey) -> Result<Option<Value>, String> {
        let (ar, caps) = self.resource(&key.api_version, &key.kind).await?;
        self.get_live(&ar, &caps, key)
            .await
            .map(|o| o.map(|o| to_value(o, &ar)))
    }

    /// Plans and applies in one go, reading every managed object (a full sync).
    pub async fn sync(&self, specs: &SpecSet, revision: &str, prune: bool) -> SyncReport {
        self.sync_with(specs, revision, prune, false).await
    }

    /// Like [`Syncer::sync`], but only what changed since the last successful sync when a full
    /// sync succeeded within the drift interval and nothing has failed since. The agent syncs
    /// this way.
    pub async fn sync_changes(&self, specs: &SpecSet, revision: &str, prune: bool) -> SyncReport {
        self.sync_with(specs, revision, prune, true).await
    }

    async fn sync_with(
        &self,
        specs: &SpecSet,
        revision: &str,
        prune: bool,
        allow_incremental: bool,
    ) -> SyncReport {
        let mut applied = self.applied.lock().await;
        let prune = Prune {
            enabled: prune,
            blocked_files: &specs.blocked_files,
        };
        let desired = desired_set(specs, &self.source, revision);
        let locations = locations_of(&desired);
        let hashes: BTreeMap<ObjectKey, String> = desired
            .iter()
            .map(|d| (d.key.clone(), d.hash.clone()))
            .collect();
        let incremental = applied
            .as_ref()
            .filter(|a| allow_incremental && a.full_at.elapsed() < self.drift_interval);
        let (plan, read_errors, skipped, full) = match incremental {
            Some(a) => {
                let (plan, errors, skipped) =
                    self.plan_incremental(desired, &a.hashes, prune).await;
                (plan, errors, skipped, false)
            }
            None => {
                let previous = applied.as_ref().map(|a| &a.hashes);
                let (plan, errors) = self.plan_full(desired, prune, previous).await;
                (plan, errors, 0, true)
            }
        };
        let mut report = self.apply(&plan).await;
        report.unchanged += skipped;
        report.errors.extend(read_errors);
        report.full = full;
        // An object the API server refused is left out of what was applied, so the next sync
        // retries it (incrementally: one refused object must not make every retry a full
        // sync). A failed list leaves the live set unknown: the next sync is full.
        let listed = !report.errors.iter().any(|(key, _)| key.name == "*");
        *applied = if listed {
            let full_at = match (&*applied, report.full) {
                (Some(a), false) => a.full_at,
                _ => Instant::now(),
            };
            let mut hashes = hashes;
            for (key, _) in &report.errors {
                hashes.remove(key);
            }
            Some(Applied { hashes, full_at })
        } else {
            None
        };
        report.errors = located(std::mem::take(&mut report.errors), &locations);
        report
    }
}

/// The namespace an object of this kind lives in: none when the kind is cluster-scoped,
/// whatever the key says.
fn scoped<'a>(caps: &ApiCapabilities, namespace: &'a str) -> &'a str {
    if caps.scope == Scope::Cluster {
        ""
    } else {
        namespace
    }
}

/// An `Api` for `client` in `namespace`, or across namespaces (and for cluster-scoped kinds)
/// when it is empty.
fn api_as(client: Client, ar: &ApiResource, namespace: &str) -> Api<DynamicObject> {
    if namespace.is_empty() {
        Api::all_with(client, ar)
    } else {
        Api::namespaced_with(client, namespace, ar)
    }
}

fn locations_of(desired: &[DesiredObject]) -> HashMap<ObjectKey, Location> {
    desired
        .iter()
        .map(|d| (d.key.clone(), d.location.clone()))
        .collect()
}

/// Each error about an object from Git, prefixed with where Git declares it.
fn located(
    errors: Vec<(ObjectKey, String)>,
    locations: &HashMap<ObjectKey, Location>,
) -> Vec<(ObjectKey, String)> {
    errors
        .into_iter()
        .map(|(key, e)| match locations.get(&key) {
            Some(at) => (key, format!("{at}: {e}")),
            None => (key, e),
        })
        .collect()
}

/// Adds the objects `api` lists with `params` to `live`, page by page, each reduced to what the
/// diff needs before the next page (one response for 1,000 rollouts was the agent's biggest
/// memory peak): the fields its desired object sets, or its identity when Git does not have
/// it. With `only_desired`, objects Git does not declare are skipped: they are not linnet's.
async fn list_live(
    api: &Api<DynamicObject>,
    params: &ListParams,
    ar: &ApiResource,
    desired: &HashMap<&ObjectKey, &DesiredObject>,
    only_desired: bool,
    live: &mut BTreeMap<ObjectKey, Value>,
) -> Result<(), kube::Error> {
    let mut page = params.clone().limit(LIST_PAGE);
    loop {
        let list = api.list(&page).await?;
        let next = list.metadata.continue_.clone().filter(|c| !c.is_empty());
        for object in list.items {
            let key = ObjectKey {
                api_version: ar.api_version.clone(),
                kind: ar.kind.clone(),
                namespace: object.metadata.namespace.clone().unwrap_or_default(),
                name: object.metadata.name.clone().unwrap_or_default(),
            };
            let kept = match desired.get(&key) {
                Some(d) => project_owned(&d.object, &to_value(object, ar)),
                None if only_desired => continue,
                None => identity_only(&to_value(object, ar)),
            };
            live.insert(key, kept);
        }
        match next {
            Some(token) => page = page.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// The live object as the diff needs it: without `managedFields` and `status`, which Git never
/// sets and which made up most of a full sync's memory at 1,000 rollouts.
fn to_value(mut object: DynamicObject, ar: &ApiResource) -> Value {
    object.metadata.managed_fields = None;
    if let Value::Object(data) = &mut object.data {
        data.remove("status");
    }
    if object.types.is_none() {
        object.types = Some(kube::core::TypeMeta {
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
        });
    }
    serde_json::to_value(object).unwrap_or(Value::Null)
}
