//! When a new rollout's first status is written (issue 51). A rollout that starts as Git asks
//! costs one status write, not two: while it is Initializing and young, its status waits for
//! the move to Stable (or Completed), and is written at once for anything else: a move to
//! another phase, a refused spec, a failed action, or the wait running out.

use std::time::Duration;

use jiff::Timestamp;

use super::RolloutStatus;
use super::actions::Planned;

/// How long a new rollout's first status waits by default for its set or Deployment to be
/// ready. A first sync of 1,000 rollouts on two cores readies every set in about 25 s.
pub const FIRST_STATUS_WAIT: Duration = Duration::from_secs(30);

/// How much longer the first status of a rollout created at `created` may wait, when the plan
/// only keeps it Initializing and its status was never written (`stored` has no phase); `None`
/// means write it now. The reconcile requeues for the time returned, so the status is written
/// at the latest `wait` after the rollout was made, even if nothing else wakes it.
pub fn first_status_wait<S: RolloutStatus>(
    stored: Option<&S>,
    planned: &Planned<S, S::Phase>,
    created: Option<Timestamp>,
    now: Timestamp,
    wait: Duration,
) -> Option<Duration> {
    use crate::api::WireName;
    if stored.and_then(RolloutStatus::phase).is_some() || !planned.entered.is_empty() {
        return None;
    }
    let initializing = planned
        .status
        .phase()
        .is_some_and(|p| p.wire_name() == S::INITIAL.wire_name());
    // Events come only with a move, which `entered` already rules out.
    let stalled =
        crate::api::find_condition(planned.status.conditions(), crate::api::condition::STALLED)
            .is_some_and(|c| c.status == "True");
    if !initializing || stalled || planned.status.failed_action().is_some() {
        return None;
    }
    let age = now.duration_since(created?);
    let age = if age.is_negative() {
        Duration::ZERO
    } else {
        age.unsigned_abs()
    };
    wait.checked_sub(age).filter(|left| !left.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CanaryStatefulSetStatus, Condition, StatefulSetPhase};

    fn planned(phase: StatefulSetPhase) -> Planned<CanaryStatefulSetStatus, StatefulSetPhase> {
        Planned {
            status: CanaryStatefulSetStatus {
                phase: Some(phase),
                ..Default::default()
            },
            actions: Vec::new(),
            events: Vec::new(),
            requeue_after: None,
            entered: Vec::new(),
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    const WAIT: Duration = FIRST_STATUS_WAIT;

    #[test]
    fn a_young_new_rollout_that_is_initializing_waits_for_the_rest_of_the_wait() {
        let p = planned(StatefulSetPhase::Initializing);
        assert_eq!(
            first_status_wait(None, &p, Some(at(0)), at(10), WAIT),
            Some(Duration::from_secs(20))
        );
        let never_written = CanaryStatefulSetStatus::default();
        assert_eq!(
            first_status_wait(Some(&never_written), &p, Some(at(0)), at(0), WAIT),
            Some(WAIT)
        );
    }

    #[test]
    fn the_status_is_written_once_the_wait_ran_out() {
        let p = planned(StatefulSetPhase::Initializing);
        assert_eq!(first_status_wait(None, &p, Some(at(0)), at(30), WAIT), None);
        assert_eq!(
            first_status_wait(None, &p, Some(at(0)), at(400), WAIT),
            None
        );
        assert_eq!(
            first_status_wait(None, &p, None, at(0), WAIT),
            None,
            "no creation time"
        );
    }

    #[test]
    fn a_move_a_refusal_or_a_failure_is_written_at_once() {
        let mut moved = planned(StatefulSetPhase::Stable);
        moved.entered.push(StatefulSetPhase::Stable);
        assert_eq!(
            first_status_wait(None, &moved, Some(at(0)), at(1), WAIT),
            None
        );
        let mut failed = planned(StatefulSetPhase::Initializing);
        failed.status.failed_action = Some("apply StatefulSet redis".into());
        assert_eq!(
            first_status_wait(None, &failed, Some(at(0)), at(1), WAIT),
            None
        );
        let mut stalled = planned(StatefulSetPhase::Initializing);
        stalled.status.conditions.push(Condition {
            type_: "Stalled".into(),
            status: "True".into(),
            reason: "InvalidSpec".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(1)),
            observed_generation: None,
        });
        assert_eq!(
            first_status_wait(None, &stalled, Some(at(0)), at(1), WAIT),
            None
        );
    }

    #[test]
    fn a_status_written_before_is_kept_up_to_date_at_once() {
        let p = planned(StatefulSetPhase::Initializing);
        let written = CanaryStatefulSetStatus {
            phase: Some(StatefulSetPhase::Initializing),
            ..Default::default()
        };
        assert_eq!(
            first_status_wait(Some(&written), &p, Some(at(0)), at(1), WAIT),
            None
        );
    }

    #[test]
    fn a_clock_behind_the_creation_time_waits_the_whole_wait() {
        let p = planned(StatefulSetPhase::Initializing);
        assert_eq!(
            first_status_wait(None, &p, Some(at(5)), at(0), WAIT),
            Some(WAIT)
        );
    }
}
