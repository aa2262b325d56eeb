//! The source loop: wakes on the poll timer (with jitter), a verified webhook, a local file
//! change or the drift timer; looks at the source; syncs what changed; and keeps the
//! agent's [`AgentState`] (for `/status`, `/readyz` and the LinnetSource object).
//!
//! Inputs: the wake-ups, the source, and the rollout stores (for the spec-error statuses).
//! Outputs: applies and prunes through the [`Syncer`], the state, and error statuses for
//! the commit-status task.

mod told;

use tracing::Instrument as _;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::DefaultBackoff;
use tokio::sync::mpsc;

use super::config::AgentConfig;
use super::look::{Found, History, Remote, SourceError, look_at_local, look_at_remote};
use super::said::SaidErrors;
use super::state::{AgentState, kept_errors, now_rfc3339};
use crate::source::git::GitError;
use crate::source::hooks::WakeReceiver;
use crate::source::snapshot::SpecSnapshot;
use crate::specs::SpecSet;
use crate::sync::Syncer;
use crate::telemetry::{ActionLabel, Metrics, ReasonLabel, RevisionLabel};
use crate::watch::rollouts::RolloutStores;
use crate::writeback::commit_status::Wanted;
use crate::{Error, Result};

/// `interval` plus up to 10% so that many agents do not poll in step.
fn with_jitter(interval: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    interval + interval.mul_f64(f64::from(nanos % 1000) / 10_000.0)
}

/// Spec errors logged per sync; the rest are counted (the status keeps 100).
const LOGGED_SPEC_ERRORS: usize = 10;
/// Object errors logged one by one, when each starts or changes; `linnet status` lists more.
const LOGGED_OBJECT_ERRORS: usize = 100;

/// What the loop's log has said of errors that persist ([`SaidErrors`]).
#[derive(Default)]
struct Said {
    specs: SaidErrors,
    objects: SaidErrors,
    /// The loop's own error, as last logged.
    loop_error: Option<String>,
}

/// The longest wait before a failed look at the source is made again.
const MAX_ERROR_RETRY: Duration = Duration::from_secs(10);

/// Where the loop reads specs from.
pub enum Source {
    /// A remote's mirror; polled and woken by webhooks.
    Remote(Arc<Remote>),
    /// A directory, and the changes of its files (the watcher is kept while the loop runs).
    Local {
        watcher: notify::RecommendedWatcher,
        changes: mpsc::Receiver<()>,
    },
}

/// What the loop reads and writes besides the source.
pub struct SourceLoop {
    pub config: AgentConfig,
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    pub state: Arc<AgentState>,
    pub rollouts: RolloutStores,
    /// Error statuses for specs that fail to load, to the commit-status task.
    pub spec_error_statuses: Option<mpsc::Sender<Wanted>>,
    /// Rollouts a controller found edited in the cluster.
    pub edited: Arc<crate::sync::EditedRollouts>,
    /// Events about the source, on its LinnetSource.
    pub events: crate::events::EventRecorders,
}

