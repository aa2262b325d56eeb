//! What wakes the source loop: the poll timer, a verified webhook, a local file change, the
//! drift timer, a rollout edited in the cluster, the shutdown; and an idle beat that only
//! tells the liveness check the loop is not stuck.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::runtime::config::AgentConfig;
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
    pub fn new(
        config: &AgentConfig,
        wakes: WakeReceiver,
        changes: mpsc::Receiver<()>,
        edited: Arc<crate::sync::EditedRollouts>,
    ) -> Wakers {
        let mut drift_check = tokio::time::interval(config.drift_interval);
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
            shutdown: Box::pin(crate::runtime::shutdown_signal()),
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
                match wake.host {
                    Some(host) => tracing::info!(host = host.name(), after = ?trigger.announced, "woken by webhook"),
                    None => tracing::info!("webhook callers were turned away (busy); looking at the remote in case one was a push"),
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
