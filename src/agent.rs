//! `linnet agent`: wires the runtime's tasks ([`crate::runtime`]) and runs until SIGINT or
//! SIGTERM. Every decision is made from Git and the cluster, so a restarted agent simply
//! syncs again.

use std::sync::Arc;

use tokio::sync::mpsc;

pub use crate::runtime::config::{AgentConfig, LeaderConfig, SourceConfig};
pub use crate::runtime::listeners::{RolloutRow, StatusReport};
use crate::runtime::look::ReadAhead;
use crate::runtime::source_loop::{Source, SourceLoop};
pub use crate::runtime::state::{DEGRADED, SourceCondition, SourceStatus};
use crate::runtime::supervise::Tasks;
use crate::runtime::{claim, lease, listeners, look, shards, shutdown_signal, state::AgentState};
use crate::watch::rollouts::RolloutStores;
use crate::{Error, Result, controller, source, sync::Syncer, telemetry::Metrics, writeback};

/// Runs the agent until SIGINT or SIGTERM.
pub async fn run(
    config: AgentConfig,
    client: kube::Client,
    kube_config: kube::Config,
) -> Result<()> {
    crate::liveness::init(config.liveness_deadline);
    // Before anything listens or applies: another live agent may have this source name.
    claim::check(&client, &config.source_name, &config.installation).await?;
    let metrics = Arc::new(metrics());
    let state = Arc::new(AgentState::new(&config.source_name));
    let selector = controller::context::source_selector(&config.source_name);
    let (rollouts, sts_watch, deploy_watch) =
        RolloutStores::new(&client, &selector, &config.watch_scope);
    let (waker, wakes) = source::hooks::wake_channel();
    // Every long-running task is held here: one that ends or panics stops the agent.
    let mut tasks = Tasks::supervisor();
    listeners::serve_all(
        &config,
        client.clone(),
        state.clone(),
        rollouts.clone(),
        metrics.clone(),
        waker.clone(),
        &mut tasks,
    )
    .await?;
    let source = open_source(&config).await?;
    // Sharded (`--shards`), every replica runs the rollouts of the shards it holds at once;
    // only Git sync, write-back and commit statuses wait for the main Lease.
    let sharded = config.leader.clone().filter(|l| l.shards > 1);
    let mut held = Held::default();
    if let (Some(leader), None) = (&config.leader, &sharded) {
        held.lease = Some(hold_lease(&client, leader, &metrics, &mut tasks).await?);
    } else if config.leader.is_none() {
        metrics.leader.set(1);
    }
    let read_ahead = read_ahead(&source, sharded.is_some(), &config, &metrics);
    // Before this replica applies, prunes or reconciles anything: the source is its own.
    held.claim = take_source_claim(&client, &config, &mut tasks).await?;
    let mut ctx = controller_context(&config, &client, &kube_config, &metrics, &state);
    ctx = with_fleet(ctx, &config, wakes.another(), &metrics, &state, &mut tasks);
    if let Some(leader) = &sharded {
        ctx = ctx.with_shards(held.shards.spawn(&client, leader, &mut tasks));
    }
    let ctx = Arc::new(ctx);
    let edited = ctx.edited.clone();
    // Each consumer subscribes before the rollout watches start: none misses the first list.
    let feeds = WriterFeeds::subscribe(&config, &rollouts, ctx.fleet.snapshots());
    spawn_controllers(&ctx, &rollouts, &mut tasks);
    tasks.spawn("CanaryStatefulSet watch", sts_watch.run());
    tasks.spawn("CanaryDeployment watch", deploy_watch.run());
    if let Some(leader) = &sharded {
        held.lease = Some(hold_lease(&client, leader, &metrics, &mut tasks).await?);
    }
    spawn_status_writers(ctx, &config, &client, &state, &waker, &mut tasks);
    let events = crate::events::EventRecorders::new(client.clone(), crate::events::reporter());
    let spec_error_statuses = feeds.spawn(&config, &client, &metrics, &events, &mut tasks);
    let syncer = syncer(&config, &client, kube_config, &rollouts);
    read_ahead.finished().await;
    let source_loop = SourceLoop {
        config,
        client,
        metrics,
        state,
        rollouts,
        spec_error_statuses,
        edited,
        events,
    };
    let outcome = tokio::select! {
        done = source_loop.run(syncer, source, wakes) => done,
        // Said once, by the command line's error report (text or JSON), not logged here too.
        fault = tasks.first_fault() => Err(fault),
    };
    // Nothing of this replica acts any more before the next one may start.
    tasks.stop_all().await;
    held.release().await;
    outcome
}

