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
    answer: analysis::Outcome,
    measurements: usize,
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
            answer: analysis::Outcome::Value(serde_json::json!(0.01)),
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
            source_path: Some("web.yaml".into()),
            abort: self.abort.clone(),
            status: self.status.clone(),
            analysis: self.analysis.clone(),
        }
    }

    fn observed(&self) -> Observed {
        Observed {
            deployments: self.deployments.values().cloned().collect(),
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
        if crate::plan::machine::standing_of(&p.status.conditions)
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
            self.execute(a);
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
            }
            other => panic!("a CanaryDeployment plan asked to {}", other.describe()),
        }
    }

    fn tick(&mut self) {
        self.now += jiff::SignedDuration::from_secs(1);
        for d in self.deployments.values_mut() {
            let broken = d.image.as_deref().is_some_and(|i| i.ends_with(":broken"));
            d.pods = d.replicas;
            d.updated = d.replicas;
            d.available = if broken { 0 } else { d.replicas };
            d.status_fresh = true;
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
fn rollback_from_the_middle_of_batches_scales_the_old_version_back() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    s.spec.strategy.type_ = Strategy::Rollback;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    assert_eq!(s.deployments.len(), 1);
    let rb = s.status.rollback.clone().unwrap();
    assert_eq!(
        (rb.from_image.as_str(), rb.to_image.as_str(), rb.state),
        ("web:2", "web:1", Finished)
    );
}

#[test]
fn a_rolling_rollback_sets_the_image_back() {
    let mut s = Sim::new(Strategy::Rolling, 1, PauseMode::Never);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.completed_on("web:2");
    s.spec.strategy.type_ = Strategy::Rollback;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    assert!(s.deployments.contains_key("web"));
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

#[derive(Clone, Debug)]
enum Event {
    Tick,
    Image(u8),
    Approve(i32),
    Strategy(u8),
    Crash(usize),
}

fn event() -> impl proptest::strategy::Strategy<Value = Event> {
    prop_oneof![
        6 => Just(Event::Tick),
        1 => (0u8..3).prop_map(Event::Image),
        1 => (1i32..=3).prop_map(Event::Approve),
        1 => (0u8..3).prop_map(Event::Strategy),
        1 => (0usize..3).prop_map(Event::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random Git changes and crashes: the new version is never asked for more than the batch
    /// recorded in status allows, a batched rollout serves at least `total - 1` available
    /// replicas while it moves, and Git settling on one image always ends Completed on it.
    #[test]
    fn batches_never_overshoot_and_always_settle(events in proptest::collection::vec(event(), 1..60)) {
        let mut s = Sim::new(Strategy::Batches, 3, PauseMode::First);
        s.spec.replicas = 6;
        s.completed_on("web:1");
        for e in events {
            match e {
                Event::Tick => {
                    let p = s.reconcile();
                    if s.status.phase == Some(Phase::Progressing) && s.spec.strategy.type_ == Strategy::Batches {
                        let n = p.status.current_batch.unwrap_or(1);
                        let t = batch::target(6, 3, n);
                        let new = p.status.canary_image.clone().map(|i| {
                            let planner = Planner { r: &s.rollout(), o: &Observed::default(), now: s.now, st: s.status.clone(), actions: vec![], events: vec![], requeue: None };
                            planner.version_for(&i)
                        });
                        for a in &p.actions {
                            if let Action::ApplyDeployment(d) = a
                                && Some(d.metadata.name.clone().unwrap()) == new
                            {
                                prop_assert!(d.spec.as_ref().unwrap().replicas.unwrap() <= t);
                            }
                        }
                        let available: i32 = s.deployments.values().map(|d| d.available).sum();
                        prop_assert!(available >= 6 - 1 || s.deployments.values().any(|d| d.available < d.replicas));
                    }
                    s.tick();
                }
                Event::Image(i) => s.spec.image = format!("web:{}", i + 1),
                Event::Approve(n) => s.spec.current_batch = n,
                Event::Strategy(k) => s.spec.strategy.type_ = [Strategy::Batches, Strategy::Rollback, Strategy::Batches][k as usize],
                Event::Crash(n) => {
                    s.reconcile_partial(Some(n));
                    s.tick();
                }
            }
            prop_assert_eq!(s.plan(), s.plan());
        }
        s.spec.strategy.type_ = Strategy::Batches;
        s.spec.current_batch = 3;
        s.spec.image = "web:9".into();
        s.completed_on("web:9");
        prop_assert_eq!(s.by_image(), BTreeMap::from([("web:9".to_string(), 6)]));
    }
}

#[test]
fn a_deleted_old_version_of_a_paused_rollout_is_recreated() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    let old = s
        .deployments
        .iter()
        .find(|(_, d)| d.image.as_deref() == Some("web:1"))
        .map(|(name, _)| name.clone())
        .unwrap();
    s.deployments.remove(&old);
    for _ in 0..3 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::Paused));
    assert_eq!(
        s.by_image(),
        BTreeMap::from([("web:1".into(), 3), ("web:2".into(), 1)])
    );
    assert!(s.deployments.contains_key(&old), "recreated under its name");
}

#[test]
fn a_selector_change_on_a_live_rollout_is_refused_until_put_back() {
    for strategy in [Strategy::Batches, Strategy::Rolling] {
        let mut s = Sim::new(strategy, 2, PauseMode::Never);
        s.completed_on("web:1");
        let before = s.spec.clone();
        s.spec
            .template
            .selector
            .match_labels
            .get_or_insert_default()
            .insert("tier".into(), "front".into());
        let p = s.reconcile();
        assert_eq!(s.phase(), Some(Phase::Failed));
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert!(s.events.contains(&"UnsafeChange"));
        let message = s.status.message.clone().unwrap();
        assert!(
            message.starts_with("web.yaml: spec.template.selector changed"),
            "{message}"
        );
        s.spec = before;
        s.completed_on("web:1");
        assert!(s.events.contains(&"SpecFixed"));
    }
}

#[test]
fn flux_kstatus_reads_every_phase_as_meant() {
    let mut histories = Vec::new();
    // Batches paused for approval, approved, then rolled back by strategy.
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    s.spec.current_batch = 2;
    s.completed_on("web:2");
    s.spec.strategy.type_ = Strategy::Rollback;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    histories.push(s.written);
    // A broken image past its deadline, then rolled back because the spec says so.
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::Never);
    s.spec.progress_deadline_seconds = 10;
    s.completed_on("web:1");
    s.spec.image = "web:broken".into();
    s.run_until("Failed", |s| s.phase() == Some(Phase::Failed));
    s.spec.rollback_on_failure = true;
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    histories.push(s.written);

    let object = |generation: i64, status: &CanaryDeploymentStatus| {
        serde_json::json!({
            "apiVersion": crate::api::API_VERSION, "kind": "CanaryDeployment",
            "metadata": {"name": "web", "namespace": "ns", "generation": generation},
            "status": status,
        })
    };
    let mut cases: Vec<(String, serde_json::Value, &str)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (strategy, status) in histories.into_iter().flatten() {
        let phase = status.phase.unwrap();
        let ready = status.ready.as_deref() == Some("4/4");
        let asked_back = strategy == Strategy::Rollback;
        if !seen.insert(format!("{phase:?} ready={ready} asked_back={asked_back}")) {
            continue;
        }
        // Ready only when settled on what Git asks for; Failed only when Git must change.
        let want = match phase {
            Phase::Completed if ready => "Current",
            Phase::RolledBack if asked_back && ready => "Current",
            Phase::RolledBack if !asked_back => "Failed",
            Phase::Failed => "Failed",
            _ => "InProgress",
        };
        let what = format!("{phase:?} ready={ready} asked_back={asked_back}");
        cases.push((what.clone(), object(1, &status), want));
        cases.push((
            format!("{what}, generation ahead"),
            object(2, &status),
            "InProgress",
        ));
    }
    for phase in [
        "Initializing",
        "Progressing",
        "Paused",
        "Completed",
        "RollingBack",
        "RolledBack",
        "Failed",
    ] {
        assert!(
            seen.iter().any(|s| s.starts_with(&format!("{phase} "))),
            "no {phase} in {seen:?}"
        );
    }
    crate::plan::machine::assert_kstatus_reads(&cases);
}

