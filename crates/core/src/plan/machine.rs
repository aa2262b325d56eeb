//! What both phase machines share. A phase's step either stays (saying what it waits for) or
//! moves on to another phase (with an event); [`drive`] runs steps until one stays, so a plan
//! can pass several phases when the cluster is already ahead (e.g. after a restart).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::actions::{PlanEvent, Planned};
use crate::api::Condition;

/// The most moves one plan makes; a machine never cycles, this only bounds a bug.
const MAX_MOVES: usize = 6;

/// The outcome of one phase's step.
pub(crate) enum Next<P> {
    /// Stay in the phase; the text says what it waits for.
    Stay(String),
    Go {
        phase: P,
        reason: &'static str,
        message: String,
        warning: bool,
        /// Keep the actions the phase emitted before it moved on (its last step).
        keep: bool,
        /// Publish an event for the move. An ordinary start is not announced: it is one
        /// write per new rollout in a first sync (issue 51), and the status says it.
        announce: bool,
    },
}

pub(crate) fn go<P>(phase: P, reason: &'static str, message: String) -> Next<P> {
    Next::Go {
        phase,
        reason,
        message,
        warning: false,
        keep: false,
        announce: true,
    }
}

/// A move with no event: a new rollout that became ready as Git asked.
pub(crate) fn go_quietly<P>(phase: P, message: String) -> Next<P> {
    Next::Go {
        phase,
        reason: "",
        message,
        warning: false,
        keep: false,
        announce: false,
    }
}

pub(crate) fn go_warning<P>(phase: P, reason: &'static str, message: String) -> Next<P> {
    Next::Go {
        phase,
        reason,
        message,
        warning: true,
        keep: false,
        announce: true,
    }
}

/// A move on that keeps the actions of the phase's last step.
pub(crate) fn keeping<P>(next: Next<P>) -> Next<P> {
    match next {
        Next::Go {
            phase,
            reason,
            message,
            warning,
            announce,
            ..
        } => Next::Go {
            phase,
            reason,
            message,
            warning,
            keep: true,
            announce,
        },
        stay => stay,
    }
}

/// What both rollout statuses have: a phase, conditions and a message.
pub trait RolloutStatus {
    type Phase: Copy + std::fmt::Debug + crate::api::WireName;
    /// The phase a new status starts in.
    const INITIAL: Self::Phase;
    fn phase(&self) -> Option<Self::Phase>;
    /// Records a new phase, its start and its message.
    fn enter(&mut self, phase: Self::Phase, since: Timestamp, message: &str);
    /// Puts a new status in `phase` (no start, no message: the first step sets them).
    fn start_in(&mut self, phase: Self::Phase);
    fn conditions(&self) -> &[Condition];
    /// Where a failed action is shown.
    fn conditions_and_message(&mut self) -> (&mut Vec<Condition>, &mut Option<String>);
    /// The action that failed, while the plan still needs it.
    fn failed_action(&self) -> Option<&str>;
    fn set_failed_action(&mut self, action: Option<String>);
    /// The analysis runs and their measurements.
    fn analysis_runs(&mut self) -> &mut Vec<crate::api::AnalysisRunStatus>;
    /// Records the trace of the sync that applied the spec (the controller knows it).
    fn set_trace_id(&mut self, trace_id: String);
}

macro_rules! rollout_status {
    ($status:ty, $phase:ty) => {
        impl RolloutStatus for $status {
            type Phase = $phase;
            const INITIAL: $phase = <$phase>::Initializing;
            fn phase(&self) -> Option<$phase> {
                self.phase
            }
            fn set_trace_id(&mut self, trace_id: String) {
                self.trace_id = Some(trace_id);
            }
            fn enter(&mut self, phase: $phase, since: Timestamp, message: &str) {
                self.phase = Some(phase);
                self.phase_since = Some(Time(since));
                self.message = Some(message.to_string());
            }
            fn start_in(&mut self, phase: $phase) {
                self.phase.get_or_insert(phase);
            }
            fn conditions(&self) -> &[Condition] {
                &self.conditions
            }
            fn conditions_and_message(&mut self) -> (&mut Vec<Condition>, &mut Option<String>) {
                (&mut self.conditions, &mut self.message)
            }
            fn failed_action(&self) -> Option<&str> {
                self.failed_action.as_deref()
            }
            fn set_failed_action(&mut self, action: Option<String>) {
                self.failed_action = action;
            }
            fn analysis_runs(&mut self) -> &mut Vec<crate::api::AnalysisRunStatus> {
                &mut self.analysis
            }
        }
    };
}
rollout_status!(
    crate::api::CanaryStatefulSetStatus,
    crate::api::StatefulSetPhase
);
rollout_status!(
    crate::api::CanaryDeploymentStatus,
    crate::api::DeploymentPhase
);

