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
    /// What a fleet says while it holds the spec's new image.
    fleet_hold: Option<String>,
    answer: Outcome,
    measurements: usize,
    /// The config copies the controller observed (`versionedConfig`).
    config: crate::plan::config::ConfigObserved,
    /// The widest canary Git has asked for: the stable floor while a canary runs.
    widest_canary: i32,
}

#[derive(Clone, Debug)]
struct SimSet {
    replicas: i32,
    start: i32,
    partition: i32,
    image: String,
    hash: String,
    fixed: FixedSetFields,
    /// The ConfigMaps and Secrets its pod template names.
    config: Vec<String>,
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
            widest_canary: 0,
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
            fleet_hold: None,
            answer: Outcome::Value(serde_json::json!(0.01)),
            measurements: 0,
            config: Default::default(),
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
                    controller_uid: None,
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
        let mut observed = Observed {
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
            config: self.config.clone(),
            ..Observed::default()
        };
        // As the controller observes: no pod list without a set.
        if !has_pods(&observed) {
            observed.pods.clear();
        }
        observed
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
            image_source: None,
            source_path: Some("redis.yaml".into()),
            status: self.status.clone(),
            analysis: self.analysis.clone(),
            fleet_hold: self.fleet_hold.clone(),
        }
    }

    /// Plans as the controller does: without the pods in a phase that does not read them, and
    /// again with them if that plan moves into one that does (no decision rests on them).
    fn plan(&self) -> Plan {
        let with_pods = plan(&self.rollout(), &self.observed(), self.now);
        if !reads_pods(self.status.phase) {
            let mut observed = self.observed();
            observed.pods.clear();
            let without = plan(&self.rollout(), &observed, self.now);
            if !plans_again_with_pods(self.status.phase, without.status.phase) {
                assert_eq!(
                    without, with_pods,
                    "a plan without the pods decided otherwise"
                );
                return without;
            }
        }
        with_pods
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
                        config: crate::plan::config::references(
                            spec.template.spec.as_ref().unwrap(),
                        )
                        .into_iter()
                        .map(|(_, n)| n)
                        .collect(),
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
                let (rev, image) = if k >= set.partition {
                    (revision(&set.image), Some(set.image.clone()))
                } else {
                    let before = self.pods.get(&pod);
                    (
                        before
                            .and_then(|p| p.revision.clone())
                            .unwrap_or_else(|| "old".into()),
                        before.and_then(|p| p.image.clone()),
                    )
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
                        image,
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
        // Issue 44: an ordinal never has two pods.
        let mut ordinals = std::collections::BTreeSet::new();
        for p in self.pods.values() {
            assert!(
                ordinals.insert(p.ordinal),
                "ordinal {} has two pods: {:?}",
                p.ordinal,
                self.pods.keys().collect::<Vec<_>>()
            );
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
        let floor = self.spec.replicas - self.spec.canary_replicas.max(self.widest_canary);
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

fn two_sets() -> Sim {
    Sim::new(StatefulSetStrategyType::TwoSets)
}

fn partition() -> Sim {
    Sim::new(StatefulSetStrategyType::Partition)
}

mod every_plan;
mod fleet_hold;
mod invariants;
mod kstatus;
mod stage_timeline;
mod status_counts;
mod versioned_config;
mod walkthroughs;
mod with_analysis;
use every_plan::check_plan;
