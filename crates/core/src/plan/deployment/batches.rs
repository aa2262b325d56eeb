//! Moving through the batches (or one rolling step): an interruption, the analysis gates and
//! holds, the pause rules, and the batch step itself.

use super::*;

impl<'a> Planner<'a> {
    /// Why an in-flight rollout must be ended, if it must. Called first by the steps of the
    /// phases [`reads_abort`] names.
    pub(super) fn interrupted(&mut self) -> Option<Next<Phase>> {
        let canary = self.canary_image();
        let stable = self.stable_image();
        let image = self.spec().image.clone();
        let aborted = annotation_acts(
            self.r.abort.as_deref(),
            self.st.abort_at_start.as_deref(),
            &canary,
        );
        let (reason, message) = if aborted && canary != stable {
            (
                "Aborted",
                format!("the abort annotation is set; rolling {canary} back to {stable}"),
            )
        } else if self.spec().strategy.type_ == Strategy::Rollback {
            (
                "RollbackStarted",
                format!("strategy set to Rollback; rolling {canary} back to {stable}"),
            )
        } else if image == stable {
            (
                "Reverted",
                format!("image set back to {stable} in Git; rolling {canary} back"),
            )
        } else if image != canary && self.batched() {
            (
                "Superseded",
                format!(
                    "image changed to {image} during the rollout of {canary}; rolling back before starting it"
                ),
            )
        } else if let Some((run, why)) =
            analysis::failed(&mut self.st.analysis, &self.r.analysis, self.now)
        {
            self.start_rollback(&canary, &stable);
            return Some(go_warning(
                Phase::RollingBack,
                "AnalysisFailed",
                format!("analysis {run} failed: {why}; rolling {canary} back to {stable}"),
            ));
        } else {
            return None;
        };
        self.start_rollback(&canary, &stable);
        Some(go(Phase::RollingBack, reason, message))
    }

    /// What holds the rollout after batch `n`: the background analysis inconclusive or
    /// unable to measure, unless a person approved the next batch in Git.
    pub(super) fn analysis_hold(&mut self, n: i32) -> Option<String> {
        if self.spec().current_batch > n {
            return None;
        }
        match analysis::background(&mut self.st.analysis, &self.r.analysis, self.now) {
            Some(Verdict::Held(why)) => Some(self.held(BACKGROUND, &why, n)),
            _ => None,
        }
    }

    /// What the least evidence (`minMeasurements`, `minDuration`) still lacks before the
    /// rollout completes; a timer for when its duration is met.
    pub(super) fn evidence_hold(&mut self) -> Option<String> {
        let spec = self.spec().analysis.as_deref();
        let (why, left) = analysis::evidence::missing(&self.st.analysis, spec, self.now)?;
        if let Some(left) = left {
            let left = left + Duration::from_millis(100);
            self.requeue = Some(self.requeue.map_or(left, |r| r.min(left)));
        }
        Some(format!(
            "{why}. To go on without it, remove minMeasurements and minDuration from \
             spec.analysis in Git"
        ))
    }

    /// `late`: which pods were late, when not the new version's.
    pub(super) fn deadline_passed(&mut self, late: Option<String>) -> Option<Next<Phase>> {
        let deadline = Duration::from_secs(self.spec().progress_deadline_seconds.max(1) as u64);
        let elapsed = elapsed(self.st.phase_since.as_ref(), self.now);
        if elapsed < deadline {
            let left = deadline - elapsed + Duration::from_millis(100);
            self.requeue = Some(self.requeue.map_or(left, |r| r.min(left)));
            return None;
        }
        let image = self.canary_image();
        let late = late.unwrap_or_else(|| format!("new pods on {image}"));
        let what = format!(
            "{late} were not available within progressDeadlineSeconds ({}s)",
            deadline.as_secs()
        );
        if self.spec().rollback_on_failure {
            self.start_rollback(&image, &self.stable_image());
            return Some(go_warning(
                Phase::RollingBack,
                "ProgressDeadlineExceeded",
                format!("{what}; rolling back"),
            ));
        }
        Some(go_warning(
            Phase::Failed,
            "ProgressDeadlineExceeded",
            format!(
                "{what}; the rollout stopped and {} keeps serving. Fix the image in Git, or set strategy Rollback",
                self.stable_image()
            ),
        ))
    }

