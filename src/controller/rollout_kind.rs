//! What the one reconcile ([`super::reconcile`]) needs of each kind of rollout: its status and
//! phases, its spec hash, whether it reads pods, its analysis and config, and its phase
//! machine, for CanaryStatefulSet and CanaryDeployment.

use kube::{Resource, ResourceExt};

use crate::api::{
    ABORT_ANNOTATION, CanaryDeployment, CanaryStatefulSet, PROMOTE_ANNOTATION, REVISION_ANNOTATION,
    RolloutAnalysis, SOURCE_PATH_ANNOTATION, VersionConfig,
};
use crate::plan::actions::Planned;
use crate::plan::analysis::{Builtins, Resolved};
use crate::plan::objects::RolloutRef;
use crate::plan::{Observed, RolloutStatus, deployment, statefulset};
use k8s_openapi::api::core::v1::PodSpec;

/// What the reconcile needs of a rollout kind; its phase machine is behind [`Self::plan`].
pub(crate) trait RolloutKind:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    const KIND: &'static str;
    /// The image the spec asks for.
    fn spec_image(&self) -> &str;
    type Status: RolloutStatus<Phase = Self::Phase>
        + Clone
        + Default
        + serde::Serialize
        + PartialEq
        + Send
        + Sync;
    type Phase: Copy + std::fmt::Debug + crate::api::WireName;
    fn status(&self) -> Option<&Self::Status>;
    /// The hash of the spec as it is in the cluster ([`crate::api::spec_stamp`]), without
    /// `replicas` when Git leaves them to `/scale`.
    fn spec_stamp(&self, replicas_from_git: bool) -> String;
    /// Whether a plan from `phase` reads the rollout's pods (see [`statefulset::reads_pods`]).
    fn reads_pods(phase: Option<Self::Phase>) -> bool;
    /// Whether a plan made from `stored` without the pods must be made again with them.
    fn plans_again_with_pods(stored: Option<Self::Phase>, planned: Option<Self::Phase>) -> bool;
    fn analysis(&self) -> Option<&RolloutAnalysis>;
    /// The pod template whose ConfigMaps and Secrets are copied per version, with
    /// `versionedConfig` (else `None`).
    fn config_template(&self) -> Option<PodSpec>;
    /// How the rollout moves traffic, if it does (its routes' changes wake it).
    fn traffic_routing(&self) -> Option<&crate::api::TrafficRouting>;
    /// The copies each image mounts, as `status` recorded them.
    fn recorded_config(status: &Self::Status) -> &[VersionConfig];
    /// Whether `phase` is a rollout at rest, whose unused config copies may go.
    fn settled(phase: Self::Phase) -> bool;
    /// The image the rollout serves at rest.
    fn stable_image(status: &Self::Status) -> Option<&str>;
    /// The step or batch whose gate comes last (a fleet wave's analysis joins it); `None`
    /// for a rollout without gates.
    fn last_gate(&self) -> Option<i32>;
    fn builtins(&self, ns: &str, status: &Self::Status) -> Builtins;
    /// Whether analysis runs in `phase` (a canary under way).
    fn measures_in(phase: Self::Phase) -> bool;
    fn plan(
        &self,
        reference: RolloutRef,
        status: Self::Status,
        analysis: Resolved,
        observed: &Observed,
        now: jiff::Timestamp,
        outside: Outside,
    ) -> Planned<Self::Status, Self::Phase>;
}

/// What a plan is told from outside its rollout and children.
#[derive(Clone, Debug, Default)]
pub struct Outside {
    /// Why a fleet holds the spec's new image ([`crate::plan::fleet::gate`]).
    pub fleet_hold: Option<String>,
    /// Where the spec's image came from (the image automation's commit).
    pub image_source: Option<String>,
}

fn annotation(rollout: &impl Resource, key: &str) -> Option<String> {
    rollout.annotations().get(key).cloned()
}

