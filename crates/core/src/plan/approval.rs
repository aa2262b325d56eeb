//! What a person does next to move a rollout that waits for them, per kind and strategy: the
//! change to make in Git (a merge patch of the rollout's file), the same in words, and how to
//! stop it instead. The dashboard shows it. Tested against the CRD's schema and CEL rules in
//! the agent's crate (`src/specs/validate/approval.rs`), where the CRD checker lives.
//!
//! A CanaryStatefulSet with `promotion: Manual` is promoted by its promote annotation; a
//! CanaryDeployment by raising `spec.currentBatch` (the annotation does not apply to it).
//! Both are aborted by their abort annotation, or by putting the old image back.
//!
//! The dashboard's buttons ([`DashboardAction`]) ask for the same changes, as pull requests.

use serde::Serialize;
use serde_json::{Value, json};

use super::{WAITING_FOR_PROMOTION, acting_value, batch, deployment::batch_allowed};
use super::{deployment::reads_abort as deployment_reads_abort, statefulset::reads_abort};
use crate::api::{
    ABORT_ANNOTATION, CanaryDeployment, CanaryStatefulSet, DeploymentPhase, DeploymentStrategyType,
    PROMOTE_ANNOTATION, PromotionType, StatefulSetPhase,
};

/// The approval a rollout waits for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Approval {
    /// What approving does: `start batch 2 of 3 (4 new replica(s) on web:2)`.
    pub what: String,
    /// How, in words: `set spec.currentBatch to 2 in Git`.
    pub how: String,
    /// The same change as a JSON merge patch of the rollout.
    pub change: Value,
    /// How to stop the canary instead.
    pub abort: String,
}

/// How to abort the canary of `canary` back to `stable`, with the value that acts on it.
fn abort_words(abort_at_start: Option<&str>, canary: &str, stable: Option<&str>) -> String {
    let value = acting_value(abort_at_start, canary);
    let back = stable.map_or_else(String::new, |s| format!(", or put the image {s} back"));
    format!("to stop instead, set the annotation {ABORT_ANNOTATION}: \"{value}\" in Git{back}")
}

/// A CanaryStatefulSet whose canary waits for its promotion (`promotion: Manual`).
pub fn statefulset_approval(r: &CanaryStatefulSet) -> Option<Approval> {
    let st = r.status.as_ref()?;
    let waits = st.phase == Some(StatefulSetPhase::CanaryActive)
        && r.spec.promotion.type_ == PromotionType::Manual
        && st
            .message
            .as_deref()
            .is_some_and(|m| m.contains(WAITING_FOR_PROMOTION));
    let canary = st.canary_image.as_deref().filter(|_| waits)?;
    let value = acting_value(st.promote_at_start.as_deref(), canary);
    Some(Approval {
        what: format!(
            "promote {canary} to all {} replicas (the canary's volumes stay with their ordinals)",
            r.spec.replicas
        ),
        how: format!("set the annotation {PROMOTE_ANNOTATION}: \"{value}\" in Git"),
        change: json!({"metadata": {"annotations": {PROMOTE_ANNOTATION: value}}}),
        abort: abort_words(
            st.abort_at_start.as_deref(),
            canary,
            st.stable_image.as_deref(),
        ),
    })
}

