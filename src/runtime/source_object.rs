//! The source's state in the cluster: the agent keeps a `LinnetSource` (named after its
//! source, in its own namespace) up to date with the revision it synced, the errors that
//! block part of it and when that last changed, so that `kubectl get lsrc` answers "why does
//! my change not show?" without access to the agent. It is written only when that state
//! changes, never per poll.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::state::SourceStatus;
use crate::api::{LinnetSource, LinnetSourceSpec, LinnetSourceStatus};
use crate::plan::set_condition;

/// The field manager of the agent's writes.
const MANAGER: &str = "linnet";
/// Errors listed on the object, of each kind.
const ERRORS_SHOWN: usize = 10;
/// Wait before a failed write is tried again (a later change tries at once).
const RETRY: Duration = Duration::from_secs(30);

/// The Ready condition's status, reason and message: the errors as the agent's own status
/// already sums them up (its Degraded condition), else the revision synced.
fn readiness(state: &SourceStatus) -> (bool, &str, String) {
    let degraded = state
        .conditions
        .iter()
        .find(|c| c.type_ == super::state::DEGRADED && c.status == "True");
    match (&state.last_error, degraded, &state.revision) {
        (Some(e), _, _) => (false, "SyncFailed", e.clone()),
        (None, Some(d), _) => (false, d.reason.as_str(), d.message.clone()),
        (None, None, Some(revision)) => (
            true,
            "Synced",
            format!("every object of {revision} is applied"),
        ),
        (None, None, None) => (false, "NotSynced", "no revision synced yet".into()),
    }
}

/// HistoryRewritten: true with why while the branch's last move was a force-push; false
/// once it moved forward again (absent until the first rewrite).
fn set_history_condition(
    conditions: &mut Vec<crate::api::Condition>,
    rewritten: Option<&str>,
    now: jiff::Timestamp,
) {
    let rewritten_before = conditions
        .iter()
        .any(|c| c.type_ == super::state::HISTORY_REWRITTEN);
    match rewritten {
        Some(why) => set_condition(
            conditions,
            super::state::HISTORY_REWRITTEN,
            true,
            "ForcePushed",
            why,
            now,
        ),
        None if rewritten_before => set_condition(
            conditions,
            super::state::HISTORY_REWRITTEN,
            false,
            "FastForward",
            "the branch's last move was a fast-forward",
            now,
        ),
        None => {}
    }
}

/// The object's status for the agent's `state`; `previous` keeps transition and sync times
/// when nothing they stand for changed. Pure.
pub fn status_of(
    state: &SourceStatus,
    generation: Option<i64>,
    previous: Option<&LinnetSourceStatus>,
    now: jiff::Timestamp,
) -> LinnetSourceStatus {
    let (ready, reason, message) = readiness(state);
    // An agent that has not synced since it started (the remote fails) keeps what the last
    // one applied, as the cluster still runs it; Flux keeps its last artifact the same way.
    let (revision, objects) = match (&state.revision, previous) {
        (None, Some(p)) if p.revision.is_some() => (p.revision.clone(), p.objects),
        _ => (state.revision.clone(), state.objects as i64),
    };
    let mut status = LinnetSourceStatus {
        observed_generation: generation,
        conditions: previous.map(|p| p.conditions.clone()).unwrap_or_default(),
        revision,
        last_sync_time: None,
        last_error: state.last_error.clone(),
        objects,
        spec_errors: state
            .spec_errors
            .iter()
            .take(ERRORS_SHOWN)
            .cloned()
            .collect(),
        sync_errors: state
            .sync_errors
            .iter()
            .take(ERRORS_SHOWN)
            .cloned()
            .collect(),
    };
    set_condition(
        &mut status.conditions,
        "Ready",
        ready,
        reason,
        &message,
        now,
    );
    set_history_condition(
        &mut status.conditions,
        state.history_rewritten.as_deref(),
        now,
    );
    // The sync time moves only with what it stands for: no write per poll or drift check.
    let same = previous.is_some_and(|p| {
        let mut p = p.clone();
        p.last_sync_time = None;
        p == status
    });
    status.last_sync_time = match previous {
        Some(p) if same => p.last_sync_time.clone(),
        _ => state
            .last_sync
            .as_deref()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(Time),
    };
    status
}

/// The LinnetSource's spec for the agent's `config`: where it reads (credentials redacted).
pub fn spec_of(config: &super::config::AgentConfig) -> LinnetSourceSpec {
    use super::config::SourceConfig;
    let (url, branch) = match &config.source {
        SourceConfig::Remote { remote, .. } => (
            crate::text::redact_credentials(&remote.url),
            remote.branch.clone(),
        ),
        SourceConfig::Local { dir } => (dir.display().to_string(), String::new()),
    };
    LinnetSourceSpec {
        url,
        branch,
        path: config.load.selection.to_string(),
    }
}

