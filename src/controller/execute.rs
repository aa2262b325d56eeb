//! The one executor of both controllers: each [`Action`] of a plan is one API call (a volume
//! patch is checked first, and made conditional on what was checked).

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Context, Doing, ReconcileError};
use crate::api::{
    BIND_REQUESTED_ANNOTATION, HANDOFF_TO_ANNOTATION, ROLLOUT_LABEL, VOLUME_NAMESPACE_LABEL,
};
use crate::plan::handoff::{VolumePatch, volume_refusal};
use crate::plan::{Action, Observed};
use crate::sync::FIELD_MANAGER;

fn ignore_status(result: Result<(), kube::Error>, code: u16) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(s)) if s.code == code => Ok(()),
        other => other,
    }
}

/// The API calls the actions make again and again: a create that finds its object there
/// already, a delete that finds it gone, and a merge patch, each under the rollouts' field
/// manager where it writes.
trait Calls<K> {
    /// Creates `object`; one there already (409) is the one wanted.
    async fn create_once(&self, object: &K) -> Result<(), kube::Error>;
    /// Deletes `name`; one gone already (404) is the outcome wanted.
    async fn delete_once(&self, name: &str, params: &DeleteParams) -> Result<(), kube::Error>;
    /// Merges `patch` into `name`.
    async fn merge(&self, name: &str, patch: serde_json::Value) -> Result<(), kube::Error>;
}

impl<K> Calls<K> for Api<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    async fn create_once(&self, object: &K) -> Result<(), kube::Error> {
        ignore_status(self.create(&create_params(), object).await.map(|_| ()), 409)
    }
    async fn delete_once(&self, name: &str, params: &DeleteParams) -> Result<(), kube::Error> {
        ignore_status(self.delete(name, params).await.map(|_| ()), 404)
    }
    async fn merge(&self, name: &str, patch: serde_json::Value) -> Result<(), kube::Error> {
        self.patch(name, &update_params(), &Patch::Merge(patch))
            .await
            .map(|_| ())
    }
}

/// Reads `volume` and the claims its patch concerns, and returns the volume's resourceVersion
/// if [`volume_refusal`] lets the handoff of `rollout` make `patch`.
async fn check_volume(
    client: &kube::Client,
    ns: &str,
    rollout: &str,
    volume: &str,
    patch: VolumePatch<'_>,
    what: &impl Fn() -> String,
) -> Result<String, ReconcileError> {
    let Some(pv) = Api::<PersistentVolume>::all(client.clone())
        .get_opt(volume)
        .await
        .doing(what)?
    else {
        return Err(ReconcileError::Waiting(format!("volume {volume} is gone")));
    };
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let named = match claim_ref
        .filter(|r| r.namespace.as_deref() == Some(ns))
        .and_then(|r| r.name.as_deref())
    {
        Some(name) => claims.get_opt(name).await.doing(what)?,
        None => None,
    };
    let target = match patch {
        VolumePatch::Bind { claim, .. } => claims.get_opt(claim).await.doing(what)?,
        VolumePatch::Retain => None,
    };
    match volume_refusal(&pv, ns, rollout, named.as_ref(), target.as_ref(), patch) {
        Some(why) => {
            tracing::warn!(volume, rollout = %format!("{ns}/{rollout}"), why, "refused to patch a volume that is not the rollout's");
            Err(ReconcileError::NotOurs {
                doing: what(),
                why: format!("volume {volume} is not rollout {ns}/{rollout}'s: {why}"),
            })
        }
        // Without a resourceVersion the patch would not be conditional: fail closed.
        None => pv.metadata.resource_version.ok_or_else(|| {
            ReconcileError::Waiting(format!("volume {volume} has no resourceVersion"))
        }),
    }
}

/// Records that the rollout's next reconcile waits for the watch of `child_kind` to show the
/// write that left `name` at `after`, unless the write changed nothing (`after` is `before`,
/// and no watch event will come).
fn expect_seen(
    ctx: &Context,
    (rollout_kind, child_kind): (&str, &str),
    ns: &str,
    rollout: &str,
    name: &str,
    (before, after): (Option<String>, Option<String>),
) {
    if let Some(after) = after
        && before.as_ref() != Some(&after)
    {
        ctx.own_child_writes.expect(
            &format!("{rollout_kind}/{ns}/{rollout}"),
            &super::own_writes::child_key(child_kind, ns, name),
            &after,
            std::time::Instant::now(),
        );
    }
}

