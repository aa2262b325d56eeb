//! When a new rollout's first status is written (issue 51). A rollout that starts as Git asks
//! costs one status write, not two: while it is Initializing and young, its status waits for
//! the move to Stable (or Completed), and is written at once for anything else: a move to
//! another phase, a refused spec, a failed action, or the wait running out. The wait grows
//! with the new rollouts waiting at once ([`WaitingFirstStatus`]): a first sync of 10,000
//! readies its sets over minutes, not seconds.

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;

use super::RolloutStatus;
use super::actions::Planned;

/// How long a new rollout's first status waits by default for its set or Deployment to be
/// ready. A first sync of 1,000 rollouts on two cores readies every set in about 25 s.
pub const FIRST_STATUS_WAIT: Duration = Duration::from_secs(30);

/// How much longer the wait is for each other new rollout waiting at the same time. A first
/// sync on two cores readied 1,000 sets in 25 s and 10,000 in 400 s: 25 to 40 ms a set.
pub const WAIT_PER_WAITING_ROLLOUT: Duration = Duration::from_millis(50);

/// The longest a first status waits, however many rollouts start at once.
pub const MAX_FIRST_STATUS_WAIT: Duration = Duration::from_secs(20 * 60);

/// The wait of a new rollout that saw `waiting` new rollouts (itself included) waiting for
/// their first status at once: `base`, and [`WAIT_PER_WAITING_ROLLOUT`] for each other one, up
/// to [`MAX_FIRST_STATUS_WAIT`]. A `base` of 0 (write at once) stays 0.
pub fn burst_wait(base: Duration, waiting: usize) -> Duration {
    if base.is_zero() {
        return base;
    }
    let others = u32::try_from(waiting.saturating_sub(1)).unwrap_or(u32::MAX);
    let longer = WAIT_PER_WAITING_ROLLOUT.saturating_mul(others);
    base.saturating_add(longer)
        .min(MAX_FIRST_STATUS_WAIT.max(base))
}

/// The new rollouts whose first status is waiting, each with the most that waited at once
/// while it did: a rollout reconciled early in a burst waits as long as the burst needs, and
/// one that starts alone later waits only `base`.
#[derive(Debug, Default)]
pub struct WaitingFirstStatus {
    peaks: HashMap<String, usize>,
}

impl WaitingFirstStatus {
    /// The wait of `rollout`'s first status ([`burst_wait`]), counting it as waiting until
    /// [`WaitingFirstStatus::done`].
    pub fn wait(&mut self, rollout: &str, base: Duration) -> Duration {
        let waiting = self.peaks.len() + usize::from(!self.peaks.contains_key(rollout));
        let peak = self.peaks.entry(rollout.to_string()).or_default();
        *peak = (*peak).max(waiting);
        burst_wait(base, *peak)
    }

    /// `rollout`'s first status was written, or it is gone.
    pub fn done(&mut self, rollout: &str) {
        if self.peaks.remove(rollout).is_some()
            && self.peaks.capacity() > 64
            && self.peaks.len() < self.peaks.capacity() / 4
        {
            // A burst's table gives its room back as the burst ends.
            self.peaks.shrink_to_fit();
        }
    }
}

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
    fn the_wait_grows_with_the_rollouts_waiting_at_once_up_to_its_cap() {
        assert_eq!(burst_wait(WAIT, 1), WAIT);
        assert_eq!(burst_wait(WAIT, 0), WAIT);
        assert_eq!(burst_wait(WAIT, 1_001), WAIT + Duration::from_secs(50));
        assert_eq!(burst_wait(WAIT, 10_001), WAIT + Duration::from_secs(500));
        assert_eq!(burst_wait(WAIT, usize::MAX), MAX_FIRST_STATUS_WAIT);
        assert_eq!(
            burst_wait(Duration::ZERO, 10_000),
            Duration::ZERO,
            "0s: at once"
        );
        let long = Duration::from_secs(3600);
        assert_eq!(
            burst_wait(long, 10_000),
            long,
            "a base over the cap is kept"
        );
    }

    #[test]
    fn a_rollout_early_in_a_burst_waits_for_the_whole_burst_and_a_later_one_alone_does_not() {
        let mut waiting = WaitingFirstStatus::default();
        assert_eq!(waiting.wait("ns/first", WAIT), WAIT);
        for i in 0..999 {
            waiting.wait(&format!("ns/r{i}"), WAIT);
        }
        // Reconciled again (its requeue, or its set changed): it saw 1,000 waiting.
        let burst = WAIT + WAIT_PER_WAITING_ROLLOUT * 999;
        assert_eq!(waiting.wait("ns/first", WAIT), burst);
        // As the burst ends, the peak each saw stays with it.
        for i in 0..999 {
            waiting.done(&format!("ns/r{i}"));
        }
        assert_eq!(waiting.peaks.len(), 1);
        assert_eq!(waiting.wait("ns/first", WAIT), burst);
        waiting.done("ns/first");
        assert!(waiting.peaks.is_empty());
        // Done twice (its status written, then deleted) is harmless.
        waiting.done("ns/first");
        assert_eq!(waiting.wait("ns/later", WAIT), WAIT);
        assert!(
            waiting.peaks.capacity() < 64,
            "the burst's room was given back"
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
