//! The kube-runtime controllers for `CanaryStatefulSet` and `CanaryDeployment`: they observe the
//! cluster, ask [`crate::plan`] what to do, execute the actions and record status and events.

/// The default for `--max-concurrent-reconciles`, measured at 1,000 rollouts (bench/RESULTS.md).
/// A reconcile waits on a few requests in turn, so under a busy API server this limit sets the
/// pace of a first sync: 16 made it 40 s, 32 makes it 27 s. 64 was no faster (the sync's own
/// applies then waited) and unbounded held more memory after a restart.
pub const MAX_CONCURRENT_RECONCILES: u16 = 32;

pub mod analysis;
pub mod backoff;
pub mod config_copies;
pub mod context;
pub mod deployment;
pub mod execute;
pub mod fleet;
pub mod own_writes;
pub mod reconcile;
pub mod rollout_kind;
pub mod shards;
pub mod source_account;
pub mod statefulset;
pub mod traffic;
pub mod unmanaged;

pub use context::{Context, SharedImageOrigins};
pub mod error;
pub mod status_write;
pub mod wakes;
pub mod wiring;

pub(crate) use error::Doing;
pub use error::ReconcileError;
pub(crate) use status_write::{
    OwnStatusWrites, StatusWrite, show_action_failure, status_write_pending, write_status,
};
pub(crate) use wakes::{foreign_child, seen_own_writes, wakes};
