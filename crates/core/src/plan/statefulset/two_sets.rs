//! The TwoSets phases: scaling the stable set down, handing volumes over, deploying steps,
//! promoting and rolling back.

use super::*;

impl<'a> Planner<'a> {
    pub(super) fn scaling_down_stable(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        let r = self.replicas();
        let n = self.size(self.step_index());
        let keep = r - n;
        let image = self.stable_image();
        if let Some(next) = self.deadline_passed("stable replicas did not stop") {
            return next;
        }
        let set = self.ensure(self.main_shape(&image, keep, 0)).cloned();
        let freed: Vec<String> = self
            .pods_of(Role::Stable)
            .iter()
            .filter(|p| p.ordinal >= keep)
            .map(|p| p.name.clone())
            .collect();
        if !freed.is_empty() || !set.is_some_and(|s| s.status_fresh) {
            return Next::Stay(format!(
                "scaling {} down to {keep}; waiting for {} to stop",
                Role::Stable.set_name(&self.r.reference.name),
                if freed.is_empty() {
                    "the set".to_string()
                } else {
                    freed.join(", ")
                }
            ));
        }
        go(
            Phase::DeployingCanary,
            "StableScaledDown",
            format!(
                "stable scaled down to {keep}; handing ordinals {keep}..{} to the canary",
                r - 1
            ),
        )
    }

    /// Runs the handoffs of ordinals `range` from `from` to `to`; what is still to do, or
    /// `None` when every volume is where it belongs.
    pub(super) fn hand_over(
        &mut self,
        range: std::ops::Range<i32>,
        from: Role,
        to: Role,
    ) -> Option<String> {
        let mut pending = Vec::new();
        let name = self.r.reference.name.clone();
        for k in range {
            for t in claim_templates(self.spec()) {
                // Keyed by the canary claim both ways; recorded as the volume goes to the canary.
                let key = claim_name(&t, &Role::Canary.set_name(&name), k);
                if to == Role::Canary
                    && !self.st.replica_volumes.contains_key(&key)
                    && let Some(v) =
                        named_volume(self.o, &claim_name(&t, &from.set_name(&name), k), &key)
                {
                    self.st.replica_volumes.insert(key.clone(), v.to_string());
                }
                let m = Move {
                    template: &t,
                    ordinal: k,
                    from,
                    to,
                    own: self.st.replica_volumes.get(&key).map(String::as_str),
                };
                match handoff_step(&self.r.reference, self.spec(), self.o, m) {
                    HandoffStep::Done => {}
                    HandoffStep::Waiting(why) => pending.push(why),
                    HandoffStep::Act(a) => {
                        // Made while the claim it is taken from still exists; with that one
                        // gone too, the replica's claim was deleted and is made again.
                        let from_claim = claim_name(&t, &from.set_name(&name), k);
                        if let Action::CreateClaim(c) = &a
                            && !self.o.claims.iter().any(|c| c.name == from_claim)
                        {
                            let volume = c
                                .spec
                                .as_ref()
                                .and_then(|s| s.volume_name.clone())
                                .unwrap_or_default();
                            self.events.push(crate::plan::actions::PlanEvent {
                                warning: true,
                                reason: "ClaimRemade",
                                message: format!(
                                    "claim {} was deleted; made again on volume {volume}, \
                                     which holds replica {k}'s data",
                                    c.metadata.name.as_deref().unwrap_or_default()
                                ),
                            });
                        }
                        pending.push(a.describe());
                        self.actions.push(a);
                    }
                }
            }
        }
        (!pending.is_empty()).then(|| pending.join("; "))
    }

    pub(super) fn deploying_two_sets(&mut self) -> Next<Phase> {
        if let Some(next) = self.abort_reason() {
            return next;
        }
        let r = self.replicas();
        let n = self.size(self.step_index());
        let start = r - n;
        if let Some(next) = self.deadline_passed(&format!("the canary's {n} pod(s) were not Ready"))
        {
            return next;
        }
        let stable_image = self.stable_image();
        self.ensure(self.main_shape(&stable_image, start, 0));
        if let Some(why) = self.hand_over(start..r, Role::Stable, Role::Canary) {
            return Next::Stay(format!(
                "handing the volumes of ordinals {start}..{} to the canary: {why}",
                r - 1
            ));
        }
        let image = self.canary_image();
        let canary = self
            .ensure(SetShape {
                role: Role::Canary,
                image: &image,
                replicas: n,
                ordinals_start: start,
                partition: 0,
            })
            .cloned();
        if !Self::settled(canary.as_ref(), n) {
            return Next::Stay(format!(
                "waiting for {n} canary pod(s) on {image} to be Ready ({} ready)",
                canary.map_or(0, |c| c.ready_replicas)
            ));
        }
        // Traffic follows Ready pods, never goes ahead of them.
        if let Some(why) = self.traffic_at(self.step_want(self.step_index())) {
            return Next::Stay(format!("{n} canary pod(s) Ready; {why}"));
        }
        self.step_done(n)
    }

    pub(super) fn canary_drained(&self) -> bool {
        self.o.canary.as_ref().is_none_or(|c| c.replicas == 0)
            && self.pods_of(Role::Canary).is_empty()
    }

    /// Scales the canary set to 0 (keeping its shape otherwise).
    pub(super) fn drain_canary(&mut self) {
        if self.o.canary.is_none() {
            return;
        }
        let image = self.canary_image();
        let r = self.replicas();
        let n = self.size(self.step_index());
        self.ensure(SetShape {
            role: Role::Canary,
            image: &image,
            replicas: 0,
            ordinals_start: r - n,
            partition: 0,
        });
    }

