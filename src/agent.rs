//! `linnet agent`: the runtime wiring of source -> specs -> sync, and the rollout
//! controllers beside it. It serves the webhook routes (and `/healthz`, `/readyz` for the
//! kubelet) on `--listen`, and `/metrics`, `/status`, `/healthz`, `/readyz` on
//! `--admin-listen` (localhost unless opted in), and wakes on a poll timer (with jitter), a
//! verified webhook, or a local file change. Every decision about what to apply is
//! made from Git and the cluster, so a restarted agent simply syncs again.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::DefaultBackoff;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::serve::{ServeLimits, serve};
use crate::source::git::{GitError, GitMirror, GitRemote};
use crate::source::hooks::{self, HookSettings};
use crate::source::local;
use crate::source::snapshot::SpecSnapshot;
use crate::specs::{LoadOptions, SpecSet};
use crate::sync::Syncer;
use crate::telemetry::{ActionLabel, Metrics, ReasonLabel, RevisionLabel};
use crate::{Error, Result};

/// Where specs come from.
#[derive(Clone, Debug)]
pub enum SourceConfig {
    /// A remote repository, mirrored into `cache_dir`.
    Remote {
        remote: GitRemote,
        cache_dir: PathBuf,
    },
    /// A plain directory on disk, watched for changes.
    Local { dir: PathBuf },
}

/// Everything the agent needs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub source: SourceConfig,
    /// Directory inside the repository that holds the specs.
    pub path: String,
    /// Sync a revision whose path holds no spec (otherwise an error that changes nothing).
    pub allow_empty: bool,
    pub poll_interval: Duration,
    /// How old the last full comparison with the cluster may be before drift is looked for
    /// again, whether or not Git moved.
    pub drift_interval: Duration,
    /// Longest a single Git operation may take.
    pub git_timeout: Duration,
    /// Webhooks and probes; faces the Git host.
    pub listen: SocketAddr,
    /// Metrics, status and probes; for the cluster's own tools.
    pub admin_listen: SocketAddr,
    /// Only the probes, for the kubelet, apart from the webhook port's callers.
    pub probe_listen: Option<SocketAddr>,
    /// What each listener lets its callers hold.
    pub serve_limits: ServeLimits,
    pub webhook: Option<HookSettings>,
    pub load: LoadOptions,
    pub source_name: String,
    pub prune: bool,
    /// Whose rights Git's objects are applied with.
    pub apply_as: crate::sync::ApplyAs,
    /// Take over existing objects linnet did not apply.
    pub adopt: bool,
    /// Leader election; `None` runs without it (a single replica).
    pub leader: Option<LeaderConfig>,
    /// Status files written to Git; `None` writes none.
    pub writeback: Option<crate::writeback::WritebackConfig>,
    /// Commit statuses posted to the Git host; `None` posts none.
    pub commit_status: Option<crate::writeback::commit_status::CommitStatusConfig>,
    /// Reconciles in flight at once per controller; 0 means no limit.
    pub max_concurrent_reconciles: u16,
    /// What analysis from Git may reach: files and URLs.
    pub analysis: crate::controller::analysis::Policy,
    /// Where the agent keeps its LinnetSource: its own namespace.
    pub state_namespace: String,
}

/// The Lease that decides which replica acts.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub duration: Duration,
}

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

