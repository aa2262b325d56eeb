//! Traffic routing for a batched CanaryDeployment: which version's pods each Service selects,
//! the weight each batch asks of the routes, and moving the routes when the plan finishes.

use std::collections::BTreeMap;

use super::*;
use crate::plan::traffic::service_switch::{self, SideReady, Switched};
use crate::plan::traffic::{
    Recorded, Sides, TrafficRecord as _, TrafficStep, Want, step_weight, traffic_step,
};

impl<'a> Planner<'a> {
    /// The pods of the version running `image`: its Deployment's version label.
    fn version_pods(&self, image: &str) -> BTreeMap<String, String> {
        let name = self
            .o
            .deployments
            .iter()
            .filter(|d| d.image.as_deref() == Some(image))
            .max_by_key(|d| (d.replicas, d.available))
            .map_or_else(|| self.version_for(image), |d| d.name.clone());
        let prefix = format!("{}-", self.name());
        let version = name
            .strip_prefix(&prefix)
            .unwrap_or(service_switch::UNVERSIONED);
        BTreeMap::from([
            (ROLLOUT_LABEL.to_string(), self.name().to_string()),
            (VERSION_LABEL.to_string(), version.to_string()),
        ])
    }

    /// The stable Service selects the version that serves (the one a rollback returns to),
    /// the canary Service the one being rolled out.
    pub(super) fn sides(&self) -> Sides {
        let (stable, canary) = match &self.st.rollback {
            Some(r) if self.st.phase == Some(Phase::RollingBack) => {
                (r.to_image.clone(), r.from_image.clone())
            }
            _ => (self.stable_image(), self.canary_image()),
        };
        Sides {
            stable: self.version_pods(&stable),
            canary: self.version_pods(&canary),
            baseline: self.baseline_under_way().then(|| {
                BTreeMap::from([
                    (ROLLOUT_LABEL.to_string(), self.name().to_string()),
                    (VERSION_LABEL.to_string(), BASELINE_VERSION.to_string()),
                ])
            }),
            baseline_service: true,
        }
    }

    /// What batch `n` asks of the routes once its new pods are available: its weight, and
    /// every request after the last batch (before the old version goes).
    pub(super) fn batch_want(&self, n: i32) -> Want {
        let Some(routing) = self.r.spec.traffic_routing.as_deref() else {
            return Want::stable();
        };
        let (total, m) = (self.total(), self.batches());
        let t = batch::target(total, m, n);
        if n >= m {
            // The old version stops next.
            return Want {
                weight: 100,
                header: false,
                canary_endpoints: t,
                settle: true,
            };
        }
        Want {
            weight: step_weight(routing, (n - 1).max(0) as usize, t, total),
            header: true,
            canary_endpoints: t,
            settle: false,
        }
    }

    /// Asks the routes for `want`: what they are not yet at (None without traffic routing,
    /// or when every route is there, accepted by its gateway, and settled if `want` says so).
    pub(super) fn traffic_at(&mut self, want: Want) -> Option<String> {
        if self.r.spec.traffic_routing.is_none() && self.switched_services().is_none() {
            return None;
        }
        self.want = Some(want);
        let step = self.traffic_step(want)?;
        if let Some(after) = step.recheck_after {
            let after = after + std::time::Duration::from_millis(100);
            self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
        }
        step.waiting
    }

    /// Since when every route has been as `want` asks, accepted by its gateway; None before.
    pub(super) fn traffic_since(&self, want: Want) -> Option<jiff::Timestamp> {
        self.traffic_step(want)?.now.since
    }

    fn traffic_step(&self, want: Want) -> Option<TrafficStep> {
        let recorded = self.st.recorded();
        let Some(routing) = self.r.spec.traffic_routing.as_deref() else {
            return self.service_switch_step(want, recorded);
        };
        Some(traffic_step(
            &self.r.reference,
            "CanaryDeployment",
            routing,
            &self.sides(),
            want,
            &self.o.traffic,
            recorded,
            self.now,
        ))
    }

    /// Moves the routes to what the phase the plan stopped in asked for (everything to the
    /// stable Service where it asked nothing), replacing traffic actions of phases left.
    pub(super) fn settle_traffic(&mut self) {
        let want = self.want.unwrap_or_else(Want::stable);
        let step = self.traffic_step(want);
        crate::plan::traffic::settle(&mut self.actions, &mut self.st, step);
        let released = self.released();
        if self.r.spec.traffic_routing.is_some() {
            // Routes now: the Services switched before are handed back all the same.
            let owner = format!("CanaryDeployment/{}", self.name());
            service_switch::hand_back(&released, &self.o.traffic, &owner, &mut self.actions);
        }
        self.st.switched_services =
            service_switch::still_switched(self.switched_services(), &released, &self.o.traffic);
    }

    /// A blue-green rollout's Services switched by their selector
    /// (`blueGreen.activeService`, without traffic routing).
    pub(super) fn switched_services(&self) -> Option<Switched<'_>> {
        let strategy = &self.spec().strategy;
        if self.r.spec.traffic_routing.is_some()
            || !matches!(strategy.type_, Strategy::BlueGreen | Strategy::Rollback)
        {
            return None;
        }
        let Some(bg) = strategy.blue_green.as_ref() else {
            // A rollback whose spec dropped the block: the Service switched last (the active
            // one comes first) still goes back to the old version, not to every version.
            let last = self.st.switched_services.first();
            return last
                .filter(|_| strategy.type_ == Strategy::Rollback)
                .map(|active| Switched {
                    active,
                    preview: None,
                });
        };
        Some(Switched {
            active: bg.active_service.as_deref()?,
            preview: bg.preview_service.as_deref(),
        })
    }

    /// Services the status says linnet switched that the spec no longer names.
    fn released(&self) -> Vec<String> {
        let named = self.switched_services();
        self.st
            .switched_services
            .iter()
            .filter(|n| named.is_none_or(|s| s.active != *n && s.preview != Some(n.as_str())))
            .cloned()
            .collect()
    }

    fn service_switch_step(&self, want: Want, recorded: Recorded) -> Option<TrafficStep> {
        let switched = self.switched_services();
        let released = self.released();
        if switched.is_none() && released.is_empty() {
            return None;
        }
        let sides = self.sides();
        let available = |side: &BTreeMap<String, String>| {
            let name = format!("{}-{}", self.name(), side.get(VERSION_LABEL)?);
            self.o
                .deployments
                .iter()
                .find(|d| d.name == name)
                .map(|d| d.available)
        };
        // The new version's pods carry its template's labels and the selector's.
        let template = self.pod_template(&self.canary_image()).metadata;
        let mut canary_labels = template.and_then(|m| m.labels).unwrap_or_default();
        let selector = self.spec().template.get().selector.match_labels;
        canary_labels.extend(selector.unwrap_or_default());
        let ready = SideReady {
            stable: available(&sides.stable).unwrap_or(0),
            canary: available(&sides.canary).unwrap_or(0),
            canary_labels,
        };
        Some(service_switch::service_switch_step(
            (self.name(), &self.r.reference.namespace),
            switched,
            &released,
            &sides,
            (want, ready),
            &self.o.traffic,
            recorded,
            self.now,
        ))
    }
}