    pub(super) fn held(&self, run: &str, why: &str, n: i32) -> String {
        let go_on = if n < self.batches() {
            format!("set currentBatch to {} in Git", n + 1)
        } else {
            "remove it from spec.analysis in Git".to_string()
        };
        format!(
            "analysis {run} holds the rollout: {why}. To go on without it, {go_on}; to roll back, \
             set {}: \"true\" or put the image back",
            crate::api::ABORT_ANNOTATION
        )
    }

    /// What the gate after batch `n` says, if the spec has one: `Ok(true)` passed,
    /// `Ok(false)` none (or a person approved the next batch), `Err` a move or a wait.
    pub(super) fn gate(&mut self, n: i32, phase: Phase) -> Result<bool, Next<Phase>> {
        if n < self.batches() && self.spec().current_batch > n {
            return Ok(false);
        }
        let Some((name, verdict)) =
            analysis::gate(&mut self.st.analysis, n, &self.r.analysis, self.now)
        else {
            return Ok(false);
        };
        match verdict {
            Verdict::Passed => Ok(true),
            Verdict::Failed(why) => {
                let (from, to) = (self.canary_image(), self.stable_image());
                self.start_rollback(&from, &to);
                Err(go_warning(
                    Phase::RollingBack,
                    "AnalysisFailed",
                    format!("analysis {name} failed: {why}; rolling {from} back to {to}"),
                ))
            }
            Verdict::Held(why) => {
                let waiting = self.held(&name, &why, n);
                Err(if phase == Phase::Paused {
                    Next::Stay(waiting)
                } else {
                    go(Phase::Paused, "AnalysisInconclusive", waiting)
                })
            }
            Verdict::Measuring(what) => Err(Next::Stay(format!("analysis {name}: {what}"))),
        }
    }

    pub(super) fn rolling_step(&mut self) -> Next<Phase> {
        if let Some(next) = self.interrupted() {
            return next;
        }
        // A new image during a rolling update just becomes its target.
        if self.spec().image != self.canary_image() {
            self.st.canary_image = Some(self.spec().image.clone());
        }
        let image = self.canary_image();
        let total = self.total();
        let name = self.name().to_string();
        // The update is done: what keeps it (a held analysis) is not late pods.
        let done = self
            .find(&name)
            .is_some_and(|d| d.complete(total) && d.image.as_deref() == Some(image.as_str()));
        if !done && let Some(next) = self.deadline_passed(None) {
            return next;
        }
        let d = self.ensure(&name, &image, total);
        if !d.is_some_and(|d| d.complete(total)) {
            return Next::Stay(format!(
                "rolling update to {image}: {} of {total} updated and available",
                d.map_or(0, |d| d.updated.min(d.available))
            ));
        }
        if let Some(hold) = self.analysis_hold(1).or_else(|| self.evidence_hold()) {
            return Next::Stay(hold);
        }
        self.delete_others(&name);
        self.finish_rollout()
    }

    pub(super) fn finish_rollout(&mut self) -> Next<Phase> {
        let image = self.canary_image();
        self.st.previous_image = Some(self.stable_image());
        self.st.stable_image = Some(image.clone());
        self.st.canary_image = None;
        let total = self.total();
        go(
            Phase::Completed,
            "RolloutComplete",
            format!("{total}/{total} replicas on {image}"),
        )
    }

    /// May batch `n` start without (more) approval?
    pub(super) fn allowed(&self, n: i32) -> bool {
        batch_allowed(self.spec(), n)
    }

