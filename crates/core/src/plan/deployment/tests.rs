//! Tests of the CanaryDeployment planner against a small model of the Deployment controller;
//! the real control plane runs the same stories in `tests/deployment.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::{Just, ProptestConfig, prop_assert, prop_assert_eq, prop_oneof, proptest};
use proptest::strategy::Strategy as _;

use super::*;

fn spec(strategy: Strategy, batches: i32, pause: PauseMode) -> CanaryDeploymentSpec {
    serde_json::from_value(serde_json::json!({
        "replicas": 4,
        "image": "web:1",
        "strategy": {"type": format!("{strategy:?}")},
        "batches": batches,
        "pause": match pause { PauseMode::First => "First", PauseMode::All => "All", PauseMode::Never => "None" },
        "template": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "web:1"}]}
            }
        }
    }))
    .unwrap()
}

#[derive(Clone, Debug)]
struct Sim {
    spec: CanaryDeploymentSpec,
    status: CanaryDeploymentStatus,
    deployments: BTreeMap<String, DeploymentView>,
    now: Timestamp,
    events: Vec<&'static str>,
    phases: Vec<Phase>,
    /// Every batch list status ever had, without repeats in a row.
    batch_history: Vec<Vec<(i32, i32, BatchState)>>,
    /// Highest replicas ever asked of each Deployment, per batch recorded in status.
    max_asked: BTreeMap<String, i32>,
    /// Every status written, with the strategy it was planned for.
    written: Vec<(Strategy, CanaryDeploymentStatus)>,
    /// The abort annotation.
    abort: Option<String>,
    /// The analysis the spec asks for, resolved, and what every measurement answers.
    analysis: Resolved,
    /// What a fleet says while it holds the spec's new image.
    fleet_hold: Option<String>,
    answer: analysis::Outcome,
    measurements: usize,
    /// The config copies the controller observed (`versionedConfig`).
    config: crate::plan::config::ConfigObserved,
    /// The ConfigMaps each Deployment's pods mount, as last applied.
    mounted: BTreeMap<String, Vec<String>>,
    /// Pods a scale-down stops per tick (`None`: all at once). New pods start at once: on a
    /// real node a pod takes longer to stop than to be created.
    stopped_per_tick: Option<i32>,
    /// The rollout's Services and routes (trafficRouting), as the gateway model has them.
    traffic: crate::plan::traffic::TrafficView,
    /// Each Service's selector, as last applied.
    service_selectors: BTreeMap<String, BTreeMap<String, String>>,
}

