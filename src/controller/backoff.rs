//! How the controllers wait after a reconcile fails: a rollout is retried later and later,
//! with jitter, slower for an error that only a change can clear, and logged once per change
//! of error rather than once per retry. The schedule is backon's, built in
//! [`crate::retry`] with every other retry schedule of the agent.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backon::BackoffBuilder as _;

pub use crate::retry::{
    RECONCILE_PERMANENT_MAX as PERMANENT_MAX, RECONCILE_PERMANENT_MIN as PERMANENT_MIN,
    RECONCILE_RETRY_MAX as RETRY_MAX, RECONCILE_RETRY_MIN as RETRY_MIN,
};

/// Each failing rollout's run of errors: how many in a row, the last one's class (its metric
/// label and HTTP code, not its text, which may vary), so that a retry with the same error
/// logs nothing new, and where its schedule stands.
#[derive(Debug, Default)]
pub struct ErrorRuns {
    runs: Mutex<HashMap<String, Run>>,
}

#[derive(Debug)]
struct Run {
    failures: u32,
    class: String,
    schedule: backon::ExponentialBackoff,
    /// The retry the schedule last gave. A failure before it (a watch event woke the
    /// rollout) does not move the schedule on: a burst of failures in the seconds after an
    /// API server restart must not push the next try minutes away (issue 44).
    next_try: Instant,
    wait: Duration,
}

/// Runs kept at most: a rollout deleted (or moved to another shard) while failing leaves its
/// run behind; past this many, all are forgotten (each then starts its backoff again).
const MAX_RUNS: usize = 10_000;

/// What [`ErrorRuns::failed`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// When to try again.
    pub after: Duration,
    /// Failures in a row, this one included.
    pub failures: u32,
    /// Whether the error differs from the last one (so it is worth a log line).
    pub changed: bool,
}

fn schedule(permanent: bool) -> backon::ExponentialBackoff {
    crate::retry::reconcile_builder(permanent).build()
}

impl ErrorRuns {
    /// Records a failure of `key` at `now` with an error of class `error`, and says when to
    /// retry.
    pub fn failed(&self, key: &str, error: &str, permanent: bool, now: Instant) -> Retry {
        let first_wait = |schedule: &mut backon::ExponentialBackoff| {
            schedule
                .next()
                .unwrap_or(if permanent { PERMANENT_MIN } else { RETRY_MIN })
        };
        let Ok(mut runs) = self.runs.lock() else {
            return Retry {
                after: first_wait(&mut schedule(permanent)),
                failures: 1,
                changed: true,
            };
        };
        if runs.len() >= MAX_RUNS && !runs.contains_key(key) {
            runs.clear();
        }
        let changed = runs.get(key).is_none_or(|run| run.class != error);
        if changed {
            let mut schedule = schedule(permanent);
            let wait = first_wait(&mut schedule);
            runs.insert(
                key.to_string(),
                Run {
                    failures: 1,
                    class: error.to_string(),
                    schedule,
                    next_try: now + wait,
                    wait,
                },
            );
            return Retry {
                after: wait,
                failures: 1,
                changed,
            };
        }
        let Some(run) = runs.get_mut(key) else {
            return Retry {
                after: RETRY_MIN,
                failures: 1,
                changed,
            };
        };
        run.failures = run.failures.saturating_add(1);
        if now >= run.next_try {
            run.wait = run.schedule.next().unwrap_or(run.wait);
            run.next_try = now + run.wait;
        }
        Retry {
            after: run
                .next_try
                .saturating_duration_since(now)
                .max(Duration::from_millis(100)),
            failures: run.failures,
            changed,
        }
    }

    /// `key` reconciled without error: its run is over. Whether it had one (worth a log line).
    pub fn succeeded(&self, key: &str) -> bool {
        self.runs
            .lock()
            .map(|mut runs| {
                let had = runs.remove(key).is_some();
                // A first sync's burst of failures left the table's room for all of them.
                let left = runs.len();
                if had && runs.capacity() > 64 && left * 4 < runs.capacity() {
                    runs.shrink_to(left * 2);
                }
                had
            })
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_slow_down_with_jitter_and_refusals_slow_down_more() {
        // Issue 69: the reconcile retry was a hand-written schedule with no jitter.
        let runs = ErrorRuns::default();
        let mut now = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..12 {
            let retry = runs.failed("ns/a", "kube_api:409", false, now);
            waits.push(retry.after);
            now += retry.after;
        }
        assert!(
            waits[0] >= RETRY_MIN && waits[0] <= RETRY_MIN * 2,
            "{waits:?}"
        );
        assert!(waits[4] > waits[0] * 4, "{waits:?}");
        assert!(waits.iter().all(|w| *w <= RETRY_MAX * 2), "{waits:?}");
        let refused = runs.failed("ns/b", "kube_api:403", true, now);
        assert!(refused.after >= PERMANENT_MIN, "{refused:?}");
        // Jitter: two rollouts failing together do not retry in step.
        let firsts: std::collections::BTreeSet<Duration> = (0..20)
            .map(|i| {
                runs.failed(&format!("ns/j{i}"), "kube_api:409", false, now)
                    .after
            })
            .collect();
        assert!(firsts.len() > 1, "{firsts:?}");
    }

    #[test]
    fn a_burst_of_failures_does_not_push_the_next_try_away() {
        // Issue 44 (make chaos): 403s for a few seconds after an API server restart pushed a
        // rollout's next try minutes away when the wait doubled per failure.
        let runs = ErrorRuns::default();
        let t0 = Instant::now();
        for ms in [0, 200, 400, 600, 800] {
            let retry = runs.failed("ns/a", "kube_api:403", true, t0 + Duration::from_millis(ms));
            assert!(retry.after <= PERMANENT_MIN * 2, "{retry:?}");
        }
    }

    #[test]
    fn a_repeated_error_is_logged_once_and_a_new_one_starts_a_new_run() {
        // Issue 44: a 403 was retried every 5 s for ever, with a long WARN each time.
        let runs = ErrorRuns::default();
        let t0 = Instant::now();
        let first = runs.failed("ns/a", "kube_api:403", true, t0);
        assert!(first.changed);
        let again = runs.failed("ns/a", "kube_api:403", true, t0 + Duration::from_secs(20));
        assert!(!again.changed);
        assert!(again.after > first.after);
        let other = runs.failed("ns/a", "kube_api:409", false, t0 + Duration::from_secs(40));
        assert!(other.changed);
        assert_eq!(other.failures, 1);
        assert!(other.after <= RETRY_MIN * 2, "{other:?}");
        assert!(runs.succeeded("ns/a"));
        assert!(!runs.succeeded("ns/a"), "the run is over");
        assert!(runs.failed("ns/a", "kube_api:409", false, t0).changed);
    }

    #[test]
    fn the_table_gives_back_its_room_once_a_burst_of_failures_is_over() {
        // Issue 51: a first sync's failures left room for 1,000 runs in a steady agent.
        let runs = ErrorRuns::default();
        let t0 = Instant::now();
        for i in 0..1000 {
            runs.failed(&format!("ns/r{i}"), "kube_api:409", false, t0);
        }
        for i in 0..1000 {
            assert!(runs.succeeded(&format!("ns/r{i}")));
        }
        let capacity = runs.runs.lock().map(|r| r.capacity()).unwrap_or(usize::MAX);
        assert!(capacity <= 64, "capacity {capacity}");
    }
}
