//! The read ahead: the source's tip fetched and parsed before the first sync, while the
//! agent that holds its Lease (or runs without one) waits for its source claim (issue 77).

use std::sync::Arc;
use std::time::Instant;

use super::{History, Remote, RemoteTip, ask_remote, read_tip};
use crate::runtime::config::AgentConfig;
use crate::telemetry::Metrics;

/// The read ahead of a remote's tip, started when the mirror is opened.
pub struct ReadAhead(Option<tokio::task::JoinHandle<()>>);

impl ReadAhead {
    /// Starts it for a remote.
    pub fn start(remote: &Arc<Remote>, config: &AgentConfig, metrics: &Arc<Metrics>) -> Self {
        let task = tokio::spawn(read_ahead(remote.clone(), config.clone(), metrics.clone()));
        ReadAhead(Some(task))
    }

    /// None: a directory has nothing to fetch, and a standby would read for nothing.
    pub fn none() -> Self {
        ReadAhead(None)
    }

    /// Waits for it to end: the first look must not find the remote busy with it.
    pub async fn finished(self) {
        if let Some(read_ahead) = self.0 {
            let _ = read_ahead.await;
        }
    }
}

/// Fetches and reads the remote's tip before the first sync, while the agent waits for its
/// source claim to settle (2 s at the default claim duration): nothing is written to the
/// cluster or to Git, so it may run before the source is this agent's, and the first sync
/// then finds the tip fetched and parsed. A tip whose history the first look must report (a
/// rewrite, or one it cannot tell) is left unread for that look, and so is any failure: the
/// first look tries again and says why.
async fn read_ahead(remote: Arc<Remote>, config: AgentConfig, metrics: Arc<Metrics>) {
    let started = Instant::now();
    let asked = ask_remote(&remote, &config, None, None).await;
    metrics
        .fetch_duration
        .observe(started.elapsed().as_secs_f64());
    let outcome = match asked {
        Ok(RemoteTip::At(tip, None | Some(History::FastForward))) => {
            let span = tracing::info_span!("read_ahead", revision = %tip);
            read_tip(&remote, &config, tip, None, span)
                .await
                .map(|_| ())
        }
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => {
            tracing::debug!(took = ?started.elapsed(), "read the source ahead of the first sync")
        }
        Err(e) => {
            tracing::debug!(error = %e, "could not read the source ahead; the first sync looks again")
        }
    }
}
