//! The CanaryStatefulSet controller: observes a rollout's sets, pods, claims, volumes and
//! migration Job, asks [`crate::plan::statefulset::plan`] what to do, does it, and writes
//! status and events. Child changes wake it (`owns`/`watches`); it requeues only for the bake
//! timer and the progress deadline.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};

use super::execute::execute;
use super::reconcile;
use super::{Context, Doing, ReconcileError};
use crate::api::{CanaryStatefulSet, FINALIZER, ROLLOUT_LABEL, StatefulSetStrategyType};
use crate::plan::objects::{Role, migration_job_name};
use crate::plan::observed::{
    ClaimView, JobView, Observed, PodView, SetView, StoredSet, VolumeView,
};
use crate::plan::statefulset::plan_cleanup;
use crate::watch::StoreReady;
use crate::watch::rollouts::{Changes, Rollouts};

pub use crate::api::VOLUME_NAMESPACE_LABEL;

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    rollouts: Rollouts<CanaryStatefulSet>,
    changes: Changes<CanaryStatefulSet>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let store = rollouts.store().clone();
    let wakes = super::wakes(changes, store.clone());
    let children = crate::watch::watch_config(&ctx.child_selector());
    // The sets are read from this watch's store, not with a GET in each reconcile: at 1,000
    // rollouts those GETs were a third of the API server's requests in a first sync.
    let (sets, set_changes) = watch_sets(
        ctx.scope.api::<StoredSet>(&client),
        children.clone(),
        ctx.clone(),
    );
    // Pods and claims carry the set's selector labels (the rollout's name), not the source;
    // volumes carry the rollout's name and namespace once a handoff has touched them. Every
    // wait of the phase machine is on one of these, so each is woken by what it waits for,
    // never by linnet's own status write (which `watch_rollouts` filters out).
    let by_rollout = crate::watch::watch_config(ROLLOUT_LABEL);
    let pods = watcher(
        ctx.scope.api::<PartialObjectMeta<Pod>>(&client),
        by_rollout.clone(),
    )
    .backoff(crate::watch::backoff::watch_backoff())
    .touched_objects();
    let volumes = watcher(
        Api::<PartialObjectMeta<PersistentVolume>>::all(client.clone()),
        by_rollout.clone(),
    )
    .backoff(crate::watch::backoff::watch_backoff())
    .touched_objects();
    // Pods, claims and volumes carry only the rollout's name, so these watches see every
    // agent's; only those of a rollout this agent runs (in its store) wake a reconcile.
    let ours = |store: &Store<CanaryStatefulSet>| {
        let store = store.clone();
        move |object: Option<ObjectRef<CanaryStatefulSet>>| {
            object.filter(|r| store.get(r).is_some())
        }
    };
    let claims = watcher(
        ctx.scope
            .api::<PartialObjectMeta<PersistentVolumeClaim>>(&client),
        by_rollout,
    )
    .backoff(crate::watch::backoff::watch_backoff())
    .touched_objects();
    let (for_claims, for_pods, for_volumes) = (ours(&store), ours(&store), ours(&store));
    let controller = super::wiring::rollout_controller(&ctx, wakes, store).await;
    let results = controller
        .owns_stream(set_changes)
        .watches_stream(claims, move |claim| {
            for_claims(rollout_of(&claim, claim.namespace()))
        })
        .watches_stream(pods, move |pod| for_pods(rollout_of(&pod, pod.namespace())))
        .watches_stream(volumes, move |volume| {
            let ns = volume.labels().get(VOLUME_NAMESPACE_LABEL).cloned();
            for_volumes(rollout_of(&volume, ns))
        })
        .graceful_shutdown_on(shutdown)
        .run(
            reconcile,
            reconcile::error_policy,
            Arc::new(Shared {
                ctx,
                sets_ready: StoreReady::of(sets.clone()),
                sets,
            }),
        );
    super::wiring::drive(results).await;
}

/// The rollout an object labelled with [`ROLLOUT_LABEL`] belongs to, in namespace `ns`.
fn rollout_of(object: &impl Resource, ns: Option<String>) -> Option<ObjectRef<CanaryStatefulSet>> {
    let rollout = object.meta().labels.as_ref()?.get(ROLLOUT_LABEL)?;
    Some(ObjectRef::<CanaryStatefulSet>::new(rollout).within(&ns?))
}

/// What this controller's reconciles share: the agent's context and the store of the sets.
struct Shared {
    ctx: Arc<Context>,
    sets: Store<StoredSet>,
    sets_ready: StoreReady,
}

impl reconcile::HasContext for Shared {
    fn context(&self) -> &Context {
        &self.ctx
    }
}

