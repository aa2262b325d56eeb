//! The fleet loop (issue 73, `--fleet`): reads the Fleet and every cluster's status files
//! from Git ([`crate::source::fleet`]) at each poll interval and at each webhook (a push to
//! the followed branch or to the status branch), and hands each new snapshot to the
//! controllers, which hold or start this cluster's rollouts by it
//! ([`crate::controller::fleet`]). Nothing here talks to another cluster.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::plan::fleet::FleetSnapshot;
use crate::source::fleet::{FleetConfig, FleetReader};
use crate::source::hooks::WakeReceiver;

/// Reads the fleet until the agent stops; never ends on a Git error (it says it once and
/// tries again at the next interval or webhook, and the last snapshot stays in force).
pub async fn run(
    config: FleetConfig,
    interval: Duration,
    state: Arc<super::state::AgentState>,
    mut wakes: WakeReceiver,
    metrics: Arc<crate::telemetry::Metrics>,
) {
    let heartbeat = crate::liveness::process().register("fleet");
    let mut reader: Option<FleetReader> = None;
    let mut said: Option<String> = None;
    // Said at the first read, then whenever the Fleet's problem changes.
    let mut problem_said: Option<Option<String>> = None;
    // A failed read is tried again soon (not only at the next poll, which may be an hour
    // away with webhooks), later and later up to the poll interval.
    let mut retries = crate::retry::Retries::new(Duration::from_secs(1), interval);
    loop {
        let mut wait = interval;
        heartbeat.beat();
        let (cfg, taken) = (config.clone(), reader.take());
        let read = tokio::task::spawn_blocking(move || {
            let mut r = match taken {
                Some(r) => r,
                None => FleetReader::open(&cfg)?,
            };
            let snapshot = r.read(cfg.timeout)?;
            Ok::<_, crate::source::git::GitError>((r, snapshot))
        });
        // Each network call gives up at --git-timeout; two of them, and the reads.
        match tokio::time::timeout(config.timeout * 3, read).await {
            Ok(Ok(Ok((r, None)))) => {
                count(&metrics, "unchanged");
                retries.reset();
                reader = Some(r);
                said = None;
            }
            Ok(Ok(Ok((r, Some(snapshot))))) => {
                count(&metrics, "read");
                retries.reset();
                metrics.fleet.clusters.set(snapshot.clusters.len() as i64);
                reader = Some(r);
                said = None;
                if problem_said.as_ref() != Some(&snapshot.problem) {
                    match &snapshot.problem {
                        Some(p) => {
                            tracing::warn!(problem = %p, "the Fleet cannot be read; every new image waits until it is fixed")
                        }
                        None => {
                            tracing::info!(fleet = %snapshot.name, clusters = snapshot.clusters.len(), "fleet read from Git")
                        }
                    }
                    problem_said = Some(snapshot.problem.clone());
                }
                tracing::debug!(clusters = snapshot.clusters.len(), reports = ?snapshot.reports, "fleet read");
                publish(&state.fleet, snapshot);
            }
            outcome => {
                count(&metrics, "error");
                wait = retries.wait().min(interval);
                let why = match outcome {
                    Ok(Ok(Err(e))) => crate::text::redact_credentials(&e.to_string()),
                    Ok(Err(e)) => format!("the read stopped: {e}"),
                    _ => format!("no answer within {:?}", config.timeout * 3),
                };
                if said.as_ref() != Some(&why) {
                    tracing::warn!(error = %why, "cannot read the fleet from Git; the last read stays in force, trying again");
                    said = Some(why);
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            wake = wakes.next() => {
                if wake.is_none() {
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// Sends `snapshot` when it differs from the last: an unchanged read wakes no rollout.
fn publish(snapshots: &watch::Sender<Option<Arc<FleetSnapshot>>>, snapshot: FleetSnapshot) {
    snapshots.send_if_modified(|last| {
        if last.as_deref() == Some(&snapshot) {
            return false;
        }
        *last = Some(Arc::new(snapshot));
        true
    });
}

fn count(metrics: &crate::telemetry::Metrics, result: &str) {
    metrics
        .fleet
        .reads
        .get_or_create(&crate::telemetry::ResultLabel {
            result: result.into(),
        })
        .inc();
}