    pub(super) fn batch_step(&mut self, phase: Phase) -> Next<Phase> {
        if let Some(next) = self.interrupted() {
            return next;
        }
        self.delete_leftovers();
        let n = self.current_batch();
        let total = self.total();
        // The deadline is for new pods (and baseline pods) that do not become available. Once
        // the batch's are, what keeps it (a gate measuring, a held analysis) is not late pods.
        let t = batch::target(total, self.batches(), n);
        let new_ready = self
            .find(&self.version_for(&self.canary_image()))
            .is_some_and(|d| d.available >= t);
        let late = match (new_ready, self.baseline_ready(t)) {
            (true, true) => None,
            (true, false) => Some(Some(format!("baseline pods on {}", self.stable_image()))),
            (false, _) => Some(None),
        };
        if phase == Phase::Progressing
            && let Some(late) = late
            && let Some(next) = self.deadline_passed(late)
        {
            return next;
        }
        let m = self.batches();
        let image = self.canary_image();
        let new_name = self.version_for(&image);
        // What the new version serves is what is observed, whether or not an apply of it (this
        // batch's scale-up, a hand edit put back) is queued: counting 0 then scaled the old
        // version back to `total` at every batch start (issue 44).
        let available = self
            .find(&new_name)
            .filter(|d| d.image.as_deref() == Some(image.as_str()))
            .map_or(0, |d| d.available.min(t));
        let (serving_new, route_waiting) = self.batch_traffic(n, available);
        // A baseline bigger than this batch's (one an earlier rollout cut off left) shrinks
        // before anything grows.
        let baseline_shrinks = self.o.baseline.as_ref().is_some_and(|b| b.replicas > t);
        let mut baseline_waiting = None;
        if baseline_shrinks {
            baseline_waiting = self.baseline_for(t);
        }
        let (new, old_stopping) = self.scale_batch(&new_name, t, serving_new);
        if !baseline_shrinks {
            baseline_waiting = self.baseline_for(t);
        }
        let done = new.is_some_and(|d| d.status_fresh && d.available >= t && d.updated >= t);
        if !done {
            let stopping = old_stopping.map_or(String::new(), |(asked, pods)| {
                format!(
                    "; waiting for the old version to stop down to {asked} (it has {pods} pod(s))"
                )
            });
            return Next::Stay(format!(
                "batch {n} of {m}: {available}/{t} new replica(s) on {image} available{stopping}"
            ));
        }
        if let Some(why) = baseline_waiting {
            return Next::Stay(format!(
                "batch {n} of {m}: {t} new replica(s) available; {why}"
            ));
        }
        if let Some(why) = route_waiting {
            return Next::Stay(format!(
                "batch {n} of {m}: {t} new replica(s) available; {why}"
            ));
        }
        self.after_batch(n, phase, &new_name)
    }

    /// Deletes, first, every Deployment that is neither the new version nor the old one
    /// serving beside it: what a completion cut off before its deletions left, when the next
    /// plan was cut off too (found by the surge invariant: 3 + 6 + 1 for 6).
    /// Only one on neither image, or empty: after a template change mid-rollout the canary's
    /// and the old version's Deployments both have other names, and both still serve.
    pub(super) fn delete_leftovers(&mut self) {
        let (canary, stable) = (self.canary_image(), self.stable_image());
        let new_name = self.version_for(&canary);
        let old_name = self.stable_deployment(&new_name).map(|d| d.name.clone());
        let leftovers: Vec<String> = self
            .o
            .deployments
            .iter()
            .filter(|d| d.name != new_name && Some(&d.name) != old_name.as_ref())
            .filter(|d| {
                let image = d.image.as_deref();
                (image != Some(canary.as_str()) && image != Some(stable.as_str()))
                    || (d.replicas == 0 && d.pods == 0)
            })
            .map(|d| d.name.clone())
            .collect();
        for name in leftovers {
            let delete = Action::DeleteDeployment { name };
            if !self.actions.contains(&delete) {
                self.actions.push(delete);
            }
        }
    }

    /// How many of batch `n`'s new replicas serve (of `available`), and what the routes still
    /// wait for. With traffic routing the old version shrinks only once the routes send the
    /// batch's share to the new one; until then it keeps what the previous batch left it.
    fn batch_traffic(&mut self, n: i32, available: i32) -> (i32, Option<String>) {
        if self.r.spec.traffic_routing.is_none() {
            return (available, None);
        }
        let (total, m) = (self.total(), self.batches());
        let t = batch::target(total, m, n);
        let before = if n > 1 {
            batch::target(total, m, n - 1)
        } else {
            0
        };
        if available < t {
            let previous = if n > 1 {
                self.batch_want(n - 1)
            } else {
                Want::stable()
            };
            self.traffic_at(previous);
            return (before.min(available), None);
        }
        match self.traffic_at(self.batch_want(n)) {
            None => (t, None),
            waiting => (before.min(available), waiting),
        }
    }

