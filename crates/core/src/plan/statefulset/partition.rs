//! The Partition phases: moving the single set's partition through the steps, promoting and
//! rolling back.

use super::*;

impl<'a> Planner<'a> {
    /// Pods at or above `partition` that run the set's update revision and are Ready.
    pub(super) fn updated_ready(&self, set: Option<&SetView>, partition: i32) -> i32 {
        let Some(set) = set else { return 0 };
        self.pods_of(Role::Single)
            .iter()
            .filter(|p| {
                p.ordinal >= partition
                    && p.ready
                    && !p.deleting
                    && p.revision == set.update_revision
            })
            .count() as i32
    }

    pub(super) fn deploying_partition(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        let r = self.replicas();
        let n = self.size(self.step_index());
        if let Some(next) = self.deadline_passed(&format!("the canary's {n} pod(s) were not Ready"))
        {
            return next;
        }
        let image = self.canary_image();
        let set = self.ensure(self.main_shape(&image, r, r - n)).cloned();
        let ready = self.updated_ready(set.as_ref(), r - n);
        if !set.as_ref().is_some_and(|s| s.status_fresh) || ready < n {
            return Next::Stay(format!(
                "waiting for ordinals {}..{} to run {image} and be Ready ({ready}/{n})",
                r - n,
                r - 1
            ));
        }
        if let Some(why) = self.traffic_at(self.step_want(self.step_index())) {
            return Next::Stay(format!("{n} canary pod(s) Ready; {why}"));
        }
        self.step_done(n)
    }

    pub(super) fn promoting_partition(&mut self) -> Next<Phase> {
        let r = self.replicas();
        let image = self.canary_image();
        // Every request to the new revision before a stable pod restarts; the canary Service
        // takes in each pod as it is updated.
        let n = self.size(self.step_index());
        if let Some(why) = self.traffic_at(Want {
            weight: 100,
            header: false,
            canary_endpoints: n,
            settle: true,
        }) {
            return Next::Stay(format!("moving all traffic to the canary first: {why}"));
        }
        let set = self.ensure(self.main_shape(&image, r, 0)).cloned();
        if !Self::settled(set.as_ref(), r) {
            return Next::Stay(format!(
                "rolling all {r} replicas to {image} ({} updated)",
                set.map_or(0, |s| s.updated_replicas)
            ));
        }
        self.finish_promotion()
    }

    pub(super) fn rolling_back_partition(&mut self) -> Next<Phase> {
        let r = self.replicas();
        let image = self.stable_image();
        // All traffic back to the stable revision before a canary pod restarts.
        if let Some(why) = self.traffic_at(Want::stable()) {
            return Next::Stay(format!("moving all traffic back to stable first: {why}"));
        }
        let set = self.ensure(self.main_shape(&image, r, 0)).cloned();
        if let Some(set) = set.as_ref().filter(|s| s.status_fresh) {
            // A pod that never became Ready blocks its set's rolling update for good (a known
            // StatefulSet trap); delete it so the set recreates it on the restored revision.
            let stuck: Vec<String> = self
                .pods_of(Role::Single)
                .iter()
                .filter(|p| !p.ready && !p.deleting && p.revision != set.update_revision)
                .map(|p| p.name.clone())
                .collect();
            for name in stuck {
                self.actions.push(Action::DeletePod { name });
            }
        }
        if !Self::settled(set.as_ref(), r) {
            return Next::Stay(format!(
                "restoring {image} on every replica ({} updated and Ready)",
                set.map_or(0, |s| s.ready_replicas.min(s.updated_replicas))
            ));
        }
        self.finish_rollback()
    }

    // --- Both ----------------------------------------------------------------------------
}
