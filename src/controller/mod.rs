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

/// The default for `--max-concurrent-reconciles`, measured at 1,000 rollouts (bench/RESULTS.md):
/// unbounded, a restart held about 30 MiB more for a minute; 8 slowed the initial sync from
/// 40 to 56 s; 16 cost neither.
pub const MAX_CONCURRENT_RECONCILES: u16 = 16;

pub mod context;
pub mod deployment;
pub mod statefulset;

pub use context::Context;

use futures::Stream;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

/// The rollouts a controller reconciles: a watch of `api`, and the store the controller reads
/// them from. The store keeps each object without its `managedFields`, which nothing here
/// reads: every managed field is a JSON map, and the store of 1,000 rollouts with them held
/// 18.7 MB (heaptrack), the largest part of the agent's memory.
pub(crate) fn watch_rollouts<K>(
    api: kube::Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|rollout| rollout.meta_mut().managed_fields = None)
        .reflect(writer)
        .applied_objects();
    (reader, stream)
}

/// Errors of a reconcile. Each has a stable metric label.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(
        "Kubernetes API request failed while {doing}: {source}{}",
        crate::sync::apply::forbidden_hint(source)
    )]
    Kube {
        doing: String,
        #[source]
        source: kube::Error,
    },
    #[error("the object has no namespace")]
    NoNamespace,
    #[error("waiting: {0}")]
    Waiting(String),
    #[error("finalizer: {0}")]
    Finalizer(String),
}

impl ReconcileError {
    /// A stable, low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Kube { .. } => "kube_api",
            ReconcileError::NoNamespace => "no_namespace",
            ReconcileError::Waiting(_) => "waiting",
            ReconcileError::Finalizer(_) => "finalizer",
        }
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

/// Writes a rollout's status with server-side apply (so fields it no longer has are removed),
/// unless it is unchanged. Called before a plan's actions run: the recorded phase is never
/// behind what was done, so a crash in between only means doing the actions again.
pub(crate) async fn write_status<K, S>(
    api: &kube::Api<K>,
    name: &str,
    kind: &str,
    old: Option<&S>,
    new: &S,
) -> Result<(), ReconcileError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: serde::Serialize + PartialEq,
{
    if old == Some(new) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": crate::api::API_VERSION,
        "kind": kind,
        "status": new,
    });
    api.patch_status(
        name,
        &kube::api::PatchParams::apply(crate::sync::FIELD_MANAGER).force(),
        &kube::api::Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
    .doing(|| format!("writing the status of {kind} {name}"))
}
