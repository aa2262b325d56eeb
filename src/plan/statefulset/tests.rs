//! Tests of the CanaryStatefulSet planner. A small model of the StatefulSet, PV binder and Job
//! controllers executes the plans, so whole rollouts run here in microseconds; the real
//! control plane runs them again in `tests/statefulset.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use jiff::Timestamp;
use proptest::prelude::*;

use super::*;
use crate::api::{Migration, Promotion, condition};
use crate::plan::analysis::Outcome;
use crate::plan::objects::claim_name;
use crate::plan::observed::{ClaimView, FixedSetFields, JobView, PodView, SetView, VolumeView};

const NAME: &str = "redis";

fn spec(strategy: StatefulSetStrategyType) -> CanaryStatefulSetSpec {
    serde_json::from_value(serde_json::json!({
        "replicas": 3,
        "canaryReplicas": 1,
        "image": "redis:1",
        "strategy": {"type": format!("{strategy:?}")},
        "template": {
            "serviceName": "redis",
            "selector": {"matchLabels": {"app": "redis"}},
            "template": {
                "metadata": {"labels": {"app": "redis"}},
                "spec": {"containers": [{"name": "redis", "image": "redis:1"}]}
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            }]
        }
    }))
    .unwrap()
}

/// A model of the cluster's controllers, enough to run plans to the end.
#[derive(Clone, Debug)]
struct Sim {
    spec: CanaryStatefulSetSpec,
    status: CanaryStatefulSetStatus,
    promote: Option<String>,
    abort: Option<String>,
    generation: i64,
    sets: BTreeMap<String, SimSet>,
    pods: BTreeMap<String, PodView>,
    claims: BTreeMap<String, ClaimView>,
    volumes: BTreeMap<String, VolumeView>,
    job: Option<JobView>,
    job_fails: bool,
    jobs_created: usize,
    now: Timestamp,
    next_id: u32,
    events: Vec<&'static str>,
    /// Actions executed, in order.
    log: Vec<Action>,
    /// Phases passed through.
    phases: Vec<Phase>,
    /// Every status written, with the generation it was planned for.
    written: Vec<(i64, CanaryStatefulSetStatus)>,
    /// The analysis the spec asks for, resolved, and what every measurement answers.
    analysis: Resolved,
    answer: Outcome,
    measurements: usize,
}

#[derive(Clone, Debug)]
struct SimSet {
    replicas: i32,
    start: i32,
    partition: i32,
    image: String,
    hash: String,
    fixed: FixedSetFields,
}

fn revision(image: &str) -> String {
    format!("rev-{image}")
}

impl Sim {
    fn new(strategy: StatefulSetStrategyType) -> Sim {
        Sim {
            spec: spec(strategy),
            status: CanaryStatefulSetStatus::default(),
            promote: None,
            abort: None,
            generation: 1,
            sets: BTreeMap::new(),
            pods: BTreeMap::new(),
            claims: BTreeMap::new(),
            volumes: BTreeMap::new(),
            job: None,
            job_fails: false,
            jobs_created: 0,
            now: Timestamp::from_second(1_700_000_000).unwrap(),
            next_id: 0,
            events: Vec::new(),
            log: Vec::new(),
            phases: Vec::new(),
            written: Vec::new(),
            analysis: Resolved::default(),
            answer: Outcome::Value(serde_json::json!(0.01)),
            measurements: 0,
        }
    }

    /// Takes the measurements due, as the controller does before it plans.
    fn measure(&mut self) {
        if self.status.phase.is_some_and(reads_abort) {
            self.measurements += analysis::testing::measure_due(
                &mut self.status.analysis,
                &self.analysis,
                &self.answer,
                self.now,
            );
        }
    }

    fn id(&mut self) -> String {
        self.next_id += 1;
        format!("{:03}", self.next_id)
    }

