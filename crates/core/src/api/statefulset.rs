//! `CanaryStatefulSet`: a canary rollout of a stateful application whose replicas keep their
//! identity (ordinal) and their volume through canary, promotion and rollback.

use k8s_openapi::api::apps::v1::StatefulSetSpec;
use k8s_openapi::api::batch::v1::JobTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// Desired state of a CanaryStatefulSet.
// The derive takes one `printcolumn` per column; clippy reads them as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "rollouts.linnet.dev",
    version = "v1alpha1",
    kind = "CanaryStatefulSet",
    namespaced,
    derive = "PartialEq",
    status = "CanaryStatefulSetStatus",
    shortname = "csts",
    shortname = "canarysts",
    category = "linnet",
    // `kubectl scale` and a HorizontalPodAutoscaler set `spec.replicas` through /scale; the
    // selector matches every pod of the rollout, stable and canary.
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Stable", type_ = "string", json_path = ".status.stableImage"),
    printcolumn(name = "Canary", type_ = "string", json_path = ".status.canaryImage"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.ready"),
    printcolumn(name = "Weight", type_ = "integer", json_path = ".status.canaryWeight"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    doc = "A canary rollout of a StatefulSet in which every replica keeps its ordinal and its volume."
)]
#[x_kube(
    validation = Rule::new("self.canaryReplicas <= self.replicas").message("canaryReplicas must not exceed replicas").field_path(".canaryReplicas"),
    validation = Rule::new("size(self.image) > 0").message("image must not be empty").field_path(".image"),
    validation = Rule::new("!has(self.steps) || self.steps.all(s, s >= 1 && s <= self.canaryReplicas)").message("every step must be at least 1 and at most canaryReplicas").field_path(".steps"),
    validation = Rule::new("!has(self.steps) || self.steps.all(s, self.steps.indexOf(s) == self.steps.lastIndexOf(s)) && self.steps.isSorted()").message("steps must be strictly ascending").field_path(".steps"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.weights) || self.trafficRouting.weights.all(w, w >= 0 && w <= 100)").message("every weight must be a percent, 0 to 100").field_path(".trafficRouting.weights"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.weights) || size(self.trafficRouting.weights) == (has(self.steps) ? size(self.steps) : 1)").message("trafficRouting.weights needs one weight per step (one when there are no steps)").field_path(".trafficRouting.weights"),
    validation = Rule::new("!has(self.trafficRouting) || self.canaryReplicas < self.replicas").message("with trafficRouting a canary must leave at least one stable replica to send the rest of the traffic to: canaryReplicas must be less than replicas").field_path(".canaryReplicas"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.headerRoute) || (has(self.trafficRouting.headerRoute.headers) && size(self.trafficRouting.headerRoute.headers) > 0) || (has(self.trafficRouting.headerRoute.queryParams) && size(self.trafficRouting.headerRoute.queryParams) > 0) || has(self.trafficRouting.headerRoute.cookie)").message("trafficRouting.headerRoute needs at least one header, query parameter or cookie").field_path(".trafficRouting.headerRoute"),
    validation = Rule::new("!has(self.trafficRouting) || (has(self.trafficRouting.gatewayAPI.httpRoutes) ? size(self.trafficRouting.gatewayAPI.httpRoutes) : 0) + (has(self.trafficRouting.gatewayAPI.grpcRoutes) ? size(self.trafficRouting.gatewayAPI.grpcRoutes) : 0) >= 1").message("trafficRouting.gatewayAPI names no route: give httpRoutes, grpcRoutes or both").field_path(".trafficRouting.gatewayAPI"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.headerRoute) || !has(self.trafficRouting.gatewayAPI.grpcRoutes) || size(self.trafficRouting.gatewayAPI.grpcRoutes) == 0 || (has(self.trafficRouting.headerRoute.headers) && size(self.trafficRouting.headerRoute.headers) > 0) || has(self.trafficRouting.headerRoute.cookie)").message("trafficRouting.headerRoute with grpcRoutes needs a header or a cookie: a gRPC request has no query parameters").field_path(".trafficRouting.headerRoute"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.headerRoute) || !has(self.trafficRouting.headerRoute.cookie) || !has(self.trafficRouting.headerRoute.headers) || self.trafficRouting.headerRoute.headers.all(h, h.name.lowerAscii() != 'cookie')").message("trafficRouting.headerRoute: give a cookie as `cookie`, not also as a Cookie header").field_path(".trafficRouting.headerRoute"),
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CanaryStatefulSetSpec {
    /// Replicas of the application when no canary runs.
    /// Leave it out of Git to let a HorizontalPodAutoscaler (or `kubectl scale`) set it
    /// through the `/scale` subresource: linnet then neither applies nor puts it back, and it
    /// starts at 1.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub replicas: i32,
    /// Replicas that run the new image during a canary: the top ordinals.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub canary_replicas: i32,
    /// The image to roll out. A change starts a canary; reverting it aborts one.
    pub image: String,
    /// The container whose image is rolled out; the first container when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The StatefulSet to run (its `replicas` is ignored; `replicas` above wins).
    #[schemars(schema_with = "super::embedded_object")]
    pub template: super::Embedded<StatefulSetSpec>,
    /// How the canary is placed.
    #[serde(default)]
    pub strategy: StatefulSetStrategy,
    /// Optional canary batch sizes, ascending, e.g. `[1, 2]`; the last may not exceed
    /// `canaryReplicas`. Without steps the whole canary comes up at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub steps: Option<Vec<i32>>,
    /// When a healthy canary is promoted.
    #[serde(default)]
    pub promotion: Promotion,
    /// How long a step may take to become Ready before the canary is rolled back.
    #[serde(default = "default_progress_deadline")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: i64,
    /// A Job run before promotion (for example, a schema migration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: most rollouts have none, and a Job template inline is 2.4 KB in every rollout.
    pub migration: Option<Box<Migration>>,
    /// Metrics that judge the canary: a background analysis and gates after steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: most rollouts have none (96 bytes inline in each stored rollout).
    pub analysis: Option<Box<super::RolloutAnalysis>>,
    /// Traffic shifting through the Gateway API: the canary gets `weights` percent of the
    /// requests, not its share of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_routing: Option<Box<super::TrafficRouting>>,
    /// What linnet does in Git once the rollout is rolled back (`revert: commit` puts the
    /// image it returned to back in the spec file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<super::OnFailure>,
    /// Where the change goes next once it passed here: a pull request that gives the next
    /// environment's rollout this image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: most rollouts have none (80 bytes inline in each stored rollout).
    pub promote_to: Option<Box<super::PromoteTo>>,
    /// Copy the ConfigMaps and Secrets the pod template refers to for each version
    /// (`<name>-<hash>`, owned by the rollout): a commit that changes the image and its config
    /// gives the new config to the canary pods only; the others keep theirs until promotion,
    /// and a rollback keeps the old. A config change without an image change rolls every pod
    /// onto the new copy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub versioned_config: bool,
    /// Only in the agent's rollout store: the object's labels, annotations and managed
    /// fields, packed ([`super::packed_meta`]). Never serialized.
    // Not `skip`: KubeSchema copies the struct for its schema, and a skipped field is
    // never read there (dead code).
    #[serde(
        skip_deserializing,
        skip_serializing_if = "super::PackedMeta::never_serialized"
    )]
    #[schemars(skip)]
    pub packed_meta: super::PackedMeta,
}

