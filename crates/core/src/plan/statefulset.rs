//! The CanaryStatefulSet state machine: `plan(rollout, observed, now) -> Plan`.
//!
//! All rollout state lives in the CR's status (phase, images, step, when the phase began), so
//! a restarted agent plans from the cluster alone. Phases with several sub-steps (Promoting,
//! RollingBack) derive where they are from what they observe (is the canary drained? are the
//! volumes handed back?) rather than from a counter, so a step cut off by a crash is simply
//! done again or found done.
//!
//! See DESIGN.md §3 and the README for the phases and the two strategies.

use std::time::Duration;

use jiff::Timestamp;

use super::actions::Action;
use super::analysis::{self, BACKGROUND, Resolved, Verdict, gate_run};
use super::handoff::{HandoffStep, Move, handoff_step, named_volume};
use super::machine::{
    self, Finished, Machine, Next, Standing, annotation_acts, elapsed, go, go_quietly, go_warning,
    keeping,
};
use super::objects::{
    Role, RolloutRef, SetShape, applied_hash, claim_name, claim_templates, migration_job,
    stateful_set,
};
use super::observed::{FixedSetFields, Observed, PodView, SetView};
use super::traffic::Want;
use crate::api::{
    CanaryStatefulSetSpec, CanaryStatefulSetStatus, PromotionType, StatefulSetPhase as Phase,
    StatefulSetStrategyType,
};

/// The rollout as the planner sees it.
#[derive(Clone, Debug)]
pub struct Rollout<'a> {
    pub reference: RolloutRef,
    pub generation: Option<i64>,
    pub spec: &'a CanaryStatefulSetSpec,
    /// The `rollouts.linnet.dev/promote` annotation.
    pub promote: Option<String>,
    /// The `rollouts.linnet.dev/abort` annotation.
    pub abort: Option<String>,
    /// The `rollouts.linnet.dev/revision` annotation set by sync.
    pub source_revision: Option<String>,
    /// Where the spec's image came from, when the image automation wrote it
    /// ([`super::image_tags::ImageOrigins`]); `None` when not known now.
    pub image_source: Option<String>,
    /// The `rollouts.linnet.dev/source-path` annotation: the rollout's file in Git.
    pub source_path: Option<String>,
    /// The status as last written, with the measurements taken for this reconcile.
    pub status: CanaryStatefulSetStatus,
    /// The analysis runs `spec.analysis` asks for, resolved by the controller.
    pub analysis: Resolved,
    /// Why a fleet holds this cluster from starting the spec's new image (its wave may not
    /// start it yet: [`super::fleet::gate`]); `None` when nothing holds it.
    pub fleet_hold: Option<String>,
}

/// What to do now: the status, the actions, the events and the next timer.
pub type Plan = super::actions::Planned<CanaryStatefulSetStatus, Phase>;

/// The CanaryStatefulSet planner: the shared [`machine::Planner`] with this kind's rollout and
/// status.
type Planner<'a> = machine::Planner<'a, Rollout<'a>, CanaryStatefulSetStatus>;

/// Plans one reconcile of a CanaryStatefulSet.
pub fn plan(rollout: &Rollout<'_>, observed: &Observed, now: Timestamp) -> Plan {
    machine::plan(
        Planner::new(rollout, observed, &rollout.status, now),
        &rollout.status,
    )
}

