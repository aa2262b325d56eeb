//! The kube-runtime controllers for `CanaryStatefulSet` and `CanaryDeployment`: they observe the
//! cluster, ask [`crate::plan`] what to do, execute the actions and record status and events.

/// Objects per page of a watch's initial list (kube's default is 500): a smaller page keeps
/// the start-up memory peak down at 1,000 rollouts, for a few more requests.
const WATCH_PAGE: u32 = 100;

/// The configuration of every watch the agent runs: objects with `labels` (a label selector),
/// listed [`WATCH_PAGE`] at a time.
pub(crate) fn watch_config(labels: &str) -> watcher::Config {
    watcher::Config::default()
        .page_size(WATCH_PAGE)
        .labels(labels)
}

/// The default for `--max-concurrent-reconciles`, measured at 1,000 rollouts (bench/RESULTS.md).
/// A reconcile waits on a few requests in turn, so under a busy API server this limit sets the
/// pace of a first sync: 16 made it 40 s, 32 makes it 27 s. 64 was no faster (the sync's own
/// applies then waited) and unbounded held more memory after a restart.
pub const MAX_CONCURRENT_RECONCILES: u16 = 32;

pub mod analysis;
pub mod backoff;
pub mod context;
pub mod deployment;
pub mod execute;
pub mod own_writes;
pub mod reconcile;
pub mod shards;
pub mod statefulset;
pub mod unmanaged;

pub use context::Context;

use futures::{Stream, StreamExt as _};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;

/// What wakes a controller's reconciles, from its kind's shared store
/// ([`crate::runtime::rollouts`]): every rollout applied, but of changes only those of what
/// Git or a person sets (the spec, by its generation; labels, annotations, finalizers). A
/// status write of linnet's own changes none of them, so it wakes nothing: every wait is
/// woken by a watch of what it waits for, or by a real timer.
///
/// kube's `predicate_filter` takes owned objects; the shared store hands out `Arc`s, so its
/// predicate is applied here, keyed by object and uid, and like kube's an entry counts for an
/// hour (a rollout quiet that long is reconciled once more by its next event). A deleted
/// rollout's key is dropped; one deleted while the watch was down (no delete event) is dropped
/// once the keys outnumber the listed store's rollouts twice.
pub(crate) fn wakes<K>(
    changes: impl Stream<Item = crate::runtime::rollouts::Change<K>> + Send + 'static,
    store: Store<K>,
) -> impl Stream<Item = std::sync::Arc<K>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    use crate::runtime::rollouts::Change;
    use kube::runtime::Predicate as _;
    let predicate = own_status_writes_filtered::<K>();
    const TTL: std::time::Duration = std::time::Duration::from_secs(3600);
    type Key<K> = (reflector::ObjectRef<K>, Option<String>);
    let mut seen: std::collections::HashMap<Key<K>, (u64, std::time::Instant)> = Default::default();
    changes.filter_map(move |change| {
        let woken = match change {
            Change::Applied(o) => {
                let key = (reflector::ObjectRef::from_obj(&*o), o.meta().uid.clone());
                let now = std::time::Instant::now();
                match predicate.hash_property(&o) {
                    Some(hash)
                        if seen
                            .get(&key)
                            .is_some_and(|(h, at)| *h == hash && now - *at < TTL) =>
                    {
                        None
                    }
                    Some(hash) => {
                        seen.insert(key, (hash, now));
                        // Not while the first list is under way: the store is empty until its end.
                        if !store.is_empty() && seen.len() > 2 * store.len() + 64 {
                            seen.retain(|(r, _), _| store.get(r).is_some());
                        }
                        Some(o)
                    }
                    None => Some(o),
                }
            }
            Change::Deleted(o) => {
                seen.remove(&(reflector::ObjectRef::from_obj(&*o), o.meta().uid.clone()));
                None
            }
        };
        futures::future::ready(woken)
    })
}