/// What both phase machines plan with: the rollout as its kind's planner sees it (`r`), what
/// was observed, the time, the status being made, the actions emitted and the timer. Each
/// kind's planner is this with its own rollout and status types, and implements [`Machine`].
pub(crate) struct Planner<'a, R, S> {
    pub r: &'a R,
    pub o: &'a super::observed::Observed,
    pub now: Timestamp,
    pub st: S,
    pub actions: Vec<super::Action>,
    /// A real timer: a bake time, a measurement or the progress deadline.
    pub requeue: Option<std::time::Duration>,
    /// What the phase the plan is in asked of the routes (with `trafficRouting`); the routes
    /// are moved to it when the plan finishes.
    pub want: Option<super::traffic::Want>,
    /// Events that are not a phase move (a claim made again, a volume replaced).
    pub events: Vec<PlanEvent>,
}

impl<'a, R, S: RolloutStatus + Clone> Planner<'a, R, S> {
    /// A planner that starts from the rollout's current `status`.
    pub fn new(r: &'a R, o: &'a super::observed::Observed, status: &S, now: Timestamp) -> Self {
        Planner {
            r,
            o,
            now,
            st: status.clone(),
            actions: Vec::new(),
            requeue: None,
            want: None,
            events: Vec::new(),
        }
    }

    fn phase(&self) -> S::Phase {
        self.st.phase().unwrap_or(S::INITIAL)
    }

    fn enter(&mut self, phase: S::Phase, message: &str) {
        self.st.enter(phase, self.now, message);
    }
}

/// What each kind's phase machine decides; [`plan`] runs it.
pub(crate) trait Machine {
    type Status: RolloutStatus;
    fn step(&mut self, phase: Phase<Self>) -> Next<Phase<Self>>;
    /// The phase moved on: decide what becomes of the actions it emitted since `mark`.
    fn moved_on(&mut self, mark: usize, keep: bool);
    /// Before the first step, what a new status lacks besides its phase.
    fn start(&mut self) {}
    /// The machine entered `to` by the move `reason` (`message`): a kind that keeps a
    /// timeline records it.
    fn moved(&mut self, _to: Phase<Self>, _reason: &'static str, _message: &str) {}
    /// After the last step, given the message of the phase it stopped in: the status's other
    /// fields, the actions, the timer and how the rollout stands.
    fn finish(self, message: String) -> Finished<Self::Status>;
}

/// What a machine hands [`plan`] after its last step.
pub(crate) struct Finished<S> {
    pub status: S,
    pub actions: Vec<super::Action>,
    /// A real timer: a bake time, a measurement or the progress deadline.
    pub requeue: Option<std::time::Duration>,
    /// Ready, Reconciling or Stalled, with the phase as the reason.
    pub standing: Standing,
    /// Events besides the phase moves.
    pub events: Vec<PlanEvent>,
}

/// A machine's phase type.
pub(crate) type Phase<M> = <<M as Machine>::Status as RolloutStatus>::Phase;

/// The one driver of both phase machines: starts the status, runs steps until one stays,
/// finishes the plan, and keeps shown an action failure the plan repeats. `before` is the
/// status the plan was made from.
pub(crate) fn plan<'a, R, S>(mut m: Planner<'a, R, S>, before: &S) -> Planned<S, S::Phase>
where
    S: RolloutStatus + Clone,
    Planner<'a, R, S>: Machine<Status = S>,
{
    let now = m.now;
    m.st.start_in(S::INITIAL);
    // Shown again below only while the plan still needs that action.
    m.st.set_failed_action(None);
    m.start();
    let driven = drive(&mut m);
    let mut finished = m.finish(driven.message.clone());
    let phase = finished.status.phase().unwrap_or(S::INITIAL);
    let (conditions, _) = finished.status.conditions_and_message();
    let reason = crate::api::WireName::wire_name(phase);
    set_standing(conditions, finished.standing, reason, &driven.message, now);
    let mut plan = Planned {
        status: finished.status,
        actions: finished.actions,
        events: driven.events.into_iter().chain(finished.events).collect(),
        requeue_after: finished.requeue,
        entered: driven.entered,
    };
    let actions: Vec<String> = plan.actions.iter().map(super::Action::describe).collect();
    carry_action_failure(before, &mut plan.status, actions, now);
    plan
}

/// What driving a machine produced besides its own state.
struct Driven<P> {
    /// What the phase it stopped in waits for (or the last move's message).
    pub message: String,
    /// Every phase entered, in order.
    pub entered: Vec<P>,
    /// One event per announced move.
    pub events: Vec<PlanEvent>,
}

/// Runs steps until one stays.
fn drive<'a, R, S>(m: &mut Planner<'a, R, S>) -> Driven<S::Phase>
where
    S: RolloutStatus + Clone,
    Planner<'a, R, S>: Machine<Status = S>,
{
    let mut out = Driven {
        message: String::new(),
        entered: Vec::new(),
        events: Vec::new(),
    };
    for _ in 0..MAX_MOVES {
        let mark = m.actions.len();
        let phase = m.phase();
        match m.step(phase) {
            Next::Stay(message) => {
                out.message = message;
                break;
            }
            Next::Go {
                phase,
                reason,
                message,
                warning,
                keep,
                announce,
            } => {
                m.moved_on(mark, keep);
                m.enter(phase, &message);
                m.moved(phase, reason, &message);
                if announce {
                    out.events.push(PlanEvent {
                        warning,
                        reason,
                        message: message.clone(),
                    });
                }
                out.entered.push(phase);
                out.message = message;
            }
        }
    }
    out
}