/// What this replica holds and lets go when it stops, so that the next need not wait for
/// a lapse: its shards, its source claim (without leader election), its Lease.
#[derive(Default)]
struct Held {
    shards: ShardHolders,
    claim: Option<claim::SourceClaim>,
    lease: Option<lease::HeldLease>,
}

impl Held {
    async fn release(self) {
        self.shards.release().await;
        if let Some(claim) = self.claim {
            claim.release().await;
        }
        if let Some(lease) = self.lease {
            lease.release().await;
        }
    }
}

/// The read ahead of a remote's tip, under the claim's settle, by a replica that will sync
/// Git (it holds the Lease, or runs without one). A standby would clone and parse the whole
/// repository for nothing (ten shards of 100,000 rollouts: ten parses at once); sharded, the
/// main Lease comes after the claim, with nothing left to overlap.
fn read_ahead(
    source: &Source,
    sharded: bool,
    config: &AgentConfig,
    metrics: &Arc<Metrics>,
) -> ReadAhead {
    match source {
        Source::Remote(remote) if !sharded => ReadAhead::start(remote, config, metrics),
        _ => ReadAhead::none(),
    }
}

/// The mirror of the remote (cloned the first time), or the watched directory.
async fn open_source(config: &AgentConfig) -> Result<Source> {
    Ok(match &config.source {
        SourceConfig::Remote { remote, cache_dir } => Source::Remote(
            look::open_remote(remote.clone(), cache_dir.clone(), config.render.clone()).await?,
        ),
        SourceConfig::Local { dir } => {
            let (watcher, changes) =
                source::local::watch(dir.clone(), std::time::Duration::from_millis(200)).map_err(
                    |e| Error::Io {
                        path: dir.clone(),
                        source: std::io::Error::other(e),
                    },
                )?;
            Source::Local { watcher, changes }
        }
    })
}

/// Waits to lead, then keeps the Lease: losing it is a fault that stops the agent.
async fn hold_lease(
    client: &kube::Client,
    leader: &LeaderConfig,
    metrics: &Metrics,
    tasks: &mut Tasks,
) -> Result<lease::HeldLease> {
    let mut held = lease::wait_for_leadership(client.clone(), leader).await?;
    tasks.spawn("lease", held.lost());
    metrics.leader.set(1);
    Ok(held)
}

/// Takes the claim on this agent's source name, or says which agent holds it, and keeps it
/// renewed; returns it when this replica releases it at shutdown: without leader election
/// the next holder is another pod, which need not wait for a lapse.
async fn take_source_claim(
    client: &kube::Client,
    config: &AgentConfig,
    tasks: &mut Tasks,
) -> Result<Option<claim::SourceClaim>> {
    let spec = crate::runtime::source_object::spec_of(config);
    let origin = claim::Origin {
        url: spec.url,
        branch: spec.branch,
    };
    let source_claim = claim::take(
        client,
        &config.source_name,
        &config.installation,
        config.claim_duration,
        &origin,
    )
    .await?;
    tasks.spawn("source claim", source_claim.clone().keep());
    Ok(config.leader.is_none().then_some(source_claim))
}

