//! The CanaryDeployment controller: observes a rollout's Deployments (from its store),
//! hands them to the shared reconcile ([`super::reconcile`]), whose plan comes from
//! [`crate::plan::deployment::plan`]. It owns its Deployments and analysis Jobs, so their
//! changes (and hand edits) wake it; it requeues only for real timers. Deleting the rollout
//! deletes its Deployments through their owner references.

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::Controller;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};

use super::reconcile;
use super::{Context, ReconcileError, StoreReady};
use crate::api::{CanaryDeployment, ROLLOUT_LABEL};
use crate::plan::observed::{DeploymentView, Observed, StoredDeployment};
use crate::runtime::rollouts::{Changes, Rollouts};

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    rollouts: Rollouts<CanaryDeployment>,
    changes: Changes<CanaryDeployment>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let store = rollouts.store().clone();
    let wakes = super::wakes(changes, store.clone());
    let children = crate::controller::watch_config(&ctx.child_selector());
    // Read from this watch's store, not with a list in each reconcile, as the sets are. By
    // the rollout label, as the list was: a Deployment of the rollout that lacks this
    // source's label (hand-edited, or made under another source) is still seen, and deleted
    // when it serves no more.
    let (deployments, deployment_changes) = watch_deployments(
        Api::<StoredDeployment>::all(client.clone()),
        crate::controller::watch_config(ROLLOUT_LABEL),
    );
    Controller::for_shared_stream(wakes, store)
        .with_config(ctx.controller_config())
        .owns_stream(deployment_changes)
        // The Jobs of `job` analysis metrics.
        .owns(
            Api::<k8s_openapi::api::batch::v1::Job>::all(client),
            children,
        )
        .graceful_shutdown_on(shutdown)
        .run(
            reconcile,
            reconcile::error_policy,
            Arc::new(Shared {
                ctx,
                deployments_ready: StoreReady::of(deployments.clone()),
                deployments,
            }),
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile did not finish");
            }
        })
        .await;
}

/// What this controller's reconciles share: the agent's context and the Deployments' store.
struct Shared {
    ctx: Arc<Context>,
    deployments: Store<StoredDeployment>,
    deployments_ready: StoreReady,
}

/// A watch of the Deployments linnet made, and the store it fills with
/// [`StoredDeployment`]s, which keep only what [`DeploymentView`] reads.
fn watch_deployments(
    api: Api<StoredDeployment>,
    config: watcher::Config,
) -> (
    Store<StoredDeployment>,
    impl futures::Stream<Item = Result<StoredDeployment, watcher::Error>> + Send + 'static,
) {
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|d| d.metadata.managed_fields = None)
        .reflect(writer)
        .touched_objects();
    (reader, stream)
}

async fn reconcile(
    rollout: Arc<CanaryDeployment>,
    shared: Arc<Shared>,
) -> Result<Requeue, ReconcileError> {
    let inner = reconcile_inner(&rollout, &shared);
    reconcile::measured(&shared.ctx, &*rollout, inner).await
}

async fn reconcile_inner(
    rollout: &CanaryDeployment,
    shared: &Shared,
) -> Result<Requeue, ReconcileError> {
    let ctx = &shared.ctx;
    let ns = rollout.namespace().ok_or(ReconcileError::NoNamespace)?;
    if rollout.meta().deletion_timestamp.is_some() {
        let key = format!("{ns}/{}", rollout.name_any());
        ctx.metrics.rollout_phase("CanaryDeployment", &key, None);
        return Ok(Requeue::await_change());
    }
    let observed = observe(rollout, shared, &ns).await?;
    reconcile::plan_and_act(ctx, rollout, &ns, &observed).await
}

/// The rollout's Deployments: labelled with its name, in its namespace, owned by its uid.
async fn observe(
    rollout: &CanaryDeployment,
    shared: &Shared,
    ns: &str,
) -> Result<Observed, ReconcileError> {
    // Until the first list is in, a missing Deployment may only be unlisted.
    shared
        .deployments_ready
        .wait()
        .await
        .map_err(|_| ReconcileError::Waiting("the Deployment watch".into()))?;
    let name = rollout.name_any();
    let uid = rollout.uid();
    let container = rollout.spec.container.as_deref();
    let mut deployments: Vec<DeploymentView> = shared
        .deployments
        .state()
        .iter()
        .filter(|d| d.metadata.namespace.as_deref() == Some(ns))
        .filter(|d| {
            d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLLOUT_LABEL))
                == Some(&name)
        })
        .filter(|d| {
            d.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| Some(&o.uid) == uid.as_ref())
        })
        .map(|d| DeploymentView::from_stored(d, container))
        .collect();
    // The order a list gave (by name), which the planner's choices may follow.
    deployments.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Observed {
        deployments,
        ..Observed::default()
    })
}