/// Clears the expectations a watch event of `kind` meets ([`own_writes`]).
pub(crate) fn seen_own_writes<K: kube::Resource>(
    writes: &own_writes::OwnChildWrites,
    kind: &str,
    event: &watcher::Event<K>,
) {
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            let m = o.meta();
            if let (Some(ns), Some(name), Some(rv)) = (&m.namespace, &m.name, &m.resource_version) {
                writes.seen(&own_writes::child_key(kind, ns, name), rv);
            }
        }
        watcher::Event::Delete(o) => {
            let m = o.meta();
            if let (Some(ns), Some(name)) = (&m.namespace, &m.name) {
                writes.deleted(&own_writes::child_key(kind, ns, name));
            }
        }
        watcher::Event::InitDone => writes.relisted(kind),
        watcher::Event::Init => {}
    }
}

/// Whether a reflector's store has had its first list, for any number of waiters at once.
///
/// kube's `Store::wait_until_ready` wakes only the last of several tasks that wait on it
/// together: it polls a oneshot receiver, which keeps one waker. After a restart, the first
/// reconciles of several rollouts all waited on the StatefulSet store at once, and all but
/// one hung forever, holding their rollouts: nothing else was ever reconciled for them
/// (issue 26). Here one task waits on the store and tells a watch channel, which wakes all.
#[derive(Clone, Debug)]
pub struct StoreReady(tokio::sync::watch::Receiver<bool>);

impl StoreReady {
    pub fn of<K>(store: Store<K>) -> StoreReady
    where
        K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let (ready, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_ok() {
                ready.send_replace(true);
            }
        });
        StoreReady(rx)
    }

    /// A readiness told by whoever fills the store, for a store that something else (a kube
    /// `Controller`) already waits on with `wait_until_ready`: of two such waiters, one
    /// would never wake.
    pub fn told() -> (tokio::sync::watch::Sender<bool>, StoreReady) {
        let (ready, rx) = tokio::sync::watch::channel(false);
        (ready, StoreReady(rx))
    }

    /// Whether the first list is in.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits for the first list; an error when the store's watch has stopped for good.
    pub async fn wait(&self) -> Result<(), tokio::sync::watch::error::RecvError> {
        self.0.clone().wait_for(|ready| *ready).await.map(|_| ())
    }
}

/// What of a rollout wakes its reconcile: everything but its status.
fn own_status_writes_filtered<K: kube::Resource>() -> impl kube::runtime::Predicate<K> {
    use kube::runtime::{Predicate, predicates};
    predicates::generation
        .combine(predicates::labels)
        .combine(predicates::annotations)
        .combine(predicates::finalizers)
        .combine(|k: &K| Some(u64::from(k.meta().deletion_timestamp.is_some())))
}

/// Errors of a reconcile. Each has a stable metric label.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(
        "Kubernetes API request failed while {doing}: {}",
        crate::error::kube_message(source)
    )]
    Kube {
        doing: String,
        #[source]
        source: kube::Error,
    },
    #[error("the object has no namespace")]
    NoNamespace,
    /// A patch refused because its object is not the rollout's (a volume whose claim is not).
    #[error("refused {doing}: {why}")]
    NotOurs { doing: String, why: String },
    #[error("waiting: {0}")]
    Waiting(String),
    #[error("finalizer: {0}")]
    Finalizer(String),
}

impl ReconcileError {
    /// Whether retrying cannot help until something changes (Git, RBAC, a hand-made object):
    /// a refusal (400, 401, 403, 404, 422) or an object that is not the rollout's. A
    /// conflict, a throttle, a server error, a timeout or a wait clears by itself.
    pub fn permanent(&self) -> bool {
        match self {
            ReconcileError::Kube {
                source: kube::Error::Api(s),
                ..
            } => matches!(s.code, 400 | 401 | 403 | 404 | 422),
            ReconcileError::NotOurs { .. } | ReconcileError::NoNamespace => true,
            ReconcileError::Kube { .. }
            | ReconcileError::Waiting(_)
            | ReconcileError::Finalizer(_) => false,
        }
    }

    /// What failed, as a rollout's status says it: the action, then the API server's message.
    pub fn failure(&self) -> String {
        match self {
            ReconcileError::Kube { doing, source } => {
                format!("{doing}: {}", crate::error::kube_message(source))
            }
            // Led by the action, like the others: that is how the plan recognises its own
            // failed action on the next reconcile and keeps the failure in the status.
            ReconcileError::NotOurs { doing, why } => format!("{doing}: refused: {why}"),
            other => other.to_string(),
        }
    }

