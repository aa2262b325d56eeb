//! `CanaryDeployment`: a Deployment rolled out in batches, with pauses for a human and
//! rollback.

use k8s_openapi::api::apps::v1::DeploymentSpec;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// Desired state of a CanaryDeployment.
// The derive takes one `printcolumn` per column; clippy reads them as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "rollouts.linnet.dev",
    version = "v1alpha1",
    kind = "CanaryDeployment",
    namespaced,
    derive = "PartialEq",
    status = "CanaryDeploymentStatus",
    shortname = "cdeploy",
    shortname = "canarydeploy",
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
    printcolumn(name = "Batch", type_ = "string", json_path = ".status.batch"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.ready"),
    printcolumn(name = "Weight", type_ = "integer", json_path = ".status.canaryWeight"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    doc = "A Deployment rolled out in batches, promoted batch by batch from Git."
)]
#[x_kube(
    validation = Rule::new("size(self.image) > 0").message("image must not be empty").field_path(".image"),
    validation = Rule::new("self.batches >= 1").message("batches must be at least 1").field_path(".batches"),
    validation = Rule::new("self.currentBatch >= 1 && (has(self.strategy) && has(self.strategy.type) && self.strategy.type == 'BlueGreen' ? self.currentBatch <= 2 : (self.currentBatch <= self.batches || self.currentBatch <= 2 && has(self.strategy) && (has(self.strategy.blueGreen) || has(self.strategy.type) && self.strategy.type == 'Rollback')))").message("currentBatch must be between 1 and batches (with strategy BlueGreen, 1 for the preview, 2 to switch)").field_path(".currentBatch"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.weights) || self.trafficRouting.weights.all(w, w >= 0 && w <= 100)").message("every weight must be a percent, 0 to 100").field_path(".trafficRouting.weights"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.weights) || size(self.trafficRouting.weights) == self.batches").message("trafficRouting.weights needs one weight per batch").field_path(".trafficRouting.weights"),
    validation = Rule::new("!has(self.trafficRouting) || has(self.strategy) && has(self.strategy.type) && self.strategy.type != 'Rolling'").message("trafficRouting needs strategy Batches or BlueGreen: a rolling update has no canary to weigh").field_path(".trafficRouting"),
    validation = Rule::new("!has(self.strategy) || !has(self.strategy.baseline) || !self.strategy.baseline || has(self.strategy.type) && self.strategy.type == 'Batches'").message("strategy.baseline needs strategy Batches: a rolling update has no canary to compare, and a blue-green one compares the whole new version").field_path(".strategy.baseline"),
    validation = Rule::new("!has(self.strategy) || !has(self.strategy.type) || self.strategy.type != 'BlueGreen' || has(self.trafficRouting) || has(self.strategy.blueGreen) && has(self.strategy.blueGreen.activeService)").message("strategy BlueGreen needs trafficRouting (the switch moves the routes from the <name>-stable Service to <name>-canary, the preview) or strategy.blueGreen.activeService (the switch points that Service's selector at the new version)").field_path(".strategy.type"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.strategy) || !has(self.strategy.blueGreen) || !has(self.strategy.blueGreen.activeService) && !has(self.strategy.blueGreen.previewService)").message("strategy.blueGreen.activeService and previewService are for a blue-green rollout without trafficRouting: with it, the switch moves the routes, and <name>-canary is the preview").field_path(".strategy.blueGreen"),
    validation = Rule::new("!has(self.strategy) || !has(self.strategy.blueGreen) || !has(self.strategy.blueGreen.previewService) || has(self.strategy.blueGreen.activeService) && self.strategy.blueGreen.previewService != self.strategy.blueGreen.activeService").message("strategy.blueGreen.previewService needs an activeService, and another Service than it").field_path(".strategy.blueGreen.previewService"),
    validation = Rule::new("!has(self.strategy) || !has(self.strategy.type) || self.strategy.type != 'BlueGreen' || !has(self.trafficRouting) || !has(self.trafficRouting.weights)").message("trafficRouting.weights has no use with strategy BlueGreen: the switch moves every request at once").field_path(".trafficRouting.weights"),
    validation = Rule::new("!has(self.strategy) || !has(self.strategy.blueGreen) || has(self.strategy.type) && (self.strategy.type == 'BlueGreen' || self.strategy.type == 'Rollback')").message("strategy.blueGreen needs strategy type BlueGreen (or Rollback, to roll a blue-green rollout back)").field_path(".strategy.blueGreen"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.headerRoute) || (has(self.trafficRouting.headerRoute.headers) && size(self.trafficRouting.headerRoute.headers) > 0) || (has(self.trafficRouting.headerRoute.queryParams) && size(self.trafficRouting.headerRoute.queryParams) > 0) || has(self.trafficRouting.headerRoute.cookie)").message("trafficRouting.headerRoute needs at least one header, query parameter or cookie").field_path(".trafficRouting.headerRoute"),
    validation = Rule::new("!has(self.trafficRouting) || (has(self.trafficRouting.gatewayAPI.httpRoutes) ? size(self.trafficRouting.gatewayAPI.httpRoutes) : 0) + (has(self.trafficRouting.gatewayAPI.grpcRoutes) ? size(self.trafficRouting.gatewayAPI.grpcRoutes) : 0) >= 1").message("trafficRouting.gatewayAPI names no route: give httpRoutes, grpcRoutes or both").field_path(".trafficRouting.gatewayAPI"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.headerRoute) || !has(self.trafficRouting.gatewayAPI.grpcRoutes) || size(self.trafficRouting.gatewayAPI.grpcRoutes) == 0 || (has(self.trafficRouting.headerRoute.headers) && size(self.trafficRouting.headerRoute.headers) > 0) || has(self.trafficRouting.headerRoute.cookie)").message("trafficRouting.headerRoute with grpcRoutes needs a header or a cookie: a gRPC request has no query parameters").field_path(".trafficRouting.headerRoute"),
    validation = Rule::new("!has(self.trafficRouting) || !has(self.trafficRouting.headerRoute) || !has(self.trafficRouting.headerRoute.cookie) || !has(self.trafficRouting.headerRoute.headers) || self.trafficRouting.headerRoute.headers.all(h, h.name.lowerAscii() != 'cookie')").message("trafficRouting.headerRoute: give a cookie as `cookie`, not also as a Cookie header").field_path(".trafficRouting.headerRoute"),
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CanaryDeploymentSpec {
    /// Replicas when the rollout is complete.
    /// Leave it out of Git to let a HorizontalPodAutoscaler (or `kubectl scale`) set it
    /// through the `/scale` subresource: linnet then neither applies nor puts it back, and it
    /// starts at 1.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub replicas: i32,
    /// The image to roll out.
    pub image: String,
    /// The container whose image is rolled out; the first container when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The Deployment to run (its `replicas` is ignored; `replicas` above wins).
    #[schemars(schema_with = "super::embedded_object")]
    pub template: super::Embedded<DeploymentSpec>,
    /// CPU and memory for the rolled-out container; drift from these is corrected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default)]
    pub strategy: DeploymentStrategy,
    /// How many batches a `Batches` rollout takes.
    #[serde(default = "one")]
    pub batches: i32,
    /// Where the rollout waits for a human.
    #[serde(default)]
    pub pause: PauseMode,
    /// The batch a human has allowed so far; a pull request bumps it to continue.
    #[serde(default = "one")]
    pub current_batch: i32,
    /// How long new pods may take to become available, per batch, before the rollout stops.
    #[serde(default = "default_progress_deadline")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: i64,
    /// Roll back by itself when the deadline passes. Off: the rollout stops in Failed and the
    /// old version keeps serving.
    #[serde(default)]
    pub rollback_on_failure: bool,
    /// Metrics that judge the new version: a background analysis and gates after batches. A
    /// failed analysis always rolls back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Boxed: most rollouts have none (96 bytes inline in each stored rollout).
    pub analysis: Option<Box<super::RolloutAnalysis>>,
    /// Traffic shifting through the Gateway API: the new version gets `weights` percent of
    /// the requests at each batch, not its share of the pods. Needs strategy `Batches` or
    /// `BlueGreen`.
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

fn default_progress_deadline() -> i64 {
    600
}

fn one() -> i32 {
    1
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeploymentStrategy {
    #[serde(rename = "type", default)]
    pub type_: DeploymentStrategyType,
    /// `Batches` only: also run the stable version's pods beside each batch's new ones, as
    /// many and started with them, in the Deployment `<name>-baseline` (pods labelled
    /// `rollouts.linnet.dev/version: baseline`), so an analysis compares two versions of one
    /// age (`{{ rollout.baselineSelector }}`) rather than new pods with warm ones. They are
    /// extra pods, and deleted when the rollout ends or rolls back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub baseline: bool,
    /// `BlueGreen` only: the preview's size and how long the old version outlives the switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blue_green: Option<BlueGreen>,
}

/// A blue-green rollout's settings.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BlueGreen {
    /// Replicas of the new version before the switch (the preview); the switch waits for all
    /// of `replicas`. All of them when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub preview_replicas: Option<i32>,
    /// How long the old version keeps every replica after the switch, while a failed
    /// post-promotion analysis or an abort switches straight back to it.
    #[serde(default = "default_scale_down_delay")]
    #[schemars(range(min = 0, max = 86400))]
    pub scale_down_delay_seconds: i64,
    /// Without `trafficRouting`: a Service of yours, in the rollout's namespace, that clients
    /// use. linnet adds `rollouts.linnet.dev/version` to its selector, so that it selects the
    /// version that serves; the switch points it at the new version, and a rollback points it
    /// back (Argo Rollouts' `activeService`). The rest of its selector stays yours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub active_service: Option<String>,
    /// With `activeService`: a Service of yours whose selector linnet points at the new
    /// version while it is previewed (at the serving version otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub preview_service: Option<String>,
}

impl Default for BlueGreen {
    fn default() -> Self {
        BlueGreen {
            preview_replicas: None,
            scale_down_delay_seconds: default_scale_down_delay(),
            active_service: None,
            preview_service: None,
        }
    }
}

fn default_scale_down_delay() -> i64 {
    30
}

/// How a CanaryDeployment rolls out.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeploymentStrategyType {
    /// An ordinary rolling update.
    #[default]
    Rolling,
    /// In `batches`, pausing as `pause` says.
    Batches,
    /// The new version started beside the old one, at full size, previewed through the
    /// `<name>-canary` Service and the header route; then every request switched to it at
    /// once (through the HTTPRoutes of `trafficRouting`); the old version stops
    /// `blueGreen.scaleDownDelaySeconds` later. `pause` holds the switch for a human
    /// (`currentBatch: 2`); analysis gate `after: 1` runs before the switch, `after: 2`
    /// after it.
    BlueGreen,
    /// Back to the previous image.
    Rollback,
}

