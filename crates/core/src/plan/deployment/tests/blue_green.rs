//! Blue-green (`strategy: BlueGreen`) against the Deployment model and a gateway model: the
//! preview beside the whole old version, the switch of every request at once, the old version
//! kept whole for the scale-down delay, and switching back on an abort or a failed
//! post-promotion gate. Every tick, no route sends requests to a Service without a ready pod.

use super::*;
use crate::plan::traffic::{RouteView, current_weight};

fn blue_green(pause: PauseMode) -> Sim {
    let mut s = Sim::new(Strategy::BlueGreen, 1, pause);
    s.spec.traffic_routing = Some(Box::new(
        serde_json::from_value(serde_json::json!({
            "gatewayAPI": {"httpRoutes": ["web"], "port": 8080},
            "headerRoute": {"headers": [{"name": "x-canary", "value": "always"}]},
            "settleSeconds": 5,
        }))
        .unwrap(),
    ));
    s.spec.strategy.blue_green = Some(crate::api::BlueGreen {
        preview_replicas: None,
        scale_down_delay_seconds: 30,
        ..crate::api::BlueGreen::default()
    });
    s.traffic.routes = vec![RouteView {
        kind: crate::api::RouteKind::Http,
        name: "web".into(),
        rules: serde_json::json!([{
            "backendRefs": [{"group": "", "kind": "Service", "name": "web-stable",
                "port": 8080, "weight": 1}]
        }]),
        generation: 1,
        accepted_generation: Some(1),
        resource_version: None,
    }];
    s.completed_on("web:1");
    s
}

fn rules(s: &Sim) -> &serde_json::Value {
    &s.traffic.routes[0].rules
}

/// Percent of requests the route sends to the canary (preview) Service.
fn weight(s: &Sim) -> i32 {
    current_weight(rules(s), "web-stable", "web-canary").unwrap_or(0)
}

fn header_route(s: &Sim) -> bool {
    rules(s).to_string().contains("x-canary")
}

fn endpoints(s: &Sim, service: &str) -> i32 {
    let found = s.traffic.services.iter().find(|x| x.name == service);
    found.map_or(0, |x| x.ready_endpoints)
}

/// No request is lost: whatever a route sends to a Service, it has ready endpoints for.
fn assert_lossless(s: &Sim) {
    let (w, header) = (weight(s), header_route(s));
    if w > 0 || header {
        assert!(
            endpoints(s, "web-canary") > 0,
            "weight {w} (header {header}) to a canary Service without ready endpoints; {:?} {:?}",
            s.status.phase,
            s.by_image()
        );
    }
    if w < 100 {
        assert!(
            endpoints(s, "web-stable") > 0,
            "weight {} to a stable Service without ready endpoints; {:?} {:?}",
            100 - w,
            s.status.phase,
            s.by_image()
        );
    }
}

fn run_checked(s: &mut Sim, what: &str, done: impl Fn(&Sim) -> bool) {
    for _ in 0..300 {
        if done(s) {
            return;
        }
        s.reconcile();
        s.tick();
        assert_lossless(s);
    }
    panic!(
        "never reached {what}: {:?} {:?}; weight {}, pods {:?}",
        s.status.phase,
        s.status.message,
        weight(s),
        s.deployments
            .values()
            .map(|d| (&d.name, &d.image, d.replicas, d.pods))
            .collect::<Vec<_>>()
    );
}

/// One plan and tick in which web:2's pods beyond `most` do not become available (slow to
/// start, or failing); then the lossless check.
fn tick_with_new_pods_available_at_most(s: &mut Sim, most: i32) {
    s.reconcile();
    s.tick();
    for d in s.deployments.values_mut() {
        if d.image.as_deref() == Some("web:2") {
            d.available = d.available.min(most);
        }
    }
    assert_lossless(s);
}

fn message(s: &Sim) -> String {
    s.status.message.clone().unwrap_or_default()
}

/// The version label the Service `name` selects.
fn selects(s: &Sim, name: &str) -> String {
    s.service_selectors[name][VERSION_LABEL].clone()
}