fn one() -> i32 {
    1
}

fn default_progress_deadline() -> i64 {
    600
}

/// Where the canary runs.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StatefulSetStrategy {
    #[serde(rename = "type", default)]
    pub type_: StatefulSetStrategyType,
}

/// The two ways to canary a StatefulSet.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StatefulSetStrategyType {
    /// `<name>-stable` and `<name>-canary`; each freed replica's volume moves to the canary.
    #[default]
    TwoSets,
    /// One StatefulSet; the canary is the top ordinals above the partition.
    Partition,
}

/// When a canary is promoted.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Promotion {
    #[serde(rename = "type", default)]
    pub type_: PromotionType,
    /// With `Auto`: how long every canary pod must have been Ready before promotion.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub bake_seconds: i64,
}

impl Default for Promotion {
    fn default() -> Self {
        Promotion {
            type_: PromotionType::Manual,
            bake_seconds: 0,
        }
    }
}

/// Who promotes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PromotionType {
    /// linnet, once the canary has baked.
    Auto,
    /// A human, with the `rollouts.linnet.dev/promote: "true"` annotation (from Git).
    #[default]
    Manual,
}

/// A Job to run before promotion.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Migration {
    /// The Job to run; a failure stops the rollout in `MigrationFailed`.
    #[schemars(schema_with = "super::embedded_object")]
    pub template: JobTemplateSpec,
}

/// Where a CanaryStatefulSet is in its rollout.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatefulSetPhase {
    Initializing,
    Stable,
    ScalingDownStable,
    DeployingCanary,
    CanaryActive,
    AwaitingMigration,
    MigratingData,
    MigrationFailed,
    Promoting,
    RollingBack,
    RolledBack,
    Failed,
}

