//! Notifications (`--notifications-file`): a person hears when a canary starts, waits for
//! approval, fails its analysis, is rolled back or promoted, in Slack, Microsoft Teams,
//! Discord, a signed webhook, or a comment on the pull request that brought the change in.
//!
//! - [`config`]: the receivers, each routed by event and rollout, with its URL in a Secret;
//! - [`events`]: what a rollout's status change tells (pure);
//! - [`payload`]: each service's documented body (pure);
//! - [`queue`]: a receiver's waiting notifications, a lane per rollout (pure);
//! - [`send`]: one task and queue per receiver: spaced, retried with backoff, counted;
//! - [`persist`]: what waits, kept in a ConfigMap for a restart.
//!
//! It reads the shared rollout store's changes like commit statuses do, on the replica that
//! holds the Lease, and never waits on a receiver: a reconcile cannot be held up by one.

pub mod config;
pub mod events;
pub mod payload;
pub mod persist;
pub mod queue;
pub mod send;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::api::{CanaryDeployment, CanaryStatefulSet};
use crate::telemetry::Metrics;
use crate::watch::rollouts::{Change, Subscription};
use crate::writeback::commit_status::CommitStatusConfig;
use config::{NotificationsFile, ReceiverKind};
use events::{Seen, Snapshot};
use send::{Outbox, Target};

/// What the notifications need, checked before the agent starts.
#[derive(Clone, Debug)]
pub struct NotifyConfig {
    pub settings: NotificationsFile,
    /// A private CA the receivers' certificates are checked against, besides the platform's.
    pub ca_file: Option<PathBuf>,
    /// Longest one request may take.
    pub timeout: Duration,
    /// The Git host for `pullRequest` receivers.
    pub commit_status: Option<CommitStatusConfig>,
}

impl NotifyConfig {
    /// Reads `--notifications-file`; a `pullRequest` receiver needs the `--commit-status-*`
    /// host.
    pub fn load(
        path: &std::path::Path,
        ca_file: Option<PathBuf>,
        timeout: Duration,
        commit_status: Option<CommitStatusConfig>,
    ) -> Result<NotifyConfig, config::ConfigError> {
        let settings = config::load(path)?;
        if commit_status.is_none()
            && let Some(r) = settings
                .receivers
                .iter()
                .find(|r| r.kind == ReceiverKind::PullRequest)
        {
            return Err(config::ConfigError::Receiver {
                path: path.display().to_string(),
                receiver: r.name.clone(),
                reason: "a pullRequest receiver comments through the Git host's API: set \
                         --commit-status-provider, --commit-status-api-url, \
                         --commit-status-repo and --commit-status-token-file"
                    .into(),
            });
        }
        Ok(NotifyConfig {
            settings,
            ca_file,
            timeout,
            commit_status,
        })
    }
}

/// Each receiver's outbox.
fn outboxes(
    config: &NotifyConfig,
    metrics: &Arc<Metrics>,
    mut stored: persist::Waiting,
    waiting: &Arc<tokio::sync::watch::Sender<persist::Waiting>>,
) -> Result<Vec<Outbox>, crate::net::CaFileError> {
    // No redirects: a webhook's signed body goes where its URL says, nowhere else.
    let http = crate::net::http_client_no_redirects(config.ca_file.as_deref(), config.timeout)?;
    let commenting = config
        .settings
        .receivers
        .iter()
        .any(|r| r.kind == ReceiverKind::PullRequest);
    let prs = match &config.commit_status {
        Some(cfg) if commenting => Some(Arc::new(
            crate::writeback::pull_request::PullRequests::new(cfg.clone())?,
        )),
        _ => None,
    };
    let mut out = Vec::new();
    for r in &config.settings.receivers {
        let target = match (r.kind, &prs) {
            (ReceiverKind::PullRequest, Some(prs)) => Target::PullRequest(prs.clone()),
            (ReceiverKind::PullRequest, None) => {
                // NotifyConfig::load refused this already.
                tracing::error!(receiver = %r.name, "no Git host to comment on; receiver off");
                continue;
            }
            _ => Target::Http(http.clone()),
        };
        out.push(Outbox::start(
            r.clone(),
            target,
            metrics.clone(),
            stored.remove(&r.name).unwrap_or_default(),
            waiting.clone(),
        ));
    }
    Ok(out)
}

type Key = (&'static str, String, String);

fn key_and_snapshot<R: crate::api::RolloutView>(
    change: &Change<R>,
    analysis: impl Fn(&R) -> &[crate::api::AnalysisRunStatus],
) -> Option<(Key, Option<Snapshot>)> {
    let o = change.object();
    let key = (R::KIND, o.meta().namespace.clone()?, o.meta().name.clone()?);
    match change {
        Change::Deleted(_) => Some((key, None)),
        Change::Applied(o) => Some((key, Snapshot::of(o.as_ref(), analysis(o)))),
    }
}

/// Sends what the rollouts' changes tell to every receiver that wants it, until the changes
/// end. With `store`, what waits is kept there for a restart, and what waited before is sent
/// first.
pub async fn run(
    changes: Subscription,
    config: NotifyConfig,
    metrics: Arc<Metrics>,
    store: Option<persist::Store>,
) {
    let (stored, written) = match &store {
        Some(store) => store.load().await,
        None => (persist::Waiting::new(), None),
    };
    let (waiting, waiting_rx) = tokio::sync::watch::channel(persist::Waiting::new());
    let waiting = Arc::new(waiting);
    if let Some(store) = store {
        crate::liveness::spawn(
            "notifications kept for a restart",
            store.keep(waiting_rx, written),
        );
    }
    let outboxes = match outboxes(&config, &metrics, stored, &waiting) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, "notifications are off");
            // Off, not dead: the agent goes on without them.
            return std::future::pending().await;
        }
    };
    tracing::info!(receivers = outboxes.len(), "notifications on");
    let sets = changes
        .statefulsets
        .filter_map(|c| {
            let k = key_and_snapshot(&c, |o: &CanaryStatefulSet| {
                o.status.as_ref().map_or(&[][..], |s| &s.analysis[..])
            });
            async move { k }
        })
        .boxed();
    let deploys = changes
        .deployments
        .filter_map(|c| {
            let k = key_and_snapshot(&c, |o: &CanaryDeployment| {
                o.status.as_ref().map_or(&[][..], |s| &s.analysis[..])
            });
            async move { k }
        })
        .boxed();
    let mut all = futures::stream::select(sets, deploys);
    let mut seen: HashMap<Key, Seen> = HashMap::new();
    while let Some((key, snapshot)) = all.next().await {
        let Some(now) = snapshot else {
            seen.remove(&key);
            continue;
        };
        let (next, notices) = events::happened(seen.get(&key), &now, jiff::Timestamp::now());
        seen.insert(key, next);
        for notice in notices {
            for outbox in &outboxes {
                if outbox
                    .receiver
                    .wants(notice.event, &notice.namespace, &notice.name)
                {
                    outbox.offer(notice.clone());
                }
            }
        }
    }
}
