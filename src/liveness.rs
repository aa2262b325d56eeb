//! Liveness that means something: each long-running loop beats each time it comes round (and
//! at least every [`IDLE_BEAT`] while it waits), and `/healthz` fails, naming the loop, when
//! one has not beaten within the deadline (`--liveness-deadline`). A loop that blocks (a
//! deadlocked lock, a call with no timeout) is this module's to notice; a task that ends is the
//! supervisor's (`runtime::supervise`), which also holds the tasks started inside modules with
//! [`spawn`]. The kubelet's liveness probe then restarts the agent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A task started inside a module, by name, for the supervisor to hold.
pub type Adopted = (&'static str, JoinHandle<()>);

/// Where [`spawn`] hands its tasks, once the supervisor asked for them.
static ADOPT: OnceLock<mpsc::UnboundedSender<Adopted>> = OnceLock::new();

/// The tasks [`spawn`] starts from now on, for the process's supervisor; `None` after the
/// first call (there is one supervisor).
pub fn adopt() -> Option<mpsc::UnboundedReceiver<Adopted>> {
    let (tx, rx) = mpsc::unbounded_channel();
    ADOPT.set(tx).is_ok().then_some(rx)
}

/// Starts `task` now, as the task `name`, and hands it to the process's supervisor if there
/// is one (its end is then a fault like any other task's). For the tests, in a debug build
/// only, `LINNET_TEST_PANIC_TASK=<name>` makes it panic a second after it starts.
pub fn spawn(name: &'static str, task: impl std::future::Future<Output = ()> + Send + 'static) {
    let handle = tokio::spawn(with_fault(name, task));
    if let Some(adopt) = ADOPT.get() {
        let _ = adopt.send((name, handle));
    }
}

/// `task`, made to panic a second after it starts when `LINNET_TEST_PANIC_TASK` names it (in
/// a debug build; a release build never reads the variable).
pub fn with_fault(
    name: &'static str,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let injected =
        cfg!(debug_assertions) && std::env::var("LINNET_TEST_PANIC_TASK").is_ok_and(|t| t == name);
    async move {
        if injected {
            tokio::time::sleep(Duration::from_secs(1)).await;
            panic!("fault injected by LINNET_TEST_PANIC_TASK");
        }
        task.await
    }
}

/// How often a waiting loop beats anyway (a timer tick, no request).
pub const IDLE_BEAT: Duration = Duration::from_secs(1);
/// The shortest deadline `--liveness-deadline` takes: a few idle beats.
pub const MIN_DEADLINE: Duration = Duration::from_secs(5);

/// The loops of a process, and how long each may go without a beat.
#[derive(Debug)]
pub struct Heartbeats {
    start: Instant,
    deadline: Duration,
    loops: Mutex<Vec<Arc<Beat>>>,
    works: Mutex<Vec<Arc<Work>>>,
}

/// Work that runs many pieces at once and has no loop of its own to beat (a controller's
/// reconciles, run by kube-runtime): each piece is watched from its start, and one still
/// running past the deadline (a deadlocked lock, a call with no timeout) is a hang.
#[derive(Debug)]
pub struct Work {
    name: String,
    start: Instant,
    next: AtomicU64,
    /// Each piece under way: what it is, and milliseconds from `start` to its start.
    running: Mutex<std::collections::HashMap<u64, (String, u64)>>,
}

/// A piece of [`Work`] under way; done when dropped.
#[derive(Debug)]
pub struct Running {
    work: Arc<Work>,
    id: u64,
}

impl Work {
    /// `what` starts now.
    pub fn begin(self: &Arc<Self>, what: impl Into<String>) -> Running {
        self.begin_at(what, Instant::now())
    }

    fn begin_at(self: &Arc<Self>, what: impl Into<String>, now: Instant) -> Running {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let at = now.saturating_duration_since(self.start).as_millis() as u64;
        if let Ok(mut running) = self.running.lock() {
            running.insert(id, (what.into(), at));
        }
        Running {
            work: self.clone(),
            id,
        }
    }

    /// The piece under way longest, and since when (milliseconds from `start`).
    fn oldest(&self) -> Option<(String, u64)> {
        let running = self.running.lock().ok()?;
        running.values().min_by_key(|(_, at)| *at).cloned()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut running) = self.work.running.lock() {
            running.remove(&self.id);
        }
    }
}

/// One loop's heartbeat.
#[derive(Debug)]
pub struct Beat {
    name: String,
    start: Instant,
    /// Milliseconds from `start` to the last beat.
    last: AtomicU64,
}

impl Beat {
    /// The loop came round.
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    /// The loop came round at `now`.
    pub fn beat_at(&self, now: Instant) {
        let ms = now
            .saturating_duration_since(self.start)
            .as_millis()
            .min(u128::from(u64::MAX)) as u64;
        self.last.fetch_max(ms, Ordering::Relaxed);
    }
}

/// A loop that missed its deadline.
#[derive(Debug, PartialEq)]
pub struct Missed {
    pub name: String,
    pub since: Duration,
}

impl Heartbeats {
    pub fn new(deadline: Duration) -> Heartbeats {
        Heartbeats {
            start: Instant::now(),
            deadline,
            loops: Mutex::new(Vec::new()),
            works: Mutex::new(Vec::new()),
        }
    }

