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

use super::actions::Planned;
use super::actions::{Action, PlanEvent};
use super::analysis::{self, BACKGROUND, Resolved, Verdict, gate_run};
use super::handoff::{HandoffStep, handoff_step};
use super::machine::{
    self, Machine, Next, Standing, annotation_acts, elapsed, go, go_warning, keeping, set_standing,
};
use super::objects::{
    Role, RolloutRef, SetShape, applied_hash, claim_templates, migration_job, stateful_set,
};
use super::observed::{FixedSetFields, Observed, PodView, SetView};
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
    /// The `rollouts.linnet.dev/source-path` annotation: the rollout's file in Git.
    pub source_path: Option<String>,
    /// The status as last written, with the measurements taken for this reconcile.
    pub status: CanaryStatefulSetStatus,
    /// The analysis runs `spec.analysis` asks for, resolved by the controller.
    pub analysis: Resolved,
}

/// What to do now: the status, the actions, the events and the next timer.
pub type Plan = super::actions::Planned<CanaryStatefulSetStatus, Phase>;

struct Planner<'a> {
    r: &'a Rollout<'a>,
    o: &'a Observed,
    now: Timestamp,
    st: CanaryStatefulSetStatus,
    actions: Vec<Action>,
    events: Vec<PlanEvent>,
    requeue: Option<Duration>,
}

/// Plans one reconcile of a CanaryStatefulSet.
pub fn plan(rollout: &Rollout<'_>, observed: &Observed, now: Timestamp) -> Plan {
    let planner = Planner {
        r: rollout,
        o: observed,
        now,
        st: rollout.status.clone(),
        actions: Vec::new(),
        events: Vec::new(),
        requeue: None,
    };
    machine::plan(planner, &rollout.status)
}