    /// Every label [`ReconcileError::metric_label`] gives.
    pub const LABELS: &'static [&'static str] = &[
        "kube_api",
        "no_namespace",
        "not_ours",
        "waiting",
        "finalizer",
    ];

    /// A stable, low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Kube { .. } => "kube_api",
            ReconcileError::NoNamespace => "no_namespace",
            ReconcileError::NotOurs { .. } => "not_ours",
            ReconcileError::Waiting(_) => "waiting",
            ReconcileError::Finalizer(_) => "finalizer",
        }
    }
}

/// Why a child the controller is about to apply may not be: an object of its name exists that
/// this rollout did not make (no controller owner reference with the rollout's uid). A rollout
/// named after someone's StatefulSet or Deployment must not take it over with the agent's
/// rights; the name is refused instead.
pub(crate) fn foreign_child(
    live: Option<&kube::api::ObjectMeta>,
    desired: &kube::api::ObjectMeta,
) -> Option<String> {
    let controller_uid = |m: &kube::api::ObjectMeta| {
        m.owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
            .map(|r| r.uid.clone())
    };
    let live = live?;
    let ours = controller_uid(desired);
    if ours.is_some() && controller_uid(live) == ours {
        return None;
    }
    Some(format!(
        "{} already exists and this rollout did not make it; rename the rollout (linnet \
         never takes over an object it did not create)",
        live.name.as_deref().unwrap_or_default()
    ))
}

/// Writes the planned status with the action that failed marked in it (Stalled, reason
/// ActionFailed, for a refusal; still Reconciling, reason ActionRetrying, for what clears by
/// itself), and hands back the failure for the reconcile to return.
pub(crate) async fn show_action_failure<K, S>(
    ctx: &Context,
    rollout: &K,
    kind: &str,
    planned: &S,
    failure: ReconcileError,
    now: jiff::Timestamp,
) -> ReconcileError
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    S: crate::plan::RolloutStatus + Clone + serde::Serialize + PartialEq,
{
    let mut blocked = planned.clone();
    let (conditions, message) = blocked.conditions_and_message();
    crate::plan::mark_action_failed(
        conditions,
        message,
        &failure.failure(),
        failure.permanent(),
        now,
    );
    match write_status(ctx, rollout, kind, Some(planned), &blocked).await {
        Ok(_) => failure,
        Err(e) => e,
    }
}

/// Adds what was being done to a kube error.
pub(crate) trait Doing<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, ReconcileError>;
}

impl<T> Doing<T> for Result<T, kube::Error> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, ReconcileError> {
        self.map_err(|source| ReconcileError::Kube {
            doing: what(),
            source,
        })
    }
}

/// What [`write_status`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusWrite {
    /// The status was already what the plan says.
    Unchanged,
    /// The status was written.
    Written,
    /// The store has not yet seen this agent's last write, and the plan repeats it: nothing
    /// was written, and the plan's events were already published with that write.
    Repeated,
}

/// Writes a rollout's status with server-side apply (so fields it no longer has are removed),
/// unless it is unchanged. Called before a plan's actions run: the recorded phase is never
/// behind what was done, so a crash in between only means doing the actions again.
///
/// `rollout` is the object the plan was made from. A reconcile woken by a child's event can
/// start before the watch has delivered this agent's previous status write; it then plans the
/// same transition again, and [`OwnStatusWrites`] keeps it from writing and announcing it twice.
pub(crate) async fn write_status<K, S>(
    ctx: &Context,
    rollout: &K,
    kind: &str,
    old: Option<&S>,
    new: &S,
) -> Result<StatusWrite, ReconcileError>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    S: serde::Serialize + PartialEq,
{
    let name = rollout.meta().name.clone().unwrap_or_default();
    let ns = rollout.meta().namespace.clone().unwrap_or_default();
    let key = format!("{kind}/{ns}/{name}");
    if old == Some(new) {
        // The store shows this status: any write of ours has come back.
        ctx.own_status_writes.forget(&key);
        return Ok(StatusWrite::Unchanged);
    }
    let planned_from = rollout.meta().resource_version.clone().unwrap_or_default();
    let digest = status_digest(new);
    if ctx.own_status_writes.repeats(&key, &planned_from, digest) {
        return Ok(StatusWrite::Repeated);
    }
    let patch = serde_json::json!({
        "apiVersion": crate::api::API_VERSION,
        "kind": kind,
        "status": new,
    });
    let api: kube::Api<K> = kube::Api::namespaced(ctx.client.clone(), &ns);
    api.patch_status(
        &name,
        &kube::api::PatchParams::apply(crate::sync::FIELD_MANAGER).force(),
        &kube::api::Patch::Apply(&patch),
    )
    .await
    .doing(|| format!("writing the status of {kind} {ns}/{name}"))?;
    ctx.own_status_writes.record(&key, &planned_from, digest);
    Ok(StatusWrite::Written)
}