#[test]
fn the_abort_annotation_rolls_a_paused_rollout_back_until_git_changes_the_image() {
    // Issue 24: CanaryDeployment had no abort annotation.
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    // An annotation left from before the rollout started does not abort it.
    s.abort = Some("true".into());
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    s.reconcile();
    assert_eq!(s.phase(), Some(Phase::Paused));
    // Naming the image being rolled out aborts it (as `linnet abort` does).
    s.abort = Some("web:2".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(s.events.contains(&"Aborted"), "{:?}", s.events);
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    // It stays rolled back (Stalled: Git still asks for web:2) until Git changes the image.
    for _ in 0..3 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::RolledBack));
    assert_eq!(
        crate::plan::machine::standing_of(&s.status.conditions),
        crate::plan::machine::Standing::Stuck
    );
    s.abort = None;
    s.spec.image = "web:3".into();
    s.run_until("Paused on web:3", |s| s.phase() == Some(Phase::Paused));
    // "true" set after the rollout started aborts it.
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
}

fn error_rate_analysis(background: bool, gate: Option<i32>) -> Resolved {
    analysis::testing::error_rate(background, gate, Some(3))
}

#[test]
fn a_passing_gate_replaces_the_pause_and_a_failing_one_rolls_back() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.analysis = error_rate_analysis(false, Some(1));
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    // pause First would wait for currentBatch 2; the gate's pass goes on instead.
    s.completed_on("web:2");
    assert_eq!(s.measurements, 3);
    assert!(!s.phases.contains(&Phase::Paused), "{:?}", s.phases);

    s.answer = analysis::Outcome::Value(serde_json::json!(0.4));
    s.spec.image = "web:3".into();
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert!(s.events.contains(&"AnalysisFailed"), "{:?}", s.events);
    assert_eq!(s.status.stable_image.as_deref(), Some("web:2"));
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".to_string(), 4)]));
}