    /// The sets of the spec's strategy.
    fn strategy_sets(&self) -> &'static [&'static str] {
        match self.spec.strategy.type_ {
            StatefulSetStrategyType::TwoSets => &["redis-stable", "redis-canary"],
            StatefulSetStrategyType::Partition => &["redis"],
        }
    }

    fn observed(&self) -> Observed {
        let view = |name: &str| {
            self.sets.get(name).map(|s| {
                let pods: Vec<&PodView> = self.pods.values().filter(|p| p.set == name).collect();
                let updated = pods
                    .iter()
                    .filter(|p| p.revision.as_deref() == Some(revision(&s.image).as_str()))
                    .count() as i32;
                let all_updated = updated == s.replicas && pods.len() as i32 == s.replicas;
                SetView {
                    name: name.to_string(),
                    replicas: s.replicas,
                    status_fresh: true,
                    ready_replicas: pods.iter().filter(|p| p.ready).count() as i32,
                    updated_replicas: updated,
                    current_revision: Some(if all_updated {
                        revision(&s.image)
                    } else {
                        "old".into()
                    }),
                    update_revision: Some(revision(&s.image)),
                    applied_hash: Some(s.hash.clone()),
                    image: Some(s.image.clone()),
                    partition: s.partition,
                    fixed: Some(s.fixed.clone()),
                }
            })
        };
        let two = self.spec.strategy.type_ == StatefulSetStrategyType::TwoSets;
        let job_name = super::super::objects::migration_job_name(
            NAME,
            self.status
                .canary_image
                .as_deref()
                .unwrap_or(&self.spec.image),
        );
        Observed {
            stable: view(if two { "redis-stable" } else { "redis" }),
            canary: view("redis-canary"),
            pods: self.pods.values().cloned().collect(),
            claims: self.claims.values().cloned().collect(),
            volumes: self.volumes.values().cloned().collect(),
            job: self.job.clone().filter(|j| j.name == job_name),
            other_strategy_set: self
                .sets
                .keys()
                .find(|n| !self.strategy_sets().contains(&n.as_str()))
                .cloned(),
            deployments: Vec::new(),
        }
    }

    fn rollout(&self) -> Rollout<'_> {
        Rollout {
            reference: RolloutRef {
                name: NAME.into(),
                namespace: "ns".into(),
                uid: "uid-cr".into(),
                source: None,
            },
            generation: Some(self.generation),
            spec: &self.spec,
            promote: self.promote.clone(),
            abort: self.abort.clone(),
            source_revision: Some("abc".into()),
            source_path: Some("redis.yaml".into()),
            status: self.status.clone(),
            analysis: self.analysis.clone(),
        }
    }

    fn plan(&self) -> Plan {
        plan(&self.rollout(), &self.observed(), self.now)
    }

    /// Plans, writes the status, and executes the first `keep` actions (all when `None`), as
    /// the controller does: a crash mid-plan loses the rest of the actions.
    fn reconcile_partial(&mut self, keep: Option<usize>) -> Plan {
        self.measure();
        let p = self.plan();
        // Invariants that every plan must keep.
        check_plan(&self.rollout(), &self.observed(), &p);
        self.status = p.status.clone();
        self.written.push((self.generation, p.status.clone()));
        let n = keep.unwrap_or(p.actions.len()).min(p.actions.len());
        for a in &p.actions[..n] {
            self.execute(a);
        }
        if keep.is_none() {
            for e in &p.events {
                self.events.push(e.reason);
            }
            if self.phases.is_empty() && p.entered.is_empty() {
                self.phases.extend(p.status.phase);
            }
            self.phases.extend(p.entered.iter().copied());
            self.status = p.status.clone();
        }
        p
    }

    fn reconcile(&mut self) -> Plan {
        self.reconcile_partial(None)
    }

    fn execute(&mut self, a: &Action) {
        self.log.push(a.clone());
        match a {
            Action::ApplySet(set) => {
                let name = set.metadata.name.clone().unwrap();
                let spec = set.spec.clone().unwrap();
                let image =
                    crate::plan::observed::container_image(spec.template.spec.as_ref(), None)
                        .unwrap();
                let fixed = FixedSetFields::of_set(set);
                if let Some(live) = self.sets.get(&name) {
                    assert_eq!(
                        live.fixed, fixed,
                        "the API server refuses to change these fields of {name}"
                    );
                }
                self.sets.insert(
                    name,
                    SimSet {
                        replicas: spec.replicas.unwrap(),
                        start: spec.ordinals.and_then(|o| o.start).unwrap_or(0),
                        partition: spec
                            .update_strategy
                            .and_then(|u| u.rolling_update)
                            .and_then(|r| r.partition)
                            .unwrap_or(0),
                        image,
                        hash: applied_hash(set).unwrap().to_string(),
                        fixed,
                    },
                );
            }
            Action::ScaleSet { name, replicas } => {
                if let Some(s) = self.sets.get_mut(name) {
                    s.replicas = *replicas;
                    s.hash = "scaled".into();
                }
            }
            Action::DeleteSet { name } => {
                assert!(
                    !self.pods.values().any(|p| p.set == *name),
                    "deleted set {name} with pods"
                );
                self.sets.remove(name);
            }
            Action::RetainVolume { volume, handoff_to } => {
                let v = self.volumes.get_mut(volume).unwrap();
                v.retain = true;
                v.handoff_to = Some(handoff_to.clone());
            }
            Action::CreateClaim(c) => {
                let name = c.metadata.name.clone().unwrap();
                assert!(!self.claims.contains_key(&name), "claim {name} exists");
                let uid = format!("uid-{}", self.id());
                self.claims.insert(
                    name.clone(),
                    ClaimView {
                        name,
                        uid,
                        volume: c.spec.as_ref().and_then(|s| s.volume_name.clone()),
                        bound: false,
                        deleting: false,
                        bind_requested: None,
                    },
                );
            }
            Action::DeleteClaim { name, volume, .. } => {
                let v = &self.volumes[volume];
                assert!(
                    v.retain,
                    "deleted claim {name} of a volume that is not Retain"
                );
                self.claims.remove(name).expect("deleted claim exists");
            }
            Action::BindVolume {
                volume,
                claim,
                claim_uid,
            } => {
                self.volumes.get_mut(volume).unwrap().claim =
                    Some((claim.clone(), Some(claim_uid.clone())));
            }
            Action::RequestBind { claim, volume } => {
                self.claims.get_mut(claim).unwrap().bind_requested = Some(volume.clone());
            }
            Action::CreateJob(j) => {
                self.jobs_created += 1;
                self.job = Some(JobView {
                    name: j.metadata.name.clone().unwrap(),
                    succeeded: false,
                    failed: false,
                });
            }
            Action::DeletePod { name } => {
                self.pods.remove(name);
            }
            other => panic!("a CanaryStatefulSet plan asked to {}", other.describe()),
        }
    }

    /// One round of the cluster's controllers; then a second passes.
    fn tick(&mut self) {
        self.now += jiff::SignedDuration::from_secs(1);
        // Jobs finish.
        if let Some(j) = &mut self.job
            && !j.succeeded
            && !j.failed
        {
            if self.job_fails {
                j.failed = true;
            } else {
                j.succeeded = true;
            }
        }
        // The PV binder. Like the real one, it binds a handed-over claim only when the claim
        // changes after its volume points at it (else at a resync, which this never reaches).
        let volumes = self.volumes.clone();
        for c in self.claims.values_mut() {
            if let Some(v) = c.volume.as_ref().and_then(|v| volumes.get(v))
                && v.claim.as_ref() == Some(&(c.name.clone(), Some(c.uid.clone())))
                && c.bind_requested.as_ref() == c.volume.as_ref()
            {
                c.bound = true;
            }
        }
        // pvc-protection: a claim being deleted goes once no pod uses it; its volume stays,
        // Released, its claimRef still naming it.
        let pods = self.pods.clone();
        self.claims.retain(|name, c| {
            !c.deleting
                || pods
                    .values()
                    .any(|p| claim_name("data", &p.set, p.ordinal) == *name)
        });
        // The StatefulSet controller, one set at a time.
        let sets = self.sets.clone();
        for (name, set) in &sets {
            let range = set.start..set.start + set.replicas;
            // Scale down: remove pods outside the range.
            self.pods
                .retain(|_, p| p.set != *name || range.contains(&p.ordinal));
            // OrderedReady: create the lowest missing ordinal once all below are Ready.
            let mut blocked = false;
            for k in range.clone() {
                let pod = format!("{name}-{k}");
                match self.pods.get(&pod) {
                    Some(p) if p.ready => continue,
                    Some(_) => {
                        blocked = true;
                        break;
                    }
                    None => {}
                }
                let claim = claim_name("data", name, k);
                if !self.claims.contains_key(&claim) {
                    let pv = format!("pv-{}", self.id());
                    let uid = format!("uid-{}", self.id());
                    self.volumes.insert(
                        pv.clone(),
                        VolumeView {
                            name: pv.clone(),
                            retain: false,
                            claim: Some((claim.clone(), Some(uid.clone()))),
                            handoff_to: None,
                            storage_class: Some("local".into()),
                        },
                    );
                    self.claims.insert(
                        claim.clone(),
                        ClaimView {
                            name: claim.clone(),
                            uid,
                            volume: Some(pv),
                            bound: true,
                            deleting: false,
                            bind_requested: None,
                        },
                    );
                }
                let ready = self.claims[&claim].bound && !set.image.ends_with(":broken");
                let rev = if k >= set.partition {
                    revision(&set.image)
                } else {
                    self.pods
                        .get(&pod)
                        .and_then(|p| p.revision.clone())
                        .unwrap_or_else(|| "old".into())
                };
                self.pods.insert(
                    pod.clone(),
                    PodView {
                        name: pod,
                        set: name.clone(),
                        ordinal: k,
                        ready,
                        ready_since: ready.then_some(self.now),
                        revision: Some(rev),
                        deleting: false,
                    },
                );
                blocked = true;
                break;
            }
            // Rolling update, highest ordinal first, only when every pod is Ready.
            if !blocked {
                let stale = self
                    .pods
                    .values()
                    .filter(|p| {
                        p.set == *name
                            && p.ordinal >= set.partition
                            && p.revision.as_deref() != Some(revision(&set.image).as_str())
                    })
                    .map(|p| (p.ordinal, p.name.clone()))
                    .max();
                if let Some((_, pod)) = stale {
                    self.pods.remove(&pod);
                }
            }
        }
    }

    /// Reconciles and ticks until `done` or a bound, checking the invariants each round.
    fn run_until(&mut self, what: &str, done: impl Fn(&Sim) -> bool) {
        for _ in 0..300 {
            if done(self) {
                return;
            }
            self.reconcile();
            self.check_ready_floor();
            self.tick();
        }
        panic!(
            "never reached: {what}; phase {:?}: {:?}\nphases {:?}\nlast actions {:?}",
            self.status.phase,
            self.status.message,
            self.phases,
            self.log.iter().rev().take(5).collect::<Vec<_>>()
        );
    }

    fn phase(&self) -> Option<Phase> {
        self.status.phase
    }

    fn check_ready_floor(&self) {
        // Once the rollout has first been Stable, and while canaries are healthy.
        if !self.phases.contains(&Phase::Stable) || self.spec.image.ends_with(":broken") {
            return;
        }
        let ready = self.pods.values().filter(|p| p.ready).count() as i32;
        let floor = self.spec.replicas - self.spec.canary_replicas;
        assert!(
            ready >= floor,
            "Ready dropped to {ready} (< {floor}) in {:?}: {:?}",
            self.status.phase,
            self.pods.keys().collect::<Vec<_>>()
        );
    }

    /// Replica k's volume, by the pod (or claim) that holds ordinal k now.
    fn volume_of(&self, k: i32) -> String {
        let holders: Vec<&ClaimView> = self
            .claims
            .values()
            .filter(|c| c.name.ends_with(&format!("-{k}")) && c.bound)
            .collect();
        assert_eq!(holders.len(), 1, "ordinal {k} has claims {holders:?}");
        holders[0].volume.clone().unwrap()
    }

    fn volumes_by_ordinal(&self) -> Vec<String> {
        (0..self.spec.replicas).map(|k| self.volume_of(k)).collect()
    }

    fn stabilise(&mut self) {
        self.run_until("Stable", |s| s.phase() == Some(Phase::Stable));
    }
}

