//! The first phases and what they check: a spec a live rollout cannot take (a change the API
//! server refuses, a template the handoff cannot follow), Initializing, Stable, and starting
//! a canary.

use super::*;

impl<'a> Planner<'a> {
    /// A claim of a handed-over replica on another volume than the replica's own (recorded at
    /// the handoff): deleted with its pod, and made again by the StatefulSet controller on a
    /// new volume (issue 44). The rollout stops rather than promote onto it.
    pub(super) fn volume_problem(&self) -> Option<String> {
        if !self.two_sets() || self.st.replica_volumes.is_empty() {
            return None;
        }
        let name = &self.r.reference.name;
        let (stable, canary) = (Role::Stable.set_name(name), Role::Canary.set_name(name));
        for t in claim_templates(self.spec()) {
            for k in 0..self.replicas() {
                let key = claim_name(&t, &canary, k);
                let Some(own) = self.st.replica_volumes.get(&key) else {
                    continue;
                };
                for set in [&canary, &stable] {
                    let claim = claim_name(&t, set, k);
                    let Some(c) = self.o.claim(&claim) else {
                        continue;
                    };
                    if c.volume.as_deref() == Some(own.as_str()) {
                        continue;
                    }
                    let other = c.volume.as_deref().unwrap_or("a volume not bound yet");
                    return Some(format!(
                        "claim {claim} is on {other}, not on replica {k}'s own volume {own}, which \
                         keeps its data: the claim was deleted with its pod and made again by \
                         the StatefulSet controller. linnet stops here and never hands {other} \
                         on. To carry on with {own}: scale StatefulSet {set} to 0 and delete \
                         claim {claim}; linnet then rolls the canary back onto {own}"
                    ));
                }
            }
        }
        None
    }

    /// A set linnet has not recorded a version for whose rolled-out container it cannot find:
    /// taking the spec's image as its version would replace every pod at once, no canary.
    fn unreadable_stable_problem(&self) -> Option<String> {
        if self.r.status.stable_image.is_some() {
            return None;
        }
        let set = self.o.stable.as_ref().filter(|s| s.image.is_none())?;
        let container = match &self.spec().container {
            Some(name) => format!("no container named {name}"),
            None => "no container".to_string(),
        };
        Some(format!(
            "StatefulSet {} already exists with {container}, so linnet cannot tell which \
             version its pods run and will not replace them all at once. Put the set's container \
             name back in Git (spec.container and the template) and rename it in a later \
             commit, once the rollout is Stable",
            set.name
        ))
    }

    /// What makes the spec impossible to act on, with the event's reason: a template linnet
    /// cannot roll out, or a change the live sets cannot take.
    pub(super) fn spec_problem(&self) -> Option<(&'static str, String)> {
        if let Some(problem) = self.template_problem() {
            return Some(("InvalidSpec", problem));
        }
        let located = |text: String| match &self.r.source_path {
            Some(path) => format!("{path}: {text}"),
            None => text,
        };
        if let Some(other) = &self.o.other_strategy_set {
            let (now, before) = if self.two_sets() {
                ("TwoSets", "Partition")
            } else {
                ("Partition", "TwoSets")
            };
            return Some((
                "UnsafeChange",
                located(format!(
                    "spec.strategy.type changed to {now} while StatefulSet {other} still runs this rollout's \
                     {before} pods; a switch would start a second set of pods on new volumes. \
                     Put spec.strategy.type back to {before} in Git; to switch, delete the rollout \
                     (its claims and volumes stay) and create it again"
                )),
            ));
        }
        if let Some(problem) = self.held_ordinals_problem() {
            return Some(("UnsafeChange", located(problem)));
        }
        if let Some(problem) = self.unreadable_stable_problem() {
            return Some(("UnreadableSet", located(problem)));
        }
        let live = [
            (self.main_role(), self.o.stable.as_ref()),
            (Role::Canary, self.o.canary.as_ref()),
        ];
        for (role, set) in live {
            let Some((set, fixed)) = set.and_then(|s| Some((s, s.fixed.as_ref()?))) else {
                continue;
            };
            let shape = SetShape {
                role,
                image: "",
                replicas: 0,
                ordinals_start: 0,
                partition: 0,
            };
            let desired = stateful_set(&self.r.reference, self.spec(), &[], &shape);
            let changed = fixed.changed(&FixedSetFields::of_set(&desired));
            if !changed.is_empty() {
                return Some((
                    "UnsafeChange",
                    located(format!(
                        "{} changed, but Kubernetes cannot change it on the live StatefulSet {}; \
                         put it back in Git, or delete the rollout (its claims and volumes stay) \
                         and create it again",
                        changed.join(", "),
                        set.name
                    )),
                ));
            }
        }
        None
    }