#[test]
fn a_failing_background_analysis_rolls_back_even_without_rollback_on_failure() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.analysis = error_rate_analysis(true, None);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    s.answer = analysis::Outcome::Value(serde_json::json!(0.31));
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    let message = s.status.analysis[0].message.clone().unwrap();
    assert!(
        message.starts_with("error-rate 0.31 failed result < 0.05"),
        "{message}"
    );
}

#[test]
fn an_unmeasurable_gate_pauses_and_an_approval_in_git_goes_on() {
    let mut s = Sim::new(Strategy::Batches, 3, PauseMode::Never);
    s.analysis = error_rate_analysis(false, Some(1));
    s.completed_on("web:1");
    s.answer = analysis::Outcome::Error("connection refused".into());
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    let message = s.status.message.clone().unwrap();
    assert!(
        message.contains("set currentBatch to 2 in Git"),
        "{message}"
    );
    s.spec.current_batch = 2;
    s.completed_on("web:2");
}

#[test]
fn a_rolling_update_holds_for_its_background_analysis_before_completing() {
    let mut s = Sim::new(Strategy::Rolling, 1, PauseMode::Never);
    s.spec.progress_deadline_seconds = 15;
    s.analysis = analysis::testing::error_rate_without_error_budget(true);
    s.completed_on("web:1");
    s.answer = analysis::Outcome::Error("connection refused".into());
    s.spec.image = "web:2".into();
    s.run_until("held", |s| {
        s.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("holds the rollout"))
    });
    for _ in 0..60 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::Progressing));
    assert!(
        !s.events.contains(&"ProgressDeadlineExceeded"),
        "{:?}",
        s.events
    );
    s.answer = analysis::Outcome::Value(serde_json::json!(0.0));
    s.completed_on("web:2");
}
