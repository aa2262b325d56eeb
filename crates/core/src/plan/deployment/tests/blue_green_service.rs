//! Blue-green without a gateway (`blueGreen.activeService`): the user's Service switched by
//! its selector's version label. Every tick, the active Service selects a version with ready
//! pods, and never two versions once switched.

use super::*;
use crate::plan::traffic::ServiceView;

fn service_blue_green(pause: PauseMode) -> Sim {
    let mut s = Sim::new(Strategy::BlueGreen, 1, pause);
    s.spec.strategy.blue_green = Some(crate::api::BlueGreen {
        active_service: Some("web".into()),
        preview_service: Some("web-preview".into()),
        ..crate::api::BlueGreen::default()
    });
    for name in ["web", "web-preview"] {
        user_service(&mut s, name, &[("app", "web")]);
    }
    s.completed_on("web:1");
    s
}

/// A Service of the user's, selecting `selector`.
fn user_service(s: &mut Sim, name: &str, selector: &[(&str, &str)]) {
    let selector: BTreeMap<String, String> = selector
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    s.traffic.services.retain(|x| x.name != name);
    s.traffic.services.push(ServiceView {
        name: name.into(),
        selector: Some(selector.clone()),
        ..ServiceView::default()
    });
    s.service_selectors.insert(name.into(), selector);
}

fn message(s: &Sim) -> String {
    s.status.message.clone().unwrap_or_default()
}

/// The image of the version the Service `name` selects.
fn selects(s: &Sim, name: &str) -> Option<String> {
    let v = s.service_selectors[name].get(VERSION_LABEL)?;
    s.deployments.get(&format!("web-{v}"))?.image.clone()
}

fn active_endpoints(s: &Sim) -> i32 {
    let svc = s.traffic.services.iter().find(|x| x.name == "web").unwrap();
    svc.ready_endpoints
}

fn run_checked(s: &mut Sim, what: &str, done: impl Fn(&Sim) -> bool) {
    for _ in 0..300 {
        if done(s) {
            return;
        }
        s.reconcile();
        s.tick();
        assert!(
            active_endpoints(s) > 0,
            "the active Service has no ready endpoint: {:?} {:?}",
            s.status.phase,
            s.by_image()
        );
    }
    panic!(
        "never reached {what}: {:?} {:?}",
        s.status.phase, s.status.message
    );
}

#[test]
fn the_active_service_selects_the_old_version_until_the_switch_then_the_new_one() {
    let mut s = service_blue_green(PauseMode::First);
    assert_eq!(selects(&s, "web").as_deref(), Some("web:1"));
    assert_eq!(s.status.switched_services, vec!["web", "web-preview"]);
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Paused", |s| s.phase() == Some(Phase::Paused));
    assert_eq!(selects(&s, "web").as_deref(), Some("web:1"));
    assert_eq!(selects(&s, "web-preview").as_deref(), Some("web:2"));
    assert_eq!(
        s.by_image(),
        BTreeMap::from([("web:1".into(), 4), ("web:2".into(), 4)])
    );
    s.spec.current_batch = 2;
    run_checked(&mut s, "the switch", |s| {
        selects(s, "web").as_deref() == Some("web:2")
    });
    let switched_at = s.now;
    assert_eq!(
        s.by_image()["web:1"],
        4,
        "the old version whole at the switch"
    );
    run_checked(&mut s, "Completed", |s| s.phase() == Some(Phase::Completed));
    let waited = s.now.duration_since(switched_at).as_secs();
    assert!(
        waited >= 30,
        "the old version stopped {waited}s after the switch"
    );
    assert_eq!(s.by_image(), BTreeMap::from([("web:2".into(), 4)]));
    assert_eq!(selects(&s, "web").as_deref(), Some("web:2"));
    assert_eq!(
        s.status.canary_weight,
        Some(0),
        "the new version is the stable one"
    );
}