impl DeploymentStrategyType {
    /// Whether each version runs in a Deployment of its own (`<name>-<hash>`), its pods
    /// labelled with their version.
    pub fn versioned(self) -> bool {
        matches!(self, Self::Batches | Self::BlueGreen)
    }
}

/// Where a batched rollout pauses for a human (who bumps `currentBatch` in Git).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PauseMode {
    /// After the first batch only.
    First,
    /// After every batch but the last.
    All,
    /// Never.
    #[default]
    #[serde(rename = "None")]
    Never,
}

/// Where a CanaryDeployment is in its rollout.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeploymentPhase {
    Initializing,
    Progressing,
    Paused,
    Completed,
    RollingBack,
    RolledBack,
    Failed,
}

/// The state of one batch.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchState {
    Pending,
    InProgress,
    Finished,
}

/// One batch of a batched rollout.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchStatus {
    /// 1-based batch number.
    pub batch: i32,
    /// New-image replicas this batch brings the rollout to.
    pub target: i32,
    pub state: BatchState,
    /// When the batch started (its new pods asked for), in this rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When it finished (its pods available, its gate passed): the dashboard's timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

/// How many available replicas run an image.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageReplicas {
    pub image: String,
    pub replicas: i32,
}

/// One point of a rollout's charts (`status.series`): what the routes gave the canary (and
/// the baseline) and the ready pods of each image, from when they changed to that.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeriesPoint {
    pub at: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_weight: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready: Vec<ImageReplicas>,
}