/// How long ago `since` was (zero when unknown or in the future).
pub(crate) fn elapsed(since: Option<&Time>, now: Timestamp) -> std::time::Duration {
    since.map_or(std::time::Duration::ZERO, |t| {
        let d = now.duration_since(t.0);
        if d.is_negative() {
            std::time::Duration::ZERO
        } else {
            d.unsigned_abs()
        }
    })
}

/// Whether a promote or abort annotation with `value` acts on the canary of `canary`: the
/// canary's image always does; `"true"` does unless it was already there when the canary
/// started (`at_start`), when it was meant for an earlier canary.
pub fn annotation_acts(value: Option<&str>, at_start: Option<&str>, canary: &str) -> bool {
    match value {
        Some(v) if v == canary => true,
        Some("true") => at_start != Some("true"),
        _ => false,
    }
}

/// The value a person sets (`linnet promote|abort`) so that the running canary acts on it:
/// `"true"`, or the canary's image when a `"true"` was there at its start. `"true"` is
/// preferred: left behind, an image would act on a later canary of the same image too.
pub fn acting_value(at_start: Option<&str>, canary: &str) -> String {
    if at_start == Some("true") {
        canary.to_string()
    } else {
        "true".to_string()
    }
}

/// Reason of the Stalled and Ready conditions while an action the plan needs is refused.
pub const ACTION_FAILED: &str = "ActionFailed";
/// Reason of the Reconciling and Ready conditions while an action failed in a way that
/// clears by itself (a conflict, a throttle, a server error) and is retried.
pub const ACTION_RETRYING: &str = "ActionRetrying";

/// Condition types of earlier versions, dropped from a status when it is next written.
const RETIRED_CONDITIONS: [&str; 2] = ["Progressing", "Degraded"];

/// How a rollout stands, in the three kstatus conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Settled with every replica ready on the intended image: Ready.
    Settled,
    /// Working towards what Git asks for: Reconciling.
    Working,
    /// Cannot go on without a change in Git: Stalled.
    Stuck,
}

/// Sets Ready, Reconciling and Stalled so that exactly one of them is true, all with the
/// same reason and message, and drops the condition types earlier versions wrote.
pub(crate) fn set_standing(
    conditions: &mut Vec<Condition>,
    standing: Standing,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    use crate::api::condition::{READY, RECONCILING, STALLED};
    conditions.retain(|c| !RETIRED_CONDITIONS.contains(&c.type_.as_str()));
    for (type_, value) in [
        (READY, standing == Standing::Settled),
        (RECONCILING, standing == Standing::Working),
        (STALLED, standing == Standing::Stuck),
    ] {
        set_condition(conditions, type_, value, reason, message, now);
    }
}

/// Records in a status that `action` failed, with `failure` (what was done, then the API
/// server's own message) as the conditions' and the status's message: Stalled (reason
/// ActionFailed) when it is `permanent` (a refusal that retrying cannot cure), else still
/// Reconciling (reason ActionRetrying): a conflict or a throttle is no reason for Flux to
/// call the rollout failed.
pub fn mark_action_failed<S: RolloutStatus>(
    status: &mut S,
    action: &str,
    failure: &str,
    permanent: bool,
    now: Timestamp,
) {
    let (standing, reason) = if permanent {
        (Standing::Stuck, ACTION_FAILED)
    } else {
        (Standing::Working, ACTION_RETRYING)
    };
    let (conditions, message) = status.conditions_and_message();
    set_standing(conditions, standing, reason, failure, now);
    *message = Some(format!("blocked: {failure}"));
    status.set_failed_action(Some(action.to_string()));
}

/// Keeps a failure that an earlier reconcile recorded (`before`) while the plan still asks
/// for the same action (`failedAction`, compared whole): the status stays as written (no
/// write per retry, no flapping Stalled). Once the plan no longer needs that action, the
/// failure is gone with it.
pub(crate) fn carry_action_failure<S: RolloutStatus>(
    before: &S,
    after: &mut S,
    actions: impl IntoIterator<Item = String>,
    now: Timestamp,
) {
    let Some(action) = before.failed_action() else {
        return;
    };
    let Some(failure) = before.conditions().iter().find(|c| {
        c.status == "True"
            && ((c.type_ == crate::api::condition::STALLED && c.reason == ACTION_FAILED)
                || (c.type_ == crate::api::condition::RECONCILING && c.reason == ACTION_RETRYING))
    }) else {
        return;
    };
    if actions.into_iter().any(|a| a == action) {
        let permanent = failure.reason == ACTION_FAILED;
        let failure = failure.message.clone();
        mark_action_failed(after, action, &failure, permanent, now);
    }
}

/// Sets a condition, keeping its transition time when its status did not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let status = if value { "True" } else { "False" }.to_string();
    let message: String = message.chars().take(1000).collect();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            last_transition_time: Time(now),
            observed_generation: None,
        }),
    }
}

#[cfg(test)]
pub(crate) mod tests;
