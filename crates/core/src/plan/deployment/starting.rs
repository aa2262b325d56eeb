//! How a CanaryDeployment starts: its first plan, a rollout of a new image (batched or
//! rolling), a rollback, and the end of a rollout.

use super::*;

impl<'a> Planner<'a> {
    pub(super) fn initializing(&mut self) -> Next<Phase> {
        let image = self.spec().image.clone();
        self.st.stable_image = Some(image.clone());
        let total = self.total();
        // Adopt what a restart finds: the single Deployment that exists, else a new one.
        let name = match &self.o.deployments[..] {
            [only] => only.name.clone(),
            _ => self.home(&image),
        };
        let d = self.ensure(&name, &image, total);
        if d.is_some_and(|d| d.complete(total)) {
            self.delete_others(&name);
            return go_quietly(
                Phase::Completed,
                format!("{total}/{total} replicas available on {image}"),
            );
        }
        Next::Stay(format!(
            "starting {total} replicas of {image} ({} available)",
            d.map_or(0, |d| d.available)
        ))
    }

    pub(super) fn start_rollback(&mut self, from: &str, to: &str) {
        self.st.rollback = Some(RollbackStatus {
            from_image: from.to_string(),
            to_image: to.to_string(),
            state: BatchState::InProgress,
        });
    }

    /// The serving version kept as it is while a fleet holds the new image
    /// ([`DeployRollout::fleet_hold`]).
    pub(super) fn held_by_fleet(&mut self) -> Option<Next<Phase>> {
        let why = self.r.fleet_hold.clone()?;
        let (stable, total) = (self.stable_image(), self.total());
        let name = match self.serving(&stable) {
            Some(d) => d.name.clone(),
            None => self.home(&stable),
        };
        self.ensure(&name, &stable, total);
        Some(Next::Stay(format!(
            "{} held on {stable}: {why}",
            self.spec().image
        )))
    }

    pub(super) fn start_rollout(&mut self) -> Next<Phase> {
        let image = self.spec().image.clone();
        let stable = self.stable_image();
        self.st.canary_image = Some(image.clone());
        self.st.rollback = None;
        // A new rollout's batches: none of the last one's times (one superseded mid-batch
        // goes from InProgress to InProgress in a single plan).
        self.st.batches.clear();
        self.st.series.clear();
        self.st.abort_at_start = self.r.abort.clone();
        analysis::start(&mut self.st.analysis, &self.r.analysis, self.now);
        if self.blue_green() {
            self.st.current_batch = Some(1);
            return go(
                Phase::Progressing,
                "BatchStarted",
                format!(
                    "rolling out {image} (from {stable}) blue-green: a preview of {} replica(s) beside the old version",
                    self.target(1)
                ),
            );
        }
        if self.batched() {
            self.st.current_batch = Some(1);
            let t = batch::target(self.total(), self.batches(), 1);
            return go(
                Phase::Progressing,
                "BatchStarted",
                format!(
                    "rolling out {image} (from {stable}): batch 1 of {}, {t} new replica(s)",
                    self.batches()
                ),
            );
        }
        self.st.current_batch = None;
        go(
            Phase::Progressing,
            "RolloutStarted",
            format!("rolling update from {stable} to {image}"),
        )
    }

    pub(super) fn completed(&mut self) -> Next<Phase> {
        let stable = self.stable_image();
        let total = self.total();
        if self.spec().strategy.type_ == Strategy::Rollback {
            return match self.st.previous_image.clone() {
                Some(previous) if previous != stable => {
                    self.start_rollback(&stable, &previous);
                    go(
                        Phase::RollingBack,
                        "RollbackStarted",
                        format!("rolling back from {stable} to {previous}"),
                    )
                }
                _ => Next::Stay(format!(
                    "strategy is Rollback, but there is no earlier image than {stable} to go back to"
                )),
            };
        }
        if self.spec().image != stable {
            // Leftovers of a rollout that was cut off after writing Completed and before
            // deleting them would run beside the new one, above the surge (issue 44).
            if let Some(serving) = self.serving(&stable).map(|d| d.name.clone()) {
                self.delete_others(&serving);
            }
            if let Some(hold) = self.held_by_fleet() {
                return hold;
            }
            return self.start_rollout();
        }
        let name = match self.serving(&stable) {
            Some(d) => d.name.clone(),
            None => self.home(&stable),
        };
        let d = self.ensure(&name, &stable, total);
        // Leftovers of a rollout cut off before its status was written.
        self.delete_others(&name);
        Next::Stay(format!(
            "{}/{total} replicas available on {stable}",
            d.map_or(0, |d| d.available)
        ))
    }
}
