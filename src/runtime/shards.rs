//! The shard Leases (`--shards`): this replica holds its home shard's Lease from the start,
//! and stands by for the others, taking one only when its holder stops renewing it. What it
//! holds goes to the controllers' [`ShardSet`], which wakes every rollout on a change.
//!
//! A shard goes back home: a replica whose home shard another holds (it took it while this
//! one was away) asks for it on the Lease ([`HOME_WAITING_ANNOTATION`]); the holder gives it
//! up, and no other standby takes it while the request is fresh. Without that, a rolling
//! restart left every shard with whichever replica restarted last.
//!
//! Inputs: the Leases. Outputs: the held shards.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};

use super::config::LeaderConfig;
use crate::controller::shards::ShardSet;

/// On a shard's Lease: `<identity> <RFC 3339 time>`, the home replica asking for it back.
pub const HOME_WAITING_ANNOTATION: &str = "rollouts.linnet.dev/home-waiting";

/// How long a home replica's request stays fresh, in lease durations: it is renewed every
/// half duration while it waits.
const HOME_WAITING_FRESH: u32 = 3;

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
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &leader.namespace);
    let home = k == leader.home_shard;
    let look_every = (leader.duration / 2).max(Duration::from_secs(1));
    loop {
        // Another replica's home shard: not taken while its home replica asks for it.
        while !home && home_is_waiting(&leases, &name, leader).await {
            tokio::select! {
                _ = tokio::time::sleep(look_every) => {}
                _ = released(&mut release) => return,
            }
        }
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
        // Whether this replica stopped for the shard's home replica (and held the shard).
        let mut stood_back = None;
        // Whether this (home) replica asked for the shard back.
        let mut asked = false;
        loop {
            let held = *holding.borrow_and_update();
            if held {
                tracing::info!(lease = %name, shard = k, "holding the shard; running its rollouts");
                if asked {
                    // Back home: standbys need not wait for the request to go stale.
                    ask_for_home_shard(&leases, &name, leader, false).await;
                    asked = false;
                }
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
                // Another's home shard, held or stood by for: given back, or no longer
                // contended for, once its home replica asks. Home but not held: asking for it.
                _ = tokio::time::sleep(look_every), if !home || !held => {
                    if home {
                        if !asked {
                            tracing::info!(lease = %name, shard = k, "another replica holds this replica's home shard; asking for it back");
                        }
                        ask_for_home_shard(&leases, &name, leader, true).await;
                        asked = true;
                    } else if home_is_waiting(&leases, &name, leader).await {
                        stood_back = Some(held);
                        break;
                    }
                }
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
        if stood_back == Some(true) {
            // Reconciles under way when the shard was let go finish before the home replica
            // may start its own (each checks the shard only when it starts).
            tokio::time::sleep(look_every).await;
        }
        // Closing the channel makes the lease manager release the Lease and end.
        drop(holding);
        if let Some(held) = stood_back {
            let _ = task.await;
            if held {
                tracing::info!(lease = %name, shard = k, "gave the shard back to its home replica");
            }
            continue;
        }
        let stopped = match task.await {
            Ok(Ok(_)) => "stopped".to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(lease = %name, why = %stopped, "the shard's lease manager stopped; starting it again");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Whether shard Lease `name` carries a fresh request from its home replica (another).
async fn home_is_waiting(leases: &kube::Api<Lease>, name: &str, leader: &LeaderConfig) -> bool {
    let Ok(Some(lease)) = leases.get_opt(name).await else {
        return false;
    };
    let asked = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HOME_WAITING_ANNOTATION));
    asked.is_some_and(|request| {
        is_fresh_request(
            request,
            &leader.identity,
            leader.duration * HOME_WAITING_FRESH,
            jiff::Timestamp::now(),
        )
    })
}

/// Whether `request` ([`HOME_WAITING_ANNOTATION`]) is another replica's, made within
/// `fresh_for` of `now` (either way: clocks differ).
fn is_fresh_request(request: &str, own: &str, fresh_for: Duration, now: jiff::Timestamp) -> bool {
    let Some((who, at)) = request.rsplit_once(' ') else {
        return false;
    };
    let Ok(at) = at.parse::<jiff::Timestamp>() else {
        return false;
    };
    let apart = now.duration_since(at).unsigned_abs();
    who != own && apart < fresh_for
}

/// Asks for this replica's home shard back on its Lease (`asking`), or withdraws the request.
async fn ask_for_home_shard(
    leases: &kube::Api<Lease>,
    name: &str,
    leader: &LeaderConfig,
    asking: bool,
) {
    let request = asking.then(|| format!("{} {}", leader.identity, jiff::Timestamp::now()));
    let patch = serde_json::json!({
        "metadata": {"annotations": {HOME_WAITING_ANNOTATION: request}}
    });
    if let Err(e) = leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::debug!(lease = %name, error = %e, "could not ask for the home shard back");
    }
}

/// Resolves once the agent asks for the shards back (or the sender is gone).
async fn released(release: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = release.wait_for(|r| *r).await.map(|_| ());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_request_is_fresh_only_from_another_replica_and_for_a_while() {
        let now: jiff::Timestamp = "2026-11-27T12:00:00Z".parse().unwrap_or_default();
        let fresh = Duration::from_secs(45);
        let asked = |who: &str, at: &str| format!("{who} {at}");
        assert!(is_fresh_request(
            &asked("linnet-1", "2026-11-27T11:59:30Z"),
            "linnet-0",
            fresh,
            now
        ));
        // Its own request never makes a replica stand back.
        assert!(!is_fresh_request(
            &asked("linnet-0", "2026-11-27T11:59:30Z"),
            "linnet-0",
            fresh,
            now
        ));
        // Stale: the home replica stopped asking (it died again).
        assert!(!is_fresh_request(
            &asked("linnet-1", "2026-11-27T11:58:00Z"),
            "linnet-0",
            fresh,
            now
        ));
        // A clock ahead by less than the window still counts.
        assert!(is_fresh_request(
            &asked("linnet-1", "2026-11-27T12:00:20Z"),
            "linnet-0",
            fresh,
            now
        ));
        for junk in ["", "linnet-1", "linnet-1 yesterday"] {
            assert!(!is_fresh_request(junk, "linnet-0", fresh, now), "{junk}");
        }
    }
}
