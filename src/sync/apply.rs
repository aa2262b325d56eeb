//! Cluster I/O of a sync: discover each kind, read the live objects, and apply the plan with
//! server-side apply. A full sync reads one list per kind (by linnet's labels) plus one get
//! for each desired object that is not labelled yet. After a full sync succeeds, later syncs
//! are incremental: only objects whose desired content changed since the last successful sync,
//! or that left Git, are read (one get each) and planned, so a one-file push costs the same at
//! 10 or 1,000 rollouts. A full sync is redone at start, after a failed read, and when the last
//! one is older than the drift interval: it reverts drift in objects Git did not change, with
//! a `DriftReverted` event naming the fields; after the first, it reads the rollouts from the
//! agent's watch (`watched.rs`). Writes happen only for creates, updates and prunes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::Mutex;

use super::FIELD_MANAGER;
use super::desired::{
    DesiredHashes, DesiredObject, changes_since, desired_set, has_cleanup, with_finalizer,
};
use super::diff::{
    Change, PlannedChange, Prune, drifted_fields, identity_only, is_unchanged_from, plan_changes,
    prerequisites_first, project_owned, takeover_refusal, uid_of,
};
use crate::api::{FINALIZER, MANAGED_BY_LABEL, MANAGED_BY_VALUE, SOURCE_LABEL};
use crate::error::{kube_message, kube_message_hinted};
use crate::specs::{ObjectKey, SpecSet};

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

/// Requests in flight while a sync applies its plan (after Namespaces and CRDs). At 1,000 new
/// rollouts a CR apply took 87 ms on the busy API server (audit log); 16 at a time left the
/// last CR applied 9 to 10 s after start, 32 at 7.6 to 8.8 s (bench/RESULTS.md, rounds 6, 7).
const APPLY_CONCURRENCY: usize = 32;

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
    /// The generation of the spec set last synced ([`crate::specs::Lineage`]).
    generation: u64,
    /// Keys left out of `hashes` because their write failed: a sync that looks only at what
    /// the spec set changed looks at these too.
    unapplied: std::collections::BTreeSet<ObjectKey>,
}

/// What a sync does to [`Applied`] once it is done.
enum NextApplied {
    /// A full sync: these are all Git has.
    All(BTreeMap<ObjectKey, String>),
    /// An incremental one: the new hashes of the changed objects, and the keys Git dropped.
    Changes {
        hashes: Vec<(ObjectKey, String)>,
        gone: Vec<ObjectKey>,
    },
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
    /// Each object's hash while its text is unchanged (an incremental sync hashes only what
    /// changed).
    desired_hashes: std::sync::Mutex<DesiredHashes>,
    /// How old the last full sync may be before the next is full again.
    drift_interval: Duration,
    recorder: crate::events::EventRecorders,
    /// Whose rights Git's objects are written with.
    apply_as: ApplyAs,
    /// The agent's own configuration, from which the impersonating clients are made.
    kube_config: Option<kube::Config>,
    /// One impersonating client per account, made on first use.
    writers: std::sync::Mutex<HashMap<String, Client>>,
    /// Take over objects linnet did not apply.
    adopt: bool,
    policy: crate::specs::Policy,
    /// Create CanaryStatefulSets with their controller's finalizer (only where that
    /// controller runs: the agent).
    rollout_finalizer: bool,
    /// Where the inventory is kept; `None` keeps it in memory only.
    inventory_namespace: Option<String>,
    /// Who writes the inventory (the source claim's holder), recorded on it.
    inventory_owner: String,
    /// What this source applied: all that pruning may delete.
    inventory: Mutex<InventoryState>,
    /// The agent's rollout stores, read instead of a list by a full sync after the first.
    watched: Option<crate::watch::rollouts::RolloutStores>,
}