    /// Asks the new version for `t` replicas and the old one for the rest of what
    /// `serving_new` leaves. Returns the new version as observed, and, while the new one may
    /// not grow yet, what the old one is asked for and how many pods it still has.
    fn scale_batch(
        &mut self,
        new_name: &str,
        t: i32,
        serving_new: i32,
    ) -> (Option<&'a DeploymentView>, Option<(i32, i32)>) {
        let (image, stable_image) = (self.canary_image(), self.stable_image());
        let old_replicas = batch::old_replicas(self.total(), serving_new);
        // The old version serves the rest; one deleted by hand comes back.
        let old_name = match self.stable_deployment(new_name) {
            Some(old) => Some(old.name.clone()),
            None if old_replicas > 0 => {
                Some(self.version_for(&stable_image)).filter(|name| name != new_name)
            }
            None => None,
        };
        // What shrinks is written first, then what grows: the other order asked for both at
        // once between the two writes (18 replicas for 10 at a batch start).
        // One this plan deletes (what a cut-off completion left under the same name) is not
        // there to hold at its size.
        let deleted = Action::DeleteDeployment {
            name: new_name.to_string(),
        };
        let new_now = self
            .find(new_name)
            .filter(|_| !self.actions.contains(&deleted))
            .map(|d| d.replicas);
        let new_shrinks = new_now.is_some_and(|r| r > t);
        let mut new = None;
        if new_shrinks {
            new = self.ensure(new_name, &image, t);
        }
        // And what grows waits until the shrink has reached the pods: a scale-down stops pods
        // later than a scale-up starts them (12 pods for a bound of 11 on the real node).
        let old_stopping = old_name
            .as_deref()
            .and_then(|name| self.find(name))
            .filter(|old| !old.shrunk_to(old_replicas))
            .map(|old| (old_replicas, old.pods));
        if let Some(old_name) = old_name {
            self.ensure(&old_name, &stable_image, old_replicas);
        }
        // Nor while a baseline bigger than this batch's (an earlier rollout's) stops.
        let baseline_stopping = self.o.baseline.as_ref().is_some_and(|b| !b.shrunk_to(t));
        // Not made at all while the old one stops: an empty Deployment is a write for nothing.
        match (old_stopping.is_some() || baseline_stopping, new_now) {
            _ if new_shrinks => {}
            (false, _) => new = self.ensure(new_name, &image, t),
            (true, Some(now)) => new = self.ensure(new_name, &image, now.min(t)),
            (true, None) => {}
        }
        (new, old_stopping)
    }

    /// Batch `n`'s new replicas are available and routed: its gate, a held analysis, then
    /// the next batch (now, or once approved in Git), or the end of the rollout.
    fn after_batch(&mut self, n: i32, phase: Phase, new_name: &str) -> Next<Phase> {
        let (total, m, image) = (self.total(), self.batches(), self.canary_image());
        let t = batch::target(total, m, n);
        let gate_passed = match self.gate(n, phase) {
            Ok(passed) => passed,
            Err(next) => return next,
        };
        if let Some(hold) = self.analysis_hold(n) {
            return if phase == Phase::Paused {
                Next::Stay(hold)
            } else {
                go(Phase::Paused, "AnalysisInconclusive", hold)
            };
        }
        if n >= m {
            if let Some(wait) = self.evidence_hold() {
                return Next::Stay(wait);
            }
            self.delete_others(new_name);
            return self.finish_rollout();
        }
        if gate_passed || self.allowed(n + 1) {
            self.st.current_batch = Some(n + 1);
            let next = batch::target(total, m, n + 1);
            return go(
                Phase::Progressing,
                "BatchStarted",
                format!("batch {} of {m}: {next} new replica(s) on {image}", n + 1),
            );
        }
        let waiting = format!(
            "batch {n} of {m} done ({t} new, {} old); waiting for approval: set currentBatch to {} in Git",
            total - t,
            n + 1
        );
        if phase == Phase::Paused {
            Next::Stay(waiting)
        } else {
            go(Phase::Paused, "Paused", waiting)
        }
    }
}
