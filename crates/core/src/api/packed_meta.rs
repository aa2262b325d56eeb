//! A rollout's labels, annotations and managed-fields entry packed into one string, for the
//! agent's rollout store.
//!
//! A `BTreeMap` costs a 544-byte node however few entries it has, and every rollout has two
//! (issue 51: 13 MiB of the store at 10,000 rollouts, with their strings 16), and the sync's
//! managed-fields entry the store keeps is a vector and three strings more. The store keeps
//! all three in one JSON string instead, in a field of the spec that is never serialized, and
//! hands out the object with them put back ([`unpacked`]) to whatever reads them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

/// Labels, annotations and managed fields taken out of an object's metadata; empty when it
/// had none.
#[derive(Clone, Debug, Default)]
pub struct PackedMeta(Option<Box<str>>);

type Maps = (
    Option<BTreeMap<String, String>>,
    Option<BTreeMap<String, String>>,
    Option<Vec<ManagedFieldsEntry>>,
);

impl PackedMeta {
    /// Takes `meta`'s labels, annotations and managed fields out into a packed form.
    pub fn take_from(meta: &mut ObjectMeta) -> PackedMeta {
        let maps: Maps = (
            meta.labels.take(),
            meta.annotations.take(),
            meta.managed_fields.take(),
        );
        if maps.0.is_none() && maps.1.is_none() && maps.2.is_none() {
            return PackedMeta(None);
        }
        match serde_json::to_string(&maps) {
            Ok(text) => PackedMeta(Some(text.into_boxed_str())),
            Err(_) => {
                // They always serialize; keep them in place if they ever do not.
                (meta.labels, meta.annotations, meta.managed_fields) = maps;
                PackedMeta(None)
            }
        }
    }

    /// Puts what was packed back into `meta` (an empty pack leaves it).
    pub fn put_back(&self, meta: &mut ObjectMeta) {
        let Some(text) = &self.0 else { return };
        if let Ok((labels, annotations, managed_fields)) = serde_json::from_str::<Maps>(text) {
            meta.labels = labels;
            meta.annotations = annotations;
            meta.managed_fields = managed_fields;
        }
    }

    /// The packed form: equal for equal contents (maps serialize in key order).
    pub fn text(&self) -> Option<&str> {
        self.0.as_deref()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// For `skip_serializing_if`: the packed maps are never part of the object sent.
    pub fn never_serialized(&self) -> bool {
        true
    }
}

/// Only for the spec's derive; [`PackedMeta::never_serialized`] keeps it out of every output.
impl serde::Serialize for PackedMeta {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_none()
    }
}

/// Not part of the spec's value: a stored spec equals the same spec as read from the API.
impl PartialEq for PackedMeta {
    fn eq(&self, _: &PackedMeta) -> bool {
        true
    }
}

/// A rollout kind whose store packs its metadata maps.
pub trait PacksMeta: kube::Resource + Clone {
    fn packed_meta(&self) -> &PackedMeta;
    fn packed_meta_mut(&mut self) -> &mut PackedMeta;
}

/// Packs `rollout`'s labels, annotations and managed fields (the store's form).
pub fn pack<K: PacksMeta>(rollout: &mut K) {
    let packed = PackedMeta::take_from(rollout.meta_mut());
    *rollout.packed_meta_mut() = packed;
}

/// `rollout` with its labels, annotations and managed fields in place: itself when they were
/// never packed.
pub fn unpacked<K: PacksMeta>(rollout: &Arc<K>) -> Arc<K> {
    if rollout.packed_meta().is_empty() {
        return rollout.clone();
    }
    let mut whole = K::clone(rollout);
    let packed = std::mem::take(whole.packed_meta_mut());
    packed.put_back(whole.meta_mut());
    Arc::new(whole)
}

/// `rollout`'s metadata with its labels, annotations and managed fields in place.
pub fn metadata<K: PacksMeta>(rollout: &K) -> Cow<'_, ObjectMeta> {
    if rollout.packed_meta().is_empty() {
        return Cow::Borrowed(rollout.meta());
    }
    let mut meta = rollout.meta().clone();
    rollout.packed_meta().put_back(&mut meta);
    Cow::Owned(meta)
}

impl PacksMeta for super::CanaryStatefulSet {
    fn packed_meta(&self) -> &PackedMeta {
        &self.spec.packed_meta
    }
    fn packed_meta_mut(&mut self) -> &mut PackedMeta {
        &mut self.spec.packed_meta
    }
}

impl PacksMeta for super::CanaryDeployment {
    fn packed_meta(&self) -> &PackedMeta {
        &self.spec.packed_meta
    }
    fn packed_meta_mut(&mut self) -> &mut PackedMeta {
        &mut self.spec.packed_meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CanaryStatefulSet;

    fn rollout() -> CanaryStatefulSet {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1",
            "kind": "CanaryStatefulSet",
            "metadata": {
                "name": "web", "namespace": "shop", "resourceVersion": "7",
                "labels": {"rollouts.linnet.dev/source": "main", "team": "a=b,c"},
                "annotations": {"rollouts.linnet.dev/source-path": "apps/web.yaml",
                                "note": "line one\nline \"two\"\u{0}end"},
                "managedFields": [{"manager": "linnet", "operation": "Apply",
                                   "apiVersion": "rollouts.linnet.dev/v1alpha1",
                                   "time": "2026-11-29T09:00:00Z"}],
            },
            "spec": {"replicas": 3, "image": "web:1",
                     "template": {"selector": {}, "serviceName": "web",
                                  "template": {"metadata": {}}}},
        }))
        .unwrap()
    }

    #[test]
    fn a_packed_rollout_unpacks_to_the_one_read_from_the_api() {
        let read = rollout();
        let mut stored = read.clone();
        pack(&mut stored);
        let m = &stored.metadata;
        assert!(m.labels.is_none() && m.annotations.is_none() && m.managed_fields.is_none());
        assert_eq!(*metadata(&stored), read.metadata);
        let back = unpacked(&Arc::new(stored));
        assert_eq!(back.metadata, read.metadata);
        assert!(back.spec.packed_meta.is_empty());
        assert_eq!(*back, read);
    }

    #[test]
    fn the_packed_form_is_never_serialized_nor_hashed() {
        let read = rollout();
        let mut stored = read.clone();
        pack(&mut stored);
        let json = serde_json::to_value(&stored.spec).unwrap();
        assert_eq!(json, serde_json::to_value(&read.spec).unwrap());
        assert_eq!(
            crate::api::spec_hash(&stored.spec),
            crate::api::spec_hash(&read.spec)
        );
    }

    #[test]
    fn a_rollout_without_labels_or_annotations_packs_to_nothing() {
        let mut bare = rollout();
        bare.metadata.labels = None;
        bare.metadata.annotations = None;
        bare.metadata.managed_fields = None;
        pack(&mut bare);
        assert!(bare.spec.packed_meta.is_empty());
        let stored = Arc::new(bare);
        assert!(Arc::ptr_eq(&unpacked(&stored), &stored));
    }

    #[test]
    fn empty_maps_stay_empty_maps() {
        let mut read = rollout();
        read.metadata.labels = Some(BTreeMap::new());
        read.metadata.annotations = None;
        let mut stored = read.clone();
        pack(&mut stored);
        assert_eq!(unpacked(&Arc::new(stored)).metadata, read.metadata);
    }
}
