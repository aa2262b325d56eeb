//! The CanaryDeployment controller: observes a rollout's Deployments, asks
//! [`crate::plan::deployment::plan`] what to do, does it, and writes status and events. It
//! owns its Deployments, so their changes (and hand edits) wake it; it requeues only for the
//! progress deadline. Deleting the rollout deletes its Deployments through their owner
//! references.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action as Requeue;
use kube::{Api, Resource, ResourceExt};

use super::analysis::{Measured, measure};
use super::{Context, Doing, ReconcileError, StatusWrite, show_action_failure, write_status};
use crate::api::{
    ABORT_ANNOTATION, CanaryDeployment, REVISION_ANNOTATION, ROLLOUT_LABEL, SOURCE_LABEL,
    SOURCE_PATH_ANNOTATION,
};
use crate::plan::deployment::{
    DeployAction, DeployRollout, DeploymentView, analysis_builtins, plan, reads_abort,
};
use crate::plan::objects::RolloutRef;
use crate::runtime::rollouts::Rollouts;
use crate::sync::FIELD_MANAGER;

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    rollouts: Rollouts<CanaryDeployment>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let store = rollouts.store().clone();
    let wakes = super::wakes(rollouts.subscribe());
    Controller::for_shared_stream(wakes, store)
        .with_config(ctx.controller_config())
        .owns(
            Api::<Deployment>::all(client.clone()),
            crate::controller::watch_config(&ctx.child_selector()),
        )
        // The Jobs of `job` analysis metrics.
        .owns(
            Api::<k8s_openapi::api::batch::v1::Job>::all(client),
            crate::controller::watch_config(&ctx.child_selector()),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile did not finish");
            }
        })
        .await;
}

fn error_policy(
    rollout: Arc<CanaryDeployment>,
    error: &ReconcileError,
    _: Arc<Context>,
) -> Requeue {
    tracing::warn!(
        rollout = %format!("{}/{}", rollout.namespace().unwrap_or_default(), rollout.name_any()),
        error = %error,
        "reconcile failed; retrying"
    );
    Requeue::requeue(Duration::from_secs(5))
}

async fn reconcile(
    rollout: Arc<CanaryDeployment>,
    ctx: Arc<Context>,
) -> Result<Requeue, ReconcileError> {
    let result = ctx
        .measured("CanaryDeployment", reconcile_inner(&rollout, &ctx))
        .await;
    if let Err(e @ ReconcileError::Kube { .. }) = &result {
        ctx.publish(
            &rollout.object_ref(&()),
            true,
            "ReconcileFailed",
            &e.to_string(),
        )
        .await;
    }
    result
}

async fn reconcile_inner(
    rollout: &CanaryDeployment,
    ctx: &Context,
) -> Result<Requeue, ReconcileError> {
    let ns = rollout.namespace().ok_or(ReconcileError::NoNamespace)?;
    let name = rollout.name_any();
    if rollout.meta().deletion_timestamp.is_some() {
        ctx.metrics
            .rollout_phase("CanaryDeployment", &format!("{ns}/{name}"), None);
        return Ok(Requeue::await_change());
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let container = rollout.spec.container.as_deref();
    let observed: Vec<DeploymentView> = deployments
        .list(&ListParams::default().labels(&format!("{ROLLOUT_LABEL}={name}")))
        .await
        .doing(|| format!("listing the Deployments of {ns}/{name}"))?
        .items
        .iter()
        .filter(|d| {
            d.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == rollout.uid().as_ref())
        })
        .map(|d| DeploymentView::from_object(d, container))
        .collect();
    let mut status = rollout.status.clone().unwrap_or_default();
    let builtins = analysis_builtins(&name, &ns, &rollout.spec, &status);
    let resolved = ctx
        .templates
        .resolve(rollout.spec.analysis.as_ref(), &ns, &builtins)
        .await;
    let now = jiff::Timestamp::now();
    let reference = RolloutRef {
        name: name.clone(),
        namespace: ns.clone(),
        uid: rollout.uid().unwrap_or_default(),
        source: rollout.labels().get(SOURCE_LABEL).cloned(),
    };
    let measured = Measured {
        reference: &reference,
        kind: "CanaryDeployment",
        active: status.phase.is_some_and(reads_abort)
            && !super::status_write_pending(ctx, "CanaryDeployment", rollout),
    };
    measure(ctx, measured, &mut status.analysis, &resolved, now).await;
    let input = DeployRollout {
        reference,
        generation: rollout.metadata.generation,
        spec: &rollout.spec,
        source_revision: rollout.annotations().get(REVISION_ANNOTATION).cloned(),
        source_path: rollout.annotations().get(SOURCE_PATH_ANNOTATION).cloned(),
        abort: rollout.annotations().get(ABORT_ANNOTATION).cloned(),
        status,
        analysis: resolved,
    };
    let planned = plan(&input, &observed, now);
    ctx.metrics.rollout_phase(
        "CanaryDeployment",
        &format!("{ns}/{name}"),
        planned.status.phase.map(|p| format!("{p:?}")).as_deref(),
    );
    let written = write_status(
        ctx,
        rollout,
        "CanaryDeployment",
        rollout.status.as_ref(),
        &planned.status,
    )
    .await?;
    for action in &planned.actions {
        tracing::info!(rollout = %format!("{ns}/{name}"), action = %action.describe(), "acting");
        let what = || action.describe();
        let result: Result<(), ReconcileError> = match action {
            DeployAction::Apply(d) => {
                let name = d.metadata.name.as_deref().unwrap_or_default();
                // One this rollout owns (observed by its uid) needs no second look.
                let known = observed.iter().any(|o| o.name == name);
                let live = if known {
                    Ok(None)
                } else {
                    deployments.get_metadata_opt(name).await.doing(what)
                };
                match live {
                    Err(e) => Err(e),
                    Ok(live) => {
                        match super::foreign_child(live.as_ref().map(|l| &l.metadata), &d.metadata)
                        {
                            Some(why) => Err(ReconcileError::NotOurs { doing: what(), why }),
                            None => deployments
                                .patch(
                                    name,
                                    &PatchParams::apply(FIELD_MANAGER).force(),
                                    &Patch::Apply(d.as_ref()),
                                )
                                .await
                                .map(|_| ())
                                .doing(what),
                        }
                    }
                }
            }
            DeployAction::Delete { name } => {
                match deployments.delete(name, &DeleteParams::background()).await {
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    other => other.map(|_| ()),
                }
                .doing(what)
            }
        };
        if let Err(e) = result {
            let kind = "CanaryDeployment";
            return Err(show_action_failure(ctx, rollout, kind, &planned.status, e, now).await);
        }
    }
    let object = rollout.object_ref(&());
    let announced = written == StatusWrite::Repeated;
    for e in planned.events.iter().filter(|_| !announced) {
        tracing::info!(rollout = %format!("{ns}/{name}"), reason = e.reason, "{}", e.message);
        ctx.publish(&object, e.warning, e.reason, &e.message).await;
    }
    Ok(match planned.requeue_after {
        Some(after) => Requeue::requeue(after),
        None => Requeue::await_change(),
    })
}
