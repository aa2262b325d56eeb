//! What can stop or hold a canary whatever its phase: an abort (annotation, image or spec),
//! a promotion made by hand, a held analysis, a step's gate and the progress deadline.

use super::*;

impl<'a> Planner<'a> {
    /// Why a running canary must end, if it must.
    pub(super) fn abort_reason(&mut self) -> Option<Next<Phase>> {
        let canary = self.canary_image();
        let stable = self.stable_image();
        let image = &self.spec().image;
        if annotation_acts(
            self.r.abort.as_deref(),
            self.st.abort_at_start.as_deref(),
            &canary,
        ) {
            return Some(go(
                Phase::RollingBack,
                "Aborted",
                format!("the abort annotation is set; rolling {canary} back to {stable}"),
            ));
        }
        if *image == stable {
            return Some(go(
                Phase::RollingBack,
                "Reverted",
                format!("image set back to {stable} in Git; rolling the canary of {canary} back"),
            ));
        }
        if *image != canary {
            return Some(go(
                Phase::RollingBack,
                "Superseded",
                format!(
                    "image changed to {image} during the canary of {canary}; ending this canary before starting the next"
                ),
            ));
        }
        if let Some((run, why)) =
            analysis::failed(&mut self.st.analysis, &self.r.analysis, self.now)
        {
            return Some(go_warning(
                Phase::RollingBack,
                "AnalysisFailed",
                format!("analysis {run} failed: {why}; rolling {canary} back to {stable}"),
            ));
        }
        None
    }

    /// Whether a person has promoted this canary (the annotation acts on it).
    pub(super) fn promoted_by_hand(&self) -> bool {
        annotation_acts(
            self.r.promote.as_deref(),
            self.st.promote_at_start.as_deref(),
            &self.canary_image(),
        )
    }

    /// What holds the canary where it is: the background analysis inconclusive or unable to
    /// measure (unless a person promoted it). Said with what to do in Git.
    pub(super) fn analysis_hold(&mut self) -> Option<String> {
        if self.promoted_by_hand() {
            return None;
        }
        match analysis::background(&mut self.st.analysis, &self.r.analysis, self.now) {
            Some(Verdict::Held(why)) => Some(self.held(BACKGROUND, &why)),
            _ => None,
        }
    }

    /// What the least evidence (`minMeasurements`, `minDuration`) still lacks before the
    /// canary is promoted (unless a person promoted it); a timer for when its duration is met.
    pub(super) fn evidence_hold(&mut self) -> Option<String> {
        if self.promoted_by_hand() {
            return None;
        }
        let spec = self.spec().analysis.as_deref();
        let (why, left) = analysis::evidence::missing(&self.st.analysis, spec, self.now)?;
        if let Some(left) = left {
            self.timer(left);
        }
        Some(format!(
            "{why}. To go on without it, set {}: \"true\" in Git",
            crate::api::PROMOTE_ANNOTATION
        ))
    }

    pub(super) fn held(&self, run: &str, why: &str) -> String {
        format!(
            "analysis {run} holds the canary: {why}. To go on without it, set {}: \"true\" in Git; \
             to roll back, set {}: \"true\" or put the image back",
            crate::api::PROMOTE_ANNOTATION,
            crate::api::ABORT_ANNOTATION
        )
    }

    /// The gate after step `after`, if the spec has one and it has not passed: a move (a
    /// failure rolls back) or what it waits for. A person's promotion skips it.
    pub(super) fn gate(&mut self, after: i32) -> Option<Next<Phase>> {
        if self.promoted_by_hand() {
            return None;
        }
        let (name, verdict) =
            analysis::gate(&mut self.st.analysis, after, &self.r.analysis, self.now)?;
        match verdict {
            Verdict::Passed => None,
            Verdict::Failed(why) => Some(go_warning(
                Phase::RollingBack,
                "AnalysisFailed",
                format!(
                    "analysis {name} failed: {why}; rolling {} back to {}",
                    self.canary_image(),
                    self.stable_image()
                ),
            )),
            Verdict::Held(why) => Some(Next::Stay(self.held(&name, &why))),
            Verdict::Measuring(what) => Some(Next::Stay(format!("analysis {name}: {what}"))),
        }
    }

    /// The current step's canary pods are all Ready on the canary's revision.
    pub(super) fn step_ready(&self) -> bool {
        let n = self.size(self.step_index());
        if self.two_sets() {
            let canary = self.o.canary.as_ref();
            Self::settled(canary, n)
                && canary.is_some_and(|c| c.image.as_deref() == Some(self.canary_image().as_str()))
        } else {
            let set = self.o.stable.as_ref();
            set.is_some_and(|s| s.status_fresh) && self.updated_ready(set, self.replicas() - n) >= n
        }
    }

    pub(super) fn deadline_passed(&mut self, what: &str) -> Option<Next<Phase>> {
        // The deadline is for pods that do not become Ready. Once the step's are, what keeps
        // it (a gate measuring, a held analysis) is not late pods.
        if self.step_ready() {
            return None;
        }
        let deadline = Duration::from_secs(self.spec().progress_deadline_seconds.max(1) as u64);
        let elapsed = elapsed(self.st.phase_since.as_ref(), self.now);
        if elapsed >= deadline {
            return Some(go_warning(
                Phase::RollingBack,
                "ProgressDeadlineExceeded",
                format!(
                    "{what} within progressDeadlineSeconds ({}s); rolling back",
                    deadline.as_secs()
                ),
            ));
        }
        self.timer(deadline - elapsed);
        None
    }
}
