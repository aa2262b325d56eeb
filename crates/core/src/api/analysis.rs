//! Analysis: `AnalysisTemplate` (named metrics, each with a provider and CEL conditions over
//! its `result`), the `analysis` block both rollout kinds carry (a background run and gates),
//! and the measurement records kept in a rollout's status so that a restarted agent counts on
//! from where it was.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::MetricProvider;

/// Metrics that judge a canary; referenced by name from a rollout's `spec.analysis`.
// The derive takes one `printcolumn` per column; clippy reads them as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "rollouts.linnet.dev",
    version = "v1alpha1",
    kind = "AnalysisTemplate",
    namespaced,
    derive = "PartialEq",
    shortname = "lat",
    category = "linnet",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    doc = "Metrics that decide whether a canary is promoted or rolled back."
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnalysisTemplateSpec {
    /// Arguments the metrics use as `{{ args.NAME }}`; a rollout passes the values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub args: Vec<TemplateArg>,
    /// The metrics; the analysis fails when any fails.
    #[schemars(length(min = 1, max = 8))]
    pub metrics: Vec<Metric>,
}

/// An argument of a template, with an optional default.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateArg {
    pub name: String,
    /// The default when the rollout passes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// One metric: what to measure, how often, and what counts as success.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metric {
    /// Named in status, events and commit statuses (e.g. `error-rate`).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Time between measurements, e.g. `30s` or `1m` (units ms, s, m, h).
    #[serde(default = "default_interval")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub interval: String,
    /// Measurements to take. Without it the metric is measured until the canary ends in the
    /// background, and once in a gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub count: Option<i32>,
    /// Wait this long after the analysis starts before the first measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub initial_delay: Option<String>,
    /// CEL over `result`; a measurement is Successful when it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub success_condition: Option<String>,
    /// CEL over `result`; a measurement is Failed when it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub failure_condition: Option<String>,
    /// Failed measurements allowed; one more fails the metric (and rolls the canary back).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub failure_limit: i32,
    /// Inconclusive measurements allowed; one more pauses the rollout.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub inconclusive_limit: i32,
    /// Measurements in a row that could not be taken (a query error) before the rollout
    /// pauses; it goes on by itself once a measurement succeeds again.
    #[serde(default = "default_consecutive_error_limit")]
    #[schemars(range(min = 0))]
    pub consecutive_error_limit: i32,
    pub provider: MetricProvider,
    /// Judge the canary against a baseline rather than each result alone: every measurement
    /// also takes the baseline's sample, and the metric fails only when the canary is worse
    /// with significance (Mann-Whitney U) and by more than `tolerancePercent`. No conditions
    /// with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
}

/// How a metric's baseline is measured and compared.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Baseline {
    /// The baseline's sample: `prometheus` or `web`, filled in like the metric's (a query
    /// on the stable version's pods, say).
    pub provider: MetricProvider,
    /// Which way the metric gets worse.
    #[serde(default)]
    pub worse: WorseWhen,
    /// How much worse than the baseline's median the canary's may be, in percent.
    #[serde(default = "default_tolerance_percent")]
    #[schemars(range(min = 0, max = 1000))]
    pub tolerance_percent: i32,
    /// Samples needed on each side before the metric can pass or fail; until then it is
    /// "not enough data" (inconclusive once its count is reached: nothing is promoted).
    #[serde(default = "default_min_samples")]
    #[schemars(range(min = 3, max = 200))]
    pub min_samples: i32,
    /// How sure the test must be that the canary is worse, in percent.
    #[serde(default = "default_confidence_percent")]
    #[schemars(range(min = 50, max = 99))]
    pub confidence_percent: i32,
    /// The metric's share of its run's score (with `spec.analysis.scoring`), against the
    /// other judged metrics' weights.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 0, max = 100))]
    pub weight: i32,
    /// With `spec.analysis.scoring`: a failed verdict of this metric fails the run whatever
    /// the score, at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub critical: bool,
}

fn default_weight() -> i32 {
    1
}

fn default_tolerance_percent() -> i32 {
    25
}

fn default_min_samples() -> i32 {
    10
}

fn default_confidence_percent() -> i32 {
    95
}

/// Which way a compared metric gets worse.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorseWhen {
    /// Error rates, latencies.
    #[default]
    Higher,
    /// Throughput, success rates.
    Lower,
}

fn default_interval() -> String {
    "30s".into()
}