#[test]
fn the_preview_runs_whole_beside_the_old_version_and_gets_only_the_header_route() {
    let mut s = blue_green(PauseMode::First);
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Paused", |s| s.phase() == Some(Phase::Paused));
    assert_eq!(
        s.by_image(),
        BTreeMap::from([("web:1".into(), 4), ("web:2".into(), 4)])
    );
    assert_eq!(weight(&s), 0, "nothing switched before approval");
    assert!(header_route(&s), "the preview answers the header route");
    assert_eq!(s.status.batch.as_deref(), Some("1/2"));
    assert!(
        message(&s).contains("waiting for approval to switch: set currentBatch to 2 in Git"),
        "{}",
        message(&s)
    );
    assert_eq!(
        s.status
            .batches
            .iter()
            .map(|b| (b.batch, b.target))
            .collect::<Vec<_>>(),
        vec![(1, 4), (2, 4)]
    );
    for _ in 0..5 {
        s.reconcile();
        s.tick();
        assert_lossless(&s);
    }
    assert_eq!(s.phase(), Some(Phase::Paused));
}

#[test]
fn the_switch_moves_every_request_at_once_and_the_old_version_stops_after_the_delay() {
    let mut s = blue_green(PauseMode::First);
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Paused", |s| s.phase() == Some(Phase::Paused));
    s.spec.current_batch = 2;
    let mut weights = Vec::new();
    let mut switched_at = None;
    for _ in 0..120 {
        s.reconcile();
        s.tick();
        assert_lossless(&s);
        if weights.last() != Some(&weight(&s)) {
            weights.push(weight(&s));
        }
        if weight(&s) == 100 && switched_at.is_none() {
            switched_at = Some(s.now);
            assert_eq!(
                s.by_image()["web:1"],
                4,
                "the old version whole at the switch"
            );
        }
        if s.phase() == Some(Phase::Completed) {
            break;
        }
    }
    assert_eq!(s.phase(), Some(Phase::Completed), "{}", message(&s));
    // Then the stable Service selects the new version, and every request goes to it.
    run_checked(&mut s, "weight 0", |s| weight(s) == 0);
    weights.push(weight(&s));
    assert_eq!(
        weights,
        vec![100, 0],
        "0 → 100 at once, then 0 to the new stable"
    );
    let waited = s.now.duration_since(switched_at.unwrap()).as_secs();
    assert!(
        waited >= 30,
        "the old version stopped {waited}s after the switch"
    );
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".into(), 4)]));
    let new_version = s.deployments.keys().next().unwrap().clone();
    assert_eq!(format!("web-{}", selects(&s, "web-stable")), new_version);
    assert!(s.events.contains(&"Switching"), "{:?}", s.events);
    assert_eq!(s.status.previous_image.as_deref(), Some("web:1"));
}

#[test]
fn while_the_old_version_waits_the_message_says_a_rollback_is_instant() {
    let mut s = blue_green(PauseMode::Never);
    s.spec.image = "web:2".into();
    run_checked(&mut s, "the switch", |s| weight(s) == 100);
    run_checked(&mut s, "the settle time over", |s| {
        message(s).contains("scaleDownDelaySeconds")
    });
    assert!(
        message(&s).contains(
            "the old version on web:1 keeps its replicas for scaleDownDelaySeconds (30s)"
        ),
        "{}",
        message(&s)
    );
    // The timer is for the end of the delay, not a poll.
    let p = s.plan();
    let requeue = p.requeue_after.unwrap();
    assert!(requeue <= Duration::from_secs(31), "{requeue:?}");
    assert!(requeue >= Duration::from_secs(10), "{requeue:?}");
}

#[test]
fn an_abort_after_the_switch_switches_straight_back_without_starting_a_pod() {
    let mut s = blue_green(PauseMode::Never);
    s.spec.image = "web:2".into();
    run_checked(&mut s, "the switch", |s| weight(s) == 100);
    s.abort = Some("true".into());
    // The first plan puts every request back: the old version has all its pods.
    s.reconcile();
    s.tick();
    assert_lossless(&s);
    assert_eq!(s.phase(), Some(Phase::RollingBack));
    assert_eq!(weight(&s), 0, "switched back at once");
    assert_eq!(s.max_asked.values().copied().max(), Some(4));
    run_checked(&mut s, "RolledBack", |s| {
        s.phase() == Some(Phase::RolledBack)
    });
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    assert_eq!(weight(&s), 0);
}