impl Machine for Planner<'_> {
    type Status = CanaryStatefulSetStatus;

    fn status(&self) -> &CanaryStatefulSetStatus {
        &self.st
    }

    fn status_mut(&mut self) -> &mut CanaryStatefulSetStatus {
        &mut self.st
    }

    fn now(&self) -> Timestamp {
        self.now
    }

    fn step(&mut self, phase: Phase) -> Next<Phase> {
        Planner::step(self, phase)
    }

    fn mark(&self) -> usize {
        self.actions.len()
    }

    fn moved_on(&mut self, mark: usize, keep: bool) {
        if !keep {
            self.actions.truncate(mark);
        }
    }

    /// A new status (or a CR created over existing sets): the stable image is what the
    /// stable set runs, else the spec's.
    fn start(&mut self) {
        if self.st.stable_image.is_none() {
            self.st.stable_image = Some(
                self.o
                    .stable
                    .as_ref()
                    .and_then(|s| s.image.clone())
                    .unwrap_or_else(|| self.r.spec.image.clone()),
            );
        }
    }

    fn finish(
        mut self,
        message: String,
        events: Vec<PlanEvent>,
    ) -> Planned<CanaryStatefulSetStatus, Phase> {
        self.events = events;
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
        let desired = stateful_set(&self.r.reference, self.spec(), &shape);
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

    /// Why a running canary must end, if it must.
    fn abort_reason(&mut self) -> Option<Next<Phase>> {
        let canary = self.canary_image();
        let stable = self.stable_image();
        let image = &self.spec().image;
        if annotation_acts(
            self.r.abort.as_deref(),
            self.st.abort_at_start.as_deref(),
            &canary,
        ) {
            return Some(go(
                Phase::RollingBack,
                "Aborted",
                format!("the abort annotation is set; rolling {canary} back to {stable}"),
            ));
        }
        if *image == stable {
            return Some(go(
                Phase::RollingBack,
                "Reverted",
                format!("image set back to {stable} in Git; rolling the canary of {canary} back"),
            ));
        }
        if *image != canary {
            return Some(go(
                Phase::RollingBack,
                "Superseded",
                format!(
                    "image changed to {image} during the canary of {canary}; ending this canary before starting the next"
                ),
            ));
        }
        if let Some((run, why)) =
            analysis::failed(&mut self.st.analysis, &self.r.analysis, self.now)
        {
            return Some(go_warning(
                Phase::RollingBack,
                "AnalysisFailed",
                format!("analysis {run} failed: {why}; rolling {canary} back to {stable}"),
            ));
        }
        None
    }

    /// Whether a person has promoted this canary (the annotation acts on it).
    fn promoted_by_hand(&self) -> bool {
        annotation_acts(
            self.r.promote.as_deref(),
            self.st.promote_at_start.as_deref(),
            &self.canary_image(),
        )
    }

    /// What holds the canary where it is: the background analysis inconclusive or unable to
    /// measure (unless a person promoted it). Said with what to do in Git.
    fn analysis_hold(&mut self) -> Option<String> {
        if self.promoted_by_hand() {
            return None;
        }
        match analysis::background(&mut self.st.analysis, &self.r.analysis, self.now) {
            Some(Verdict::Held(why)) => Some(self.held(BACKGROUND, &why)),
            _ => None,
        }
    }

    fn held(&self, run: &str, why: &str) -> String {
        format!(
            "analysis {run} holds the canary: {why}. To go on without it, set {}: \"true\" in Git; \
             to roll back, set {}: \"true\" or put the image back",
            crate::api::PROMOTE_ANNOTATION,
            crate::api::ABORT_ANNOTATION
        )
    }

    /// The gate after step `after`, if the spec has one and it has not passed: a move (a
    /// failure rolls back) or what it waits for. A person's promotion skips it.
    fn gate(&mut self, after: i32) -> Option<Next<Phase>> {
        if self.promoted_by_hand() {
            return None;
        }
        let (name, verdict) =
            analysis::gate(&mut self.st.analysis, after, &self.r.analysis, self.now)?;
        match verdict {
            Verdict::Passed => None,
            Verdict::Failed(why) => Some(go_warning(
                Phase::RollingBack,
                "AnalysisFailed",
                format!(
                    "analysis {name} failed: {why}; rolling {} back to {}",
                    self.canary_image(),
                    self.stable_image()
                ),
            )),
            Verdict::Held(why) => Some(Next::Stay(self.held(&name, &why))),
            Verdict::Measuring(what) => Some(Next::Stay(format!("analysis {name}: {what}"))),
        }
    }

    /// The current step's canary pods are all Ready on the canary's revision.
    fn step_ready(&self) -> bool {
        let n = self.size(self.step_index());
        if self.two_sets() {
            let canary = self.o.canary.as_ref();
            Self::settled(canary, n)
                && canary.is_some_and(|c| c.image.as_deref() == Some(self.canary_image().as_str()))
        } else {
            let set = self.o.stable.as_ref();
            set.is_some_and(|s| s.status_fresh) && self.updated_ready(set, self.replicas() - n) >= n
        }
    }

    fn deadline_passed(&mut self, what: &str) -> Option<Next<Phase>> {
        // The deadline is for pods that do not become Ready. Once the step's are, what keeps
        // it (a gate measuring, a held analysis) is not late pods.
        if self.step_ready() {
            return None;
        }
        let deadline = Duration::from_secs(self.spec().progress_deadline_seconds.max(1) as u64);
        let elapsed = elapsed(self.st.phase_since.as_ref(), self.now);
        if elapsed >= deadline {
            return Some(go_warning(
                Phase::RollingBack,
                "ProgressDeadlineExceeded",
                format!(
                    "{what} within progressDeadlineSeconds ({}s); rolling back",
                    deadline.as_secs()
                ),
            ));
        }
        self.timer(deadline - elapsed);
        None
    }

    fn timer(&mut self, after: Duration) {
        let after = after + Duration::from_millis(100);
        self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
    }

    fn step(&mut self, phase: Phase) -> Next<Phase> {
        if phase != Phase::Failed
            && let Some((reason, problem)) = self.spec_problem()
        {
            return go_warning(Phase::Failed, reason, problem);
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
            (Phase::Failed, _) => match self.spec_problem() {
                Some((_, problem)) => Next::Stay(problem),
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

    /// What makes the spec impossible to act on, with the event's reason: a template linnet
    /// cannot roll out, or a change the live sets cannot take.
    fn spec_problem(&self) -> Option<(&'static str, String)> {
        if let Some(problem) = self.template_problem() {
            return Some(("InvalidSpec", problem));
        }
        let located = |text: String| match &self.r.source_path {
            Some(path) => format!("{path}: {text}"),
            None => text,
        };
        if let Some(other) = &self.o.other_strategy_set {
            let (now, before) = if self.two_sets() {
                ("TwoSets", "Partition")
            } else {
                ("Partition", "TwoSets")
            };
            return Some((
                "UnsafeChange",
                located(format!(
                    "spec.strategy.type changed to {now} while StatefulSet {other} still runs this rollout's \
                     {before} pods; a switch would start a second set of pods on new volumes. \
                     Put spec.strategy.type back to {before} in Git; to switch, delete the rollout \
                     (its claims and volumes stay) and create it again"
                )),
            ));
        }
        let live = [
            (self.main_role(), self.o.stable.as_ref()),
            (Role::Canary, self.o.canary.as_ref()),
        ];
        for (role, set) in live {
            let Some((set, fixed)) = set.and_then(|s| Some((s, s.fixed.as_ref()?))) else {
                continue;
            };
            let shape = SetShape {
                role,
                image: "",
                replicas: 0,
                ordinals_start: 0,
                partition: 0,
            };
            let desired = stateful_set(&self.r.reference, self.spec(), &shape);
            let changed = fixed.changed(&FixedSetFields::of_set(&desired));
            if !changed.is_empty() {
                return Some((
                    "UnsafeChange",
                    located(format!(
                        "{} changed, but Kubernetes cannot change it on the live StatefulSet {}; \
                         put it back in Git, or delete the rollout (its claims and volumes stay) \
                         and create it again",
                        changed.join(", "),
                        set.name
                    )),
                ));
            }
        }
        None
    }

    /// What makes the template impossible to roll out (the API server's rules cannot see it).
    fn template_problem(&self) -> Option<String> {
        let pod = self.spec().template.template.spec.as_ref();
        let containers = pod.map(|p| p.containers.as_slice()).unwrap_or_default();
        match self.spec().container.as_deref() {
            Some(c) if !containers.iter().any(|x| x.name == c) => Some(format!(
                "container {c:?} is not in the template; fix spec.container or the template in Git"
            )),
            None if containers.is_empty() => {
                Some("the template has no containers; add one in Git".into())
            }
            _ if self.replicas() == 0 => Some("replicas must be at least 1".into()),
            _ => None,
        }
    }

    fn main_shape<'s>(&self, image: &'s str, replicas: i32, partition: i32) -> SetShape<'s> {
        SetShape {
            role: self.main_role(),
            image,
            replicas,
            ordinals_start: 0,
            partition,
        }
    }

    fn initializing(&mut self) -> Next<Phase> {
        let image = self.stable_image();
        let r = self.replicas();
        let set = self.ensure(self.main_shape(&image, r, 0)).cloned();
        if Self::settled(set.as_ref(), r) {
            return go(
                Phase::Stable,
                "Available",
                format!("{r}/{r} replicas ready on {image}"),
            );
        }
        Next::Stay(format!(
            "starting {r} replicas of {image} ({} ready)",
            set.map_or(0, |s| s.ready_replicas)
        ))
    }

    fn stable(&mut self) -> Next<Phase> {
        let image = self.stable_image();
        if self.spec().image != image {
            return self.start_canary();
        }
        let r = self.replicas();
        if self.ensure(self.main_shape(&image, r, 0)).is_none()
            && let Some(set) = &self.o.stable
        {
            return Next::Stay(format!(
                "{}/{r} replicas ready on {image}; putting back {} changed outside Git ({} replicas, image {})",
                set.ready_replicas,
                set.name,
                set.replicas,
                set.image.as_deref().unwrap_or("none"),
            ));
        }
        Next::Stay(format!(
            "{}/{r} replicas ready on {image}",
            self.o.stable.as_ref().map_or(0, |s| s.ready_replicas)
        ))
    }

    fn start_canary(&mut self) -> Next<Phase> {
        let image = self.spec().image.clone();
        self.st.canary_image = Some(image.clone());
        self.st.current_step = Some(0);
        self.st.promote_at_start = self.r.promote.clone();
        self.st.abort_at_start = self.r.abort.clone();
        analysis::start(&mut self.st.analysis, &self.r.analysis, self.now);
        let n = self.size(0);
        let r = self.replicas();
        let next = if self.two_sets() {
            Phase::ScalingDownStable
        } else {
            Phase::DeployingCanary
        };
        go(
            next,
            "CanaryStarted",
            format!(
                "canary of {image} on {n} of {r} replicas (ordinals {}..{}); stable stays on {}",
                r - n,
                r - 1,
                self.stable_image()
            ),
        )
    }

    // --- TwoSets -------------------------------------------------------------------------

    fn scaling_down_stable(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        let r = self.replicas();
        let n = self.size(self.step_index());
        let keep = r - n;
        let image = self.stable_image();
        if let Some(next) = self.deadline_passed("stable replicas did not stop") {
            return next;
        }
        let set = self.ensure(self.main_shape(&image, keep, 0)).cloned();
        let freed: Vec<String> = self
            .pods_of(Role::Stable)
            .iter()
            .filter(|p| p.ordinal >= keep)
            .map(|p| p.name.clone())
            .collect();
        if !freed.is_empty() || !set.is_some_and(|s| s.status_fresh) {
            return Next::Stay(format!(
                "scaling {} down to {keep}; waiting for {} to stop",
                Role::Stable.set_name(&self.r.reference.name),
                if freed.is_empty() {
                    "the set".to_string()
                } else {
                    freed.join(", ")
                }
            ));
        }
        go(
            Phase::DeployingCanary,
            "StableScaledDown",
            format!(
                "stable scaled down to {keep}; handing ordinals {keep}..{} to the canary",
                r - 1
            ),
        )
    }

    /// Runs the handoffs of ordinals `range` from `from` to `to`; what is still to do, or
    /// `None` when every volume is where it belongs.
    fn hand_over(&mut self, range: std::ops::Range<i32>, from: Role, to: Role) -> Option<String> {
        let mut pending = Vec::new();
        for k in range {
            for t in claim_templates(self.spec()) {
                match handoff_step(&self.r.reference, self.spec(), self.o, &t, k, from, to) {
                    HandoffStep::Done => {}
                    HandoffStep::Waiting(why) => pending.push(why),
                    HandoffStep::Act(a) => {
                        pending.push(a.describe());
                        self.actions.push(a);
                    }
                }
            }
        }
        (!pending.is_empty()).then(|| pending.join("; "))
    }

    fn deploying_two_sets(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        let r = self.replicas();
        let n = self.size(self.step_index());
        let start = r - n;
        if let Some(next) = self.deadline_passed(&format!("the canary's {n} pod(s) were not Ready"))
        {
            return next;
        }
        let stable_image = self.stable_image();
        self.ensure(self.main_shape(&stable_image, start, 0));
        if let Some(why) = self.hand_over(start..r, Role::Stable, Role::Canary) {
            return Next::Stay(format!(
                "handing the volumes of ordinals {start}..{} to the canary: {why}",
                r - 1
            ));
        }
        let image = self.canary_image();
        let canary = self
            .ensure(SetShape {
                role: Role::Canary,
                image: &image,
                replicas: n,
                ordinals_start: start,
                partition: 0,
            })
            .cloned();
        if !Self::settled(canary.as_ref(), n) {
            return Next::Stay(format!(
                "waiting for {n} canary pod(s) on {image} to be Ready ({} ready)",
                canary.map_or(0, |c| c.ready_replicas)
            ));
        }
        self.step_done(n)
    }

    fn step_done(&mut self, n: i32) -> Next<Phase> {
        let i = self.step_index();
        if let Some(next) = self.gate(i as i32 + 1) {
            return next;
        }
        if let Some(hold) = self.analysis_hold() {
            return Next::Stay(hold);
        }
        if i < self.last_step() {
            self.st.current_step = Some(i as i32 + 1);
            let next = if self.two_sets() {
                Phase::ScalingDownStable
            } else {
                Phase::DeployingCanary
            };
            return go(
                next,
                "StepComplete",
                format!(
                    "step {} of {} done ({n} canary replicas Ready); next: {}",
                    i + 1,
                    self.last_step() + 1,
                    self.size(i + 1)
                ),
            );
        }
        go(
            Phase::CanaryActive,
            "CanaryReady",
            format!("{n} canary replica(s) Ready on {}", self.canary_image()),
        )
    }

    fn canary_drained(&self) -> bool {
        self.o.canary.as_ref().is_none_or(|c| c.replicas == 0)
            && self.pods_of(Role::Canary).is_empty()
    }

    /// Scales the canary set to 0 (keeping its shape otherwise).
    fn drain_canary(&mut self) {
        if self.o.canary.is_none() {
            return;
        }
        let image = self.canary_image();
        let r = self.replicas();
        let n = self.size(self.step_index());
        self.ensure(SetShape {
            role: Role::Canary,
            image: &image,
            replicas: 0,
            ordinals_start: r - n,
            partition: 0,
        });
    }

    fn promoting_two_sets(&mut self) -> Next<Phase> {
        let r = self.replicas();
        let n = self.size(self.step_index());
        let image = self.canary_image();
        let canary_range = r - self.spec().canary_replicas.clamp(1, r.max(1))..r;
        if !self.canary_drained() {
            // 1. The stable replicas move to the new image first; the canary keeps serving.
            let stable = self.ensure(self.main_shape(&image, r - n, 0)).cloned();
            if !Self::settled(stable.as_ref(), r - n) {
                return Next::Stay(format!(
                    "updating the {} stable replica(s) to {image}",
                    r - n
                ));
            }
            // 2. Then the canary stops.
            self.drain_canary();
            return Next::Stay("stopping the canary pods".into());
        }
        // 3. Its volumes go back to the stable set.
        if let Some(why) = self.hand_over(canary_range, Role::Canary, Role::Stable) {
            return Next::Stay(format!("handing volumes back to the stable set: {why}"));
        }
        // 4. The stable set comes back to full size on the new image.
        let stable = self.ensure(self.main_shape(&image, r, 0)).cloned();
        if !Self::settled(stable.as_ref(), r) {
            return Next::Stay(format!(
                "scaling the stable set back to {r} on {image} ({} ready)",
                stable.map_or(0, |s| s.ready_replicas)
            ));
        }
        // 5. The canary set goes; the phase says Stable only once it has.
        if let Some(waiting) = self.delete_canary_set() {
            return waiting;
        }
        self.finish_promotion()
    }

    fn finish_promotion(&mut self) -> Next<Phase> {
        let image = self.canary_image();
        self.st.stable_image = Some(image.clone());
        self.st.canary_image = None;
        self.st.current_step = None;
        let r = self.replicas();
        keeping(go(
            Phase::Stable,
            "Promoted",
            format!("promoted: {r}/{r} replicas on {image}"),
        ))
    }

    fn rolling_back_two_sets(&mut self) -> Next<Phase> {
        let r = self.replicas();
        let stable_image = self.stable_image();
        if !self.canary_drained() {
            // The stable replicas must serve, on the stable image, before the canary stops.
            let keep = self.o.stable.as_ref().map_or(r, |s| s.replicas);
            let stable = self
                .ensure(self.main_shape(&stable_image, keep, 0))
                .cloned();
            if !Self::settled(stable.as_ref(), keep) {
                return Next::Stay(format!(
                    "waiting for the {keep} stable replica(s) on {stable_image} to be Ready before stopping the canary"
                ));
            }
            self.drain_canary();
            return Next::Stay("stopping the canary pods".into());
        }
        let canary_range = r - self.spec().canary_replicas.clamp(1, r.max(1))..r;
        if let Some(why) = self.hand_over(canary_range, Role::Canary, Role::Stable) {
            return Next::Stay(format!("handing volumes back to the stable set: {why}"));
        }
        let stable = self.ensure(self.main_shape(&stable_image, r, 0)).cloned();
        if !Self::settled(stable.as_ref(), r) {
            return Next::Stay(format!(
                "scaling the stable set back to {r} on {stable_image} ({} ready)",
                stable.map_or(0, |s| s.ready_replicas)
            ));
        }
        if let Some(waiting) = self.delete_canary_set() {
            return waiting;
        }
        self.finish_rollback()
    }

    /// Deletes the canary set while it exists. A finished phase (Stable, RolledBack) is
    /// written before its actions run, so it must not be reached while the set is still
    /// there: readers of the phase would see it with the set.
    fn delete_canary_set(&mut self) -> Option<Next<Phase>> {
        self.o.canary.as_ref()?;
        self.actions.push(Action::DeleteSet {
            name: Role::Canary.set_name(&self.r.reference.name),
        });
        Some(Next::Stay("deleting the canary set".into()))
    }

    fn finish_rollback(&mut self) -> Next<Phase> {
        let r = self.replicas();
        let stable = self.stable_image();
        self.st.current_step = None;
        let why = analysis::failure(&self.st.analysis).map_or(String::new(), |f| format!(" ({f})"));
        keeping(go_warning(
            Phase::RolledBack,
            "RolledBack",
            format!(
                "rolled back: {r}/{r} replicas on {stable}; {} was not promoted{why}",
                self.canary_image()
            ),
        ))
    }

    // --- Partition -------------------------------------------------------------------------

    /// Pods at or above `partition` that run the set's update revision and are Ready.
    fn updated_ready(&self, set: Option<&SetView>, partition: i32) -> i32 {
        let Some(set) = set else { return 0 };
        self.pods_of(Role::Single)
            .iter()
            .filter(|p| {
                p.ordinal >= partition
                    && p.ready
                    && !p.deleting
                    && p.revision == set.update_revision
            })
            .count() as i32
    }

    fn deploying_partition(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        let r = self.replicas();
        let n = self.size(self.step_index());
        if let Some(next) = self.deadline_passed(&format!("the canary's {n} pod(s) were not Ready"))
        {
            return next;
        }
        let image = self.canary_image();
        let set = self.ensure(self.main_shape(&image, r, r - n)).cloned();
        let ready = self.updated_ready(set.as_ref(), r - n);
        if !set.as_ref().is_some_and(|s| s.status_fresh) || ready < n {
            return Next::Stay(format!(
                "waiting for ordinals {}..{} to run {image} and be Ready ({ready}/{n})",
                r - n,
                r - 1
            ));
        }
        self.step_done(n)
    }

    fn promoting_partition(&mut self) -> Next<Phase> {
        let r = self.replicas();
        let image = self.canary_image();
        let set = self.ensure(self.main_shape(&image, r, 0)).cloned();
        if !Self::settled(set.as_ref(), r) {
            return Next::Stay(format!(
                "rolling all {r} replicas to {image} ({} updated)",
                set.map_or(0, |s| s.updated_replicas)
            ));
        }
        self.finish_promotion()
    }

    fn rolling_back_partition(&mut self) -> Next<Phase> {
        let r = self.replicas();
        let image = self.stable_image();
        let set = self.ensure(self.main_shape(&image, r, 0)).cloned();
        if let Some(set) = set.as_ref().filter(|s| s.status_fresh) {
            // A pod that never became Ready blocks its set's rolling update for good (a known
            // StatefulSet trap); delete it so the set recreates it on the restored revision.
            let stuck: Vec<String> = self
                .pods_of(Role::Single)
                .iter()
                .filter(|p| !p.ready && !p.deleting && p.revision != set.update_revision)
                .map(|p| p.name.clone())
                .collect();
            for name in stuck {
                self.actions.push(Action::DeletePod { name });
            }
        }
        if !Self::settled(set.as_ref(), r) {
            return Next::Stay(format!(
                "restoring {image} on every replica ({} updated and Ready)",
                set.map_or(0, |s| s.ready_replicas.min(s.updated_replicas))
            ));
        }
        self.finish_rollback()
    }

    // --- Both ----------------------------------------------------------------------------

    /// The canary pods (those on the canary image) as the strategy places them.
    fn canary_pods(&self) -> Vec<&PodView> {
        if self.two_sets() {
            return self.pods_of(Role::Canary);
        }
        let r = self.replicas();
        let n = self.size(self.step_index());
        let revision = self
            .o
            .stable
            .as_ref()
            .and_then(|s| s.update_revision.clone());
        self.pods_of(Role::Single)
            .into_iter()
            .filter(|p| p.ordinal >= r - n && p.revision == revision)
            .collect()
    }

    fn keep_canary_shape(&mut self) {
        let r = self.replicas();
        let n = self.size(self.step_index());
        let image = self.canary_image();
        if self.two_sets() {
            let stable = self.stable_image();
            self.ensure(self.main_shape(&stable, r - n, 0));
            self.ensure(SetShape {
                role: Role::Canary,
                image: &image,
                replicas: n,
                ordinals_start: r - n,
                partition: 0,
            });
        } else {
            self.ensure(self.main_shape(&image, r, r - n));
        }
    }

    fn canary_active(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        self.keep_canary_shape();
        if let Some(hold) = self.analysis_hold() {
            return Next::Stay(hold);
        }
        let n = self.size(self.step_index());
        let image = self.canary_image();
        let pods = self.canary_pods();
        let ready: Vec<&PodView> = pods.iter().copied().filter(|p| p.ready).collect();
        // A gate after the last step passed (step_done saw to it): it replaces the human.
        let last_gate = gate_run(self.last_step() as i32 + 1);
        let gate_passed = self
            .st
            .analysis
            .iter()
            .any(|r| r.name == last_gate && r.phase == crate::api::AnalysisPhase::Successful);
        let promote = match self.spec().promotion.type_ {
            _ if gate_passed => true,
            PromotionType::Auto => {
                if (ready.len() as i32) < n {
                    return Next::Stay(format!(
                        "{}/{n} canary pods Ready; the bake time starts when all are",
                        ready.len()
                    ));
                }
                let bake = Duration::from_secs(self.spec().promotion.bake_seconds.max(0) as u64);
                let since = ready
                    .iter()
                    .filter_map(|p| p.ready_since)
                    .max()
                    .unwrap_or(self.now);
                let baked = self.now.duration_since(since).unsigned_abs();
                if baked < bake {
                    self.timer(bake - baked);
                    return Next::Stay(format!(
                        "baking: canary Ready for {}s of {}s",
                        baked.as_secs(),
                        bake.as_secs()
                    ));
                }
                true
            }
            PromotionType::Manual => annotation_acts(
                self.r.promote.as_deref(),
                self.st.promote_at_start.as_deref(),
                &image,
            ),
        };
        if !promote {
            let stale = self.r.promote.as_deref() == Some("true");
            return Next::Stay(format!(
                "canary of {image} Ready on {n} replica(s); waiting for promotion: set the annotation {}: \"true\" in Git{}",
                crate::api::PROMOTE_ANNOTATION,
                if stale {
                    " (it was already \"true\" when this canary started, so it counts for an earlier one; set it to the canary's image instead)"
                } else {
                    ""
                }
            ));
        }
        if self.spec().migration.is_some() {
            return go(
                Phase::AwaitingMigration,
                "PromotionApproved",
                format!("promotion of {image} approved; running the migration Job first"),
            );
        }
        go(
            Phase::Promoting,
            "PromotionStarted",
            format!("promoting {image} to all {} replicas", self.replicas()),
        )
    }

    fn awaiting_migration(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        self.keep_canary_shape();
        if let Some(job) = &self.o.job {
            return go(
                Phase::MigratingData,
                "MigrationStarted",
                format!("migration Job {} started", job.name),
            );
        }
        let image = self.canary_image();
        match migration_job(&self.r.reference, self.spec(), &image) {
            Some(job) => {
                self.actions.push(Action::CreateJob(Box::new(job)));
                Next::Stay("creating the migration Job".into())
            }
            None => go(
                Phase::Promoting,
                "PromotionStarted",
                "the migration was removed from the spec; promoting".into(),
            ),
        }
    }

    fn migrating_data(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        self.keep_canary_shape();
        match &self.o.job {
            Some(j) if j.succeeded => go(
                Phase::Promoting,
                "MigrationSucceeded",
                format!("migration Job {} succeeded; promoting", j.name),
            ),
            Some(j) if j.failed => go_warning(
                Phase::MigrationFailed,
                "MigrationFailed",
                format!(
                    "migration Job {} failed; rolling back (see `kubectl logs job/{}`)",
                    j.name, j.name
                ),
            ),
            Some(j) => Next::Stay(format!("migration Job {} running", j.name)),
            None => Next::Stay(
                "the migration Job is gone before it finished; it is not run twice for the same image. Abort or change the image in Git"
                    .into(),
            ),
        }
    }

    fn rolled_back(&mut self) -> Next<Phase> {
        let stable = self.stable_image();
        let image = self.spec().image.clone();
        if image == stable {
            self.st.canary_image = None;
            return go(
                Phase::Stable,
                "Available",
                format!("image is {stable} again in Git; stable"),
            );
        }
        if Some(&image) != self.st.canary_image.as_ref() {
            return self.start_canary();
        }
        let r = self.replicas();
        self.ensure(self.main_shape(&stable, r, 0));
        let why = analysis::failure(&self.st.analysis).map_or(String::new(), |f| format!(" ({f})"));
        Next::Stay(format!(
            "rolled back to {stable}; {image} stays off until the image in Git changes{why}"
        ))
    }

    // --- Status --------------------------------------------------------------------------

    fn finish(mut self, message: String) -> Plan {
        let r = self.replicas();
        let ready = self
            .o
            .pods
            .iter()
            .filter(|p| p.ready && !p.deleting)
            .count() as i32;
        let canary_ready = match self.st.phase {
            Some(Phase::Stable | Phase::Initializing | Phase::RolledBack | Phase::Failed) => 0,
            _ => self
                .canary_pods()
                .iter()
                .filter(|p| p.ready && !p.deleting)
                .count() as i32,
        };
        let phase = self.st.phase.unwrap_or(Phase::Initializing);
        if progressing_phase(phase) && self.st.canary_image.is_none() {
            self.st.canary_image = Some(self.spec().image.clone());
        }
        let stable_set = self.o.stable.as_ref();
        let stable_revision = stable_set.and_then(|s| s.current_revision.clone());
        let canary_revision = if self.two_sets() {
            self.o
                .canary
                .as_ref()
                .and_then(|c| c.update_revision.clone())
        } else {
            stable_set
                .and_then(|s| s.update_revision.clone())
                .filter(|u| Some(u) != stable_revision.as_ref())
        };
        if reads_abort(phase) {
            if let Some(after) = analysis::next_due(&self.st.analysis, &self.r.analysis, self.now) {
                self.timer(after);
            }
        } else {
            analysis::stop_runs(&mut self.st.analysis);
        }
        self.st.stable_revision = stable_revision;
        self.st.canary_revision = canary_revision.filter(|_| progressing_phase(phase));
        self.st.ready_replicas = ready;
        self.st.canary_ready_replicas = canary_ready;
        self.st.ready = Some(format!("{ready}/{r}"));
        self.st.observed_generation = self.r.generation;
        self.st.source_revision = self.r.source_revision.clone();
        self.st.message = Some(message.clone());

        let standing = match phase {
            // Every pod ready on the set's current revision: a template change rolling
            // through the pods (same image) is not settled yet.
            Phase::Stable if ready >= r && Self::settled(self.o.stable.as_ref(), r) => {
                Standing::Settled
            }
            Phase::RolledBack | Phase::Failed => Standing::Stuck,
            _ => Standing::Working,
        };
        let reason = format!("{phase:?}");
        let mut conditions = std::mem::take(&mut self.st.conditions);
        set_standing(&mut conditions, standing, &reason, &message, self.now);
        self.st.conditions = conditions;
        Plan {
            status: self.st,
            actions: self.actions,
            events: self.events,
            requeue_after: self.requeue,
            entered: Vec::new(),
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
            format!("{ROLLOUT_LABEL}={name},{ROLE_LABEL}=canary"),
            format!("{ROLLOUT_LABEL}={name},{ROLE_LABEL}=stable"),
        ),
        StatefulSetStrategyType::Partition => {
            let revision = |r: &Option<String>| {
                format!(
                    "{ROLLOUT_LABEL}={name},controller-revision-hash={}",
                    r.as_deref().unwrap_or("")
                )
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
        stable_image: status.stable_image.clone().unwrap_or_default(),
        canary_selector,
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

#[cfg(test)]
mod tests;
