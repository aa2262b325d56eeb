//! The runtime layer: the agent's processes, each a task with its inputs and outputs named.
//! [`crate::agent`] wires them; what they decide is in `plan/`, `sync/`, `specs/` and
//! `writeback/`, which do no wiring of their own.
//!
//! - [`source_loop`]: wake-ups in, looks at the source ([`look`]) and syncs out;
//! - [`listeners`]: HTTP in (webhooks, probes, `/metrics`, `/status`), wake-ups out;
//! - [`holder`] and [`claim`]: one agent installation per source name, held by a Lease;
//! - [`lease`]: the Lease in, whether this replica acts out;
//! - [`shards`]: the shard Leases in (`--shards`), which rollouts this replica runs out;
//! - [`said`]: which persisting errors the log has said already;
//! - [`state`]: the source loop's state, read by the listeners and the LinnetSource object;
//! - [`spec_errors`]: error statuses for rollouts whose files have errors;
//! - [`source_object`]: that state published on the source's `LinnetSource` object;
//! - [`config`]: what the flags say;
//! - [`writer_slot`]: a Git writer's own clone, used off the async threads;
//! - [`supervise`]: every task above held by name (and those [`crate::liveness::spawn`]
//!   hands over); one that dies stops the agent.
//!
//! The controllers ([`crate::controller`]) and write-back ([`crate::writeback::run`],
//! [`crate::writeback::post_commit_statuses`]) are the other tasks; they take their kind's
//! [`crate::watch::rollouts::Rollouts`] (one watch and store per rollout kind, fanned out)
//! instead of watching rollouts themselves.

pub mod claim;
pub mod config;
pub mod dashboard;
pub mod fleet;
pub mod holder;
pub mod image_automation;
pub mod lease;
pub mod listeners;
pub mod look;
pub mod registry_backoff;
pub mod said;
pub mod shards;
pub mod source_loop;
pub mod source_object;
pub mod spec_errors;
pub mod state;
pub mod supervise;
pub mod writer_slot;

/// Resolves on SIGTERM or SIGINT, and marks the agent as shutting down
/// ([`supervise::shutting_down`]): its tasks may end now.
pub async fn shutdown_signal() {
    signal().await;
    supervise::shutting_down();
}

async fn signal() {
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
