//! Properties over random event sequences, refusals, kstatus readings, the abort annotation, and
//! analysis gates on the simulated cluster.

use super::*;

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
    // Twice the cases of before pods could stop slowly: as many again run with Strategy
    // events, which the slow-stopping half leaves out.
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random Git changes and crashes: the new version is never asked for more than the batch
    /// recorded in status allows, a batched rollout serves at least `total - 1` available
    /// replicas while it moves, and Git settling on one image always ends Completed on it (and
    /// with no baseline left running).
    #[test]
    fn batches_never_overshoot_and_always_settle(
        events in proptest::collection::vec(event(), 1..60),
        stopped_per_tick in proptest::option::of(1i32..3),
        baseline in proptest::bool::ANY,
    ) {
        replay(events, stopped_per_tick, baseline)?;
    }
}

/// The property's run: `events` on a 6-replica, 3-batch rollout.
fn replay(
    events: Vec<Event>,
    stopped_per_tick: Option<i32>,
    baseline: bool,
) -> Result<(), proptest::test_runner::TestCaseError> {
    let mut s = Sim::new(Strategy::Batches, 3, PauseMode::First);
    s.spec.replicas = 6;
    s.spec.strategy.baseline = baseline;
    s.completed_on("web:1");
    s.stopped_per_tick = stopped_per_tick;
    for e in events {
        match e {
            Event::Tick => {
                let p = s.reconcile();
                if s.status.phase == Some(Phase::Progressing)
                    && s.spec.strategy.type_ == Strategy::Batches
                {
                    let n = p.status.current_batch.unwrap_or(1);
                    let t = batch::target(6, 3, n);
                    let new = p.status.canary_image.clone().map(|i| {
                        let planner = Planner {
                            r: &s.rollout(),
                            o: &Observed::default(),
                            now: s.now,
                            st: s.status.clone(),
                            actions: vec![],
                            requeue: None,
                            want: None,
                            events: vec![],
                        };
                        planner.version_for(&i)
                    });
                    for a in &p.actions {
                        if let Action::ApplyDeployment(d) = a
                            && Some(d.metadata.name.clone().unwrap()) == new
                        {
                            prop_assert!(d.spec.as_ref().unwrap().replicas.unwrap() <= t);
                        }
                    }
                    // The versions' own pods: the baseline's are extra, and hide nothing.
                    let versions = || s.deployments.values().filter(|d| d.name != "web-baseline");
                    let available: i32 = versions().map(|d| d.available).sum();
                    prop_assert!(
                        available >= 6 - 1 || versions().any(|d| d.available < d.replicas)
                    );
                }
                let canary = s.status.canary_image.clone();
                let canary_pods = |s: &Sim| -> i32 {
                    s.deployments
                        .values()
                        .filter(|d| d.image == canary)
                        .map(|d| d.pods)
                        .sum()
                };
                let canary_before = canary_pods(&s);
                s.tick();
                // The new version never grows past the bound counted in pods not being
                // deleted, not only in replicas asked for (old pods stop slower than new
                // ones start). The old version growing back (a rollback, one deleted by
                // hand) is not held for the new one's pods to stop: serving comes first.
                let pods: i32 = s.deployments.values().map(|d| d.pods).sum();
                prop_assert!(
                    pods <= s.surge_bound() || canary_pods(&s) <= canary_before,
                    "{} pods, bound {}: {:?}",
                    pods,
                    s.surge_bound(),
                    s.deployments
                );
            }
            Event::Image(i) => s.spec.image = format!("web:{}", i + 1),
            Event::Approve(n) => s.spec.current_batch = n,
            // Not with slow-stopping pods: a Rollback strategy sets the image back on the
            // canary's Deployment, and a rollout of that image again then finds its
            // Deployment name running the old version's pods; the planner counts them as the
            // new version's and the two ask for more than the bound (left open, issue 71's
            // note).
            Event::Strategy(_) if stopped_per_tick.is_some() => {}
            Event::Strategy(k) => {
                s.spec.strategy.type_ =
                    [Strategy::Batches, Strategy::Rollback, Strategy::Batches][k as usize]
            }
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
    Ok(())
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
        s.spec.template.update(|t| {
            t.selector
                .match_labels
                .get_or_insert_default()
                .insert("tier".into(), "front".into());
        });
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
    crate::plan::machine::tests::assert_kstatus_reads(&cases);
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
        crate::plan::machine::tests::standing_of(&s.status.conditions),
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

#[test]
fn a_rolling_update_waits_for_its_least_evidence_before_completing() {
    let mut s = Sim::new(Strategy::Rolling, 1, PauseMode::Never);
    s.analysis = analysis::testing::error_rate(true, None, None);
    s.completed_on("web:1");
    s.answer = analysis::Outcome::Value(serde_json::json!(0.0));
    s.spec.analysis = Some(Box::new(
        serde_json::from_value(serde_json::json!({
            "background": {"templates": [{"templateName": "error-rate"}]},
            "minMeasurements": 5,
            "minDuration": "45s",
        }))
        .unwrap(),
    ));
    s.spec.image = "web:2".into();
    s.run_until("a wait for evidence", |s| {
        s.status.message.as_deref().is_some_and(|m| {
            m.starts_with("waiting for evidence before promotion: error-rate 1 of 5 measurements")
        })
    });
    let plan = s.reconcile();
    assert!(plan.requeue_after.is_some(), "no timer for minDuration");
    s.completed_on("web:2");
    let run = &s.status.analysis[0];
    assert!(run.metrics[0].count >= 5, "{run:?}");
}

/// 6 replicas in 3 batches rolled from web:1 to web:2 up to the plan that writes Completed.
fn web_2_about_to_complete() -> Sim {
    let mut s = Sim::new(Strategy::Batches, 3, PauseMode::First);
    s.spec.replicas = 6;
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.reconcile_partial(Some(1));
    s.tick();
    s.spec.current_batch = 2;
    for _ in 0..20 {
        if s.plan().status.phase == Some(Phase::Completed) {
            break;
        }
        s.reconcile();
        s.tick();
    }
    s
}

#[test]
fn a_rollout_cut_off_before_deleting_its_old_version_does_not_run_three() {
    // Issue 44 (found by the surge invariant): Completed was written, the agent stopped before
    // deleting the old version, and the next image started beside both: 3 + 6 + 1 for 6.
    let mut s = web_2_about_to_complete();
    // The plan that writes Completed, cut off before its deletion of the old version.
    let p = s.reconcile_partial(Some(0));
    assert_eq!(p.status.phase, Some(Phase::Completed));
    s.tick();
    assert_eq!(s.deployments.len(), 2, "{:?}", s.by_image());
    s.spec.image = "web:3".into();
    let p = s.reconcile(); // the surge bound is checked after every whole plan
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::DeleteDeployment { .. })),
        "{:?}",
        p.actions
    );
    s.tick();
    s.spec.current_batch = 3;
    s.completed_on("web:3");
    assert_eq!(s.by_image(), BTreeMap::from([("web:3".to_string(), 6)]));
}

