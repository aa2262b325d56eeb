//! What wakes the source loop: the poll timer, a verified webhook, a local file change, the
//! drift timer, a rollout edited in the cluster, the shutdown; and an idle beat that only
//! tells the liveness check the loop is not stuck.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::source::hooks::WakeReceiver;

/// Why the loop looks at the source now.
#[derive(Default)]
pub(super) struct Trigger {
    /// The commit a webhook announced, if any: when it is not the one fetched last, the
    /// fetch goes ahead without first asking the remote for its tip (one round trip less).
    pub announced: Option<String>,
    /// The drift timer: the last synced specs are compared in full even if Git did not move.
    pub drift_due: bool,
    /// A controller found a rollout edited in the cluster: Git's spec goes back.
    pub edited_due: bool,
}

pub(super) enum Woken {
    Step(Trigger),
    /// Only the idle beat: nothing to do.
    Idle,
    Shutdown,
}

pub(super) struct Wakers {
    /// When the remote is looked at next: kept across the idle beats.
    pub poll_at: tokio::time::Instant,
    wakes: WakeReceiver,
    changes: mpsc::Receiver<()>,
    /// Drift is looked for on this timer, whether or not Git moved.
    drift_check: tokio::time::Interval,
    idle_beat: tokio::time::Interval,
    edited: Arc<crate::sync::EditedRollouts>,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Wakers {
    /// Wakers for a loop that looks for drift every `drift_interval` and stops when
    /// `shutdown` resolves (the process's signal, [`crate::runtime::shutdown_signal`]).
    pub fn new(
        drift_interval: std::time::Duration,
        wakes: WakeReceiver,
        changes: mpsc::Receiver<()>,
        edited: Arc<crate::sync::EditedRollouts>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Wakers {
        let mut drift_check = tokio::time::interval(drift_interval);
        drift_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        drift_check.reset();
        let mut idle_beat = tokio::time::interval(crate::liveness::IDLE_BEAT);
        idle_beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Wakers {
            poll_at: tokio::time::Instant::now(),
            wakes,
            changes,
            drift_check,
            idle_beat,
            edited,
            shutdown: Box::pin(shutdown),
        }
    }

    /// Waits for the next reason to look, recording it on the step's span (and making the
    /// step the child of the webhook that woke it).
    pub async fn next(&mut self, step: &tracing::Span) -> Woken {
        let mut trigger = Trigger::default();
        tokio::select! {
            _ = tokio::time::sleep_until(self.poll_at) => {
                step.record("trigger", "poll");
                tracing::debug!("poll");
            }
            Some(wake) = self.wakes.next() => {
                step.record("trigger", "webhook");
                if let Some(parent) = &wake.parent {
                    parent.adopt(step);
                }
                trigger.announced = wake.after;
                match (wake.host, &trigger.announced) {
                    (Some(host), _) => tracing::info!(host = host.name(), after = ?trigger.announced, "woken by webhook"),
                    (None, Some(after)) => tracing::info!(%after, "woken by this agent's own commit (image automation)"),
                    (None, None) => tracing::info!("webhook callers were turned away (busy); looking at the remote in case one was a push"),
                }
            }
            Some(()) = self.changes.recv() => {
                step.record("trigger", "disk");
                tracing::info!("files changed on disk");
            }
            _ = self.drift_check.tick() => {
                step.record("trigger", "drift");
                tracing::debug!("drift interval: comparing every object with the cluster");
                trigger.drift_due = true;
            }
            _ = self.edited.notified() => {
                step.record("trigger", "edited");
                tracing::info!("a rollout was edited in the cluster: putting Git's spec back");
                trigger.edited_due = true;
            }
            _ = &mut self.shutdown => {
                tracing::info!("shutting down");
                return Woken::Shutdown;
            }
            _ = self.idle_beat.tick() => return Woken::Idle,
        }
        Woken::Step(trigger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::hooks::{Wake, wake_channel};
    use std::time::Duration;
    use tokio::time::Instant;

    const DRIFT: Duration = Duration::from_secs(180);

    struct Loop {
        wakers: Wakers,
        waker: crate::source::hooks::Waker,
        edited: Arc<crate::sync::EditedRollouts>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        _changes: mpsc::Sender<()>,
    }

    fn source_loop() -> Loop {
        let (waker, wakes) = wake_channel();
        let (changes_tx, changes) = mpsc::channel(1);
        let edited = Arc::new(crate::sync::EditedRollouts::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let wakers = Wakers::new(DRIFT, wakes, changes, edited.clone(), async {
            let _ = stopped.await;
        });
        Loop {
            wakers,
            waker,
            edited,
            stop: Some(stop),
            _changes: changes_tx,
        }
    }

    /// The next wake that is not only the idle beat.
    async fn next_step(l: &mut Loop) -> Woken {
        loop {
            match l.wakers.next(&tracing::Span::none()).await {
                Woken::Idle => continue,
                woken => return woken,
            }
        }
    }

    /// What woke the loop, and when, up to `until` on the (paused) clock; the poll is put
    /// off by `poll_every` after each look, as the source loop does.
    async fn steps(l: &mut Loop, until: Duration, poll_every: Duration) -> Vec<(Duration, String)> {
        let start = Instant::now();
        let mut seen = Vec::new();
        while start.elapsed() < until {
            let woken = l.wakers.next(&tracing::Span::none()).await;
            let what = match woken {
                Woken::Idle => continue,
                Woken::Shutdown => "shutdown".to_string(),
                Woken::Step(t) if t.drift_due => "drift".to_string(),
                Woken::Step(t) if t.edited_due => "edited".to_string(),
                Woken::Step(t) => match t.announced {
                    Some(tip) => format!("webhook {tip}"),
                    None => "poll".to_string(),
                },
            };
            let stop = what == "shutdown";
            seen.push((start.elapsed(), what));
            if stop {
                break;
            }
            l.wakers.poll_at = Instant::now() + poll_every;
        }
        seen
    }

    // On tokio's paused clock (issue 71): seven minutes of timers in no wall-clock time.
    #[tokio::test(start_paused = true)]
    async fn the_poll_and_the_drift_check_come_on_their_own_timers() {
        let mut l = source_loop();
        let seen = steps(&mut l, Duration::from_secs(420), Duration::from_secs(60)).await;
        let at = |what: &str| -> Vec<u64> {
            seen.iter()
                .filter(|(_, w)| w == what)
                .map(|(t, _)| t.as_secs())
                .collect()
        };
        assert_eq!(at("poll")[..3], [0, 60, 120], "{seen:?}");
        // Every drift interval, not moved by the polls between.
        assert_eq!(at("drift"), [180, 360], "{seen:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_webhook_an_edit_and_the_shutdown_wake_the_loop_at_once() {
        let mut l = source_loop();
        // The first look, at once; the next poll a minute away.
        let first = next_step(&mut l).await;
        assert!(matches!(first, Woken::Step(t) if t.announced.is_none() && !t.drift_due));
        l.wakers.poll_at = Instant::now() + Duration::from_secs(60);
        l.waker.wake(Wake {
            host: None,
            after: Some("abc".into()),
            parent: None,
        });
        let woken = next_step(&mut l).await;
        assert!(
            matches!(&woken, Woken::Step(t) if t.announced.as_deref() == Some("abc")),
            "a webhook with its tip"
        );
        l.edited.found(crate::specs::ObjectKey::new(
            "rollouts.linnet.dev/v1alpha1",
            "CanaryStatefulSet",
            "ns",
            "redis",
        ));
        let before = Instant::now();
        let woken = next_step(&mut l).await;
        assert!(matches!(woken, Woken::Step(t) if t.edited_due));
        assert_eq!(before.elapsed(), Duration::ZERO, "not on a timer");
        if let Some(stop) = l.stop.take() {
            let _ = stop.send(());
        }
        let woken = next_step(&mut l).await;
        assert!(matches!(woken, Woken::Shutdown));
    }
}