impl Machine for Planner<'_> {
    type Status = CanaryStatefulSetStatus;

    fn step(&mut self, phase: Phase) -> Next<Phase> {
        Planner::step(self, phase)
    }

    fn moved_on(&mut self, mark: usize, keep: bool) {
        if !keep {
            self.actions.truncate(mark);
        }
        self.want = None;
    }

    fn moved(&mut self, to: Phase, reason: &'static str, message: &str) {
        let step = self.step_index();
        let to = stages::stage_of(to, step, self.size(step));
        let moved = stages::Moved {
            to,
            reason,
            message,
            commit: self.r.source_revision.as_deref(),
            now: self.now,
        };
        stages::record(&mut self.st.stages, moved);
    }

    /// A new status (or a CR created over existing sets): the stable image is what the
    /// stable set runs, else (no set yet) the spec's. A set whose container cannot be read
    /// leaves it unknown, and `spec_problem` stops the rollout.
    fn start(&mut self) {
        if self.st.stable_image.is_none() {
            self.st.stable_image = match &self.o.stable {
                Some(set) => set.image.clone(),
                None => Some(self.r.spec.image.clone()),
            };
        }
        let keep: Vec<&str> = self.st.canary_image.as_deref().into_iter().collect();
        self.st.version_config = super::config::versions(
            &self.r.status.version_config,
            &self.o.config,
            &self.r.spec.image,
            self.st.stable_image.as_deref().unwrap_or_default(),
            &keep,
        );
    }

    fn finish(mut self, message: String) -> Finished<Self::Status> {
        let mut versions = std::mem::take(&mut self.st.version_config);
        let st = &self.st;
        let keep: Vec<&str> = [Some(self.r.spec.image.as_str())]
            .into_iter()
            .chain([st.stable_image.as_deref(), st.canary_image.as_deref()])
            .flatten()
            .collect();
        super::config::retain(&mut versions, &keep);
        self.st.version_config = versions;
        Planner::finish(self, message)
    }
}

impl<'a> Planner<'a> {
    fn spec(&self) -> &CanaryStatefulSetSpec {
        self.r.spec
    }

    fn replicas(&self) -> i32 {
        self.spec().replicas.max(0)
    }

    fn two_sets(&self) -> bool {
        self.spec().strategy.type_ == StatefulSetStrategyType::TwoSets
    }

    fn stable_image(&self) -> String {
        self.st.stable_image.clone().unwrap_or_default()
    }

    fn canary_image(&self) -> String {
        self.st
            .canary_image
            .clone()
            .unwrap_or_else(|| self.spec().image.clone())
    }

    fn step_index(&self) -> usize {
        self.st.current_step.unwrap_or(0).max(0) as usize
    }

    fn last_step(&self) -> usize {
        self.spec()
            .steps
            .as_ref()
            .map_or(0, |s| s.len().saturating_sub(1))
    }

    /// Canary replicas at step `i`, within 1..=replicas.
    fn size(&self, i: usize) -> i32 {
        let s = self
            .spec()
            .steps
            .as_ref()
            .and_then(|s| s.get(i).copied())
            .unwrap_or(self.spec().canary_replicas);
        s.clamp(1, self.replicas().max(1))
    }

    fn main_role(&self) -> Role {
        if self.two_sets() {
            Role::Stable
        } else {
            Role::Single
        }
    }

    /// Emits an apply when the observed set differs from `shape`; returns the observed set
    /// when it already is `shape`. Besides linnet's own last apply (its hash), what the
    /// rollout owns is compared, so drift made by hand (a scaled set, another image, a moved
    /// partition) is put back in every phase.
    fn ensure(&mut self, shape: SetShape<'_>) -> Option<&SetView> {
        let desired = stateful_set(
            &self.r.reference,
            self.spec(),
            &self.st.version_config,
            &shape,
        );
        let observed = match shape.role {
            Role::Canary => self.o.canary.as_ref(),
            _ => self.o.stable.as_ref(),
        };
        let hash = applied_hash(&desired).map(str::to_string);
        let partition = if shape.role == Role::Single {
            shape.partition
        } else {
            0
        };
        let same = observed.is_some_and(|s| {
            s.applied_hash == hash
                && s.replicas == shape.replicas
                && s.image.as_deref() == Some(shape.image)
                && s.partition == partition
        });
        if same {
            observed
        } else {
            self.actions.push(Action::ApplySet(Box::new(desired)));
            None
        }
    }

