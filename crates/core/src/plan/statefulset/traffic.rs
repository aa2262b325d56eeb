//! Traffic routing for a CanaryStatefulSet: which pods each Service selects, the weight each
//! phase asks of the routes, and moving the routes when the plan finishes.

use std::collections::BTreeMap;

use super::*;
use crate::api::{ROLE_LABEL, ROLLOUT_LABEL};
use crate::plan::traffic::{
    Sides, TrafficRecord as _, TrafficStep, Want, step_weight, traffic_step,
};

/// The label the StatefulSet controller puts on each pod with the revision it runs.
const REVISION_LABEL: &str = "controller-revision-hash";

impl<'a> Planner<'a> {
    /// The stable and canary pods: the two sets' (TwoSets), or the single set's pods of its
    /// current and update revisions (Partition). The canary Service keeps selecting the update
    /// revision once it is current, so a promotion never leaves the side at 100 % empty.
    pub(super) fn sides(&self) -> Sides {
        let pods = |role: Role| {
            BTreeMap::from([
                (ROLLOUT_LABEL.to_string(), self.r.reference.name.clone()),
                (ROLE_LABEL.to_string(), role.label().to_string()),
            ])
        };
        if self.two_sets() {
            return Sides {
                stable: pods(Role::Stable),
                canary: pods(Role::Canary),
                baseline: None,
                baseline_service: false,
            };
        }
        let set = self.o.stable.as_ref();
        let of = |revision: Option<&String>| {
            let mut labels = pods(Role::Single);
            // No revision known yet: nothing but linnet's set runs there, so select no pod.
            let revision = revision.map_or("none", String::as_str);
            labels.insert(REVISION_LABEL.to_string(), revision.to_string());
            labels
        };
        Sides {
            stable: of(set.and_then(|s| s.current_revision.as_ref())),
            canary: of(set.and_then(|s| s.update_revision.as_ref())),
            baseline: None,
            baseline_service: false,
        }
    }

    /// What step `i` asks of the routes once its canary pods are Ready.
    pub(super) fn step_want(&self, i: usize) -> Want {
        let Some(routing) = self.spec().traffic_routing.as_deref() else {
            return Want::stable();
        };
        let n = self.size(i);
        Want {
            weight: step_weight(routing, i, n, self.replicas()),
            header: true,
            canary_endpoints: n,
            settle: false,
        }
    }

    /// What the step before the current one asked (the canary it left serving), or nothing.
    pub(super) fn previous_want(&self) -> Want {
        match self.step_index() {
            0 => Want::stable(),
            i => self.step_want(i - 1),
        }
    }

    /// Asks the routes for `want`: what they are not yet at (None without traffic routing,
    /// or when every route is there, accepted by its gateway, and settled if `want` says so).
    pub(super) fn traffic_at(&mut self, want: Want) -> Option<String> {
        self.r.spec.traffic_routing.as_deref()?;
        self.want = Some(want);
        let step = self.traffic_step(want)?;
        if let Some(after) = step.recheck_after {
            self.timer(after);
        }
        step.waiting
    }

    fn traffic_step(&self, want: Want) -> Option<TrafficStep> {
        let routing = self.r.spec.traffic_routing.as_deref()?;
        let recorded = self.st.recorded();
        Some(traffic_step(
            &self.r.reference,
            "CanaryStatefulSet",
            routing,
            &self.sides(),
            want,
            &self.o.traffic,
            recorded,
            self.now,
        ))
    }

    /// Moves the routes to what the phase the plan stopped in asked for (or, where it asked
    /// nothing, to what the phase serves), replacing traffic actions of phases left behind.
    pub(super) fn settle_traffic(&mut self) {
        let want = self.want.unwrap_or_else(|| match self.st.phase {
            Some(Phase::ScalingDownStable | Phase::DeployingCanary) => self.previous_want(),
            Some(Phase::CanaryActive | Phase::AwaitingMigration | Phase::MigratingData) => {
                self.step_want(self.step_index())
            }
            _ => Want::stable(),
        });
        let step = self.traffic_step(want);
        crate::plan::traffic::settle(&mut self.actions, &mut self.st, step);
    }
}
