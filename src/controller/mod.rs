//! The kube-runtime controllers for `CanaryStatefulSet` and `CanaryDeployment`: they observe the
//! cluster, ask [`crate::plan`] what to do, execute the actions and record status and events.

pub mod context;
pub mod statefulset;

pub use context::Context;

/// Errors of a reconcile. Each has a stable metric label.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API request failed while {doing}: {source}")]
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
