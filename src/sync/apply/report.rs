//! What a sync reports: the objects it created, updated, left and pruned, and each object's
//! error, located in its spec file.

use crate::error::{kube_message, kube_message_hinted};
use crate::specs::{ObjectKey, SpecSet};

use super::*;

/// Why one object of a revision was not read or written. Shown, located in its file, in the
/// source's status (`syncErrors`), and retried with the next sync.
#[derive(Debug)]
pub enum ObjectError {
    /// The cluster does not serve the object's kind; `linnet` for linnet's own kinds.
    NotServed {
        kind: String,
        api_version: String,
        linnet: bool,
    },
    /// The kind could not be looked up.
    Lookup {
        kind: String,
        api_version: String,
        source: kube::Error,
    },
    /// The agent cannot make a client that acts as the source's account.
    ActAs(String),
    /// A read as the agent failed.
    Read(kube::Error),
    /// A request failed: `what` is `apply`, `delete` or `read`; `refused` when the source's
    /// account may not make it; `text` is the API server's message with what to grant.
    Request {
        what: &'static str,
        refused: bool,
        text: String,
    },
}

impl std::fmt::Display for ObjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectError::NotServed {
                kind,
                api_version,
                linnet: true,
            } => write!(
                f,
                "the cluster does not serve {kind} in {api_version}: install linnet's CRDs \
                 (kubectl apply -f deploy/crds/crds.yaml)"
            ),
            ObjectError::NotServed {
                kind, api_version, ..
            } => write!(
                f,
                "the cluster does not serve {kind} in {api_version}: install the CRD or API \
                 that provides it, or fix apiVersion"
            ),
            ObjectError::Lookup {
                kind,
                api_version,
                source,
            } => write!(
                f,
                "cannot look up {kind} in {api_version}: {}",
                kube_message(source)
            ),
            ObjectError::ActAs(why) => f.write_str(why),
            ObjectError::Read(e) => write!(
                f,
                "cannot read: {}",
                kube_message_hinted(e, READ_FORBIDDEN_HINT)
            ),
            ObjectError::Request {
                what,
                refused: true,
                text,
            } => write!(f, "{what} refused: {text}"),
            ObjectError::Request {
                what: "read", text, ..
            } => write!(f, "cannot read: {text}"),
            ObjectError::Request { what, text, .. } => write!(f, "{what} failed: {text}"),
        }
    }
}

impl std::error::Error for ObjectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ObjectError::Lookup { source, .. } | ObjectError::Read(source) => Some(source),
            _ => None,
        }
    }
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

/// Each error about an object from Git, prefixed with where Git declares it.
pub(super) fn located(
    errors: Vec<(ObjectKey, String)>,
    specs: &SpecSet,
) -> Vec<(ObjectKey, String)> {
    errors
        .into_iter()
        .map(
            |(key, e)| match specs.objects.get(&key).map(|o| &o.location) {
                Some(at) => (key, format!("{at}: {e}")),
                None => (key, e),
            },
        )
        .collect()
}
