//! What wakes a reconcile: the changes of a rollout that Git or a person makes (not the
//! agent's own status writes), the watch events that meet the agent's own writes of
//! children, and which children a rollout may act on at all.

use futures::{Stream, StreamExt as _};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use std::hash::BuildHasher as _;

use super::own_writes;
use crate::plan::observed::controller_uid;

/// What wakes a controller's reconciles, from its kind's shared store
/// ([`crate::watch::rollouts`]): every rollout applied, but of changes only those of what
/// Git or a person sets (the spec, by its generation; labels, annotations, finalizers). A
/// status write of linnet's own changes none of them, so it wakes nothing: every wait is
/// woken by a watch of what it waits for, or by a real timer.
///
/// kube's `predicate_filter` takes owned objects; the shared store hands out `Arc`s, so its
/// predicate is applied here, keyed by object and uid, and like kube's an entry counts for an
/// hour (a rollout quiet that long is reconciled once more by its next event). A deleted
/// rollout's key is dropped; one deleted while the watch was down (no delete event) is dropped
/// once the keys outnumber the listed store's rollouts twice. The key is a hash of namespace,
/// name and uid, seeded per process: kube's `ObjectRef` and the uid beside it held five
/// strings a rollout, 3 MiB at 10,000 (issue 51). Two rollouts whose keys collide would only
/// both be woken by each other's events.
pub(crate) fn wakes<K>(
    changes: impl Stream<Item = crate::watch::rollouts::Change<K>> + Send + 'static,
    store: Store<K>,
) -> impl Stream<Item = std::sync::Arc<K>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + crate::api::PacksMeta + Clone + Send + Sync + 'static,
{
    use crate::watch::rollouts::Change;
    use kube::runtime::Predicate as _;
    let predicate = own_status_writes_filtered::<K>();
    const TTL: std::time::Duration = std::time::Duration::from_secs(3600);
    let seed = std::hash::RandomState::new();
    let key_of = move |o: &K| {
        let m = o.meta();
        seed.hash_one((&m.namespace, &m.name, &m.uid))
    };
    let mut seen: std::collections::HashMap<u64, (u64, std::time::Instant)> = Default::default();
    changes.filter_map(move |change| {
        let woken = match change {
            Change::Applied(o) => {
                let key = key_of(&o);
                let now = std::time::Instant::now();
                match predicate.hash_property(&o) {
                    Some(hash)
                        if seen
                            .get(&key)
                            .is_some_and(|(h, at)| *h == hash && now - *at < TTL) =>
                    {
                        None
                    }
                    Some(hash) => {
                        seen.insert(key, (hash, now));
                        // Not while the first list is under way: the store is empty until its end.
                        if !store.is_empty() && seen.len() > 2 * store.len() + 64 {
                            let listed: std::collections::HashSet<u64> =
                                store.state().iter().map(|o| key_of(o)).collect();
                            seen.retain(|k, _| listed.contains(k));
                        }
                        Some(o)
                    }
                    None => Some(o),
                }
            }
            Change::Deleted(o) => {
                seen.remove(&key_of(&o));
                None
            }
        };
        futures::future::ready(woken)
    })
}

/// Clears the expectations a watch event of `kind` meets ([`own_writes`]).
pub(crate) fn seen_own_writes<K: kube::Resource>(
    writes: &own_writes::OwnChildWrites,
    kind: &str,
    event: &watcher::Event<K>,
) {
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            let m = o.meta();
            if let (Some(ns), Some(name), Some(rv)) = (&m.namespace, &m.name, &m.resource_version) {
                writes.seen(&own_writes::child_key(kind, ns, name), rv);
            }
        }
        watcher::Event::Delete(o) => {
            let m = o.meta();
            if let (Some(ns), Some(name)) = (&m.namespace, &m.name) {
                writes.deleted(&own_writes::child_key(kind, ns, name));
            }
        }
        watcher::Event::InitDone => writes.relisted(kind),
        watcher::Event::Init => {}
    }
}

/// What of a rollout wakes its reconcile: everything but its status.
/// The store packs labels and annotations ([`crate::api::packed_meta`]): they are read in
/// either form, so a person's annotation (promote, abort) still wakes the rollout.
fn own_status_writes_filtered<K: crate::api::PacksMeta>() -> impl kube::runtime::Predicate<K> {
    use kube::runtime::{Predicate, predicates};
    let packed = |k: &K| {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        k.packed_meta().text().hash(&mut hasher);
        Some(hasher.finish())
    };
    predicates::generation
        .combine(predicates::labels)
        .combine(predicates::annotations)
        .combine(packed)
        .combine(predicates::finalizers)
        .combine(|k: &K| Some(u64::from(k.meta().deletion_timestamp.is_some())))
}

/// Whether a child whose controlling owner is `observed_controller` (as its watch or a GET
/// showed it) is the rollout's that applies `desired`. A uid is never reused, so a child the
/// plan saw this way needs no GET before its apply.
pub(crate) fn observed_as_ours(
    observed_controller: Option<&str>,
    desired: &kube::api::ObjectMeta,
) -> bool {
    observed_controller.is_some() && observed_controller == controller_uid(desired)
}

