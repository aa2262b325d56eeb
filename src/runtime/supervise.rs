//! The agent's long-running tasks, held by name. A task that ends or panics while the agent
//! is not shutting down ends the agent with an error naming it (exit status 2), so that
//! Kubernetes restarts it: before, task handles were dropped, and a task that died left a
//! process that did nothing and answered `/healthz` (issue 44).
//!
//! Tasks started deep inside a module (a watch, a receiver's queue) are handed over with
//! [`spawn`]: the agent's supervisor adopts them, so their end is a fault like any other's.
//!
//! For the tests, in a debug build only, `LINNET_TEST_PANIC_TASK=<name>` makes the task of
//! that name panic a second after it starts: the fault injected to see the agent stop.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::{Id, JoinSet};

use crate::Error;

/// Set once SIGTERM or SIGINT came: from then on a task ending is the shutdown, not a fault.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// Marks the agent as shutting down ([`super::shutdown_signal`] calls it).
pub fn shutting_down() {
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
}

type Adopted = (&'static str, BoxFuture<'static, ()>);

/// Where [`spawn`] hands tasks to the process's supervisor, once there is one.
static ADOPT: OnceLock<mpsc::UnboundedSender<Adopted>> = OnceLock::new();

/// Runs `task` as the task `name` under the process's supervisor, or on its own when there
/// is none (a command that is not the agent, a unit test).
pub fn spawn(name: &'static str, task: impl std::future::Future<Output = ()> + Send + 'static) {
    let task: BoxFuture<'static, ()> = Box::pin(task);
    let task = match ADOPT.get() {
        Some(adopt) => match adopt.send((name, task)) {
            Ok(()) => return,
            Err(mpsc::error::SendError((_, task))) => task,
        },
        None => task,
    };
    tokio::spawn(task);
}

/// The supervised tasks.
#[derive(Default)]
pub struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
    adopting: Option<mpsc::UnboundedReceiver<Adopted>>,
}

impl Tasks {
    /// The process's supervisor: also adopts the tasks handed to [`spawn`]. The first one made
    /// is (the agent makes one).
    pub fn supervisor() -> Tasks {
        let (tx, rx) = mpsc::unbounded_channel();
        let adopting = ADOPT.set(tx).is_ok().then_some(rx);
        Tasks {
            adopting,
            ..Tasks::default()
        }
    }

    /// Runs `task` as the task `name`.
    pub fn spawn(
        &mut self,
        name: &'static str,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let injected = cfg!(debug_assertions)
            && std::env::var("LINNET_TEST_PANIC_TASK").is_ok_and(|t| t == name);
        let handle = self.set.spawn(async move {
            if injected {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                panic!("fault injected by LINNET_TEST_PANIC_TASK");
            }
            task.await
        });
        self.names.insert(handle.id(), name);
    }

    /// Stops every task and waits until they have stopped.
    pub async fn stop_all(&mut self) {
        self.set.shutdown().await;
    }

    /// Waits until a task ends while the agent is not shutting down, and says which and how.
    /// Never resolves while every task runs (or once all ended in a shutdown).
    pub async fn first_fault(&mut self) -> Error {
        loop {
            let ended = tokio::select! {
                ended = self.set.join_next_with_id(), if !self.set.is_empty() => ended,
                Some((name, task)) = async {
                    match self.adopting.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    self.spawn(name, task);
                    continue;
                }
                else => return std::future::pending().await,
            };
            let Some(ended) = ended else {
                continue;
            };
            if SHUTTING_DOWN.load(Ordering::SeqCst) {
                continue;
            }
            let (id, how) = match ended {
                Ok((id, ())) => (id, "ended".to_string()),
                Err(e) => {
                    let id = e.id();
                    let how = if e.is_panic() {
                        let payload = e.into_panic();
                        let text = payload
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        format!("panicked: {text}")
                    } else {
                        "was cancelled".to_string()
                    };
                    (id, how)
                }
            };
            let task = self.names.get(&id).copied().unwrap_or("unnamed");
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
