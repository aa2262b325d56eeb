//! Write-back: the only module that writes to Git. It commits rollout status files (and, for
//! rollouts that ask for it, revert commits) and posts commit statuses to the Git host, never
//! force-pushes, and never loses a human's commit.
//!
//! - [`status_files`]: the files and commit messages (pure);
//! - [`push`]: commit on top of the branch and push, redoing it on a new tip when rejected;
//! - [`commit_status`]: the Git host's commit statuses (what to post, and posting it);
//! - [`revert`], [`pull_request`] and [`revert_loop`]: revert commits and pull requests that
//!   put a rolled-back rollout's good image back in its spec file (`onFailure.revert`).

pub mod action_branch;
pub mod action_edit;
pub mod commit_status;
pub mod config_carry;
pub mod config_revert;
pub mod fleet_revert;
mod image_edit;
pub mod image_markers;
pub mod image_pull_request;
pub mod image_update;
pub mod promotion;
pub mod promotion_branch;
pub mod pull_request;
pub mod push;
pub mod rendered_edit;
pub mod revert;
mod revert_jobs;
pub mod revert_loop;
mod reverter;
pub mod signing;
pub mod status_files;

pub use reverter::Proposal;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::source::git::GitRemote;
use crate::telemetry::{Metrics, ReasonLabel};
use crate::watch::rollouts::Subscription;
use push::{Pushed, StatusWriter};
use status_files::StatusFile;

/// Where and as whom status files are written.
#[derive(Clone, Debug)]
pub struct WritebackConfig {
    /// The repository; its `branch` is the one written.
    pub remote: GitRemote,
    /// The writer's own clone.
    pub cache_dir: PathBuf,
    pub author_name: String,
    pub author_email: String,
    /// `--git-signing-key`: the commits are signed with it.
    pub signer: Option<std::sync::Arc<crate::writeback::signing::CommitSigner>>,
    /// Changes within this window go into one commit.
    pub interval: Duration,
    /// How long one fetch-and-push may take.
    pub timeout: Duration,
    /// This cluster (`--cluster`, `--cluster-label`): its directory of status files.
    pub cluster: crate::api::ClusterIdentity,
}

/// Gathers status file changes into one write per window. The window opens at the first
/// change after a write, so a steady stream of changes cannot postpone a write for ever.
/// A write carries only the files changed since the last one: its cost follows the change,
/// not the number of rollouts.
#[derive(Debug, Default)]
pub struct Coalescer {
    /// A digest of every rollout's latest file, to tell a change from a repeat. Not the
    /// text: at 1,000 rollouts the texts were 0.85 MB of a 17 MB heap (issue 51).
    latest: BTreeMap<String, FileDigest>,
    /// The files changed since the last write that went through, by path.
    unwritten: BTreeMap<String, StatusFile>,
    due: Option<std::time::Instant>,
}

/// The first 16 bytes of a SHA-256 of a status file's fields.
type FileDigest = [u8; 16];

