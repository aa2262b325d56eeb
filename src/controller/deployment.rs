//! The CanaryDeployment controller: observes a rollout's Deployments (from its store),
//! hands them to the shared reconcile ([`super::reconcile`]), whose plan comes from
//! [`crate::plan::deployment::plan`]. It owns its Deployments and analysis Jobs, so their
//! changes (and hand edits) wake it; it requeues only for real timers. Deleting the rollout
//! deletes its Deployments through their owner references.

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};

use super::reconcile;
use super::{Context, ReconcileError};
use crate::api::{CanaryDeployment, ROLLOUT_LABEL};
use crate::plan::observed::{DeploymentView, Observed, StoredDeployment};
use crate::watch::StoreReady;
use crate::watch::rollouts::{Change, Changes, Rollouts};

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    rollouts: Rollouts<CanaryDeployment>,
    changes: Changes<CanaryDeployment>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let store = rollouts.store().clone();
    // A CanaryDeployment has no finalizer: once deleted, no reconcile sees it again.
    let gone = ctx.clone();
    let changes = changes.inspect(move |change| {
        if let Change::Deleted(rollout) = change {
            forget_deleted(&gone, rollout);
        }
    });
    let wakes = super::wakes(changes, store.clone());
    // Read from this watch's store, not with a list in each reconcile, as the sets are. By
    // the rollout label, as the list was: a Deployment of the rollout that lacks this
    // source's label (hand-edited, or made under another source) is still seen, and deleted
    // when it serves no more.
    let (deployments, by_rollout, deployments_ready, deployment_changes) = watch_deployments(
        ctx.scope.api::<StoredDeployment>(&client),
        crate::watch::watch_config(ROLLOUT_LABEL),
        ctx.clone(),
    );
    let controller = super::wiring::rollout_controller(&ctx, wakes, store).await;
    let results = controller
        .owns_stream(deployment_changes)
        .graceful_shutdown_on(shutdown)
        .run(
            reconcile,
            reconcile::error_policy,
            Arc::new(Shared {
                ctx,
                deployments_ready,
                deployments,
                by_rollout,
            }),
        );
    super::wiring::drive(results).await;
}

/// What this controller's reconciles share: the agent's context and the Deployments' store.
struct Shared {
    ctx: Arc<Context>,
    deployments: Store<StoredDeployment>,
    deployments_ready: StoreReady,
    by_rollout: ByRollout,
}

impl reconcile::HasContext for Shared {
    fn context(&self) -> &Context {
        &self.ctx
    }
}

/// A watch of the Deployments linnet made, and the store it fills with
/// [`StoredDeployment`]s, which keep only what [`DeploymentView`] reads.
fn watch_deployments(
    api: Api<StoredDeployment>,
    config: watcher::Config,
    ctx: Arc<Context>,
) -> (
    Store<StoredDeployment>,
    ByRollout,
    StoreReady,
    impl futures::Stream<Item = Result<StoredDeployment, watcher::Error>> + Send + 'static,
) {
    let (reader, writer) = reflector::store();
    let index = ByRollout::default();
    let indexed = index.clone();
    // Ready once the index has the first list too (told here, after it).
    let (told, ready) = StoreReady::told();
    let stream = watcher(api, config)
        .backoff(crate::watch::backoff::watch_backoff())
        .modify(|d| d.metadata.managed_fields = None)
        .reflect(writer)
        .inspect(move |event| {
            if let Ok(event) = event {
                indexed.apply(event);
                super::seen_own_writes(&ctx.own_child_writes, "Deployment", event);
                if matches!(event, watcher::Event::InitDone) {
                    told.send_replace(true);
                }
            }
        })
        .touched_objects();
    (reader, index, ready, stream)
}

type RolloutKey = (String, String);

/// The names of each rollout's Deployments, by namespace and rollout label, kept in step with
/// the store: a reconcile reads its own few Deployments instead of scanning every one (at
/// 1,000 measured rollouts, a hundred scans of 2,000 a second).
#[derive(Clone, Default)]
struct ByRollout(Arc<std::sync::Mutex<Index>>);

#[derive(Default)]
struct Index {
    /// Each rollout's Deployments, and each Deployment's rollout (by namespace and name).
    names: std::collections::HashMap<RolloutKey, std::collections::BTreeSet<String>>,
    rollout_of: std::collections::HashMap<(String, String), RolloutKey>,
    /// What a list under way has found so far; it replaces the above when the list ends.
    listing: Vec<(RolloutKey, String)>,
}

impl Index {
    fn remove(&mut self, ns: &str, name: &str) {
        if let Some(key) = self.rollout_of.remove(&(ns.to_string(), name.to_string()))
            && let Some(names) = self.names.get_mut(&key)
        {
            names.remove(name);
            if names.is_empty() {
                self.names.remove(&key);
            }
        }
    }

    fn insert(&mut self, key: RolloutKey, name: String) {
        self.rollout_of
            .insert((key.0.clone(), name.clone()), key.clone());
        self.names.entry(key).or_default().insert(name);
    }
}