impl Sim {
    fn new(strategy: Strategy, batches: i32, pause: PauseMode) -> Sim {
        Sim {
            spec: spec(strategy, batches, pause),
            status: CanaryDeploymentStatus::default(),
            deployments: BTreeMap::new(),
            now: Timestamp::from_second(1_700_000_000).unwrap(),
            events: Vec::new(),
            phases: Vec::new(),
            batch_history: Vec::new(),
            max_asked: BTreeMap::new(),
            written: Vec::new(),
            abort: None,
            analysis: Resolved::default(),
            fleet_hold: None,
            answer: analysis::Outcome::Value(serde_json::json!(0.01)),
            measurements: 0,
            config: Default::default(),
            mounted: BTreeMap::new(),
            stopped_per_tick: None,
            traffic: Default::default(),
            service_selectors: BTreeMap::new(),
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

    fn rollout(&self) -> DeployRollout<'_> {
        DeployRollout {
            reference: RolloutRef {
                name: "web".into(),
                namespace: "ns".into(),
                uid: "uid".into(),
                source: None,
            },
            generation: Some(1),
            spec: &self.spec,
            source_revision: None,
            image_source: None,
            source_path: Some("web.yaml".into()),
            abort: self.abort.clone(),
            status: self.status.clone(),
            analysis: self.analysis.clone(),
            fleet_hold: self.fleet_hold.clone(),
        }
    }

    fn observed(&self) -> Observed {
        // As the controller does: the baseline apart from the versions.
        let (baseline, deployments): (Vec<_>, Vec<_>) = self
            .deployments
            .values()
            .cloned()
            .partition(|d| d.name == baseline_name("web"));
        Observed {
            deployments,
            baseline: baseline.into_iter().next(),
            config: self.config.clone(),
            traffic: self.traffic.clone(),
            ..Observed::default()
        }
    }

    fn plan(&self) -> DeployPlan {
        plan(&self.rollout(), &self.observed(), self.now)
    }

    fn reconcile_partial(&mut self, keep: Option<usize>) -> DeployPlan {
        self.measure();
        let p = self.plan();
        self.written
            .push((self.spec.strategy.type_, p.status.clone()));
        // Exactly one kstatus condition is true, and Ready only when settled on Git's image.
        if crate::plan::machine::tests::standing_of(&p.status.conditions)
            == crate::plan::machine::Standing::Settled
        {
            let asked_back = self.spec.strategy.type_ == Strategy::Rollback;
            match p.status.phase {
                Some(Phase::Completed) => assert_eq!(
                    p.status.stable_image.as_deref(),
                    Some(self.spec.image.as_str())
                ),
                Some(Phase::RolledBack) => assert!(asked_back),
                other => panic!("Ready in phase {other:?}"),
            }
        }
        self.status = p.status.clone();
        let n = keep.unwrap_or(p.actions.len()).min(p.actions.len());
        for a in &p.actions[..n] {
            let asked_before: i32 = self.deployments.values().map(|d| d.replicas).sum();
            self.execute(a);
            // Between two writes too: the cluster sees each one as it lands. A write that
            // shrinks cannot breach the bound; it may land while an earlier batch's surge, which
            // the status just written no longer allows, is still being taken down.
            if keep.is_none() {
                let asked: i32 = self.deployments.values().map(|d| d.replicas).sum();
                assert!(
                    asked <= asked_before || asked <= self.surge_bound(),
                    "{asked} replicas asked for after {}, more than {} (phase {:?}, batch {:?}): {:?}",
                    a.describe(),
                    self.surge_bound(),
                    self.status.phase,
                    self.status.current_batch,
                    self.by_image()
                );
            }
        }
        // Issue 44: a whole plan never leaves more replicas asked for than `replicas` plus the
        // documented surge (a crash mid-plan may, until the next plan finishes its work).
        if keep.is_none() {
            let asked: i32 = self.deployments.values().map(|d| d.replicas).sum();
            assert!(
                asked <= self.surge_bound(),
                "{asked} replicas asked for, more than {} (batch {:?}, phase {:?}): {:?}",
                self.surge_bound(),
                self.status.current_batch,
                self.status.phase,
                self.by_image()
            );
        }
        if keep.is_none() {
            self.events.extend(p.events.iter().map(|e| e.reason));
            if self.phases.is_empty() && p.entered.is_empty() {
                self.phases.extend(p.status.phase);
            }
            self.phases.extend(p.entered.iter().copied());
            let batches: Vec<_> = p
                .status
                .batches
                .iter()
                .map(|b| (b.batch, b.target, b.state))
                .collect();
            if !batches.is_empty() && self.batch_history.last() != Some(&batches) {
                self.batch_history.push(batches);
            }
            self.status = p.status.clone();
        }
        p
    }

    fn reconcile(&mut self) -> DeployPlan {
        self.reconcile_partial(None)
    }

    fn execute(&mut self, a: &Action) {
        match a {
            Action::ApplyDeployment(d) => {
                let name = d.metadata.name.clone().unwrap();
                let pod = d
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .unwrap();
                let config = crate::plan::config::references(pod);
                self.mounted
                    .insert(name.clone(), config.into_iter().map(|(_, n)| n).collect());
                let mut view = DeploymentView::from_object(d, None);
                let prev = self.deployments.get(&name);
                view.available = prev.map_or(0, |p| p.available);
                view.updated = prev.map_or(0, |p| p.updated);
                view.pods = prev.map_or(0, |p| p.pods);
                view.status_fresh = false;
                let max = self.max_asked.entry(name.clone()).or_insert(0);
                *max = (*max).max(view.replicas);
                self.deployments.insert(name, view);
            }
            Action::DeleteDeployment { name } => {
                self.deployments.remove(name);
                self.mounted.remove(name);
            }
            Action::ScaleDeployment { name, replicas } => {
                let view = self.deployments.get_mut(name).unwrap();
                view.replicas = *replicas;
                view.status_fresh = false;
            }
            Action::ApplyService(svc) => {
                let name = svc.metadata.name.clone().unwrap();
                let selector = svc.spec.as_ref().and_then(|s| s.selector.clone());
                self.service_selectors
                    .insert(name.clone(), selector.unwrap_or_default());
                let applied_hash = svc
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(CHILD_HASH_ANNOTATION).cloned());
                let services = &mut self.traffic.services;
                services.retain(|s| s.name != name);
                services.push(crate::plan::traffic::ServiceView {
                    name,
                    applied_hash,
                    ..Default::default()
                });
            }
            Action::SwitchService { name, version, .. } => {
                let selector = self.service_selectors.entry(name.clone()).or_default();
                match version {
                    Some(v) => selector.insert(VERSION_LABEL.into(), v.clone()),
                    None => selector.remove(VERSION_LABEL),
                };
                let svc = self.traffic.services.iter_mut().find(|s| &s.name == name);
                let svc = svc.expect("a switched Service that exists");
                svc.selector_version = version.clone();
                svc.selector = Some(self.service_selectors[name].clone());
                svc.labelled = version.is_some();
                svc.switched_by = version.as_ref().map(|_| "CanaryDeployment/web".to_string());
            }
            Action::UpdateRoute { name, rules, .. } => {
                let route = self.traffic.routes.iter_mut().find(|r| &r.name == name);
                let route = route.unwrap();
                route.rules = rules.clone();
                route.generation += 1;
            }
            other => panic!("a CanaryDeployment plan asked to {}", other.describe()),
        }
    }

