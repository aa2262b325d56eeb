//! Rollouts no linnet source manages: a CanaryStatefulSet or CanaryDeployment made with
//! `kubectl apply` has no source label, so no agent's controller sees it, and it would sit
//! there without status or a word. This watches for them and puts one Warning event on each,
//! saying why nothing happens and what would manage it, and a status that says so in
//! conditions (Stalled: kstatus reads it as Failed, not as a healthy, empty status).

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt as _;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Resource, ResourceExt};

use super::Context;
use crate::api::{CanaryDeployment, CanaryStatefulSet, SOURCE_LABEL};

pub use crate::plan::unmanaged::NOT_MANAGED;

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
        ctx.scope.api::<CanaryStatefulSet>(&ctx.client),
        unlabelled.clone(),
        "CanaryStatefulSet",
    );
    let deploys = warn_each(
        ctx.clone(),
        ctx.scope.api::<CanaryDeployment>(&ctx.client),
        unlabelled,
        "CanaryDeployment",
    );
    tokio::select! {
        _ = sets => {}
        _ = deploys => {}
        _ = shutdown => {}
    }
}

/// Either rollout kind, as this module reads and writes it.
trait WatchedRollout:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + serde::Serialize
    + Send
    + Sync
    + 'static
{
}

impl<K> WatchedRollout for K where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize
        + Send
        + Sync
        + 'static
{
}

async fn warn_each<K: WatchedRollout>(
    ctx: Arc<Context>,
    api: Api<K>,
    config: watcher::Config,
    kind: &str,
) {
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
        tracing::warn!(kind, namespace = ?object.namespace(), name = %object.name_any(), "a rollout no linnet source manages; it gets an event and a status saying so");
        let message = not_managed_message(kind, &ctx.source);
        ctx.publish(&object.object_ref(&()), true, NOT_MANAGED, &message)
            .await;
        mark_not_managed(&ctx, &object, kind, &message).await;
    }
}

/// Writes the NotManaged status on `object` (the field manager the controllers write status
/// with, so a source that later adopts the rollout replaces it whole).
async fn mark_not_managed<K: WatchedRollout>(ctx: &Context, object: &K, kind: &str, message: &str) {
    let current = serde_json::to_value(object).unwrap_or_default();
    if crate::plan::unmanaged::says_not_managed(&current["status"], object.meta().generation) {
        return;
    }
    let status = crate::plan::unmanaged::not_managed_status(
        object.meta().generation,
        message,
        jiff::Timestamp::now(),
    );
    let patch = serde_json::json!({
        "apiVersion": crate::api::API_VERSION,
        "kind": kind,
        "status": status,
    });
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
    let params = kube::api::PatchParams::apply(crate::sync::FIELD_MANAGER).force();
    if let Err(e) = api
        .patch_status(
            &object.name_any(),
            &params,
            &kube::api::Patch::Apply(&patch),
        )
        .await
    {
        tracing::warn!(kind, name = %object.name_any(), error = %crate::error::kube_message(&e), "cannot write the NotManaged status");
    }
}
