//! The desired-state engine: compares what Git wants with what linnet manages in the cluster,
//! and applies the difference with server-side apply under one field manager. When Git and
//! the cluster agree, a sync writes nothing. Pruning is opt-in, deletes only what the source's
//! inventory says it applied, and never deletes PersistentVolumeClaims or PersistentVolumes.
//!
//! [`desired`], [`diff`] and [`inventory`] are pure; [`apply`] does the cluster I/O.

pub mod apply;
pub mod desired;
pub mod diff;
pub mod edited;
pub mod inventory;
pub mod ownership;

pub use apply::{ApplyAs, SyncReport, Syncer};
pub use desired::{DesiredObject, desired_set};
pub use diff::{Change, PlannedChange, Prune, plan_changes};
pub use edited::EditedRollouts;

/// The field manager of every server-side apply linnet makes.
pub const FIELD_MANAGER: &str = crate::plan::config::SYNC_FIELD_MANAGER;
