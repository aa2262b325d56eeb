//! What the planners see of the cluster: small, plain views of StatefulSets, pods, claims,
//! volumes and Jobs, built from the Kubernetes objects by pure conversions. Tests build them
//! directly.

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

mod deployment;
mod stored_set;
pub use deployment::{DeploymentView, StoredDeployment};
pub use stored_set::{
    StoredContainer, StoredPodSpec, StoredRollingUpdate, StoredSet, StoredSetSpec, StoredSetStatus,
    StoredTemplate, StoredUpdateStrategy,
};

use crate::api::{BIND_REQUESTED_ANNOTATION, HANDOFF_TO_ANNOTATION};

/// The uid of the object's controlling owner, if it has one.
pub fn controller_uid(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// A StatefulSet as the planner needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetView {
    pub name: String,
    /// `spec.replicas`.
    pub replicas: i32,
    /// Whether `status` describes the current `spec` (`observedGeneration == generation`).
    pub status_fresh: bool,
    pub ready_replicas: i32,
    pub updated_replicas: i32,
    pub current_revision: Option<String>,
    pub update_revision: Option<String>,
    /// The hash linnet put on the set when it last applied it.
    pub applied_hash: Option<String>,
    /// The image of the rolled-out container in the set's template.
    pub image: Option<String>,
    /// `spec.updateStrategy.rollingUpdate.partition` (0 when unset).
    pub partition: i32,
    /// What Kubernetes never lets change on the set (None when not known).
    pub fixed: Option<FixedSetFields>,
    /// The uid of the set's controlling owner: a set its rollout controls is applied again
    /// without first reading it to check that no one else made it.
    pub controller_uid: Option<String>,
}

/// The fields of a StatefulSet's spec that the API server refuses to change (422): a rollout
/// that changes one must be refused before its apply is, with a message that says what to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FixedSetFields {
    pub selector: Option<serde_json::Value>,
    pub service_name: String,
    pub pod_management_policy: String,
    pub claim_templates: Vec<ClaimTemplateView>,
}

/// A volume claim template, down to what decides the volumes it makes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimTemplateView {
    pub name: String,
    pub access_modes: Vec<String>,
    pub storage: Option<String>,
    pub storage_class: Option<String>,
}

/// A label selector as JSON, with empty parts dropped so that unset and empty compare equal
/// (None when it selects nothing).
pub fn normalized_selector(selector: &LabelSelector) -> Option<serde_json::Value> {
    let mut s = selector.clone();
    s.match_labels = s.match_labels.filter(|m| !m.is_empty());
    s.match_expressions = s.match_expressions.filter(|e| !e.is_empty());
    serde_json::to_value(s)
        .ok()
        .filter(|v| v.as_object().is_some_and(|o| !o.is_empty()))
}

impl FixedSetFields {
    /// From a set's spec parts (the desired set's or the store's, which share these types).
    pub fn of(
        selector: Option<&LabelSelector>,
        service_name: Option<&str>,
        pod_management_policy: Option<&str>,
        claim_templates: &[PersistentVolumeClaim],
    ) -> FixedSetFields {
        let selector = selector.and_then(normalized_selector);
        FixedSetFields {
            selector,
            service_name: service_name.unwrap_or_default().to_string(),
            pod_management_policy: pod_management_policy.unwrap_or("OrderedReady").to_string(),
            claim_templates: claim_templates
                .iter()
                .map(|t| {
                    let spec = t.spec.clone().unwrap_or_default();
                    let mut access_modes = spec.access_modes.unwrap_or_default();
                    access_modes.sort();
                    ClaimTemplateView {
                        name: t.metadata.name.clone().unwrap_or_default(),
                        access_modes,
                        storage: spec
                            .resources
                            .and_then(|r| r.requests)
                            .and_then(|r| r.get("storage").map(|q| q.0.clone())),
                        storage_class: spec.storage_class_name,
                    }
                })
                .collect(),
        }
    }

    /// The desired set's fixed fields.
    pub fn of_set(set: &StatefulSet) -> FixedSetFields {
        let spec = set.spec.clone().unwrap_or_default();
        FixedSetFields::of(
            Some(&spec.selector),
            spec.service_name.as_deref(),
            spec.pod_management_policy.as_deref(),
            spec.volume_claim_templates.as_deref().unwrap_or_default(),
        )
    }

    /// The rollout's fields (under `spec.template`) where `desired` differs from this live set.
    /// A storage class Git leaves out is the cluster's default, not a change.
    pub fn changed(&self, desired: &FixedSetFields) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.selector != desired.selector {
            out.push("spec.template.selector");
        }
        if self.service_name != desired.service_name {
            out.push("spec.template.serviceName");
        }
        if self.pod_management_policy != desired.pod_management_policy {
            out.push("spec.template.podManagementPolicy");
        }
        let same_templates = self.claim_templates.len() == desired.claim_templates.len()
            && self
                .claim_templates
                .iter()
                .zip(&desired.claim_templates)
                .all(|(live, want)| {
                    live.name == want.name
                        && live.access_modes == want.access_modes
                        && live.storage == want.storage
                        && (want.storage_class.is_none()
                            || live.storage_class == want.storage_class)
                });
        if !same_templates {
            out.push("spec.template.volumeClaimTemplates");
        }
        out
    }
}

/// A pod of one of the rollout's sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodView {
    pub name: String,
    /// The StatefulSet that owns it.
    pub set: String,
    pub ordinal: i32,
    pub ready: bool,
    /// When it last became Ready.
    pub ready_since: Option<Timestamp>,
    /// `controller-revision-hash`: the set revision the pod runs.
    pub revision: Option<String>,
    pub deleting: bool,
    /// The image of the rollout's container (`spec.container`, else the first) in the pod.
    pub image: Option<String>,
}

