use super::*;
use crate::api::{FleetSpec, WaveApproval};
use proptest::prelude::*;

const X: &str = "shop/redis:7.4";
const OLD: &str = "shop/redis:7.2";
const KEY: (&str, &str, &str) = ("CanaryStatefulSet", "shop", "redis");

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn fleet() -> FleetSpec {
    serde_saphyr::from_str(
        "waves:\n\
         - {name: canary, clusters: [eu-1], bakeSeconds: 600}\n\
         - {name: eu, matchLabels: {region: eu}, bakeSeconds: 60}\n\
         - {name: rest, matchLabels: {}}\n",
    )
    .unwrap()
}

fn me(name: &str, region: &str) -> ClusterIdentity {
    ClusterIdentity {
        name: name.into(),
        labels: [("region".to_string(), region.to_string())].into(),
    }
}

fn stable(image: &str, since: i64) -> Report {
    Report {
        phase: "Stable".into(),
        stable_image: Some(image.into()),
        canary_image: None,
        wanted_image: Some(image.into()),
        since: Some(t(since)),
    }
}

fn reports(list: &[(&str, &str, Report)]) -> FleetReports {
    let mut f = FleetReports::default();
    for (name, region, r) in list {
        f.clusters.insert(name.to_string(), me(name, region));
        f.reports.insert(name.to_string(), r.clone());
    }
    f
}

fn hold_reason(g: &Gate) -> Option<HoldReason> {
    match g {
        Gate::Hold(h) => Some(h.reason),
        _ => None,
    }
}

#[test]
fn the_first_wave_starts_at_once_and_the_next_waits_for_its_bake() {
    let f = fleet();
    let none = FleetReports::default();
    let g = gate("shop", &f, &me("eu-1", "eu"), KEY, X, &none, t(0));
    assert_eq!(
        g,
        Gate::Open {
            wave: "canary".into()
        }
    );

    // eu-1 rolling: eu-2 (wave eu) waits and names it.
    let mut rolling = stable(OLD, 0);
    rolling.phase = "CanaryActive".into();
    rolling.canary_image = Some(X.into());
    rolling.wanted_image = Some(X.into());
    let found = reports(&[("eu-1", "eu", rolling)]);
    let g = gate("shop", &f, &me("eu-2", "eu"), KEY, X, &found, t(10));
    let Gate::Hold(h) = g else { panic!("{g:?}") };
    assert_eq!(h.reason, HoldReason::EarlierWave);
    assert!(
        h.message.contains("eu-1 (canary: CanaryActive)"),
        "{}",
        h.message
    );

    // Stable since t(100): baking until t(700), then open.
    let found = reports(&[("eu-1", "eu", stable(X, 100))]);
    let g = gate("shop", &f, &me("eu-2", "eu"), KEY, X, &found, t(699));
    let Gate::Hold(h) = g else { panic!("{g:?}") };
    assert_eq!((h.reason, h.recheck_at), (HoldReason::Baking, Some(t(700))));
    let g = gate("shop", &f, &me("eu-2", "eu"), KEY, X, &found, t(700));
    assert_eq!(g, Gate::Open { wave: "eu".into() });
}

#[test]
fn the_last_wave_waits_for_every_cluster_of_every_earlier_wave() {
    let f = fleet();
    let mut found = reports(&[
        ("eu-1", "eu", stable(X, 0)),
        ("eu-2", "eu", stable(X, 1000)),
        ("eu-3", "eu", stable(OLD, 0)),
    ]);
    found.reports.get_mut("eu-3").unwrap().wanted_image = Some(X.into());
    let us = me("us-1", "us");
    let g = gate("shop", &f, &us, KEY, X, &found, t(2000));
    let Gate::Hold(h) = g else { panic!("{g:?}") };
    assert_eq!(h.reason, HoldReason::EarlierWave);
    assert!(h.message.contains("eu-3 (eu: waiting)"), "{}", h.message);
    found.reports.insert("eu-3".into(), stable(X, 1500));
    assert_eq!(
        hold_reason(&gate("shop", &f, &us, KEY, X, &found, t(1559))),
        Some(HoldReason::Baking)
    );
    assert_eq!(
        gate("shop", &f, &us, KEY, X, &found, t(1560)),
        Gate::Open {
            wave: "rest".into()
        }
    );
}

