//! The source loop: wakes on the poll timer (with jitter), a verified webhook, a local file
//! change or the drift timer; looks at the source; syncs what changed; and keeps the
//! agent's [`AgentState`] (for `/status`, `/readyz` and the LinnetSource object).
//!
//! Inputs: the wake-ups, the source, and the rollout stores (for the spec-error statuses).
//! Outputs: applies and prunes through the [`Syncer`], the state, and error statuses for
//! the commit-status task.

mod told;
mod wakers;

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
use wakers::{Trigger, Wakers, Woken};

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

/// What the loop carries from one step to the next.
struct Progress {
    local_snapshot: SpecSnapshot,
    /// The revision synced last.
    synced: Option<String>,
    /// Whether the last sync attempt succeeded; a failed one is retried even without a change.
    last_sync_ok: bool,
    backoff: DefaultBackoff,
    said: Said,
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
    pub async fn run(self, syncer: Syncer, source: Source, wake_rx: WakeReceiver) -> Result<()> {
        let (remote, _watcher, changes) = match source {
            Source::Remote(remote) => (Some(remote), None, mpsc::channel(1).1),
            Source::Local { watcher, changes } => (None, Some(watcher), changes),
        };
        let mut wakers = Wakers::new(
            self.config.drift_interval,
            wake_rx,
            changes,
            self.edited.clone(),
            crate::runtime::shutdown_signal(),
        );
        let mut progress = Progress {
            local_snapshot: SpecSnapshot::with_render(self.config.render.clone()),
            synced: None,
            last_sync_ok: false,
            backoff: DefaultBackoff::default(),
            said: Said::default(),
        };
        let heartbeat = crate::liveness::process().register("source loop");
        loop {
            heartbeat.beat();
            crate::liveness::hang_if_asked("source loop").await;
            // One span per step, the child of the webhook that woke it (issue 71): the fetch,
            // the render and the apply below are its children.
            let step = tracing::info_span!(
                "sync",
                trigger = tracing::field::Empty,
                revision = tracing::field::Empty
            );
            let trigger = match wakers.next(&step).await {
                Woken::Step(trigger) => trigger,
                Woken::Idle => continue,
                Woken::Shutdown => return Ok(()),
            };
            let started = Instant::now();
            let found = self
                .look(
                    remote.as_ref(),
                    &mut progress,
                    trigger.announced.clone(),
                    &step,
                )
                .await;
            let found = self
                .or_last_synced(found, &trigger, remote.as_ref(), &syncer, &mut progress)
                .instrument(step.clone())
                .await?;
            let source_failed = found.is_err();
            let outcome = match found {
                Ok(Found::Nothing) => Ok(()),
                Ok(Found::SameSpecs { revision }) => {
                    progress.synced = Some(revision);
                    Ok(())
                }
                Ok(Found::Specs { revision, specs }) => {
                    step.record("revision", revision.as_str());
                    let full = trigger.drift_due;
                    let result = self
                        .sync(&syncer, &revision, &specs, full, &mut progress.said)
                        .instrument(step.clone())
                        .await;
                    progress.last_sync_ok = result.is_ok();
                    if result.is_ok() {
                        progress.synced = Some(revision);
                    }
                    result
                }
                Err(e) => Err(e),
            };
            self.state.set_ready();
            let delay = self.after_step(outcome, source_failed, &mut progress).await;
            wakers.poll_at = tokio::time::Instant::now() + delay;
            self.state
                .publish_metrics(&self.metrics, &self.config.source_name);
            tracing::debug!(took = ?started.elapsed(), "source step done");
        }
    }

    /// Looks at the remote (or the directory) for what changed since the last sync.
    async fn look(
        &self,
        remote: Option<&Arc<Remote>>,
        progress: &mut Progress,
        announced: Option<String>,
        step: &tracing::Span,
    ) -> std::result::Result<Found, SourceError> {
        let Some(remote) = remote else {
            // Reading the tree may render units (seconds, within --render-timeout): the
            // runtime's other tasks move to other threads meanwhile.
            let (snapshot, ok) = (&mut progress.local_snapshot, progress.last_sync_ok);
            return tokio::task::block_in_place(|| {
                step.in_scope(|| look_at_local(snapshot, &self.config, ok))
            });
        };
        let synced = progress.synced.clone();
        let looked = look_at_remote(
            remote.clone(),
            &self.config,
            &self.metrics,
            synced,
            announced,
        )
        .instrument(step.clone())
        .await;
        match looked.history {
            Some((tip, History::Rewritten { previous })) => {
                self.history_rewritten(previous, tip).await;
            }
            Some((_, History::FastForward)) => self.history_fast_forward(),
            Some((tip, History::Unknown { previous })) if !self.config.refuse_history_rewrites => {
                tracing::info!(%tip, %previous, "cannot tell whether the new tip descends from the last one (not within the history fetched); applied, as --refuse-history-rewrites is off");
            }
            // Refused: the look's error says why.
            Some((_, History::Unknown { .. })) | None => {}
        }
        looked.found
    }

