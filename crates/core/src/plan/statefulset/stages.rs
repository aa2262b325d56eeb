//! The canary's stages as they happen (`status.stages`, the dashboard's timeline): each move
//! of the phase machine that changes the stage closes the open one with its reason and opens
//! the next with its reason, message and the Git commit the rollout was synced from.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{Stage, StageStatus, StatefulSetPhase as Phase};

/// The most stages kept: a canary of many steps, its migration, its promotion or rollback.
const KEPT: usize = 32;
/// The most characters of a move's message kept in a stage.
const DETAIL: usize = 300;
/// The most characters of a commit kept (a SHA-256 id is 64): the annotation is anyone's.
const COMMIT: usize = 64;

/// Which stage a phase is in, with the 1-based step and its canary replicas for a Step;
/// `None` outside a canary.
pub(super) fn stage_of(
    phase: Phase,
    step: usize,
    canary: i32,
) -> Option<(Stage, Option<i32>, Option<i32>)> {
    match phase {
        Phase::ScalingDownStable | Phase::DeployingCanary | Phase::CanaryActive => {
            let step = i32::try_from(step).unwrap_or(i32::MAX).saturating_add(1);
            Some((Stage::Step, Some(step), Some(canary)))
        }
        Phase::AwaitingMigration | Phase::MigratingData => Some((Stage::Migration, None, None)),
        Phase::Promoting => Some((Stage::Promotion, None, None)),
        // A failed migration rolls the canary back.
        Phase::RollingBack | Phase::MigrationFailed => Some((Stage::Rollback, None, None)),
        Phase::Initializing | Phase::Stable | Phase::RolledBack | Phase::Failed => None,
    }
}

/// A move to a phase in stage `to` by `reason` (`message`), at `now`, with the rollout synced
/// from `commit`.
pub(super) struct Moved<'a> {
    pub to: Option<(Stage, Option<i32>, Option<i32>)>,
    pub reason: &'a str,
    pub message: &'a str,
    pub commit: Option<&'a str>,
    pub now: Timestamp,
}

/// Records a move in `stages`: nothing while the stage stays; else the open stage closes and
/// the next opens. A canary's first step starts a new list.
pub(super) fn record(stages: &mut Vec<StageStatus>, moved: Moved) {
    let open = stages.last().filter(|s| s.finished_at.is_none());
    let same = |s: &StageStatus| {
        moved
            .to
            .is_some_and(|(stage, step, _)| s.stage == stage && s.step == step)
    };
    if open.is_some_and(same) {
        return;
    }
    let reason = if moved.reason.is_empty() {
        "Moved"
    } else {
        moved.reason
    };
    if let Some(last) = stages.last_mut().filter(|s| s.finished_at.is_none()) {
        last.finished_at = Some(Time(moved.now));
        last.closed_by = Some(reason.to_string());
    }
    let Some((stage, step, canary_replicas)) = moved.to else {
        return;
    };
    if stage == Stage::Step && step == Some(1) {
        stages.clear();
    }
    if stages.len() >= KEPT {
        stages.remove(0);
    }
    stages.push(StageStatus {
        stage,
        step,
        canary_replicas,
        opened_by: reason.to_string(),
        detail: moved.message.chars().take(DETAIL).collect(),
        commit: moved.commit.map(|c| c.chars().take(COMMIT).collect()),
        started_at: Time(moved.now),
        finished_at: None,
        closed_by: None,
    });
}

#[cfg(test)]
mod tests;