fn now_rfc3339() -> String {
    jiff::Timestamp::try_from(SystemTime::now())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// `interval` plus up to 10% so that many agents do not poll in step.
fn with_jitter(interval: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    interval + interval.mul_f64(f64::from(nanos % 1000) / 10_000.0)
}

struct RemoteState {
    mirror: GitMirror,
    snapshot: SpecSnapshot,
    fetched: Option<git2::Oid>,
    /// Tips fetched lately: a webhook announcing one of them is not a reason to fetch.
    fetched_tips: std::collections::VecDeque<git2::Oid>,
}

/// The longest wait before a failed look at the source is made again.
const MAX_ERROR_RETRY: Duration = Duration::from_secs(10);

/// How many fetched tips [`RemoteState::fetched_tips`] keeps.
const REMEMBERED_TIPS: usize = 64;

/// What a look at the source found.
enum Found {
    /// Nothing new since the last successful sync: no fetch, no parse, no API call.
    Nothing,
    /// A new revision whose specs equal those last synced (e.g. a status-only commit).
    SameSpecs { revision: String },
    /// Specs to sync at a revision.
    Specs { revision: String, specs: SpecSet },
}

struct Shared {
    config: AgentConfig,
    /// Error statuses for specs that fail to load, to the commit-status task.
    spec_error_statuses: Option<mpsc::Sender<crate::writeback::commit_status::Wanted>>,
    client: kube::Client,
    metrics: Arc<Metrics>,
    status: RwLock<SourceStatus>,
    /// Told after every change of `status`, for the LinnetSource object.
    status_changed: tokio::sync::watch::Sender<()>,
    ready: AtomicBool,
}

/// Runs the agent until SIGINT or SIGTERM.
pub async fn run(
    config: AgentConfig,
    client: kube::Client,
    kube_config: kube::Config,
) -> Result<()> {
    let (error_tx, error_rx) = mpsc::channel(64);
    let shared = Arc::new(Shared {
        spec_error_statuses: config.commit_status.is_some().then_some(error_tx),
        client: client.clone(),
        metrics: Arc::new(Metrics::default()),
        status: RwLock::new(SourceStatus {
            source: config.source_name.clone(),
            ..SourceStatus::default()
        }),
        status_changed: tokio::sync::watch::Sender::new(()),
        ready: AtomicBool::new(false),
        config,
    });
    let config = &shared.config;

    let (waker, mut wake_rx) = hooks::wake_channel();
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(shared.clone());
    let mut hooks_app = probes.clone();
    if let Some(settings) = &config.webhook {
        hooks_app = hooks_app.merge(hooks::router(
            settings.clone(),
            waker.clone(),
            shared.metrics.clone(),
        ));
    }
    let admin_app = probes.clone().merge(
        Router::new()
            .route("/metrics", get(metrics))
            .route("/status", get(status))
            .with_state(shared.clone()),
    );
    let hooks_refusals = config.webhook.as_ref().map(|_| waker.clone());
    let mut listeners = vec![
        ("webhooks", config.listen, hooks_app, hooks_refusals),
        ("metrics and status", config.admin_listen, admin_app, None),
    ];
    if let Some(addr) = config.probe_listen {
        listeners.push(("probes", addr, probes, None));
    }
    for (what, addr, app, on_refused) in listeners {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Io {
                path: format!("{addr} ({what})").into(),
                source,
            })?;
        let bound = listener.local_addr().map_err(|source| Error::Io {
            path: "listener".into(),
            source,
        })?;
        tracing::info!(addr = %bound, serves = what, webhooks = config.webhook.is_some(), "listening");
        tokio::spawn(serve(listener, app, config.serve_limits, on_refused));
    }

    // A local directory is watched; a remote is polled and woken by webhooks.
    let (_watcher, mut changes) = match &config.source {
        SourceConfig::Local { dir } => {
            let (w, rx) =
                local::watch(dir.clone(), Duration::from_millis(200)).map_err(|e| Error::Io {
                    path: dir.clone(),
                    source: std::io::Error::other(e),
                })?;
            (Some(w), rx)
        }
        SourceConfig::Remote { .. } => (None, mpsc::channel(1).1),
    };
    let remote = match &config.source {
        SourceConfig::Remote { remote, cache_dir } => {
            let (remote, cache_dir) = (remote.clone(), cache_dir.clone());
            let mirror = tokio::task::spawn_blocking(move || GitMirror::open(&cache_dir, remote))
                .await
                .map_err(|e| Error::Runtime(std::io::Error::other(e)))?
                .map_err(|e| {
                    Error::Runtime(std::io::Error::other(crate::text::redact_credentials(
                        &e.to_string(),
                    )))
                })?;
            Some(Arc::new(Remote {
                state: Mutex::new(RemoteState {
                    mirror,
                    snapshot: SpecSnapshot::default(),
                    fetched: None,
                    fetched_tips: Default::default(),
                }),
                in_flight: Arc::new(tokio::sync::Semaphore::new(1)),
            }))
        }
        SourceConfig::Local { .. } => None,
    };
    if let Some(leader) = &config.leader {
        wait_for_leadership(client.clone(), leader).await?;
    }
    // The rollout controllers run beside the sync loop; they act on what the sync applied.
    let controllers = Arc::new(crate::controller::Context::new(
        client.clone(),
        &config.source_name,
        shared.metrics.clone(),
        config.max_concurrent_reconciles,
        config.analysis.clone(),
    ));
    tokio::spawn(crate::controller::statefulset::run(
        controllers.clone(),
        shutdown_signal(),
    ));
    tokio::spawn(crate::controller::deployment::run(
        controllers.clone(),
        shutdown_signal(),
    ));
    tokio::spawn(crate::controller::unmanaged::run(
        controllers.clone(),
        shutdown_signal(),
    ));
    {
        let (url, branch) = match &config.source {
            SourceConfig::Remote { remote, .. } => (
                crate::text::redact_credentials(&remote.url),
                remote.branch.clone(),
            ),
            SourceConfig::Local { dir } => (dir.display().to_string(), String::new()),
        };
        let spec = crate::api::LinnetSourceSpec {
            url,
            branch,
            path: config.path.clone(),
        };
        let reader = shared.clone();
        tokio::spawn(crate::source::object::publish(
            client.clone(),
            config.state_namespace.clone(),
            config.source_name.clone(),
            spec,
            move || reader.status.read().map(|s| s.clone()).unwrap_or_default(),
            shared.status_changed.subscribe(),
        ));
    }
    if let Some(commit_status) = &config.commit_status {
        tokio::spawn(crate::writeback::post_commit_statuses(
            client.clone(),
            controllers.selector(),
            commit_status.clone(),
            shared.metrics.clone(),
            error_rx,
        ));
    }
    if let Some(writeback) = &config.writeback {
        tokio::spawn(crate::writeback::run(
            client.clone(),
            controllers.selector(),
            writeback.clone(),
            shared.metrics.clone(),
        ));
    }
    let mut local_snapshot = SpecSnapshot::default();
    let syncer = Syncer::new(
        client,
        &config.source_name,
        config.load.policy.allowed_namespaces.clone(),
    )
    .with_drift_interval(config.drift_interval)
    .with_apply_as(config.apply_as.clone(), kube_config)
    .with_adopt(config.adopt)
    .with_policy(config.load.policy.clone());
    // Drift is looked for on this timer, whether or not Git moved.
    let mut drift_check = tokio::time::interval(config.drift_interval);
    drift_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    drift_check.reset();
    let mut backoff = DefaultBackoff::default();
    let mut synced: Option<String> = None;
    // Whether the last sync attempt succeeded; a failed one is retried even without a change.
    let mut last_sync_ok = false;
    let mut delay = Duration::ZERO;
    let mut shutdown = std::pin::pin!(shutdown_signal());

    loop {
        // The commit a webhook announced, if any: when it is not the one fetched last, the
        // fetch goes ahead without first asking the remote for its tip (one round trip less).
        let mut announced: Option<String> = None;
        let mut drift_due = false;
        tokio::select! {
            _ = tokio::time::sleep(delay) => tracing::debug!("poll"),
            Some(wake) = wake_rx.next() => {
                announced = wake.after;
                match wake.host {
                    Some(host) => tracing::info!(host = host.name(), after = ?announced, "woken by webhook"),
                    None => tracing::info!("webhook callers were turned away (busy); looking at the remote in case one was a push"),
                }
            }
            Some(()) = changes.recv() => tracing::info!("files changed on disk"),
            _ = drift_check.tick() => {
                tracing::debug!("drift interval: comparing every object with the cluster");
                drift_due = true;
            }
            _ = &mut shutdown => {
                tracing::info!("shutting down");
                return Ok(());
            }
        }
        let started = Instant::now();
        let found = match &remote {
            Some(remote) => {
                look_at_remote(remote.clone(), &shared, synced.clone(), announced).await
            }
            None => look_at_local(&mut local_snapshot, &shared, last_sync_ok),
        };
        // Git did not move, but the cluster may have: the last synced specs, compared in full.
        let found = match found {
            Ok(Found::Nothing) if drift_due && last_sync_ok => match &synced {
                Some(revision) => Ok(Found::Specs {
                    revision: revision.clone(),
                    specs: match &remote {
                        Some(remote) => match remote.state.lock() {
                            Ok(s) => s.snapshot.spec_set(),
                            Err(_) => {
                                return Err(Error::Runtime(std::io::Error::other(
                                    "source state poisoned",
                                )));
                            }
                        },
                        None => local_snapshot.spec_set(),
                    },
                }),
                None => Ok(Found::Nothing),
            },
            other => other,
        };
        let source_failed = found.is_err();
        let outcome = match found {
            Ok(Found::Nothing) => Ok(()),
            Ok(Found::SameSpecs { revision }) => {
                synced = Some(revision);
                Ok(())
            }
            Ok(Found::Specs { revision, specs }) => {
                let result = sync(&syncer, &shared, &revision, &specs, drift_due).await;
                last_sync_ok = result.is_ok();
                if result.is_ok() {
                    synced = Some(revision);
                }
                result
            }
            Err(e) => Err(e),
        };
        shared.ready.store(true, Ordering::Relaxed);
        match outcome {
            Ok(()) => {
                backoff.reset();
                delay = with_jitter(config.poll_interval);
                if let Ok(mut s) = shared.status.write() {
                    s.last_error = None;
                }
                shared.status_changed.send_replace(());
            }
            Err(message) => {
                // Git's own messages may quote the URL, with whatever credentials it holds.
                let message = crate::text::redact_credentials(&message);
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
                tracing::warn!(error = %message, retry_in = ?delay, "source not synced; the cluster keeps the last good state");
                if let Ok(mut s) = shared.status.write() {
                    s.last_error = Some(message);
                }
                shared.status_changed.send_replace(());
            }
        }
        tracing::debug!(took = ?started.elapsed(), "source step done");
    }
}

