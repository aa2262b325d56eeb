//! linnet's pure core: what a rollout is ([`api`]), what to do about it ([`plan`]), and what
//! everything shares ([`hash`], [`text`], [`sigv4`]). No Kubernetes client, no Git, no async runtime:
//! the agent crate (`linnet`) does every I/O and re-exports these modules, so
//! `linnet::plan` and `linnet_core::plan` are the same.

pub mod api;
pub mod hash;
pub mod plan;
pub mod sigv4;
pub mod text;
