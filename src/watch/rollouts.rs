//! One watch, one store per rollout kind, shared by every consumer of rollout state: the
//! controller, write-back, commit statuses, the spec-error statuses and `/status`.
//!
//! Each kind was watched three times (by its controller, by write-back and by commit
//! statuses), each watch with its own list at start-up and its own copy of every object in
//! flight. Now one watcher fills one kube reflector [`Store`], and a broadcast channel tells
//! each subscriber what changed, as linkerd's policy controller fans one index out.
//!
//! kube's own fan-out (`reflect_shared`) was not used: it holds the watch until the slowest
//! subscriber has read each change, so a Git host that is slow to take a commit status would
//! hold up the controllers, and its handle stops waking when a changed object is deleted
//! before it is read. Here a subscriber that falls behind by more than [`BUFFER`] changes is
//! told so and handed the whole store instead: it never holds up the watch, and never misses
//! a rollout's latest state.

use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::broadcast;

use crate::api::{CanaryDeployment, CanaryStatefulSet};
use crate::watch::StoreReady;

/// Changes a subscriber may be behind before it is handed the whole store instead. At start
/// every rollout arrives at once: 1,000 of them fit.
pub const BUFFER: usize = 2048;

/// A subscriber's changes: every rollout change from the moment it subscribed.
pub type Changes<K> = futures::stream::BoxStream<'static, Change<K>>;

/// Where the watch is in its lists: how many are done, and whether one is under way (during
/// a list the store still holds what the last one found).
#[derive(Clone, Copy, Debug, Default)]
struct Lists {
    done: u64,
    listing: bool,
}

/// A change of one rollout, as a subscriber sees it.
#[derive(Clone, Debug)]
pub enum Change<K> {
    /// Listed, created or changed: the object as the store now has it.
    Applied(Arc<K>),
    /// Deleted: the object as it last was.
    Deleted(Arc<K>),
}

impl<K> Change<K> {
    /// The object, applied or deleted.
    pub fn object(&self) -> &Arc<K> {
        match self {
            Change::Applied(o) | Change::Deleted(o) => o,
        }
    }
}

/// The rollouts of one kind: the store, and the changes to subscribe to.
#[derive(Clone)]
pub struct Rollouts<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    ready: StoreReady,
    lists: tokio::sync::watch::Receiver<Lists>,
    changes: broadcast::Sender<Change<K>>,
}

/// The watch that fills a [`Rollouts`]; run it once every subscriber has subscribed.
pub struct RolloutWatch<K: Resource<DynamicType = ()> + Clone + 'static> {
    api: kube::Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    changes: broadcast::Sender<Change<K>>,
    ready: tokio::sync::watch::Sender<bool>,
    lists: tokio::sync::watch::Sender<Lists>,
}

/// A subscription to every kind's changes, made before the watches start.
pub struct Subscription {
    pub statefulsets: Changes<CanaryStatefulSet>,
    pub deployments: Changes<CanaryDeployment>,
}

/// Every rollout kind's [`Rollouts`].
#[derive(Clone)]
pub struct RolloutStores {
    pub statefulsets: Rollouts<CanaryStatefulSet>,
    pub deployments: Rollouts<CanaryDeployment>,
}

impl RolloutStores {
    /// The stores of the rollouts labelled with `selector` in `scope`, and the watches that
    /// fill them.
    pub fn new(
        client: &kube::Client,
        selector: &str,
        scope: &super::WatchScope,
    ) -> (
        RolloutStores,
        RolloutWatch<CanaryStatefulSet>,
        RolloutWatch<CanaryDeployment>,
    ) {
        let config = crate::watch::watch_config(selector);
        let (statefulsets, sts_watch) = Rollouts::new(scope.api(client), config.clone());
        let (deployments, deploy_watch) = Rollouts::new(scope.api(client), config);
        (
            RolloutStores {
                statefulsets,
                deployments,
            },
            sts_watch,
            deploy_watch,
        )
    }
}

impl RolloutStores {
    /// Subscribes to both kinds now (call it before the watches run, so that nothing of the
    /// first list is missed).
    pub fn subscribe(&self) -> Subscription {
        Subscription {
            statefulsets: self.statefulsets.subscribe(),
            deployments: self.deployments.subscribe(),
        }
    }

    /// Whether both kinds have been listed (before that, and on a replica waiting for the
    /// lease, the stores are empty).
    pub fn listed(&self) -> bool {
        self.statefulsets.ready().is_ready() && self.deployments.ready().is_ready()
    }
}

impl<K> Rollouts<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
{
    /// The store of `api`'s objects matching `config`, empty until its watch runs.
    pub fn new(api: kube::Api<K>, config: watcher::Config) -> (Rollouts<K>, RolloutWatch<K>) {
        let writer = reflector::store::Writer::default();
        let store = writer.as_reader();
        let (changes, _) = broadcast::channel(BUFFER);
        // Told by the watch, not by `wait_until_ready`: the controller waits on that.
        let (told, ready) = StoreReady::told();
        let (lists_tx, lists) = tokio::sync::watch::channel(Lists::default());
        (
            Rollouts {
                ready,
                lists,
                store,
                changes: changes.clone(),
            },
            RolloutWatch {
                api,
                config,
                writer,
                changes,
                ready: told,
                lists: lists_tx,
            },
        )
    }

