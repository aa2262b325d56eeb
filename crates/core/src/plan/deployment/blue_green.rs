//! Blue-green (`strategy: BlueGreen`): the new version started beside the old one and
//! previewed through the canary Service and the header route (stage 1), then every request
//! switched to it at once (stage 2), while the old version keeps every replica for
//! `scaleDownDelaySeconds`, so that switching back is as instant as the switch. A gate
//! `after: 1` judges the preview, `after: 2` the switched version.

use super::*;
use crate::api::BlueGreen;
use crate::plan::traffic::{TrafficRecord as _, Want};

/// The stage that switches every request to the new version.
const SWITCHED: i32 = 2;

impl<'a> Planner<'a> {
    pub(super) fn blue_green(&self) -> bool {
        self.spec().strategy.type_ == Strategy::BlueGreen
    }

    fn blue_green_settings(&self) -> BlueGreen {
        self.spec().strategy.blue_green.clone().unwrap_or_default()
    }

    /// New-version replicas at batch (or blue-green stage) `n`.
    pub(super) fn target(&self, n: i32) -> i32 {
        let total = self.total();
        if !self.blue_green() {
            return batch::target(total, self.batches(), n);
        }
        match self.blue_green_settings().preview_replicas {
            Some(preview) if n < SWITCHED => preview.clamp(0, total),
            _ => total,
        }
    }

    /// What stage `n` asks of the routes once its new pods are available: the preview only
    /// by the header route, then every request, settled before the old version may stop.
    fn stage_want(&self, n: i32) -> Want {
        if n >= SWITCHED {
            return Want {
                weight: 100,
                header: false,
                canary_endpoints: self.total(),
                settle: true,
            };
        }
        Want {
            weight: 0,
            header: true,
            canary_endpoints: self.target(n),
            settle: false,
        }
    }

    pub(super) fn blue_green_step(&mut self, phase: Phase) -> Next<Phase> {
        if let Some(next) = self.interrupted() {
            return next;
        }
        self.delete_leftovers();
        let n = self.current_batch().min(SWITCHED);
        let (total, t) = (self.total(), self.target(n));
        let (image, stable_image) = (self.canary_image(), self.stable_image());
        let new_name = self.version_for(&image);
        // The old version keeps every replica until the end: it is what a rollback switches
        // back to. It is the one on the stable image (not merely the biggest: a preview of an
        // earlier template is as big). One deleted by hand comes back.
        let old_name = self
            .o
            .deployments
            .iter()
            .filter(|d| d.name != new_name && d.image.as_deref() == Some(stable_image.as_str()))
            .max_by_key(|d| (d.replicas, d.available))
            .map_or_else(|| self.version_for(&stable_image), |d| d.name.clone());
        if old_name != new_name {
            self.ensure(&old_name, &stable_image, total);
        }
        let new = self.ensure(&new_name, &image, t);
        let available = new
            .filter(|d| d.image.as_deref() == Some(image.as_str()))
            .map_or(0, |d| d.available.min(t));
        let ready = new.is_some_and(|d| d.status_fresh && d.available >= t && d.updated >= t);
        let stage = if n >= SWITCHED { "switch" } else { "preview" };
        // Once the gateways took the switch, the requests stay on the new version while it
        // has ready pods, and a resize (a HorizontalPodAutoscaler's, say) starts the
        // deadline again: its pods are late from then, not from the switch. Pods that stop
        // being ready and do not come back still meet the deadline, and switch back.
        let switched = n >= SWITCHED && self.st.recorded().weight == Some(100);
        if switched && self.st.replicas != total {
            self.st.phase_since = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                self.now,
            ));
        }
        if !ready {
            if phase == Phase::Progressing
                && let Some(next) = self.deadline_passed(None)
            {
                return next;
            }
            // The routes stay where the last stage left them until this one's pods are up.
            let before = match n {
                _ if switched => self.stage_want(n),
                SWITCHED => self.stage_want(n - 1),
                _ => Want::stable(),
            };
            self.traffic_at(before);
            return Next::Stay(format!(
                "blue-green {stage}: {available}/{t} new replica(s) on {image} available"
            ));
        }
        if let Some(why) = self.traffic_at(self.stage_want(n)) {
            return Next::Stay(format!(
                "blue-green {stage}: {t} new replica(s) on {image} available; {why}"
            ));
        }
        if n < SWITCHED {
            self.before_switch(phase, t)
        } else {
            self.after_switch(phase, &new_name)
        }
    }

    /// The preview is up and routed: its gate, a held analysis, then the switch (now, or once
    /// approved in Git).
    fn before_switch(&mut self, phase: Phase, t: i32) -> Next<Phase> {
        let image = self.canary_image();
        let gate_passed = match self.gate(1, phase) {
            Ok(passed) => passed,
            Err(next) => return next,
        };
        if let Some(hold) = self.analysis_hold(1) {
            return paused(phase, "AnalysisInconclusive", hold);
        }
        if gate_passed || self.allowed(SWITCHED) {
            self.st.current_batch = Some(SWITCHED);
            return go(
                Phase::Progressing,
                "Switching",
                format!("switching every request to {image}"),
            );
        }
        let canary = crate::api::canary_service_name(self.name());
        paused(
            phase,
            "Paused",
            format!(
                "preview of {image} ready ({t} replica(s), through Service {canary} and the \
                 header route); waiting for approval to switch: set currentBatch to \
                 {SWITCHED} in Git"
            ),
        )
    }

    /// Every request is on the new version: its gate, a held analysis, the least evidence,
    /// then, once the scale-down delay is over, the old version stops.
    fn after_switch(&mut self, phase: Phase, new_name: &str) -> Next<Phase> {
        if let Err(next) = self.gate(SWITCHED, phase) {
            return next;
        }
        if let Some(hold) = self.analysis_hold(SWITCHED) {
            return paused(phase, "AnalysisInconclusive", hold);
        }
        if let Some(wait) = self.evidence_hold() {
            return Next::Stay(wait);
        }
        let delay = self.blue_green_settings().scale_down_delay_seconds.max(0) as u64;
        let delay = Duration::from_secs(delay);
        // From the switch itself, when the gateways took it: not from the approval (a preview
        // that grows to every replica first takes its time).
        let switched = self.traffic_since(self.stage_want(SWITCHED));
        let since = switched
            .map(|t| self.now.duration_since(t))
            .filter(|d| !d.is_negative())
            .map_or(Duration::ZERO, |d| d.unsigned_abs());
        if since < delay {
            let left = delay - since + Duration::from_millis(100);
            self.requeue = Some(self.requeue.map_or(left, |r| r.min(left)));
            return Next::Stay(format!(
                "every request switched to {}; the old version on {} keeps its replicas for \
                 scaleDownDelaySeconds ({}s) after the switch, while an abort or a failed \
                 analysis switches straight back",
                self.canary_image(),
                self.stable_image(),
                delay.as_secs()
            ));
        }
        self.delete_others(new_name);
        self.finish_rollout()
    }
}

/// `why` as the Paused phase's message: stays if paused already.
fn paused(phase: Phase, reason: &'static str, why: String) -> Next<Phase> {
    if phase == Phase::Paused {
        Next::Stay(why)
    } else {
        go(Phase::Paused, reason, why)
    }
}
