//! How the controllers wait after a reconcile fails: a rollout is retried later and later,
//! slower for an error that only a change can clear, and logged once per change of error
//! rather than once per retry. (Watches back off on their own: [`crate::watch::backoff`].)

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The first retry of a reconcile that failed with an error that clears by itself.
pub const RETRY_MIN: Duration = Duration::from_secs(1);
/// The longest wait between retries of an error that clears by itself.
pub const RETRY_MAX: Duration = Duration::from_secs(60);
/// The first retry of a refusal (400, 403, 404, 422, not ours): usually only a change clears
/// it, but right after an API server restart a 403 can come while its authorizer catches up.
pub const PERMANENT_MIN: Duration = Duration::from_secs(5);
/// The longest wait between retries of a refusal.
pub const PERMANENT_MAX: Duration = Duration::from_secs(300);

/// The wait before the next retry of an error that has lasted `lasted`: as long again,
/// between the bounds (slower for a refusal). By time, not by count: a burst of failures in
/// the seconds after an API server restart does not push the next try minutes away, and an
/// error that lasts is retried about twice as far apart each time.
pub fn retry_after(lasted: Duration, permanent: bool) -> Duration {
    let (min, max) = if permanent {
        (PERMANENT_MIN, PERMANENT_MAX)
    } else {
        (RETRY_MIN, RETRY_MAX)
    };
    lasted.clamp(min, max)
}

/// Each failing rollout's run of errors: when it began, how many in a row, and the last one's
/// class (its metric label and HTTP code, not its text, which may vary), so that a retry with
/// the same error logs nothing new.
#[derive(Debug, Default)]
pub struct ErrorRuns {
    runs: Mutex<HashMap<String, Run>>,
}

#[derive(Debug)]
struct Run {
    since: Instant,
    failures: u32,
    class: String,
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

impl ErrorRuns {
    /// Records a failure of `key` at `now` with an error of class `error`, and says when to
    /// retry.
    pub fn failed(&self, key: &str, error: &str, permanent: bool, now: Instant) -> Retry {
        let Ok(mut runs) = self.runs.lock() else {
            return Retry {
                after: retry_after(Duration::ZERO, permanent),
                failures: 1,
                changed: true,
            };
        };
        if runs.len() >= MAX_RUNS && !runs.contains_key(key) {
            runs.clear();
        }
        let run = runs.entry(key.to_string()).or_insert(Run {
            since: now,
            failures: 0,
            class: String::new(),
        });
        let changed = run.class != error;
        if changed {
            *run = Run {
                since: now,
                failures: 0,
                class: error.to_string(),
            };
        }
        run.failures = run.failures.saturating_add(1);
        Retry {
            after: retry_after(now.saturating_duration_since(run.since), permanent),
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
    fn retries_slow_down_as_the_error_lasts_and_refusals_slow_down_more() {
        assert_eq!(retry_after(Duration::ZERO, false), RETRY_MIN);
        assert_eq!(
            retry_after(Duration::from_secs(8), false),
            Duration::from_secs(8)
        );
        assert_eq!(retry_after(Duration::from_secs(3600), false), RETRY_MAX);
        assert_eq!(retry_after(Duration::ZERO, true), PERMANENT_MIN);
        assert_eq!(retry_after(Duration::from_secs(3600), true), PERMANENT_MAX);
        assert!((0..400).all(|s| {
            let lasted = Duration::from_secs(s);
            retry_after(lasted, true) >= retry_after(lasted, false)
        }));
    }

    #[test]
    fn a_burst_of_failures_does_not_push_the_next_try_away() {
        // Issue 44 (make chaos): 403s for a few seconds after an API server restart pushed a
        // rollout's next try minutes away when the wait doubled per failure.
        let runs = ErrorRuns::default();
        let t0 = Instant::now();
        for ms in [0, 200, 400, 600, 800] {
            let retry = runs.failed("ns/a", "kube_api:403", true, t0 + Duration::from_millis(ms));
            assert_eq!(retry.after, PERMANENT_MIN);
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
        assert_eq!((other.failures, other.after), (1, RETRY_MIN));
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