/// Invariants every single plan keeps, whatever it observed.
fn check_plan(r: &Rollout<'_>, o: &Observed, p: &Plan) {
    let replicas = r.spec.replicas;
    let floor = replicas - r.spec.canary_replicas;
    // The canary never outgrows the step the new status records.
    let step = p.status.current_step.unwrap_or(0).max(0) as usize;
    let max_step = r
        .spec
        .steps
        .as_ref()
        .and_then(|s| s.get(step).copied())
        .unwrap_or(r.spec.canary_replicas);
    // Exactly one kstatus condition is true, and Ready only when settled on Git's image.
    if crate::plan::machine::standing_of(&p.status.conditions)
        == crate::plan::machine::Standing::Settled
    {
        assert_eq!(p.status.phase, Some(Phase::Stable));
        assert_eq!(
            p.status.stable_image.as_deref(),
            Some(r.spec.image.as_str())
        );
        assert!(p.status.ready_replicas >= replicas, "{:?}", p.status);
    }
    for a in &p.actions {
        // Status is written before the actions run: a finished phase written in the same
        // plan as the canary's deletion was read, in the cluster tests, with the set still
        // there (regression: abort_by_annotation_rolls_back saw redis-canary at 0).
        if let Action::DeleteSet { name } = a {
            assert!(
                !(name.ends_with("-canary")
                    && matches!(p.status.phase, Some(Phase::Stable | Phase::RolledBack))),
                "{:?} written in the plan that deletes {name}",
                p.status.phase
            );
        }
        match a {
            Action::ApplySet(set) => {
                let spec = set.spec.as_ref().unwrap();
                let n = spec.replicas.unwrap();
                let name = set.metadata.name.as_deref().unwrap();
                if name.ends_with("-canary") {
                    assert!(n <= max_step, "canary set asks for {n} > {max_step}");
                } else if name.ends_with("-stable") {
                    assert!(n >= floor, "stable set asks for {n} < {floor}");
                }
                if let Some(part) = spec
                    .update_strategy
                    .as_ref()
                    .and_then(|u| u.rolling_update.as_ref())
                    .and_then(|r| r.partition)
                {
                    assert!(part >= floor || part == 0, "partition {part} below {floor}");
                }
                let retention = spec
                    .persistent_volume_claim_retention_policy
                    .as_ref()
                    .unwrap();
                assert_eq!(retention.when_deleted.as_deref(), Some("Retain"));
                assert_eq!(retention.when_scaled.as_deref(), Some("Retain"));
            }
            Action::DeleteClaim { name, volume, to } => {
                let v = o.volumes.iter().find(|v| v.name == *volume).unwrap();
                assert!(
                    v.retain,
                    "claim {name} deleted while {volume} is not Retain"
                );
                assert_eq!(v.handoff_to.as_deref(), Some(to.as_str()));
                assert!(
                    o.claim(to).is_some(),
                    "claim {name} deleted before {to} exists"
                );
                let claim = o.claim(name).unwrap();
                assert_eq!(claim.volume.as_deref(), Some(volume.as_str()));
                let ordinal = name.rsplit('-').next().unwrap();
                assert!(
                    !o.pods
                        .iter()
                        .any(|p| name.ends_with(&format!("{}-{ordinal}", p.set))
                            && p.ordinal.to_string() == ordinal),
                    "claim {name} deleted while its pod runs"
                );
            }
            _ => {}
        }
    }
}