/// Why a child the controller is about to apply may not be: an object of its name exists that
/// this rollout did not make (no controller owner reference with the rollout's uid). A rollout
/// named after someone's StatefulSet or Deployment must not take it over with the agent's
/// rights; the name is refused instead.
pub(crate) fn foreign_child(
    live: Option<&kube::api::ObjectMeta>,
    desired: &kube::api::ObjectMeta,
) -> Option<String> {
    let live = live?;
    if observed_as_ours(controller_uid(live), desired) {
        return None;
    }
    Some(format!(
        "{} already exists and this rollout did not make it; rename the rollout (linnet \
         never takes over an object it did not create)",
        live.name.as_deref().unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(owner_uid: Option<&str>) -> kube::api::ObjectMeta {
        serde_json::from_value(serde_json::json!({"name": "db-stable",
            "ownerReferences": owner_uid.map(|u| vec![serde_json::json!({
                "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
                "name": "db", "uid": u, "controller": true})]).unwrap_or_default()}))
        .unwrap_or_default()
    }

    #[test]
    fn a_rollout_never_takes_over_a_workload_it_did_not_make() {
        let desired = meta(Some("r1"));
        assert_eq!(foreign_child(None, &desired), None, "absent: created");
        assert_eq!(
            foreign_child(Some(&meta(Some("r1"))), &desired),
            None,
            "its own"
        );
        assert!(
            foreign_child(Some(&meta(None)), &desired).is_some(),
            "hand-made"
        );
        assert!(
            foreign_child(Some(&meta(Some("r2"))), &desired).is_some(),
            "another rollout's (a deleted and recreated one has a new uid)"
        );
    }

    #[test]
    fn only_a_child_seen_under_this_rollouts_control_skips_the_look_before_its_apply() {
        let desired = meta(Some("r1"));
        assert!(observed_as_ours(Some("r1"), &desired));
        assert!(
            !observed_as_ours(None, &desired),
            "not seen, or seen without a controller"
        );
        assert!(
            !observed_as_ours(Some("r2"), &desired),
            "another rollout's of the same name"
        );
        assert!(
            !observed_as_ours(None, &meta(None)),
            "no uid on either side"
        );
    }

    /// The store packs labels and annotations: a person's annotation or label still wakes
    /// the rollout.
    #[tokio::test]
    async fn only_changes_of_what_git_or_a_person_sets_wake_a_reconcile() {
        use crate::api::CanaryStatefulSet;
        use crate::watch::rollouts::Change;
        use futures::StreamExt as _;
        use std::sync::Arc;
        let object = |generation: i64, version: &str, annotation: &str, label: &str| {
            let mut o: CanaryStatefulSet = serde_json::from_value(serde_json::json!({
                "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
                "metadata": {"name": "db", "namespace": "shop", "uid": "u1",
                             "generation": generation, "resourceVersion": version,
                             "labels": {"app": label},
                             "annotations": {crate::api::PROMOTE_ANNOTATION: annotation}},
                "spec": {"replicas": 3, "image": "db:1", "template": {}},
            }))
            .unwrap();
            crate::api::packed_meta::pack(&mut o);
            Arc::new(o)
        };
        let changes = futures::stream::iter(vec![
            Change::Applied(object(1, "1", "false", "db")),
            Change::Applied(object(1, "2", "false", "db")), // linnet's own status write
            Change::Applied(object(2, "3", "false", "db")), // the spec from Git
            Change::Applied(object(2, "4", "true", "db")),  // an annotation: promote
            Change::Applied(object(2, "5", "true", "db2")), // a label
            Change::Deleted(object(2, "6", "true", "db2")),
            Change::Applied(object(2, "7", "true", "db2")), // made again
        ]);
        let woken: Vec<String> = wakes(
            changes,
            kube::runtime::reflector::store::<CanaryStatefulSet>().0,
        )
        .map(|o| o.metadata.resource_version.clone().unwrap_or_default())
        .collect()
        .await;
        assert_eq!(woken, ["1", "3", "4", "5", "7"]);
    }

    /// Keys of rollouts gone while the watch was down are dropped once they outnumber the
    /// store's rollouts twice; a listed rollout's key stays.
    #[tokio::test]
    async fn the_wake_keys_of_rollouts_the_store_no_longer_has_are_dropped() {
        use crate::api::CanaryStatefulSet;
        use crate::watch::rollouts::Change;
        use futures::StreamExt as _;
        use std::sync::Arc;
        let object = |name: &str, version: &str| {
            let o: CanaryStatefulSet = serde_json::from_value(serde_json::json!({
                "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
                "metadata": {"name": name, "namespace": "shop", "uid": format!("u-{name}"),
                             "generation": 1, "resourceVersion": version},
                "spec": {"replicas": 3, "image": "db:1", "template": {}},
            }))
            .unwrap();
            Arc::new(o)
        };
        let (store, mut writer) = kube::runtime::reflector::store::<CanaryStatefulSet>();
        writer.apply_watcher_event(&watcher::Event::Apply((*object("kept", "1")).clone()));
        let mut events = vec![object("kept", "1"), object("gone", "1")];
        events.extend((0..65).map(|i| object(&format!("other-{i}"), "1")));
        events.extend([object("kept", "2"), object("gone", "2")]);
        let woken: Vec<String> = wakes(
            futures::stream::iter(events.into_iter().map(Change::Applied)),
            store,
        )
        .map(|o| {
            format!(
                "{}@{}",
                o.metadata.name.clone().unwrap_or_default(),
                o.metadata.resource_version.clone().unwrap_or_default()
            )
        })
        .collect()
        .await;
        assert_eq!(woken.len(), 68, "{woken:?}");
        assert_eq!(woken.last().map(String::as_str), Some("gone@2"));
        assert!(!woken.contains(&"kept@2".to_string()), "{woken:?}");
    }
}
