//! The task behind revert commits and pull requests: follows the rollouts, and for each one
//! rolled back with `onFailure.revert` puts the good image back in its spec file, as a commit
//! on the followed branch or as a pull request from a branch of its own
//! (`linnet/revert/<namespace>/<name>/<failed commit>`). [`super::revert`] says what,
//! [`super::push`] pushes it (never forced), [`super::pull_request`] talks to the host.
//!
//! A revert that Git no longer needs, and one that cannot be made, is not tried again until
//! the rollout changes; a failed push or call is, with a backoff. A pull request is found
//! again by its branch after a restart (one per failure), and closed once Git moved on: the
//! rollout is no longer rolled back from that commit (a person changed the image, or a later
//! failure has its own pull request).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::commit_status::CommitStatusConfig;
use super::promotion::{self, Promotion};
use super::pull_request::PullRequests;
use super::push::StatusWriter;
use super::revert::{self, Revert};
use super::reverter::{Job, Key, Outcome, Reverter};
use crate::api::RevertMode;
use crate::source::git::GitRemote;
use crate::telemetry::{Metrics, ResultLabel};
use crate::watch::rollouts::Subscription;

/// Where and as whom reverts are written.
#[derive(Clone, Debug)]
pub struct RevertConfig {
    /// The followed repository and branch (the one the specs come from).
    pub remote: GitRemote,
    /// The reverter's own clone.
    pub cache_dir: PathBuf,
    pub author_name: String,
    pub author_email: String,
    /// How long one fetch-and-push may take.
    pub timeout: Duration,
    /// The Git host's API, for pull requests (the commit statuses' host and token).
    pub host: Option<CommitStatusConfig>,
    /// `--promotion-auto-merge`: promotions whose `promoteTo.autoMerge` is set are merged.
    pub promotion_auto_merge: bool,
    /// The fleet as last read (`--fleet`): whether a revert may edit a shared base.
    pub fleet: Option<FleetSnapshots>,
    /// This cluster's name (`--cluster`): in the branch of each of its pull requests.
    pub cluster: String,
}

/// The fleet's snapshots as the fleet loop reads them.
pub type FleetSnapshots =
    tokio::sync::watch::Receiver<Option<Arc<crate::plan::fleet::FleetSnapshot>>>;

/// `revert` as this cluster's, let edit a base the fleet's overlays share when the fleet says so.
fn for_this_cluster(revert: Option<Revert>, config: &RevertConfig) -> Option<Revert> {
    let mut r = revert?;
    r.cluster = named_cluster(&config.cluster);
    let snapshot = config.fleet.as_ref().and_then(|f| f.borrow().clone());
    r.shared_base = snapshot
        .is_some_and(|s| s.reverts_shared_base((r.kind, r.namespace.as_str(), r.name.as_str())));
    Some(r)
}

/// `cluster` unless it is the name of an agent without `--cluster`.
fn named_cluster(cluster: &str) -> Option<String> {
    (cluster != revert::DEFAULT_CLUSTER).then(|| cluster.to_string())
}

/// What a job is about: a rollout's revert, or its promotion to the next environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lane {
    Revert,
    Promote,
}

/// The first wait after a failure that may pass; it doubles up to [`MAX_RETRY`].
const RETRY: Duration = Duration::from_secs(2);
const MAX_RETRY: Duration = Duration::from_secs(120);

/// Which reverts and promotions to make and which pull requests to close, and which were
/// dealt with.
struct Reverts {
    pending: BTreeMap<(Key, Lane), Job>,
    /// The last job dealt with per rollout and lane (made, not needed, or impossible): the
    /// same one is not tried again.
    settled: BTreeMap<(Key, Lane), Job>,
    /// Rollouts whose revert pull requests were looked for since the start (found, opened or
    /// closed): a rollout seen for the first time is looked for once.
    looked: BTreeSet<Key>,
    due: Option<Instant>,
    retries: crate::retry::Retries,
}