fn two_sets() -> Sim {
    Sim::new(StatefulSetStrategyType::TwoSets)
}

fn partition() -> Sim {
    Sim::new(StatefulSetStrategyType::Partition)
}

#[test]
fn initializing_creates_the_stable_set_and_becomes_stable() {
    let mut s = two_sets();
    let first = s.reconcile();
    assert_eq!(first.status.phase, Some(Phase::Initializing));
    assert!(
        matches!(&first.actions[..], [Action::ApplySet(set)] if set.metadata.name.as_deref() == Some("redis-stable"))
    );
    s.stabilise();
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:1"));
    assert_eq!(s.status.ready.as_deref(), Some("3/3"));
    assert!(s.events.contains(&"Available"));
    // Stable and nothing changed: no actions at all.
    assert!(s.reconcile().actions.is_empty());
}

#[test]
fn a_stable_set_scaled_by_hand_is_put_back() {
    // Issue 18: the set's own hash was all `ensure` compared, so 3 -> 1 by hand stayed.
    for mut s in [two_sets(), partition()] {
        s.stabilise();
        let name = s.sets.keys().next().unwrap().clone();
        s.sets.get_mut(&name).unwrap().replicas = 1;
        let p = s.reconcile();
        assert!(
            p.actions.iter().any(|a| matches!(a, Action::ApplySet(set)
                if set.spec.as_ref().and_then(|s| s.replicas) == Some(3))),
            "{:?}",
            p.actions
        );
        assert!(
            p.status
                .message
                .as_deref()
                .unwrap_or("")
                .contains("changed outside Git"),
            "{:?}",
            p.status.message
        );
        s.stabilise();
        assert_eq!(s.sets[&name].replicas, 3);
        assert!(s.reconcile().actions.is_empty());
    }
}

#[test]
fn two_sets_walkthrough_keeps_every_volume_with_its_replica() {
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();

    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(
        s.phases,
        [
            Phase::Initializing,
            Phase::Stable,
            Phase::ScalingDownStable,
            Phase::DeployingCanary,
            Phase::CanaryActive
        ]
    );
    assert_eq!(s.sets["redis-stable"].replicas, 2);
    assert_eq!(s.sets["redis-canary"].start, 2);
    assert!(s.pods.contains_key("redis-canary-2"));
    assert!(s.claims.contains_key("data-redis-canary-2"));
    assert!(!s.claims.contains_key("data-redis-stable-2"));
    assert_eq!(
        s.volumes_by_ordinal(),
        before,
        "the canary got replica 2's own volume"
    );
    assert_eq!(s.status.canary_image.as_deref(), Some("redis:2"));

    // Manual promotion waits for the annotation.
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::CanaryActive));
    assert!(
        s.status
            .message
            .as_deref()
            .unwrap()
            .contains("waiting for promotion")
    );

    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:2"));
    assert_eq!(s.status.canary_image, None);
    assert!(!s.sets.contains_key("redis-canary"));
    assert_eq!(s.sets["redis-stable"].replicas, 3);
    assert!(
        s.pods
            .values()
            .all(|p| p.revision.as_deref() == Some("rev-redis:2"))
    );
    assert_eq!(s.volumes_by_ordinal(), before, "promotion moved a volume");
    assert!(s.events.contains(&"Promoted"));
    assert_eq!(s.volumes.len(), 3, "a volume was created or lost");
}

/// Regression: volumes left Released by an earlier rollout of the same name in the same
/// namespace carry the same handoff annotation and claimRef names; the handoff picked one and
/// stalled. Only a live claim's volumeName identifies a replica's volume.
#[test]
fn stale_volumes_of_an_earlier_rollout_with_the_same_name_are_ignored() {
    let mut s = two_sets();
    for (name, claim) in [
        ("pv-old-a", "data-redis-canary-2"),
        ("pv-old-b", "data-redis-stable-2"),
    ] {
        s.volumes.insert(
            name.into(),
            VolumeView {
                name: name.into(),
                retain: true,
                claim: Some((claim.into(), Some("uid-of-a-deleted-claim".into()))),
                handoff_to: Some("data-redis-canary-2".into()),
                storage_class: Some("local".into()),
            },
        );
    }
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.promote = Some("redis:2".into());
    s.run_until("promoted", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert_eq!(s.volumes_by_ordinal(), before);
    for stale in ["pv-old-a", "pv-old-b"] {
        assert_eq!(
            s.volumes[stale].claim.as_ref().map(|c| c.1.as_deref()),
            Some(Some("uid-of-a-deleted-claim")),
            "{stale} was touched"
        );
    }
}

#[test]
fn a_promote_annotation_left_from_an_earlier_canary_does_not_promote_the_next() {
    let mut s = two_sets();
    s.stabilise();
    s.promote = Some("true".into());
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::CanaryActive));
    assert!(s.status.message.as_deref().unwrap().contains("already"));
    // Naming the canary's image promotes it.
    s.promote = Some("redis:2".into());
    s.stabilise();
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:2"));
}

#[test]
fn auto_promotion_waits_for_the_bake_time() {
    let mut s = two_sets();
    s.spec.promotion = Promotion {
        type_: PromotionType::Auto,
        bake_seconds: 30,
    };
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::CanaryActive));
    let after = p.requeue_after.expect("a bake timer");
    assert!(
        after <= Duration::from_secs(31) && after >= Duration::from_secs(20),
        "{after:?}"
    );
    s.now += jiff::SignedDuration::from_secs(31);
    s.stabilise();
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:2"));
}

#[test]
fn a_broken_canary_rolls_back_at_the_deadline_with_volumes_back_in_place() {
    let mut s = two_sets();
    s.spec.progress_deadline_seconds = 20;
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:broken".into();
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(s.events.contains(&"ProgressDeadlineExceeded"));
    assert!(s.events.contains(&"RolledBack"));
    assert!(!s.sets.contains_key("redis-canary"));
    assert_eq!(s.sets["redis-stable"].replicas, 3);
    assert_eq!(s.sets["redis-stable"].image, "redis:1");
    assert_eq!(s.volumes_by_ordinal(), before);
    assert_eq!(s.status.canary_image.as_deref(), Some("redis:broken"));
    let stalled = crate::api::find_condition(&s.status.conditions, condition::STALLED).unwrap();
    assert_eq!(stalled.status, "True");
    // It stays rolled back until Git changes the image.
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::RolledBack));
    s.spec.image = "redis:1".into();
    s.stabilise();
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn abort_by_annotation_rolls_back() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(s.events.contains(&"Aborted"));
    assert_eq!(s.sets["redis-stable"].image, "redis:1");
}