/// A PersistentVolumeClaim of the rollout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimView {
    pub name: String,
    pub uid: String,
    /// `spec.volumeName`.
    pub volume: Option<String>,
    pub bound: bool,
    pub deleting: bool,
    /// The volume a handoff asked this claim to bind ([`BIND_REQUESTED_ANNOTATION`]).
    pub bind_requested: Option<String>,
}

/// A PersistentVolume that holds (or held) one of the rollout's claims.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeView {
    pub name: String,
    pub retain: bool,
    /// `spec.claimRef`: the claim's name and uid, when it names one in the rollout's namespace.
    pub claim: Option<(String, Option<String>)>,
    /// The claim a handoff in progress is moving it to.
    pub handoff_to: Option<String>,
    pub storage_class: Option<String>,
}

/// The rollout's migration Job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobView {
    pub name: String,
    pub succeeded: bool,
    pub failed: bool,
}

/// Everything a planner reads from the cluster: a CanaryStatefulSet's sets, pods, claims,
/// volumes and Job, or a CanaryDeployment's Deployments (and its analysis Jobs, through
/// [`crate::plan::analysis`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// `<name>-stable` (TwoSets) or `<name>` (Partition).
    pub stable: Option<SetView>,
    /// `<name>-canary` (TwoSets only).
    pub canary: Option<SetView>,
    pub pods: Vec<PodView>,
    pub claims: Vec<ClaimView>,
    pub volumes: Vec<VolumeView>,
    /// The migration Job for the current canary image, if one was created.
    pub job: Option<JobView>,
    /// A set of the rollout's other strategy (e.g. `<name>` when the spec says TwoSets): the
    /// strategy was switched on a live rollout.
    pub other_strategy_set: Option<String>,
    /// A CanaryDeployment's Deployments (owned by it).
    pub deployments: Vec<DeploymentView>,
    /// A CanaryDeployment's baseline Deployment (`strategy.baseline`), kept apart from
    /// `deployments`: it runs the stable image but never serves as the stable version.
    pub baseline: Option<DeploymentView>,
    /// The Services and HTTPRoutes of a rollout with `trafficRouting` (empty without).
    pub traffic: crate::plan::traffic::TrafficView,
    /// The copies of the config the pod template names, as it is now (`versionedConfig`).
    pub config: crate::plan::config::ConfigObserved,
}

impl Observed {
    pub fn claim(&self, name: &str) -> Option<&ClaimView> {
        self.claims.iter().find(|c| c.name == name)
    }

    pub fn pods_of<'a>(&'a self, set: &'a str) -> impl Iterator<Item = &'a PodView> + 'a {
        self.pods.iter().filter(move |p| p.set == set)
    }
}

/// The image of container `container` (or the first) in a pod spec.
pub fn container_image(
    spec: Option<&k8s_openapi::api::core::v1::PodSpec>,
    container: Option<&str>,
) -> Option<String> {
    let containers = &spec?.containers;
    let c = match container {
        Some(name) => containers.iter().find(|c| c.name == name),
        None => containers.first(),
    };
    c.and_then(|c| c.image.clone())
}

impl PodView {
    /// A pod owned by a StatefulSet, with the image of its container `container` (else the
    /// first); `None` for any other pod.
    pub fn from_object(pod: &Pod, container: Option<&str>) -> Option<PodView> {
        let owner = pod
            .metadata
            .owner_references
            .as_ref()?
            .iter()
            .find(|o| o.kind == "StatefulSet" && o.controller == Some(true))?;
        let name = pod.metadata.name.clone()?;
        let ordinal = name
            .strip_prefix(&format!("{}-", owner.name))?
            .parse()
            .ok()?;
        let ready_condition = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let ready = ready_condition.is_some_and(|c| c.status == "True");
        Some(PodView {
            set: owner.name.clone(),
            ordinal,
            ready,
            ready_since: ready_condition
                .filter(|_| ready)
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0),
            revision: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("controller-revision-hash").cloned()),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            image: container_image(pod.spec.as_ref(), container),
            name,
        })
    }
}

impl ClaimView {
    pub fn from_object(claim: &PersistentVolumeClaim) -> ClaimView {
        ClaimView {
            name: claim.metadata.name.clone().unwrap_or_default(),
            uid: claim.metadata.uid.clone().unwrap_or_default(),
            volume: claim.spec.as_ref().and_then(|s| s.volume_name.clone()),
            bound: claim
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Bound"),
            deleting: claim.metadata.deletion_timestamp.is_some(),
            bind_requested: claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(BIND_REQUESTED_ANNOTATION).cloned()),
        }
    }
}

impl VolumeView {
    /// A volume as seen from namespace `namespace`: a claimRef elsewhere is not ours.
    pub fn from_object(pv: &PersistentVolume, namespace: &str) -> VolumeView {
        let spec = pv.spec.clone().unwrap_or_default();
        VolumeView {
            name: pv.metadata.name.clone().unwrap_or_default(),
            retain: spec.persistent_volume_reclaim_policy.as_deref() == Some("Retain"),
            claim: spec
                .claim_ref
                .filter(|r| r.namespace.as_deref() == Some(namespace))
                .and_then(|r| Some((r.name?, r.uid))),
            handoff_to: pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(HANDOFF_TO_ANNOTATION).cloned()),
            storage_class: spec.storage_class_name,
        }
    }
}

impl JobView {
    pub fn from_object(job: &Job) -> JobView {
        let conditions = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let has = |t: &str| {
            conditions
                .iter()
                .any(|c| c.type_ == t && c.status == "True")
        };
        JobView {
            name: job.metadata.name.clone().unwrap_or_default(),
            succeeded: has("Complete"),
            failed: has("Failed"),
        }
    }
}