impl RolloutKind for CanaryStatefulSet {
    const KIND: &'static str = "CanaryStatefulSet";
    fn spec_image(&self) -> &str {
        &self.spec.image
    }
    type Status = crate::api::CanaryStatefulSetStatus;
    type Phase = crate::api::StatefulSetPhase;
    fn status(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn spec_stamp(&self, replicas_from_git: bool) -> String {
        crate::api::spec_stamp(&self.spec, replicas_from_git)
    }
    fn reads_pods(phase: Option<Self::Phase>) -> bool {
        statefulset::reads_pods(phase)
    }
    fn plans_again_with_pods(stored: Option<Self::Phase>, planned: Option<Self::Phase>) -> bool {
        statefulset::plans_again_with_pods(stored, planned)
    }
    fn analysis(&self) -> Option<&RolloutAnalysis> {
        self.spec.analysis.as_deref()
    }
    fn traffic_routing(&self) -> Option<&crate::api::TrafficRouting> {
        self.spec.traffic_routing.as_deref()
    }
    fn config_template(&self) -> Option<PodSpec> {
        let spec = &self.spec;
        spec.versioned_config
            .then(|| spec.template.get().template.spec)
            .flatten()
    }
    fn recorded_config(status: &Self::Status) -> &[VersionConfig] {
        &status.version_config
    }
    fn settled(phase: Self::Phase) -> bool {
        use crate::api::StatefulSetPhase as P;
        matches!(phase, P::Stable | P::RolledBack)
    }
    fn stable_image(status: &Self::Status) -> Option<&str> {
        status.stable_image.as_deref()
    }
    fn last_gate(&self) -> Option<i32> {
        Some(self.spec.steps.as_ref().map_or(1, |s| s.len().max(1)) as i32)
    }
    fn builtins(&self, ns: &str, status: &Self::Status) -> Builtins {
        statefulset::analysis_builtins(&self.name_any(), ns, &self.spec, status)
    }
    fn measures_in(phase: Self::Phase) -> bool {
        statefulset::reads_abort(phase)
    }
    fn plan(
        &self,
        reference: RolloutRef,
        status: Self::Status,
        analysis: Resolved,
        observed: &Observed,
        now: jiff::Timestamp,
        outside: Outside,
    ) -> Planned<Self::Status, Self::Phase> {
        let input = statefulset::Rollout {
            reference,
            generation: self.metadata.generation,
            spec: &self.spec,
            promote: annotation(self, PROMOTE_ANNOTATION),
            abort: annotation(self, ABORT_ANNOTATION),
            source_revision: annotation(self, REVISION_ANNOTATION),
            source_path: annotation(self, SOURCE_PATH_ANNOTATION),
            status,
            analysis,
            fleet_hold: outside.fleet_hold,
            image_source: outside.image_source,
        };
        statefulset::plan(&input, observed, now)
    }
}

impl RolloutKind for CanaryDeployment {
    const KIND: &'static str = "CanaryDeployment";
    fn spec_image(&self) -> &str {
        &self.spec.image
    }
    type Status = crate::api::CanaryDeploymentStatus;
    type Phase = crate::api::DeploymentPhase;
    fn status(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn spec_stamp(&self, replicas_from_git: bool) -> String {
        crate::api::spec_stamp(&self.spec, replicas_from_git)
    }
    /// A CanaryDeployment's observation has no pod list to spare.
    fn reads_pods(_: Option<Self::Phase>) -> bool {
        true
    }
    fn plans_again_with_pods(_: Option<Self::Phase>, _: Option<Self::Phase>) -> bool {
        false
    }
    fn analysis(&self) -> Option<&RolloutAnalysis> {
        self.spec.analysis.as_deref()
    }
    fn traffic_routing(&self) -> Option<&crate::api::TrafficRouting> {
        self.spec.traffic_routing.as_deref()
    }
    fn config_template(&self) -> Option<PodSpec> {
        let spec = &self.spec;
        spec.versioned_config
            .then(|| spec.template.get().template.spec)
            .flatten()
    }
    fn recorded_config(status: &Self::Status) -> &[VersionConfig] {
        &status.version_config
    }
    fn settled(phase: Self::Phase) -> bool {
        use crate::api::DeploymentPhase as P;
        matches!(phase, P::Completed | P::RolledBack)
    }
    fn stable_image(status: &Self::Status) -> Option<&str> {
        status.stable_image.as_deref()
    }
    fn last_gate(&self) -> Option<i32> {
        use crate::api::DeploymentStrategyType as S;
        match self.spec.strategy.type_ {
            S::Batches => Some(self.spec.batches.max(1)),
            S::BlueGreen => Some(2),
            S::Rolling | S::Rollback => None,
        }
    }
    fn builtins(&self, ns: &str, status: &Self::Status) -> Builtins {
        deployment::analysis_builtins(&self.name_any(), ns, &self.spec, status)
    }
    fn measures_in(phase: Self::Phase) -> bool {
        deployment::reads_abort(phase)
    }
    fn plan(
        &self,
        reference: RolloutRef,
        status: Self::Status,
        analysis: Resolved,
        observed: &Observed,
        now: jiff::Timestamp,
        outside: Outside,
    ) -> Planned<Self::Status, Self::Phase> {
        let input = deployment::DeployRollout {
            reference,
            generation: self.metadata.generation,
            spec: &self.spec,
            source_revision: annotation(self, REVISION_ANNOTATION),
            source_path: annotation(self, SOURCE_PATH_ANNOTATION),
            abort: annotation(self, ABORT_ANNOTATION),
            status,
            analysis,
            fleet_hold: outside.fleet_hold,
            image_source: outside.image_source,
        };
        deployment::plan(&input, observed, now)
    }
}
