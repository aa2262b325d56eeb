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
//! - [`render`] turns Kustomize overlays and Helm charts into objects, as hostile input.
//! - [`source`] is the only module that reads Git; [`writeback`] the only one that writes it.
//! - [`plan`] makes every rollout decision, as pure functions of spec, observed state and time:
//!   it and the CRD types ([`api`]) are the crate `linnet-core`, which has no Kubernetes
//!   client, Git or async runtime, and are re-exported here.
//! - The cluster is written by [`sync`] (Git's objects), [`controller`] (the rollouts'
//!   children and statuses), [`runtime`] (the Lease and the source's LinnetSource) and
//!   [`events`]; read also by [`watch`] (the shared stores) and [`inspect`] (`linnet get`).
//! - Imports run down the layers of docs/development.md; `tests/layers.rs` checks them.

pub mod agent;
pub mod cli;
pub mod controller;
pub mod error;
pub mod events;
pub mod inspect;
pub mod kube_client;
pub mod liveness;
pub mod net;
pub mod notify;
pub mod render;
pub mod retry;
pub mod runtime;
pub mod serve;
pub mod source;
pub mod specs;
pub mod sync;
pub mod telemetry;
pub mod watch;
pub mod writeback;

pub use error::{Error, Result};
pub use linnet_core::{api, hash, plan, sigv4, text};
