//! The child objects a CanaryStatefulSet wants: its StatefulSets, the claims a volume handoff
//! pre-creates, and the migration Job. Each is built from the spec alone and carries a hash
//! of itself, so the planner can tell from an observed object's annotation that nothing
//! needs writing.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetOrdinals, StatefulSetPersistentVolumeClaimRetentionPolicy,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use crate::api::{
    API_VERSION, CHILD_HASH_ANNOTATION, CanaryStatefulSetSpec, MANAGED_BY_LABEL, MANAGED_BY_VALUE,
    ROLE_LABEL, ROLLOUT_LABEL, ROLLOUT_SOURCE_LABEL,
};
use crate::hash::content_hash;

/// What a status shows for pods or a workload whose container image cannot be read (the
/// container `spec.container` names is not in them): never another image in its place.
pub const UNKNOWN_IMAGE: &str = "unknown";

/// The rollout object itself, as children refer to it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RolloutRef {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The rollout's `rollouts.linnet.dev/source` label, copied to its children as
    /// `rollouts.linnet.dev/rollout-source` so that an agent watches only its own.
    pub source: Option<String>,
}

impl RolloutRef {
    pub fn owner(&self, kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: API_VERSION.into(),
            kind: kind.into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    /// Labels every child carries. Never [`crate::api::SOURCE_LABEL`]: a child is the
    /// rollout's, not Git's, and must not look like an object prune may delete.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([
            (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
            (ROLLOUT_LABEL.to_string(), self.name.clone()),
        ]);
        if let Some(s) = &self.source {
            l.insert(ROLLOUT_SOURCE_LABEL.to_string(), s.clone());
        }
        l
    }

    pub fn meta(&self, name: &str, kind: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![self.owner(kind)]),
            ..ObjectMeta::default()
        }
    }
}

/// Which of a rollout's StatefulSets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `<name>-stable` of TwoSets.
    Stable,
    /// `<name>-canary` of TwoSets.
    Canary,
    /// The one set of Partition, named `<name>`.
    Single,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Stable => "stable",
            Role::Canary => "canary",
            Role::Single => "single",
        }
    }

    pub fn set_name(self, rollout: &str) -> String {
        match self {
            Role::Stable => format!("{rollout}-stable"),
            Role::Canary => format!("{rollout}-canary"),
            Role::Single => rollout.to_string(),
        }
    }
}

/// The shape of one StatefulSet of a rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct SetShape<'a> {
    pub role: Role,
    pub image: &'a str,
    pub replicas: i32,
    /// The first ordinal (canary sets start above the stable ones).
    pub ordinals_start: i32,
    /// Pods below this ordinal keep the old revision (Partition).
    pub partition: i32,
}

/// The StatefulSet for `shape`, with [`CHILD_HASH_ANNOTATION`] set, naming the config copies
/// `versions` gives its image.
pub fn stateful_set(
    rollout: &RolloutRef,
    spec: &CanaryStatefulSetSpec,
    versions: &[crate::api::VersionConfig],
    shape: &SetShape<'_>,
) -> StatefulSet {
    let name = shape.role.set_name(&rollout.name);
    let mut set_spec = spec.template.get();
    set_spec.replicas = Some(shape.replicas);

    // Pods (and, through the selector, the claims the set creates) say whose they are. The two
    // sets of TwoSets have disjoint selectors; both still match the application's Service.
    let mut pod_labels = set_spec.selector.match_labels.clone().unwrap_or_default();
    pod_labels.insert(ROLLOUT_LABEL.into(), rollout.name.clone());
    pod_labels.insert(ROLE_LABEL.into(), shape.role.label().into());
    set_spec.selector = LabelSelector {
        match_labels: Some(pod_labels.clone()),
        match_expressions: set_spec.selector.match_expressions.clone(),
    };
    let template_meta = set_spec
        .template
        .metadata
        .get_or_insert_with(ObjectMeta::default);
    template_meta
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(pod_labels);

    if let Some(pod) = set_spec.template.spec.as_mut() {
        super::config::rewrite(pod, super::config::copies_for(versions, shape.image));
        let index = match spec.container.as_deref() {
            Some(c) => pod.containers.iter().position(|x| x.name == c),
            None => (!pod.containers.is_empty()).then_some(0),
        };
        if let Some(i) = index {
            pod.containers[i].image = Some(shape.image.to_string());
        }
    }
    set_spec.ordinals = (shape.ordinals_start > 0).then_some(StatefulSetOrdinals {
        start: Some(shape.ordinals_start),
    });
    if shape.role == Role::Single {
        set_spec.update_strategy = Some(StatefulSetUpdateStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(
                k8s_openapi::api::apps::v1::RollingUpdateStatefulSetStrategy {
                    partition: Some(shape.partition),
                    max_unavailable: None,
                },
            ),
        });
    }
    // Volumes outlive their pods: linnet moves them between sets and never deletes them.
    set_spec.persistent_volume_claim_retention_policy =
        Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
            when_deleted: Some("Retain".into()),
            when_scaled: Some("Retain".into()),
        });

    let mut labels = rollout.labels();
    labels.insert(ROLE_LABEL.into(), shape.role.label().into());
    let mut set = StatefulSet {
        metadata: rollout.meta(&name, "CanaryStatefulSet", labels),
        spec: Some(set_spec),
        status: None,
    };
    stamp(&mut set.metadata, &set.spec);
    set
}

