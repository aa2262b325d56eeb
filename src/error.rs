//! The crate's error type. Each variant has a stable, low-cardinality label for metrics.

use std::path::PathBuf;

/// Anything that can go wrong in linnet, with the context a user needs to act on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to Kubernetes: {0}")]
    KubeConfig(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// A request to the API server failed while linnet was `doing` something; after a 403,
    /// `forbidden_hint` says which permission to grant and where.
    #[error("cannot {doing}: {}", kube_message_hinted(.source, .forbidden_hint))]
    ClusterRequest {
        doing: String,
        #[source]
        source: kube::Error,
        forbidden_hint: &'static str,
    },

    /// The API server did not answer the first request within `waited`.
    #[error("cannot use the Kubernetes API server at {url}: no answer within {}s", .waited.as_secs())]
    ClusterSilent {
        url: String,
        waited: std::time::Duration,
    },

    /// Leader election cannot start on `lease` (namespace/name).
    #[error(
        "cannot use Lease {lease} for leader election: {}; check that the namespace exists and \
         RBAC allows leases",
        lease_manager_message(.source)
    )]
    LeaderLease {
        lease: String,
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },

    /// The cluster does not serve linnet's API group at all.
    #[error("{CRDS_MISSING}")]
    CrdsMissing,

    /// The cluster serves linnet's API group, but without these kinds (older CRDs).
    #[error(
        "this cluster serves rollouts.linnet.dev/v1alpha1 without {}: its \
         CustomResourceDefinitions are from an older linnet. Apply this version's: `kubectl \
         apply -f deploy/crds/crds.yaml` (or `linnet crds | kubectl apply -f -`)",
        .missing.join(", ")
    )]
    CrdsOutdated { missing: Vec<String> },

    /// The source claim (namespace/name) changed under every write this agent tried.
    #[error("cannot write the source claim {claim}: it kept changing under this agent")]
    ClaimContended { claim: String },

    #[error("Kubernetes API request failed: {}", kube_message(.0))]
    Kube(#[from] kube::Error),

    #[error("{path}: {}", io_reason(.source))]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A person's mistake on the command line or in what they asked for. The message says what
    /// to do instead; no code matches on it, so it stays text.
    #[error("{0}")]
    Usage(String),

    #[error("cannot serialise as JSON: {0}")]
    Json(#[from] serde_json::Error),

    #[error("cannot serialise as YAML: {0}")]
    Yaml(#[from] serde_saphyr::SerializeError),

    /// The agent's own machinery failed (the async runtime, a lock, the lease manager).
    #[error("{0}")]
    Runtime(#[source] std::io::Error),

    /// The Git source cannot be opened at the start. Only the error's text is kept, with any
    /// credentials in a URL redacted: the error itself may hold them.
    #[error("{0}")]
    Source(String),

    /// A long-running task of the agent stopped: the agent stops too, so that it is restarted.
    #[error("the agent's {task} task {how}; stopping so that Kubernetes restarts the agent")]
    TaskEnded { task: &'static str, how: String },
}

impl Error {
    /// A stable label for the `error` dimension of metrics; never includes user data.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::KubeConfig(_) => "kubeconfig",
            Error::ClusterRequest { .. }
            | Error::ClusterSilent { .. }
            | Error::LeaderLease { .. }
            | Error::ClaimContended { .. } => "cluster",
            Error::CrdsMissing | Error::CrdsOutdated { .. } => "crds",
            Error::Kube(_) => "kube_api",
            Error::Io { .. } => "io",
            Error::Json(_) | Error::Yaml(_) => "serialize",
            Error::Usage(_) => "usage",
            Error::Runtime(_) => "runtime",
            Error::Source(_) => "source",
            Error::TaskEnded { .. } => "task_ended",
        }
    }
}

/// Why the cluster does not serve linnet's API, and the fix.
pub const CRDS_MISSING: &str = "this cluster does not serve rollouts.linnet.dev/v1alpha1: \
     linnet's CustomResourceDefinitions are not installed. Install them with `kubectl apply -f \
     deploy/crds/crds.yaml` (or `linnet crds | kubectl apply -f -`), as an administrator";

/// A lease manager's error, with kube's refusals read as [`kube_message_hinted`] reads them.
fn lease_manager_message(e: &kube_lease_manager::LeaseManagerError) -> String {
    match e {
        kube_lease_manager::LeaseManagerError::KubeError(k) => kube_message_hinted(
            k,
            "; linnet's identity may not use leases: grant it in deploy/rbac.yaml",
        ),
        other => other.to_string(),
    }
}

/// A kube error as a person reads it: for a refusal, the API server's own message, reason and
/// code (kube's `Display` appends a debug dump of the whole `Status`), and which file grants
/// linnet a permission it lacks.
pub fn kube_message(e: &kube::Error) -> String {
    kube_message_hinted(e, FORBIDDEN_HINT)
}

/// After a 403, when no more precise place to grant the permission is known.
pub const FORBIDDEN_HINT: &str =
    "; linnet's identity lacks this permission: grant it in its ClusterRole (deploy/rbac.yaml)";

/// After a 401: the credentials, not the permissions, are wrong.
const UNAUTHORIZED_HINT: &str = "; the API server does not accept these credentials: check the \
     kubeconfig's user (in a cluster, the ServiceAccount's token)";

/// [`kube_message`] with `forbidden_hint` after a 403: which identity lacks the permission and
/// where to grant it.
pub fn kube_message_hinted(e: &kube::Error, forbidden_hint: &str) -> String {
    match e {
        kube::Error::Api(s) => {
            let message = if s.message.is_empty() {
                "no message"
            } else {
                s.message.as_str()
            };
            let hint = match s.code {
                401 => UNAUTHORIZED_HINT,
                403 => forbidden_hint,
                _ => "",
            };
            // A body that is not a Status (a proxy's page) leaves kube's parse error as reason.
            match s.reason.as_str() {
                "" | "Failed to parse error data" => format!("{message} (HTTP {}){hint}", s.code),
                reason => format!("{message} ({reason}, HTTP {}){hint}", s.code),
            }
        }
        // kube's own text stops at the outermost error ("client error (Connect)"): the causes
        // (refused, DNS, certificate) are further down the chain.
        other => error_chain(other),
    }
}

/// Every message of `e` and its sources, one after the other, without repeats. An
/// `io::Error` wrapping another error is looked into (its `source` skips the wrapped one).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    walk_sources(e, &mut |err| {
        let text = err.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    });
    parts.join(": ")
}

