//! A StatefulSet as the controller's store keeps it ([`StoredSet`]), and the planner's view of
//! it ([`SetView::from_stored`]).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{FixedSetFields, SetView, normalized_selector};
use crate::api::CHILD_HASH_ANNOTATION;

/// A StatefulSet as the controller's store keeps it: only what [`SetView`] reads, deserialized
/// straight from the watch (serde skips the rest). A whole `StatefulSet` in the store cost about
/// 4 KB per set, mostly empty optional fields of its pod template.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredSet {
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(default)]
    pub spec: StoredSetSpec,
    #[serde(default)]
    pub status: StoredSetStatus,
    /// [`CHILD_HASH_ANNOTATION`], once [`StoredSet::compact`] took it out of the annotations.
    #[serde(skip)]
    pub applied_hash: Option<String>,
    /// `spec.selector` as [`normalized_selector`]'s JSON text, once [`StoredSet::compact`]
    /// took it out of the spec.
    #[serde(skip)]
    pub selector_json: Option<Box<str>>,
}

impl StoredSet {
    /// Drops what nothing reads from the store and keeps what [`SetView`] reads in one string
    /// each (issue 51). A `BTreeMap` costs a 544-byte node however few entries it has, and a
    /// set has three (labels, annotations, the selector's labels): 1.7 KB a set, 18 MiB of the
    /// heap at 10,000 rollouts (heaptrack). The sets are matched to rollouts by owner.
    pub fn compact(&mut self) {
        let meta = &mut self.metadata;
        meta.managed_fields = None;
        meta.labels = None;
        if let Some(mut annotations) = meta.annotations.take() {
            self.applied_hash = annotations.remove(CHILD_HASH_ANNOTATION);
        }
        if let Some(selector) = self.spec.selector.take() {
            self.selector_json =
                normalized_selector(&selector).map(|v| v.to_string().into_boxed_str());
        }
    }

    fn applied_hash(&self) -> Option<String> {
        let annotation = self.metadata.annotations.as_ref();
        (self.applied_hash.clone())
            .or_else(|| annotation.and_then(|a| a.get(CHILD_HASH_ANNOTATION).cloned()))
    }

    fn selector(&self) -> Option<serde_json::Value> {
        match &self.spec.selector {
            Some(selector) => normalized_selector(selector),
            None => (self.selector_json.as_deref()).and_then(|s| serde_json::from_str(s).ok()),
        }
    }
}

/// The part of a set's spec [`SetView`] reads.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredSetSpec {
    pub replicas: Option<i32>,
    #[serde(default)]
    pub template: StoredTemplate,
    #[serde(default)]
    pub update_strategy: StoredUpdateStrategy,
    pub selector: Option<LabelSelector>,
    pub service_name: Option<String>,
    pub pod_management_policy: Option<String>,
    #[serde(default)]
    pub volume_claim_templates: Vec<PersistentVolumeClaim>,
}

/// A set's update strategy, down to its partition.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredUpdateStrategy {
    #[serde(default)]
    pub rolling_update: StoredRollingUpdate,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredRollingUpdate {
    pub partition: Option<i32>,
}

/// A set's pod template, down to its containers' names and images.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredTemplate {
    #[serde(default)]
    pub spec: StoredPodSpec,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredPodSpec {
    #[serde(default)]
    pub containers: Vec<StoredContainer>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredContainer {
    pub name: String,
    pub image: Option<String>,
}

/// The part of a set's status [`SetView`] reads.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredSetStatus {
    pub observed_generation: Option<i64>,
    pub ready_replicas: Option<i32>,
    pub updated_replicas: Option<i32>,
    pub current_revision: Option<String>,
    pub update_revision: Option<String>,
}