    /// Work named `name` (its pieces named when they begin).
    pub fn register_work(&self, name: impl Into<String>) -> Arc<Work> {
        let work = Arc::new(Work {
            name: name.into(),
            start: self.start,
            next: AtomicU64::new(0),
            running: Mutex::new(Default::default()),
        });
        if let Ok(mut works) = self.works.lock() {
            works.retain(|w| Arc::strong_count(w) > 1);
            works.push(work.clone());
        }
        work
    }

    /// A loop named `name`, beating from now.
    pub fn register(&self, name: impl Into<String>) -> Arc<Beat> {
        let beat = Arc::new(Beat {
            name: name.into(),
            start: self.start,
            last: AtomicU64::new(0),
        });
        beat.beat();
        if let Ok(mut loops) = self.loops.lock() {
            // A loop that stopped (its task ended) is the supervisor's news, not this one's.
            loops.retain(|b| Arc::strong_count(b) > 1);
            loops.push(beat.clone());
        }
        beat
    }

    /// The loops that have not beaten within the deadline, at `now`.
    pub fn missed(&self, now: Instant) -> Vec<Missed> {
        let Ok(loops) = self.loops.lock() else {
            return Vec::new();
        };
        let at = now.saturating_duration_since(self.start);
        let mut missed: Vec<Missed> = loops
            .iter()
            // Dropped by its loop: not watched any more.
            .filter(|b| Arc::strong_count(b) > 1)
            .filter_map(|b| {
                let since =
                    at.saturating_sub(Duration::from_millis(b.last.load(Ordering::Relaxed)));
                (since > self.deadline).then(|| Missed {
                    name: b.name.clone(),
                    since,
                })
            })
            .collect();
        drop(loops);
        if let Ok(works) = self.works.lock() {
            for work in works.iter().filter(|w| Arc::strong_count(w) > 1) {
                let Some((what, started)) = work.oldest() else {
                    continue;
                };
                let since = at.saturating_sub(Duration::from_millis(started));
                if since > self.deadline {
                    missed.push(Missed {
                        name: format!("{} of {what}", work.name),
                        since,
                    });
                }
            }
        }
        missed
    }

    pub fn deadline(&self) -> Duration {
        self.deadline
    }
}

static PROCESS: OnceLock<Heartbeats> = OnceLock::new();

/// Sets the process's deadline; the first call wins (the agent makes it once, at start).
pub fn init(deadline: Duration) {
    let _ = PROCESS.set(Heartbeats::new(deadline));
}

/// The process's heartbeats (with the default deadline if [`init`] was not called).
pub fn process() -> &'static Heartbeats {
    PROCESS.get_or_init(|| Heartbeats::new(DEFAULT_DEADLINE))
}

/// The deadline when none is set: longer than any one step of a loop may take (a full sync
/// of 10,000 objects, a fetch within `--git-timeout`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);

/// For the tests: with `LINNET_TEST_HANG_TASK=<name>` in a debug build, the loop of that name
/// stops beating and blocks, as a deadlocked one would. Not in a release build.
pub async fn hang_if_asked(name: &str) {
    if cfg!(debug_assertions) && std::env::var("LINNET_TEST_HANG_TASK").is_ok_and(|t| t == name) {
        tracing::warn!(task = name, "hanging as LINNET_TEST_HANG_TASK asks");
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_that_stops_beating_is_named_after_the_deadline() {
        let beats = Heartbeats::new(Duration::from_secs(60));
        let source = beats.register("source loop");
        let notify = beats.register("notifications to chat");
        let t0 = Instant::now();
        assert!(beats.missed(t0 + Duration::from_secs(59)).is_empty());
        notify.beat_at(t0 + Duration::from_secs(30));
        let missed = beats.missed(t0 + Duration::from_secs(61));
        assert_eq!(missed.len(), 1, "{missed:?}");
        assert_eq!(missed[0].name, "source loop");
        source.beat();
        assert!(beats.missed(Instant::now()).is_empty());
    }

    #[test]
    fn a_reconcile_still_running_past_the_deadline_is_named() {
        // Issue 69: a controller's reconcile blocked for ever (a deadlocked lock) left a
        // healthy agent that reconciled nothing more.
        let beats = Heartbeats::new(Duration::from_secs(60));
        let reconciles = beats.register_work("reconcile");
        let t0 = Instant::now();
        let quick = reconciles.begin_at("CanaryStatefulSet/a/redis", t0);
        let stuck = reconciles.begin_at("CanaryDeployment/a/web", t0 + Duration::from_secs(1));
        drop(quick);
        assert!(beats.missed(t0 + Duration::from_secs(60)).is_empty());
        let missed = beats.missed(t0 + Duration::from_secs(62));
        assert_eq!(missed.len(), 1, "{missed:?}");
        assert_eq!(missed[0].name, "reconcile of CanaryDeployment/a/web");
        drop(stuck);
        assert!(beats.missed(t0 + Duration::from_secs(600)).is_empty());
    }

    #[test]
    fn a_loop_whose_task_ended_is_not_watched() {
        let beats = Heartbeats::new(Duration::from_secs(1));
        let gone = beats.register("gone");
        drop(gone);
        assert!(
            beats
                .missed(Instant::now() + Duration::from_secs(10))
                .is_empty()
        );
    }
}
