//! Rollout decisions, as pure functions `(spec, observed, now) -> (status, actions)`. Nothing in
//! here does I/O or reads a clock; the controllers execute the actions.
//!
//! - [`observed`]: the plain views of the cluster the planners read;
//! - [`objects`]: the child objects a rollout wants (sets, handoff claims, Jobs);
//! - [`handoff`]: moving one replica's volume between two StatefulSets;
//! - [`statefulset`]: the CanaryStatefulSet phase machine;
//! - [`batch`] and [`deployment`]: the CanaryDeployment batch arithmetic and phase machine;
//! - [`analysis`]: metric arguments, CEL judgements, measurement records and run verdicts;
//! - [`config`]: the ConfigMap and Secret copies each version's pods mount (`versionedConfig`);
//! - [`traffic`]: the Services and HTTPRoute weights of a rollout with `trafficRouting`;
//! - [`actions`]: what a plan asks the controller to do;
//! - [`first_status`]: when a new rollout's first status is written;
//! - `machine`: the one driver of both phase machines ([`RolloutStatus`], `machine::plan`),
//!   and the condition helpers they share.

pub mod actions;
pub mod analysis;
pub mod approval;
pub mod batch;
pub mod compare;
pub mod config;
pub mod deployment;
pub mod first_status;
pub mod fleet;
pub mod handoff;
pub mod image_tags;
mod machine;
pub mod objects;
pub mod observed;
pub mod replica_map;
pub mod series;
pub mod statefulset;
pub mod traffic;
pub mod unmanaged;

pub use actions::{Action, PlanEvent};
pub use machine::{
    ACTION_FAILED, ACTION_RETRYING, RolloutStatus, acting_value, annotation_acts,
    mark_action_failed, set_condition,
};
pub use observed::Observed;

/// What a CanaryStatefulSet's message says while its canary waits for a person's promotion:
/// notifications read it to tell "waiting for approval".
pub const WAITING_FOR_PROMOTION: &str = "waiting for promotion";

/// Whether a rollout's spec in the cluster is the one the sync applied from Git, so that its
/// controller may act on it: `stamped` is its `rollouts.linnet.dev/spec-hash`, `from_git`
/// whether the sync applied it at all (linnet's applied-hash), `live` the hash of the spec as
/// it is. A rollout made with kubectl (not from Git) is acted on as it is; one from Git whose
/// stamp was taken off is not (issue 44: an edit in the cluster is never acted on).
pub fn spec_is_gits(stamped: Option<&str>, from_git: bool, live: &str) -> bool {
    match stamped {
        Some(stamped) => stamped == live,
        None => !from_git,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_spec_git_applied_is_acted_on() {
        assert!(spec_is_gits(Some("h1"), true, "h1"));
        assert!(
            !spec_is_gits(Some("h1"), true, "h2"),
            "edited in the cluster"
        );
        assert!(
            !spec_is_gits(None, true, "h1"),
            "applied from Git, stamp taken off"
        );
        assert!(
            spec_is_gits(None, false, "h1"),
            "made with kubectl: nothing to compare"
        );
    }
}