/// Calls `visit` on `e` and each of its sources, an `io::Error`'s wrapped error included
/// (at most 16 deep).
pub fn walk_sources(
    e: &(dyn std::error::Error + 'static),
    visit: &mut dyn FnMut(&(dyn std::error::Error + 'static)),
) {
    let mut next = Some(e);
    let mut depth = 0;
    while let Some(err) = next {
        visit(err);
        depth += 1;
        if depth > 16 {
            return;
        }
        next = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
}

/// An I/O error as a person reads it: "no such file" rather than "No such file or directory
/// (os error 2)"; other errors keep their words without the errno.
pub fn io_reason(e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::NotFound => "no such file".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        ErrorKind::IsADirectory => "a directory, not a file".into(),
        _ => {
            let text = e.to_string();
            match e.raw_os_error() {
                Some(code) => text
                    .trim_end_matches(&format!(" (os error {code})"))
                    .to_string(),
                None => text,
            }
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_refusal_reads_as_the_servers_message_not_a_debug_dump() {
        let status = kube::core::Status::failure(
            "StatefulSet.apps \"web\" is invalid: spec: Forbidden: updates to statefulset spec for fields other than 'replicas' are forbidden",
            "Invalid",
        )
        .with_code(422);
        let text = Error::Kube(kube::Error::Api(Box::new(status))).to_string();
        assert_eq!(
            text,
            "Kubernetes API request failed: StatefulSet.apps \"web\" is invalid: spec: Forbidden: updates to statefulset spec for fields other than 'replicas' are forbidden (Invalid, HTTP 422)"
        );
        assert!(!text.contains("Status {"));
    }

    #[test]
    fn a_refused_login_says_the_credentials_are_wrong() {
        let status = kube::core::Status::failure("Unauthorized", "Unauthorized").with_code(401);
        let text = kube_message(&kube::Error::Api(Box::new(status)));
        assert!(text.starts_with("Unauthorized (Unauthorized, HTTP 401); the API server does not accept these credentials"), "{text}");
    }

    #[test]
    fn a_connection_error_names_its_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = kube::Error::Service(Box::new(io));
        assert!(
            kube_message(&e).contains("Connection refused"),
            "{}",
            kube_message(&e)
        );
    }

    #[test]
    fn an_io_error_reads_without_its_errno() {
        let missing = std::io::Error::from_raw_os_error(2);
        assert_eq!(io_reason(&missing), "no such file");
        let busy = std::io::Error::from_raw_os_error(16);
        assert_eq!(io_reason(&busy), "Device or resource busy");
        let e = Error::Io {
            path: "/x".into(),
            source: missing,
        };
        assert_eq!(e.to_string(), "/x: no such file");
    }

    #[test]
    fn a_refused_cluster_request_says_what_was_done_and_where_to_grant() {
        let status = kube::core::Status::failure("leases is forbidden", "Forbidden").with_code(403);
        let e = Error::ClusterRequest {
            doing: "read the source claim ns/c".into(),
            source: kube::Error::Api(Box::new(status)),
            forbidden_hint: "; grant it here",
        };
        assert_eq!(
            e.to_string(),
            "cannot read the source claim ns/c: leases is forbidden (Forbidden, HTTP 403); grant it here"
        );
        assert_eq!(e.metric_label(), "cluster");
    }

    #[test]
    fn metric_labels_are_stable_snake_case() {
        for e in [
            Error::Usage("x".into()),
            Error::CrdsMissing,
            Error::ClaimContended {
                claim: "ns/c".into(),
            },
            Error::ClusterSilent {
                url: "https://127.0.0.1:1".into(),
                waited: std::time::Duration::from_secs(10),
            },
            Error::TaskEnded {
                task: "t",
                how: "ended".into(),
            },
        ] {
            assert!(
                e.metric_label()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_'),
                "{e}"
            );
        }
    }
}