/// Keeps `LinnetSource` `name` in `namespace` current: writes its spec once, then its status
/// after each change of `state` that changes it, until the channel closes.
pub async fn publish(
    client: Client,
    namespace: String,
    name: String,
    spec: LinnetSourceSpec,
    read: impl Fn() -> SourceStatus,
    mut changed: tokio::sync::watch::Receiver<()>,
) {
    let api: Api<LinnetSource> = Api::namespaced(client, &namespace);
    let params = PatchParams::apply(MANAGER).force();
    let mut generation = None;
    let mut written: Option<LinnetSourceStatus> = None;
    loop {
        // A failed write is tried again after RETRY, or at once on the next change.
        let mut failed = false;
        if generation.is_none() {
            let object = LinnetSource::new(&name, spec.clone());
            match api.patch(&name, &params, &Patch::Apply(&object)).await {
                Ok(o) => {
                    generation = o.metadata.generation;
                    written = o.status;
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!(source = %name, %namespace, error = %crate::error::kube_message(&e), "cannot write LinnetSource; check RBAC for linnetsources")
                }
            }
        }
        if generation.is_some() {
            let status = status_of(
                &read(),
                generation,
                written.as_ref(),
                jiff::Timestamp::now(),
            );
            if written.as_ref() != Some(&status) {
                let patch = serde_json::json!({
                    "apiVersion": crate::api::API_VERSION,
                    "kind": "LinnetSource",
                    "status": status,
                });
                match api
                    .patch_status(&name, &params, &Patch::Apply(&patch))
                    .await
                {
                    Ok(_) => written = Some(status),
                    // Deleted (or its CRD reinstalled): make it again.
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        generation = None;
                        written = None;
                        failed = true;
                    }
                    Err(e) => {
                        failed = true;
                        tracing::warn!(source = %name, %namespace, error = %crate::error::kube_message(&e), "cannot write LinnetSource status; check RBAC for linnetsources/status")
                    }
                }
            }
        }
        let wait = async {
            if !failed {
                changed.changed().await.is_ok()
            } else {
                let _ = tokio::time::timeout(RETRY, changed.changed()).await;
                true
            }
        };
        if !wait.await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> SourceStatus {
        let mut state = SourceStatus {
            source: "default".into(),
            revision: Some("abc123".into()),
            last_sync: Some("2026-11-24T01:00:00Z".into()),
            objects: 4,
            ..Default::default()
        };
        state.set_degraded();
        state
    }

    #[test]
    fn a_clean_sync_is_ready_and_a_new_poll_writes_nothing() {
        let t0 = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let first = status_of(&state(), Some(1), None, t0);
        let ready = &first.conditions[0];
        assert_eq!(
            (
                ready.type_.as_str(),
                ready.status.as_str(),
                ready.reason.as_str()
            ),
            ("Ready", "True", "Synced")
        );
        assert_eq!(first.objects, 4);
        // A later sync of the same revision only moves last_sync: the status stays equal.
        let mut later = state();
        later.last_sync = Some("2026-11-24T02:00:00Z".into());
        let t1 = jiff::Timestamp::from_second(1_800_003_600).unwrap();
        assert_eq!(status_of(&later, Some(1), Some(&first), t1), first);
    }

    #[test]
    fn an_error_makes_it_not_ready_with_the_first_error_and_a_new_sync_time() {
        let t0 = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let first = status_of(&state(), Some(1), None, t0);
        let mut broken = state();
        broken.revision = Some("def456".into());
        broken.last_sync = Some("2026-11-24T02:00:00Z".into());
        broken.sync_errors = vec!["Service shop/web: apps/web.yaml:30:1: forbidden".into()];
        broken.set_degraded();
        let t1 = jiff::Timestamp::from_second(1_800_003_600).unwrap();
        let next = status_of(&broken, Some(1), Some(&first), t1);
        let ready = &next.conditions[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "SyncErrors")
        );
        assert!(
            ready.message.contains("apps/web.yaml:30:1"),
            "{}",
            ready.message
        );
        assert_eq!(ready.last_transition_time.0, t1);
        assert_eq!(
            next.last_sync_time.as_ref().unwrap().0.to_string(),
            "2026-11-24T02:00:00Z"
        );
        let mut unreachable = broken.clone();
        unreachable.last_error = Some("cannot reach https://git.example/x.git: timed out".into());
        let third = status_of(&unreachable, Some(1), Some(&next), t1);
        assert_eq!(third.conditions[0].reason, "SyncFailed");
    }

    #[test]
    fn the_ready_metric_is_the_ready_condition() {
        let t0 = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let mut spec_error = state();
        spec_error.spec_errors = vec!["apps/web.yaml:3:1: unknown field".into()];
        spec_error.set_degraded();
        let unreachable = SourceStatus {
            last_error: Some("timed out".into()),
            ..state()
        };
        let never_synced = SourceStatus::default();
        for s in [state(), spec_error, unreachable, never_synced] {
            let ready = status_of(&s, Some(1), None, t0).conditions[0].status == "True";
            assert_eq!(s.is_ready(), ready, "{s:?}");
        }
    }

    #[test]
    fn a_restart_while_the_remote_fails_keeps_the_last_applied_revision_and_count() {
        // Issue 47: after a restart, `kubectl get lsrc` showed no revision and 0 objects while
        // the cluster still ran the last good revision.
        let t0 = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let synced = status_of(&state(), Some(1), None, t0);
        assert!(synced.revision.is_some() && synced.objects > 0);
        let restarted = SourceStatus {
            revision: None,
            objects: 0,
            last_error: Some("cannot reach https://git.example/x.git: timed out".into()),
            ..state()
        };
        let after = status_of(&restarted, Some(1), Some(&synced), t0);
        assert_eq!(after.revision, synced.revision);
        assert_eq!(after.objects, synced.objects);
        assert_eq!(after.conditions[0].reason, "SyncFailed");
        // A new agent with no object before it shows what it knows: nothing yet.
        let fresh = status_of(&restarted, Some(1), None, t0);
        assert_eq!((fresh.revision, fresh.objects), (None, 0));
    }
}