    fn pods_of(&self, role: Role) -> Vec<&'a PodView> {
        let name = role.set_name(&self.r.reference.name);
        self.o.pods.iter().filter(|p| p.set == name).collect()
    }

    /// The set has settled on what linnet last applied: `n` replicas, all ready and updated.
    fn settled(set: Option<&SetView>, n: i32) -> bool {
        set.is_some_and(|s| {
            s.status_fresh
                && s.ready_replicas == n
                && s.updated_replicas == n
                && s.current_revision == s.update_revision
        })
    }

    fn timer(&mut self, after: Duration) {
        let after = after + Duration::from_millis(100);
        self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
    }

    fn step(&mut self, phase: Phase) -> Next<Phase> {
        if phase != Phase::Failed {
            if let Some((reason, problem)) = self.spec_problem() {
                return go_warning(Phase::Failed, reason, problem);
            }
            if let Some(problem) = self.volume_problem() {
                return go_warning(Phase::Failed, "VolumeSwapped", problem);
            }
        }
        match (phase, self.two_sets()) {
            (Phase::Initializing, _) => self.initializing(),
            (Phase::Stable, _) => self.stable(),
            (Phase::ScalingDownStable, true) => self.scaling_down_stable(),
            (Phase::ScalingDownStable, false) | (Phase::DeployingCanary, false) => {
                self.deploying_partition()
            }
            (Phase::DeployingCanary, true) => self.deploying_two_sets(),
            (Phase::CanaryActive, _) => self.canary_active(),
            (Phase::AwaitingMigration, _) => self.awaiting_migration(),
            (Phase::MigratingData, _) => self.migrating_data(),
            (Phase::Promoting, true) => self.promoting_two_sets(),
            (Phase::Promoting, false) => self.promoting_partition(),
            (Phase::RollingBack | Phase::MigrationFailed, true) => self.rolling_back_two_sets(),
            (Phase::RollingBack | Phase::MigrationFailed, false) => self.rolling_back_partition(),
            (Phase::RolledBack, _) => self.rolled_back(),
            (Phase::Failed, _) => match self
                .spec_problem()
                .map(|(_, p)| p)
                .or_else(|| self.volume_problem())
            {
                Some(problem) => Next::Stay(problem),
                // Failed mid-canary: the canary's volumes go back before anything else runs
                // (the stable set scaled up now would give those replicas new, empty volumes).
                None if self.two_sets()
                    && (self.o.canary.is_some() || !self.st.replica_volumes.is_empty()) =>
                {
                    go(
                        Phase::RollingBack,
                        "SpecFixed",
                        "the rollout can go on again; rolling the canary back, its volumes \
                         first"
                            .into(),
                    )
                }
                None if self.o.stable.is_none() => go(
                    Phase::Initializing,
                    "SpecFixed",
                    "the spec is valid again; starting".into(),
                ),
                None => go(
                    Phase::Stable,
                    "SpecFixed",
                    "the spec is valid again; carrying on from the stable set".into(),
                ),
            },
        }
    }
}

/// What an analysis template's `{{ rollout.FIELD }}` means for a CanaryStatefulSet: with
/// TwoSets the pods' role label tells canary from stable; with Partition, their revision.
pub fn analysis_builtins(
    name: &str,
    namespace: &str,
    spec: &CanaryStatefulSetSpec,
    status: &CanaryStatefulSetStatus,
) -> super::analysis::Builtins {
    use crate::api::{ROLE_LABEL, ROLLOUT_LABEL};
    let (canary_selector, stable_selector) = match spec.strategy.type_ {
        StatefulSetStrategyType::TwoSets => (
            Some(format!("{ROLLOUT_LABEL}={name},{ROLE_LABEL}=canary")),
            Some(format!("{ROLLOUT_LABEL}={name},{ROLE_LABEL}=stable")),
        ),
        StatefulSetStrategyType::Partition => {
            // Not known until the status records the set's revisions: an empty hash would
            // select no pod, and an analysis of no pod passes.
            let revision = |r: &Option<String>| {
                r.as_deref()
                    .map(|r| format!("{ROLLOUT_LABEL}={name},controller-revision-hash={r}"))
            };
            (
                revision(&status.canary_revision),
                revision(&status.stable_revision),
            )
        }
    };
    super::analysis::Builtins {
        name: name.to_string(),
        namespace: namespace.to_string(),
        canary_image: status
            .canary_image
            .clone()
            .unwrap_or_else(|| spec.image.clone()),
        stable_image: status.stable_image.clone(),
        canary_selector,
        // No baseline pods for a StatefulSet (docs/analysis.md says why): its stable pods.
        baseline_selector: stable_selector.clone(),
        stable_selector,
    }
}