/// Does one action of `rollout`'s plan. `observed` is what the plan was made from: a
/// Deployment it shows as the rollout's needs no second look before it is applied.
pub(crate) async fn execute(
    action: &Action,
    ctx: &Context,
    ns: &str,
    rollout: &str,
    observed: &Observed,
) -> Result<(), ReconcileError> {
    let client = ctx.client.clone();
    let what = || action.describe();
    match action {
        Action::ApplySet(set) => apply_set(ctx, set, (ns, rollout), observed, &what).await,
        Action::ScaleSet { name, replicas } => Api::<StatefulSet>::namespaced(client, ns)
            .merge(name, json!({"spec": {"replicas": replicas}}))
            .await
            .doing(what),
        Action::ScaleDeployment { name, replicas } => Api::<Deployment>::namespaced(client, ns)
            .merge(name, json!({"spec": {"replicas": replicas}}))
            .await
            .doing(what),
        Action::DeleteSet { name } => Api::<StatefulSet>::namespaced(client, ns)
            .delete_once(name, &DeleteParams::background())
            .await
            .doing(what),
        Action::RetainVolume { volume, handoff_to } => {
            retain_volume(&client, ns, rollout, volume, handoff_to, &what).await
        }
        Action::CreateClaim(claim) => Api::<PersistentVolumeClaim>::namespaced(client, ns)
            .create_once(claim)
            .await
            .doing(what),
        Action::DeleteClaim { name, .. } => Api::<PersistentVolumeClaim>::namespaced(client, ns)
            .delete_once(name, &DeleteParams::default())
            .await
            .doing(what),
        Action::BindVolume {
            volume,
            claim,
            claim_uid,
        } => bind_volume(&client, ns, rollout, volume, (claim, claim_uid), &what).await,
        Action::RequestBind { claim, volume } => {
            Api::<PersistentVolumeClaim>::namespaced(client, ns)
                .merge(
                    claim,
                    json!({"metadata": {"annotations": {BIND_REQUESTED_ANNOTATION: volume}}}),
                )
                .await
                .doing(what)
        }
        Action::CreateJob(job) => Api::<Job>::namespaced(client, ns)
            .create_once(job)
            .await
            .doing(what),
        Action::DeletePod { name } => Api::<Pod>::namespaced(client, ns)
            .delete_once(name, &DeleteParams::default())
            .await
            .doing(what),
        Action::ApplyDeployment(d) => apply_deployment(ctx, d, ns, rollout, observed, &what).await,
        Action::DeleteDeployment { name } => Api::<Deployment>::namespaced(client, ns)
            .delete_once(name, &DeleteParams::background())
            .await
            .doing(what),
        Action::ApplyService(service) => {
            super::traffic::apply_service(&client, ns, service, &what).await
        }
        route @ (Action::UpdateRoute { .. } | Action::SwitchService { .. }) => {
            super::traffic::write_route(&client, ns, rollout, route, &what).await
        }
    }
}

/// Applies a rollout's StatefulSet, unless another owner has it; a create or a change is
/// waited for in the watch before the rollout plans again.
async fn apply_set(
    ctx: &Context,
    set: &StatefulSet,
    (ns, rollout): (&str, &str),
    observed: &Observed,
    what: &impl Fn() -> String,
) -> Result<(), ReconcileError> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let sets = Api::<StatefulSet>::namespaced(ctx.client.clone(), ns);
    // One the plan saw under this rollout's control needs no second look (as a Deployment).
    let live =
        if super::wakes::observed_as_ours(observed_controller_of(observed, &name), &set.metadata) {
            None
        } else {
            sets.get_metadata_opt(&name).await.doing(what)?
        };
    if let Some(why) = super::foreign_child(live.as_ref().map(|l| &l.metadata), &set.metadata) {
        return Err(ReconcileError::NotOurs { doing: what(), why });
    }
    let written = sets
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(set),
        )
        .await
        .doing(what)?;
    let before = live.and_then(|l| l.metadata.resource_version);
    let kinds = ("CanaryStatefulSet", "StatefulSet");
    let versions = (before, written.metadata.resource_version);
    expect_seen(ctx, kinds, ns, rollout, &name, versions);
    Ok(())
}