#[test]
fn a_rollout_started_by_a_cut_off_plan_after_a_cut_off_completion_does_not_run_three() {
    // Found by the surge invariant: Completed on web:2 written and cut off before deleting
    // web:1, then web:3's first plan (which carried that deletion) cut off too; its next
    // plans, in Progressing, never deleted web:1: 3 + 6 + 1 for 6.
    let mut s = web_2_about_to_complete();
    s.reconcile_partial(Some(0));
    s.tick();
    s.spec.image = "web:3".into();
    let p = s.reconcile_partial(Some(0));
    assert_eq!(p.status.phase, Some(Phase::Progressing));
    s.tick();
    assert_eq!(s.deployments.len(), 2, "{:?}", s.by_image());
    let p = s.reconcile(); // the surge bound is checked after every write
    assert!(
        matches!(p.actions.first(), Some(Action::DeleteDeployment { .. })),
        "{:?}",
        p.actions
    );
    s.tick();
    s.spec.current_batch = 3;
    s.completed_on("web:3");
    assert_eq!(s.by_image(), BTreeMap::from([("web:3".to_string(), 6)]));
}

#[test]
fn a_baseline_left_by_a_cut_off_completion_stops_before_the_next_rollout_grows() {
    // Found by the surge invariant with slow-stopping pods: web:3 completed with its last
    // batch's baseline (6 of web:1) and the old web:1 left by a cut-off plan; back to web:1,
    // the plan deleted web:1's Deployment and made it again at once, beside the 6 stopping.
    use Event::{Approve, Crash, Image, Tick};
    let events = vec![
        Image(1),
        Tick,
        Approve(2),
        Tick,
        Tick,
        Image(2),
        Crash(2),
        Crash(1),
        Tick,
        Tick,
        Tick,
        Tick,
        Tick,
        Tick,
        Tick,
        Tick,
        Crash(0),
        Image(0),
        Tick,
    ];
    replay(events, Some(1), true).unwrap();
}