#[test]
fn reverting_the_image_in_git_rolls_back_then_is_stable() {
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.spec.image = "redis:1".into();
    s.phases.clear();
    s.stabilise();
    assert_eq!(
        s.phases,
        [Phase::RollingBack, Phase::RolledBack, Phase::Stable]
    );
    assert!(s.events.contains(&"Reverted"));
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn a_new_image_during_a_canary_ends_it_before_starting_the_next() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.spec.image = "redis:3".into();
    s.phases.clear();
    s.run_until("CanaryActive on 3", |s| {
        s.phase() == Some(Phase::CanaryActive)
            && s.status.canary_image.as_deref() == Some("redis:3")
    });
    assert!(s.events.contains(&"Superseded"));
    assert_eq!(s.phases[..2], [Phase::RollingBack, Phase::RolledBack]);
    assert_eq!(s.sets["redis-canary"].image, "redis:3");
}

#[test]
fn steps_bring_the_canary_up_in_batches() {
    let mut s = two_sets();
    s.spec.canary_replicas = 2;
    s.spec.steps = Some(vec![1, 2]);
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("step 1 done", |s| s.events.contains(&"StepComplete"));
    assert_eq!(s.sets["redis-canary"].replicas, 1);
    assert_eq!(s.sets["redis-canary"].start, 2);
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(s.sets["redis-canary"].replicas, 2);
    assert_eq!(s.sets["redis-canary"].start, 1);
    assert_eq!(s.sets["redis-stable"].replicas, 1);
    assert_eq!(s.volumes_by_ordinal(), before);
    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn migration_runs_once_then_promotes() {
    let mut s = two_sets();
    s.spec.migration = Some(Migration {
        template: serde_json::from_value(serde_json::json!({
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "migrate:1"}]}}}
        }))
        .unwrap(),
    });
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.promote = None;
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(s.jobs_created, 1);
    for ph in [
        Phase::AwaitingMigration,
        Phase::MigratingData,
        Phase::Promoting,
    ] {
        assert!(s.phases.contains(&ph), "{ph:?} missing from {:?}", s.phases);
    }
}

#[test]
fn a_failed_migration_rolls_back_and_never_runs_again() {
    let mut s = two_sets();
    s.spec.migration = Some(Migration {
        template: serde_json::from_value(
            serde_json::json!({"spec": {"template": {"spec": {"containers": []}}}}),
        )
        .unwrap(),
    });
    s.job_fails = true;
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.promote = Some("redis:2".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(s.phases.contains(&Phase::MigrationFailed));
    assert_eq!(s.jobs_created, 1);
    assert_eq!(s.volumes_by_ordinal(), before);
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.jobs_created, 1);
}

#[test]
fn partition_walkthrough_and_promotion() {
    let mut s = partition();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(s.sets["redis"].partition, 2);
    assert_eq!(s.pods["redis-2"].revision.as_deref(), Some("rev-redis:2"));
    assert_eq!(s.pods["redis-1"].revision.as_deref(), Some("rev-redis:1"));
    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(s.sets["redis"].partition, 0);
    assert!(
        s.pods
            .values()
            .all(|p| p.revision.as_deref() == Some("rev-redis:2"))
    );
    assert_eq!(s.volumes_by_ordinal(), before);
    assert!(
        !s.log
            .iter()
            .any(|a| matches!(a, Action::DeleteClaim { .. }))
    );
}

#[test]
fn partition_rollback_recreates_the_pod_stuck_on_the_bad_revision() {
    let mut s = partition();
    s.spec.progress_deadline_seconds = 10;
    s.stabilise();
    s.spec.image = "redis:broken".into();
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(
        s.log
            .iter()
            .any(|a| matches!(a, Action::DeletePod { name } if name == "redis-2"))
    );
    assert!(
        s.pods
            .values()
            .all(|p| p.ready && p.revision.as_deref() == Some("rev-redis:1"))
    );
}

#[test]
fn cleanup_scales_down_waits_then_deletes_and_keeps_claims() {
    let mut s = two_sets();
    s.stabilise();
    let claims = s.claims.len();
    for _ in 0..20 {
        let (actions, waiting) = plan_cleanup(&s.observed());
        for a in &actions {
            assert!(!matches!(a, Action::DeleteClaim { .. }));
            s.execute(a);
        }
        if waiting.is_none() && s.sets.is_empty() {
            break;
        }
        s.tick();
    }
    assert!(s.sets.is_empty() && s.pods.is_empty());
    assert_eq!(s.claims.len(), claims);
}

#[test]
fn an_interrupted_handoff_carries_on_after_a_crash_at_every_point() {
    // Crash after each possible number of actions in every plan of a full rollout.
    for crash_at in 0..4 {
        let mut s = two_sets();
        s.stabilise();
        let before = s.volumes_by_ordinal();
        s.spec.image = "redis:2".into();
        s.promote = Some("redis:2".into());
        for round in 0..400 {
            if s.phase() == Some(Phase::Stable)
                && s.status.stable_image.as_deref() == Some("redis:2")
            {
                break;
            }
            if round % 3 == 0 {
                s.reconcile_partial(Some(crash_at));
            } else {
                s.reconcile();
            }
            s.tick();
        }
        assert_eq!(
            s.status.stable_image.as_deref(),
            Some("redis:2"),
            "crash at {crash_at}"
        );
        assert_eq!(s.volumes_by_ordinal(), before, "crash at {crash_at}");
    }
}

#[test]
fn abort_while_scaling_down_the_stable_set_rolls_back() {
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.reconcile();
    assert_eq!(s.phase(), Some(Phase::ScalingDownStable));
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(
        s.phases[2..],
        [
            Phase::ScalingDownStable,
            Phase::RollingBack,
            Phase::RolledBack
        ]
    );
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn a_missing_container_fails_until_the_spec_is_fixed() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.container = Some("sidecar".into());
    s.generation += 1;
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::Failed));
    assert!(p.actions.is_empty());
    assert!(
        p.status
            .message
            .unwrap()
            .contains("\"sidecar\" is not in the template")
    );
    let stalled = crate::api::find_condition(&p.status.conditions, condition::STALLED);
    assert_eq!(stalled.unwrap().status, "True");
    s.spec.container = Some("redis".into());
    s.generation += 1;
    s.stabilise();
    assert_eq!(s.phases[2..], [Phase::Failed, Phase::Stable]);
}

