//! Leader election: one replica acts, the others wait to hold the Lease.

use super::config::LeaderConfig;
use crate::{Error, Result};

/// Blocks until this replica holds the Lease, then watches it: a replica that loses the
/// Lease exits at once (all rollout state is in the cluster, so the next leader carries on),
/// which is the surest way never to have two replicas acting.
pub async fn wait_for_leadership(client: kube::Client, leader: &LeaderConfig) -> Result<()> {
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
