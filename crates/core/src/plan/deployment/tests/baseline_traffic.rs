//! Baseline pods with traffic routing: the routes give the baseline's Service the canary's
//! share (taken from the stable one's), and its pods go only once no route sends them
//! requests and the gateway had the settle time: at the end, and on an abort.

use super::*;
use crate::plan::traffic::{RouteView, baseline_weight, current_weight};

const SETTLE: i64 = 5;

fn routed_baseline() -> Sim {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.spec.strategy.baseline = true;
    s.spec.traffic_routing = Some(Box::new(
        serde_json::from_value(serde_json::json!({
            "gatewayAPI": {"httpRoutes": ["web"], "port": 8080},
            "weights": [30, 100],
            "settleSeconds": SETTLE,
        }))
        .unwrap(),
    ));
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

/// Percent to the canary and to the baseline.
fn split(s: &Sim) -> (i32, i32) {
    let rules = &s.traffic.routes[0].rules;
    (
        current_weight(rules, "web-stable", "web-canary").unwrap_or(0),
        baseline_weight(rules, "web-stable", "web-canary").unwrap_or(0),
    )
}

fn endpoints(s: &Sim, service: &str) -> i32 {
    let found = s.traffic.services.iter().find(|x| x.name == service);
    found.map_or(0, |x| x.ready_endpoints)
}

/// Runs until `done`, checking at every tick that each Service the route gives requests to has
/// ready pods, and that the baseline's pods outlive their last share by the settle time.
fn run_checked(s: &mut Sim, what: &str, done: impl Fn(&Sim) -> bool) {
    run_gateway(s, what, false, done)
}

/// [`run_checked`], with a gateway that accepts each route change a tick after it is written
/// (`slow`).
fn run_gateway(s: &mut Sim, what: &str, slow: bool, done: impl Fn(&Sim) -> bool) {
    let mut last_share = None;
    for _ in 0..300 {
        if done(s) {
            return;
        }
        // The routes as the gateway has them until this plan's writes.
        if split(s).1 > 0 {
            last_share = Some(s.now);
        }
        let before = s.traffic.routes[0].generation;
        s.reconcile();
        let (canary, baseline) = split(s);
        if !s.deployments.contains_key("web-baseline")
            && let Some(at) = last_share
        {
            let gone_after = s.now.duration_since(at).as_secs();
            assert!(
                gone_after >= SETTLE,
                "the baseline went {gone_after}s after its last share"
            );
            last_share = None;
        }
        let written = s.traffic.routes[0].generation;
        s.tick();
        if slow && written > before {
            s.traffic.routes[0].accepted_generation = Some(before);
        }
        for (service, share) in [("web-canary", canary), ("web-baseline", baseline)] {
            if share > 0 {
                assert!(
                    endpoints(s, service) > 0,
                    "{share}% to {service} without a ready pod"
                );
            }
        }
        if canary + baseline < 100 {
            assert!(
                endpoints(s, "web-stable") > 0,
                "stable's share without a ready pod"
            );
        }
    }
    panic!(
        "never reached {what}: {:?} {:?}",
        s.status.phase, s.status.message
    );
}

#[test]
fn the_baseline_gets_the_canarys_share_and_goes_after_the_last_batch() {
    let mut s = routed_baseline();
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Paused after batch 1", |s| {
        s.phase() == Some(Phase::Paused) && split(s) == (30, 30)
    });
    let refs = s.traffic.routes[0].rules[0]["backendRefs"].clone();
    let weights: Vec<(String, i64)> = refs
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["weight"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        weights,
        [
            ("web-stable".into(), 40),
            ("web-canary".into(), 30),
            ("web-baseline".into(), 30)
        ]
    );
    assert_eq!(
        s.service_selectors["web-baseline"][VERSION_LABEL],
        crate::plan::deployment::BASELINE_VERSION
    );
    s.spec.current_batch = 2;
    run_checked(&mut s, "Completed", |s| s.phase() == Some(Phase::Completed));
    run_checked(&mut s, "the baseline gone", |s| {
        !s.deployments.contains_key("web-baseline")
    });
    run_checked(&mut s, "the routes without the baseline", |s| {
        !s.traffic.routes[0]
            .rules
            .to_string()
            .contains("web-baseline")
    });
    assert_eq!(split(&s), (0, 0));
}

#[test]
fn an_abort_takes_the_baseline_s_share_back_before_its_pods_go() {
    let mut s = routed_baseline();
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Paused after batch 1", |s| {
        s.phase() == Some(Phase::Paused) && split(s) == (30, 30)
    });
    s.abort = Some("true".into());
    run_checked(&mut s, "RolledBack", |s| {
        s.phase() == Some(Phase::RolledBack)
    });
    run_checked(&mut s, "the baseline gone", |s| {
        !s.deployments.contains_key("web-baseline")
    });
    assert_eq!(split(&s), (0, 0));
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
}

/// A rollout paused after batch 1 (30 % to the canary and to the baseline) for 20 s more,
/// longer than the settle time: the routes' last change is old.
fn paused_long_at_batch_1() -> Sim {
    let mut s = routed_baseline();
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Paused after batch 1", |s| {
        s.phase() == Some(Phase::Paused) && split(s) == (30, 30)
    });
    for _ in 0..20 {
        s.reconcile();
        s.tick();
    }
    s
}

/// Found by review: an abort long after the last route change, and a gateway slow to accept
/// the change, deleted the baseline as the routes took its share away.
#[test]
fn an_abort_long_after_the_pause_still_gives_the_gateway_its_settle_time() {
    for slow in [false, true] {
        let mut s = paused_long_at_batch_1();
        s.abort = Some("true".into());
        run_gateway(&mut s, "the baseline gone", slow, |s| {
            !s.deployments.contains_key("web-baseline")
        });
        assert_eq!(split(&s), (0, 0));
    }
}

/// Found by review: Git turning the baseline off mid-rollout takes only its share away (the
/// canary's stays); its pods still wait for the settle time.
#[test]
fn a_baseline_turned_off_mid_rollout_waits_for_the_settle_time_too() {
    for slow in [false, true] {
        let mut s = paused_long_at_batch_1();
        s.spec.strategy.baseline = false;
        run_gateway(&mut s, "the baseline gone", slow, |s| {
            !s.deployments.contains_key("web-baseline")
        });
        assert_eq!(split(&s), (30, 0), "the canary keeps its share");
        assert_eq!(s.phase(), Some(Phase::Paused));
    }
}