#[test]
fn status_names_the_revisions_during_a_canary() {
    let mut s = two_sets();
    s.stabilise();
    assert_eq!(s.status.stable_revision.as_deref(), Some("rev-redis:1"));
    assert_eq!(s.status.canary_revision, None);
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.reconcile();
    assert_eq!(s.status.canary_revision.as_deref(), Some("rev-redis:2"));
    assert_eq!(s.status.source_revision.as_deref(), Some("abc"));
}

#[test]
fn conditions_keep_their_transition_time_while_unchanged() {
    let mut s = two_sets();
    s.stabilise();
    let t1 = s.status.conditions.clone();
    s.tick();
    let p = s.reconcile();
    assert_eq!(p.status.conditions, t1);
    assert_eq!(p.status, s.status);
}

#[test]
fn handoff_claims_are_bound_by_volume_name_and_not_owned() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.image = "redis:2".into();
    let mut created = None;
    for _ in 0..50 {
        let p = s.reconcile();
        if let Some(Action::CreateClaim(c)) = p
            .actions
            .iter()
            .find(|a| matches!(a, Action::CreateClaim(_)))
        {
            created = Some(c.clone());
            break;
        }
        s.tick();
    }
    let c = created.expect("a handoff claim");
    assert_eq!(c.metadata.name.as_deref(), Some("data-redis-canary-2"));
    assert!(c.metadata.owner_references.is_none());
    let spec = c.spec.unwrap();
    assert!(spec.volume_name.is_some());
    assert_eq!(spec.storage_class_name.as_deref(), Some("local"));
}

/// One thing that can happen between reconciles.
#[derive(Clone, Debug)]
enum Event {
    Tick,
    Image(u8),
    Promote(bool),
    Abort(bool),
    Crash(usize),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => Just(Event::Tick),
        1 => (0u8..4).prop_map(Event::Image),
        1 => any::<bool>().prop_map(Event::Promote),
        1 => any::<bool>().prop_map(Event::Abort),
        1 => (0usize..3).prop_map(Event::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random Git changes, crashes and clock ticks: every plan keeps the invariants (checked
    /// in `reconcile`), Ready never drops below the floor while canaries are healthy, no
    /// volume is ever lost, and once things calm down the rollout settles with every replica
    /// on its own volume.
    #[test]
    fn invariants_hold_over_random_histories(
        two in any::<bool>(),
        steps in any::<bool>(),
        events in proptest::collection::vec(event(), 1..60),
    ) {
        let mut s = if two { two_sets() } else { partition() };
        if steps {
            s.spec.canary_replicas = 2;
            s.spec.steps = Some(vec![1, 2]);
        }
        s.stabilise();
        let before = s.volumes_by_ordinal();
        let pv_count = s.volumes.len();
        for e in events {
            match e {
                Event::Tick => {
                    s.reconcile();
                    s.check_ready_floor();
                    s.tick();
                }
                Event::Image(i) => s.spec.image = format!("redis:{}", i + 1),
                Event::Promote(on) => s.promote = on.then(|| "true".into()),
                Event::Abort(on) => s.abort = on.then(|| "true".into()),
                Event::Crash(n) => {
                    s.reconcile_partial(Some(n));
                    s.tick();
                }
            }
            // Determinism: the same state plans the same way.
            prop_assert_eq!(s.plan(), s.plan());
            prop_assert!(s.volumes.len() >= pv_count, "a volume disappeared");
        }
        // Calm: Git settles on the last image, promoted.
        s.abort = None;
        s.promote = Some(s.spec.image.clone());
        s.run_until("settled", |s| {
            s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some(&s.spec.image)
                || s.phase() == Some(Phase::RolledBack)
        });
        if s.phase() == Some(Phase::RolledBack) {
            let image = s.status.stable_image.clone().unwrap();
            s.spec.image = image;
            s.stabilise();
        }
        prop_assert_eq!(s.volumes_by_ordinal(), before);
        prop_assert_eq!(s.volumes.len(), pv_count, "volumes were created: a replica lost its data");
    }
}

#[test]
fn a_refused_action_shows_as_stalled_until_the_plan_no_longer_needs_it() {
    // Issue 18: a 422 on every retry while status said Stable, Ready=True.
    let mut s = two_sets();
    s.stabilise();
    s.sets.get_mut("redis-stable").unwrap().replicas = 1;
    let p = s.plan();
    let apply = p.actions[0].describe();
    let mut blocked = p.status.clone();
    let failure = format!("{apply}: spec: Forbidden (Invalid, HTTP 422)");
    crate::plan::mark_action_failed(
        &mut blocked.conditions,
        &mut blocked.message,
        &failure,
        true,
        s.now,
    );
    s.status = blocked.clone();
    let condition = |st: &CanaryStatefulSetStatus, t: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    assert_eq!(
        condition(&blocked, "Ready"),
        Some(("False".into(), "ActionFailed".into()))
    );
    // A retry plans the same action: the status stays as written, so nothing is rewritten.
    let again = s.plan();
    assert_eq!(again.status, blocked);
    // Once the action went through, the failure is gone with it.
    s.sets.get_mut("redis-stable").unwrap().replicas = 3;
    let after = s.reconcile();
    assert!(after.actions.is_empty());
    assert_eq!(
        condition(&after.status, "Stalled"),
        Some(("False".into(), "Stable".into()))
    );
    assert_eq!(
        condition(&after.status, "Ready"),
        Some(("True".into(), "Stable".into()))
    );
}

#[test]
fn a_strategy_switch_on_a_live_rollout_is_refused_until_put_back() {
    // Issue 18: Partition -> TwoSets made redis-stable on new volumes beside redis: 8 pods for 4.
    let mut s = partition();
    s.stabilise();
    s.spec.strategy.type_ = StatefulSetStrategyType::TwoSets;
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::Failed));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(
        p.events
            .iter()
            .any(|e| e.warning && e.reason == "UnsafeChange")
    );
    let message = p.status.message.clone().unwrap();
    assert!(
        message.starts_with("redis.yaml: spec.strategy.type changed to TwoSets")
            && message.contains("Put spec.strategy.type back to Partition"),
        "{message}"
    );
    assert!(!s.sets.contains_key("redis-stable"));
    s.spec.strategy.type_ = StatefulSetStrategyType::Partition;
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::Stable));
    assert!(s.events.contains(&"SpecFixed"));
}

