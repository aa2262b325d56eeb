//! The agent's long-running tasks, held by name. A task that ends or panics while the agent
//! is not shutting down ends the agent with an error naming it (exit status 2), so that
//! Kubernetes restarts it: before, task handles were dropped, and a task that died left a
//! process that did nothing and answered `/healthz` (issue 44).
//!
//! For the tests, `LINNET_TEST_PANIC_TASK=<name>` makes the task of that name panic a second
//! after it starts: the fault injected to see the agent stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::task::{Id, JoinSet};

use crate::Error;

/// Set once SIGTERM or SIGINT came: from then on a task ending is the shutdown, not a fault.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// Marks the agent as shutting down ([`super::shutdown_signal`] calls it).
pub fn shutting_down() {
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
}

/// The supervised tasks.
#[derive(Default)]
pub struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

impl Tasks {
    /// Runs `task` as the task `name`.
    pub fn spawn(
        &mut self,
        name: &'static str,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let injected = std::env::var("LINNET_TEST_PANIC_TASK").is_ok_and(|t| t == name);
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
            let Some(ended) = self.set.join_next_with_id().await else {
                return std::future::pending().await;
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