fn file_digest(file: &StatusFile) -> FileDigest {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    let fields = [file.content.as_str(), &file.summary]
        .into_iter()
        .chain(file.replaces.iter().map(String::as_str));
    for text in fields {
        // Length-prefixed, so that no two lists of fields hash alike.
        h.update((text.len() as u64).to_le_bytes());
        h.update(text.as_bytes());
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    out
}

impl Coalescer {
    /// Records `file`; a file that did not change opens no window.
    pub fn offer(&mut self, file: StatusFile, now: std::time::Instant, window: Duration) {
        let digest = file_digest(&file);
        if self.latest.get(&file.path) != Some(&digest) {
            self.latest.insert(file.path.clone(), digest);
            self.unwritten.insert(file.path.clone(), file);
            self.due.get_or_insert(now + window);
        }
    }

    /// When the next write is due, if one is.
    pub fn due(&self) -> Option<std::time::Instant> {
        self.due
    }

    /// The files to write now (those changed since the last write); closes the window.
    pub fn take(&mut self) -> Vec<StatusFile> {
        self.due = None;
        std::mem::take(&mut self.unwritten).into_values().collect()
    }

    /// A write of `files` failed: they are written again, with whatever changed meanwhile,
    /// at `at`. A file offered since then is newer than the one that failed, and wins.
    pub fn retry_at(&mut self, files: &[StatusFile], at: std::time::Instant) {
        for file in files {
            self.unwritten
                .entry(file.path.clone())
                .or_insert_with(|| file.clone());
        }
        self.due = Some(at);
    }
}

/// Follows this source's rollouts (`changes`, subscribed before their watches started) and
/// keeps their status files in Git, until
/// the process ends. A failure to write never touches a rollout; it is logged, counted, and
/// tried again with the next change or after a backoff.
pub async fn run(changes: Subscription, config: WritebackConfig, metrics: Arc<Metrics>) {
    let open = {
        let c = config.clone();
        move || {
            StatusWriter::open(&c.cache_dir, c.remote, &c.author_name, &c.author_email)
                .map(|w| w.with_timeout(c.timeout).with_signer(c.signer))
        }
    };
    let opened = tokio::task::spawn_blocking(open.clone()).await;
    let mut writer = match opened {
        Ok(Ok(w)) => Some(w),
        Ok(Err(e)) => {
            tracing::error!(error = %crate::text::redact_credentials(&e.to_string()), "write-back is off: cannot open its clone; check --cache-dir");
            // Off, not dead: the agent goes on without it (a supervised task that ends stops it).
            return std::future::pending().await;
        }
        Err(e) => {
            tracing::error!(error = %crate::text::redact_credentials(&e.to_string()), "write-back is off");
            return std::future::pending().await;
        }
    };
    let mut changes = status_file_changes(changes, config.cluster.name.clone());
    // The trace of the latest change offered: the next commit joins it.
    let mut latest_trace: Option<crate::telemetry::trace::Parent> = None;
    let mut pending = Coalescer::default();
    // Who this cluster is, for a fleet's label selectors: in every write, so that a file
    // another writer's commit lost comes back with this cluster's next one (an unchanged file
    // makes no commit).
    let cluster_file = status_files::cluster_file(&config.cluster);
    pending.offer(
        cluster_file.clone(),
        std::time::Instant::now(),
        config.interval,
    );
    let mut failures = Failures {
        backoff: crate::retry::Retries::new(config.interval * 2, config.interval * 64),
        said: None,
    };
    tracing::info!(branch = %config.remote.branch, "writing rollout status to Git");
    loop {
        let wait = sleep_until_due(pending.due());
        tokio::select! {
            change = changes.next() => {
                let Some((file, trace)) = change else { return };
                latest_trace = trace.or(latest_trace);
                pending.offer(file, std::time::Instant::now(), config.interval);
            }
            () = wait => {
                let mut files = pending.take();
                if !files.iter().any(|f| f.path == cluster_file.path) {
                    files.push(cluster_file.clone());
                }
                let attempted = files.clone();
                let result = write_files(&mut writer, open.clone(), files, latest_trace.take()).await;
                if let Some(backoff) = failures.record(result, &metrics) {
                    pending.retry_at(&attempted, std::time::Instant::now() + backoff);
                }
            }
        }
    }
}

/// Each status file a rollout's change asks for, with the trace of the push that led to it
/// (issue 71), for both kinds as one stream.
fn status_file_changes(
    changes: Subscription,
    cluster: String,
) -> impl futures::Stream<Item = (StatusFile, Option<crate::telemetry::trace::Parent>)> + Unpin {
    let cluster: std::sync::Arc<str> = cluster.into();
    let at = cluster.clone();
    let sets = changes
        .statefulsets
        .filter_map(move |c| {
            let cluster = at.clone();
            async move {
                status_files::for_statefulset(c.object(), &cluster)
                    .map(|f| (f, pushed_trace(&**c.object())))
            }
        })
        .boxed();
    let deploys = changes
        .deployments
        .filter_map(move |c| {
            let cluster = cluster.clone();
            async move {
                status_files::for_deployment(c.object(), &cluster)
                    .map(|f| (f, pushed_trace(&**c.object())))
            }
        })
        .boxed();
    futures::stream::select(sets, deploys)
}

/// Writes `files` in one commit, off the async runtime, in a span joined to `trace`. The
/// writer is moved into the write and handed back, so no lock is held while Git is waited
/// for; a write that panicked does not hand it back, and the next one opens it again.
async fn write_files(
    writer: &mut Option<StatusWriter>,
    open: impl FnOnce() -> Result<StatusWriter, crate::source::git::GitError> + Send + 'static,
    files: Vec<StatusFile>,
    trace: Option<crate::telemetry::trace::Parent>,
) -> Result<Pushed, (&'static str, String)> {
    let current = writer.take();
    let span = tracing::info_span!("write-back", files = files.len());
    if let Some(parent) = trace {
        parent.adopt(&span);
    }
    let (w, written) = tokio::task::spawn_blocking(move || {
        let _in = span.enter();
        let mut w = match current {
            Some(w) => w,
            None => open()?,
        };
        let written = w.write(&files);
        Ok::<_, push::WriteError>((w, written))
    })
    .await
    .map_err(|e| ("panic", e.to_string()))?
    .map_err(|e| (e.label(), e.to_string()))?;
    *writer = Some(w);
    written.map_err(|e| (e.label(), e.to_string()))
}

/// The write-back's failures in a row: their backoff, and the reason said last (the same one
/// again is not said again).
struct Failures {
    backoff: crate::retry::Retries,
    said: Option<&'static str>,
}

impl Failures {
    /// Counts and logs a write's result; after a failure, how long until the files are tried
    /// again.
    fn record(
        &mut self,
        result: Result<Pushed, (&'static str, String)>,
        metrics: &Metrics,
    ) -> Option<Duration> {
        match result {
            Ok(Pushed::Unchanged) => None,
            Ok(Pushed::Committed { commit, retries }) => {
                self.backoff.reset();
                if self.said.take().is_some() {
                    tracing::info!("writing status to Git works again");
                }
                metrics.writeback_commits.inc();
                metrics.writeback_push_retries.inc_by(u64::from(retries));
                tracing::info!(%commit, retries, "status written to Git");
                None
            }
            Err((reason, e)) => {
                metrics
                    .writeback_errors
                    .get_or_create(&ReasonLabel {
                        reason: reason.into(),
                    })
                    .inc();
                let backoff = self.backoff.wait();
                let error = crate::text::redact_credentials(&e);
                if self.said.replace(reason) == Some(reason) {
                    tracing::debug!(%error, retry_in = ?backoff, "could not write status to Git, again");
                } else {
                    tracing::warn!(%error, retry_in = ?backoff, "could not write status to Git; rollouts go on, and it is tried again with backoff (said again when the error changes)");
                }
                Some(backoff)
            }
        }
    }
}

/// The trace a rollout's spec was applied in, from its `traceparent` annotation.
/// (The store packs annotations: read them through [`crate::api::packed_meta::metadata`].)
fn pushed_trace<K: crate::api::packed_meta::PacksMeta>(
    rollout: &K,
) -> Option<crate::telemetry::trace::Parent> {
    crate::telemetry::trace::Parent::of_annotations(
        crate::api::packed_meta::metadata(rollout)
            .annotations
            .as_ref(),
    )
}

/// Posts each rollout's state as a commit status, never the same one twice, until the
/// process ends. It runs on its own, so a slow or failing Git host never holds up a rollout.
/// A status the host did not take is posted again after a backoff (the latest one per
/// rollout and commit), so a host that comes back gets the state it missed.
pub struct StatusPoster {
    poster: commit_status::Poster,
    posted: std::collections::HashMap<(String, String), (commit_status::State, String)>,
    /// Statuses not taken yet, by commit and context.
    failed: BTreeMap<(String, String), commit_status::Wanted>,
    /// When `failed` is tried again.
    retry_at: Option<std::time::Instant>,
    /// How long to wait after rounds in a row in which a post failed.
    retries: crate::retry::Retries,
    /// The label of the failure said last: the same one again is not said again.
    failed_with: Option<&'static str>,
    metrics: Arc<Metrics>,
}

/// The first wait before a failed status is posted again; it doubles (with jitter) up to
/// [`MAX_STATUS_RETRY`], so a host that answers again gets what it missed within two minutes.
/// The most of the analysis a pull request body or a revert commit carries: the hosts cap a
/// body (GitHub at 65,536 characters), and a template may have many metrics.
const EVIDENCE_BYTES: usize = 16 * 1024;

const STATUS_RETRY: Duration = Duration::from_secs(1);
const MAX_STATUS_RETRY: Duration = Duration::from_secs(60);

impl StatusPoster {
    pub fn new(
        config: commit_status::CommitStatusConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, crate::net::CaFileError> {
        Ok(StatusPoster {
            poster: commit_status::Poster::new(config)?,
            posted: Default::default(),
            failed: Default::default(),
            retry_at: None,
            retries: crate::retry::Retries::new(STATUS_RETRY, MAX_STATUS_RETRY),
            failed_with: None,
            metrics,
        })
    }

    /// Posts `wanted` unless it is what the commit already shows. While the host is being
    /// backed off from, it is kept for the retry instead: a host that is away would cost a
    /// timeout per change of a rollout's object, and this task posts one status at a time.
    pub async fn offer(&mut self, wanted: commit_status::Wanted) {
        let key = (wanted.sha.clone(), wanted.context.clone());
        let value = (wanted.state, wanted.description.clone());
        if self.posted.get(&key) == Some(&value) {
            self.failed.remove(&key);
            return;
        }
        if self
            .retry_at
            .is_some_and(|at| std::time::Instant::now() < at)
        {
            self.failed.insert(key, wanted);
            return;
        }
        let result = match self.poster.post(&wanted).await {
            Ok(_) => {
                tracing::info!(sha = %wanted.sha, context = %wanted.context, state = ?wanted.state, "commit status posted");
                self.posted.insert(key.clone(), value);
                self.failed.remove(&key);
                self.retries.reset();
                if self.failed_with.take().is_some() {
                    tracing::info!("the Git host takes commit statuses again");
                }
                "posted"
            }
            Err(e) if e.retryable() => {
                let wait = self.retries.wait();
                if self.failed_with.replace(e.label()) == Some(e.label()) {
                    tracing::debug!(sha = %wanted.sha, context = %wanted.context, error = %e, retry_in = ?wait, "could not post the commit status, again");
                } else {
                    tracing::warn!(sha = %wanted.sha, context = %wanted.context, error = %e, retry_in = ?wait, "could not post the commit status; the rollout goes on, and it is posted again with backoff (said again when the error changes)");
                }
                self.retry_at = Some(std::time::Instant::now() + wait);
                self.failed.insert(key, wanted);
                e.label()
            }
            Err(e) => {
                // Asking again would get the same answer (a token without the scope, a commit
                // the host does not have); the rollout's next change tries again.
                tracing::warn!(sha = %wanted.sha, context = %wanted.context, error = %e, "the Git host refused the commit status; the rollout goes on");
                self.failed.remove(&key);
                e.label()
            }
        };
        self.metrics
            .commit_status_posts
            .get_or_create(&crate::telemetry::ResultLabel {
                result: result.to_string(),
            })
            .inc();
    }

    /// When statuses that failed are due to be posted again, if any are waiting.
    pub fn retry_due(&self) -> Option<std::time::Instant> {
        self.retry_at.filter(|_| !self.failed.is_empty())
    }

    /// Posts again every status kept for the retry. After one fails again (the host is still
    /// away), the others are kept for the next, longer, wait.
    pub async fn retry_failed(&mut self) {
        self.retry_at = None;
        for wanted in std::mem::take(&mut self.failed).into_values() {
            self.offer(wanted).await;
        }
    }
}

/// Follows this source's rollouts (their shared stores) and posts their commit statuses;
/// spec errors found by the sync arrive on `errors`.
pub async fn post_commit_statuses(
    changes: Subscription,
    config: commit_status::CommitStatusConfig,
    metrics: Arc<Metrics>,
    errors: tokio::sync::mpsc::Receiver<commit_status::Wanted>,
) {
    let mut poster = match StatusPoster::new(config.clone(), metrics) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "commit statuses are off");
            // Off, not dead: the agent goes on without them (a supervised task that ends stops it).
            return std::future::pending().await;
        }
    };
    let (c1, c2) = (config.clone(), config.clone());
    let sets = changes
        .statefulsets
        .filter_map(move |c| {
            let w = commit_status::wanted_for_statefulset(&c1, c.object());
            async move { w }
        })
        .boxed();
    let deploys = changes
        .deployments
        .filter_map(move |c| {
            let w = commit_status::wanted_for_deployment(&c2, c.object());
            async move { w }
        })
        .boxed();
    // Spec errors found by the sync arrive on `errors`.
    let errors = tokio_stream_from(errors);
    let mut wanted = futures::stream::select(futures::stream::select(sets, deploys), errors);
    loop {
        let retry = sleep_until_due(poster.retry_due());
        tokio::select! {
            w = wanted.next() => match w {
                Some(w) => poster.offer(w).await,
                None => return,
            },
            () = retry => poster.retry_failed().await,
        }
    }
}