/// The controlling owner's uid of the set named `name` as the plan saw it, if it saw one.
fn observed_controller_of<'a>(observed: &'a Observed, name: &str) -> Option<&'a str> {
    observed
        .stable
        .iter()
        .chain(&observed.canary)
        .find(|s| s.name == name)
        .and_then(|s| s.controller_uid.as_deref())
}

/// Applies one of a rollout's Deployments, unless another owner has it.
async fn apply_deployment(
    ctx: &Context,
    d: &Deployment,
    ns: &str,
    rollout: &str,
    observed: &Observed,
    what: &impl Fn() -> String,
) -> Result<(), ReconcileError> {
    let name = d.metadata.name.clone().unwrap_or_default();
    let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), ns);
    // One this rollout owns (observed by its uid) needs no second look.
    let owned = observed
        .deployments
        .iter()
        .chain(observed.baseline.as_ref())
        .any(|o| o.name == name);
    let live = if owned {
        None
    } else {
        deployments.get_metadata_opt(&name).await.doing(what)?
    };
    if let Some(why) = super::foreign_child(live.as_ref().map(|l| &l.metadata), &d.metadata) {
        return Err(ReconcileError::NotOurs { doing: what(), why });
    }
    let written = deployments
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(d),
        )
        .await
        .doing(what)?;
    // A Deployment the rollout already has was not read: only a create, which can never
    // leave the version as it was, is waited for.
    if !owned {
        let before = live.and_then(|l| l.metadata.resource_version);
        let kinds = ("CanaryDeployment", "Deployment");
        let versions = (before, written.metadata.resource_version);
        expect_seen(ctx, kinds, ns, rollout, &name, versions);
    }
    Ok(())
}

/// Keeps a volume past its claim's deletion, marked for the claim it is handed to.
async fn retain_volume(
    client: &kube::Client,
    ns: &str,
    rollout: &str,
    volume: &str,
    handoff_to: &str,
    what: &impl Fn() -> String,
) -> Result<(), ReconcileError> {
    let checked = check_volume(client, ns, rollout, volume, VolumePatch::Retain, what).await?;
    // The resourceVersion makes the patch fail if the volume changed since the check.
    Api::<PersistentVolume>::all(client.clone())
        .merge(
            volume,
            json!({
                "metadata": {
                    "resourceVersion": checked,
                    "labels": {ROLLOUT_LABEL: rollout, VOLUME_NAMESPACE_LABEL: ns},
                    "annotations": {HANDOFF_TO_ANNOTATION: handoff_to},
                },
                "spec": {"persistentVolumeReclaimPolicy": "Retain"},
            }),
        )
        .await
        .doing(what)
}

/// Points a retained volume at the claim (`name`, `uid`) that takes it over.
async fn bind_volume(
    client: &kube::Client,
    ns: &str,
    rollout: &str,
    volume: &str,
    (claim, claim_uid): (&str, &str),
    what: &impl Fn() -> String,
) -> Result<(), ReconcileError> {
    let patch = VolumePatch::Bind { claim, claim_uid };
    let checked = check_volume(client, ns, rollout, volume, patch, what).await?;
    Api::<PersistentVolume>::all(client.clone())
        .merge(
            volume,
            json!({
                "metadata": {"resourceVersion": checked},
                "spec": {"claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": ns,
                    "name": claim,
                    "uid": claim_uid,
                    "resourceVersion": null,
                }},
            }),
        )
        .await
        .doing(what)
}

/// A create under the rollouts' field manager.
fn create_params() -> PostParams {
    crate::kube_client::post_as(crate::api::field_managers::ROLLOUT)
}

/// A merge patch under the rollouts' field manager.
fn update_params() -> PatchParams {
    crate::kube_client::patch_as(crate::api::field_managers::ROLLOUT)
}