impl Default for Reverts {
    fn default() -> Self {
        Reverts {
            pending: BTreeMap::new(),
            settled: BTreeMap::new(),
            looked: BTreeSet::new(),
            due: None,
            retries: crate::retry::Retries::new(RETRY, MAX_RETRY),
        }
    }
}

impl Reverts {
    /// The rollout `key` asks for revert `wanted` now; `pull_requests` when it uses them.
    fn offer(&mut self, key: Key, wanted: Option<Revert>, pull_requests: bool, now: Instant) {
        let lane = (key.clone(), Lane::Revert);
        let job = match wanted.map(Job::Revert) {
            Some(job) if self.settled.get(&lane) == Some(&job) => None,
            Some(job) => Some(job),
            None => {
                let had_one = self.settled.remove(&lane).is_some_and(
                    |j| matches!(j, Job::Revert(r) if r.mode == RevertMode::PullRequest),
                );
                // After a restart, an open pull request may be left from before: looked for once.
                (pull_requests && (had_one || !self.looked.contains(&key))).then_some(Job::Close)
            }
        };
        match job {
            Some(job) => {
                self.looked.insert(key);
                self.pending.insert(lane, job);
                self.due.get_or_insert(now);
            }
            None => {
                if self
                    .pending
                    .get(&lane)
                    .is_some_and(|j| matches!(j, Job::Revert(_)))
                {
                    self.pending.remove(&lane);
                }
            }
        }
    }

    /// The rollout `key` asks for promotion `wanted` now. A rollout that no longer asks (a new
    /// canary) leaves its pull request open: what it proposes still passed.
    fn offer_promotion(&mut self, key: Key, wanted: Option<Promotion>, now: Instant) {
        let lane = (key, Lane::Promote);
        match wanted.map(Job::Promote) {
            Some(job) if self.settled.get(&lane) != Some(&job) => {
                self.pending.insert(lane, job);
                self.due.get_or_insert(now);
            }
            Some(_) => {}
            None => {
                self.pending.remove(&lane);
            }
        }
    }

    /// Whether a revert, a promotion or a pull request's closing waits for `key`.
    fn has_job(&self, key: &Key) -> bool {
        let lanes = (key.clone(), Lane::Revert)..=(key.clone(), Lane::Promote);
        self.pending.range(lanes).next().is_some()
    }

    fn take(&mut self) -> Vec<((Key, Lane), Job)> {
        self.due = None;
        std::mem::take(&mut self.pending).into_iter().collect()
    }

    fn settle(&mut self, lane: (Key, Lane), job: Job) {
        self.retries.reset();
        if !matches!(job, Job::Close) {
            self.settled.insert(lane, job);
        }
    }

    /// A failure that may pass: tried again after a backoff, unless the rollout asked for
    /// something else meanwhile.
    fn retry(&mut self, lane: (Key, Lane), job: Job, now: Instant) {
        let wait = self.retries.wait();
        self.pending.entry(lane).or_insert(job);
        self.due = Some(self.due.map_or(now + wait, |d| d.max(now + wait)));
    }
}