    pub(super) fn promoting_two_sets(&mut self) -> Next<Phase> {
        let r = self.replicas();
        let n = self.size(self.step_index());
        let image = self.canary_image();
        let canary_range = r - self.spec().canary_replicas.clamp(1, r.max(1))..r;
        if !self.canary_drained() {
            // 1. The stable replicas move to the new image first; the canary keeps serving
            //    (with traffic routing, all of it while the stable pods restart).
            let on_new = self
                .o
                .stable
                .as_ref()
                .is_some_and(|s| s.image.as_deref() == Some(image.as_str()))
                && Self::settled(self.o.stable.as_ref(), r - n);
            if !on_new
                && let Some(why) = self.traffic_at(Want {
                    weight: 100,
                    header: false,
                    canary_endpoints: n,
                    settle: true,
                })
            {
                return Next::Stay(format!("moving all traffic to the canary first: {why}"));
            }
            let stable = self.ensure(self.main_shape(&image, r - n, 0)).cloned();
            if !Self::settled(stable.as_ref(), r - n) {
                return Next::Stay(format!(
                    "updating the {} stable replica(s) to {image}",
                    r - n
                ));
            }
            // 2. Then the traffic goes back to the stable Service, and the canary stops.
            if let Some(why) = self.traffic_at(Want::stable()) {
                return Next::Stay(format!(
                    "stable replicas on {image}; moving traffic back to them: {why}"
                ));
            }
            self.drain_canary();
            return Next::Stay("stopping the canary pods".into());
        }
        // 3. Its volumes go back to the stable set.
        if let Some(why) = self.hand_over(canary_range, Role::Canary, Role::Stable) {
            return Next::Stay(format!("handing volumes back to the stable set: {why}"));
        }
        // 4. The stable set comes back to full size on the new image.
        let stable = self.ensure(self.main_shape(&image, r, 0)).cloned();
        if !Self::settled(stable.as_ref(), r) {
            return Next::Stay(format!(
                "scaling the stable set back to {r} on {image} ({} ready)",
                stable.map_or(0, |s| s.ready_replicas)
            ));
        }
        // 5. The canary set goes; the phase says Stable only once it has.
        if let Some(waiting) = self.delete_canary_set() {
            return waiting;
        }
        self.finish_promotion()
    }

    pub(super) fn finish_promotion(&mut self) -> Next<Phase> {
        self.st.replica_volumes.clear();
        let image = self.canary_image();
        self.st.stable_image = Some(image.clone());
        self.st.canary_image = None;
        self.st.current_step = None;
        let r = self.replicas();
        keeping(go(
            Phase::Stable,
            "Promoted",
            format!("promoted: {r}/{r} replicas on {image}"),
        ))
    }

    pub(super) fn rolling_back_two_sets(&mut self) -> Next<Phase> {
        let r = self.replicas();
        let stable_image = self.stable_image();
        if !self.canary_drained() {
            // The stable replicas must serve, on the stable image, before the canary stops.
            let keep = self.o.stable.as_ref().map_or(r, |s| s.replicas);
            let stable = self
                .ensure(self.main_shape(&stable_image, keep, 0))
                .cloned();
            if !Self::settled(stable.as_ref(), keep) {
                return Next::Stay(format!(
                    "waiting for the {keep} stable replica(s) on {stable_image} to be Ready before stopping the canary"
                ));
            }
            // All traffic back to stable before a canary pod stops.
            if let Some(why) = self.traffic_at(Want::stable()) {
                return Next::Stay(format!("moving all traffic back to stable first: {why}"));
            }
            self.drain_canary();
            return Next::Stay("stopping the canary pods".into());
        }
        let canary_range = r - self.spec().canary_replicas.clamp(1, r.max(1))..r;
        if let Some(why) = self.hand_over(canary_range, Role::Canary, Role::Stable) {
            return Next::Stay(format!("handing volumes back to the stable set: {why}"));
        }
        let stable = self.ensure(self.main_shape(&stable_image, r, 0)).cloned();
        if !Self::settled(stable.as_ref(), r) {
            return Next::Stay(format!(
                "scaling the stable set back to {r} on {stable_image} ({} ready)",
                stable.map_or(0, |s| s.ready_replicas)
            ));
        }
        if let Some(waiting) = self.delete_canary_set() {
            return waiting;
        }
        self.finish_rollback()
    }

    /// Deletes the canary set while it exists. A finished phase (Stable, RolledBack) is
    /// written before its actions run, so it must not be reached while the set is still
    /// there: readers of the phase would see it with the set.
    pub(super) fn delete_canary_set(&mut self) -> Option<Next<Phase>> {
        self.o.canary.as_ref()?;
        self.actions.push(Action::DeleteSet {
            name: Role::Canary.set_name(&self.r.reference.name),
        });
        Some(Next::Stay("deleting the canary set".into()))
    }

    pub(super) fn finish_rollback(&mut self) -> Next<Phase> {
        self.st.replica_volumes.clear();
        let r = self.replicas();
        let stable = self.stable_image();
        self.st.current_step = None;
        let why = analysis::failure(&self.st.analysis).map_or(String::new(), |f| format!(" ({f})"));
        keeping(go_warning(
            Phase::RolledBack,
            "RolledBack",
            format!(
                "rolled back: {r}/{r} replicas on {stable}; {} was not promoted{why}",
                self.canary_image()
            ),
        ))
    }

    // --- Partition -------------------------------------------------------------------------
}
