//! `linnet get`, `linnet promote` and `linnet abort`: a person's view of one rollout and the
//! emergency levers, for kubectl users. Reading is here; the tree is drawn by [`tree`].

pub mod list;
pub mod object;
pub mod table;
pub mod tree;

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{ListParams, Patch};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};

use crate::api::{
    ABORT_ANNOTATION, CanaryDeployment, CanaryStatefulSet, PROMOTE_ANNOTATION, ROLLOUT_LABEL,
};
use crate::error::{Error, Result};
pub use object::RolloutObject;
pub use tree::Snapshot;

/// How long `get -w` waits after a change for more before it draws again.
const SETTLE: Duration = Duration::from_millis(250);

/// Reads rollout `target` in `ns` (`name` of either kind, or `kind/name`) and everything the
/// tree shows.
pub async fn snapshot(client: &Client, ns: &str, target: &str) -> Result<Snapshot> {
    let rollout = find(client, ns, target).await?;
    let kind = rollout.kind();
    let name = rollout.name();
    let name = name.as_str();
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

/// The kinds a `kind/name` may name, as `kubectl get` takes them.
const STATEFULSET_NAMES: [&str; 4] = [
    "csts",
    "canarysts",
    "canarystatefulset",
    "canarystatefulsets",
];
const DEPLOYMENT_NAMES: [&str; 4] = [
    "cdeploy",
    "canarydeploy",
    "canarydeployment",
    "canarydeployments",
];

/// Which kinds `target` may be, and its name: `name` is either kind, `kind/name` one.
pub fn parse_target(target: &str) -> Result<(bool, bool, &str)> {
    let Some((kind, name)) = target.split_once('/') else {
        return Ok((true, true, target));
    };
    let kind = kind.to_ascii_lowercase();
    let kind = kind.split('.').next().unwrap_or_default();
    if STATEFULSET_NAMES.contains(&kind) {
        Ok((true, false, name))
    } else if DEPLOYMENT_NAMES.contains(&kind) {
        Ok((false, true, name))
    } else {
        Err(Error::Usage(format!(
            "{target}: no such kind of rollout; say csts/NAME (CanaryStatefulSet) or \
             cdeploy/NAME (CanaryDeployment)"
        )))
    }
}

async fn find(client: &Client, ns: &str, target: &str) -> Result<RolloutObject> {
    let (sts, deploy, name) = parse_target(target)?;
    let mut found = Vec::new();
    if sts
        && let Some(r) = Api::<CanaryStatefulSet>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(crds_missing)?
    {
        found.push(RolloutObject::StatefulSet(Box::new(r)));
    }
    if deploy
        && let Some(r) = Api::<CanaryDeployment>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(crds_missing)?
    {
        found.push(RolloutObject::Deployment(Box::new(r)));
    }
    match found.len() {
        0 => Err(Error::Usage(format!(
            "no CanaryStatefulSet or CanaryDeployment {name} in namespace {ns} \
             (linnet get -A lists them; -n names the namespace)"
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(Error::Usage(format!(
            "both a CanaryStatefulSet and a CanaryDeployment are named {name} in namespace \
             {ns}: say csts/{name} or cdeploy/{name}"
        ))),
    }
}

/// Every rollout of either kind in `ns`, or in every namespace.
pub async fn list(client: &Client, ns: Option<&str>) -> Result<Vec<RolloutObject>> {
    let params = ListParams::default();
    let (sets, deployments) = match ns {
        Some(ns) => (
            Api::<CanaryStatefulSet>::namespaced(client.clone(), ns),
            Api::<CanaryDeployment>::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let sets = sets.list(&params).await.map_err(crds_missing)?.items;
    let deployments = deployments.list(&params).await.map_err(crds_missing)?.items;
    Ok(sets
        .into_iter()
        .map(|r| RolloutObject::StatefulSet(Box::new(r)))
        .chain(
            deployments
                .into_iter()
                .map(|r| RolloutObject::Deployment(Box::new(r))),
        )
        .collect())
}

/// A 404 that is not a Status about one object: the API server does not serve linnet's kinds.
pub fn crds_missing(e: kube::Error) -> Error {
    match &e {
        kube::Error::Api(s) if s.code == 404 && s.reason != "NotFound" => Error::CrdsMissing,
        _ => Error::Kube(e),
    }
}

/// Waits for a change, then lets a burst of them settle (so that one drawing follows it),
/// noting each watch that has listed once; `false` once the watches ended.
async fn next_burst(
    changes: &mut (impl futures::Stream<Item = Option<usize>> + Unpin),
    listed: &mut [bool],
) -> bool {
    let Some(change) = changes.next().await else {
        return false;
    };
    let mut note = |done_listing: Option<usize>| {
        if let Some(i) = done_listing {
            listed[i] = true;
        }
    };
    note(change);
    let _ = tokio::time::timeout(SETTLE, async {
        while let Some(next) = changes.next().await {
            note(next);
        }
    })
    .await;
    true
}

/// Draws the tree, then again whenever the rollout, its workloads, pods, claims or events
/// change, until the process is stopped. The first drawing is read with plain requests (it
/// says at once when there is no such rollout); after that, watches keep a copy of each, and
/// every drawing is made from those copies: no request per change.
pub async fn watch(
    client: &Client,
    ns: &str,
    name: &str,
    mut draw: impl FnMut(&str),
) -> Result<()> {
    let start = snapshot(client, ns, name).await?;
    let mut last = start.render(jiff::Timestamp::now());
    draw(&last);
    let kind = start.rollout.kind();
    let name = start.rollout.name();
    let name = name.as_str();
    let labels = watcher::Config::default().labels(&format!("{ROLLOUT_LABEL}={name}"));
    let named = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let about = watcher::Config::default().fields(&format!(
        "involvedObject.name={name},involvedObject.kind={kind}"
    ));
    let c = || client.clone();
    let (set_rollouts, w0) = mirror(
        Api::<CanaryStatefulSet>::namespaced(c(), ns),
        named.clone(),
        0,
    );
    let (deploy_rollouts, w1) = mirror(Api::<CanaryDeployment>::namespaced(c(), ns), named, 1);
    let (stateful_sets, w2) = mirror(Api::<StatefulSet>::namespaced(c(), ns), labels.clone(), 2);
    let (deployments, w3) = mirror(Api::<Deployment>::namespaced(c(), ns), labels.clone(), 3);
    let (pods, w4) = mirror(Api::<Pod>::namespaced(c(), ns), labels.clone(), 4);
    let (claims, w5) = mirror(Api::<PersistentVolumeClaim>::namespaced(c(), ns), labels, 5);
    let (events, w6) = mirror(Api::<Event>::namespaced(c(), ns), about, 6);
    let mut changes = futures::stream::select_all([w0, w1, w2, w3, w4, w5, w6]);
    // Which watches have listed once: a drawing before all have would show part of the tree.
    let mut listed = [false; 7];
    loop {
        if !next_burst(&mut changes, &mut listed).await {
            return Ok(());
        }
        if !listed.iter().all(|l| *l) {
            continue;
        }
        let rollout = match start.rollout {
            RolloutObject::StatefulSet(_) => set_rollouts
                .state()
                .first()
                .map(|r| RolloutObject::StatefulSet(Box::new(CanaryStatefulSet::clone(r)))),
            RolloutObject::Deployment(_) => deploy_rollouts
                .state()
                .first()
                .map(|r| RolloutObject::Deployment(Box::new(CanaryDeployment::clone(r)))),
        };
        let Some(rollout) = rollout else {
            return Err(Error::Usage(format!(
                "{kind} {name} in namespace {ns} was deleted"
            )));
        };
        let text = Snapshot {
            rollout,
            stateful_sets: owned(&stateful_sets),
            deployments: owned(&deployments),
            pods: owned(&pods),
            claims: owned(&claims),
            events: owned(&events),
        }
        .render(jiff::Timestamp::now());
        if text != last {
            draw(&text);
            last = text;
        }
    }
}

/// A watch of `api` kept in a store, and its stream of changes: each item is `Some(tag)`
/// once the watch has listed everything (and after each relist), else `None`. It backs off
/// on errors: a watch the user may not make is retried slowly, not in a tight loop.
fn mirror<K>(
    api: Api<K>,
    config: watcher::Config,
    tag: usize,
) -> (Store<K>, futures::stream::BoxStream<'static, Option<usize>>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let changes = reflector(
        writer,
        watcher(api, config).backoff(crate::watch::backoff::watch_backoff()),
    )
    .map(move |event| matches!(event, Ok(watcher::Event::InitDone)).then_some(tag))
    .boxed();
    (store, changes)
}

/// The objects of a store, owned.
fn owned<K: kube::Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> Vec<K> {
    store.state().iter().map(|o| K::clone(o)).collect()
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
    let name = rollout.name();
    let name = name.as_str();
    use crate::plan::{deployment, statefulset};
    let nothing = || {
        Error::Usage(format!(
            "{name} has no canary to {verb} now: no phase under way reads the {verb} lever (linnet get {name} \
             shows its phase)"
        ))
    };
    // Only a phase whose plan reads the annotation; with what was there at the canary's start.
    let (canary, at_start) = match &rollout {
        RolloutObject::StatefulSet(r) => {
            if lever == Lever::Promote && r.spec.promotion.type_ == crate::api::PromotionType::Auto
            {
                return Err(Error::Usage(format!(
                    "{name} has promotion Auto: it promotes by itself once every canary pod has \
                     been Ready for bakeSeconds"
                )));
            }
            let status = r.status.clone().unwrap_or_default();
            let (acts, at_start) = match lever {
                Lever::Promote => (
                    status.phase.is_some_and(statefulset::reads_promote),
                    status.promote_at_start,
                ),
                Lever::Abort => (
                    status.phase.is_some_and(statefulset::reads_abort),
                    status.abort_at_start,
                ),
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
            let acts = status.phase.is_some_and(deployment::reads_abort);
            (status.canary_image.filter(|_| acts), status.abort_at_start)
        }
    };
    let canary = canary.ok_or_else(nothing)?;
    let value = crate::plan::acting_value(at_start.as_deref(), &canary);
    let patch = Patch::Merge(serde_json::json!({
        "metadata": {"annotations": {annotation: value}}
    }));
    let params = crate::kube_client::patch_as(crate::api::field_managers::CLI);
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