    /// Git did not move, but the cluster may have: the last synced specs, compared in full on
    /// the drift timer; only the rollouts found edited, when that woke the loop.
    async fn or_last_synced(
        &self,
        found: std::result::Result<Found, SourceError>,
        trigger: &Trigger,
        remote: Option<&Arc<Remote>>,
        syncer: &Syncer,
        progress: &mut Progress,
    ) -> Result<std::result::Result<Found, SourceError>> {
        let due = (trigger.drift_due || trigger.edited_due) && progress.last_sync_ok;
        let (Ok(Found::Nothing), Some(revision), true) = (&found, &progress.synced, due) else {
            return Ok(found);
        };
        let specs = match remote {
            Some(remote) => match remote.state.lock() {
                Ok(mut s) => s.snapshot.spec_set(),
                Err(_) => {
                    let poisoned = std::io::Error::other("source state poisoned");
                    return Err(Error::Runtime(poisoned));
                }
            },
            None => progress.local_snapshot.spec_set(),
        };
        if trigger.drift_due {
            let revision = revision.clone();
            return Ok(Ok(Found::Specs { revision, specs }));
        }
        self.put_back_edited(syncer, revision, &specs).await;
        Ok(Ok(Found::Nothing))
    }

    /// Says how the step went (an error once per change of error), and returns when the
    /// source is looked at next: the poll interval, or sooner with backoff after an error.
    async fn after_step(
        &self,
        outcome: std::result::Result<(), SourceError>,
        source_failed: bool,
        progress: &mut Progress,
    ) -> Duration {
        let poll_interval = self.config.poll_interval;
        let said = &mut progress.said;
        let error = match outcome {
            Ok(()) => {
                if said.loop_error.take().is_some() {
                    tracing::info!("source synced again");
                }
                progress.backoff.reset();
                self.state.update(|s| s.last_error = None);
                return with_jitter(poll_interval);
            }
            Err(error) => error,
        };
        // Git's own messages may quote the URL, with whatever credentials it holds.
        let message = crate::text::redact_credentials(&error.to_string());
        // A failed look at the source is made again within MAX_ERROR_RETRY, so a host that
        // answers again is synced from soon after (a look that fails costs one connection); a
        // failed sync backs off further, up to 30 s.
        let most = if source_failed {
            MAX_ERROR_RETRY
        } else {
            Duration::from_secs(30)
        };
        let delay = progress
            .backoff
            .next()
            .unwrap_or(most)
            .min(most)
            .min(poll_interval);
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
        let reason = error.metric_label().into();
        self.metrics
            .sync_errors
            .get_or_create(&ReasonLabel { reason })
            .inc();
        delay
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
        if !self.config.allow_empty {
            // Most likely a wrong --path (or specs moved away): applying "nothing" would prune
            // everything this source (or that path) applied.
            let selection = &self.config.load.selection;
            let empty = match specs.is_empty() {
                true => selection.to_string(),
                false => selection
                    .holding_nothing(specs.files.iter().map(String::as_str))
                    .join(","),
            };
            if !empty.is_empty() {
                return Err(SourceError::NoSpecs {
                    path: empty,
                    revision: revision.to_string(),
                });
            }
        }
        self.say_spec_errors(revision, specs, said).await;
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
        self.record_sync(revision, specs, &report, started, said);
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

    /// Says the revision's spec errors (each once, when it starts or changes), as an event
    /// on the source, and as error statuses on the commits of the files that have them.
    async fn say_spec_errors(&self, revision: &str, specs: &SpecSet, said: &mut Said) {
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
        // Hooks left out on purpose are no fault: said at debug, where `validate` notes them.
        for e in specs.left_out.iter().take(LOGGED_SPEC_ERRORS) {
            tracing::debug!(revision, document = %e, "left out, not applied");
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
    }

    /// The sync's outcome in the metrics, the log (object errors once each) and the state.
    fn record_sync(
        &self,
        revision: &str,
        specs: &SpecSet,
        report: &crate::sync::SyncReport,
        started: Instant,
        said: &mut Said,
    ) {
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
    }
}