    /// The store: every rollout of the kind, as last seen.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Whether the store has had its first list.
    pub fn ready(&self) -> &StoreReady {
        &self.ready
    }

    /// Every change from the moment of the call. A subscriber that falls [`BUFFER`] changes
    /// behind gets every rollout in the store once, as applied, and goes on from there; when
    /// it fell behind during a list, once the list is in the store.
    pub fn subscribe(&self) -> Changes<K> {
        let rx = self.changes.subscribe();
        let state = (rx, self.store.clone(), self.lists.clone());
        futures::stream::unfold(state, |(mut rx, store, mut lists)| async move {
            let changes = match rx.recv().await {
                Ok(change) => vec![change],
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        kind = %K::kind(&()),
                        "a consumer of rollout changes fell behind; it reads the whole store"
                    );
                    let seen = *lists.borrow_and_update();
                    if seen.listing || seen.done == 0 {
                        // The changes it missed are in the list under way, not yet in the store.
                        let listed = lists.wait_for(|l| l.done > seen.done && !l.listing).await;
                        if listed.is_err() {
                            return None;
                        }
                    }
                    store.state().into_iter().map(Change::Applied).collect()
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((futures::stream::iter(changes), (rx, store, lists)))
        })
        .flatten()
        .boxed()
    }
}

impl<K> RolloutWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: crate::api::PacksMeta + Send + Sync + 'static,
{
    /// Watches until the process ends. The store keeps of each object's `managedFields` only
    /// the sync's apply entry, without its field set: in full, the store of 1,000 rollouts
    /// held 18.7 MB (heaptrack), the largest part of the agent's memory. That entry, the
    /// labels and the annotations are packed into one string (issue 51): whatever reads them
    /// takes the object through [`crate::api::packed_meta::unpacked`] or
    /// [`crate::api::packed_meta::metadata`].
    pub async fn run(self) {
        let RolloutWatch {
            api,
            config,
            writer,
            changes,
            ready,
            lists,
        } = self;
        let store = writer.as_reader();
        let events = watcher(api, config)
            .backoff(crate::watch::backoff::watch_backoff())
            .modify(|rollout| {
                let meta = rollout.meta_mut();
                meta.managed_fields =
                    crate::plan::config::applied_entry(meta.managed_fields.take());
                crate::api::packed_meta::pack(rollout);
            })
            .reflect(writer);
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let change = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    // The store's own copy, when it has this version (not during a list).
                    let stored = store
                        .get(&ObjectRef::from_obj(&o))
                        .filter(|s| s.meta().resource_version == o.meta().resource_version);
                    Change::Applied(stored.unwrap_or_else(|| Arc::new(o)))
                }
                Ok(watcher::Event::Delete(o)) => Change::Deleted(Arc::new(o)),
                Ok(watcher::Event::InitDone) => {
                    lists.send_modify(|l| {
                        l.done += 1;
                        l.listing = false;
                    });
                    ready.send_replace(true);
                    continue;
                }
                Ok(watcher::Event::Init) => {
                    lists.send_modify(|l| l.listing = true);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(kind = %K::kind(&()), error = %e, "rollout watch failed; retrying with backoff");
                    continue;
                }
            };
            // No subscriber is not an error: the store is still kept.
            let _ = changes.send(change);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn object(name: &str) -> ConfigMap {
        let mut o = ConfigMap::default();
        o.metadata.name = Some(name.into());
        o.metadata.namespace = Some("ns".into());
        o
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_reads_the_whole_store() {
        let mut writer = reflector::store::Writer::<ConfigMap>::default();
        let store = writer.as_reader();
        let (changes, _) = broadcast::channel(2);
        let (lists_tx, lists) = tokio::sync::watch::channel(Lists::default());
        let rollouts = Rollouts {
            lists,
            ready: StoreReady::told().1,
            store,
            changes: changes.clone(),
        };
        let mut subscriber = rollouts.subscribe();
        // Four changes during the first list: the store has them only at its end.
        lists_tx.send_modify(|l| l.listing = true);
        writer.apply_watcher_event(&watcher::Event::Init);
        for name in ["a", "b", "c", "d"] {
            let o = object(name);
            writer.apply_watcher_event(&watcher::Event::InitApply(o.clone()));
            let _ = changes.send(Change::Applied(Arc::new(o)));
        }
        let listed = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            writer.apply_watcher_event(&watcher::Event::InitDone);
            lists_tx.send_modify(|l| {
                l.done += 1;
                l.listing = false;
            });
        });
        let mut names = Vec::new();
        for _ in 0..4 {
            let change = subscriber.next().await;
            let Some(change) = change else { break };
            names.push(change.object().metadata.name.clone().unwrap_or_default());
        }
        names.sort();
        assert_eq!(names, ["a", "b", "c", "d"], "every rollout, once listed");
        assert!(listed.await.is_ok());
    }
}