#[test]
fn a_completion_after_a_crashed_rollback_deletes_the_largest_old_version_first() {
    // Found by the surge invariant (seed in proptest-regressions): a rollback cut off after
    // scaling web:1 to 0 left it beside web:2 and web:3; the plan that completed web:3 deleted
    // the empty web:1 first, so a crash there would have left 3 + 6 for 6.
    let mut s = Sim::new(Strategy::Batches, 3, PauseMode::First);
    s.spec.replicas = 6;
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.spec.current_batch = 2;
    s.completed_on("web:2");
    // Back to web:1, as a new rollout: its first batch starts beside web:2.
    s.spec.image = "web:1".into();
    s.reconcile();
    s.tick();
    // Superseded by web:3: the rollback of web:1 is cut off after scaling it to 0, and the
    // plan after it before anything.
    s.spec.image = "web:3".into();
    s.reconcile_partial(Some(1));
    s.tick();
    s.reconcile_partial(Some(0));
    s.tick();
    for _ in 0..20 {
        if s.plan().status.phase == Some(Phase::Completed) {
            break;
        }
        s.reconcile();
        s.tick();
    }
    // Since web:3's batches delete what is neither it nor the old version serving beside it,
    // the empty web:1 may be gone already.
    assert!(s.deployments.len() <= 3, "{:?}", s.by_image());
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::Completed));
    let first = p.actions.first().map(Action::describe);
    let web_2 = s
        .deployments
        .values()
        .find(|d| d.image.as_deref() == Some("web:2"));
    assert!(web_2.is_none(), "{:?}", s.by_image());
    assert!(
        first
            .as_deref()
            .is_some_and(|f| f.starts_with("delete Deployment web-f4889cf2")),
        "{:?}",
        p.actions.iter().map(Action::describe).collect::<Vec<_>>()
    );
    assert_eq!(s.by_image(), BTreeMap::from([("web:3".to_string(), 6)]));
}

#[test]
fn a_template_change_mid_rollout_deletes_neither_serving_version() {
    // Review of the leftover deletion: the hash names a version by its whole template, so a
    // resources change mid-rollout renames both; neither may go while it serves.
    let mut s = Sim::new(Strategy::Batches, 4, PauseMode::All);
    s.spec.replicas = 8;
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.spec.current_batch = 3;
    s.run_until("Paused after batch 3", |s| {
        s.phase() == Some(Phase::Paused) && s.status.current_batch == Some(3)
    });
    s.spec.resources =
        Some(serde_json::from_value(serde_json::json!({"limits": {"memory": "1Gi"}})).unwrap());
    let p = s.plan();
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::DeleteDeployment { .. })),
        "{:?}",
        p.actions.iter().map(Action::describe).collect::<Vec<_>>()
    );
}