impl ByRollout {
    fn key(d: &StoredDeployment) -> Option<(RolloutKey, String)> {
        let m = &d.metadata;
        let rollout = m.labels.as_ref()?.get(ROLLOUT_LABEL)?;
        Some(((m.namespace.clone()?, rollout.clone()), m.name.clone()?))
    }

    fn apply(&self, event: &watcher::Event<StoredDeployment>) {
        let Ok(mut index) = self.0.lock() else {
            return;
        };
        let ns_name = |d: &StoredDeployment| {
            (
                d.metadata.namespace.clone().unwrap_or_default(),
                d.metadata.name.clone().unwrap_or_default(),
            )
        };
        match event {
            watcher::Event::Apply(d) => {
                // A Deployment whose rollout label changed is under its new rollout only.
                let (ns, name) = ns_name(d);
                index.remove(&ns, &name);
                if let Some((key, name)) = Self::key(d) {
                    index.insert(key, name);
                }
            }
            watcher::Event::Delete(d) => {
                let (ns, name) = ns_name(d);
                index.remove(&ns, &name);
            }
            watcher::Event::Init => index.listing.clear(),
            watcher::Event::InitApply(d) => {
                if let Some(found) = Self::key(d) {
                    index.listing.push(found);
                }
            }
            watcher::Event::InitDone => {
                let listed = std::mem::take(&mut index.listing);
                index.names.clear();
                index.rollout_of.clear();
                for (key, name) in listed {
                    index.insert(key, name);
                }
            }
        }
    }

    fn names(&self, ns: &str, rollout: &str) -> Vec<String> {
        self.0
            .lock()
            .ok()
            .and_then(|i| {
                i.names
                    .get(&(ns.to_string(), rollout.to_string()))
                    .map(|n| n.iter().cloned().collect())
            })
            .unwrap_or_default()
    }
}

async fn reconcile(
    rollout: Arc<CanaryDeployment>,
    shared: Arc<Shared>,
) -> Result<Requeue, ReconcileError> {
    let Some(_running) = reconcile::run_here(&shared.ctx, &*rollout) else {
        return Ok(Requeue::await_change());
    };
    // The store packs labels, annotations and the applied entry; the reconcile reads all
    // three (source, spec hash, when the spec was applied).
    let rollout = crate::api::packed_meta::unpacked(&rollout);
    let inner = reconcile_inner(&rollout, &shared);
    reconcile::measured(&shared.ctx, &*rollout, inner).await
}

/// Takes a deleted rollout out of the first-status wait and the phase metric.
fn forget_deleted(ctx: &Context, rollout: &CanaryDeployment) {
    let ns = rollout.namespace().unwrap_or_default();
    let name = rollout.name_any();
    ctx.first_status_done(&super::own_writes::child_key(
        "CanaryDeployment",
        &ns,
        &name,
    ));
    ctx.metrics
        .rollout_phase("CanaryDeployment", &format!("{ns}/{name}"), None);
}

async fn reconcile_inner(
    rollout: &CanaryDeployment,
    shared: &Shared,
) -> Result<Requeue, ReconcileError> {
    let ctx = &shared.ctx;
    let ns = rollout.namespace().ok_or(ReconcileError::NoNamespace)?;
    if rollout.meta().deletion_timestamp.is_some() {
        forget_deleted(ctx, rollout);
        return Ok(Requeue::await_change());
    }
    let at = ns.as_str();
    let observe = move |_pods: bool| observe(rollout, shared, at);
    reconcile::plan_and_act(ctx, rollout, &ns, observe).await
}

/// The user's Services a blue-green rollout switches by their selector, and the ones it
/// switched before and must hand back.
fn switched_services(rollout: &CanaryDeployment) -> Vec<String> {
    let bg = rollout.spec.strategy.blue_green.as_ref();
    let named = bg
        .into_iter()
        .flat_map(|b| [&b.active_service, &b.preview_service]);
    let before = rollout.status.iter().flat_map(|s| &s.switched_services);
    let mut names: Vec<String> = named.flatten().chain(before).cloned().collect();
    names.sort();
    names.dedup();
    names
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
        .by_rollout
        .names(ns, &name)
        .into_iter()
        .filter_map(|d| shared.deployments.get(&ObjectRef::new(&d).within(ns)))
        .filter(|d| {
            d.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| Some(&o.uid) == uid.as_ref())
        })
        .map(|d| DeploymentView::from_stored(&d, container))
        .collect();
    // The order a list gave (by name), which the planner's choices may follow.
    deployments.sort_by(|a, b| a.name.cmp(&b.name));
    let baseline_name = crate::plan::deployment::baseline_name(&name);
    let baseline = deployments
        .iter()
        .position(|d| d.name == baseline_name)
        .map(|i| deployments.remove(i));
    let routing = rollout.spec.traffic_routing.as_deref();
    let switched = switched_services(rollout);
    let traffic = if routing.is_some() || !switched.is_empty() {
        let with_baseline = rollout.spec.strategy.baseline;
        let client = &shared.ctx.client;
        super::traffic::observe_traffic(client, ns, &name, routing, with_baseline, &switched)
            .await?
    } else {
        Default::default()
    };
    Ok(Observed {
        deployments,
        baseline,
        traffic,
        ..Observed::default()
    })
}