#[test]
fn a_failure_anywhere_stops_the_image_and_only_that_image() {
    let f = fleet();
    let mut failed = stable(OLD, 0);
    failed.phase = "RolledBack".into();
    failed.canary_image = Some(X.into());
    failed.wanted_image = Some(X.into());
    let found = reports(&[("eu-1", "eu", stable(X, 0)), ("eu-2", "eu", failed)]);
    let g = gate("shop", &f, &me("us-1", "us"), KEY, X, &found, t(5000));
    let Gate::Hold(h) = g else { panic!("{g:?}") };
    assert_eq!(h.reason, HoldReason::FailedInFleet);
    assert!(
        h.message.contains("failed in cluster eu-2 (RolledBack)"),
        "{}",
        h.message
    );
    // A newer image is judged on its own.
    let newer = "shop/redis:7.6";
    let g = gate("shop", &f, &me("eu-1", "eu"), KEY, newer, &found, t(5000));
    assert_eq!(
        g,
        Gate::Open {
            wave: "canary".into()
        }
    );
}

#[test]
fn a_silent_cluster_is_named_once_the_deadline_passed() {
    let f = fleet();
    let mut found = reports(&[("eu-1", "eu", stable(X, 0)), ("eu-2", "eu", stable(X, 0))]);
    // eu-3 said who it is but still runs the old image and never reported the new one.
    found.clusters.insert("eu-3".into(), me("eu-3", "eu"));
    found.reports.insert("eu-3".into(), stable(OLD, -100));
    let us = me("us-1", "us");
    let g = gate("shop", &f, &us, KEY, X, &found, t(599));
    let Gate::Hold(h) = g else { panic!("{g:?}") };
    assert_eq!(
        (h.reason, h.recheck_at),
        (HoldReason::EarlierWave, Some(t(600)))
    );
    let g = gate("shop", &f, &us, KEY, X, &found, t(600));
    let Gate::Hold(h) = g else { panic!("{g:?}") };
    assert_eq!(h.reason, HoldReason::NotReporting);
    assert!(
        h.message
            .contains("eu-3 (eu: last Stable on shop/redis:7.2)"),
        "{}",
        h.message
    );
}

#[test]
fn a_cluster_a_wave_names_that_never_wrote_holds_it() {
    let f = fleet();
    let found = reports(&[("eu-2", "eu", stable(X, 0))]);
    let g = gate("shop", &f, &me("us-1", "us"), KEY, X, &found, t(10_000));
    let Gate::Hold(h) = g else { panic!("{g:?}") };
    assert_eq!(h.reason, HoldReason::NotReporting);
    assert!(
        h.message.contains("eu-1 (canary: no status yet)"),
        "{}",
        h.message
    );
}

#[test]
fn a_manual_wave_waits_for_its_approval_in_git() {
    let mut f = fleet();
    f.waves[1].approval = crate::api::WaveApprovalMode::Manual;
    let found = reports(&[("eu-1", "eu", stable(X, 0))]);
    let eu2 = me("eu-2", "eu");
    let g = gate("shop", &f, &eu2, KEY, X, &found, t(1000));
    assert_eq!(hold_reason(&g), Some(HoldReason::AwaitingApproval));
    f.approvals.push(WaveApproval {
        wave: "eu".into(),
        image: OLD.into(),
    });
    assert_eq!(
        hold_reason(&gate("shop", &f, &eu2, KEY, X, &found, t(1000))),
        Some(HoldReason::AwaitingApproval)
    );
    f.approvals.push(WaveApproval {
        wave: "eu".into(),
        image: X.into(),
    });
    assert_eq!(
        gate("shop", &f, &eu2, KEY, X, &found, t(1000)),
        Gate::Open { wave: "eu".into() }
    );
}

#[test]
fn a_removed_cluster_is_ignored_and_one_added_to_an_early_wave_catches_up() {
    let mut f = fleet();
    f.waves[2].match_labels = Some([("region".to_string(), "us".to_string())].into());
    // ap-1 is in no wave now: its old report does not hold anyone, and it is free itself.
    let mut found = reports(&[("eu-1", "eu", stable(X, 0)), ("ap-1", "ap", stable(OLD, 0))]);
    assert_eq!(
        gate("shop", &f, &me("us-1", "us"), KEY, X, &found, t(1000)),
        Gate::Open {
            wave: "rest".into()
        }
    );
    assert!(matches!(
        gate("shop", &f, &me("ap-1", "ap"), KEY, X, &found, t(1000)),
        Gate::Free(_)
    ));
    // eu-9 joins wave eu after us-1 started: eu-9's own earlier waves are done, so it starts.
    found.clusters.insert("eu-9".into(), me("eu-9", "eu"));
    assert_eq!(
        gate("shop", &f, &me("eu-9", "eu"), KEY, X, &found, t(1000)),
        Gate::Open { wave: "eu".into() }
    );
}

#[test]
fn a_rollout_outside_the_fleet_is_free() {
    let mut f = fleet();
    f.rollouts.push(crate::api::FleetRollout {
        kind: None,
        namespace: "shop".into(),
        name: "web".into(),
    });
    let g = gate(
        "shop",
        &f,
        &me("us-1", "us"),
        KEY,
        X,
        &FleetReports::default(),
        t(0),
    );
    assert!(
        matches!(g, Gate::Free(ref why) if why.contains("not one of fleet shop's rollouts")),
        "{g:?}"
    );
}

