//! Gives the memory a worker thread freed back to the system when the thread goes idle.
//!
//! mimalloc keeps a thread's freed pages until that thread allocates again. An agent that
//! caught up after a restart goes idle with the peak of its catch-up still resident (at 1,000
//! rollouts, 42 MiB of anonymous memory against 27 MiB a drift check later; bench/RESULTS.md),
//! so a worker collects its heap when it parks, at most once per [`COLLECT_EVERY`].

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The least time between two collections by one worker: an idle agent's workers wake every
/// few seconds (Lease renewals, timers), and a collection of an idle heap costs microseconds.
pub const COLLECT_EVERY: Duration = Duration::from_secs(5);

thread_local! {
    static LAST_COLLECT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// For tokio's `on_thread_park`: collects this thread's heap if it has not in
/// [`COLLECT_EVERY`].
pub fn on_worker_park() {
    let now = Instant::now();
    let due = LAST_COLLECT.with(|last| {
        let due = collect_due(last.get(), now);
        if due {
            last.set(Some(now));
        }
        due
    });
    if due {
        collect_freed();
    }
}

fn collect_due(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= COLLECT_EVERY)
}

/// Frees this thread's empty pages and returns every arena's free memory to the system.
#[allow(unsafe_code)]
fn collect_freed() {
    // SAFETY: mi_collect takes no pointer and only walks the calling thread's own heap and
    // the arenas' free lists, under mimalloc's locks; it is safe from any thread at any time,
    // also when mimalloc is not the global allocator (as in tests): then its heaps are empty.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_collects_at_its_first_park_and_then_at_most_once_per_interval() {
        let start = Instant::now();
        assert!(collect_due(None, start));
        assert!(!collect_due(Some(start), start + Duration::from_secs(1)));
        assert!(collect_due(Some(start), start + COLLECT_EVERY));
    }

    #[test]
    fn parking_twice_in_a_row_is_harmless() {
        on_worker_park();
        on_worker_park();
    }
}