/// Blocks until this replica holds the Lease, then watches it: a replica that loses the
/// Lease exits at once (all rollout state is in the cluster, so the next leader carries on),
/// which is the surest way never to have two replicas acting.
async fn wait_for_leadership(client: kube::Client, leader: &LeaderConfig) -> Result<()> {
    use kube_lease_manager::LeaseManagerBuilder;
    let duration = leader.duration.as_secs().max(2);
    let manager = LeaseManagerBuilder::new(client, &leader.name)
        .with_namespace(&leader.namespace)
        .with_identity(&leader.identity)
        .with_duration(duration)
        .with_grace((duration / 3).clamp(1, 5))
        .build()
        .await
        .map_err(|e| {
            let why = match &e {
                kube_lease_manager::LeaseManagerError::KubeError(k) => {
                    crate::error::kube_message_hinted(
                        k,
                        "; linnet's identity may not use leases: grant it in deploy/rbac.yaml",
                    )
                }
                other => other.to_string(),
            };
            Error::Cluster(format!(
                "cannot use Lease {}/{} for leader election: {why}; check that the namespace \
                 exists and RBAC allows leases",
                leader.namespace, leader.name
            ))
        })?;
    let (mut holding, task) = manager.watch().await;
    tracing::info!(lease = %format!("{}/{}", leader.namespace, leader.name), identity = %leader.identity, "waiting to hold the lease; another replica may be acting");
    while !*holding.borrow_and_update() {
        if holding.changed().await.is_err() {
            return Err(Error::Runtime(std::io::Error::other(
                "the lease manager stopped before this replica got the lease",
            )));
        }
    }
    tracing::info!(lease = %leader.name, identity = %leader.identity, "holding the lease; this replica acts");
    tokio::spawn(async move {
        let _task = task;
        loop {
            if holding.changed().await.is_err() || !*holding.borrow_and_update() {
                tracing::error!("lost the lease; exiting so that only the new holder acts");
                std::process::exit(1);
            }
        }
    });
    Ok(())
}

