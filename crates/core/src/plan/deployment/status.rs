//! The plan's last part: the status fields, batches, conditions and timer that follow from where
//! the machine stopped.

use super::*;
use crate::plan::series;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

impl<'a> Planner<'a> {
    pub(super) fn finish(mut self, message: String) -> Finished<CanaryDeploymentStatus> {
        let total = self.total();
        let phase = self.st.phase.unwrap_or(Phase::Initializing);
        let available = self.record_availability();
        // The count the plan sizes the Deployments to: it follows a new count once acted on.
        self.st.replicas = total;
        self.st.selector = Some(crate::api::pods_selector(&self.r.reference.name));
        self.st.ready = Some(format!("{available}/{total}"));
        self.record_batches(phase);
        if phase == Phase::Completed {
            self.st.current_batch = None;
        }
        if reads_abort(phase) {
            if let Some(after) = analysis::next_due(&self.st.analysis, &self.r.analysis, self.now) {
                let after = after + Duration::from_millis(100);
                self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
            }
        } else {
            analysis::stop_runs(&mut self.st.analysis);
        }
        self.st.observed_generation = self.r.generation;
        self.settle_traffic();
        // After the routes are recorded as seen now: the baseline's retirement counts the
        // settle time from them.
        self.retire_baseline();
        // During a rollout, and the point of the move that ended it: a settled rollout's
        // pods (an autoscaler's, a restart) are not the rollout's chart.
        let entered = self
            .st
            .phase_since
            .as_ref()
            .is_some_and(|t| t.0 == self.now);
        let rolling = matches!(
            phase,
            Phase::Progressing | Phase::Paused | Phase::RollingBack
        );
        if rolling || entered {
            let reading = series::Reading {
                weight: self.st.canary_weight,
                baseline_weight: self.st.baseline_weight,
                ready: &self.st.available_by_image,
            };
            series::record(&mut self.st.series, self.now, reading);
        }
        self.st.source_revision = self.r.source_revision.clone();
        self.st.image_source = super::super::image_tags::image_source(
            &self.r.spec.image,
            self.r.image_source.clone(),
            self.st.image_source.take(),
        );
        self.st.message = Some(message.clone());
        let standing = self.standing(phase, available);
        Finished {
            status: self.st,
            actions: self.actions,
            requeue: self.requeue,
            standing,
            events: self.events,
        }
    }

    /// Records the replicas available, in all and by image, leaving out the Deployments this
    /// plan deletes (they serve no more); returns the total.
    fn record_availability(&mut self) -> i32 {
        let deleted = |name: &str| {
            self.actions
                .iter()
                .any(|a| matches!(a, Action::DeleteDeployment { name: n } if n == name))
        };
        let serving: Vec<&DeploymentView> = self
            .o
            .deployments
            .iter()
            .filter(|d| !deleted(&d.name))
            .collect();
        let available: i32 = serving.iter().map(|d| d.available).sum();
        let mut by_image: BTreeMap<&str, i32> = BTreeMap::new();
        for d in serving.iter().filter(|d| d.available > 0) {
            *by_image
                .entry(
                    d.image
                        .as_deref()
                        .unwrap_or(crate::plan::objects::UNKNOWN_IMAGE),
                )
                .or_default() += d.available;
        }
        self.st.available_replicas = available;
        self.st.available_by_image = by_image
            .into_iter()
            .map(|(image, replicas)| ImageReplicas {
                image: image.to_string(),
                replicas,
            })
            .collect();
        available
    }

    /// Each batch's target and state, and the batch column (`2/4`); none for a rolling update.
    fn record_batches(&mut self, phase: Phase) {
        let m = self.batches();
        if !self.batched() {
            self.st.batches.clear();
            self.st.batch = None;
            return;
        }
        if self.st.current_batch.is_none() {
            return;
        }
        let n = self.current_batch();
        let all_done = phase == Phase::Completed;
        let in_rollout = matches!(phase, Phase::Progressing | Phase::Paused | Phase::Failed);
        let before = std::mem::take(&mut self.st.batches);
        let now = Time(self.now);
        self.st.batches = (1..=m)
            .map(|b| {
                let state = if all_done || b < n || (b == n && phase == Phase::Paused) {
                    BatchState::Finished
                } else if b == n && in_rollout {
                    BatchState::InProgress
                } else {
                    BatchState::Pending
                };
                let (started_at, finished_at) =
                    batch_times(before.iter().find(|p| p.batch == b), state, &now);
                BatchStatus {
                    batch: b,
                    target: self.target(b),
                    state,
                    started_at,
                    finished_at,
                }
            })
            .collect();
        self.st.batch = Some(format!("{}/{m}", if all_done { m } else { n }));
    }

    /// How the rollout stands for kstatus: settled on Git's image with every replica
    /// available and nothing else running, stuck, or working.
    fn standing(&self, phase: Phase, available: i32) -> Standing {
        let total = self.total();
        // A rollback is what Git asks for under strategy Rollback; otherwise it is a failed
        // rollout that waits for a new image.
        let asked_back = self.spec().strategy.type_ == Strategy::Rollback;
        let on_git_image = self.st.stable_image.as_deref() == Some(self.spec().image.as_str());
        // The serving Deployment has every replica updated and available, and nothing else
        // runs: a template change rolling through (same image) is not settled yet.
        let serving_complete = self.st.stable_image.as_deref().is_some_and(|stable| {
            self.serving(stable).is_some_and(|d| d.complete(total))
                && self
                    .o
                    .deployments
                    .iter()
                    .all(|d| d.pods == 0 || Some(d) == self.serving(stable))
        });
        // A new image a fleet holds is still to come: not settled, and not stuck either.
        let held = self.r.fleet_hold.is_some() && !on_git_image;
        match phase {
            Phase::Completed | Phase::RolledBack if held => Standing::Working,
            Phase::Completed if !on_git_image => Standing::Stuck,
            Phase::Completed if available >= total && serving_complete => Standing::Settled,
            Phase::RolledBack if asked_back && available >= total && serving_complete => {
                Standing::Settled
            }
            Phase::RolledBack if asked_back => Standing::Working,
            Phase::RolledBack | Phase::Failed => Standing::Stuck,
            _ => Standing::Working,
        }
    }
}

/// When a batch in `state` started and finished: as `before` (its last status) recorded them
/// while its state stays (even without times: an older agent's, or a CRD without the fields,
/// is not rewritten at every reconcile), or now for a move seen now. A finished batch that is
/// not finished any more is one of a new rollout, whose times start again.
fn batch_times(
    before: Option<&BatchStatus>,
    state: BatchState,
    now: &Time,
) -> (Option<Time>, Option<Time>) {
    if let Some(p) = before.filter(|p| p.state == state) {
        return (p.started_at.clone(), p.finished_at.clone());
    }
    let carried = before.filter(|p| p.state != BatchState::Finished);
    let started = (state != BatchState::Pending).then(|| {
        carried
            .and_then(|p| p.started_at.clone())
            .unwrap_or_else(|| now.clone())
    });
    let finished = (state == BatchState::Finished).then(|| now.clone());
    (started, finished)
}