/// Follows this source's rollouts (`changes`) and makes their reverts, until the process ends.
pub async fn run(
    changes: Subscription,
    config: RevertConfig,
    metrics: Arc<Metrics>,
    events: crate::events::EventRecorders,
) {
    let mut reverter = reverter(&config);
    let mut changes = wanted(changes);
    let mut reverts = Reverts::default();
    // Each rollout's reference, for its events.
    let mut regarding: BTreeMap<Key, k8s_openapi::api::core::v1::ObjectReference> = BTreeMap::new();
    loop {
        let wait = super::sleep_until_due(reverts.due);
        tokio::select! {
            change = changes.next() => {
                let Some(w) = change else { return };
                let now = Instant::now();
                let revert = for_this_cluster(w.revert, &config);
                reverts.offer(w.key.clone(), revert, w.pull_requests, now);
                reverts.offer_promotion(w.key.clone(), w.promotion, now);
                // Only a rollout with a job needs its reference, for the job's event: one for
                // every rollout was 0.4 MB of the heap at 1,000 (issue 51).
                if reverts.has_job(&w.key) || regarding.contains_key(&w.key) {
                    regarding.insert(w.key, w.regarding);
                }
            }
            () = wait => {
                if let Some(host) = &reverter.host {
                    host.forget_lists();
                }
                for (lane, job) in reverts.take() {
                    let outcome = reverter.run(&lane.0, &job).await;
                    let result = match lane.1 {
                        Lane::Revert => outcome.label().to_string(),
                        Lane::Promote => format!("promotion_{}", outcome.label()),
                    };
                    metrics.revert_commits.get_or_create(&ResultLabel { result }).inc();
                    log(&lane, &outcome);
                    if let (Some((warning, reason, note)), Some(object)) =
                        (event(&lane.1, &job, &outcome), regarding.get(&lane.0))
                    {
                        events.publish_note(object, warning, reason, &note).await;
                    }
                    if let Outcome::Failed { retry: true, .. } = outcome {
                        reverts.retry(lane, job, Instant::now());
                    } else {
                        reverts.settle(lane, job);
                    }
                }
            }
        }
    }
}

/// The writer of reverts and promotions: its Git clone opened on first use, and its Git
/// host's pull requests if one is configured.
fn reverter(config: &RevertConfig) -> Reverter {
    let host = match config.host.clone().map(PullRequests::new).transpose() {
        Ok(host) => host,
        Err(e) => {
            tracing::error!(error = %e, "revert pull requests are off");
            None
        }
    };
    Reverter {
        open: {
            let c = config.clone();
            Arc::new(move || {
                StatusWriter::open(
                    &c.cache_dir,
                    c.remote.clone(),
                    &c.author_name,
                    &c.author_email,
                )
                .map(|w| w.with_timeout(c.timeout))
            })
        },
        writer: None,
        host,
        auto_merge: config.promotion_auto_merge,
        cluster: named_cluster(&config.cluster),
    }
}

/// What each rollout's change asks of Git, for both kinds, as one stream.
fn wanted(changes: Subscription) -> impl futures::Stream<Item = Wanted> + Unpin {
    let sets = changes
        .statefulsets
        .map(|c| {
            let o = c.object();
            Wanted {
                regarding: kube::Resource::object_ref(o.as_ref(), &()),
                key: key("CanaryStatefulSet", &o.metadata),
                revert: revert::for_statefulset(o),
                pull_requests: uses_pull_requests(o.spec.on_failure.as_ref()),
                promotion: promotion::for_statefulset(o),
            }
        })
        .boxed();
    let deploys = changes
        .deployments
        .map(|c| {
            let o = c.object();
            Wanted {
                regarding: kube::Resource::object_ref(o.as_ref(), &()),
                key: key("CanaryDeployment", &o.metadata),
                revert: revert::for_deployment(o),
                pull_requests: uses_pull_requests(o.spec.on_failure.as_ref()),
                promotion: promotion::for_deployment(o),
            }
        })
        .boxed();
    futures::stream::select(sets, deploys)
}

/// What a rollout's change asks of Git.
struct Wanted {
    regarding: k8s_openapi::api::core::v1::ObjectReference,
    key: Key,
    revert: Option<Revert>,
    pull_requests: bool,
    promotion: Option<Promotion>,
}

