//! The label sets of the agent's metric families, and what a rollout in trouble is.

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RevisionLabel {
    pub revision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub host: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MeasurementLabels {
    pub provider: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub kind: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

/// One rollout that needs a person: stalled (its Stalled condition's reason) or failed (its
/// phase). Only such rollouts have a series, so the count stays with the problems, not with
/// the number of rollouts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutReasonLabels {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

/// One rollout, for the series of rollouts that have a weight (traffic routing).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutLabels {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// A series a rollout in the shared store has at a scrape: what it needs a person for, and
/// its canary's weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RolloutSeries {
    /// Its Stalled condition is True, with this reason.
    Stalled(String),
    /// It ended in this phase: Failed, RolledBack or MigrationFailed.
    Failed(String),
    /// The share of requests (0 to 100) its routes send to the canary.
    CanaryWeight(i32),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
    pub commit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotifyLabels {
    pub receiver: String,
    pub result: String,
}