#[test]
fn a_change_kubernetes_cannot_make_to_a_live_set_is_refused_by_name() {
    // Issue 18: a selector added to a live rollout's template was a 422 retried forever.
    for field in ["selector", "serviceName", "volumeClaimTemplates"] {
        let mut s = two_sets();
        s.stabilise();
        let before = s.spec.clone();
        match field {
            "selector" => {
                s.spec
                    .template
                    .selector
                    .match_labels
                    .get_or_insert_default()
                    .insert("tier".into(), "db".into());
            }
            "serviceName" => s.spec.template.service_name = Some("other".into()),
            _ => {
                let t = s.spec.template.volume_claim_templates.as_mut().unwrap();
                t[0].metadata.name = Some("state".into());
            }
        }
        let p = s.reconcile();
        assert_eq!(p.status.phase, Some(Phase::Failed), "{field}");
        assert!(p.actions.is_empty(), "{field}: {:?}", p.actions);
        let message = p.status.message.clone().unwrap();
        assert!(
            message.starts_with(&format!("redis.yaml: spec.template.{field} changed"))
                && message.contains("redis-stable"),
            "{message}"
        );
        s.spec = before;
        assert_eq!(s.reconcile().status.phase, Some(Phase::Stable), "{field}");
    }
}

#[test]
fn a_canary_claim_deleted_by_hand_is_recreated_on_its_volume_before_it_moves_back() {
    // Issue 18: with both claims of ordinal 2 gone, the handoff back called it done, and the
    // stable set's controller gave replica 2 a new, empty volume.
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.claims.get_mut("data-redis-canary-2").unwrap().deleting = true;
    s.promote = Some("true".into());
    s.run_until("Stable on redis:2", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert_eq!(s.volumes_by_ordinal(), before);
}

/// What kstatus (Flux health checks, kpt) must read from each phase once the status is
/// current: Ready only when settled on Git's image, Failed only when Git must change.
fn kstatus_expected(phase: Phase, ready: bool) -> &'static str {
    match phase {
        Phase::Stable if ready => "Current",
        Phase::RolledBack | Phase::Failed => "Failed",
        _ => "InProgress",
    }
}

#[test]
fn flux_kstatus_reads_every_phase_as_meant() {
    let mut histories = Vec::new();
    // A canary promoted by hand, then a broken image rolled back by its deadline.
    let mut s = two_sets();
    s.spec.progress_deadline_seconds = 20;
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.generation += 1;
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.promote = Some("true".into());
    s.stabilise();
    s.promote = None;
    s.spec.image = "redis:broken".into();
    s.generation += 1;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    s.spec.container = Some("sidecar".into());
    s.generation += 1;
    s.run_until("Failed", |s| s.phase() == Some(Phase::Failed));
    histories.push(s.written);
    // A migration that fails, and a canary aborted while the stable set scales down.
    let mut s = two_sets();
    s.spec.migration = Some(Migration {
        template: serde_json::from_value(
            serde_json::json!({"spec": {"template": {"spec": {"containers": []}}}}),
        )
        .unwrap(),
    });
    s.job_fails = true;
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.generation += 1;
    s.promote = Some("redis:2".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    histories.push(s.written);
    let mut s = two_sets();
    s.spec.migration = Some(Migration {
        template: serde_json::from_value(serde_json::json!({
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "migrate:1"}]}}}
        }))
        .unwrap(),
    });
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.generation += 1;
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.promote = Some("true".into());
    s.stabilise();
    histories.push(s.written);
    let mut s = partition();
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.generation += 1;
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    histories.push(s.written);

    let mut cases: Vec<(String, serde_json::Value, &str)> = Vec::new();
    let object = |generation: i64, status: &CanaryStatefulSetStatus| {
        serde_json::json!({
            "apiVersion": crate::api::API_VERSION, "kind": "CanaryStatefulSet",
            "metadata": {"name": "redis", "namespace": "shop", "generation": generation},
            "status": status,
        })
    };
    let mut seen = std::collections::BTreeSet::new();
    for (generation, status) in histories.into_iter().flatten() {
        let phase = status.phase.unwrap();
        let ready = status.ready_replicas >= 3;
        if !seen.insert((format!("{phase:?}"), ready)) {
            continue;
        }
        cases.push((
            format!("{phase:?} ready={ready}"),
            object(generation, &status),
            kstatus_expected(phase, ready),
        ));
        // A status not yet updated for a new generation is in progress, whatever it says.
        cases.push((
            format!("{phase:?} ready={ready}, generation ahead"),
            object(generation + 1, &status),
            "InProgress",
        ));
    }
    // An action the API server refuses is Failed; one that failed in a way that clears by
    // itself (a conflict) is still in progress.
    for (what, failure, permanent, want) in [
        (
            "action refused",
            "apply StatefulSet redis-stable: forbidden",
            true,
            "Failed",
        ),
        (
            "action conflicted",
            "patch PersistentVolume pv-1: the object has been modified (Conflict, HTTP 409)",
            false,
            "InProgress",
        ),
    ] {
        let mut status = CanaryStatefulSetStatus {
            phase: Some(Phase::Stable),
            observed_generation: Some(1),
            ..Default::default()
        };
        crate::plan::mark_action_failed(
            &mut status.conditions,
            &mut status.message,
            failure,
            permanent,
            Timestamp::UNIX_EPOCH,
        );
        cases.push((what.into(), object(1, &status), want));
    }

    let phases: std::collections::BTreeSet<&str> = seen.iter().map(|(p, _)| p.as_str()).collect();
    for phase in [
        "Initializing",
        "Stable",
        "ScalingDownStable",
        "DeployingCanary",
        "CanaryActive",
        "AwaitingMigration",
        // MigratingData: the model's Job finishes within the plan that starts it.
        "MigrationFailed",
        "Promoting",
        "RollingBack",
        "RolledBack",
        "Failed",
    ] {
        assert!(phases.contains(phase), "no {phase} in {phases:?}");
    }
    crate::plan::machine::assert_kstatus_reads(&cases);
}

fn error_rate_analysis(background: bool, gate: Option<i32>, count: Option<i32>) -> Resolved {
    analysis::testing::error_rate(background, gate, count)
}

fn with_auto_promotion(s: &mut Sim, bake_seconds: i64) {
    s.spec.promotion = Promotion {
        type_: PromotionType::Auto,
        bake_seconds,
    };
}