impl k8s_openapi::Resource for StoredSet {
    const API_VERSION: &'static str = <StatefulSet as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <StatefulSet as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <StatefulSet as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <StatefulSet as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <StatefulSet as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for StoredSet {
    type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn metadata(&self) -> &Self::Ty {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut Self::Ty {
        &mut self.metadata
    }
}

impl SetView {
    /// The planner's view of a set, from the controller's store.
    pub fn from_stored(set: &StoredSet, container: Option<&str>) -> SetView {
        let status = &set.status;
        let containers = &set.spec.template.spec.containers;
        let image = match container {
            Some(name) => containers.iter().find(|c| c.name == name),
            None => containers.first(),
        }
        .and_then(|c| c.image.clone());
        SetView {
            name: set.metadata.name.clone().unwrap_or_default(),
            replicas: set.spec.replicas.unwrap_or(1),
            status_fresh: status.observed_generation.is_some()
                && status.observed_generation == set.metadata.generation,
            ready_replicas: status.ready_replicas.unwrap_or(0),
            updated_replicas: status.updated_replicas.unwrap_or(0),
            current_revision: status.current_revision.clone(),
            update_revision: status.update_revision.clone(),
            applied_hash: set.applied_hash(),
            image,
            partition: set
                .spec
                .update_strategy
                .rolling_update
                .partition
                .unwrap_or(0),
            fixed: Some(FixedSetFields {
                selector: set.selector(),
                ..FixedSetFields::of(
                    None,
                    set.spec.service_name.as_deref(),
                    set.spec.pod_management_policy.as_deref(),
                    &set.spec.volume_claim_templates,
                )
            }),
            controller_uid: super::controller_uid(&set.metadata).map(String::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::observed::ClaimTemplateView;
    use serde_json::json;

    fn stored(set: serde_json::Value) -> StoredSet {
        serde_json::from_value(set).unwrap_or_default()
    }

    #[test]
    fn a_stored_set_keeps_everything_the_planner_reads() {
        let set = stored(json!({
            "metadata": {
                "name": "db-stable", "namespace": "shop", "generation": 3,
                "labels": {"rollouts.linnet.dev/rollout": "db"},
                "annotations": {CHILD_HASH_ANNOTATION: "abc"},
                "ownerReferences": [{"apiVersion": "rollouts.linnet.dev/v1alpha1",
                    "kind": "CanaryStatefulSet", "name": "db", "uid": "u1", "controller": true}],
            },
            "spec": {
                "replicas": 3, "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}},
                "template": {
                    "metadata": {"labels": {"app": "db"}},
                    "spec": {
                        "containers": [
                            {"name": "sidecar", "image": "proxy:1", "args": ["-v"]},
                            {"name": "db", "image": "db:2", "env": [{"name": "A", "value": "b"}]},
                        ],
                        "volumes": [{"name": "scratch", "emptyDir": {}}],
                    },
                },
                "volumeClaimTemplates": [{"metadata": {"name": "data"}}],
            },
            "status": {
                "replicas": 3, "readyReplicas": 2, "updatedReplicas": 1, "observedGeneration": 3,
                "currentRevision": "db-stable-1", "updateRevision": "db-stable-2",
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }));
        let view = |image: Option<&str>| SetView {
            name: "db-stable".into(),
            replicas: 3,
            status_fresh: true,
            ready_replicas: 2,
            updated_replicas: 1,
            current_revision: Some("db-stable-1".into()),
            update_revision: Some("db-stable-2".into()),
            applied_hash: Some("abc".into()),
            image: image.map(String::from),
            partition: 2,
            fixed: Some(FixedSetFields {
                selector: Some(json!({"matchLabels": {"app": "db"}})),
                service_name: "db".into(),
                pod_management_policy: "OrderedReady".into(),
                claim_templates: vec![ClaimTemplateView {
                    name: "data".into(),
                    ..ClaimTemplateView::default()
                }],
            }),
            controller_uid: Some("u1".into()),
        };
        assert_eq!(SetView::from_stored(&set, None), view(Some("proxy:1")));
        assert_eq!(SetView::from_stored(&set, Some("db")), view(Some("db:2")));
        assert_eq!(
            SetView::from_stored(&set, Some("sidecar")),
            view(Some("proxy:1"))
        );
        assert_eq!(SetView::from_stored(&set, Some("missing")), view(None));
        // Compacted as the store keeps it: the same view, without a map.
        let mut compact = set.clone();
        compact.compact();
        assert_eq!(
            SetView::from_stored(&compact, Some("db")),
            view(Some("db:2"))
        );
        let meta = &compact.metadata;
        assert!(meta.labels.is_none() && meta.annotations.is_none());
        assert!(compact.spec.selector.is_none());
        // Compacting twice (a store's copy of a compacted event) keeps what it took.
        compact.compact();
        assert_eq!(
            SetView::from_stored(&compact, Some("db")),
            view(Some("db:2"))
        );
        // The controller finds a set's rollout through its owner.
        let owners = compact.metadata.owner_references.unwrap_or_default();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (owners[0].name.as_str(), owners[0].uid.as_str()),
            ("db", "u1")
        );
    }

    #[test]
    fn a_stored_set_without_status_or_template_is_not_fresh_and_has_no_image() {
        let expected = |name: &str| SetView {
            name: name.into(),
            replicas: 1,
            fixed: Some(FixedSetFields {
                pod_management_policy: "OrderedReady".into(),
                ..FixedSetFields::default()
            }),
            ..SetView::default()
        };
        let new = stored(json!({"metadata": {"name": "new"}}));
        assert_eq!(SetView::from_stored(&new, None), expected("new"));
        let bare = stored(json!({"metadata": {"name": "bare", "generation": 1},
            "spec": {"selector": {}, "template": {}}}));
        assert_eq!(SetView::from_stored(&bare, Some("db")), expected("bare"));
        let stale = stored(json!({"metadata": {"name": "stale", "generation": 4},
            "status": {"observedGeneration": 3, "readyReplicas": 1}}));
        assert!(!SetView::from_stored(&stale, None).status_fresh);
        for mut set in [new, bare] {
            let before = SetView::from_stored(&set, None);
            set.compact();
            assert_eq!(SetView::from_stored(&set, None), before);
        }
    }

    #[test]
    fn a_selector_that_selects_nothing_compacts_to_none_and_still_compares_equal() {
        let mut set = stored(json!({"metadata": {"name": "s"},
            "spec": {"selector": {"matchLabels": {}, "matchExpressions": []}}}));
        set.compact();
        assert!(set.selector_json.is_none());
        let fixed = SetView::from_stored(&set, None).fixed.unwrap_or_default();
        assert_eq!(fixed.selector, None);
    }
}