/// The event a job's outcome is worth on its rollout: (warning, reason, note). Retries and
/// jobs that found nothing to do are not.
fn event(lane: &Lane, job: &Job, outcome: &Outcome) -> Option<(bool, &'static str, String)> {
    let promotion = *lane == Lane::Promote;
    match (job, outcome) {
        (Job::Revert(r), Outcome::Committed(commit)) => Some((
            false,
            "RevertCommitted",
            format!(
                "committed {} back to {} ({commit}): Stable again once synced",
                r.good, r.path
            ),
        )),
        (
            Job::Revert(r),
            Outcome::PullRequest {
                url, opened: true, ..
            },
        ) => Some((
            false,
            "RevertPullRequestOpened",
            format!(
                "{url} puts {} back in {}; merging it makes the rollout Stable",
                r.good, r.path
            ),
        )),
        (
            Job::Promote(p),
            Outcome::PullRequest {
                url, opened: true, ..
            },
        ) => Some((
            false,
            "PromotionPullRequestOpened",
            format!("{url} gives {} {} in {}", p.target, p.image, p.place()),
        )),
        (Job::Promote(p), Outcome::Merged { url }) => Some((
            false,
            "PromotionPullRequestMerged",
            format!(
                "merged {url} (autoMerge): {} gets {} in {}; its own canary starts once synced",
                p.target,
                p.image,
                p.place()
            ),
        )),
        (_, Outcome::Closed(n)) if *n > 0 => Some((
            false,
            if promotion {
                "PromotionPullRequestClosed"
            } else {
                "RevertPullRequestClosed"
            },
            format!("closed {n} pull request(s) that Git no longer needs"),
        )),
        (
            _,
            Outcome::Failed {
                error,
                retry: false,
                ..
            },
        ) => Some((
            true,
            if promotion {
                "PromotionFailed"
            } else {
                "RevertFailed"
            },
            crate::text::redact_credentials(error),
        )),
        _ => None,
    }
}

/// Says what a job did, and what it means for the rollout.
fn log((key, lane): &(Key, Lane), outcome: &Outcome) {
    let rollout = format!("{}/{}", key.1, key.2);
    let promotion = *lane == Lane::Promote;
    match outcome {
        Outcome::Committed(commit) => {
            tracing::info!(%commit, %rollout, "reverted the image in Git: the rollout is Stable again once this commit is synced");
        }
        Outcome::Unchanged if promotion => {
            tracing::debug!(%rollout, "the next environment runs the image already; no promotion");
        }
        Outcome::Unchanged => {
            tracing::debug!(%rollout, "Git no longer asks for the rolled-back image; nothing to revert");
        }
        Outcome::PullRequest {
            url, opened: true, ..
        } if promotion => {
            tracing::info!(%url, %rollout, "opened a promotion pull request: merging it gives the next environment this image");
        }
        Outcome::PullRequest {
            url, opened: true, ..
        } => {
            tracing::info!(%url, %rollout, "opened a revert pull request: merging it makes the rollout Stable again");
        }
        Outcome::PullRequest {
            url, opened: false, ..
        } => {
            tracing::debug!(%url, %rollout, "the pull request is open");
        }
        Outcome::Closed(n) => {
            tracing::debug!(%rollout, closed = n, "looked for revert pull requests Git no longer needs");
        }
        Outcome::Merged { url } => {
            tracing::info!(%url, %rollout, "merged the promotion pull request (autoMerge): the next environment's canary starts once it is synced");
        }
        Outcome::Declined => {
            tracing::info!(%rollout, "a person closed this pull request; it is not opened again");
        }
        Outcome::Failed {
            error, retry: true, ..
        } => {
            tracing::warn!(%rollout, error = %crate::text::redact_credentials(error), "could not write the change to Git; tried again later");
        }
        Outcome::Failed { error, .. } if promotion => {
            tracing::warn!(%rollout, error = %crate::text::redact_credentials(error), "no promotion pull request until the rollout changes");
        }
        Outcome::Failed { error, .. } => {
            tracing::warn!(%rollout, error = %crate::text::redact_credentials(error), "no revert: the rollout stays rolled back until the image changes in Git");
        }
    }
}

fn uses_pull_requests(on_failure: Option<&crate::api::OnFailure>) -> bool {
    on_failure.is_some_and(|f| f.revert == RevertMode::PullRequest)
}