impl SourceLoop {
    /// Runs until SIGINT or SIGTERM.
    pub async fn run(
        self,
        syncer: Syncer,
        source: Source,
        mut wake_rx: WakeReceiver,
    ) -> Result<()> {
        let config = &self.config;
        let (remote, _watcher, mut changes) = match source {
            Source::Remote(remote) => (Some(remote), None, mpsc::channel(1).1),
            Source::Local { watcher, changes } => (None, Some(watcher), changes),
        };
        let mut local_snapshot = SpecSnapshot::with_render(config.render.clone());
        // Drift is looked for on this timer, whether or not Git moved.
        let mut drift_check = tokio::time::interval(config.drift_interval);
        drift_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        drift_check.reset();
        let mut backoff = DefaultBackoff::default();
        let mut synced: Option<String> = None;
        // Whether the last sync attempt succeeded; a failed one is retried even without a change.
        let mut last_sync_ok = false;
        let mut delay;
        // When the remote is looked at next: kept across the idle heartbeats.
        let mut poll_at = tokio::time::Instant::now();
        let mut said = Said::default();
        let heartbeat = crate::liveness::process().register("source loop");
        let mut idle_beat = tokio::time::interval(crate::liveness::IDLE_BEAT);
        idle_beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown = std::pin::pin!(super::shutdown_signal());
        let edited = self.edited.clone();

        loop {
            heartbeat.beat();
            crate::liveness::hang_if_asked("source loop").await;
            // The commit a webhook announced, if any: when it is not the one fetched last, the
            // fetch goes ahead without first asking the remote for its tip (one round trip less).
            let mut announced: Option<String> = None;
            let mut drift_due = false;
            let mut edited_due = false;
            // One span per step, the child of the webhook that woke it (issue 71): the fetch,
            // the render and the apply below are its children.
            let step = tracing::info_span!(
                "sync",
                trigger = tracing::field::Empty,
                revision = tracing::field::Empty
            );
            tokio::select! {
                _ = tokio::time::sleep_until(poll_at) => {
                    step.record("trigger", "poll");
                    tracing::debug!("poll");
                }
                Some(wake) = wake_rx.next() => {
                    step.record("trigger", "webhook");
                    if let Some(parent) = &wake.parent {
                        parent.adopt(&step);
                    }
                    announced = wake.after;
                    match wake.host {
                        Some(host) => tracing::info!(host = host.name(), after = ?announced, "woken by webhook"),
                        None => tracing::info!("webhook callers were turned away (busy); looking at the remote in case one was a push"),
                    }
                }
                Some(()) = changes.recv() => {
                    step.record("trigger", "disk");
                    tracing::info!("files changed on disk");
                }
                _ = drift_check.tick() => {
                    step.record("trigger", "drift");
                    tracing::debug!("drift interval: comparing every object with the cluster");
                    drift_due = true;
                }
                _ = edited.notified() => {
                    step.record("trigger", "edited");
                    tracing::info!("a rollout was edited in the cluster: putting Git's spec back");
                    edited_due = true;
                }
                _ = &mut shutdown => {
                    tracing::info!("shutting down");
                    return Ok(());
                }
                _ = idle_beat.tick() => continue,
            }
            let started = Instant::now();
            let found = match &remote {
                Some(remote) => {
                    let looked = look_at_remote(
                        remote.clone(),
                        &self.config,
                        &self.metrics,
                        synced.clone(),
                        announced,
                    )
                    .instrument(step.clone())
                    .await;
                    match looked.history {
                        Some((tip, History::Rewritten { previous })) => {
                            self.history_rewritten(previous, tip).await;
                        }
                        Some((_, History::FastForward)) => self.history_fast_forward(),
                        Some((tip, History::Unknown { previous }))
                            if !self.config.refuse_history_rewrites =>
                        {
                            tracing::info!(%tip, %previous, "cannot tell whether the new tip descends from the last one (not within the history fetched); applied, as --refuse-history-rewrites is off");
                        }
                        // Refused: the look's error says why.
                        Some((_, History::Unknown { .. })) => {}
                        None => {}
                    }
                    looked.found
                }
                // Reading the tree may render units (seconds, within --render-timeout): the
                // runtime's other tasks move to other threads meanwhile.
                None => tokio::task::block_in_place(|| {
                    step.in_scope(|| look_at_local(&mut local_snapshot, &self.config, last_sync_ok))
                }),
            };
            // Git did not move, but the cluster may have: the last synced specs, compared in
            // full on the drift timer; only the rollouts found edited, when that woke us.
            let last_synced = |local_snapshot: &mut SpecSnapshot| match &remote {
                Some(remote) => match remote.state.lock() {
                    Ok(mut s) => Ok(s.snapshot.spec_set()),
                    Err(_) => Err(Error::Runtime(std::io::Error::other(
                        "source state poisoned",
                    ))),
                },
                None => Ok(local_snapshot.spec_set()),
            };
            let found = match (found, &synced) {
                (Ok(Found::Nothing), Some(revision)) if drift_due && last_sync_ok => {
                    Ok(Found::Specs {
                        revision: revision.clone(),
                        specs: last_synced(&mut local_snapshot)?,
                    })
                }
                (Ok(Found::Nothing), Some(revision)) if edited_due && last_sync_ok => {
                    let specs = last_synced(&mut local_snapshot)?;
                    self.put_back_edited(&syncer, revision, &specs)
                        .instrument(step.clone())
                        .await;
                    Ok(Found::Nothing)
                }
                (other, _) => other,
            };
            let source_failed = found.is_err();
            let outcome = match found {
                Ok(Found::Nothing) => Ok(()),
                Ok(Found::SameSpecs { revision }) => {
                    synced = Some(revision);
                    Ok(())
                }
                Ok(Found::Specs { revision, specs }) => {
                    step.record("revision", revision.as_str());
                    let result = self
                        .sync(&syncer, &revision, &specs, drift_due, &mut said)
                        .instrument(step.clone())
                        .await;
                    last_sync_ok = result.is_ok();
                    if result.is_ok() {
                        synced = Some(revision);
                    }
                    result
                }
                Err(e) => Err(e),
            };
            self.state.set_ready();
            match outcome {
                Ok(()) => {
                    if said.loop_error.take().is_some() {
                        tracing::info!("source synced again");
                    }
                    backoff.reset();
                    delay = with_jitter(config.poll_interval);
                    self.state.update(|s| s.last_error = None);
                }
                Err(error) => {
                    // Git's own messages may quote the URL, with whatever credentials it holds.
                    let message = crate::text::redact_credentials(&error.to_string());
                    // A failed look at the source is made again within MAX_ERROR_RETRY, so a host
                    // that answers again is synced from soon after (a look that fails costs one
                    // connection); a failed sync backs off further, up to 30 s.
                    let most = if source_failed {
                        MAX_ERROR_RETRY
                    } else {
                        Duration::from_secs(30)
                    };
                    delay = backoff
                        .next()
                        .unwrap_or(most)
                        .min(most)
                        .min(config.poll_interval);
                    // Said once per change of error; each retry of the same one at debug.
                    let news = said.loop_error.as_deref() != Some(message.as_str());
                    said.loop_error = Some(message.clone());
                    if !news {
                        tracing::debug!(error = %message, retry_in = ?delay, "still failing; retrying with backoff");
                    } else if source_failed || matches!(error, SourceError::NoSpecs { .. }) {
                        tracing::warn!(error = %message, retry_in = ?delay, "source not synced; the cluster keeps the last good state (retried with backoff, said again when the error changes)");
                    } else {
                        tracing::warn!(error = %message, retry_in = ?delay, "some objects of the revision were not applied (the others were); retrying them with backoff (said again when the error changes)");
                    }
                    if let SourceError::Git(GitError::Unverified { .. }) = &error {
                        self.source_event("Unverified", &message).await;
                    }
                    self.state.update(|s| s.last_error = Some(message));
                    self.metrics
                        .sync_errors
                        .get_or_create(&ReasonLabel {
                            reason: error.metric_label().into(),
                        })
                        .inc();
                }
            }
            poll_at = tokio::time::Instant::now() + delay;
            self.state
                .publish_metrics(&self.metrics, &self.config.source_name);
            tracing::debug!(took = ?started.elapsed(), "source step done");
        }
    }

