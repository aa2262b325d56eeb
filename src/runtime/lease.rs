//! Leader election: one replica acts, the others wait to hold the Lease.

use super::config::LeaderConfig;
use crate::{Error, Result};

/// How long a stopping agent waits for the API server to take its release of the Lease.
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The Lease this replica holds, until [`HeldLease::release`].
pub struct HeldLease {
    stop: tokio::sync::oneshot::Sender<()>,
    watching: tokio::task::JoinHandle<()>,
    lost: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl HeldLease {
    /// Resolves when this replica has lost the Lease (or its watch ended): a task for the
    /// supervisor, whose end stops the agent, so that only the new holder acts.
    pub fn lost(&mut self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let lost = self.lost.take();
        async move {
            match lost {
                Some(lost) => {
                    let _ = lost.await;
                    tracing::error!("lost the lease; stopping so that only the new holder acts");
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Gives the Lease up, so that a standby (or the next pod of a rollout) acts at once
    /// instead of waiting for it to expire. Call it once nothing of this replica acts any more.
    pub async fn release(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(RELEASE_TIMEOUT, self.watching).await;
    }
}

/// Blocks until this replica holds the Lease, then watches it: a replica that loses the
/// Lease stops at once ([`HeldLease::lost`], a supervised task; all rollout state is in the
/// cluster, so the next leader carries on), and its writes stopped already at the renew
/// deadline ([`crate::kube_client::fence`]).
pub async fn wait_for_leadership(client: kube::Client, leader: &LeaderConfig) -> Result<HeldLease> {
    use kube_lease_manager::LeaseManagerBuilder;
    let (duration, grace) = crate::kube_client::fence::lease_timing(leader.duration);
    let manager = LeaseManagerBuilder::new(client, &leader.name)
        .with_namespace(&leader.namespace)
        .with_identity(&leader.identity)
        .with_duration(duration.as_secs())
        .with_grace(grace.as_secs())
        .build()
        .await
        .map_err(|source| Error::LeaderLease {
            lease: format!("{}/{}", leader.namespace, leader.name),
            source,
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
    if let Some(fence) = crate::kube_client::fence::current() {
        fence.hold();
    }
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let (lost_tx, lost) = tokio::sync::oneshot::channel::<()>();
    let heartbeat = crate::liveness::process().register("lease");
    let lease = format!("{}/{}", leader.namespace, leader.name);
    let watching = tokio::spawn(async move {
        let mut idle_beat = tokio::time::interval(crate::liveness::IDLE_BEAT);
        idle_beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            heartbeat.beat();
            crate::liveness::hang_if_asked("lease").await;
            tokio::select! {
                _ = idle_beat.tick() => {}
                _ = &mut stopped => {
                    // Closing the channel makes the lease manager release the Lease and end.
                    drop(holding);
                    match task.await {
                        Ok(Ok(_)) => tracing::info!(%lease, "released the lease"),
                        Ok(Err(e)) => tracing::warn!(%lease, error = %e, "could not release the lease; it expires by itself"),
                        Err(e) => tracing::warn!(%lease, error = %e, "could not release the lease; it expires by itself"),
                    }
                    return;
                }
                changed = holding.changed() => {
                    if changed.is_err() || !*holding.borrow_and_update() {
                        if let Some(fence) = crate::kube_client::fence::current() {
                            fence.lost();
                        }
                        let _ = lost_tx.send(());
                        return;
                    }
                }
            }
        }
    });
    Ok(HeldLease {
        stop,
        watching,
        lost: Some(lost),
    })
}