#[test]
fn an_abort_after_the_switch_points_the_service_back_without_starting_a_pod() {
    let mut s = service_blue_green(PauseMode::Never);
    s.spec.image = "web:2".into();
    run_checked(&mut s, "the switch", |s| {
        s.status.canary_weight == Some(100)
    });
    s.abort = Some("true".into());
    s.reconcile();
    s.tick();
    assert_eq!(s.phase(), Some(Phase::RollingBack));
    assert_eq!(
        selects(&s, "web").as_deref(),
        Some("web:1"),
        "switched back at once"
    );
    assert_eq!(s.max_asked.values().copied().max(), Some(4));
    run_checked(&mut s, "RolledBack", |s| {
        s.phase() == Some(Phase::RolledBack)
    });
    assert_eq!(s.by_image(), BTreeMap::from([("web:1".into(), 4)]));
    assert_eq!(selects(&s, "web").as_deref(), Some("web:1"));
}

#[test]
fn a_missing_active_service_holds_the_preview_and_says_what_to_create() {
    let mut s = service_blue_green(PauseMode::Never);
    s.traffic.services.retain(|x| x.name != "web");
    s.spec.image = "web:2".into();
    for _ in 0..20 {
        s.reconcile();
        s.tick();
    }
    let message = s.status.message.clone().unwrap_or_default();
    assert!(
        message.contains("Service web (strategy.blueGreen) not found in namespace ns"),
        "{message}"
    );
    assert_eq!(s.phase(), Some(Phase::Progressing));
    assert_eq!(s.by_image()["web:1"], 4);
}

/// New pods that all stop being ready after the switch: the Service goes back to the old
/// version, whole, rather than select no ready pod.
#[test]
fn new_pods_that_all_fail_after_the_switch_send_the_service_back() {
    let mut s = service_blue_green(PauseMode::Never);
    s.spec
        .strategy
        .blue_green
        .as_mut()
        .unwrap()
        .scale_down_delay_seconds = 600;
    s.spec.image = "web:2".into();
    run_checked(&mut s, "the switch", |s| {
        s.status.canary_weight == Some(100)
    });
    s.reconcile();
    s.tick();
    for d in s.deployments.values_mut() {
        if d.image.as_deref() == Some("web:2") {
            d.available = 0;
        }
    }
    s.reconcile();
    assert_eq!(selects(&s, "web").as_deref(), Some("web:1"));
}

/// A Service no longer named (the strategy changed) gets its selector back, so that it does
/// not keep selecting one version whose pods go.
#[test]
fn a_service_no_longer_named_gets_its_selector_back() {
    let mut s = service_blue_green(PauseMode::Never);
    assert!(selects(&s, "web").is_some());
    s.spec.strategy.type_ = Strategy::Batches;
    s.spec.strategy.blue_green = None;
    s.reconcile();
    s.tick();
    assert_eq!(s.service_selectors["web"].get(VERSION_LABEL), None);
    assert_eq!(s.service_selectors["web-preview"].get(VERSION_LABEL), None);
    s.reconcile();
    assert_eq!(s.status.switched_services, Vec::<String>::new());
    let p = s.plan();
    assert!(!p.actions.iter().any(|a| a.is_traffic()), "{:?}", p.actions);
}

/// Restart-safe: a plan made again from the status and the cluster takes no step back.
#[test]
fn a_replanned_switch_keeps_the_service_where_it_is() {
    let mut s = service_blue_green(PauseMode::Never);
    s.spec.image = "web:2".into();
    run_checked(&mut s, "the switch", |s| {
        s.status.canary_weight == Some(100)
    });
    let again = s.plan();
    assert!(
        !again.actions.iter().any(|a| a.is_traffic()),
        "{:?}",
        again.actions
    );
}

