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
    /// Located errors in the specs at the current revision: the first [`ERRORS_KEPT`].
    pub spec_errors: Vec<String>,
    /// How many errors the specs have, kept or not.
    #[serde(default)]
    pub spec_error_count: usize,
    /// Objects of `revision` that were not applied (refused by the policy, by the source's
    /// rights or by the API server), each located in its file; retried. The first
    /// [`ERRORS_KEPT`].
    #[serde(default)]
    pub sync_errors: Vec<String>,
    /// How many objects were not applied, kept or not.
    #[serde(default)]
    pub sync_error_count: usize,
    /// Set when the tracked branch was last force-pushed (its new tip not descending from the
    /// one before), until a tip descends from the one before it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_rewritten: Option<String>,
    /// `Degraded`: whether part of the revision is not applied (spec or sync errors);
    /// `HistoryRewritten` while the branch's last move was a force push.
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

/// Errors kept per revision in the status (`/status`, `linnet status`); the rest are counted.
/// A revision of 10,000 broken files made `/status` 177 MB before (issue 45).
pub const ERRORS_KEPT: usize = 100;

/// The longest error message kept, in characters.
const ERROR_CHARS: usize = 1000;

/// The first [`ERRORS_KEPT`] of `errors`, each at most [`ERROR_CHARS`] long, and how many
/// there were.
pub fn kept_errors(errors: impl ExactSizeIterator<Item = String>) -> (Vec<String>, usize) {
    let count = errors.len();
    let kept = errors
        .take(ERRORS_KEPT)
        .map(|e| {
            if e.chars().count() > ERROR_CHARS {
                let mut cut: String = e.chars().take(ERROR_CHARS).collect();
                cut.push('…');
                cut
            } else {
                e
            }
        })
        .collect();
    (kept, count)
}

/// The source's condition that part of the revision is not applied.
pub const DEGRADED: &str = "Degraded";

/// The source's condition that the tracked branch was force-pushed.
pub const HISTORY_REWRITTEN: &str = "HistoryRewritten";

impl SourceStatus {
    /// Whether a revision is synced with every object applied and the last step failed
    /// nothing: the LinnetSource's Ready condition, and `linnet_source_ready`.
    pub fn is_ready(&self) -> bool {
        self.last_error.is_none()
            && self.revision.is_some()
            && !self
                .conditions
                .iter()
                .any(|c| c.type_ == DEGRADED && c.status == "True")
    }

    /// Recomputes `Degraded` from the errors.
    pub fn set_degraded(&mut self) {
        let (status, reason, message) = match (self.spec_errors.first(), self.sync_errors.first()) {
            (_, Some(first)) => (
                "True",
                "SyncErrors",
                format!(
                    "{} object(s) of the revision not applied; first: {first}",
                    self.sync_error_count.max(self.sync_errors.len())
                ),
            ),
            (Some(first), None) => (
                "True",
                "SpecErrors",
                format!(
                    "{} error(s) in the specs block their files; first: {first}",
                    self.spec_error_count.max(self.spec_errors.len())
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
        if let Some(rewritten) = &self.history_rewritten {
            self.conditions.push(SourceCondition {
                type_: HISTORY_REWRITTEN.into(),
                status: "True".into(),
                reason: "ForcePushed".into(),
                message: rewritten.clone(),
            });
        }
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
    /// The fleet as last read from Git (`--fleet`; `None` until then, and without one).
    pub fleet:
        tokio::sync::watch::Sender<Option<std::sync::Arc<crate::plan::fleet::FleetSnapshot>>>,
    /// Told by a registry's webhook: the image automation scans now (`--image-automation`).
    pub image_scans: std::sync::Arc<tokio::sync::Notify>,
    /// Where the images the image automation committed came from: it writes, the reconciles
    /// read (a rollout's `imageSource`).
    pub image_origins: crate::controller::SharedImageOrigins,
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
            fleet: tokio::sync::watch::Sender::new(None),
            image_scans: Default::default(),
            image_origins: Default::default(),
        }
    }

    /// The status as it is now.
    pub fn status(&self) -> SourceStatus {
        self.status.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// What `read` makes of the status, without copying it.
    pub fn read<T>(&self, read: impl FnOnce(&SourceStatus) -> T) -> Option<T> {
        self.status.read().ok().map(|s| read(&s))
    }

    /// The source's state as metrics (Ready, error counts, the last success), after a step.
    pub fn publish_metrics(&self, metrics: &crate::telemetry::Metrics, source: &str) {
        let Some((ready, spec_errors, unapplied)) =
            self.read(|s| (s.is_ready(), s.spec_error_count, s.sync_error_count))
        else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        metrics.source_state(source, ready, spec_errors, unapplied, now);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_of_many_errors_keeps_a_hundred_and_counts_the_rest() {
        // Issue 45: a million spec errors made a 177 MB `/status` body.
        let errors = (0..100_000).map(|i| format!("f{i}.yaml:1:1: {}", "x".repeat(5000)));
        let (kept, count) = kept_errors(errors);
        assert_eq!((kept.len(), count), (ERRORS_KEPT, 100_000));
        assert!(kept.iter().all(|e| e.chars().count() <= ERROR_CHARS + 1));
        let mut s = SourceStatus {
            spec_errors: kept,
            spec_error_count: count,
            ..SourceStatus::default()
        };
        s.set_degraded();
        assert!(
            s.conditions[0].message.starts_with("100000 error(s)"),
            "{:?}",
            s.conditions
        );
    }
}
