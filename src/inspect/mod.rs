//! `linnet get`, `linnet promote` and `linnet abort`: a person's view of one rollout and the
//! emergency levers, for kubectl users. Reading is here; the tree is drawn by [`tree`].

pub mod tree;

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};

use crate::api::{
    ABORT_ANNOTATION, CanaryDeployment, CanaryStatefulSet, PROMOTE_ANNOTATION, ROLLOUT_LABEL,
};
use crate::error::{Error, Result};
pub use tree::{RolloutObject, Snapshot};

/// How long `get -w` waits after a change for more before it draws again.
const SETTLE: Duration = Duration::from_millis(250);

/// Reads rollout `name` in `ns` (either kind) and everything the tree shows.
pub async fn snapshot(client: &Client, ns: &str, name: &str) -> Result<Snapshot> {
    let rollout = find(client, ns, name).await?;
    let kind = match &rollout {
        RolloutObject::StatefulSet(_) => "CanaryStatefulSet",
        RolloutObject::Deployment(_) => "CanaryDeployment",
    };
    let mine = ListParams::default().labels(&format!("{ROLLOUT_LABEL}={name}"));
    let (stateful_sets, deployments) = match &rollout {
        RolloutObject::StatefulSet(_) => (
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .list(&mine)
                .await?
                .items,
            Vec::new(),
        ),
        RolloutObject::Deployment(_) => (
            Vec::new(),
            Api::<Deployment>::namespaced(client.clone(), ns)
                .list(&mine)
                .await?
                .items,
        ),
    };
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&mine)
        .await?
        .items;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&mine)
        .await?
        .items;
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!(
            "involvedObject.name={name},involvedObject.kind={kind}"
        )))
        .await?
        .items;
    Ok(Snapshot {
        rollout,
        stateful_sets,
        deployments,
        pods,
        claims,
        events,
    })
}

async fn find(client: &Client, ns: &str, name: &str) -> Result<RolloutObject> {
    if let Some(r) = Api::<CanaryStatefulSet>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?
    {
        return Ok(RolloutObject::StatefulSet(Box::new(r)));
    }
    if let Some(r) = Api::<CanaryDeployment>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?
    {
        return Ok(RolloutObject::Deployment(Box::new(r)));
    }
    Err(Error::Usage(format!(
        "no CanaryStatefulSet or CanaryDeployment {name} in namespace {ns} \
         (kubectl get csts,cdeploy -A lists them; -n names the namespace)"
    )))
}

/// Draws the tree, then again whenever the rollout, its workloads, pods, claims or events
/// change (watches, not polling), until the process is stopped.
pub async fn watch(
    client: &Client,
    ns: &str,
    name: &str,
    mut draw: impl FnMut(&str),
) -> Result<()> {
    let labels = watcher::Config::default().labels(&format!("{ROLLOUT_LABEL}={name}"));
    let named = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = watcher::Config::default().fields(&format!("involvedObject.name={name}"));
    fn changes<K>(api: Api<K>, config: watcher::Config) -> futures::stream::BoxStream<'static, ()>
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
        K::DynamicType: Default,
    {
        // Backoff: a watch the user may not make is retried slowly, not in a tight loop.
        watcher(api, config).default_backoff().map(|_| ()).boxed()
    }
    let mut any = futures::stream::select_all([
        changes(
            Api::<CanaryStatefulSet>::namespaced(client.clone(), ns),
            named.clone(),
        ),
        changes(
            Api::<CanaryDeployment>::namespaced(client.clone(), ns),
            named,
        ),
        changes(
            Api::<StatefulSet>::namespaced(client.clone(), ns),
            labels.clone(),
        ),
        changes(
            Api::<Deployment>::namespaced(client.clone(), ns),
            labels.clone(),
        ),
        changes(Api::<Pod>::namespaced(client.clone(), ns), labels.clone()),
        changes(
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns),
            labels,
        ),
        changes(Api::<Event>::namespaced(client.clone(), ns), events),
    ]);
    let mut last = String::new();
    loop {
        let text = snapshot(client, ns, name)
            .await?
            .render(jiff::Timestamp::now());
        if text != last {
            draw(&text);
            last = text;
        }
        // Wait for a change, then let a burst of them settle before drawing once.
        if any.next().await.is_none() {
            return Ok(());
        }
        let _ = tokio::time::timeout(SETTLE, async { while any.next().await.is_some() {} }).await;
    }
}

