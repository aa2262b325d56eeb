//! The agent's own state, as `/status`, `/readyz` and the LinnetSource object show it: the
//! source's last sync, and whether the first one is done. Written by the source loop only.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// What `/status` and `linnet status` report about the source.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    pub source: String,
    /// The revision last synced: its objects are applied, except those in `syncErrors`.
    pub revision: Option<String>,
    pub last_sync: Option<String>,
    /// The last failure to reach Git or to sync, cleared by the next success.
    pub last_error: Option<String>,
    pub objects: usize,
    /// Located errors in the specs at the current revision.
    pub spec_errors: Vec<String>,
    /// Objects of `revision` that were not applied (refused by the policy, by the source's
    /// rights or by the API server), each located in its file; retried.
    #[serde(default)]
    pub sync_errors: Vec<String>,
    /// `Degraded`: whether part of the revision is not applied (spec or sync errors).
    #[serde(default)]
    pub conditions: Vec<SourceCondition>,
}

/// A condition of the source, as on Kubernetes objects.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// The source's condition that part of the revision is not applied.
pub const DEGRADED: &str = "Degraded";

impl SourceStatus {
    /// Recomputes `Degraded` from the errors.
    pub fn set_degraded(&mut self) {
        let (status, reason, message) = match (self.spec_errors.first(), self.sync_errors.first()) {
            (_, Some(first)) => (
                "True",
                "SyncErrors",
                format!(
                    "{} object(s) of the revision not applied; first: {first}",
                    self.sync_errors.len()
                ),
            ),
            (Some(first), None) => (
                "True",
                "SpecErrors",
                format!(
                    "{} error(s) in the specs block their files; first: {first}",
                    self.spec_errors.len()
                ),
            ),
            (None, None) => (
                "False",
                "Synced",
                "every object of the revision is applied".into(),
            ),
        };
        self.conditions = vec![SourceCondition {
            type_: DEGRADED.into(),
            status: status.into(),
            reason: reason.into(),
            message,
        }];
    }
}

pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::try_from(SystemTime::now())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The source loop's state, read by the listeners and the LinnetSource publisher.
pub struct AgentState {
    status: RwLock<SourceStatus>,
    /// Told after every change of `status`, for the LinnetSource object.
    changed: tokio::sync::watch::Sender<()>,
    ready: AtomicBool,
}

impl AgentState {
    pub fn new(source: &str) -> AgentState {
        AgentState {
            status: RwLock::new(SourceStatus {
                source: source.to_string(),
                ..SourceStatus::default()
            }),
            changed: tokio::sync::watch::Sender::new(()),
            ready: AtomicBool::new(false),
        }
    }

    /// The status as it is now.
    pub fn status(&self) -> SourceStatus {
        self.status.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// Changes the status and tells whoever follows it.
    pub fn update(&self, change: impl FnOnce(&mut SourceStatus)) {
        if let Ok(mut s) = self.status.write() {
            change(&mut s);
        }
        self.changed.send_replace(());
    }

    /// Told after every change of the status.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Whether the first look at the source is done (`/readyz`).
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }
}
