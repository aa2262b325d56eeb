//! The Git source: the only module that reads Git. It keeps a local mirror of the tracked
//! branch (git2) and learns of new revisions by polling, from Git host webhooks, or from local
//! file changes. Only files whose content changed are parsed again.

pub mod fleet;
pub mod git;
pub mod hooks;
pub mod local;
pub mod registry;
pub mod registry_auth;
pub mod registry_hooks;
pub mod snapshot;
pub mod verify;
pub mod webhook;
