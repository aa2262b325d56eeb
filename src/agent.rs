//! `linnet agent`: wires the runtime's tasks ([`crate::runtime`]) and runs until SIGINT or
//! SIGTERM. Every decision is made from Git and the cluster, so a restarted agent simply
//! syncs again.

use std::sync::Arc;

use tokio::sync::mpsc;

pub use crate::runtime::config::{AgentConfig, LeaderConfig, SourceConfig};
pub use crate::runtime::listeners::{RolloutRow, StatusReport};
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
    let (rollouts, sts_watch, deploy_watch) = RolloutStores::new(&client, &selector);
    let (waker, wakes) = source::hooks::wake_channel();
    // Every long-running task is held here: one that ends or panics stops the agent.
    let mut tasks = Tasks::supervisor();
    listeners::serve_all(
        &config,
        client.clone(),
        state.clone(),
        rollouts.clone(),
        metrics.clone(),
        waker,
        &mut tasks,
    )
    .await?;
    let source = match &config.source {
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
    };
    // Sharded (`--shards`), every replica runs the rollouts of the shards it holds at once;
    // only Git sync, write-back and commit statuses wait for the main Lease.
    let sharded = config.leader.clone().filter(|l| l.shards > 1);
    let mut held_lease = None;
    if let (Some(leader), None) = (&config.leader, &sharded) {
        let mut held = lease::wait_for_leadership(client.clone(), leader).await?;
        tasks.spawn("lease", held.lost());
        held_lease = Some(held);
    }
    if config.leader.is_none() || held_lease.is_some() {
        metrics.leader.set(1);
    }
    // Before this replica applies, prunes or reconciles anything: the source is its own.
    let origin = {
        let spec = crate::runtime::source_object::spec_of(&config);
        claim::Origin {
            url: spec.url,
            branch: spec.branch,
        }
    };
    let source_claim = claim::take(
        &client,
        &config.source_name,
        &config.installation,
        config.claim_duration,
        &origin,
    )
    .await?;
    tasks.spawn("source claim", source_claim.clone().keep());
    // Without leader election the next holder is another pod: it need not wait for a lapse.
    let release_claim = config.leader.is_none().then_some(source_claim);
    // The controllers act on what the sync applied, each on its kind's shared store.
    let mut ctx = controller::Context::new(
        client.clone(),
        &config.source_name,
        metrics.clone(),
        config.max_concurrent_reconciles,
        config.analysis.clone(),
    )
    .with_source_account(controller::source_account::SourceAccount::new(
        config.apply_as.clone(),
        Some(kube_config.clone()),
    ))
    .with_first_status_wait(config.first_status_wait);
    let (release_shards, shard_release) = tokio::sync::watch::channel(false);
    // Each shard holder keeps a sender: all dropped once every held shard was released.
    let (holders_alive, mut holders_gone) = mpsc::channel::<()>(1);
    if let Some(leader) = &sharded {
        let shards = Arc::new(controller::shards::ShardSet::new(leader.shards));
        let holders = shards::hold_shards(
            client.clone(),
            leader,
            shards.clone(),
            shard_release,
            holders_alive.clone(),
        );
        // A holder that ends or panics before the shutdown is a fault like any task's.
        for holder in holders {
            tasks.spawn("shard lease", async move {
                let _ = holder.await;
            });
        }
        ctx = ctx.with_shards(shards);
    }
    drop(holders_alive);
    let ctx = Arc::new(ctx);
    let edited = ctx.edited.clone();
    // Each consumer subscribes here, not in its task: none misses the first list.
    let (sts, sts_changes) = (
        rollouts.statefulsets.clone(),
        rollouts.statefulsets.subscribe(),
    );
    let (deploys, deploy_changes) = (
        rollouts.deployments.clone(),
        rollouts.deployments.subscribe(),
    );
    let commit_status_changes = config.commit_status.as_ref().map(|_| rollouts.subscribe());
    let writeback_changes = config.writeback.as_ref().map(|_| rollouts.subscribe());
    let revert_changes = config.reverts.as_ref().map(|_| rollouts.subscribe());
    let notify_changes = config.notifications.as_ref().map(|_| rollouts.subscribe());
    tasks.spawn(
        "CanaryStatefulSet controller",
        controller::statefulset::run(ctx.clone(), sts, sts_changes, shutdown_signal()),
    );
    tasks.spawn(
        "CanaryDeployment controller",
        controller::deployment::run(ctx.clone(), deploys, deploy_changes, shutdown_signal()),
    );
    // Every consumer has subscribed (above, not in its task): the rollout watches start.
    tasks.spawn("CanaryStatefulSet watch", sts_watch.run());
    tasks.spawn("CanaryDeployment watch", deploy_watch.run());
    if let Some(leader) = &sharded {
        let mut held = lease::wait_for_leadership(client.clone(), leader).await?;
        tasks.spawn("lease", held.lost());
        held_lease = Some(held);
        metrics.leader.set(1);
    }
    tasks.spawn(
        "unmanaged rollouts",
        controller::unmanaged::run(ctx, shutdown_signal()),
    );
    tasks.spawn(
        "LinnetSource status",
        crate::runtime::source_object::publish(
            client.clone(),
            config.state_namespace.clone(),
            config.source_name.clone(),
            crate::runtime::source_object::spec_of(&config),
            {
                let state = state.clone();
                move || state.status()
            },
            state.subscribe(),
        ),
    );
    let spec_error_statuses = match (config.commit_status.clone(), commit_status_changes) {
        (Some(cfg), Some(changes)) => {
            let (tx, rx) = mpsc::channel(64);
            tasks.spawn(
                "commit statuses",
                writeback::post_commit_statuses(changes, cfg, metrics.clone(), rx),
            );
            Some(tx)
        }
        _ => None,
    };
    if let (Some(cfg), Some(changes)) = (config.notifications.clone(), notify_changes) {
        tasks.spawn(
            "notifications",
            crate::notify::run(
                changes,
                cfg,
                metrics.clone(),
                Some(crate::notify::persist::Store {
                    client: client.clone(),
                    namespace: config.state_namespace.clone(),
                    source: config.source_name.clone(),
                }),
            ),
        );
    }
    if let (Some(cfg), Some(changes)) = (config.writeback.clone(), writeback_changes) {
        tasks.spawn("write-back", writeback::run(changes, cfg, metrics.clone()));
    }
    let events = crate::events::EventRecorders::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "linnet".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    if let (Some(cfg), Some(changes)) = (config.reverts.clone(), revert_changes) {
        tasks.spawn(
            "revert commits",
            writeback::revert_loop::run(changes, cfg, metrics.clone(), events.clone()),
        );
    }
    let syncer = Syncer::new(
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
    .with_rollout_finalizer(true);
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
    let _ = release_shards.send(true);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(3), holders_gone.recv()).await;
    if let Some(claim) = release_claim {
        claim.release().await;
    }
    if let Some(lease) = held_lease {
        lease.release().await;
    }
    outcome
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
}
