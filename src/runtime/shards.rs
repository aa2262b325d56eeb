//! The shard Leases (`--shards`): this replica holds its home shard's Lease from the start,
//! and stands by for the others, taking one only when its holder stops renewing it. What it
//! holds goes to the controllers' [`ShardSet`], which wakes every rollout on a change.
//!
//! Inputs: the Leases. Outputs: the held shards.

use std::sync::Arc;
use std::time::Duration;

use super::config::LeaderConfig;
use crate::controller::shards::ShardSet;

/// The Lease of shard `k`.
pub fn lease_name(leader: &LeaderConfig, k: u32) -> String {
    format!("{}-shard-{k}", leader.name)
}

/// Holds shard Leases until `release` turns true (the agent stops: every shard held is
/// released, so other replicas take it at once); one task per shard, returned to be awaited.
pub fn hold_shards(
    client: kube::Client,
    leader: &LeaderConfig,
    shards: Arc<ShardSet>,
    release: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..leader.shards)
        .map(|k| {
            let (client, leader, shards) = (client.clone(), leader.clone(), shards.clone());
            let mut release = release.clone();
            tokio::spawn(async move {
                // Standing by: the home replica of a shard starting with this one gets its
                // Lease first, so shards spread one per replica instead of going to the quickest.
                if k != leader.home_shard {
                    tokio::select! {
                        _ = tokio::time::sleep(leader.duration) => {}
                        _ = released(&mut release) => return,
                    }
                }
                hold_shard(client, &leader, k, &shards, release).await;
            })
        })
        .collect()
}

async fn hold_shard(
    client: kube::Client,
    leader: &LeaderConfig,
    k: u32,
    shards: &ShardSet,
    mut release: tokio::sync::watch::Receiver<bool>,
) {
    use kube_lease_manager::LeaseManagerBuilder;
    let name = lease_name(leader, k);
    let duration = leader.duration.as_secs().max(2);
    loop {
        let built = LeaseManagerBuilder::new(client.clone(), &name)
            .with_namespace(&leader.namespace)
            .with_identity(&leader.identity)
            .with_duration(duration)
            .with_grace((duration / 3).clamp(1, 5))
            .build()
            .await;
        let manager = match built {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "cannot use the shard's Lease; trying again in 5 s");
                tokio::time::sleep(Duration::from_secs(5)).await;
                continue;
            }
        };
        let (mut holding, task) = manager.watch().await;
        loop {
            let held = *holding.borrow_and_update();
            if held {
                tracing::info!(lease = %name, shard = k, "holding the shard; running its rollouts");
            }
            let was = shards.held().contains(&k);
            if was && !held {
                tracing::warn!(lease = %name, shard = k, "lost the shard; its rollouts are another replica's now");
            }
            shards.set_held(k, held);
            tokio::select! {
                changed = holding.changed() => if changed.is_err() {
                    break;
                },
                _ = released(&mut release) => {
                    // Closing the channel makes the lease manager release the Lease and end.
                    shards.set_held(k, false);
                    drop(holding);
                    if let Ok(Ok(_)) = task.await {
                        tracing::info!(lease = %name, shard = k, "released the shard");
                    }
                    return;
                }
            }
        }
        shards.set_held(k, false);
        let stopped = match task.await {
            Ok(Ok(_)) => "stopped".to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(lease = %name, why = %stopped, "the shard's lease manager stopped; starting it again");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Resolves once the agent asks for the shards back (or the sender is gone).
async fn released(release: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = release.wait_for(|r| *r).await.map(|_| ());
}