    fn tick(&mut self) {
        self.now += jiff::SignedDuration::from_secs(1);
        for d in self.deployments.values_mut() {
            let broken = d.image.as_deref().is_some_and(|i| i.ends_with(":broken"));
            d.pods = match self.stopped_per_tick {
                Some(k) if d.pods > d.replicas => (d.pods - k).max(d.replicas),
                _ => d.replicas,
            };
            d.updated = d.pods;
            d.available = if broken { 0 } else { d.pods };
            d.status_fresh = true;
        }
        // The gateway accepts every route; each Service's endpoints are the available pods
        // of the version Deployment its selector names.
        for r in &mut self.traffic.routes {
            r.accepted_generation = Some(r.generation);
        }
        for svc in &mut self.traffic.services {
            let version = self.service_selectors[&svc.name].get(VERSION_LABEL);
            // A Service without the version label selects every version's pods.
            svc.endpoint_versions = self
                .deployments
                .values()
                .map(|d| {
                    let version = d.name.strip_prefix("web-").unwrap_or("");
                    (version.to_string(), d.available)
                })
                .filter(|(v, n)| version.is_none_or(|want| want == v) && *n > 0)
                .collect();
            svc.ready_endpoints = svc.endpoint_versions.values().sum();
        }
    }

    fn run_until(&mut self, what: &str, done: impl Fn(&Sim) -> bool) {
        for _ in 0..200 {
            if done(self) {
                return;
            }
            self.reconcile();
            self.tick();
        }
        panic!(
            "never reached {what}: {:?} {:?}; phases {:?}",
            self.status.phase, self.status.message, self.phases
        );
    }

    fn phase(&self) -> Option<Phase> {
        self.status.phase
    }

