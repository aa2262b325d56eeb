//! The kube-runtime controllers for `CanaryStatefulSet` and `CanaryDeployment`: they observe the
//! cluster, ask [`crate::plan`] what to do, execute the actions and record status and events.

/// Objects per page of a watch's initial list (kube's default is 500): a smaller page keeps
/// the start-up memory peak down at 1,000 rollouts, for a few more requests.
pub const WATCH_PAGE: u32 = 100;

pub mod context;
pub mod deployment;
pub mod statefulset;

pub use context::Context;

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