    /// Puts back the rollouts their controllers found edited in the cluster, as the last
    /// synced `revision` has them; a failure is retried by the drift check.
    async fn put_back_edited(&self, syncer: &Syncer, revision: &str, specs: &SpecSet) {
        let keys = self.edited.take();
        if keys.is_empty() {
            return;
        }
        let report = syncer.put_back_edited(specs, revision, &keys).await;
        for (key, e) in &report.errors {
            tracing::warn!(object = %key, error = %e, "could not put Git's spec of an edited rollout back; the next drift check tries again");
        }
        tracing::info!(
            revision,
            edited = keys.len(),
            updated = report.updated.len(),
            created = report.created.len(),
            errors = report.errors.len(),
            "put edited rollouts back"
        );
    }

    #[tracing::instrument(name = "apply", skip_all, fields(revision, full))]
    async fn sync(
        &self,
        syncer: &Syncer,
        revision: &str,
        specs: &SpecSet,
        full: bool,
        said: &mut Said,
    ) -> Result<(), SourceError> {
        if specs.is_empty() && !self.config.allow_empty {
            // Most likely a wrong --path (or specs moved away): applying "nothing" would prune
            // everything this source applied.
            return Err(SourceError::NoSpecs {
                path: self.config.path.clone(),
                revision: revision.to_string(),
            });
        }
        let news = said.specs.news(
            specs.errors.iter().map(|e| (e.to_string(), String::new())),
            LOGGED_SPEC_ERRORS,
        );
        for (e, _) in &news.changed {
            tracing::error!(error = %e, "spec error; this file is not applied until it is fixed");
        }
        for e in &news.cleared {
            tracing::info!(error = %e, "spec error gone (fixed, or its file removed)");
        }
        if !news.changed.is_empty() && specs.errors.len() > LOGGED_SPEC_ERRORS {
            tracing::error!(
                more = specs.errors.len() - LOGGED_SPEC_ERRORS,
                "more spec errors; linnet status lists the first 100"
            );
        }
        if let Some(first) = specs.errors.first() {
            self.source_event(
                "SpecErrors",
                &format!(
                    "{} error(s) in the specs of {revision} block their files (the rest is applied); first: {first}",
                    specs.errors.len()
                ),
            )
            .await;
        }
        if !specs.errors.is_empty()
            && let (Some(tx), Some(cfg)) = (&self.spec_error_statuses, &self.config.commit_status)
        {
            tokio::spawn(super::spec_errors::spec_error_statuses(
                self.rollouts.clone(),
                cfg.clone(),
                revision.to_string(),
                specs.errors.clone(),
                tx.clone(),
            ));
        }
        let started = Instant::now();
        let report = if full {
            syncer.sync(specs, revision, self.config.prune).await
        } else {
            syncer
                .sync_changes(specs, revision, self.config.prune)
                .await
        };
        // Rollouts found edited meanwhile: their spec back whole, fields Git leaves out included.
        self.put_back_edited(syncer, revision, specs).await;
        self.metrics
            .sync_duration
            .observe(started.elapsed().as_secs_f64());
        for (action, n) in [
            ("create", report.created.len()),
            ("update", report.updated.len()),
            ("prune", report.pruned.len()),
        ] {
            if n > 0 {
                self.metrics
                    .objects_applied
                    .get_or_create(&ActionLabel {
                        action: action.into(),
                    })
                    .inc_by(n as u64);
            }
        }
        let news = said.objects.news(
            report
                .errors
                .iter()
                .map(|(key, e)| (key.to_string(), e.clone())),
            LOGGED_OBJECT_ERRORS,
        );
        for (object, e) in &news.changed {
            tracing::warn!(%object, error = %e, "object not applied; retried with backoff");
        }
        for object in &news.cleared {
            tracing::info!(%object, "object applied (or gone from Git) after an error");
        }
        tracing::info!(
            revision,
            created = report.created.len(),
            updated = report.updated.len(),
            unchanged = report.unchanged,
            pruned = report.pruned.len(),
            errors = report.errors.len(),
            full = report.full,
            took = ?started.elapsed(),
            "synced"
        );
        // The revision is what the cluster now has, even when some objects failed: those are
        // listed beside it (and retried), the rest of the commit was applied.
        self.state.update(|s| {
            s.objects = specs.objects.len();
            (s.spec_errors, s.spec_error_count) =
                kept_errors(specs.errors.iter().map(ToString::to_string));
            s.revision = Some(revision.to_string());
            s.last_sync = Some(now_rfc3339());
            (s.sync_errors, s.sync_error_count) =
                kept_errors(report.errors.iter().map(|(key, e)| format!("{key}: {e}")));
            s.set_degraded();
            if report.errors.is_empty() {
                s.last_error = None;
            }
        });
        self.metrics.synced_revision.clear();
        self.metrics
            .synced_revision
            .get_or_create(&RevisionLabel {
                revision: revision.to_string(),
            })
            .set(1);
        if report.errors.is_empty() {
            Ok(())
        } else {
            let (key, e) = &report.errors[0];
            Err(SourceError::Sync {
                count: report.errors.len(),
                first: format!("{key}: {e}"),
            })
        }
    }
}