    fn completed_on(&mut self, image: &str) {
        let image = image.to_string();
        self.run_until(&format!("Completed on {image}"), |s| {
            s.phase() == Some(Phase::Completed) && s.status.stable_image.as_deref() == Some(&image)
        });
    }

    /// Replicas by image, over all Deployments.
    /// The most replicas the rollout's Deployments may ask for together: `replicas`, plus,
    /// while batch N runs, the replicas batch N adds (docs/canarydeployment.md: the old
    /// version runs `total - new.available`, so it shrinks only as new pods become available).
    fn surge_bound(&self) -> i32 {
        let (total, m) = (self.spec.replicas.max(0), self.spec.batches.max(1));
        // Blue-green runs both versions whole.
        if self.spec.strategy.type_ == Strategy::BlueGreen {
            return 2 * total;
        }
        // The baseline's pods are extra: as many as the batch's new ones; one no longer asked
        // for stays (with traffic routing) until the gateway had the settle time.
        let baseline = if baseline_wanted(&self.spec) {
            let n = self.status.current_batch.unwrap_or(m).clamp(1, m);
            batch::target(total, m, n)
        } else {
            self.deployments
                .get("web-baseline")
                .map_or(0, |d| d.replicas)
        };
        baseline + self.versions_bound(total, m)
    }

    fn versions_bound(&self, total: i32, m: i32) -> i32 {
        if self.status.phase == Some(Phase::RollingBack) {
            // The old version back to `replicas` before the new one stops: for a moment both,
            // the new one at most at its batch's target.
            let n = self.status.current_batch.unwrap_or(m).clamp(1, m);
            return total + batch::target(total, m, n);
        }
        self.status.current_batch.map_or(total, |n| {
            let n = n.clamp(1, m);
            let before = if n > 1 {
                batch::target(total, m, n - 1)
            } else {
                0
            };
            total + batch::target(total, m, n) - before
        })
    }

    fn by_image(&self) -> BTreeMap<String, i32> {
        let mut out = BTreeMap::new();
        for d in self.deployments.values() {
            *out.entry(d.image.clone().unwrap()).or_insert(0) += d.replicas;
        }
        out
    }
}

use BatchState::{Finished, InProgress, Pending};

#[test]
fn an_ordinary_start_completes_without_an_event() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.run_until("Completed", |s| s.phase() == Some(Phase::Completed));
    assert_eq!(s.status.ready.as_deref(), Some("4/4"));
    assert!(s.events.is_empty(), "issue 51: {:?}", s.events);
}

#[test]
fn the_seeds_example_pauses_after_batch_one_and_finishes_on_approval() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    assert_eq!(s.deployments.len(), 1);
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    assert_eq!(
        s.by_image(),
        BTreeMap::from([("web:1".into(), 3), ("web:2".into(), 1)])
    );
    assert_eq!(s.status.batch.as_deref(), Some("1/2"));
    // It stays paused until Git raises currentBatch.
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::Paused));
    assert!(
        s.status
            .message
            .as_deref()
            .unwrap()
            .contains("set currentBatch to 2")
    );
    s.spec.current_batch = 2;
    s.completed_on("web:2");
    // Regression: the plan that deleted the old Deployment still counted its pods (7/4).
    assert_eq!(s.status.ready.as_deref(), Some("4/4"));
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".into(), 4)]));
    assert_eq!(s.deployments.len(), 1, "the old Deployment is deleted");
    assert_eq!(
        s.batch_history,
        vec![
            vec![(1, 1, InProgress), (2, 4, Pending)],
            vec![(1, 1, Finished), (2, 4, Pending)],
            vec![(1, 1, Finished), (2, 4, InProgress)],
            vec![(1, 1, Finished), (2, 4, Finished)],
        ]
    );
    assert_eq!(s.status.previous_image.as_deref(), Some("web:1"));
    assert!(s.events.contains(&"RolloutComplete"));
}

