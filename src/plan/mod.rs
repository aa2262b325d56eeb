//! Rollout decisions, as pure functions `(spec, observed, now) -> (status, actions)`. Nothing in
//! here does I/O or reads a clock; the controllers execute the actions.
//!
//! - [`observed`]: the plain views of the cluster the planners read;
//! - [`objects`]: the child objects a rollout wants (sets, handoff claims, Jobs);
//! - [`handoff`]: moving one replica's volume between two StatefulSets;
//! - [`statefulset`]: the CanaryStatefulSet phase machine;
//! - [`batch`] and [`deployment`]: the CanaryDeployment batch arithmetic and phase machine;
//! - [`analysis`]: metric arguments, CEL judgements, measurement records and run verdicts;
//! - [`actions`]: what a plan asks the controller to do;
//! - `machine`: the one driver of both phase machines ([`RolloutStatus`], `machine::plan`),
//!   and the condition helpers they share.

pub mod actions;
pub mod analysis;
pub mod batch;
pub mod deployment;
pub mod handoff;
mod machine;
pub mod objects;
pub mod observed;
pub mod statefulset;

pub use actions::{Action, PlanEvent};
#[cfg(test)]
pub(crate) use machine::carry_action_failure;
pub use machine::{
    ACTION_FAILED, ACTION_RETRYING, RolloutStatus, acting_value, mark_action_failed, set_condition,
};
pub use observed::Observed;