/// Progress of a rollback.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RollbackStatus {
    pub from_image: String,
    pub to_image: String,
    pub state: BatchState,
}

/// Observed state of a CanaryDeployment.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanaryDeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DeploymentPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_image: Option<String>,
    /// Current batch over batches, e.g. `1/2`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// Available replicas over desired replicas, e.g. `4/4`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    #[serde(default)]
    pub available_replicas: i32,
    /// The replicas linnet sizes the rollout's workloads to, stable and canary together, once
    /// it has acted on `spec.replicas`: `/scale`'s `status.replicas`.
    #[serde(default)]
    pub replicas: i32,
    /// The label selector of every pod of the rollout, as text: `/scale`'s `status.selector`,
    /// which a HorizontalPodAutoscaler reads the pods' metrics by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Available replicas per image, as observed (commit subjects and `kubectl describe`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub available_by_image: Vec<ImageReplicas>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<BatchStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackStatus>,
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
    /// The batch being rolled out (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_batch: Option<i32>,
    /// When the current phase (or batch) began; the progress deadline counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_since: Option<Time>,
    /// The stable image before the last completed rollout: what a `Rollback` returns to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_image: Option<String>,
    /// The abort annotation's value when the current rollout started. A `"true"` that was
    /// already there does not abort the new rollout (it was meant for an earlier one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_at_start: Option<String>,
    /// The Git commit that last set this spec (from the sync's revision annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_revision: Option<String>,
    /// Where the spec's image came from when the image automation wrote it: the image, its
    /// digest, the `ImagePolicy` and the commit (`--image-automation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_source: Option<String>,
    /// The analysis runs of the current (or last) rollout, with their measurements.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis: Vec<super::AnalysisRunStatus>,
    /// Percent of the routes' requests the canary Service gets, as the routes say now (with
    /// `trafficRouting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_weight: Option<i32>,
    /// Whether the routes send requests matching `trafficRouting.headerRoute` to the canary.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub header_routed: bool,
    /// Percent of the routes' requests the baseline's Service gets (`strategy.baseline` with
    /// `trafficRouting`), as the routes say now; absent when they give it none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_weight: Option<i32>,
    /// When the routes last changed (weight, baseline share or header route), as observed:
    /// pods that lose their traffic are stopped only `settleSeconds` after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_since: Option<Time>,
    /// Services of yours whose selector linnet points at a version (`blueGreen.activeService`
    /// and `previewService`): one no longer named gets its selector back as it was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub switched_services: Vec<String>,
    /// With `versionedConfig`: the ConfigMap and Secret copies each image's pods mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub version_config: Vec<super::VersionConfig>,
    /// The current (or last) rollout's canary weight and available pods per image over
    /// time, a point each time they changed (at most 60: the first and the newest), for the
    /// dashboard's charts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<SeriesPoint>,
}
