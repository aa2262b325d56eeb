//! Rollouts no linnet source manages: a CanaryStatefulSet or CanaryDeployment made with
//! `kubectl apply` has no source label, so no agent's controller sees it, and it would sit
//! there without status or a word. This watches for them and puts one Warning event on each,
//! saying why nothing happens and what would manage it.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt as _;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Resource, ResourceExt};

use super::Context;
use crate::api::{CanaryDeployment, CanaryStatefulSet, SOURCE_LABEL};

/// Reason of the event on a rollout no source manages.
pub const NOT_MANAGED: &str = "NotManaged";

/// What the event says about rollout `kind` when this agent's source is `source`.
pub fn not_managed_message(kind: &str, source: &str) -> String {
    format!(
        "no linnet source manages this {kind}: it has no {SOURCE_LABEL} label, so it was not \
         applied from Git by linnet and nothing rolls it out. Put it in the Git repository a \
         linnet agent follows (this agent's source is {source:?}); linnet labels what it \
         applies, and its controllers act only on rollouts of their own source"
    )
}

/// Watches both kinds for rollouts without a source label until `shutdown`.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()>) {
    let unlabelled = crate::watch::watch_config(&format!("!{SOURCE_LABEL}"));
    let sets = warn_each(
        ctx.clone(),
        Api::<CanaryStatefulSet>::all(ctx.client.clone()),
        unlabelled.clone(),
        "CanaryStatefulSet",
    );
    let deploys = warn_each(
        ctx.clone(),
        Api::<CanaryDeployment>::all(ctx.client.clone()),
        unlabelled,
        "CanaryDeployment",
    );
    tokio::select! {
        _ = sets => {}
        _ = deploys => {}
        _ = shutdown => {}
    }
}

async fn warn_each<K>(ctx: Arc<Context>, api: Api<K>, config: watcher::Config, kind: &str)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
{
    // Once per object and generation while this agent runs (a restart says it once more);
    // a deleted object's entries go with it.
    let mut warned: HashMap<String, Option<i64>> = HashMap::new();
    let mut events =
        std::pin::pin!(watcher(api, config).backoff(crate::watch::backoff::watch_backoff()));
    while let Some(next) = events.next().await {
        let object = match next {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => object,
            Ok(watcher::Event::Delete(object)) => {
                warned.remove(&object.uid().unwrap_or_default());
                continue;
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            Err(e) => {
                tracing::debug!(error = %e, kind, "watch of unmanaged rollouts interrupted");
                continue;
            }
        };
        if object.meta().deletion_timestamp.is_some() {
            continue;
        }
        let generation = object.meta().generation;
        if warned.insert(object.uid().unwrap_or_default(), generation) == Some(generation) {
            continue;
        }
        tracing::warn!(kind, namespace = ?object.namespace(), name = %object.name_any(), "a rollout no linnet source manages; it gets an event saying so");
        ctx.publish(
            &object.object_ref(&()),
            true,
            NOT_MANAGED,
            &not_managed_message(kind, &ctx.source),
        )
        .await;
    }
}
