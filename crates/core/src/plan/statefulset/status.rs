//! The plan's last part: the status fields, conditions and timer that follow from where the
//! machine stopped.

use super::*;
use crate::plan::series;

impl<'a> Planner<'a> {
    pub(super) fn finish(mut self, message: String) -> Finished<CanaryStatefulSetStatus> {
        let r = self.replicas();
        let phase = self.st.phase.unwrap_or(Phase::Initializing);
        let (ready, canary_ready, ready_by_image) = self.readiness(phase);
        if progressing_phase(phase) && self.st.canary_image.is_none() {
            self.st.canary_image = Some(self.spec().image.clone());
        }
        let (stable_revision, canary_revision) = self.revisions();
        if reads_abort(phase) {
            if let Some(after) = analysis::next_due(&self.st.analysis, &self.r.analysis, self.now) {
                self.timer(after);
            }
        } else {
            analysis::stop_runs(&mut self.st.analysis);
        }
        // Nothing is stable before the first Stable: a revision shown while Initializing would
        // cost every new rollout one more status write (the set's controller sets it later).
        self.st.stable_revision = stable_revision.filter(|_| phase != Phase::Initializing);
        self.st.canary_revision = canary_revision.filter(|_| progressing_phase(phase));
        self.st.ready_replicas = ready;
        self.st.canary_ready_replicas = canary_ready;
        // The count the plan sizes the sets to (stable and canary together): it follows a new
        // count once acted on, and does not move as the sets appear (one status per new rollout).
        self.st.replicas = r;
        self.st.selector = Some(crate::api::pods_selector(&self.r.reference.name));
        if phase == Phase::Stable {
            self.check_stable_volumes();
        }
        self.st.ready_by_image = ready_by_image;
        self.st.ready = Some(format!("{ready}/{r}"));
        self.st.observed_generation = self.r.generation;
        self.settle_traffic();
        // During a canary, and the point of the move that ended it: a settled rollout's
        // pods (an autoscaler's, a restart) are not the canary's chart.
        let entered = self
            .st
            .phase_since
            .as_ref()
            .is_some_and(|t| t.0 == self.now);
        if progressing_phase(phase) || entered {
            let reading = series::Reading {
                weight: self.st.canary_weight,
                baseline_weight: None,
                ready: &self.st.ready_by_image,
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

        // A new image a fleet holds is still to come: not settled, and not stuck either.
        let held = self.r.fleet_hold.is_some()
            && self.st.stable_image.as_deref() != Some(self.r.spec.image.as_str());
        let standing = match phase {
            Phase::Stable | Phase::RolledBack if held => Standing::Working,
            // Every pod ready on the set's current revision: a template change rolling
            // through the pods (same image) is not settled yet.
            Phase::Stable if ready >= r && Self::settled(self.o.stable.as_ref(), r) => {
                Standing::Settled
            }
            Phase::RolledBack | Phase::Failed => Standing::Stuck,
            _ => Standing::Working,
        };
        Finished {
            status: self.st,
            actions: self.actions,
            requeue: self.requeue,
            standing,
            events: self.events,
        }
    }

    /// The pods ready, the canary's ready, and the ready pods by image.
    fn readiness(&self, phase: Phase) -> (i32, i32, Vec<crate::api::ImageReplicas>) {
        // Without a canary the set's status tells, as it decides Stable (see `reads_pods`).
        let ready = match phase {
            Phase::Initializing | Phase::Stable => {
                self.o.stable.as_ref().map_or(0, |s| s.ready_replicas)
            }
            _ => self
                .o
                .pods
                .iter()
                .filter(|p| p.ready && !p.deleting)
                .count() as i32,
        };
        // A Failed rollout still shows the canary it runs (issue 44: it showed none); with one
        // set, only pods of a revision other than the stable one are a canary.
        let partition_canary = self.o.stable.as_ref().is_some_and(|s| {
            s.update_revision.is_some() && s.update_revision != s.current_revision
        });
        let mut canary_ready = match phase {
            Phase::Stable | Phase::Initializing | Phase::RolledBack => 0,
            Phase::Failed if !self.two_sets() && !partition_canary => 0,
            _ => self
                .canary_pods()
                .iter()
                .filter(|p| p.ready && !p.deleting)
                .count() as i32,
        };
        let ready_by_image = self.ready_by_image(phase, ready);
        // Where the pods are read, the canary is what runs its image (issue 69: a Failed
        // rollout said `0 canary ready` while its canary pod was Ready).
        if reads_pods(Some(phase))
            && let Some(canary) = self
                .st
                .canary_image
                .as_deref()
                .filter(|c| Some(*c) != self.st.stable_image.as_deref())
        {
            canary_ready = ready_by_image
                .iter()
                .find(|r| r.image == canary)
                .map_or(0, |r| r.replicas);
        }
        (ready, canary_ready, ready_by_image)
    }

    /// The stable set's current revision, and the canary's (the canary set's, or with one
    /// set its update revision when it is not the stable one).
    fn revisions(&self) -> (Option<String>, Option<String>) {
        let stable_set = self.o.stable.as_ref();
        let stable_revision = stable_set.and_then(|s| s.current_revision.clone());
        let canary_revision = if self.two_sets() {
            self.o
                .canary
                .as_ref()
                .and_then(|c| c.update_revision.clone())
        } else {
            stable_set
                .and_then(|s| s.update_revision.clone())
                .filter(|u| Some(u) != stable_revision.as_ref())
        };
        (stable_revision, canary_revision)
    }

    /// Records the volume each stable replica's claim is on, the first time it is seen bound;
    /// returns the replicas whose claim is now on another volume while the recorded one is
    /// still there. Claims of replicas scaled away (or templates removed) are forgotten.
    fn record_stable_volumes(&mut self, set: &str) -> Vec<ReplacedVolume> {
        let mut replaced = Vec::new();
        let mut current = std::collections::BTreeSet::new();
        for t in claim_templates(self.spec()) {
            for k in 0..self.replicas() {
                let claim = claim_name(&t, set, k);
                current.insert(claim.clone());
                let Some(now) = self
                    .o
                    .claims
                    .iter()
                    .find(|c| c.name == claim && c.bound && !c.deleting)
                    .and_then(|c| c.volume.clone())
                else {
                    continue;
                };
                let Some(was) = self.st.stable_volumes.get(&claim).cloned() else {
                    self.st.stable_volumes.insert(claim, now);
                    continue;
                };
                if was == now {
                    continue;
                }
                match self.o.volumes.iter().find(|v| v.name == was) {
                    // Gone: the new volume is the replica's now.
                    None => {
                        self.st.stable_volumes.insert(claim, now);
                    }
                    Some(v) => replaced.push(ReplacedVolume {
                        claim,
                        replica: k,
                        was,
                        now,
                        retained: v.retain,
                    }),
                }
            }
        }
        self.st
            .stable_volumes
            .retain(|claim, _| current.contains(claim));
        replaced
    }

    /// Records each stable replica's volume while Stable, and says when a claim is found on
    /// another one (issue 69: the StatefulSet controller gave a replica whose claim was
    /// deleted with its pod a new, empty volume, and nothing was said).
    fn check_stable_volumes(&mut self) {
        use crate::api::condition::VOLUME_REPLACED;
        let set = self.main_role().set_name(&self.r.reference.name);
        let replaced = self.record_stable_volumes(&set);
        let conditions = &mut self.st.conditions;
        if replaced.is_empty() {
            if crate::api::find_condition(conditions, VOLUME_REPLACED).is_some() {
                super::super::machine::set_condition(
                    conditions,
                    VOLUME_REPLACED,
                    false,
                    "VolumesKept",
                    "every replica's claim is on the volume recorded for it",
                    self.now,
                );
            }
            return;
        }
        let said: Vec<String> = replaced.iter().map(|r| r.advice(&set)).collect();
        let message = said.join("; ");
        let conditions = &mut self.st.conditions;
        let already = crate::api::find_condition(conditions, VOLUME_REPLACED).is_some_and(|c| {
            c.status == "True" && c.message == message.chars().take(1000).collect::<String>()
        });
        super::super::machine::set_condition(
            conditions,
            VOLUME_REPLACED,
            true,
            "ClaimOnAnotherVolume",
            &message,
            self.now,
        );
        if !already {
            self.events.push(crate::plan::actions::PlanEvent {
                warning: true,
                reason: "VolumeReplaced",
                message,
            });
        }
    }

    /// Ready pods by image: from the pods where the plan reads them, else (Initializing,
    /// Stable) from the stable set, whose ready pods run its template's image once settled.
    fn ready_by_image(&self, phase: Phase, ready: i32) -> Vec<crate::api::ImageReplicas> {
        let mut by_image: std::collections::BTreeMap<String, i32> = Default::default();
        if reads_pods(Some(phase)) {
            for p in self.o.pods.iter().filter(|p| p.ready && !p.deleting) {
                let image = p
                    .image
                    .clone()
                    .unwrap_or_else(|| crate::plan::objects::UNKNOWN_IMAGE.into());
                *by_image.entry(image).or_default() += 1;
            }
        } else if ready > 0 {
            let image = self
                .o
                .stable
                .as_ref()
                .and_then(|s| s.image.clone())
                .unwrap_or_else(|| crate::plan::objects::UNKNOWN_IMAGE.into());
            by_image.insert(image, ready);
        }
        by_image
            .into_iter()
            .map(|(image, replicas)| crate::api::ImageReplicas { image, replicas })
            .collect()
    }
}

/// A stable replica whose claim is on another volume than the one recorded for it.
struct ReplacedVolume {
    claim: String,
    replica: i32,
    /// The recorded volume, where the replica's data is.
    was: String,
    now: String,
    /// Whether `was` is kept (reclaim policy Retain).
    retained: bool,
}

impl ReplacedVolume {
    /// What to do to put the replica back on its data (pods of set `set`).
    fn advice(&self, set: &str) -> String {
        let ReplacedVolume {
            claim,
            replica: k,
            was,
            now,
            retained,
        } = self;
        let back = if *retained {
            format!(
                "{was} is kept (Retain): to put replica {k} back on it, scale the rollout below \
                 {k} (or delete pod {set}-{k} and claim {claim} together), clear {was}'s \
                 claimRef, and create claim {claim} with volumeName {was}"
            )
        } else {
            format!(
                "{was} has reclaim policy Delete: set it to Retain at once to keep replica {k}'s \
                 data"
            )
        };
        format!("claim {claim} is on volume {now}, not {was} where replica {k}'s data is; {back}")
    }
}