#[test]
fn a_failing_post_promotion_gate_switches_back() {
    let mut s = blue_green(PauseMode::Never);
    s.analysis = analysis::testing::error_rate(false, Some(2), Some(3));
    s.spec.image = "web:2".into();
    run_checked(&mut s, "the switch", |s| weight(s) == 100);
    s.answer = analysis::Outcome::Value(serde_json::json!(0.4));
    run_checked(&mut s, "RolledBack", |s| {
        s.phase() == Some(Phase::RolledBack)
    });
    assert!(s.events.contains(&"AnalysisFailed"), "{:?}", s.events);
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    assert_eq!(s.status.stable_image.as_deref(), Some("web:1"));
}

#[test]
fn a_passing_preview_gate_switches_without_approval_and_a_failing_one_never_switches() {
    let mut s = blue_green(PauseMode::First);
    s.analysis = analysis::testing::error_rate(false, Some(1), Some(3));
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Completed on web:2", |s| {
        s.phase() == Some(Phase::Completed) && s.status.stable_image.as_deref() == Some("web:2")
    });
    assert!(!s.phases.contains(&Phase::Paused), "{:?}", s.phases);

    s.answer = analysis::Outcome::Value(serde_json::json!(0.4));
    s.spec.image = "web:3".into();
    let mut highest = 0;
    for _ in 0..100 {
        s.reconcile();
        s.tick();
        assert_lossless(&s);
        highest = highest.max(weight(&s));
        if s.phase() == Some(Phase::RolledBack) {
            break;
        }
    }
    assert_eq!(s.phase(), Some(Phase::RolledBack));
    assert_eq!(
        highest, 0,
        "a preview that failed its gate never got a request"
    );
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".into(), 4)]));
}

#[test]
fn a_smaller_preview_grows_to_every_replica_before_the_switch() {
    let mut s = blue_green(PauseMode::First);
    s.spec
        .strategy
        .blue_green
        .as_mut()
        .unwrap()
        .preview_replicas = Some(1);
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Paused", |s| s.phase() == Some(Phase::Paused));
    assert_eq!(
        s.by_image(),
        BTreeMap::from([("web:1".into(), 4), ("web:2".into(), 1)])
    );
    s.spec.current_batch = 2;
    let mut seen = vec![(0, 1)];
    for _ in 0..100 {
        s.reconcile();
        s.tick();
        assert_lossless(&s);
        let new = s
            .deployments
            .values()
            .find(|d| d.image.as_deref() == Some("web:2"));
        let now = (weight(&s), new.map_or(0, |d| d.available));
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        if s.phase() == Some(Phase::Completed) && weight(&s) == 0 {
            break;
        }
    }
    assert_eq!(seen, vec![(0, 1), (0, 4), (100, 4), (0, 4)], "{seen:?}");
}

/// Found by review: the delay counted from the approval, so a preview that took longer than
/// the delay to grow to every replica lost its old version as soon as the switch settled.
#[test]
fn the_scale_down_delay_counts_from_the_switch_not_from_the_approval() {
    let mut s = blue_green(PauseMode::First);
    s.spec
        .strategy
        .blue_green
        .as_mut()
        .unwrap()
        .preview_replicas = Some(1);
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Paused", |s| s.phase() == Some(Phase::Paused));
    s.spec.current_batch = 2;
    // The new version's other pods take 60 s to become available.
    for _ in 0..60 {
        tick_with_new_pods_available_at_most(&mut s, 1);
    }
    assert_eq!(weight(&s), 0, "no switch before every new pod is up");
    run_checked(&mut s, "the switch", |s| weight(s) == 100);
    let switched_at = s.now;
    run_checked(&mut s, "Completed", |s| s.phase() == Some(Phase::Completed));
    let waited = s.now.duration_since(switched_at).as_secs();
    assert!(
        waited >= 30,
        "the old version stopped {waited}s after the switch"
    );
}

/// Found by review: after the switch, more replicas (an autoscaler's) sent every request back
/// to the old version until the new pods were up, and, past the progress deadline counted
/// from the switch, rolled the rollout back.
#[test]
fn a_scale_up_after_the_switch_keeps_the_requests_on_the_new_version() {
    let mut s = blue_green(PauseMode::Never);
    // Longer than the scale-up's pods take (30 s), shorter than since the switch (50 s).
    s.spec.progress_deadline_seconds = 40;
    s.spec
        .strategy
        .blue_green
        .as_mut()
        .unwrap()
        .scale_down_delay_seconds = 120;
    s.spec.image = "web:2".into();
    run_checked(&mut s, "the switch", |s| weight(s) == 100);
    for _ in 0..20 {
        s.reconcile();
        s.tick();
    }
    s.spec.replicas = 6;
    // The two new pods of web:2 take 30 s to become available.
    for _ in 0..30 {
        tick_with_new_pods_available_at_most(&mut s, 4);
        assert_eq!(weight(&s), 100, "{}", message(&s));
        assert_eq!(s.phase(), Some(Phase::Progressing), "{}", message(&s));
    }
    run_checked(&mut s, "Completed", |s| {
        s.phase() == Some(Phase::Completed) && weight(s) == 0
    });
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".into(), 6)]));
}