impl Syncer {
    /// A syncer for objects labelled with `source`.
    pub fn new(client: Client, source: impl Into<String>, namespaces: Vec<String>) -> Self {
        Syncer {
            source: source.into(),
            namespaces,
            discovery: Mutex::new(HashMap::new()),
            applied: Mutex::new(None),
            desired_hashes: Default::default(),
            drift_interval: DEFAULT_DRIFT_INTERVAL,
            apply_as: ApplyAs::Client,
            kube_config: None,
            writers: std::sync::Mutex::new(HashMap::new()),
            adopt: false,
            policy: crate::specs::Policy::default(),
            rollout_finalizer: false,
            inventory_namespace: None,
            inventory_owner: String::new(),
            inventory: Mutex::new(InventoryState::default()),
            watched: None,
            recorder: crate::events::EventRecorders::new(client.clone(), crate::events::reporter()),
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

    /// Applies each CanaryStatefulSet with its controller's finalizer, so the controller
    /// need not add it in a second write. Only for a syncer whose agent runs that
    /// controller: a finalizer nobody removes leaves a pruned rollout Terminating.
    pub fn with_rollout_finalizer(mut self, on: bool) -> Self {
        self.rollout_finalizer = on;
        self
    }

    /// Keeps the inventory of what this source applied ([`crate::sync::inventory`]) in
    /// ConfigMaps in `namespace` (the agent's own), so that a restarted agent prunes only what
    /// it applied. Without it the inventory lives in memory: nothing applied before the
    /// process started is pruned.
    /// `owner` is recorded on it: the installation holding the source's claim.
    pub fn with_inventory(
        mut self,
        namespace: impl Into<String>,
        owner: impl Into<String>,
    ) -> Self {
        self.inventory_namespace = Some(namespace.into());
        self.inventory_owner = owner.into();
        self
    }

    /// The operator's policy; the sync checks what only the cluster knows (a kind's scope).
    pub fn with_policy(mut self, policy: crate::specs::Policy) -> Self {
        self.policy = policy;
        self
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
        let mut inventory = self.inventory.lock().await;
        self.load_inventory(&mut inventory).await;
        let before = inventory.entries.clone();
        let prune = Prune {
            enabled: prune && inventory.loaded,
            blocked_files: &specs.blocked_files,
            applied: &before,
        };
        let incremental = applied
            .as_ref()
            .filter(|a| allow_incremental && a.full_at.elapsed() < self.drift_interval);
        let SyncPlan {
            plan,
            read_errors,
            forgotten,
            skipped,
            next,
        } = match incremental {
            Some(a) => self.plan_changed(a, specs, revision, prune).await,
            None => {
                let previous = applied.as_ref().map(|a| &a.hashes);
                self.plan_everything(specs, revision, prune, previous).await
            }
        };
        let (mut report, written) = self.apply_recording(&plan).await;
        inventory_store::record(&mut inventory.entries, &plan, &written, &report, &forgotten);
        self.save_inventory(&mut inventory, &before).await;
        drop(inventory);
        report.unchanged += skipped;
        report.errors.extend(read_errors);
        report.full = matches!(next, NextApplied::All(_));
        // A failed list leaves the live set unknown: the next sync is full.
        let listed = !report.errors.iter().any(|(key, _)| key.name == "*");
        if listed {
            remember_applied(&mut applied, next, &report, specs);
        } else {
            *applied = None;
        }
        report.errors = located(std::mem::take(&mut report.errors), specs);
        report
    }
}

/// A merge patch that makes `have` into `want`: `want`, with a null for every key of `have`
/// that `want` lacks, at every depth of objects both have (arrays are replaced whole).
fn with_nulls(want: &Value, have: &Value) -> Value {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            let mut out = serde_json::Map::new();
            for (k, wv) in w {
                let hv = h.get(k).unwrap_or(&Value::Null);
                out.insert(k.clone(), with_nulls(wv, hv));
            }
            for k in h.keys().filter(|k| !w.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            Value::Object(out)
        }
        _ => want.clone(),
    }
}

/// Adds the objects `api` lists with `params` to `live`, page by page, each reduced to what the
/// diff needs before the next page (one response for 1,000 rollouts was the agent's biggest
/// memory peak): the fields its desired object sets, or its identity when Git does not have
/// it. A desired object found unchanged is kept by its identity too, and named in
/// `unchanged`: at 10,000 rollouts their projections held about as much as the desired
/// objects (issue 51). With `only_desired`, objects Git does not declare are skipped: they
/// are not linnet's.
async fn list_live(
    api: &Api<DynamicObject>,
    params: &ListParams,
    ar: &ApiResource,
    desired: &HashMap<&ObjectKey, &DesiredObject>,
    only_desired: bool,
    (live, unchanged): (&mut BTreeMap<ObjectKey, Value>, &mut BTreeSet<ObjectKey>),
) -> Result<(), kube::Error> {
    let mut page = params.clone().limit(LIST_PAGE);
    loop {
        let list = api.list(&page).await?;
        let next = list.metadata.continue_.clone().filter(|c| !c.is_empty());
        for object in list.items {
            let key = ObjectKey::new(
                ar.api_version.clone(),
                ar.kind.clone(),
                object.metadata.namespace.clone().unwrap_or_default(),
                object.metadata.name.clone().unwrap_or_default(),
            );
            if only_desired && !desired.contains_key(&key) {
                continue;
            }
            keep_live(
                key,
                &to_value(object, ar),
                desired,
                (live, unchanged),
                KeepChanged::Projected,
            );
        }
        match next {
            Some(token) => page = page.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// Keeps live object `key` as far as the diff looks at it (see [`list_live`]).
fn keep_live(
    key: ObjectKey,
    object: &Value,
    desired: &HashMap<&ObjectKey, &DesiredObject>,
    (live, unchanged): (&mut BTreeMap<ObjectKey, Value>, &mut BTreeSet<ObjectKey>),
    changed: KeepChanged,
) {
    let kept = match desired.get(&key) {
        Some(d) => {
            let want = d.value();
            let projected = project_owned(&want, object);
            if is_unchanged_from(&want, &d.hash, &projected) {
                unchanged.insert(key.clone());
                identity_only(&projected)
            } else if changed == KeepChanged::Projected {
                projected
            } else {
                return;
            }
        }
        None => identity_only(object),
    };
    live.insert(key, kept);
}

/// What [`keep_live`] keeps of an object that differs from Git.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeepChanged {
    /// Its owned fields, as listed.
    Projected,
    /// Nothing: it is read from the API server before the diff (a store's typed copy lacks
    /// any field its types do not know, which is not drift).
    ReadAgain,
}

mod access;
mod inventory_store;
mod listing;
mod planning;
use planning::{SyncPlan, remember_applied};
mod put_back;
mod watched;
pub use planning::missing_namespace;
mod report;
mod writes;

pub use access::ApplyAs;
use access::{READ_FORBIDDEN_HINT, scoped, to_value};
use report::located;
pub use report::{ObjectError, SyncReport};

use inventory_store::InventoryState;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_nulls_every_key_git_leaves_out() {
        // Issue 44: a field set by `kubectl patch` that Git leaves out stayed under server-side
        // apply; the rollout's spec never matched Git's again.
        let want = serde_json::json!({"image": "redis:7.2", "promotion": {"type": "Manual"}});
        let have = serde_json::json!({
            "image": "redis:by-hand",
            "steps": [1, 2],
            "promotion": {"type": "Auto", "bakeSeconds": 30}
        });
        assert_eq!(
            with_nulls(&want, &have),
            serde_json::json!({
                "image": "redis:7.2",
                "steps": null,
                "promotion": {"type": "Manual", "bakeSeconds": null}
            })
        );
    }
}
