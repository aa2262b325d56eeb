//! What both strategies share while a canary runs: when a step advances ([`Planner::step_done`]:
//! its pods Ready, then its analysis gate, then the next step or the active canary), the active
//! canary, the migration Job, and a finished rollback.

use super::*;

impl<'a> Planner<'a> {
    /// A step's canary pods are Ready: its gate (if any) decides, then a held analysis keeps
    /// it, else the next step starts (`StepComplete`) or, after the last, the canary is active.
    pub(super) fn step_done(&mut self, n: i32) -> Next<Phase> {
        let i = self.step_index();
        if let Some(next) = self.gate(i as i32 + 1) {
            return next;
        }
        if let Some(hold) = self.analysis_hold() {
            return Next::Stay(hold);
        }
        if i < self.last_step() {
            self.st.current_step = Some(i as i32 + 1);
            let next = if self.two_sets() {
                Phase::ScalingDownStable
            } else {
                Phase::DeployingCanary
            };
            return go(
                next,
                "StepComplete",
                format!(
                    "step {} of {} done ({n} canary replicas Ready); next: {}",
                    i + 1,
                    self.last_step() + 1,
                    self.size(i + 1)
                ),
            );
        }
        go(
            Phase::CanaryActive,
            "CanaryReady",
            format!("{n} canary replica(s) Ready on {}", self.canary_image()),
        )
    }

    /// The canary pods (those on the canary image) as the strategy places them.
    pub(super) fn canary_pods(&self) -> Vec<&PodView> {
        if self.two_sets() {
            return self.pods_of(Role::Canary);
        }
        let r = self.replicas();
        let n = self.size(self.step_index());
        let revision = self
            .o
            .stable
            .as_ref()
            .and_then(|s| s.update_revision.clone());
        self.pods_of(Role::Single)
            .into_iter()
            .filter(|p| p.ordinal >= r - n && p.revision == revision)
            .collect()
    }

    /// Keeps the sets as the canary step has them; what is still to do first, if anything.
    pub(super) fn keep_canary_shape(&mut self) -> Option<String> {
        let r = self.replicas();
        let n = self.size(self.step_index());
        let image = self.canary_image();
        if self.two_sets() {
            let stable = self.stable_image();
            self.ensure(self.main_shape(&stable, r - n, 0));
            // A canary claim gone with its pod (a drain) is made again on the replica's own
            // volume, if linnet is before the StatefulSet controller; if not, `volume_problem`
            // stops the rollout at the next plan.
            if let Some(why) = self.hand_over(r - n..r, Role::Stable, Role::Canary) {
                return Some(format!(
                    "putting the canary's volumes back on their claims: {why}"
                ));
            }
            self.ensure(SetShape {
                role: Role::Canary,
                image: &image,
                replicas: n,
                ordinals_start: r - n,
                partition: 0,
            });
        } else {
            self.ensure(self.main_shape(&image, r, r - n));
        }
        None
    }