#[test]
fn a_second_image_overtakes_the_first_without_skipping_a_bake() {
    let f = fleet();
    let y = "shop/redis:7.6";
    // eu-1 finished X and started Y; eu-2 has X baked elsewhere but must not start Y yet.
    let mut on_y = stable(X, 0);
    on_y.phase = "CanaryActive".into();
    on_y.canary_image = Some(y.into());
    on_y.wanted_image = Some(y.into());
    let found = reports(&[("eu-1", "eu", on_y)]);
    let g = gate("shop", &f, &me("eu-2", "eu"), KEY, y, &found, t(10_000));
    assert_eq!(hold_reason(&g), Some(HoldReason::EarlierWave));
    let found = reports(&[("eu-1", "eu", stable(y, 10_000))]);
    assert_eq!(
        hold_reason(&gate(
            "shop",
            &f,
            &me("eu-2", "eu"),
            KEY,
            y,
            &found,
            t(10_599)
        )),
        Some(HoldReason::Baking)
    );
    assert_eq!(
        gate("shop", &f, &me("eu-2", "eu"), KEY, y, &found, t(10_600)),
        Gate::Open { wave: "eu".into() }
    );
}

fn any_report() -> impl Strategy<Value = Option<Report>> {
    let phase = prop::sample::select(vec![
        "Stable",
        "Completed",
        "CanaryActive",
        "RolledBack",
        "Failed",
        "Progressing",
    ]);
    let image = prop::option::of(prop::sample::select(vec![X, OLD]));
    prop::option::of(
        (phase, image.clone(), image.clone(), image, 0i64..3000).prop_map(
            |(phase, stable_image, canary_image, wanted_image, since)| Report {
                phase: phase.into(),
                stable_image: stable_image.map(Into::into),
                canary_image: canary_image.map(Into::into),
                wanted_image: wanted_image.map(Into::into),
                since: Some(t(since)),
            },
        ),
    )
}

proptest! {
    /// A wave opens only when every cluster of every earlier wave has the image Stable for
    /// its bake time, and nothing failed; and once open, it stays open as time passes.
    #[test]
    fn a_wave_opens_only_after_every_earlier_cluster_baked(
        eu1 in any_report(), eu2 in any_report(), eu3 in any_report(),
        now in 0i64..6000, later in 0i64..6000,
    ) {
        let f = fleet();
        let mut found = FleetReports::default();
        for (name, r) in [("eu-1", eu1), ("eu-2", eu2), ("eu-3", eu3)] {
            found.clusters.insert(name.into(), me(name, "eu"));
            if let Some(r) = r { found.reports.insert(name.into(), r); }
        }
        let us = me("us-1", "us");
        let g = gate("shop", &f, &us, KEY, X, &found, t(now));
        if matches!(g, Gate::Open { .. }) {
            for (name, bake) in [("eu-1", 600), ("eu-2", 60), ("eu-3", 60)] {
                let r = found.reports.get(name);
                prop_assert_eq!(cluster_state(r, X, bake, t(now)), ClusterState::Done, "{}", name);
            }
            prop_assert_eq!(gate("shop", &f, &us, KEY, X, &found, t(now + later)), g);
        }
    }
}

#[test]
fn a_waves_analysis_gates_the_last_step_in_that_waves_clusters_only() {
    let spec: FleetSpec = serde_saphyr::from_str(
        "waves:\n\
         - {name: canary, clusters: [eu-1]}\n\
         - name: eu\n\
         \x20 matchLabels: {region: eu}\n\
         \x20 analysis: {templates: [{templateName: error-rate}], args: [{name: max, value: '0.01'}]}\n",
    )
    .unwrap();
    let snapshot = FleetSnapshot {
        name: "shop".into(),
        spec,
        ..Default::default()
    };
    assert_eq!(snapshot.wave_analysis(&me("eu-1", "eu"), KEY), None);
    let wave = snapshot.wave_analysis(&me("eu-2", "eu"), KEY).unwrap();
    // No analysis of its own: the wave's is the gate after its last step (3).
    let merged = with_wave_analysis(None, wave, Some(3));
    assert_eq!(merged.gates.len(), 1);
    assert_eq!(merged.gates[0].after, 3);
    assert_eq!(merged.gates[0].templates[0].template_name, "error-rate");
    assert_eq!(merged.background, None);
    // A gate of its own there keeps its templates and its value of an argument both set;
    // its other gates and its background stay as they are.
    let own: RolloutAnalysis = serde_saphyr::from_str(
        "background: {templates: [{templateName: latency}]}\n\
         gates:\n\
         - {after: 1, templates: [{templateName: smoke}]}\n\
         - {after: 3, templates: [{templateName: latency}], args: [{name: max, value: '0.5'}]}\n",
    )
    .unwrap();
    let merged = with_wave_analysis(Some(&own), wave, Some(3));
    assert_eq!(merged.gates[0], own.gates[0]);
    assert_eq!(merged.background, own.background);
    let last = &merged.gates[1];
    let names: Vec<&str> = last
        .templates
        .iter()
        .map(|t| t.template_name.as_str())
        .collect();
    assert_eq!(names, ["latency", "error-rate"]);
    assert_eq!(last.args.len(), 1);
    assert_eq!(last.args[0].value, "0.5");
    // No last step to gate (a rolling CanaryDeployment): the background runs it.
    let merged = with_wave_analysis(Some(&own), wave, None);
    assert_eq!(merged.background.unwrap().templates.len(), 2);
    // A Fleet with a mistake runs no wave's analysis (it holds every new image instead).
    let broken = FleetSnapshot {
        problem: Some("bad".into()),
        ..snapshot
    };
    assert_eq!(broken.wave_analysis(&me("eu-2", "eu"), KEY), None);
}

