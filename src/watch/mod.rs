//! The cluster watches every consumer shares: one watch and store per rollout kind
//! ([`rollouts`]), the configuration and backoff of every watch ([`backoff`]), and whether a
//! store has had its first list ([`StoreReady`]). Below the controllers, write-back and the
//! runtime, which all read these stores.

pub mod backoff;
pub mod rollouts;

use kube::runtime::reflector::Store;
use kube::runtime::watcher;

/// Objects per page of a watch's initial list (kube's default is 500): a smaller page keeps
/// the start-up memory peak down at 1,000 rollouts, for a few more requests.
const WATCH_PAGE: u32 = 100;

/// The configuration of every watch the agent runs: objects with `labels` (a label selector),
/// listed [`WATCH_PAGE`] at a time.
pub fn watch_config(labels: &str) -> watcher::Config {
    watcher::Config::default()
        .page_size(WATCH_PAGE)
        .labels(labels)
}

/// Where the agent's watches and reads of namespaced kinds look: every namespace, or only the
/// one `--watch-namespace` names (a namespace-scoped install, whose Role grants nothing
/// elsewhere). Volumes are cluster-scoped whatever this says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchScope(Option<String>);

impl WatchScope {
    /// Every namespace (a cluster-wide install).
    pub fn cluster() -> WatchScope {
        WatchScope(None)
    }

    /// Only `namespace`.
    pub fn namespace(namespace: impl Into<String>) -> WatchScope {
        WatchScope(Some(namespace.into()))
    }

    /// The one namespace watched, if not every one.
    pub fn only(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// An `Api` of a namespaced kind over this scope.
    pub fn api<K>(&self, client: &kube::Client) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.0 {
            None => kube::Api::all(client.clone()),
            Some(ns) => kube::Api::namespaced(client.clone(), ns),
        }
    }

    /// An `Api` of the namespaced kind `resource` over this scope.
    pub fn api_with<K>(&self, client: &kube::Client, resource: &K::DynamicType) -> kube::Api<K>
    where
        K: kube::Resource<Scope = kube::core::DynamicResourceScope>,
    {
        match &self.0 {
            None => kube::Api::all_with(client.clone(), resource),
            Some(ns) => kube::Api::namespaced_with(client.clone(), ns, resource),
        }
    }
}

/// Whether a reflector's store has had its first list, for any number of waiters at once.
///
/// kube's `Store::wait_until_ready` wakes only the last of several tasks that wait on it
/// together: it polls a oneshot receiver, which keeps one waker. After a restart, the first
/// reconciles of several rollouts all waited on the StatefulSet store at once, and all but
/// one hung forever, holding their rollouts: nothing else was ever reconciled for them
/// (issue 26). Here one task waits on the store and tells a watch channel, which wakes all.
#[derive(Clone, Debug)]
pub struct StoreReady(tokio::sync::watch::Receiver<bool>);

impl StoreReady {
    pub fn of<K>(store: Store<K>) -> StoreReady
    where
        K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let (ready, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_ok() {
                ready.send_replace(true);
            }
        });
        StoreReady(rx)
    }

    /// A readiness told by whoever fills the store, for a store that something else (a kube
    /// `Controller`) already waits on with `wait_until_ready`: of two such waiters, one
    /// would never wake.
    pub fn told() -> (tokio::sync::watch::Sender<bool>, StoreReady) {
        let (ready, rx) = tokio::sync::watch::channel(false);
        (ready, StoreReady(rx))
    }

    /// Whether the first list is in.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits for the first list; an error when the store's watch has stopped for good.
    pub async fn wait(&self) -> Result<(), tokio::sync::watch::error::RecvError> {
        self.0.clone().wait_for(|ready| *ready).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_waiter_on_a_store_wakes_when_it_is_ready() {
        // Issue 26: with kube's wait_until_ready, of several reconciles waiting together only
        // the last one woke; the others held their rollouts forever.
        use k8s_openapi::api::core::v1::ConfigMap;
        let (store, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        let ready = StoreReady::of(store);
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let ready = ready.clone();
                tokio::spawn(async move { ready.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        for waiter in waiters {
            let woke = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await;
            assert!(matches!(woke, Ok(Ok(Ok(())))), "a waiter was never woken");
        }
    }
}