/// A watch of the sets linnet made, and the store it fills with [`StoredSet`]s, which keep
/// only what [`SetView`] reads.
fn watch_sets(
    api: Api<StoredSet>,
    config: watcher::Config,
    ctx: Arc<Context>,
) -> (
    Store<StoredSet>,
    impl futures::Stream<Item = Result<StoredSet, watcher::Error>> + Send + 'static,
) {
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .backoff(crate::watch::backoff::watch_backoff())
        .modify(StoredSet::compact)
        .reflect(writer)
        // After the store has it: the reconcile this event wakes plans from it.
        .inspect(move |event| {
            if let Ok(event) = event {
                super::seen_own_writes(&ctx.own_child_writes, "StatefulSet", event);
            }
        })
        // Deletions too: a rollout being deleted waits for its sets to go.
        .touched_objects();
    (reader, stream)
}

async fn reconcile(
    rollout: Arc<CanaryStatefulSet>,
    shared: Arc<Shared>,
) -> Result<Requeue, ReconcileError> {
    let Some(_running) = reconcile::run_here(&shared.ctx, &*rollout) else {
        return Ok(Requeue::await_change());
    };
    // The store packs labels, annotations and the applied entry; the reconcile reads all
    // three (source, spec hash, when the spec was applied).
    let rollout = crate::api::packed_meta::unpacked(&rollout);
    let inner = reconcile_inner(rollout.clone(), &shared);
    reconcile::measured(&shared.ctx, &*rollout, inner).await
}

async fn reconcile_inner(
    rollout: Arc<CanaryStatefulSet>,
    shared: &Shared,
) -> Result<Requeue, ReconcileError> {
    let ctx = &shared.ctx;
    let ns = rollout.namespace().ok_or(ReconcileError::NoNamespace)?;
    let api: Api<CanaryStatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, rollout, |event| async {
        match event {
            Finalizer::Apply(r) => {
                let (rollout, at) = (&*r, ns.as_str());
                let observe = move |pods: bool| observe(rollout, shared, at, pods);
                reconcile::plan_and_act(ctx, &*r, &ns, observe).await
            }
            Finalizer::Cleanup(r) => cleanup(&r, shared, &ns).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        // The Kubernetes error said in words, not kube's debug dump of its Status.
        kube::runtime::finalizer::Error::AddFinalizer(e) => ReconcileError::Finalizer(format!(
            "adding the finalizer: {}",
            crate::error::kube_message(&e)
        )),
        kube::runtime::finalizer::Error::RemoveFinalizer(e) => ReconcileError::Finalizer(format!(
            "removing the finalizer: {}",
            crate::error::kube_message(&e)
        )),
        other => ReconcileError::Finalizer(other.to_string()),
    })
}

async fn cleanup(
    rollout: &CanaryStatefulSet,
    shared: &Shared,
    ns: &str,
) -> Result<Requeue, ReconcileError> {
    let ctx = &shared.ctx;
    let observed = observe(rollout, shared, ns, true).await?;
    let name = rollout.name_any();
    let (actions, waiting) = plan_cleanup(&observed);
    for action in &actions {
        tracing::info!(rollout = %format!("{ns}/{name}"), action = %action.describe(), "deleting");
        execute(action, ctx, ns, &name, &observed).await?;
    }
    match waiting {
        Some(what) => Err(ReconcileError::Waiting(what)),
        None if observed.stable.is_none() && observed.canary.is_none() => {
            tracing::info!(rollout = %format!("{ns}/{name}"), "deleted; its claims and volumes stay");
            ctx.first_status_done(&super::own_writes::child_key(
                "CanaryStatefulSet",
                ns,
                &name,
            ));
            ctx.metrics
                .rollout_phase("CanaryStatefulSet", &format!("{ns}/{name}"), None);
            Ok(Requeue::await_change())
        }
        None => Err(ReconcileError::Waiting("the sets to be deleted".into())),
    }
}

/// Reads what the planner needs: the sets (from the watch's store), the pods (if `with_pods`)
/// and claims labelled with the rollout's name, the volumes those claims name, and the
/// migration Job for the current canary image.
async fn observe(
    rollout: &CanaryStatefulSet,
    shared: &Shared,
    ns: &str,
    with_pods: bool,
) -> Result<Observed, ReconcileError> {
    let client = &shared.ctx.client;
    let name = rollout.name_any();
    // Until the first list is in, a missing set may only be unlisted.
    shared
        .sets_ready
        .wait()
        .await
        .map_err(|_| ReconcileError::Waiting("the StatefulSet watch".into()))?;
    let (stable, canary, other_strategy_set) = observe_sets(rollout, shared, ns);
    let (claims, volumes) = observe_storage(rollout, client, ns).await?;
    let job = match &rollout.spec.migration {
        Some(_) => {
            let image = rollout
                .status
                .as_ref()
                .and_then(|s| s.canary_image.clone())
                .unwrap_or_else(|| rollout.spec.image.clone());
            let job_name = migration_job_name(&name, &image);
            Api::<Job>::namespaced(client.clone(), ns)
                .get_opt(&job_name)
                .await
                .doing(|| format!("reading Job {ns}/{job_name}"))?
                .map(|j| JobView::from_object(&j))
        }
        None => None,
    };
    let mut observed = Observed {
        stable,
        canary,
        pods: Vec::new(),
        claims,
        volumes,
        job,
        other_strategy_set,
        deployments: Vec::new(),
        baseline: None,
        traffic: Default::default(),
        config: Default::default(),
    };
    if let Some(routing) = rollout.spec.traffic_routing.as_deref() {
        observed.traffic =
            super::traffic::observe_traffic(client, ns, &name, Some(routing), false, &[]).await?;
    }
    if with_pods && crate::plan::statefulset::has_pods(&observed) {
        let own = ListParams::default().labels(&format!("{ROLLOUT_LABEL}={name}"));
        observed.pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&own)
            .await
            .doing(|| format!("listing the pods of {ns}/{name}"))?
            .items
            .iter()
            .filter_map(|p| PodView::from_object(p, rollout.spec.container.as_deref()))
            .collect();
    }
    Ok(observed)
}