/// Puts the hash of `content` on `meta`.
pub(crate) fn stamp<T: serde::Serialize>(meta: &mut ObjectMeta, content: &T) {
    let hash = serde_json::to_value(content)
        .map(|v| content_hash(&v))
        .unwrap_or_default();
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CHILD_HASH_ANNOTATION.into(), hash);
}

/// The hash [`stateful_set`] stamped on a set.
pub fn applied_hash(set: &StatefulSet) -> Option<&str> {
    set.metadata
        .annotations
        .as_ref()?
        .get(CHILD_HASH_ANNOTATION)
        .map(String::as_str)
}

/// The names of the set's claim templates (`data` in `data-redis-stable-2`).
pub fn claim_templates(spec: &CanaryStatefulSetSpec) -> Vec<String> {
    spec.template
        .get()
        .volume_claim_templates
        .iter()
        .flatten()
        .filter_map(|t| t.metadata.name.clone())
        .collect()
}

/// The claim name the StatefulSet controller uses for template `template`, set `set`,
/// ordinal `ordinal`.
pub fn claim_name(template: &str, set: &str, ordinal: i32) -> String {
    format!("{template}-{set}-{ordinal}")
}

/// The claim a handoff pre-creates for `volume`: template `template`'s spec, bound to that
/// one volume by `volumeName`, labelled like the claims the target set would create.
pub fn handoff_claim(
    rollout: &RolloutRef,
    spec: &CanaryStatefulSetSpec,
    template: &str,
    target: Role,
    ordinal: i32,
    volume: &str,
    storage_class: Option<&str>,
) -> PersistentVolumeClaim {
    let set = target.set_name(&rollout.name);
    let set_spec = spec.template.get();
    let base = set_spec
        .volume_claim_templates
        .iter()
        .flatten()
        .find(|t| t.metadata.name.as_deref() == Some(template));
    let mut claim_spec: PersistentVolumeClaimSpec =
        base.and_then(|t| t.spec.clone()).unwrap_or_default();
    claim_spec.volume_name = Some(volume.to_string());
    if storage_class.is_some() {
        claim_spec.storage_class_name = storage_class.map(str::to_string);
    }
    let mut labels = base
        .and_then(|t| t.metadata.labels.clone())
        .unwrap_or_default();
    labels.extend(set_spec.selector.match_labels.clone().unwrap_or_default());
    labels.extend(rollout.labels());
    labels.insert(ROLE_LABEL.into(), target.label().into());
    let mut meta = rollout.meta(
        &claim_name(template, &set, ordinal),
        "CanaryStatefulSet",
        labels,
    );
    // Claims are not owned: deleting the rollout must never delete a volume's claim.
    meta.owner_references = None;
    PersistentVolumeClaim {
        metadata: meta,
        spec: Some(claim_spec),
        status: None,
    }
}

/// The migration Job's name for a canary image: one Job per image, never run twice.
pub fn migration_job_name(rollout: &str, image: &str) -> String {
    let hash = content_hash(&serde_json::Value::String(image.to_string()));
    let prefix: String = rollout.chars().take(40).collect();
    format!("{prefix}-migrate-{}", &hash[..10])
}

/// The migration Job for `image`, from the spec's template.
pub fn migration_job(
    rollout: &RolloutRef,
    spec: &CanaryStatefulSetSpec,
    image: &str,
) -> Option<Job> {
    let template = &spec.migration.as_ref()?.template;
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.extend(rollout.labels());
    let mut meta = rollout.meta(
        &migration_job_name(&rollout.name, image),
        "CanaryStatefulSet",
        labels,
    );
    meta.annotations = Some(BTreeMap::from([(
        "rollouts.linnet.dev/canary-image".to_string(),
        image.to_string(),
    )]));
    Some(Job {
        metadata: meta,
        spec: template.spec.clone(),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SOURCE_LABEL;

    #[test]
    fn children_are_owned_and_never_labelled_as_applied_from_git() {
        let rollout = RolloutRef {
            name: "redis".into(),
            namespace: "ns".into(),
            uid: "u1".into(),
            source: Some("prod".into()),
        };
        let labels = rollout.labels();
        assert!(!labels.contains_key(SOURCE_LABEL), "{labels:?}");
        assert_eq!(labels[ROLLOUT_SOURCE_LABEL], "prod");
        assert_eq!(labels[ROLLOUT_LABEL], "redis");
        let meta = rollout.meta("redis-stable", "CanaryStatefulSet", labels);
        let owner = &meta.owner_references.unwrap_or_default()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("CanaryStatefulSet", "u1", Some(true))
        );
    }
}
