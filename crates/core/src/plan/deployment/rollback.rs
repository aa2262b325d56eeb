//! Going back: rolling back to the previous image, a finished rollback, and the Failed phase.

use super::*;

impl<'a> Planner<'a> {
    pub(super) fn rolling_back(&mut self) -> Next<Phase> {
        let Some(rollback) = self.st.rollback.clone() else {
            let (from, to) = (self.canary_image(), self.stable_image());
            self.start_rollback(&from, &to);
            return Next::Stay(format!("rolling {from} back to {to}"));
        };
        let target = rollback.to_image.clone();
        let total = self.total();
        // The Deployment that runs the target image (the previous version's), if it still
        // exists; else the one that serves most, whose image is set back.
        let home = self
            .o
            .deployments
            .iter()
            .filter(|d| d.image.as_deref() == Some(target.as_str()))
            .max_by_key(|d| d.replicas)
            .or_else(|| self.stable_deployment(""))
            .map_or_else(|| self.home(&target), |d| d.name.clone());
        let back = self.ensure(&home, &target, total);
        // Every request back on the version rolled back to before a new pod stops.
        if let Some(why) = self.traffic_at(Want::stable()) {
            return Next::Stay(format!("rolling back to {target}: {why}"));
        }
        for other in self.o.deployments.iter().filter(|d| d.name != home) {
            if other.replicas > 0 {
                match other.image.clone() {
                    Some(image) => {
                        self.ensure(&other.name.clone(), &image, 0);
                    }
                    // Its image cannot be read (no container of that name): scaled down as it
                    // is, not given an empty image.
                    None => self.actions.push(Action::ScaleDeployment {
                        name: other.name.clone(),
                        replicas: 0,
                    }),
                }
            }
        }
        let drained = self
            .o
            .deployments
            .iter()
            .filter(|d| d.name != home)
            .all(|d| d.pods == 0);
        if !back.is_some_and(|d| d.complete(total)) || !drained {
            return Next::Stay(format!(
                "rolling back to {target}: {}/{total} available",
                back.map_or(0, |d| d.available)
            ));
        }
        self.delete_others(&home);
        if let Some(r) = self.st.rollback.as_mut() {
            r.state = BatchState::Finished;
        }
        if self.st.stable_image.as_deref() != Some(target.as_str()) {
            self.st.previous_image = self.st.stable_image.clone();
        }
        self.st.stable_image = Some(target.clone());
        self.st.current_batch = None;
        go_warning(
            Phase::RolledBack,
            "RolledBack",
            format!(
                "rolled back from {} to {target}: {total}/{total} available{}",
                rollback.from_image,
                analysis::failure(&self.st.analysis).map_or(String::new(), |f| format!(" ({f})"))
            ),
        )
    }

    pub(super) fn rolled_back(&mut self) -> Next<Phase> {
        let stable = self.stable_image();
        let from = self.st.rollback.as_ref().map(|r| r.from_image.clone());
        let image = self.spec().image.clone();
        if self.spec().strategy.type_ != Strategy::Rollback {
            if image == stable {
                self.st.canary_image = None;
                return go(
                    Phase::Completed,
                    "Available",
                    format!("image is {stable} in Git; nothing to roll out"),
                );
            }
            if Some(&image) != from.as_ref() {
                if let Some(hold) = self.held_by_fleet() {
                    return hold;
                }
                return self.start_rollout();
            }
        }
        let total = self.total();
        let name = match self.serving(&stable) {
            Some(d) => d.name.clone(),
            None => self.home(&stable),
        };
        self.ensure(&name, &stable, total);
        // Leftovers of a rollback cut off after its status was written, before its deletions.
        self.delete_others(&name);
        Next::Stay(format!(
            "rolled back to {stable}; {} stays off until the image in Git changes{}",
            from.unwrap_or_default(),
            analysis::failure(&self.st.analysis).map_or(String::new(), |f| format!(" ({f})"))
        ))
    }

    pub(super) fn failed(&mut self) -> Next<Phase> {
        if let Some(next) = self.interrupted() {
            return next;
        }
        if self.spec().rollback_on_failure {
            let (from, to) = (self.canary_image(), self.stable_image());
            self.start_rollback(&from, &to);
            return go(
                Phase::RollingBack,
                "RollbackStarted",
                format!("rollbackOnFailure set; rolling {from} back to {to}"),
            );
        }
        Next::Stay(self.st.message.clone().unwrap_or_default())
    }
}
