//! The wiring both rollout controllers share: what wakes a rollout besides changes of the
//! rollout itself (its routes, its config copies' sources, its analysis Jobs, a shard taken
//! over), the controller's settings, and how its results end. Each kind adds the watches of
//! its own children ([`super::statefulset`], [`super::deployment`]).

use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::batch::v1::Job;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, WatchStreamExt as _, watcher};

use super::Context;
use super::rollout_kind::RolloutKind;

/// A controller of rollouts of kind `K` woken by `wakes` (see [`super::wakes`]), by changes of
/// the routes it shifts, the ConfigMaps and Secrets it copies per version, and the Jobs of
/// its `job` analysis metrics, and by every shard change.
pub(crate) async fn rollout_controller<K>(
    ctx: &Arc<Context>,
    wakes: impl Stream<Item = Arc<K>> + Send + 'static,
    store: Store<K>,
) -> Controller<K>
where
    K: RolloutKind,
{
    // Said once in the log; the route watch runs either way.
    super::traffic::say_if_routes_are_not_served(&ctx.client).await;
    let traffic = super::traffic::traffic_wakes(
        ctx.client.clone(),
        &ctx.scope,
        store.clone(),
        K::traffic_routing,
    );
    let config = super::config_copies::config_wakes(
        ctx.client.clone(),
        ctx.scope.clone(),
        store.clone(),
        &ctx.source,
        K::config_template,
    );
    let jobs = watcher(
        ctx.scope.api::<PartialObjectMeta<Job>>(&ctx.client),
        crate::watch::watch_config(&ctx.child_selector()),
    )
    .backoff(crate::watch::backoff::watch_backoff())
    .touched_objects();
    Controller::for_shared_stream(wakes, store)
        .with_config(ctx.controller_config())
        // Each watch backs off on its own (see `backoff`).
        .trigger_backoff(crate::watch::backoff::NoTriggerBackoff)
        // A shard taken over (or given up) looks at every rollout again.
        .reconcile_all_on(ctx.shards.changes())
        // A fleet's new read of Git may let a held rollout start (or hold a new image): every
        // rollout when the Fleet changed, else those whose reports did.
        .reconcile_all_on(ctx.fleet.changed_all())
        .reconcile_on(ctx.fleet.changed_rollouts::<K>())
        .reconcile_on(traffic)
        .reconcile_on(config)
        .owns_stream(jobs)
}

/// Runs a controller's reconciles to the end; each failure is already logged, counted and
/// shown on the rollout by the reconcile itself, so here it is only traced.
pub(crate) async fn drive<T, E: std::fmt::Display>(results: impl Stream<Item = Result<T, E>>) {
    results
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile did not finish");
            }
        })
        .await;
}