/// Observed state of a CanaryStatefulSet.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatefulSetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<StatefulSetPhase>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling and Stalled (kstatus): exactly one is True.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_image: Option<String>,
    /// Ready pods over desired replicas, e.g. `3/3`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(default)]
    pub canary_ready_replicas: i32,
    /// The replicas linnet sizes the rollout's workloads to, stable and canary together, once
    /// it has acted on `spec.replicas`: `/scale`'s `status.replicas`.
    #[serde(default)]
    pub replicas: i32,
    /// The label selector of every pod of the rollout, as text: `/scale`'s `status.selector`,
    /// which a HorizontalPodAutoscaler reads the pods' metrics by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Ready pods by the image their rolled-out container runs, read from the pods (from the
    /// set while Stable): what `linnet get`, the write-back subject and the dashboard say is
    /// serving, in every phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready_by_image: Vec<super::ImageReplicas>,
    /// Index into `spec.steps` of the step being rolled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step: Option<i32>,
    /// When the current phase began; bake times and deadlines count from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_since: Option<Time>,
    /// What is happening, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The OpenTelemetry trace (32 hex digits) of the sync that applied this generation,
    /// when the agent exports traces (`--otlp-endpoint`): its reconciles and actions are in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The action the plan needs that last failed (its description), while the plan still
    /// needs it: the failure stays shown, without a write per retry, until it is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_action: Option<String>,
    /// The StatefulSet revision (`controller-revision-hash`) the stable replicas run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_revision: Option<String>,
    /// The StatefulSet revision the canary replicas run, during a canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_revision: Option<String>,
    /// The Git commit that last set this spec (from the sync's revision annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_revision: Option<String>,
    /// Where the spec's image came from when the image automation wrote it: the image, its
    /// digest, the `ImagePolicy` and the commit (`--image-automation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_source: Option<String>,
    /// The promote annotation's value when the current canary started. A `"true"` that was
    /// already there does not promote the new canary (it was meant for an earlier one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_at_start: Option<String>,
    /// The abort annotation's value when the current canary started (same rule as promote).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_at_start: Option<String>,
    /// The analysis runs of the current (or last) canary, with their measurements.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis: Vec<super::AnalysisRunStatus>,
    /// During a TwoSets canary, each handed-over replica's own PersistentVolume, by the canary
    /// claim that holds it (`data-redis-canary-2: pv-…`), recorded when the handoff took it
    /// from the stable claim. A claim of that replica on any other volume fails the rollout
    /// (reason VolumeSwapped); nothing is handed on but this volume.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub replica_volumes: std::collections::BTreeMap<String, String>,
    /// Each stable replica's PersistentVolume, by its claim, recorded while Stable. A claim
    /// found on another volume (deleted with its pod, and made again on a new, empty one)
    /// sets the condition VolumeReplaced, naming both, with a Warning event.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub stable_volumes: std::collections::BTreeMap<String, String>,
    /// Percent of the routes' requests the canary Service gets, as the routes say now (with
    /// `trafficRouting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_weight: Option<i32>,
    /// Whether the routes send requests matching `trafficRouting.headerRoute` to the canary.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub header_routed: bool,
    /// When the routes last changed (weight or header route), as observed: pods that lose
    /// their traffic are stopped only `settleSeconds` after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_since: Option<Time>,
    /// With `versionedConfig`: the ConfigMap and Secret copies each image's pods mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub version_config: Vec<super::VersionConfig>,
    /// The current (or last) canary's stages as they happened: each step, the migration, the
    /// promotion or the rollback, with the move that opened and closed each, for the
    /// dashboard's timeline. A new canary starts a new list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageStatus>,
    /// The current (or last) canary's weight and ready pods per image over time, a point each
    /// time they changed (at most 60: the first and the newest), for the dashboard's charts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<super::SeriesPoint>,
}

/// What a stage of a canary is.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// `spec.steps[step - 1]` canary replicas, from their start until the next step (the
    /// last step lasts until the promotion or the rollback).
    Step,
    /// The migration Job before the promotion.
    Migration,
    Promotion,
    Rollback,
}

/// One stage of a canary on the timeline.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    pub stage: Stage,
    /// The 1-based step, for a Step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<i32>,
    /// The canary replicas of a Step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_replicas: Option<i32>,
    /// The move that opened it, as its event's reason: `CanaryStarted` (a commit),
    /// `StepComplete` (the step before Ready and its analysis gate passed),
    /// `PromotionStarted` (the promote annotation), `Aborted`, `AnalysisFailed`…
    pub opened_by: String,
    /// What that move said, within 300 characters.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// The Git commit the rollout had been synced from when the stage opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    pub started_at: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The move that closed it (`StepComplete`, `Promoted`, `RolledBack`, `Aborted`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by: Option<String>,
}