/// Found by review: a rollout that was Rolling has one Deployment of no version; turned
/// blue-green, the Service was pointed at version "none" and selected no pod. It keeps its
/// own selector until a version has ready pods, then the next rollout switches it.
#[test]
fn a_rollout_that_was_rolling_keeps_the_services_own_selector_until_a_version_runs() {
    let mut s = Sim::new(Strategy::Rolling, 1, PauseMode::Never);
    user_service(&mut s, "web", &[("app", "web")]);
    s.completed_on("web:1");
    s.spec.strategy.type_ = Strategy::BlueGreen;
    s.spec.strategy.blue_green = Some(crate::api::BlueGreen {
        active_service: Some("web".into()),
        ..crate::api::BlueGreen::default()
    });
    for _ in 0..5 {
        s.reconcile();
        s.tick();
        assert_eq!(s.service_selectors["web"].get(VERSION_LABEL), None);
        assert!(active_endpoints(&s) > 0);
    }
    s.spec.image = "web:2".into();
    run_checked(&mut s, "Completed on web:2", |s| {
        s.phase() == Some(Phase::Completed) && s.status.stable_image.as_deref() == Some("web:2")
    });
    assert_eq!(selects(&s, "web").as_deref(), Some("web:2"));
}

/// Found by review: a Service whose own selector asks for a label the new pods lack would
/// select no pod once switched; it is not switched, and the message says why.
#[test]
fn a_service_selecting_a_label_the_new_pods_lack_is_not_switched() {
    let mut s = service_blue_green(PauseMode::Never);
    let version = s.service_selectors["web"][VERSION_LABEL].clone();
    user_service(
        &mut s,
        "web",
        &[("app", "web"), ("tier", "front"), (VERSION_LABEL, &version)],
    );
    s.traffic.services[1].labelled = true;
    s.traffic.services[1].selector_version = Some(version);
    s.spec.image = "web:2".into();
    for _ in 0..40 {
        s.reconcile();
        s.tick();
        assert_eq!(selects(&s, "web").as_deref(), Some("web:1"));
    }
    assert!(
        message(&s).contains("Service web selects tier=front as well, which version"),
        "{}",
        message(&s)
    );
}

/// Found by review: nothing woke a rollout waiting for a Service that was not there yet.
#[test]
fn a_missing_service_is_looked_for_again() {
    let mut s = service_blue_green(PauseMode::Never);
    s.traffic.services.retain(|x| x.name != "web");
    s.spec.image = "web:2".into();
    for _ in 0..10 {
        s.reconcile();
        s.tick();
    }
    let p = s.plan();
    assert!(
        p.requeue_after
            .is_some_and(|r| r <= Duration::from_secs(31)),
        "{:?}",
        p.requeue_after
    );
}

/// Found by review: turning to traffic routing left the Service pinned to a version whose pods
/// would go.
#[test]
fn a_rollout_turned_to_traffic_routing_hands_its_service_back() {
    let mut s = service_blue_green(PauseMode::Never);
    s.spec.strategy.blue_green = Some(crate::api::BlueGreen::default());
    s.spec.traffic_routing = Some(Box::new(
        serde_json::from_value(serde_json::json!({
            "gatewayAPI": {"httpRoutes": ["web"], "port": 8080},
        }))
        .unwrap(),
    ));
    s.reconcile();
    s.tick();
    assert_eq!(s.service_selectors["web"].get(VERSION_LABEL), None);
    s.reconcile();
    assert_eq!(s.status.switched_services, Vec::<String>::new());
}

/// Found by review: a rollback whose spec dropped the `blueGreen` block (only the type is
/// needed) handed the Service back mid-rollback, and it selected both versions.
#[test]
fn a_rollback_without_the_block_still_points_the_service_back() {
    let mut s = service_blue_green(PauseMode::Never);
    s.spec.image = "web:2".into();
    s.spec
        .strategy
        .blue_green
        .as_mut()
        .unwrap()
        .scale_down_delay_seconds = 600;
    run_checked(&mut s, "the switch", |s| {
        s.status.canary_weight == Some(100)
    });
    s.spec.strategy.type_ = Strategy::Rollback;
    s.spec.strategy.blue_green = None;
    run_checked(&mut s, "RolledBack", |s| {
        s.phase() == Some(Phase::RolledBack)
    });
    assert_eq!(selects(&s, "web").as_deref(), Some("web:1"));
}
