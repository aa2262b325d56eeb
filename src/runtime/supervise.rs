//! The agent's long-running tasks, held by name. A task that ends or panics while the agent
//! is not shutting down ends the agent with an error naming it (exit status 2), so that
//! Kubernetes restarts it: before, task handles were dropped, and a task that died left a
//! process that did nothing and answered `/healthz` (issue 44).
//!
//! Tasks started deep inside a module (a watch, a receiver's queue) with
//! [`crate::liveness::spawn`] run at once and are handed here: their end is a fault like any
//! other's.
//!
//! For the tests, in a debug build only, `LINNET_TEST_PANIC_TASK=<name>` makes the task of
//! that name panic a second after it starts: the fault injected to see the agent stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, Id, JoinError, JoinSet};

use crate::Error;
use crate::liveness::Adopted;

/// Set once SIGTERM or SIGINT came: from then on a task ending is the shutdown, not a fault.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// Marks the agent as shutting down ([`super::shutdown_signal`] calls it).
pub fn shutting_down() {
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
}

type Ended = (&'static str, Result<(), JoinError>);

/// The supervised tasks.
#[derive(Default)]
pub struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
    /// Where [`crate::liveness::spawn`] hands its tasks (the process's supervisor only).
    adopting: Option<mpsc::UnboundedReceiver<Adopted>>,
    adopted: FuturesUnordered<BoxFuture<'static, Ended>>,
    adopted_aborts: Vec<AbortHandle>,
}

impl Tasks {
    /// The process's supervisor: also holds the tasks [`crate::liveness::spawn`] starts from
    /// now on. The first one made is (the agent makes one).
    pub fn supervisor() -> Tasks {
        Tasks {
            adopting: crate::liveness::adopt(),
            ..Tasks::default()
        }
    }

    /// Runs `task` as the task `name`.
    pub fn spawn(
        &mut self,
        name: &'static str,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let handle = self.set.spawn(crate::liveness::with_fault(name, task));
        self.names.insert(handle.id(), name);
    }

    fn hold(&mut self, (name, handle): Adopted) {
        self.adopted_aborts.push(handle.abort_handle());
        self.adopted
            .push(Box::pin(async move { (name, handle.await) }));
    }

    /// Stops every task and waits until they have stopped.
    pub async fn stop_all(&mut self) {
        for a in self.adopted_aborts.drain(..) {
            a.abort();
        }
        self.set.shutdown().await;
    }

    /// Waits until a task ends while the agent is not shutting down, and says which and how.
    /// Never resolves while every task runs (or once all ended in a shutdown).
    pub async fn first_fault(&mut self) -> Error {
        loop {
            let (task, ended): (&'static str, Result<(), JoinError>) = tokio::select! {
                Some(ended) = self.set.join_next_with_id(), if !self.set.is_empty() => {
                    match ended {
                        Ok((id, ())) => (self.names.get(&id).copied().unwrap_or("unnamed"), Ok(())),
                        Err(e) => (self.names.get(&e.id()).copied().unwrap_or("unnamed"), Err(e)),
                    }
                }
                Some(ended) = self.adopted.next(), if !self.adopted.is_empty() => ended,
                Some(adopted) = async {
                    match self.adopting.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    self.hold(adopted);
                    continue;
                }
                else => return std::future::pending().await,
            };
            if SHUTTING_DOWN.load(Ordering::SeqCst) {
                continue;
            }
            let how = match ended {
                Ok(()) => "ended".to_string(),
                Err(e) if e.is_panic() => {
                    let payload = e.into_panic();
                    let text = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    format!("panicked: {text}")
                }
                Err(_) => "was cancelled".to_string(),
            };
            return Error::TaskEnded { task, how };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_is_named() {
        let mut tasks = Tasks::default();
        tasks.spawn("forever", std::future::pending());
        tasks.spawn("writeback", async { panic!("boom") });
        let e = tokio::time::timeout(std::time::Duration::from_secs(5), tasks.first_fault()).await;
        let Ok(Error::TaskEnded { task, how }) = e else {
            panic!("no fault reported: {e:?}");
        };
        assert_eq!(task, "writeback");
        assert!(how.contains("boom"), "{how}");
    }

    #[tokio::test]
    async fn a_task_that_returns_is_a_fault_too() {
        let mut tasks = Tasks::default();
        tasks.spawn("rollout watch", async {});
        let e = tokio::time::timeout(std::time::Duration::from_secs(5), tasks.first_fault()).await;
        assert!(
            matches!(
                e,
                Ok(Error::TaskEnded {
                    task: "rollout watch",
                    ..
                })
            ),
            "{e:?}"
        );
    }
}
