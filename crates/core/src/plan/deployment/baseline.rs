//! Baseline pods (`strategy.baseline`): the stable version's pods started beside each batch's
//! new ones, as many, in `<name>-baseline`, so an analysis compares pods of one age; deleted
//! once the rollout is no longer under way.

use super::*;

/// The [`VERSION_LABEL`] of a baseline's pods (`strategy.baseline`).
pub const BASELINE_VERSION: &str = "baseline";

/// The name of a rollout's baseline Deployment: `<name>-baseline`, never a version's name
/// (those end in 8 hex digits).
pub fn baseline_name(rollout: &str) -> String {
    format!("{rollout}-{BASELINE_VERSION}")
}

/// Whether the spec asks for baseline pods: `strategy.baseline` on a batched rollout.
pub fn baseline_wanted(spec: &CanaryDeploymentSpec) -> bool {
    spec.strategy.baseline && spec.strategy.type_ == Strategy::Batches
}

impl<'a> Planner<'a> {
    /// Asks for the baseline at `t` replicas of the stable image, when the spec wants one.
    /// Returns what it still waits for: its pods not yet available.
    pub(super) fn baseline_for(&mut self, t: i32) -> Option<String> {
        if !baseline_wanted(self.spec()) {
            return None;
        }
        let (name, image) = (baseline_name(self.name()), self.stable_image());
        let observed = self.ensure(&name, &image, t);
        let available = observed.map_or(0, |d| d.available.min(t));
        (!self.baseline_ready(t))
            .then(|| format!("baseline: {available}/{t} replica(s) on {image} available"))
    }

    /// Whether the baseline is what batch target `t` needs, or none is wanted: `t` pods of
    /// the stable image, all of its current template (not a template it is leaving).
    pub(super) fn baseline_ready(&self, t: i32) -> bool {
        if !baseline_wanted(self.spec()) {
            return true;
        }
        let stable = self.stable_image();
        self.o.baseline.as_ref().is_some_and(|d| {
            d.status_fresh
                && d.image.as_deref() == Some(stable.as_str())
                && d.available >= t
                && d.updated >= t
        })
    }

    /// Whether the rollout is under way with a baseline it asks for: its pods stay, and the
    /// routes (with traffic routing) weigh them.
    pub(super) fn baseline_under_way(&self) -> bool {
        matches!(self.st.phase, Some(Phase::Progressing | Phase::Paused))
            && self.st.current_batch.is_some()
            && baseline_wanted(self.spec())
    }

    /// Deletes the baseline, before anything else, unless the rollout is under way with one:
    /// a rollout that ended, rolled back, or no longer asks for one. With traffic routing,
    /// only once no route gives its Service requests and the gateway had the settle time.
    pub(super) fn retire_baseline(&mut self) {
        let Some(baseline) = self.o.baseline.as_ref() else {
            return;
        };
        if self.baseline_under_way() || self.baseline_routed() {
            return;
        }
        let delete = Action::DeleteDeployment {
            name: baseline.name.clone(),
        };
        // First: its pods are extra, and a rollback's scale-up of the old version should not
        // come on top of them.
        if !self.actions.contains(&delete) {
            self.actions.insert(0, delete);
        }
    }

    /// Whether the routes may still send the baseline requests: a route (as observed before
    /// this plan's writes) gives its Service a share, the gateway has not accepted the routes
    /// as they are, or their last change (the baseline's share counts) is younger than the
    /// settle time (then a recheck is asked for). Runs after the plan recorded the routes.
    fn baseline_routed(&mut self) -> bool {
        let Some(routing) = self.r.spec.traffic_routing.as_deref() else {
            return false;
        };
        let name = self.name();
        let (stable, canary) = (
            crate::api::stable_service_name(name),
            crate::api::canary_service_name(name),
        );
        let weighed = self.o.traffic.routes.iter().any(|r| {
            crate::plan::traffic::baseline_weight(&r.rules, &stable, &canary).unwrap_or(0) > 0
        });
        if weighed {
            return true;
        }
        if self.o.traffic.routes.is_empty() {
            // No route of the rollout's is there to send it anything.
            return false;
        }
        use crate::plan::traffic::TrafficRecord as _;
        let Some(since) = self.st.recorded().since else {
            // Not accepted as they are yet: the settle time has not begun.
            return true;
        };
        match crate::plan::traffic::settle_left(routing, Some(since), self.now) {
            Some(left) => {
                let after = left + std::time::Duration::from_millis(100);
                self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
                true
            }
            None => false,
        }
    }
}