/// The remote and its mirror, shared by the looks at the source.
struct Remote {
    /// The mirror's local state: the snapshot, and a handle that reads fetched objects. Its
    /// lock is never held across a network call.
    state: Mutex<RemoteState>,
    /// Held by the one network call to the remote under way. A call past --git-timeout keeps
    /// it until libgit2 gives up, and no second call is started beside it.
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// What the network half of a look found.
enum RemoteTip {
    /// The remote's tip is the revision synced last.
    Unchanged,
    /// This tip is in the mirror (fetched now, or before).
    At(git2::Oid),
}

async fn look_at_remote(
    remote: Arc<Remote>,
    shared: &Arc<Shared>,
    synced: Option<String>,
    announced: Option<String>,
) -> Result<Found, String> {
    let started = Instant::now();
    let result = ask_remote(&remote, shared, synced.clone(), announced).await;
    shared
        .metrics
        .fetch_duration
        .observe(started.elapsed().as_secs_f64());
    let found = match result {
        Ok(RemoteTip::Unchanged) => Ok(Found::Nothing),
        Ok(RemoteTip::At(tip)) => {
            let path = shared.config.path.clone();
            let load = shared.config.load.clone();
            let remote = remote.clone();
            // Local work only: the objects are in the mirror already.
            tokio::task::spawn_blocking(move || read_revision(&remote, tip, &path, &load, synced))
                .await
                .map_err(|e| ("panic", format!("Git task failed: {e}")))
                .and_then(|r| r.map_err(|e| (e.label(), e.to_string())))
        }
        Err(e) => Err(e),
    };
    found.map_err(|(label, message)| {
        shared
            .metrics
            .fetch_errors
            .get_or_create(&ReasonLabel {
                reason: label.to_string(),
            })
            .inc();
        message
    })
}

/// Asks the remote for its tip and fetches it when it is new, within --git-timeout, holding
/// no lock while it waits.
async fn ask_remote(
    remote: &Arc<Remote>,
    shared: &Arc<Shared>,
    synced: Option<String>,
    announced: Option<String>,
) -> Result<RemoteTip, (&'static str, String)> {
    let timeout = shared.config.git_timeout;
    let (dir, git_remote, previous, announced_is_new) = {
        let s = remote
            .state
            .lock()
            .map_err(|_| ("git", "source state poisoned".to_string()))?;
        let announced = announced.and_then(|a| git2::Oid::from_str(&a).ok());
        // A webhook for a tip fetched before (a replay, a redelivery, an old push) only asks
        // the remote for its tip; wake-ups coalesce, so a newer push behind it is found then.
        (
            s.mirror.dir().to_path_buf(),
            s.mirror.remote().clone(),
            s.fetched,
            announced.is_some_and(|a| !s.fetched_tips.contains(&a)),
        )
    };
    let url = crate::text::redact_credentials(&git_remote.url);
    let Ok(permit) = remote.in_flight.clone().try_acquire_owned() else {
        return Err((
            "busy",
            format!(
                "the previous call to {url} has not returned after --git-timeout ({timeout:?}); \
                 waiting for libgit2 to give it up before starting another"
            ),
        ));
    };
    let job = tokio::task::spawn_blocking(move || -> Result<RemoteTip, GitError> {
        let _permit = permit;
        let mut mirror = GitMirror::open_existing(&dir, git_remote)?;
        mirror.set_deadline(Some(timeout));
        if announced_is_new {
            return Ok(RemoteTip::At(mirror.fetch()?));
        }
        let tip = mirror.remote_tip()?;
        if Some(tip) == previous && synced.as_deref() == Some(&tip.to_string()) {
            return Ok(RemoteTip::Unchanged);
        }
        if Some(tip) == previous {
            return Ok(RemoteTip::At(tip));
        }
        Ok(RemoteTip::At(mirror.fetch()?))
    });
    // libgit2 ends the call at its socket timeout or the deadline above; this is the backstop
    // for a server that keeps it busy otherwise, and then the call goes on alone, holding only
    // `in_flight`.
    match tokio::time::timeout(timeout + Duration::from_secs(1), job).await {
        Ok(Ok(Ok(tip))) => Ok(tip),
        Ok(Ok(Err(e))) => Err((e.label(), e.to_string())),
        Ok(Err(e)) => Err(("panic", format!("Git task failed: {e}"))),
        Err(_) => Err((
            "timeout",
            format!("{url} did not answer within {timeout:?} (--git-timeout)"),
        )),
    }
}

/// Reads the specs at `tip`, which is in the mirror, into the snapshot.
fn read_revision(
    remote: &Remote,
    tip: git2::Oid,
    path: &str,
    load: &LoadOptions,
    synced: Option<String>,
) -> Result<Found, GitError> {
    let mut guard = remote
        .state
        .lock()
        .map_err(|_| GitError::Git(git2::Error::from_str("source state poisoned")))?;
    let s = &mut *guard;
    let previous = s.fetched;
    if !s.fetched_tips.contains(&tip) {
        if s.fetched_tips.len() >= REMEMBERED_TIPS {
            s.fetched_tips.pop_front();
        }
        s.fetched_tips.push_back(tip);
    }
    let listing = s.mirror.list_files(tip, path)?;
    let mirror = &s.mirror;
    let update = s.snapshot.update(
        &listing,
        |_, id| mirror.read_spec_file(id, load.max_file_bytes),
        load,
    )?;
    s.fetched = Some(tip);
    // Only when the last sync succeeded for the snapshot as it was; a failed sync is retried.
    let last_sync_covers_snapshot = synced.is_some() && synced == previous.map(|p| p.to_string());
    if !update.changed && last_sync_covers_snapshot {
        tracing::info!(revision = %tip, "new revision changes no spec (e.g. status only); nothing to sync");
        return Ok(Found::SameSpecs {
            revision: tip.to_string(),
        });
    }
    tracing::info!(revision = %tip, parsed = update.parsed, "new revision");
    Ok(Found::Specs {
        revision: tip.to_string(),
        specs: s.snapshot.spec_set(),
    })
}

fn look_at_local(
    snapshot: &mut SpecSnapshot,
    shared: &Arc<Shared>,
    last_sync_ok: bool,
) -> Result<Found, String> {
    let SourceConfig::Local { dir } = &shared.config.source else {
        return Ok(Found::Nothing);
    };
    let root = dir.join(&shared.config.path);
    let files = crate::specs::list_local_spec_files(&root)
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let listing: Vec<(String, String)> = files
        .iter()
        .map(|f| (f.rel.clone(), f.change_id()))
        .collect();
    let by_path: std::collections::HashMap<&str, &crate::specs::LocalSpecFile> =
        files.iter().map(|f| (f.rel.as_str(), f)).collect();
    let max = shared.config.load.max_file_bytes;
    let update = snapshot
        .update(
            &listing,
            |p, _| -> std::result::Result<_, std::convert::Infallible> {
                Ok(match by_path.get(p) {
                    Some(file) => crate::specs::read_local_spec_file(file, max),
                    None => crate::specs::FileContent::Refused("vanished while read".into()),
                })
            },
            &shared.config.load,
        )
        .map_err(|e| format!("{}: {e}", root.display()))?;
    if !update.changed && last_sync_ok {
        return Ok(Found::Nothing);
    }
    Ok(Found::Specs {
        revision: "working-tree".into(),
        specs: snapshot.spec_set(),
    })
}

async fn sync(
    syncer: &Syncer,
    shared: &Arc<Shared>,
    revision: &str,
    specs: &SpecSet,
    full: bool,
) -> Result<(), String> {
    if specs.is_empty() && !shared.config.allow_empty {
        // Most likely a wrong --path (or specs moved away): applying "nothing" would prune
        // everything this source applied.
        return Err(format!(
            "no specs found in {:?} at {revision}; nothing is applied or pruned. Check \
             --path, or give --allow-empty to sync an empty directory",
            shared.config.path
        ));
    }
    for e in &specs.errors {
        tracing::error!(error = %e, "spec error; this file is not applied until it is fixed");
    }
    if !specs.errors.is_empty()
        && let (Some(tx), Some(cfg)) = (&shared.spec_error_statuses, &shared.config.commit_status)
    {
        tokio::spawn(spec_error_statuses(
            shared.client.clone(),
            shared.config.source_name.clone(),
            cfg.clone(),
            revision.to_string(),
            specs.errors.clone(),
            tx.clone(),
        ));
    }
    let started = Instant::now();
    let report = if full {
        syncer.sync(specs, revision, shared.config.prune).await
    } else {
        syncer
            .sync_changes(specs, revision, shared.config.prune)
            .await
    };
    shared
        .metrics
        .sync_duration
        .observe(started.elapsed().as_secs_f64());
    for (action, n) in [
        ("create", report.created.len()),
        ("update", report.updated.len()),
        ("prune", report.pruned.len()),
    ] {
        if n > 0 {
            shared
                .metrics
                .objects_applied
                .get_or_create(&ActionLabel {
                    action: action.into(),
                })
                .inc_by(n as u64);
        }
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
    if let Ok(mut s) = shared.status.write() {
        s.objects = specs.objects.len();
        s.spec_errors = specs.errors.iter().map(ToString::to_string).collect();
        s.revision = Some(revision.to_string());
        s.last_sync = Some(now_rfc3339());
        s.sync_errors = report
            .errors
            .iter()
            .map(|(key, e)| format!("{key}: {e}"))
            .collect();
        s.set_degraded();
        if report.errors.is_empty() {
            s.last_error = None;
        }
    }
    shared.status_changed.send_replace(());
    shared.metrics.synced_revision.clear();
    shared
        .metrics
        .synced_revision
        .get_or_create(&RevisionLabel {
            revision: revision.to_string(),
        })
        .set(1);
    if report.errors.is_empty() {
        Ok(())
    } else {
        let (key, e) = &report.errors[0];
        Err(format!(
            "{} object(s) failed to sync; first: {key}: {e}",
            report.errors.len()
        ))
    }
}

/// Error statuses on `revision` for the rollouts (already in the cluster, from an earlier
/// revision) whose files now have errors.
async fn spec_error_statuses(
    client: kube::Client,
    source: String,
    cfg: crate::writeback::commit_status::CommitStatusConfig,
    revision: String,
    errors: Vec<crate::specs::SpecError>,
    tx: mpsc::Sender<crate::writeback::commit_status::Wanted>,
) {
    use crate::api::{CanaryDeployment, CanaryStatefulSet, SOURCE_LABEL, SOURCE_PATH_ANNOTATION};
    use crate::writeback::commit_status::wanted_for_spec_error;
    let params = kube::api::ListParams::default().labels(&format!("{SOURCE_LABEL}={source}"));
    let mut metas = Vec::new();
    let cannot_list = |kind: &str, e: kube::Error| {
        tracing::warn!(kind, error = %e, "cannot list rollouts to post error statuses for spec errors; the errors are still logged above");
    };
    match kube::Api::<CanaryStatefulSet>::all(client.clone())
        .list(&params)
        .await
    {
        Ok(l) => metas.extend(l.items.into_iter().map(|o| o.metadata)),
        Err(e) => cannot_list("CanaryStatefulSet", e),
    }
    match kube::Api::<CanaryDeployment>::all(client)
        .list(&params)
        .await
    {
        Ok(l) => metas.extend(l.items.into_iter().map(|o| o.metadata)),
        Err(e) => cannot_list("CanaryDeployment", e),
    }
    for e in &errors {
        for m in &metas {
            let file = m
                .annotations
                .as_ref()
                .and_then(|a| a.get(SOURCE_PATH_ANNOTATION));
            if file != Some(&e.location.file) {
                continue;
            }
            let (Some(ns), Some(name)) = (&m.namespace, &m.name) else {
                continue;
            };
            if let Some(w) = wanted_for_spec_error(&cfg, ns, name, &revision, &e.to_string()) {
                let _ = tx.send(w).await;
            }
        }
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if shared.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting to hold the lease (another replica acts) or for the first sync\n",
        )
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> ([(&'static str, &'static str); 1], String) {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.encode(),
    )
}

async fn status(State(shared): State<Arc<Shared>>) -> axum::Json<SourceStatus> {
    axum::Json(shared.status.read().map(|s| s.clone()).unwrap_or_default())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