/// A CanaryDeployment paused after a batch (or a blue-green preview) until `currentBatch`
/// allows the next one.
pub fn deployment_approval(r: &CanaryDeployment) -> Option<Approval> {
    let st = r.status.as_ref()?;
    let blue_green = r.spec.strategy.type_ == DeploymentStrategyType::BlueGreen;
    let stages = if blue_green { 2 } else { r.spec.batches.max(1) };
    let n = st.current_batch?;
    let waits = st.phase == Some(DeploymentPhase::Paused)
        && r.spec.strategy.type_.versioned()
        && n < stages
        && !batch_allowed(&r.spec, n + 1);
    let canary = st.canary_image.as_deref().filter(|_| waits)?;
    let what = if blue_green {
        format!(
            "switch every request to {canary}; the old version stays whole for the scale-down delay"
        )
    } else {
        let total = r.spec.replicas.max(0);
        format!(
            "start batch {} of {stages} ({} new replica(s) on {canary})",
            n + 1,
            batch::target(total, stages, n + 1)
        )
    };
    Some(Approval {
        what,
        how: format!(
            "set spec.currentBatch to {} in Git (the promote annotation does not apply to a CanaryDeployment)",
            n + 1
        ),
        change: json!({"spec": {"currentBatch": n + 1}}),
        abort: abort_words(
            st.abort_at_start.as_deref(),
            canary,
            st.stable_image.as_deref(),
        ),
    })
}

/// Why a dashboard action does not apply to a rollout now (said to the person who clicked).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotNow(pub String);

/// A button on a rollout's dashboard page: the change it asks for in Git.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DashboardAction {
    /// A CanaryStatefulSet's promote annotation.
    Promote,
    /// A CanaryDeployment's `spec.currentBatch`, one higher.
    Advance,
    /// Either kind's abort annotation.
    Abort,
}

impl DashboardAction {
    /// The action named `name` in a URL (`promote`, `advance`, `abort`).
    pub fn parse(name: &str) -> Option<DashboardAction> {
        match name {
            "promote" => Some(DashboardAction::Promote),
            "advance" => Some(DashboardAction::Advance),
            "abort" => Some(DashboardAction::Abort),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DashboardAction::Promote => "promote",
            DashboardAction::Advance => "advance",
            DashboardAction::Abort => "abort",
        }
    }
}

/// The merge patch of a CanaryStatefulSet's file that `action` asks for now, or why it does
/// not apply (said to the person who clicked).
pub fn statefulset_action(r: &CanaryStatefulSet, action: DashboardAction) -> Result<Value, NotNow> {
    match action {
        DashboardAction::Promote => statefulset_approval(r)
            .map(|a| a.change)
            .ok_or_else(|| NotNow("its canary is not waiting for a promotion".into())),
        DashboardAction::Advance => Err(NotNow(
            "a CanaryStatefulSet has no batches to advance: promote it instead".into(),
        )),
        DashboardAction::Abort => {
            let st = r.status.as_ref();
            let running = st
                .and_then(|s| s.phase)
                .is_some_and(reads_abort)
                .then(|| st.and_then(|s| s.canary_image.as_deref()))
                .flatten();
            let canary = running.ok_or_else(|| NotNow("it has no canary to abort".into()))?;
            Ok(abort_change(
                st.and_then(|s| s.abort_at_start.as_deref()),
                canary,
            ))
        }
    }
}

/// [`statefulset_action`] for a CanaryDeployment.
pub fn deployment_action(r: &CanaryDeployment, action: DashboardAction) -> Result<Value, NotNow> {
    match action {
        DashboardAction::Advance => deployment_approval(r)
            .map(|a| a.change)
            .ok_or_else(|| NotNow("it is not paused before a batch".into())),
        DashboardAction::Promote => Err(NotNow(
            "a CanaryDeployment is promoted batch by batch: advance it instead (the promote \
             annotation does not apply to it)"
                .into(),
        )),
        DashboardAction::Abort => {
            let st = r.status.as_ref();
            let running = st
                .and_then(|s| s.phase)
                .is_some_and(deployment_reads_abort)
                .then(|| st.and_then(|s| s.canary_image.as_deref()))
                .flatten();
            let canary =
                running.ok_or_else(|| NotNow("it has no rollout under way to abort".into()))?;
            Ok(abort_change(
                st.and_then(|s| s.abort_at_start.as_deref()),
                canary,
            ))
        }
    }
}

fn abort_change(abort_at_start: Option<&str>, canary: &str) -> Value {
    let value = acting_value(abort_at_start, canary);
    json!({"metadata": {"annotations": {ABORT_ANNOTATION: value}}})
}