    pub(super) fn canary_active(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        if let Some(first) = self.keep_canary_shape() {
            return Next::Stay(first);
        }
        if let Some(hold) = self.analysis_hold().or_else(|| self.evidence_hold()) {
            return Next::Stay(hold);
        }
        let n = self.size(self.step_index());
        let image = self.canary_image();
        let pods = self.canary_pods();
        let ready: Vec<&PodView> = pods.iter().copied().filter(|p| p.ready).collect();
        // A gate after the last step passed (step_done saw to it): it replaces the human.
        let last_gate = gate_run(self.last_step() as i32 + 1);
        let gate_passed = self
            .st
            .analysis
            .iter()
            .any(|r| r.name == last_gate && r.phase == crate::api::AnalysisPhase::Successful);
        let promote = match self.spec().promotion.type_ {
            _ if gate_passed => true,
            PromotionType::Auto => {
                if (ready.len() as i32) < n {
                    return Next::Stay(format!(
                        "{}/{n} canary pods Ready; the bake time starts when all are",
                        ready.len()
                    ));
                }
                let bake = Duration::from_secs(self.spec().promotion.bake_seconds.max(0) as u64);
                let since = ready
                    .iter()
                    .filter_map(|p| p.ready_since)
                    .max()
                    .unwrap_or(self.now);
                let baked = self.now.duration_since(since).unsigned_abs();
                if baked < bake {
                    self.timer(bake - baked);
                    return Next::Stay(format!(
                        "baking: canary Ready for {}s of {}s",
                        baked.as_secs(),
                        bake.as_secs()
                    ));
                }
                true
            }
            PromotionType::Manual => annotation_acts(
                self.r.promote.as_deref(),
                self.st.promote_at_start.as_deref(),
                &image,
            ),
        };
        if !promote {
            let stale = self.r.promote.as_deref() == Some("true");
            return Next::Stay(format!(
                "canary of {image} Ready on {n} replica(s); {}: set the annotation {}: \"true\" in Git{}",
                crate::plan::WAITING_FOR_PROMOTION,
                crate::api::PROMOTE_ANNOTATION,
                if stale {
                    " (it was already \"true\" when this canary started, so it counts for an earlier one; set it to the canary's image instead)"
                } else {
                    ""
                }
            ));
        }
        if self.spec().migration.is_some() {
            return go(
                Phase::AwaitingMigration,
                "PromotionApproved",
                format!("promotion of {image} approved; running the migration Job first"),
            );
        }
        go(
            Phase::Promoting,
            "PromotionStarted",
            format!("promoting {image} to all {} replicas", self.replicas()),
        )
    }

    pub(super) fn awaiting_migration(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        if let Some(first) = self.keep_canary_shape() {
            return Next::Stay(first);
        }
        if let Some(job) = &self.o.job {
            return go(
                Phase::MigratingData,
                "MigrationStarted",
                format!("migration Job {} started", job.name),
            );
        }
        let image = self.canary_image();
        match migration_job(&self.r.reference, self.spec(), &image) {
            Some(job) => {
                self.actions.push(Action::CreateJob(Box::new(job)));
                Next::Stay("creating the migration Job".into())
            }
            None => go(
                Phase::Promoting,
                "PromotionStarted",
                "the migration was removed from the spec; promoting".into(),
            ),
        }
    }

    pub(super) fn migrating_data(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        if let Some(first) = self.keep_canary_shape() {
            return Next::Stay(first);
        }
        match &self.o.job {
            Some(j) if j.succeeded => go(
                Phase::Promoting,
                "MigrationSucceeded",
                format!("migration Job {} succeeded; promoting", j.name),
            ),
            Some(j) if j.failed => go_warning(
                Phase::MigrationFailed,
                "MigrationFailed",
                format!(
                    "migration Job {} failed; rolling back (see `kubectl logs job/{}`)",
                    j.name, j.name
                ),
            ),
            Some(j) => Next::Stay(format!("migration Job {} running", j.name)),
            None => Next::Stay(
                "the migration Job is gone before it finished; it is not run twice for the same image. Abort or change the image in Git"
                    .into(),
            ),
        }
    }

    pub(super) fn rolled_back(&mut self) -> Next<Phase> {
        let stable = self.stable_image();
        let image = self.spec().image.clone();
        if image == stable {
            self.st.canary_image = None;
            return go(
                Phase::Stable,
                "Available",
                format!("image is {stable} again in Git; stable"),
            );
        }
        if Some(&image) != self.st.canary_image.as_ref() {
            if let Some(hold) = self.held_by_fleet() {
                return hold;
            }
            return self.start_canary();
        }
        let r = self.replicas();
        self.ensure(self.main_shape(&stable, r, 0));
        let why = analysis::failure(&self.st.analysis).map_or(String::new(), |f| format!(" ({f})"));
        Next::Stay(format!(
            "rolled back to {stable}; {image} stays off until the image in Git changes{why}"
        ))
    }

    // --- Status --------------------------------------------------------------------------
}