/// The rollout's sets from the store: stable and canary (or the one set of a partition),
/// and a set it made under its other strategy (the strategy was switched live).
fn observe_sets(
    rollout: &CanaryStatefulSet,
    shared: &Shared,
    ns: &str,
) -> (Option<SetView>, Option<SetView>, Option<String>) {
    let name = rollout.name_any();
    let container = rollout.spec.container.as_deref();
    let (stable_name, canary_name, other_names) = match rollout.spec.strategy.type_ {
        StatefulSetStrategyType::TwoSets => (
            Role::Stable.set_name(&name),
            Some(Role::Canary.set_name(&name)),
            vec![Role::Single.set_name(&name)],
        ),
        StatefulSetStrategyType::Partition => (
            Role::Single.set_name(&name),
            None,
            vec![Role::Stable.set_name(&name), Role::Canary.set_name(&name)],
        ),
    };
    let get_set = |set: String| {
        shared
            .sets
            .get(&ObjectRef::new(&set).within(ns))
            .map(|s| SetView::from_stored(&s, container))
    };
    let uid = rollout.uid();
    let other_strategy_set = other_names.into_iter().find(|set| {
        shared
            .sets
            .get(&ObjectRef::new(set).within(ns))
            .is_some_and(|s| {
                s.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == uid.as_ref())
            })
    });
    (
        get_set(stable_name),
        canary_name.and_then(get_set),
        other_strategy_set,
    )
}

/// The rollout's claims, and the volumes the handoff may move: those live claims name, the
/// stable replicas' recorded ones, and (a claim deleted by hand) those it labelled.
async fn observe_storage(
    rollout: &CanaryStatefulSet,
    client: &kube::Client,
    ns: &str,
) -> Result<(Vec<ClaimView>, Vec<VolumeView>), ReconcileError> {
    let name = rollout.name_any();
    let own = ListParams::default().labels(&format!("{ROLLOUT_LABEL}={name}"));
    // Claims matter only to the handoff, which moves the claims of the spec's templates: a
    // rollout without templates has none to read (a quarter of the reads in a first sync of 1,000).
    let templates = crate::plan::objects::claim_templates(&rollout.spec).len();
    let claims: Vec<ClaimView> = if templates > 0 {
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
            .list(&own)
            .await
            .doing(|| format!("listing the claims of {ns}/{name}"))?
            .items
            .iter()
            .map(ClaimView::from_object)
            .collect()
    } else {
        Vec::new()
    };
    // Only the volumes live claims name: that is how the handoff identifies a replica's
    // volume (labels and annotations on volumes are for people reading them).
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let mut named: BTreeSet<String> = claims.iter().filter_map(|c| c.volume.clone()).collect();
    // And a stable replica's recorded volume its claim no longer names: whether it is still
    // there (and kept) decides what the VolumeReplaced condition says.
    named.extend(
        rollout
            .status
            .iter()
            .flat_map(|s| s.stable_volumes.values())
            .cloned(),
    );
    let mut volumes = Vec::with_capacity(named.len());
    for v in &named {
        if let Some(pv) = pvs
            .get_opt(v)
            .await
            .doing(|| format!("reading PersistentVolume {v}"))?
        {
            volumes.push(VolumeView::from_object(&pv, ns));
        }
    }
    // Fewer claims than replicas: one was deleted by hand. The volumes a handoff has touched
    // (labelled with the rollout) are read too, so the handoff finds the one whose claim is
    // gone instead of letting the replica start on a new, empty volume.
    if templates > 0 && claims.len() < templates * rollout.spec.replicas.max(0) as usize {
        let labelled = pvs
            .list(&own)
            .await
            .doing(|| format!("listing the volumes of {ns}/{name}"))?;
        volumes.extend(
            labelled
                .items
                .iter()
                .filter(|pv| {
                    pv.labels().get(VOLUME_NAMESPACE_LABEL).map(String::as_str) == Some(ns)
                })
                .filter(|pv| !named.contains(&pv.name_any()))
                .map(|pv| VolumeView::from_object(pv, ns)),
        );
    }
    Ok((claims, volumes))
}
