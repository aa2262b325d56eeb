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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::commit_status::CommitStatusConfig;
use super::fleet_revert::{self, Settled};
use super::promotion::{self, Promotion};
use super::pull_request::PullRequests;
use super::push::StatusWriter;
use super::revert::{self, Revert};
use super::revert_jobs::{Lane, Reverts};
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
    /// `--git-signing-key`: the commits are signed with it.
    pub signer: Option<std::sync::Arc<crate::writeback::signing::CommitSigner>>,
    /// How long one fetch-and-push may take.
    pub timeout: Duration,
    /// The Git host's API, for pull requests (the commit statuses' host and token).
    pub host: Option<CommitStatusConfig>,
    /// `--promotion-auto-merge`: promotions whose `promoteTo.autoMerge` is set are merged.
    pub promotion_auto_merge: bool,
    /// The fleet as last read (`--fleet`): whether a revert may edit a shared base.
    pub fleet: Option<FleetSnapshots>,
    /// This cluster (`--cluster`, `--cluster-label`): in the branch of each of its pull
    /// requests, and its wave in the fleet.
    pub cluster: crate::api::ClusterIdentity,
}

/// The fleet's snapshots as the fleet loop reads them.
pub type FleetSnapshots =
    tokio::sync::watch::Receiver<Option<Arc<crate::plan::fleet::FleetSnapshot>>>;

/// `revert` as this cluster's, let edit a base the fleet's overlays share when the fleet says so.
fn for_this_cluster(revert: Option<Revert>, config: &RevertConfig) -> Option<Revert> {
    let mut r = revert?;
    r.cluster = named_cluster(&config.cluster.name);
    let snapshot = config.fleet.as_ref().and_then(|f| f.borrow().clone());
    r.shared_base = snapshot
        .is_some_and(|s| s.reverts_shared_base((r.kind, r.namespace.as_str(), r.name.as_str())));
    Some(r)
}

/// `cluster` unless it is the name of an agent without `--cluster`.
fn named_cluster(cluster: &str) -> Option<String> {
    (cluster != revert::DEFAULT_CLUSTER).then(|| cluster.to_string())
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
    // With a fleet, the rollouts settled on their image (and their references, for the
    // events): a failure elsewhere reverts them.
    type Reference = k8s_openapi::api::core::v1::ObjectReference;
    let mut settled: BTreeMap<Key, (Settled, Reference)> = BTreeMap::new();
    let mut fleet = config.fleet.clone();
    loop {
        let wait = super::sleep_until_due(reverts.due);
        tokio::select! {
            change = changes.next() => {
                let Some(w) = change else { return };
                let now = Instant::now();
                let revert = for_this_cluster(w.revert, &config);
                reverts.offer(w.key.clone(), revert, w.pull_requests, now);
                reverts.offer_promotion(w.key.clone(), w.promotion, now);
                let on = w.settled.as_ref().map(|s| s.image.as_str());
                reverts.withdraw_fleet_revert(&w.key, on);
                match w.settled.filter(|_| fleet.is_some()) {
                    Some(s) => {
                        let wanted = fleet_revert_of(&s, fleet.as_ref(), &config.cluster);
                        reverts.offer_fleet_revert(w.key.clone(), wanted, now);
                        settled.insert(w.key.clone(), (s, w.regarding.clone()));
                    }
                    None => {
                        settled.remove(&w.key);
                    }
                }
                // Only a rollout with a job needs its reference, for the job's event: one for
                // every rollout was 0.4 MB of the heap at 1,000 (issue 51).
                if reverts.has_job(&w.key) || regarding.contains_key(&w.key) {
                    regarding.insert(w.key, w.regarding);
                }
            }
            () = fleet_changed(&mut fleet) => {
                let now = Instant::now();
                for (key, (s, object)) in &settled {
                    let wanted = fleet_revert_of(s, fleet.as_ref(), &config.cluster);
                    reverts.offer_fleet_revert(key.clone(), wanted, now);
                    if reverts.has_job(key) {
                        regarding.insert(key.clone(), object.clone());
                    }
                }
            }
            () = wait => {
                if let Some(host) = &reverter.host {
                    host.forget_lists();
                }
                for (lane, job) in reverts.take() {
                    let outcome = reverter.run(&lane.0, &job).await;
                    let result = match lane.1 {
                        Lane::Revert | Lane::FleetRevert => outcome.label().to_string(),
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

/// The fleet revert settled rollout `s` asks for in cluster `me` as the fleet reads now.
fn fleet_revert_of(
    s: &Settled,
    fleet: Option<&FleetSnapshots>,
    me: &crate::api::ClusterIdentity,
) -> Option<Revert> {
    let snapshot = fleet?.borrow().clone()?;
    fleet_revert::fleet_revert(s, &snapshot, me)
}

/// Returns when the fleet is read again; never without a fleet (or once its reader ended).
async fn fleet_changed(fleet: &mut Option<FleetSnapshots>) {
    if let Some(f) = fleet.as_mut()
        && f.changed().await.is_ok()
    {
        return;
    }
    *fleet = None;
    std::future::pending::<()>().await;
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
                .map(|w| w.with_timeout(c.timeout).with_signer(c.signer.clone()))
            })
        },
        writer: None,
        host,
        auto_merge: config.promotion_auto_merge,
        cluster: named_cluster(&config.cluster.name),
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
                settled: applied(&c)
                    .then(|| fleet_revert::settled_statefulset(o))
                    .flatten(),
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
                settled: applied(&c)
                    .then(|| fleet_revert::settled_deployment(o))
                    .flatten(),
            }
        })
        .boxed();
    futures::stream::select(sets, deploys)
}

/// Whether `change` leaves the rollout in the cluster (not a deletion).
fn applied<K>(change: &crate::watch::rollouts::Change<K>) -> bool {
    matches!(change, crate::watch::rollouts::Change::Applied(_))
}

/// What a rollout's change asks of Git.
struct Wanted {
    regarding: k8s_openapi::api::core::v1::ObjectReference,
    key: Key,
    revert: Option<Revert>,
    pull_requests: bool,
    promotion: Option<Promotion>,
    /// The rollout settled on its image, for a fleet's revert.
    settled: Option<Settled>,
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