/// Which lever `linnet promote` or `linnet abort` pulls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lever {
    Promote,
    Abort,
}

/// Sets the promote or abort annotation on rollout `name` so that its running canary acts on
/// it: `"true"`, or the canary's image when a `"true"` was already there when the canary
/// started. Refuses when no phase that reads it is under way. Returns what was done.
pub async fn pull(client: &Client, ns: &str, name: &str, lever: Lever) -> Result<String> {
    let (annotation, verb) = match lever {
        Lever::Promote => (PROMOTE_ANNOTATION, "promote"),
        Lever::Abort => (ABORT_ANNOTATION, "abort"),
    };
    let rollout = find(client, ns, name).await?;
    use crate::api::{DeploymentPhase as D, PromotionType, StatefulSetPhase as S};
    let nothing = || {
        Error::Usage(format!(
            "{name} has no canary that can be {verb}d now: nothing to {verb} (linnet get {name} \
             shows its phase)"
        ))
    };
    // The phases whose plan reads the annotation, and what was there when the canary started.
    let (canary, at_start) = match &rollout {
        RolloutObject::StatefulSet(r) => {
            if lever == Lever::Promote && r.spec.promotion.type_ == PromotionType::Auto {
                return Err(Error::Usage(format!(
                    "{name} has promotion Auto: it promotes by itself once every canary pod has \
                     been Ready for bakeSeconds"
                )));
            }
            let status = r.status.clone().unwrap_or_default();
            let acts = match lever {
                Lever::Promote => matches!(
                    status.phase,
                    Some(S::ScalingDownStable | S::DeployingCanary | S::CanaryActive)
                ),
                Lever::Abort => matches!(
                    status.phase,
                    Some(
                        S::ScalingDownStable
                            | S::DeployingCanary
                            | S::CanaryActive
                            | S::AwaitingMigration
                            | S::MigratingData
                    )
                ),
            };
            let at_start = match lever {
                Lever::Promote => status.promote_at_start,
                Lever::Abort => status.abort_at_start,
            };
            (status.canary_image.filter(|_| acts), at_start)
        }
        RolloutObject::Deployment(r) => {
            if lever == Lever::Promote {
                return Err(Error::Usage(format!(
                    "a CanaryDeployment is promoted from Git: set spec.currentBatch of {name} \
                     to the next batch in Git (or strategy Rolling); `linnet abort {name}` \
                     rolls it back"
                )));
            }
            let status = r.status.clone().unwrap_or_default();
            let acts = matches!(status.phase, Some(D::Progressing | D::Paused | D::Failed));
            (status.canary_image.filter(|_| acts), status.abort_at_start)
        }
    };
    let canary = canary.ok_or_else(nothing)?;
    // "true" acts unless it was already there when the canary started (then it was meant for
    // an earlier one); the image acts either way, but would also act on a later canary of the
    // same image if left, so it is used only when it must be.
    let value = if at_start.as_deref() == Some("true") {
        canary.clone()
    } else {
        "true".to_string()
    };
    let patch = Patch::Merge(serde_json::json!({
        "metadata": {"annotations": {annotation: value}}
    }));
    let params = PatchParams::default();
    let params = PatchParams {
        field_manager: Some("linnet-cli".into()),
        ..params
    };
    match &rollout {
        RolloutObject::StatefulSet(_) => {
            Api::<CanaryStatefulSet>::namespaced(client.clone(), ns)
                .patch(name, &params, &patch)
                .await?;
        }
        RolloutObject::Deployment(_) => {
            Api::<CanaryDeployment>::namespaced(client.clone(), ns)
                .patch(name, &params, &patch)
                .await?;
        }
    }
    Ok(format!(
        "set {annotation}={value} on {ns}/{name}; linnet will {verb} the canary of {canary}.\n\
         note: Git stays the source of truth. This is for emergencies: make the same change in \
         Git (merge the promote pull request, or put the old image back), or the next image \
         pushed to Git starts a new rollout."
    ))
}