/// Found by the second review: with no deadline after the switch, new pods that stopped being
/// ready (one left) held the rollout in Progressing for good. They meet the deadline and the
/// requests switch back to the old version, whole all along.
#[test]
fn new_pods_that_fail_after_the_switch_meet_the_deadline_and_switch_back() {
    let mut s = blue_green(PauseMode::Never);
    s.spec.progress_deadline_seconds = 30;
    s.spec.rollback_on_failure = true;
    s.spec
        .strategy
        .blue_green
        .as_mut()
        .unwrap()
        .scale_down_delay_seconds = 600;
    s.spec.image = "web:2".into();
    run_checked(&mut s, "the switch", |s| weight(s) == 100);
    for _ in 0..60 {
        tick_with_new_pods_available_at_most(&mut s, 1);
        if s.phase() == Some(Phase::RollingBack) {
            break;
        }
    }
    assert_eq!(s.phase(), Some(Phase::RollingBack), "{}", message(&s));
    run_checked(&mut s, "RolledBack", |s| {
        s.phase() == Some(Phase::RolledBack)
    });
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    assert_eq!(weight(&s), 0);
}

#[test]
fn a_preview_that_never_becomes_available_fails_at_the_deadline_and_keeps_every_request() {
    let mut s = blue_green(PauseMode::Never);
    s.spec.progress_deadline_seconds = 20;
    s.spec.image = "web:broken".into();
    run_checked(&mut s, "Failed", |s| s.phase() == Some(Phase::Failed));
    assert!(
        message(&s).contains(
            "new pods on web:broken were not available within progressDeadlineSeconds (20s)"
        ),
        "{}",
        message(&s)
    );
    assert_eq!(weight(&s), 0);
    assert!(
        !header_route(&s),
        "no header route to pods that are not ready"
    );
    assert_eq!(s.by_image()["web:1"], 4);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Restart-safe and lossless: plans cut off after any action (a `kill -9` between two
    /// writes), old pods stopping slowly, an abort or an approval at any time. Whatever
    /// happens, no request goes to a Service without a ready pod, the rollout never asks for
    /// more than both versions whole, and it ends on one version with every request on it.
    #[test]
    fn blue_green_loses_no_request_whatever_is_cut_off(
        cuts in proptest::collection::vec(prop_oneof![Just(None), (0usize..4).prop_map(Some)], 1..60),
        abort_at in prop_oneof![Just(None), (0usize..60).prop_map(Some)],
        approve_at in 0usize..30,
        slow_stops in prop_oneof![Just(None), Just(Some(1))],
    ) {
        let mut s = blue_green(PauseMode::First);
        s.stopped_per_tick = slow_stops;
        s.spec.image = "web:2".into();
        for (i, cut) in cuts.iter().enumerate() {
            if i == approve_at {
                s.spec.current_batch = 2;
            }
            if Some(i) == abort_at {
                s.abort = Some("true".into());
            }
            s.reconcile_partial(*cut);
            s.tick();
            assert_lossless(&s);
            let asked: i32 = s.deployments.values().map(|d| d.replicas).sum();
            prop_assert!(asked <= 8, "{asked} replicas asked for: {:?}", s.by_image());
        }
        s.spec.current_batch = 2;
        run_checked(&mut s, "at rest", |s| {
            matches!(s.phase(), Some(Phase::Completed | Phase::RolledBack))
                && s.deployments.len() == 1
                && s.deployments.values().all(|d| d.pods == 4)
                && weight(s) == 0
        });
        let serving = s.status.stable_image.clone().unwrap();
        prop_assert_eq!(s.by_image(), BTreeMap::from([(serving, 4)]));
        prop_assert_eq!(weight(&s), 0);
    }
}