/// What the controllers share: the client, the source's name and account, the limits.
fn controller_context(
    config: &AgentConfig,
    client: &kube::Client,
    kube_config: &kube::Config,
    metrics: &Arc<Metrics>,
    state: &AgentState,
) -> controller::Context {
    metrics
        .fleet
        .cluster(&config.cluster.name, &config.cluster.labels);
    controller::Context::new(
        client.clone(),
        &config.source_name,
        metrics.clone(),
        config.max_concurrent_reconciles,
        config.analysis.clone(),
        config.watch_scope.clone(),
    )
    .with_source_account(controller::source_account::SourceAccount::new(
        config.apply_as.clone(),
        Some(kube_config.clone()),
    ))
    .with_first_status_wait(config.first_status_wait)
    .with_image_origins(state.image_origins.clone())
}

/// With `--fleet`, the controllers ask the fleet before starting a new image, and the fleet
/// loop reads it from Git at each poll and webhook.
fn with_fleet(
    ctx: controller::Context,
    config: &AgentConfig,
    wakes: source::hooks::WakeReceiver,
    metrics: &Arc<Metrics>,
    state: &Arc<AgentState>,
    tasks: &mut Tasks,
) -> controller::Context {
    let Some(fleet) = &config.fleet else {
        return ctx;
    };
    let read = state.fleet.subscribe();
    let run = crate::runtime::fleet::run(
        fleet.clone(),
        config.poll_interval,
        state.clone(),
        wakes,
        metrics.clone(),
    );
    tasks.spawn("fleet", run);
    ctx.with_fleet(controller::fleet::FleetGates::new(
        config.cluster.clone(),
        read,
    ))
}

/// The tasks holding shard Leases (`--shards`), and how to let them go at the end.
struct ShardHolders {
    release: tokio::sync::watch::Sender<bool>,
    /// Each holder keeps a sender: all dropped once every held shard was released.
    alive: Option<mpsc::Sender<()>>,
    gone: mpsc::Receiver<()>,
}

impl Default for ShardHolders {
    fn default() -> ShardHolders {
        let (release, _) = tokio::sync::watch::channel(false);
        let (alive, gone) = mpsc::channel(1);
        ShardHolders {
            release,
            alive: Some(alive),
            gone,
        }
    }
}

impl ShardHolders {
    /// Starts a holder per shard; the shards this replica holds are the returned set's.
    fn spawn(
        &self,
        client: &kube::Client,
        leader: &LeaderConfig,
        tasks: &mut Tasks,
    ) -> Arc<controller::shards::ShardSet> {
        let shards = Arc::new(controller::shards::ShardSet::new(leader.shards));
        let Some(alive) = self.alive.clone() else {
            return shards;
        };
        let holders = shards::hold_shards(
            client.clone(),
            leader,
            shards.clone(),
            self.release.subscribe(),
            alive,
        );
        // A holder that ends or panics before the shutdown is a fault like any task's.
        for holder in holders {
            tasks.spawn("shard lease", async move {
                let _ = holder.await;
            });
        }
        shards
    }

    /// Releases every held shard, waiting up to 3 s for the holders to say so.
    async fn release(mut self) {
        drop(self.alive.take());
        let _ = self.release.send(true);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), self.gone.recv()).await;
    }
}

/// The two kinds' controllers, each on its kind's shared store.
fn spawn_controllers(ctx: &Arc<controller::Context>, rollouts: &RolloutStores, tasks: &mut Tasks) {
    let (sts, sts_changes) = (
        rollouts.statefulsets.clone(),
        rollouts.statefulsets.subscribe(),
    );
    let (deploys, deploy_changes) = (
        rollouts.deployments.clone(),
        rollouts.deployments.subscribe(),
    );
    tasks.spawn(
        "CanaryStatefulSet controller",
        controller::statefulset::run(ctx.clone(), sts, sts_changes, shutdown_signal()),
    );
    tasks.spawn(
        "CanaryDeployment controller",
        controller::deployment::run(ctx.clone(), deploys, deploy_changes, shutdown_signal()),
    );
}