/// Sleeps until `due`, or for ever when nothing is due.
async fn sleep_until_due(due: Option<std::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<commit_status::Wanted>,
) -> futures::stream::BoxStream<'static, commit_status::Wanted> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn file(name: &str, phase: &str) -> StatusFile {
        StatusFile {
            path: status_files::path("default", "default", name),
            content: format!("phase: {phase}\n"),
            summary: format!("default/{name} {phase}"),
            replaces: Vec::new(),
        }
    }

    #[test]
    fn changes_within_a_window_make_one_write() {
        let window = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut c = Coalescer::default();
        c.offer(file("redis", "ScalingDownStable"), t0, window);
        c.offer(
            file("redis", "DeployingCanary"),
            t0 + Duration::from_millis(500),
            window,
        );
        c.offer(
            file("web", "Progressing"),
            t0 + Duration::from_millis(900),
            window,
        );
        c.offer(
            file("redis", "CanaryActive"),
            t0 + Duration::from_millis(1900),
            window,
        );
        // The window opened at the first change and does not move.
        assert_eq!(c.due(), Some(t0 + window));
        let files = c.take();
        assert_eq!(files.len(), 2);
        assert!(files.iter().any(|f| f.content == "phase: CanaryActive\n"));
        assert_eq!(c.due(), None);
        // The same content again opens no window.
        c.offer(file("redis", "CanaryActive"), t0 + window, window);
        assert_eq!(c.due(), None);
    }

    #[test]
    fn a_write_carries_only_the_files_changed_since_the_last() {
        // Issue 25: every write compared every rollout's file with the branch, so a push cost
        // grew with the number of rollouts.
        let window = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut c = Coalescer::default();
        for i in 0..100 {
            c.offer(file(&format!("app-{i}"), "Stable"), t0, window);
        }
        assert_eq!(c.take().len(), 100);
        c.offer(file("app-7", "CanaryActive"), t0 + window, window);
        let files = c.take();
        assert_eq!(files.len(), 1);
        // A failed write is tried again with what changed meanwhile.
        c.retry_at(&files, t0 + window * 2);
        c.offer(file("app-8", "CanaryActive"), t0 + window, window);
        assert_eq!(c.due(), Some(t0 + window * 2));
        let again: Vec<String> = c.take().into_iter().map(|f| f.content).collect();
        assert_eq!(again, vec!["phase: CanaryActive\n"; 2]);
        assert!(c.take().is_empty());
    }

    #[test]
    fn a_retry_keeps_a_file_offered_after_the_failed_write() {
        let window = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut c = Coalescer::default();
        c.offer(file("redis", "DeployingCanary"), t0, window);
        let failed = c.take();
        c.offer(file("redis", "CanaryActive"), t0 + window, window);
        c.retry_at(&failed, t0 + window * 2);
        let files = c.take();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].content, "phase: CanaryActive\n");
        // Back to the content that failed: a change again, not a repeat.
        c.offer(file("redis", "DeployingCanary"), t0 + window * 3, window);
        assert_eq!(c.take().len(), 1);
    }

    #[test]
    fn a_file_that_only_moves_from_its_old_path_is_a_change() {
        let window = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut c = Coalescer::default();
        let mut moved = file("redis", "Stable");
        moved.replaces = vec!["old/redis.yaml".into()];
        c.offer(moved, t0, window);
        assert_eq!(c.take().len(), 1);
        c.offer(file("redis", "Stable"), t0 + window, window);
        assert_eq!(c.take().len(), 1, "the same text without `replaces`");
        c.offer(file("redis", "Stable"), t0 + window * 2, window);
        assert!(c.take().is_empty(), "a repeat");
    }
}