    /// A change of `replicas`, `canaryReplicas` or `steps` that moves the canary's ordinals
    /// off the ones whose volumes it holds: the stable set would start those ordinals again on
    /// new, empty volumes (issue 44). Refused until the shape is back or the canary is done.
    pub(super) fn held_ordinals_problem(&self) -> Option<String> {
        if !self.two_sets() || self.st.replica_volumes.is_empty() {
            return None;
        }
        let canary = Role::Canary.set_name(&self.r.reference.name);
        let templates = claim_templates(self.spec());
        let held: std::collections::BTreeSet<i32> = self
            .st
            .replica_volumes
            .keys()
            .filter_map(|key| {
                templates.iter().find_map(|t| {
                    key.strip_prefix(&format!("{t}-{canary}-"))?
                        .parse::<i32>()
                        .ok()
                })
            })
            .collect();
        let (first, last) = (*held.first()?, *held.last()?);
        let r = self.replicas();
        let n = self.size(self.step_index());
        if first >= r - n && last < r {
            return None;
        }
        let ordinals = held
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        Some(format!(
            "spec.replicas, spec.canaryReplicas or spec.steps changed while the canary holds the \
             volumes of ordinal(s) {ordinals}: the new shape ({r} replicas, {n} canary) would \
             start them again in the stable set on new, empty volumes. Put them back in Git \
             ({} replicas and a canary of at least {}) and change them once the rollout is \
             Stable or RolledBack",
            last + 1,
            last + 1 - first
        ))
    }

    /// What makes the template impossible to roll out (the API server's rules cannot see it).
    pub(super) fn template_problem(&self) -> Option<String> {
        let pod = self.spec().template.get().template.spec;
        let containers = pod
            .as_ref()
            .map(|p| p.containers.as_slice())
            .unwrap_or_default();
        match self.spec().container.as_deref() {
            Some(c) if !containers.iter().any(|x| x.name == c) => Some(format!(
                "container {c:?} is not in the template; fix spec.container or the template in Git"
            )),
            None if containers.is_empty() => {
                Some("the template has no containers; add one in Git".into())
            }
            _ if self.replicas() == 0 => Some("replicas must be at least 1".into()),
            _ => None,
        }
    }

    pub(super) fn main_shape<'s>(
        &self,
        image: &'s str,
        replicas: i32,
        partition: i32,
    ) -> SetShape<'s> {
        SetShape {
            role: self.main_role(),
            image,
            replicas,
            ordinals_start: 0,
            partition,
        }
    }

    pub(super) fn initializing(&mut self) -> Next<Phase> {
        let image = self.stable_image();
        let r = self.replicas();
        let set = self.ensure(self.main_shape(&image, r, 0)).cloned();
        if Self::settled(set.as_ref(), r) {
            return go_quietly(Phase::Stable, format!("{r}/{r} replicas ready on {image}"));
        }
        Next::Stay(format!(
            "starting {r} replicas of {image} ({} ready)",
            set.map_or(0, |s| s.ready_replicas)
        ))
    }

    pub(super) fn stable(&mut self) -> Next<Phase> {
        let image = self.stable_image();
        if self.spec().image != image {
            if let Some(hold) = self.held_by_fleet() {
                return hold;
            }
            return self.start_canary();
        }
        let r = self.replicas();
        if self.ensure(self.main_shape(&image, r, 0)).is_none()
            && let Some(set) = &self.o.stable
        {
            return Next::Stay(format!(
                "{}/{r} replicas ready on {image}; putting back {} changed outside Git ({} replicas, image {})",
                set.ready_replicas,
                set.name,
                set.replicas,
                set.image.as_deref().unwrap_or("none"),
            ));
        }
        Next::Stay(format!(
            "{}/{r} replicas ready on {image}",
            self.o.stable.as_ref().map_or(0, |s| s.ready_replicas)
        ))
    }

    /// The stable set kept as it is while a fleet holds the new image ([`Rollout::fleet_hold`]).
    pub(super) fn held_by_fleet(&mut self) -> Option<Next<Phase>> {
        let why = self.r.fleet_hold.clone()?;
        let (image, r) = (self.stable_image(), self.replicas());
        self.ensure(self.main_shape(&image, r, 0));
        Some(Next::Stay(format!(
            "{} held on {image}: {why}",
            self.spec().image
        )))
    }

    pub(super) fn start_canary(&mut self) -> Next<Phase> {
        let image = self.spec().image.clone();
        self.st.canary_image = Some(image.clone());
        self.st.current_step = Some(0);
        // The charts of a new canary start with it.
        self.st.series.clear();
        self.st.promote_at_start = self.r.promote.clone();
        self.st.abort_at_start = self.r.abort.clone();
        analysis::start(&mut self.st.analysis, &self.r.analysis, self.now);
        let n = self.size(0);
        let r = self.replicas();
        let next = if self.two_sets() {
            Phase::ScalingDownStable
        } else {
            Phase::DeployingCanary
        };
        go(
            next,
            "CanaryStarted",
            format!(
                "canary of {image} on {n} of {r} replicas (ordinals {}..{}); stable stays on {}",
                r - n,
                r - 1,
                self.stable_image()
            ),
        )
    }

    // --- TwoSets -------------------------------------------------------------------------
}