#[test]
fn only_a_revert_policy_lets_a_revert_edit_the_shared_base_of_the_fleets_rollouts() {
    let snapshot = |yaml: &str| FleetSnapshot {
        name: "shop".into(),
        spec: serde_saphyr::from_str(yaml).unwrap(),
        ..Default::default()
    };
    let waves = "waves:\n- {name: a, clusters: [eu-1]}\n";
    assert!(!snapshot(waves).reverts_shared_base(KEY));
    let revert = snapshot(&format!("{waves}onFailure: revert\n"));
    assert!(revert.reverts_shared_base(KEY));
    let other = snapshot(&format!(
        "{waves}onFailure: revert\nrollouts:\n- {{namespace: shop, name: web}}\n"
    ));
    assert!(!other.reverts_shared_base(KEY));
    let broken = FleetSnapshot {
        problem: Some("bad".into()),
        ..revert
    };
    assert!(!broken.reverts_shared_base(KEY));
}

#[test]
fn every_other_cluster_that_took_a_failed_image_puts_back_the_one_the_failed_cluster_went_back_to()
{
    let mut snapshot = FleetSnapshot {
        name: "shop".into(),
        spec: fleet(),
        ..Default::default()
    };
    let rolled_back = Report {
        phase: "RolledBack".into(),
        stable_image: Some(OLD.into()),
        canary_image: Some(X.into()),
        wanted_image: Some(X.into()),
        since: Some(t(100)),
    };
    let id = |k: (&str, &str, &str)| (k.0.to_string(), k.1.to_string(), k.2.to_string());
    let mut by_cluster = BTreeMap::new();
    by_cluster.insert("eu-1".to_string(), stable(X, 0));
    by_cluster.insert("eu-2".to_string(), rolled_back.clone());
    snapshot.reports.insert(id(KEY), by_cluster);
    let eu1 = me("eu-1", "eu");
    // `stop`, the default: the clusters that took it keep it.
    assert_eq!(snapshot.failure_to_revert(&eu1, KEY, X), None);
    snapshot.spec.on_failure = crate::api::FleetFailurePolicy::Revert;
    let want = FleetFailure {
        cluster: "eu-2".into(),
        phase: "RolledBack".into(),
        good: OLD.into(),
    };
    assert_eq!(snapshot.failure_to_revert(&eu1, KEY, X), Some(want));
    // Not the failed cluster itself (its own revert does), not another image, not another
    // rollout, not a cluster in no wave.
    assert_eq!(snapshot.failure_to_revert(&me("eu-2", "eu"), KEY, X), None);
    assert_eq!(snapshot.failure_to_revert(&eu1, KEY, OLD), None);
    let web = ("CanaryStatefulSet", "shop", "web");
    assert_eq!(snapshot.failure_to_revert(&eu1, web, X), None);
    let mut one_wave = snapshot.clone();
    one_wave.spec.waves.truncate(1);
    assert_eq!(one_wave.failure_to_revert(&me("us-1", "us"), KEY, X), None);
    // Still rolling it out, or already back on X (a failed canary of X with X stable): no
    // image to go back to.
    for report in [
        Report {
            phase: "CanaryActive".into(),
            ..rolled_back.clone()
        },
        Report {
            stable_image: Some(X.into()),
            ..rolled_back.clone()
        },
    ] {
        let mut s = snapshot.clone();
        s.reports
            .get_mut(&id(KEY))
            .unwrap()
            .insert("eu-2".into(), report);
        assert_eq!(s.failure_to_revert(&eu1, KEY, X), None);
    }
    // A Fleet with a mistake reverts nothing.
    let broken = FleetSnapshot {
        problem: Some("bad".into()),
        ..snapshot
    };
    assert_eq!(broken.failure_to_revert(&eu1, KEY, X), None);
}