/// What writes status once this replica leads: the unmanaged rollouts' (those of no source
/// or another), and the LinnetSource object's, kept on what this agent's state says.
fn spawn_status_writers(
    ctx: Arc<controller::Context>,
    config: &AgentConfig,
    client: &kube::Client,
    state: &Arc<AgentState>,
    waker: &source::hooks::Waker,
    tasks: &mut Tasks,
) {
    tasks.spawn(
        "unmanaged rollouts",
        controller::unmanaged::run(ctx, shutdown_signal()),
    );
    let status = {
        let state = state.clone();
        move || state.status()
    };
    tasks.spawn(
        "LinnetSource status",
        crate::runtime::source_object::publish(
            client.clone(),
            config.state_namespace.clone(),
            config.source_name.clone(),
            crate::runtime::source_object::spec_of(config),
            status,
            state.subscribe(),
        ),
    );
    // Only once this replica holds the main Lease: one agent commits tags, not every replica.
    if let Some(images) = &config.image_automation {
        tasks.spawn(
            "image automation",
            crate::runtime::image_automation::run(
                images.clone(),
                state.image_scans.clone(),
                state.image_origins.clone(),
                waker.clone(),
            ),
        );
    }
}

/// The rollout changes each writer to Git (and the notifier) follows, subscribed before the
/// watches start.
struct WriterFeeds {
    commit_status: Option<crate::watch::rollouts::Subscription>,
    writeback: Option<crate::watch::rollouts::Subscription>,
    reverts: Option<crate::watch::rollouts::Subscription>,
    notifications: Option<crate::watch::rollouts::Subscription>,
    /// The fleet's snapshots (`--fleet`), for the reverts.
    fleet: Option<writeback::revert_loop::FleetSnapshots>,
}

impl WriterFeeds {
    fn subscribe(
        config: &AgentConfig,
        rollouts: &RolloutStores,
        fleet: Option<writeback::revert_loop::FleetSnapshots>,
    ) -> WriterFeeds {
        WriterFeeds {
            commit_status: config.commit_status.as_ref().map(|_| rollouts.subscribe()),
            writeback: config.writeback.as_ref().map(|_| rollouts.subscribe()),
            reverts: config.reverts.as_ref().map(|_| rollouts.subscribe()),
            notifications: config.notifications.as_ref().map(|_| rollouts.subscribe()),
            fleet,
        }
    }

    /// Starts the writers configured; returns where the sync sends spec errors to become
    /// commit statuses, if they are posted.
    fn spawn(
        self,
        config: &AgentConfig,
        client: &kube::Client,
        metrics: &Arc<Metrics>,
        events: &crate::events::EventRecorders,
        tasks: &mut Tasks,
    ) -> Option<mpsc::Sender<writeback::commit_status::Wanted>> {
        let mut spec_error_statuses = None;
        if let (Some(cfg), Some(changes)) = (config.commit_status.clone(), self.commit_status) {
            let (tx, rx) = mpsc::channel(64);
            tasks.spawn(
                "commit statuses",
                writeback::post_commit_statuses(changes, cfg, metrics.clone(), rx),
            );
            spec_error_statuses = Some(tx);
        }
        if let (Some(cfg), Some(changes)) = (config.notifications.clone(), self.notifications) {
            let store = crate::notify::persist::Store {
                client: client.clone(),
                namespace: config.state_namespace.clone(),
                source: config.source_name.clone(),
            };
            tasks.spawn(
                "notifications",
                crate::notify::run(changes, cfg, metrics.clone(), Some(store)),
            );
        }
        if let (Some(cfg), Some(changes)) = (config.writeback.clone(), self.writeback) {
            tasks.spawn("write-back", writeback::run(changes, cfg, metrics.clone()));
        }
        if let (Some(mut cfg), Some(changes)) = (config.reverts.clone(), self.reverts) {
            cfg.fleet = self.fleet;
            tasks.spawn(
                "revert commits",
                writeback::revert_loop::run(changes, cfg, metrics.clone(), events.clone()),
            );
        }
        spec_error_statuses
    }
}