fn key(kind: &'static str, meta: &kube::api::ObjectMeta) -> Key {
    (
        kind,
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revert(failed: &str) -> Revert {
        Revert {
            path: "apps/redis.yaml".into(),
            kind: "CanaryStatefulSet",
            namespace: "demo".into(),
            name: "redis".into(),
            failed: failed.into(),
            good: "redis:7.2".into(),
            why: "rolled back".into(),
            mode: crate::api::RevertMode::Commit,
            revision: None,
            shared_base: false,
            cluster: None,
        }
    }

    fn redis() -> Key {
        ("CanaryStatefulSet", "demo".into(), "redis".into())
    }

    #[test]
    fn only_a_rollout_with_a_job_has_one() {
        let mut r = Reverts::default();
        let now = Instant::now();
        let other: Key = ("CanaryStatefulSet", "default".into(), "web".into());
        assert!(!r.has_job(&redis()));
        r.offer(redis(), Some(revert("redis:7.4")), false, now);
        assert!(r.has_job(&redis()));
        assert!(!r.has_job(&other));
        r.offer(redis(), None, false, now);
        assert!(!r.has_job(&redis()), "the revert is no longer asked for");
    }

    #[test]
    fn a_revert_dealt_with_is_not_made_again_but_a_new_failure_is() {
        let t0 = Instant::now();
        let mut r = Reverts::default();
        r.offer(redis(), Some(revert("redis:7.4")), false, t0);
        assert_eq!(r.due, Some(t0));
        let batch = r.take();
        assert_eq!(batch.len(), 1);
        r.settle((redis(), Lane::Revert), Job::Revert(revert("redis:7.4")));
        // Every later change of the same rolled-back rollout: nothing to do.
        r.offer(redis(), Some(revert("redis:7.4")), false, t0);
        assert!(r.take().is_empty());
        // The next image fails too: a new revert.
        r.offer(redis(), Some(revert("redis:7.6")), false, t0);
        assert_eq!(r.take().len(), 1);
    }

    #[test]
    fn a_failed_push_is_retried_after_a_backoff_unless_the_rollout_moved_on() {
        let t0 = Instant::now();
        let mut r = Reverts::default();
        r.offer(redis(), Some(revert("redis:7.4")), false, t0);
        let (key, job) = r.take().remove(0);
        r.retry(key, job, t0);
        let due = r.due.map(|d| d - t0);
        assert!(due >= Some(RETRY) && due <= Some(RETRY * 2), "{due:?}");
        // The rollout is no longer rolled back (a person changed the image): dropped.
        r.offer(redis(), None, false, t0);
        assert!(r.take().is_empty());
    }

    #[test]
    fn pull_requests_are_looked_for_once_after_a_start_and_closed_when_git_moves_on() {
        let t0 = Instant::now();
        let mut r = Reverts::default();
        // A Stable rollout that uses pull requests, seen first after a start: one look, in
        // case a pull request was left open while the agent was away.
        r.offer(redis(), None, true, t0);
        assert_eq!(r.take(), vec![((redis(), Lane::Revert), Job::Close)]);
        r.offer(redis(), None, true, t0);
        assert!(r.take().is_empty());
        // It fails: a pull request; later it is no longer rolled back: closed.
        let mut pr = revert("redis:7.4");
        pr.mode = RevertMode::PullRequest;
        r.offer(redis(), Some(pr.clone()), true, t0);
        let (key, job) = r.take().remove(0);
        r.settle(key, job);
        r.offer(redis(), Some(pr), true, t0);
        assert!(r.take().is_empty());
        r.offer(redis(), None, true, t0);
        assert_eq!(r.take(), vec![((redis(), Lane::Revert), Job::Close)]);
        // Commit mode never closes anything.
        r.offer(redis(), None, false, t0);
        assert!(r.take().is_empty());
    }
}