#[test]
fn pause_all_waits_after_every_batch() {
    let mut s = Sim::new(Strategy::Batches, 3, PauseMode::All);
    s.spec.replicas = 6;
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused at 1", |s| s.phase() == Some(Phase::Paused));
    assert_eq!(s.by_image()["web:2"], 1);
    s.spec.current_batch = 2;
    s.run_until("Paused at 2", |s| {
        s.phase() == Some(Phase::Paused) && s.status.current_batch == Some(2)
    });
    assert_eq!(
        s.by_image(),
        BTreeMap::from([("web:1".into(), 3), ("web:2".into(), 3)])
    );
    s.spec.current_batch = 3;
    s.completed_on("web:2");
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".into(), 6)]));
}

#[test]
fn pause_none_runs_through() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::Never);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.completed_on("web:2");
    assert!(!s.phases.contains(&Phase::Paused));
}

#[test]
fn pause_first_goes_on_by_itself_after_the_first_approval() {
    let mut s = Sim::new(Strategy::Batches, 3, PauseMode::First);
    s.spec.replicas = 6;
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    s.spec.current_batch = 2;
    s.completed_on("web:2");
    assert_eq!(s.phases.iter().filter(|p| **p == Phase::Paused).count(), 1);
}

#[test]
fn rolling_updates_one_deployment_and_corrects_drift() {
    let mut s = Sim::new(Strategy::Rolling, 1, PauseMode::Never);
    s.completed_on("web:1");
    assert!(s.deployments.contains_key("web"));
    s.spec.image = "web:2".into();
    s.completed_on("web:2");
    assert_eq!(s.deployments.len(), 1);
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".into(), 4)]));
    // Someone edits the Deployment by hand.
    let d = s.deployments.get_mut("web").unwrap();
    d.replicas = 1;
    d.image = Some("web:hacked".into());
    let p = s.reconcile();
    assert!(
        matches!(&p.actions[..], [Action::ApplyDeployment(d)] if d.spec.as_ref().unwrap().replicas == Some(4))
    );
    s.tick();
    // Resources drift too.
    s.spec.resources = Some(
        serde_json::from_value(serde_json::json!({"requests": {"cpu": "100m", "memory": "64Mi"}}))
            .unwrap(),
    );
    let p = s.reconcile();
    assert_eq!(p.actions.len(), 1, "a resources change is applied");
    s.tick();
    assert!(s.reconcile().actions.is_empty());
    s.deployments.get_mut("web").unwrap().resources = None;
    assert_eq!(
        s.reconcile().actions.len(),
        1,
        "a hand edit of resources is put back"
    );
}

#[test]
fn a_broken_image_stops_at_the_deadline_and_the_old_version_keeps_serving() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::Never);
    s.spec.progress_deadline_seconds = 10;
    s.completed_on("web:1");
    s.spec.image = "web:broken".into();
    s.run_until("Failed", |s| s.phase() == Some(Phase::Failed));
    assert!(s.events.contains(&"ProgressDeadlineExceeded"));
    // Regression: the Failed phase kept the previous phase's message.
    assert!(
        s.status
            .message
            .as_deref()
            .unwrap()
            .contains("web:1 keeps serving")
    );
    assert_eq!(
        s.by_image()["web:1"],
        4,
        "old version serves at full strength"
    );
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::Failed));
    // With automatic rollback it cleans up by itself.
    s.spec.rollback_on_failure = true;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
}

#[test]
fn a_restart_mid_batch_carries_on_without_scaling_twice() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::Never);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    for crash in 0..3 {
        s.reconcile_partial(Some(crash));
        s.tick();
    }
    s.completed_on("web:2");
    let new = s.deployments.keys().next().unwrap().clone();
    assert_eq!(s.max_asked[&new], 4);
}

mod invariants;

mod batch_growth;

mod versioned_config;

mod rollback;

mod baseline;

mod baseline_traffic;

mod blue_green;

mod blue_green_service;

mod batch_times;
