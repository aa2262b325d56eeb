//! linnet: a GitOps rollout agent for Kubernetes.
//!
//! A Git repository holds canary specs. linnet follows it and keeps the cluster in line:
//!
//! ```text
//! Git host ─webhook/poll─▶ source ─▶ specs ─▶ sync (desired set, diff, server-side apply)
//!     ▲                                              │
//!     │                                              ▼
//!     └── writeback ◀── CR status ◀── controller ◀── plan (pure decisions)
//! ```
//!
//! - [`source`] is the only module that reads Git; [`writeback`] the only one that writes it.
//! - [`sync`] and [`controller`] are the only modules that talk to the cluster, with
//!   [`events`], through which both publish their Kubernetes events.
//! - [`plan`] makes every rollout decision, as pure functions of spec, observed state and time.

pub mod agent;
pub mod api;
pub mod cli;
pub mod controller;
pub mod error;
pub mod events;
pub mod hash;
pub mod inspect;
pub mod kube_client;
pub mod net;
pub mod plan;
pub mod runtime;
pub mod serve;
pub mod source;
pub mod specs;
pub mod sync;
pub mod telemetry;
pub mod text;
pub mod writeback;

pub use error::{Error, Result};
