//! How the controllers wait after errors: each watch backs off on its own, briefly, so that
//! a restarted API server is followed within seconds; a rollout whose reconcile fails is
//! retried later and later, slower for an error that only a change can clear, and logged once
//! per change of error rather than once per retry.
//!
//! kube's `Controller` puts one backoff on all its trigger streams together (up to 30 s, reset
//! after 120 s without errors). Across a kube-apiserver restart every child watch failed and
//! then answered 410 Gone, one error after another, and each paused every trigger for up to
//! 30 s: the controllers acted on nothing for minutes (issue 44). Each stream here carries
//! [`watch_backoff`] and the controller's shared one never waits ([`NoTriggerBackoff`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::utils::Backoff;

/// The first wait of a watch after an error.
pub const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest wait of a watch between two tries: a restarted API server is seen again
/// within this (and the jitter) of answering.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(4);

/// One watch's backoff: kube's exponential backoff from [`WATCH_BACKOFF_MIN`] to
/// [`WATCH_BACKOFF_MAX`], with jitter, reset by any event (kube's `StreamBackoff` resets it
/// on success).
pub fn watch_backoff() -> kube::runtime::watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(WATCH_BACKOFF_MIN)
        .with_max_delay(WATCH_BACKOFF_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// The controller's backoff over all its trigger streams together: none, since each stream
/// backs off on its own ([`watch_backoff`]); one stream's errors never hold up the others.
pub struct NoTriggerBackoff;

impl Iterator for NoTriggerBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for NoTriggerBackoff {
    fn reset(&mut self) {}
}

/// The first retry of a reconcile that failed with an error that clears by itself.
pub const RETRY_MIN: Duration = Duration::from_secs(2);
/// The longest wait between retries of an error that clears by itself.
pub const RETRY_MAX: Duration = Duration::from_secs(60);
/// The first retry of a refusal (400, 403, 404, 422, not ours): only a change can clear it,
/// and a change wakes the rollout anyway.
pub const PERMANENT_MIN: Duration = Duration::from_secs(15);
/// The longest wait between retries of a refusal.
pub const PERMANENT_MAX: Duration = Duration::from_secs(300);

/// The wait before the `failures`th retry in a row (1 for the first).
pub fn retry_after(failures: u32, permanent: bool) -> Duration {
    let (min, max) = if permanent {
        (PERMANENT_MIN, PERMANENT_MAX)
    } else {
        (RETRY_MIN, RETRY_MAX)
    };
    let doublings = failures.saturating_sub(1).min(16);
    min.saturating_mul(1 << doublings).min(max)
}

/// Each failing rollout's run of errors: how many in a row, and the last one's class (its
/// metric label and HTTP code, not its text, which may vary), so that a retry with the same
/// error logs nothing new.
#[derive(Debug, Default)]
pub struct ErrorRuns {
    runs: Mutex<HashMap<String, (u32, String)>>,
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
    /// Records a failure of `key` with an error of class `error`, and says when to retry.
    pub fn failed(&self, key: &str, error: &str, permanent: bool) -> Retry {
        let Ok(mut runs) = self.runs.lock() else {
            return Retry {
                after: retry_after(1, permanent),
                failures: 1,
                changed: true,
            };
        };
        if runs.len() >= MAX_RUNS && !runs.contains_key(key) {
            runs.clear();
        }
        let run = runs.entry(key.to_string()).or_insert((0, String::new()));
        let changed = run.1 != error;
        run.0 = if changed { 1 } else { run.0.saturating_add(1) };
        run.1 = error.to_string();
        Retry {
            after: retry_after(run.0, permanent),
            failures: run.0,
            changed,
        }
    }

    /// `key` reconciled without error: its run is over. Whether it had one (worth a log line).
    pub fn succeeded(&self, key: &str) -> bool {
        self.runs
            .lock()
            .map(|mut runs| runs.remove(key).is_some())
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_waits_at_most_a_few_seconds_between_tries() {
        let mut b = watch_backoff();
        let waits: Vec<Duration> = (&mut b).take(20).collect();
        assert!(
            waits.iter().all(|w| *w <= WATCH_BACKOFF_MAX * 2),
            "{waits:?}"
        );
        b.reset();
        assert!(
            b.next().is_some_and(|w| w < WATCH_BACKOFF_MAX),
            "reset starts over"
        );
    }

    #[test]
    fn the_controllers_shared_backoff_never_waits() {
        assert_eq!(NoTriggerBackoff.next(), Some(Duration::ZERO));
    }

    #[test]
    fn retries_slow_down_and_refusals_slow_down_more() {
        assert_eq!(retry_after(1, false), RETRY_MIN);
        assert_eq!(retry_after(2, false), RETRY_MIN * 2);
        assert_eq!(retry_after(100, false), RETRY_MAX);
        assert_eq!(retry_after(1, true), PERMANENT_MIN);
        assert_eq!(retry_after(100, true), PERMANENT_MAX);
        assert!((1..40).all(|n| retry_after(n, true) >= retry_after(n, false)));
    }

    #[test]
    fn a_repeated_error_is_logged_once_and_a_new_one_starts_a_new_run() {
        // Issue 44: a 403 was retried every 5 s for ever, with a long WARN each time.
        let runs = ErrorRuns::default();
        let first = runs.failed("ns/a", "403 forbidden", true);
        assert!(first.changed);
        let again = runs.failed("ns/a", "403 forbidden", true);
        assert!(!again.changed);
        assert!(again.after > first.after);
        let other = runs.failed("ns/a", "409 conflict", false);
        assert!(other.changed);
        assert_eq!(other.failures, 1);
        assert!(runs.succeeded("ns/a"));
        assert!(!runs.succeeded("ns/a"), "the run is over");
        assert!(runs.failed("ns/a", "409 conflict", false).changed);
    }
}
