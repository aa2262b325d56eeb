//! Every retry schedule of the agent, in one place: backon's exponential backoff with
//! jitter, capped, for ever, built here for each kind of call that is tried again (a
//! reconcile, a notification, a Git write, a commit status, a revert, a config copy).
//! A watch's own schedule, which must stay short, is [`crate::watch::backoff`]'s.

use std::time::Duration;

use backon::BackoffBuilder as _;

/// A schedule from `min` doubling to `max`, with jitter, for ever.
pub fn exponential(min: Duration, max: Duration) -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

/// The first wait before a commit status the host answered 429 or 5xx is posted again in
/// the same round.
pub const COMMIT_STATUS_POST_MIN: Duration = Duration::from_millis(400);
/// The longest wait within one round.
pub const COMMIT_STATUS_POST_MAX: Duration = Duration::from_secs(12);

/// One caller's run of failures: each [`Retries::wait`] waits longer (with jitter) up to its
/// cap, and [`Retries::reset`] after a success starts over.
#[derive(Debug)]
pub struct Retries {
    min: Duration,
    max: Duration,
    schedule: Option<backon::ExponentialBackoff>,
}

impl Retries {
    /// A schedule from `min` to `max` (each wait up to twice that with jitter).
    pub const fn new(min: Duration, max: Duration) -> Self {
        Retries {
            min,
            max,
            schedule: None,
        }
    }

    /// The wait before the next try, after one more failure.
    pub fn wait(&mut self) -> Duration {
        let (min, max) = (self.min, self.max);
        self.schedule
            .get_or_insert_with(|| exponential(min, max).build())
            .next()
            .unwrap_or(max)
    }

    /// A success: the next failure waits the shortest again.
    pub fn reset(&mut self) {
        self.schedule = None;
    }
}

/// Later and later, 1 s to 5 min, for ever: a question asked again until the answer changes.
pub fn retry_builder() -> backon::ExponentialBuilder {
    exponential(Duration::from_secs(1), Duration::from_secs(300))
}

/// The first retry of a reconcile that failed with an error that clears by itself.
pub const RECONCILE_RETRY_MIN: Duration = Duration::from_secs(1);
/// The longest wait between retries of an error that clears by itself.
pub const RECONCILE_RETRY_MAX: Duration = Duration::from_secs(60);
/// The first retry of a refusal (400, 403, 404, 422, not ours): usually only a change clears
/// it, but right after an API server restart a 403 can come while its authorizer catches up.
pub const RECONCILE_PERMANENT_MIN: Duration = Duration::from_secs(5);
/// The longest wait between retries of a refusal.
pub const RECONCILE_PERMANENT_MAX: Duration = Duration::from_secs(300);

/// A failed reconcile: doubling from 1 s to a minute, or from 5 s to 5 minutes for a
/// refusal, with jitter, for ever ([`crate::controller::backoff`] keeps one per rollout).
pub fn reconcile_builder(permanent: bool) -> backon::ExponentialBuilder {
    let (min, max) = if permanent {
        (RECONCILE_PERMANENT_MIN, RECONCILE_PERMANENT_MAX)
    } else {
        (RECONCILE_RETRY_MIN, RECONCILE_RETRY_MAX)
    };
    exponential(min, max)
}

/// The longest wait between two tries of a notification.
pub const NOTIFY_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// A notification that failed in a way that may clear: 1 s doubling to a minute, with
/// jitter, for ever (a receiver down for an hour hears everything when it is back).
pub fn notify_builder() -> backon::ExponentialBuilder {
    exponential(Duration::from_secs(1), NOTIFY_BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_grow_with_jitter_up_to_twice_the_cap_and_start_over_after_a_success() {
        let mut r = Retries::new(Duration::from_millis(100), Duration::from_secs(2));
        let waits: Vec<Duration> = (0..12).map(|_| r.wait()).collect();
        assert!(waits[0] <= Duration::from_millis(200), "{waits:?}");
        assert!(waits[5] > Duration::from_millis(800), "{waits:?}");
        assert!(
            waits.iter().all(|w| *w <= Duration::from_secs(4)),
            "{waits:?}"
        );
        r.reset();
        assert!(r.wait() <= Duration::from_millis(200));
    }
}