/// The sync: what it may apply, as whom, what it records, and what it watches.
fn syncer(
    config: &AgentConfig,
    client: &kube::Client,
    kube_config: kube::Config,
    rollouts: &RolloutStores,
) -> Syncer {
    Syncer::new(
        client.clone(),
        &config.source_name,
        config.load.policy.allowed_namespaces.clone(),
    )
    .with_drift_interval(config.drift_interval)
    .with_apply_as(config.apply_as.clone(), kube_config)
    .with_adopt(config.adopt)
    .with_policy(config.load.policy.clone())
    .with_inventory(
        config.state_namespace.clone(),
        format!(
            "{}/{}",
            config.installation.namespace, config.installation.identity
        ),
    )
    .with_watched(rollouts.clone())
    // This agent runs the CanaryStatefulSet controller, which removes the finalizer.
    .with_rollout_finalizer(true)
}

/// The agent's metrics, with every error counter at 0 from the start, by the labels of the
/// modules that own the errors.
pub fn metrics() -> Metrics {
    let metrics = Metrics::default();
    let network = crate::net::Failure::LABELS;
    let git = crate::source::git::GitError::LABELS;
    metrics.start_error_series(&crate::telemetry::ErrorSeries {
        fetch: network.iter().chain(git).copied().collect(),
        writeback: network
            .iter()
            .chain(git)
            .chain(crate::writeback::push::WriteError::LABELS)
            .copied()
            .collect(),
        commit_status: network
            .iter()
            .chain(crate::writeback::commit_status::PostError::LABELS)
            .copied()
            .collect(),
        reconcile: crate::controller::ReconcileError::LABELS.to_vec(),
        sync: network
            .iter()
            .chain(git)
            .chain(look::SourceError::LABELS)
            .copied()
            .collect(),
    });
    metrics
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_error_counter_exists_before_the_first_error() {
        let text = super::metrics().encode();
        for series in [
            r#"linnet_git_fetch_errors_total{reason="timeout"} 0"#,
            r#"linnet_git_fetch_errors_total{reason="certificate"} 0"#,
            r#"linnet_git_fetch_errors_total{reason="auth"} 0"#,
            r#"linnet_writeback_errors_total{reason="kept_moving"} 0"#,
            r#"linnet_commit_status_posts_total{result="refused"} 0"#,
            r#"linnet_reconcile_errors_total{kind="CanaryDeployment",error="kube_api"} 0"#,
            r#"linnet_sync_errors_total{reason="no_specs"} 0"#,
            r#"linnet_sync_errors_total{reason="timeout"} 0"#,
            r#"linnet_sync_errors_total{reason="sync"} 0"#,
        ] {
            assert!(text.contains(series), "no {series} in:\n{text}");
        }
    }

    /// Regression (issue 72): docs/metrics.md missed three reasons Git errors are counted by
    /// (`unverified`, `rewritten`, `history_unknown`), and `act_as` among the reconcile errors.
    #[test]
    fn every_error_label_is_explained_in_the_metrics_page() {
        let page = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"),
        )
        .unwrap_or_default();
        let labels = [
            crate::net::Failure::LABELS,
            crate::source::git::GitError::LABELS,
            crate::runtime::look::SourceError::LABELS,
            crate::writeback::push::WriteError::LABELS,
            crate::writeback::commit_status::PostError::LABELS,
            crate::controller::error::ReconcileError::LABELS,
        ];
        let missing: Vec<&str> = labels
            .iter()
            .flat_map(|l| l.iter().copied())
            .filter(|l| !page.contains(&format!("`{l}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/metrics.md does not explain {missing:?}"
        );
    }
}
