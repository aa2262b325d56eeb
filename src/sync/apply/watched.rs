//! The rollouts a full sync reads from the agent's own watch instead of listing them. The
//! drift check compared every object with one list per kind; at 10,000 rollouts that list
//! was most of its cost, for objects the agent already holds, each as fresh as its watch
//! (issue 51). Only a full sync after one that succeeded reads the stores: the first is
//! listed, as is the first after a failed read, so a store still filling never stands in for
//! the cluster. A kind read from a store is not "listed in full": no inventory entry is
//! forgotten on what a store does not show yet. A rollout the store shows otherwise than Git
//! has it is read again from the API server before anything is written or announced.

use super::*;
use crate::api::{CanaryDeployment, CanaryStatefulSet};
use kube::Resource;

impl Syncer {
    /// Reads the rollout kinds from `stores` in full syncs after the first.
    pub fn with_watched(mut self, stores: crate::watch::rollouts::RolloutStores) -> Self {
        self.watched = Some(stores);
        self
    }

    /// Kind `api_version`/`kind`'s objects of this source as the agent's watch holds them,
    /// reduced to what the diff looks at; `None` where it is not watched, or not yet listed.
    pub(super) fn keep_watched(
        &self,
        (api_version, kind): (&str, &str),
        desired: &HashMap<&ObjectKey, &DesiredObject>,
        kept: (&mut BTreeMap<ObjectKey, Value>, &mut BTreeSet<ObjectKey>),
    ) -> Option<usize> {
        let stores = self.watched.as_ref()?;
        if api_version != crate::api::API_VERSION {
            return None;
        }
        if kind == CanaryStatefulSet::kind(&()) {
            self.keep_from(&stores.statefulsets, desired, kept)
        } else if kind == CanaryDeployment::kind(&()) {
            self.keep_from(&stores.deployments, desired, kept)
        } else {
            None
        }
    }

    fn keep_from<K>(
        &self,
        rollouts: &crate::watch::rollouts::Rollouts<K>,
        desired: &HashMap<&ObjectKey, &DesiredObject>,
        (live, unchanged): (&mut BTreeMap<ObjectKey, Value>, &mut BTreeSet<ObjectKey>),
    ) -> Option<usize>
    where
        K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::Serialize,
        K: crate::api::PacksMeta + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        if !rollouts.ready().is_ready() {
            return None;
        }
        let mut n = 0;
        for rollout in rollouts.store().state() {
            let namespace = rollout.meta().namespace.clone().unwrap_or_default();
            if !self.namespaces.is_empty() && !self.namespaces.contains(&namespace) {
                continue;
            }
            let key = ObjectKey::new(
                K::api_version(&()),
                K::kind(&()),
                namespace,
                rollout.meta().name.clone().unwrap_or_default(),
            );
            let rollout = crate::api::packed_meta::unpacked(&rollout);
            let Ok(mut object) = serde_json::to_value(&*rollout) else {
                continue;
            };
            if let Value::Object(fields) = &mut object {
                fields.remove("status");
                if let Some(Value::Object(meta)) = fields.get_mut("metadata") {
                    meta.remove("managedFields");
                }
            }
            keep_live(
                key,
                &object,
                desired,
                (&mut *live, &mut *unchanged),
                KeepChanged::ReadAgain,
            );
            n += 1;
        }
        Some(n)
    }
}