fn default_consecutive_error_limit() -> i32 {
    4
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutAnalysis {
    /// Values for the templates' `{{ args.NAME }}`, shared by every run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub args: Vec<AnalysisArg>,
    /// Runs from the canary's start until it ends; a failure rolls the canary back, an
    /// inconclusive result holds the promotion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<AnalysisRef>,
    /// Runs once the given step (CanaryStatefulSet) or batch (CanaryDeployment) is Ready; the
    /// rollout goes on only when it passes, and a pass replaces the human's approval there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub gates: Vec<AnalysisGate>,
    /// The least evidence before the canary is promoted: every metric of the background run
    /// has at least this many measurements. Until then the rollout holds, and its message
    /// counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub min_measurements: Option<i32>,
    /// The least time the background run measures before the canary is promoted (`10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub min_duration: Option<String>,
    /// Judge each run's metrics with a `baseline` together, as Kayenta does: once each has
    /// its verdict, the run's score (0 to 100, the weighted share that passed) at least
    /// `pass` passes it, at least `marginal` holds it for a person, and below rolls back.
    /// Without it, each judged metric passes or fails on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoring: Option<Scoring>,
}

/// The bounds of a run's score.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scoring {
    /// The least score that passes.
    #[serde(default = "default_pass_score")]
    #[schemars(range(min = 0, max = 100))]
    pub pass: i32,
    /// The least score that holds instead of rolling back; at most `pass`.
    #[serde(default = "default_marginal_score")]
    #[schemars(range(min = 0, max = 100))]
    pub marginal: i32,
}

fn default_pass_score() -> i32 {
    95
}

fn default_marginal_score() -> i32 {
    75
}

/// Templates to run together, with arguments of their own.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnalysisRef {
    #[schemars(length(min = 1, max = 4))]
    pub templates: Vec<TemplateRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub args: Vec<AnalysisArg>,
}

/// A gate: an analysis after a step or batch.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnalysisGate {
    /// The step (1-based, of `spec.steps`; 1 without steps) or batch the gate follows.
    #[schemars(range(min = 1))]
    pub after: i32,
    #[schemars(length(min = 1, max = 4))]
    pub templates: Vec<TemplateRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub args: Vec<AnalysisArg>,
}

/// An AnalysisTemplate in the rollout's namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateRef {
    pub template_name: String,
}

/// A value for `{{ args.NAME }}`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AnalysisArg {
    pub name: String,
    pub value: String,
}

/// Where an analysis run or a metric stands.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AnalysisPhase {
    /// Measuring.
    #[default]
    Running,
    /// Every metric met its count without failing.
    Successful,
    /// A metric failed more than its failureLimit: the canary is rolled back.
    Failed,
    /// A metric was inconclusive more than its inconclusiveLimit: the rollout holds.
    Inconclusive,
    /// Measurements could not be taken more than consecutiveErrorLimit times in a row: the
    /// rollout holds and goes on once a measurement succeeds.
    Error,
    /// The canary ended (promoted, rolled back, replaced) before the run finished.
    Stopped,
}

/// What one measurement found.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeasurementPhase {
    Successful,
    Failed,
    Inconclusive,
    /// The measurement could not be taken (the provider failed).
    Error,
}

/// One measurement.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Measurement {
    pub phase: MeasurementPhase,
    /// The result, as JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub at: Time,
    /// Why it failed or erred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A metric of a run: its counts (all of them) and its last measurements.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MetricStatus {
    pub name: String,
    pub phase: AnalysisPhase,
    /// Measurements taken (errors excluded).
    #[serde(default)]
    pub count: i32,
    #[serde(default)]
    pub successful: i32,
    #[serde(default)]
    pub failed: i32,
    #[serde(default)]
    pub inconclusive: i32,
    #[serde(default)]
    pub errors: i32,
    #[serde(default)]
    pub consecutive_errors: i32,
    /// The last measurements, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurements: Vec<Measurement>,
    /// The Job of a `job` measurement under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// With `baseline`: the canary's samples and the baseline's (the first 200 of each), and
    /// the judge's evidence, e.g. `canary 0.02 vs baseline 0.005 (medians): 300 % worse,
    /// tolerated 25 %; p 0.0001, needs below 0.05; 12 and 12 samples: Fail`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canary_samples: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline_samples: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison: Option<String>,
    /// What decides a measurement, e.g. `success when result < 0.05; failureLimit 1`, or the
    /// judge's rule for a metric with a baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// What is measured: the PromQL with its arguments filled in, a web metric's method and
    /// URL (its password or token as `***`, no query string), or the Job's template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// A link to the query's graph on its provider, when it has one (Prometheus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<String>,
}

/// One analysis run of the current canary: `background`, or `after-N` for a gate.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisRunStatus {
    pub name: String,
    pub phase: AnalysisPhase,
    pub started_at: Time,
    /// Which metric decided, with its value and condition, e.g.
    /// `error-rate 0.31 failed result < 0.05`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricStatus>,
    /// With `spec.analysis.scoring`: the score of the judged metrics (0 to 100), once each
    /// has its verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<i32>,
}
