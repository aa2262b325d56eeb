//! A reconcile's errors, each with a stable metric label, and what was being done when a
//! request failed.

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
    /// A request made as the source's account (a `versionedConfig` Secret copy): a refusal
    /// is that account's to fix, never linnet's own ClusterRole's, which reads no Secret.
    #[error(
        "Kubernetes API request failed while {doing}: {}",
        crate::error::kube_message_hinted(source, SOURCE_ACCOUNT_HINT)
    )]
    KubeAsSource {
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
    #[error(transparent)]
    ActAs(#[from] super::source_account::ActAsError),
}

/// After a 403 of a request made as the source's account.
const SOURCE_ACCOUNT_HINT: &str = "; the source's account may not do this: a cluster admin \
     grants it in this namespace (docs/security.md, Permissions: a RoleBinding to ClusterRole \
     linnet-source). Do not widen linnet's own ClusterRole: it never reads Secrets";

impl ReconcileError {
    /// Whether retrying cannot help until something changes (Git, RBAC, a hand-made object):
    /// a refusal (400, 401, 403, 404, 422) or an object that is not the rollout's. A
    /// conflict, a throttle, a server error, a timeout or a wait clears by itself.
    pub fn permanent(&self) -> bool {
        match self {
            ReconcileError::Kube {
                source: kube::Error::Api(s),
                ..
            }
            | ReconcileError::KubeAsSource {
                source: kube::Error::Api(s),
                ..
            } => matches!(s.code, 400 | 401 | 403 | 404 | 422),
            ReconcileError::NotOurs { .. }
            | ReconcileError::NoNamespace
            | ReconcileError::ActAs(_) => true,
            ReconcileError::Kube { .. }
            | ReconcileError::KubeAsSource { .. }
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
            ReconcileError::KubeAsSource { doing, source } => format!(
                "{doing}: {}",
                crate::error::kube_message_hinted(source, SOURCE_ACCOUNT_HINT)
            ),
            // Led by the action, like the others, so that a person reads what was refused.
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
        "act_as",
    ];

    /// A stable, low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Kube { .. } | ReconcileError::KubeAsSource { .. } => "kube_api",
            ReconcileError::NoNamespace => "no_namespace",
            ReconcileError::NotOurs { .. } => "not_ours",
            ReconcileError::Waiting(_) => "waiting",
            ReconcileError::Finalizer(_) => "finalizer",
            ReconcileError::ActAs(_) => "act_as",
        }
    }
}

/// Adds what was being done to a kube error.
pub(crate) trait Doing<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, ReconcileError>;
    /// [`Doing::doing`] for a request made as the source's account.
    fn doing_as_source(self, what: impl FnOnce() -> String) -> Result<T, ReconcileError>;
}

impl<T> Doing<T> for Result<T, kube::Error> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, ReconcileError> {
        self.map_err(|source| ReconcileError::Kube {
            doing: what(),
            source,
        })
    }

    fn doing_as_source(self, what: impl FnOnce() -> String) -> Result<T, ReconcileError> {
        self.map_err(|source| ReconcileError::KubeAsSource {
            doing: what(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_secret_copy_names_the_sources_account_not_linnets_cluster_role() {
        // Issue 70: the event advised granting linnet's ClusterRole, which must never read
        // Secrets; the copies are the source's account's to make.
        let status = kube::core::Status::failure(
            "secrets \"db\" is forbidden: User \"system:serviceaccount:a:linnet-a\" cannot get resource \"secrets\"",
            "Forbidden",
        )
        .with_code(403);
        let e: Result<(), kube::Error> = Err(kube::Error::Api(Box::new(status)));
        let e = e
            .doing_as_source(|| "reading Secret a/db".into())
            .unwrap_err();
        for said in [e.to_string(), e.failure()] {
            assert!(
                said.contains("the source's account may not do this")
                    && said.contains("linnet-source")
                    && !said.contains("grant it in its ClusterRole"),
                "{said}"
            );
        }
        assert!(e.permanent());
        assert_eq!(e.metric_label(), "kube_api");
    }
}