/// Whether `rollout` (from the store) predates a status this agent has written: a reconcile
/// woken before the watch delivered that write sees an older status. Measuring from it would
/// take again a measurement already recorded.
pub(crate) fn status_write_pending<K: kube::Resource>(
    ctx: &Context,
    kind: &str,
    rollout: &K,
) -> bool {
    let meta = rollout.meta();
    let key = format!(
        "{kind}/{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    );
    ctx.own_status_writes
        .pending(&key, meta.resource_version.as_deref().unwrap_or_default())
}

fn status_digest(status: &impl serde::Serialize) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(status)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// The last status this agent wrote to each rollout, with the resourceVersion of the object it
/// was planned from. While a rollout's store still shows that version, the write has not come
/// back through the watch yet, and writing the same status again would change nothing.
#[derive(Debug, Default)]
pub struct OwnStatusWrites {
    last: std::sync::Mutex<std::collections::HashMap<String, (String, u64)>>,
}

impl OwnStatusWrites {
    /// True if the status with `digest`, planned from `planned_from`, is the one last written
    /// from that same version. An entry for an older version is dropped: once the store moves
    /// past it, it never matches again.
    pub fn repeats(&self, key: &str, planned_from: &str, digest: u64) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        match last.get(key) {
            Some((from, d)) if from == planned_from => *d == digest,
            Some(_) => {
                last.remove(key);
                false
            }
            None => false,
        }
    }

    /// Drops what is known of `key`'s last write, once the store shows it: entries are kept
    /// only while a write is on its way back, not for every rollout ever written.
    pub fn forget(&self, key: &str) {
        if let Ok(mut last) = self.last.lock() {
            last.remove(key);
        }
    }

    /// Whether a status this agent wrote from version `planned_from` is still on its way
    /// back: the store's object (at that version) is older than the status written.
    pub fn pending(&self, key: &str, planned_from: &str) -> bool {
        self.last
            .lock()
            .is_ok_and(|last| last.get(key).is_some_and(|(from, _)| from == planned_from))
    }

    /// Remembers a status written from version `planned_from`.
    pub fn record(&self, key: &str, planned_from: &str, digest: u64) {
        if let Ok(mut last) = self.last.lock() {
            last.insert(key.to_string(), (planned_from.to_string(), digest));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(owner_uid: Option<&str>) -> kube::api::ObjectMeta {
        serde_json::from_value(serde_json::json!({"name": "db-stable",
            "ownerReferences": owner_uid.map(|u| vec![serde_json::json!({
                "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
                "name": "db", "uid": u, "controller": true})]).unwrap_or_default()}))
        .unwrap_or_default()
    }

    #[test]
    fn a_refused_action_stays_shown_while_the_plan_repeats_it() {
        // The plan keeps a failure shown while it still emits the failed action, recognised by
        // the failure leading with it; a refusal's did not, so the status lost and regained
        // its Stalled (then Degraded) condition on every retry.
        let action = "retain volume pv-1 for data-db-canary-0".to_string();
        let refused = ReconcileError::NotOurs {
            doing: action.clone(),
            why: "volume pv-1 is not rollout shop/db's".into(),
        };
        let now = jiff::Timestamp::UNIX_EPOCH;
        let (mut shown, mut message) = (Vec::new(), None);
        crate::plan::mark_action_failed(
            &mut shown,
            &mut message,
            &refused.failure(),
            refused.permanent(),
            now,
        );
        let (mut next, mut next_message) = (Vec::new(), None);
        crate::plan::carry_action_failure(&shown, &mut next, &mut next_message, [action], now);
        assert!(
            next.iter()
                .any(|c| c.type_ == crate::api::condition::STALLED && c.status == "True"),
            "{next:?}"
        );
    }

    #[test]
    fn a_rollout_never_takes_over_a_workload_it_did_not_make() {
        let desired = meta(Some("r1"));
        assert_eq!(foreign_child(None, &desired), None, "absent: created");
        assert_eq!(
            foreign_child(Some(&meta(Some("r1"))), &desired),
            None,
            "its own"
        );
        assert!(
            foreign_child(Some(&meta(None)), &desired).is_some(),
            "hand-made"
        );
        assert!(
            foreign_child(Some(&meta(Some("r2"))), &desired).is_some(),
            "another rollout's (a deleted and recreated one has a new uid)"
        );
    }

    #[tokio::test]
    async fn every_waiter_on_a_store_wakes_when_it_is_ready() {
        // Issue 26: with kube's wait_until_ready, of several reconciles waiting together only
        // the last one woke; the others held their rollouts forever.
        use k8s_openapi::api::core::v1::ConfigMap;
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let ready = StoreReady::of(store);
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let ready = ready.clone();
                tokio::spawn(async move { ready.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        for waiter in waiters {
            let woke = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await;
            assert!(matches!(woke, Ok(Ok(Ok(())))), "a waiter was never woken");
        }
    }

    #[tokio::test]
    async fn only_changes_of_what_git_or_a_person_sets_wake_a_reconcile() {
        use crate::runtime::rollouts::Change;
        use futures::StreamExt as _;
        use k8s_openapi::api::core::v1::ConfigMap;
        use std::sync::Arc;
        let object = |generation: i64, version: &str, label: &str| {
            let mut o = ConfigMap::default();
            o.metadata.name = Some("db".into());
            o.metadata.namespace = Some("shop".into());
            o.metadata.uid = Some("u1".into());
            o.metadata.generation = Some(generation);
            o.metadata.resource_version = Some(version.into());
            o.metadata.labels = Some([("app".to_string(), label.to_string())].into());
            Arc::new(o)
        };
        let changes = futures::stream::iter(vec![
            Change::Applied(object(1, "1", "a")),
            Change::Applied(object(1, "2", "a")), // linnet's own status write
            Change::Applied(object(2, "3", "a")), // the spec from Git
            Change::Applied(object(2, "4", "b")), // a label
            Change::Deleted(object(2, "5", "b")),
            Change::Applied(object(2, "6", "b")), // made again
        ]);
        let woken: Vec<String> = wakes(changes, reflector::store::<ConfigMap>().0)
            .map(|o| o.metadata.resource_version.clone().unwrap_or_default())
            .collect()
            .await;
        assert_eq!(woken, ["1", "3", "4", "6"]);
    }

    #[test]
    fn a_status_planned_again_from_the_same_version_is_a_repeat() {
        let writes = OwnStatusWrites::default();
        assert!(!writes.repeats("r", "100", 1), "nothing written yet");
        writes.record("r", "100", 1);
        assert!(
            writes.repeats("r", "100", 1),
            "store still at 100: same status"
        );
        assert!(
            !writes.repeats("r", "100", 2),
            "store still at 100, but the plan changed: write it"
        );
        assert!(!writes.repeats("other", "100", 1), "another rollout");
    }

    #[test]
    fn once_the_store_moves_on_the_entry_is_dropped() {
        let writes = OwnStatusWrites::default();
        writes.record("r", "100", 1);
        assert!(
            !writes.repeats("r", "101", 1),
            "the write came back: compare as usual"
        );
        assert!(
            !writes.repeats("r", "100", 1),
            "the entry is gone, even for a version seen before"
        );
        assert!(writes.last.lock().map(|m| m.is_empty()).unwrap_or(false));
    }

    #[test]
    fn an_entry_is_forgotten_once_the_store_shows_the_write() {
        let writes = OwnStatusWrites::default();
        writes.record("r", "100", 1);
        writes.record("other", "7", 2);
        writes.forget("r");
        assert!(!writes.repeats("r", "100", 1));
        assert!(
            writes.repeats("other", "7", 2),
            "only that rollout's entry goes"
        );
    }
}