/// Whether a canary is under way in `phase`.
fn progressing_phase(phase: Phase) -> bool {
    !matches!(
        phase,
        Phase::Initializing | Phase::Stable | Phase::RolledBack | Phase::Failed
    )
}

/// Whether a plan from `phase` reads the rollout's pods. Without a canary, a rollout goes by
/// its set's status alone (its ready count decides Stable), so the controller lists the pods
/// only for a plan that starts or runs a canary: at 1,000 new rollouts, pod lists were the
/// API server's most frequent request in a first sync.
pub fn reads_pods(phase: Option<Phase>) -> bool {
    !matches!(phase, None | Some(Phase::Initializing | Phase::Stable))
}

/// Whether the rollout has pods to list: a set of the spec's strategy, or one of the other
/// strategy that a refused switch left running (its pods carry the same rollout label, and a
/// Failed rollout's status counts them). Without a set there are none (the first reconcile of
/// each rollout in a first sync), and the controller does not list them.
pub fn has_pods(observed: &Observed) -> bool {
    observed.stable.is_some() || observed.canary.is_some() || observed.other_strategy_set.is_some()
}

/// Whether a plan made from `stored` without the pods must be made again with them: it moved
/// into a phase that reads them (a canary start).
pub fn plans_again_with_pods(stored: Option<Phase>, planned: Option<Phase>) -> bool {
    !reads_pods(stored) && reads_pods(planned)
}

/// Whether a rollout in `phase` acts on the promote annotation: its canary phases (it is
/// read in CanaryActive; set earlier, it acts there).
pub fn reads_promote(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::ScalingDownStable | Phase::DeployingCanary | Phase::CanaryActive
    )
}

/// Whether a rollout in `phase` acts on the abort annotation: the phases whose step begins
/// with [`Planner::abort_reason`].
pub fn reads_abort(phase: Phase) -> bool {
    reads_promote(phase) || matches!(phase, Phase::AwaitingMigration | Phase::MigratingData)
}

/// What deleting a rollout takes: scale each set to 0, wait for its pods, then delete it.
/// Claims and volumes stay. Returns the actions and, while not done, what it waits for.
pub fn plan_cleanup(observed: &Observed) -> (Vec<Action>, Option<String>) {
    let mut actions = Vec::new();
    let mut waiting = Vec::new();
    for set in [observed.stable.as_ref(), observed.canary.as_ref()]
        .into_iter()
        .flatten()
    {
        let pods = observed.pods_of(&set.name).count();
        if set.replicas > 0 {
            actions.push(Action::ScaleSet {
                name: set.name.clone(),
                replicas: 0,
            });
            waiting.push(format!("scaling {} to 0", set.name));
        } else if pods > 0 {
            waiting.push(format!("{pods} pod(s) of {} to stop", set.name));
        } else {
            actions.push(Action::DeleteSet {
                name: set.name.clone(),
            });
        }
    }
    (actions, (!waiting.is_empty()).then(|| waiting.join("; ")))
}

mod canary;
mod gates;
mod partition;
mod stages;
mod starting;
mod status;
mod two_sets;

mod traffic;

#[cfg(test)]
mod tests;
