//! Gives the memory a worker thread freed back to the system when the thread goes idle, and
//! sets how soon mimalloc gives back freed pages at all ([`tune_allocator`]).
//!
//! mimalloc keeps a thread's freed pages until that thread allocates again. An agent that
//! caught up after a restart went idle with the peak of its catch-up still resident (at 1,000
//! rollouts, 42 MiB of anonymous memory against 27 MiB a drift check later; bench/RESULTS.md).
//! So a worker collects its heap when it parks, once it has worked [`BUSY_BEFORE_COLLECT`]
//! since its last collection, and at most once per [`COLLECT_EVERY`]: a collection visits
//! every page of the thread's heap, so an idle agent, whose workers wake every second or two
//! for a moment, must not pay one at each wake. Blocking-pool threads (Git, parsing) are not
//! parked workers: theirs goes back when they exit, after tokio's 10 s idle keep-alive.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The least time between two collections by one worker.
pub const COLLECT_EVERY: Duration = Duration::from_secs(5);

/// The work (time unparked) a worker does between two collections: a burst (a sync, a
/// restart's catch-up) passes it at once; an idle agent's timers and Lease renewals in
/// minutes.
pub const BUSY_BEFORE_COLLECT: Duration = Duration::from_millis(100);

/// One worker thread's account.
#[derive(Clone, Copy, Debug, Default)]
struct Worker {
    unparked_at: Option<Instant>,
    busy: Duration,
    last_collect: Option<Instant>,
}

impl Worker {
    fn unparked(&mut self, now: Instant) {
        self.unparked_at = Some(now);
    }

    /// Whether to collect now, as the thread parks.
    fn parks(&mut self, now: Instant) -> bool {
        if let Some(at) = self.unparked_at.take() {
            self.busy += now.saturating_duration_since(at);
        }
        let spaced = self
            .last_collect
            .is_none_or(|at| now.saturating_duration_since(at) >= COLLECT_EVERY);
        let due = spaced && self.busy >= BUSY_BEFORE_COLLECT;
        if due {
            self.busy = Duration::ZERO;
            self.last_collect = Some(now);
        }
        due
    }
}

thread_local! {
    static WORKER: Cell<Worker> = Cell::new(Worker::default());
}

/// For tokio's `on_thread_unpark`.
pub fn on_worker_unpark() {
    WORKER.with(|w| {
        let mut worker = w.get();
        worker.unparked(Instant::now());
        w.set(worker);
    });
}

/// For tokio's `on_thread_park`: collects this thread's heap when it is due.
pub fn on_worker_park() {
    let due = WORKER.with(|w| {
        let mut worker = w.get();
        let due = worker.parks(Instant::now());
        w.set(worker);
        due
    });
    if due {
        collect_freed();
    }
}

/// mimalloc's delay before a freed page goes back to the system: 2 ms, not its 1 s. A burst
/// (a revision's parse, a first sync) is shorter than a second, so nothing it freed went back
/// before it ended and the pages it freed could not all be reused: reading the
/// repository-shape bombs of `tests/hostile.rs` peaked at 95–117 MiB (release build; 68 MiB
/// of it anonymous), at 2 ms at 52 (17). `MIMALLOC_PURGE_DELAY` in the environment still wins.
pub const PURGE_DELAY_MS: std::ffi::c_long = 2;

/// `mi_option_purge_delay` in the mimalloc (v3) that libmimalloc-sys builds, which does not
/// name it (`include/mimalloc.h`, `mi_option_e`; 15 in v2 too).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets mimalloc's options, before the first thread starts.
#[allow(unsafe_code)]
pub fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: takes no pointer; sets one word of mimalloc's option table, which it reads
    // atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
}

/// Frees this thread's empty pages and returns every arena's free memory to the system.
/// Also for a blocking-pool thread after a burst (reading a revision): its freed pages would
/// otherwise stay resident until it allocates again or exits (tokio keeps an idle one 10 s).
/// At mimalloc's 1 s purge delay this alone took the repository-shape bombs of
/// `tests/hostile.rs` from 95–117 MiB to 75–102 (release build).
#[allow(unsafe_code)]
pub fn collect_freed() {
    // SAFETY: mi_collect takes no pointer and only walks the calling thread's own heap and
    // the arenas' free lists, under mimalloc's locks; it is safe from any thread at any time,
    // also when mimalloc is not the global allocator (as in tests): then its heaps are empty.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_worker_collects_once_it_has_worked_and_not_again_within_the_interval() {
        let t0 = Instant::now();
        let mut w = Worker::default();
        w.unparked(t0);
        assert!(w.parks(t0 + ms(150)), "a burst of work, then idle: collect");
        w.unparked(t0 + ms(200));
        assert!(
            !w.parks(t0 + ms(400)),
            "worked again, but within the interval"
        );
        let later = t0 + ms(150) + COLLECT_EVERY;
        w.unparked(later);
        assert!(
            w.parks(later + ms(1)),
            "the work before counts once the interval has passed"
        );
    }

    #[test]
    fn an_idle_worker_that_wakes_for_a_moment_does_not_collect_at_each_wake() {
        let t0 = Instant::now();
        let mut w = Worker::default();
        let mut collections = 0;
        // One wake a second for a minute, 1 ms of work each.
        for s in 0..60 {
            let at = t0 + Duration::from_secs(s);
            w.unparked(at);
            collections += usize::from(w.parks(at + ms(1)));
        }
        assert_eq!(collections, 0);
    }

    #[test]
    fn a_park_without_an_unpark_counts_no_work() {
        let mut w = Worker::default();
        assert!(!w.parks(Instant::now()));
    }

    #[allow(unsafe_code)]
    #[test]
    fn the_purge_delay_is_mimallocs_option_15() {
        // SAFETY: reads one option; no pointer.
        let get = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(
                get(),
                1000,
                "v3's default purge delay: another option at 15?"
            );
        }
        tune_allocator();
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(get(), PURGE_DELAY_MS);
        }
    }

    #[test]
    fn parking_twice_in_a_row_is_harmless() {
        on_worker_unpark();
        on_worker_park();
        on_worker_park();
    }
}