#[test]
fn a_failing_background_analysis_rolls_back_and_names_the_metric() {
    let mut s = two_sets();
    with_auto_promotion(&mut s, 600);
    s.analysis = error_rate_analysis(true, None, None);
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    let good = s.measurements;
    s.answer = Outcome::Value(serde_json::json!(0.31));
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    // failureLimit 1: the second failed measurement rolls back, 10 s after the first.
    assert_eq!(s.measurements - good, 2);
    assert!(s.events.contains(&"AnalysisFailed"), "{:?}", s.events);
    let run = &s.status.analysis[0];
    assert_eq!(run.phase, crate::api::AnalysisPhase::Failed);
    let message = run.message.as_deref().unwrap();
    assert!(
        message.starts_with("error-rate 0.31 failed result < 0.05 (2 failed, failureLimit 1)"),
        "{message}"
    );
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:1"));
    // Nothing is measured once the canary is over.
    let after = s.measurements;
    for _ in 0..30 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.measurements, after);
}

#[test]
fn a_passing_gate_promotes_without_the_human_and_is_measured_count_times() {
    let mut s = two_sets();
    s.analysis = error_rate_analysis(false, Some(1), Some(3));
    s.stabilise();
    s.spec.image = "redis:2".into();
    // Manual promotion, no annotation: the gate replaces the human.
    s.run_until("promoted", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert_eq!(s.measurements, 3);
    assert!(s.phases.contains(&Phase::CanaryActive));
}

#[test]
fn a_gate_does_not_count_against_the_progress_deadline() {
    let mut s = two_sets();
    s.spec.progress_deadline_seconds = 15;
    s.analysis = error_rate_analysis(false, Some(1), Some(4));
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("promoted", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert!(
        !s.events.contains(&"ProgressDeadlineExceeded"),
        "{:?}",
        s.events
    );
}

#[test]
fn an_unmeasurable_background_holds_the_canary_and_goes_on_when_measurable() {
    let mut s = two_sets();
    with_auto_promotion(&mut s, 60);
    s.analysis = error_rate_analysis(true, None, None);
    s.stabilise();
    s.answer = Outcome::Error("Prometheus http://prometheus:9090: connection refused".into());
    s.spec.image = "redis:2".into();
    s.run_until("held", |s| {
        s.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("holds the canary"))
    });
    for _ in 0..60 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::CanaryActive));
    assert!(
        !matches!(
            s.phase(),
            Some(Phase::RollingBack | Phase::RolledBack | Phase::Promoting | Phase::Stable)
        ),
        "{:?}",
        s.phase()
    );
    let message = s.status.message.clone().unwrap();
    assert!(message.contains("could not be measured"), "{message}");
    assert!(
        message.contains("rollouts.linnet.dev/promote: \"true\""),
        "{message}"
    );
    s.answer = Outcome::Value(serde_json::json!(0.0));
    s.run_until("promoted", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
}

#[test]
fn a_failed_gate_rolls_back() {
    let mut s = partition();
    s.analysis = error_rate_analysis(false, Some(1), Some(3));
    s.stabilise();
    s.answer = Outcome::Value(serde_json::json!(0.5));
    s.spec.image = "redis:2".into();
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(s.measurements, 2);
    assert_eq!(s.status.analysis[0].name, "after-1");
}

fn answer() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        3 => (0.0f64..0.05).prop_map(|x| Outcome::Value(serde_json::json!(x))),
        1 => (0.05f64..1.0).prop_map(|x| Outcome::Value(serde_json::json!(x))),
        1 => Just(Outcome::Error("timeout".into())),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random measurement histories through the whole machine, with crashes: a canary whose
    /// analysis failed is never promoted, and no metric records more than failureLimit + 1
    /// failures (the one that fails it) before the rollback starts.
    #[test]
    fn a_failed_analysis_is_never_promoted(
        two in any::<bool>(),
        gate in any::<bool>(),
        answers in proptest::collection::vec((answer(), 1usize..15, 0usize..3), 1..20),
    ) {
        let mut s = if two { two_sets() } else { partition() };
        with_auto_promotion(&mut s, 30);
        s.analysis = error_rate_analysis(true, gate.then_some(1), Some(3));
        s.stabilise();
        s.spec.image = "redis:2".into();
        for (a, ticks, crash) in answers {
            s.answer = a;
            for _ in 0..ticks {
                if crash == 0 { s.reconcile_partial(Some(1)); } else { s.reconcile(); }
                s.tick();
            }
        }
        s.answer = Outcome::Value(serde_json::json!(0.0));
        s.run_until("decided", |s| matches!(s.phase(), Some(Phase::Stable | Phase::RolledBack)));
        for (_, status) in &s.written {
            let failed = status.analysis.iter().any(|r| r.phase == crate::api::AnalysisPhase::Failed);
            let promoted = matches!(status.phase, Some(Phase::Promoting))
                || status.phase == Some(Phase::Stable)
                    && status.stable_image.as_deref() == Some("redis:2");
            prop_assert!(!(failed && promoted), "promoted after a failed analysis: {:?}", status);
            for m in status.analysis.iter().flat_map(|r| &r.metrics) {
                prop_assert!(m.failed <= 2, "{} failed measurements with failureLimit 1", m.failed);
            }
        }
        let promoted = s.status.stable_image.as_deref() == Some("redis:2");
        let failed = s.status.analysis.iter().any(|r| r.phase == crate::api::AnalysisPhase::Failed);
        prop_assert!(!(promoted && failed));
    }
}

#[test]
fn a_background_hold_between_steps_is_not_a_missed_deadline() {
    let mut s = two_sets();
    s.spec.canary_replicas = 2;
    s.spec.steps = Some(vec![1, 2]);
    s.spec.progress_deadline_seconds = 15;
    s.analysis = analysis::testing::error_rate_without_error_budget(true);
    s.stabilise();
    s.answer = Outcome::Error("connection refused".into());
    s.spec.image = "redis:2".into();
    s.run_until("held after step 1", |s| {
        s.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("holds the canary"))
    });
    for _ in 0..60 {
        s.reconcile();
        s.tick();
    }
    assert!(
        !s.events.contains(&"ProgressDeadlineExceeded"),
        "{:?}",
        s.events
    );
    assert_eq!(s.phase(), Some(Phase::DeployingCanary));
    assert_eq!(s.status.current_step, Some(0));
    // Measurable again: it goes on (the deadline long past counts for nothing).
    s.answer = Outcome::Value(serde_json::json!(0.0));
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert!(!s.events.contains(&"ProgressDeadlineExceeded"));
}
