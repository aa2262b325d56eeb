use super::*;
use crate::api::{CookieMatch, GatewayApiRouting, HeaderMatch, HeaderRoute};
use serde_json::json;

fn routing(weights: Option<Vec<i32>>) -> TrafficRouting {
    TrafficRouting {
        gateway_api: GatewayApiRouting {
            http_routes: vec!["web".into()],
            grpc_routes: Vec::new(),
            port: 8080,
        },
        weights,
        header_route: Some(HeaderRoute {
            headers: vec![HeaderMatch {
                name: "x-canary".into(),
                value: "yes".into(),
            }],
            query_params: Vec::new(),
            cookie: None,
        }),
        settle_seconds: 10,
    }
}

fn rollout() -> RolloutRef {
    RolloutRef {
        name: "shop".into(),
        namespace: "demo".into(),
        uid: "u1".into(),
        source: None,
    }
}

/// A route as the API server returns it: defaults filled in.
fn user_rules() -> Value {
    json!([{
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [{"group": "", "kind": "Service", "name": "shop-stable", "port": 8080, "weight": 1}]
    }])
}

fn sides() -> Sides {
    Sides {
        stable: BTreeMap::from([("v".into(), "1".into())]),
        canary: BTreeMap::from([("v".into(), "2".into())]),
        baseline: None,
        baseline_service: false,
    }
}

/// The view after linnet's Services are applied, with `ready` endpoints each.
fn view(rules: Value, stable: i32, canary: i32, accepted: Option<i64>) -> TrafficView {
    let r = rollout();
    let svc = |name: &str, sel: &BTreeMap<String, String>, ready| {
        let s = service(&r, "CanaryStatefulSet", name, (8080, None), sel);
        ServiceView {
            name: name.into(),
            applied_hash: applied(&s).cloned(),
            ready_endpoints: ready,
            ..ServiceView::default()
        }
    };
    TrafficView {
        services: vec![
            svc("shop-stable", &sides().stable, stable),
            svc("shop-canary", &sides().canary, canary),
        ],
        routes: vec![RouteView {
            kind: RouteKind::Http,
            name: "web".into(),
            rules,
            generation: 3,
            accepted_generation: accepted,
            resource_version: Some("17".into()),
        }],
    }
}

fn want(weight: i32, header: bool, canary_endpoints: i32) -> Want {
    Want {
        weight,
        header,
        canary_endpoints,
        settle: false,
    }
}

fn now() -> Timestamp {
    "2026-11-27T10:00:00Z".parse().unwrap()
}

/// A step whose routes have been as observed for long.
fn settled_step(r: &TrafficRouting, want: Want, v: &TrafficView) -> TrafficStep {
    let first = v.routes.first();
    let recorded = Recorded {
        weight: first.and_then(|r| current_weight(&r.rules, "shop-stable", "shop-canary")),
        header: first.is_some_and(|r| has_header_rule(&r.rules, "shop-canary")),
        baseline: None,
        since: Some("2026-11-27T09:00:00Z".parse().unwrap()),
    };
    traffic_step(
        &rollout(),
        "CanaryStatefulSet",
        r,
        &sides(),
        want,
        v,
        recorded,
        now(),
    )
}

#[test]
fn a_weight_puts_the_canary_beside_the_stable_service() {
    let rules = route_rules(
        &user_rules(),
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        10,
        None,
    )
    .unwrap();
    let refs = rules[0]["backendRefs"].as_array().unwrap();
    assert_eq!(refs.len(), 2);
    assert_eq!(refs[0]["name"], "shop-stable");
    assert_eq!(refs[0]["weight"], 90);
    assert_eq!(refs[1]["name"], "shop-canary");
    assert_eq!(refs[1]["weight"], 10);
    assert_eq!(
        current_weight(&rules, "shop-stable", "shop-canary"),
        Some(10)
    );
    // The user's route alone: all to stable.
    assert_eq!(
        current_weight(&user_rules(), "shop-stable", "shop-canary"),
        Some(0)
    );
}

#[test]
fn rewriting_is_a_fixpoint_and_header_rules_come_and_go() {
    let h = routing(None).header_route;
    let once = route_rules(
        &user_rules(),
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        25,
        h.as_ref(),
    )
    .unwrap();
    assert_eq!(
        once.as_array().unwrap().len(),
        2,
        "a header rule before the weighed one"
    );
    let header_rule = &once[0];
    assert_eq!(header_rule["backendRefs"].as_array().unwrap().len(), 1);
    assert_eq!(header_rule["backendRefs"][0]["name"], "shop-canary");
    assert_eq!(header_rule["matches"][0]["headers"][0]["name"], "x-canary");
    assert_eq!(header_rule["matches"][0]["path"]["value"], "/");
    let twice = route_rules(
        &once,
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        25,
        h.as_ref(),
    )
    .unwrap();
    assert_eq!(once, twice);
    // Without the header route, linnet's header rule goes.
    let back = route_rules(
        &once,
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        0,
        None,
    )
    .unwrap();
    assert_eq!(back.as_array().unwrap().len(), 1);
    assert_eq!(current_weight(&back, "shop-stable", "shop-canary"), Some(0));
}

#[test]
fn other_rules_are_kept_and_mixed_backends_refused() {
    let mut rules = user_rules();
    rules.as_array_mut().unwrap().push(json!({
        "matches": [{"path": {"type": "PathPrefix", "value": "/static"}}],
        "backendRefs": [{"name": "cdn", "port": 80}]
    }));
    let out = route_rules(
        &rules,
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        50,
        None,
    )
    .unwrap();
    assert_eq!(out[1], rules[1]);
    let mixed = json!([{"backendRefs": [{"name": "shop-stable"}, {"name": "legacy"}]}]);
    let err = route_rules(
        &mixed,
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        50,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("legacy"), "{err}");
    let none = json!([{"backendRefs": [{"name": "other"}]}]);
    let err = route_rules(
        &none,
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        50,
        None,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("point a backendRef at it"),
        "{err}"
    );
}

#[test]
fn services_are_applied_first_and_traffic_waits_for_endpoints() {
    let r = routing(Some(vec![10]));
    let empty = TrafficView::default();
    let step = settled_step(&r, Want::stable(), &empty);
    assert_eq!(
        step.actions
            .iter()
            .filter(|a| matches!(a, Action::ApplyService(_)))
            .count(),
        2
    );
    assert!(step.waiting.unwrap().contains("shop-stable"));
    // The canary has 1 of the 2 endpoints the step needs: the route is not touched.
    let v = view(user_rules(), 3, 1, Some(3));
    let step = settled_step(&r, want(10, false, 2), &v);
    assert!(step.actions.is_empty());
    assert!(step.waiting.unwrap().contains("shop-canary"));
    // Both ready: the route moves, guarded by its resourceVersion.
    let v = view(user_rules(), 3, 2, Some(3));
    let step = settled_step(&r, want(10, false, 2), &v);
    match &step.actions[..] {
        [
            Action::UpdateRoute {
                name,
                resource_version,
                ..
            },
        ] => {
            assert_eq!(name, "web");
            assert_eq!(resource_version.as_deref(), Some("17"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(step.now.weight, Some(0), "the route as observed");
}

#[test]
fn a_route_at_the_weight_waits_for_the_gateway_to_accept_it() {
    let r = routing(None);
    let rules = route_rules(
        &user_rules(),
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        10,
        None,
    )
    .unwrap();
    let v = view(rules.clone(), 3, 1, Some(2));
    let step = settled_step(&r, want(10, false, 1), &v);
    assert!(step.actions.is_empty());
    assert!(step.waiting.unwrap().contains("accept"));
    let v = view(rules, 3, 1, Some(3));
    let step = settled_step(&r, want(10, false, 1), &v);
    assert_eq!(step.waiting, None);
    assert_eq!(step.now.weight, Some(10));
}

#[test]
fn all_to_the_canary_needs_no_stable_endpoint_and_a_missing_route_is_named() {
    let r = routing(None);
    let v = view(user_rules(), 0, 3, Some(3));
    let step = settled_step(&r, want(100, false, 3), &v);
    assert_eq!(step.actions.len(), 1);
    let mut v = view(user_rules(), 3, 3, Some(3));
    v.routes.clear();
    let step = settled_step(&r, Want::stable(), &v);
    assert!(
        step.waiting
            .unwrap()
            .contains("HTTPRoute web not found in namespace demo")
    );
}

#[test]
fn weights_default_to_the_replica_share() {
    assert_eq!(step_weight(&routing(Some(vec![5, 40])), 1, 1, 10), 40);
    assert_eq!(step_weight(&routing(None), 0, 1, 10), 10);
    assert_eq!(step_weight(&routing(None), 0, 1, 3), 33);
    assert_eq!(step_weight(&routing(None), 0, 2, 3), 67);
    assert_eq!(step_weight(&routing(None), 0, 1, 0), 0);
}

#[test]
fn pods_losing_traffic_wait_for_the_settle_time_from_the_change_seen() {
    let r = routing(None);
    let rules = route_rules(
        &user_rules(),
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        0,
        None,
    )
    .unwrap();
    let v = view(rules, 3, 1, Some(3));
    let settle = Want {
        settle: true,
        ..Want::stable()
    };
    // The routes were at 20 % when last recorded: the change is seen now, 10 s to wait.
    let recorded = Recorded {
        weight: Some(20),
        header: false,
        baseline: None,
        since: Some("2026-11-27T09:00:00Z".parse().unwrap()),
    };
    let s = traffic_step(
        &rollout(),
        "CanaryStatefulSet",
        &r,
        &sides(),
        settle,
        &v,
        recorded,
        now(),
    );
    assert!(s.waiting.unwrap().contains("letting the gateway apply"));
    assert_eq!(s.recheck_after, Some(std::time::Duration::from_secs(10)));
    assert_eq!(s.now.since, Some(now()));
    // 4 s later, 6 s left; 10 s later, done.
    let later = |secs| {
        now()
            .checked_add(jiff::SignedDuration::from_secs(secs))
            .unwrap()
    };
    let s2 = traffic_step(
        &rollout(),
        "CanaryStatefulSet",
        &r,
        &sides(),
        settle,
        &v,
        s.now,
        later(4),
    );
    assert_eq!(s2.recheck_after, Some(std::time::Duration::from_secs(6)));
    let s3 = traffic_step(
        &rollout(),
        "CanaryStatefulSet",
        &r,
        &sides(),
        settle,
        &v,
        s.now,
        later(10),
    );
    assert_eq!(s3.waiting, None);
    // A move towards the canary does not wait.
    let no_settle = settled_step(&r, want(0, false, 1), &v);
    assert_eq!(no_settle.waiting, None);
}

/// Review of issue 49: a canary whose pods all went away kept its share of the requests.
#[test]
fn a_canary_with_no_ready_endpoint_gives_its_traffic_back_to_stable() {
    let r = routing(Some(vec![30]));
    let at_30 = route_rules(
        &user_rules(),
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        30,
        None,
    )
    .unwrap();
    let v = view(at_30.clone(), 3, 0, Some(3));
    let s = settled_step(&r, want(30, true, 1), &v);
    match &s.actions[..] {
        [Action::UpdateRoute { rules, .. }] => {
            assert_eq!(current_weight(rules, "shop-stable", "shop-canary"), Some(0));
            assert!(!has_header_rule(rules, "shop-canary"));
        }
        other => panic!("{other:?}"),
    }
    assert!(s.waiting.unwrap().contains("shop-canary"));
    // One of two ready: the share stays where it is until the second is.
    let v = view(at_30, 3, 1, Some(3));
    let s = settled_step(&r, want(50, true, 2), &v);
    assert!(s.actions.is_empty(), "{:?}", s.actions);
}

/// Review of issue 49: the settle time counted from the change seen, not from its acceptance.
#[test]
fn the_settle_time_counts_from_the_gateways_acceptance() {
    let r = routing(None);
    let rules = route_rules(
        &user_rules(),
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        0,
        None,
    )
    .unwrap();
    let settle = Want {
        settle: true,
        ..Want::stable()
    };
    let recorded = Recorded {
        weight: Some(20),
        header: false,
        baseline: None,
        since: Some("2026-11-27T09:00:00Z".parse().unwrap()),
    };
    // Written, not accepted yet: no start.
    let pending = view(rules.clone(), 3, 1, Some(2));
    let s = traffic_step(
        &rollout(),
        "CanaryStatefulSet",
        &r,
        &sides(),
        settle,
        &pending,
        recorded,
        now(),
    );
    assert_eq!(s.now.since, None);
    assert!(s.waiting.unwrap().contains("accept"));
    // Accepted 30 s later: the 10 s start then.
    let later = now()
        .checked_add(jiff::SignedDuration::from_secs(30))
        .unwrap();
    let accepted = view(rules, 3, 1, Some(3));
    let s2 = traffic_step(
        &rollout(),
        "CanaryStatefulSet",
        &r,
        &sides(),
        settle,
        &accepted,
        s.now,
        later,
    );
    assert_eq!(s2.now.since, Some(later));
    assert_eq!(s2.recheck_after, Some(std::time::Duration::from_secs(10)));
}

#[test]
fn a_header_rule_does_not_copy_the_rules_name() {
    let mut rules = user_rules();
    rules[0]["name"] = json!("main");
    let h = routing(None).header_route;
    let out = route_rules(
        &rules,
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        10,
        h.as_ref(),
    )
    .unwrap();
    assert_eq!(out[0].get("name"), None, "the header rule");
    assert_eq!(out[1]["name"], "main");
}

#[test]
fn a_canary_route_matches_query_parameters_and_a_cookie_beside_the_headers() {
    let mut h = routing(None).header_route.unwrap();
    h.query_params = vec![HeaderMatch {
        name: "beta".into(),
        value: "on".into(),
    }];
    h.cookie = Some(CookieMatch {
        name: "tier".into(),
        value: "gold.1".into(),
    });
    let mut rules = user_rules();
    rules[0]["matches"] = json!([{"path": {"type": "PathPrefix", "value": "/api"},
        "queryParams": [{"type": "Exact", "name": "v", "value": "2"}]}]);
    let out = route_rules(
        &rules,
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        10,
        Some(&h),
    )
    .unwrap();
    let m = &out[0]["matches"][0];
    assert_eq!(m["path"]["value"], "/api", "{m}");
    assert_eq!(
        m["queryParams"],
        json!([{"type": "Exact", "name": "v", "value": "2"},
               {"type": "Exact", "name": "beta", "value": "on"}])
    );
    assert_eq!(
        m["headers"],
        json!([{"type": "Exact", "name": "x-canary", "value": "yes"},
               {"type": "RegularExpression", "name": "Cookie",
                "value": "^(.*;[ ]*)?tier=gold\\.1(;.*)?$"}])
    );
    assert_eq!(out[0]["backendRefs"][0]["name"], "shop-canary");
    // Without headers, no empty `headers` list is written.
    h.headers.clear();
    h.cookie = None;
    let out = route_rules(
        &user_rules(),
        RouteKind::Http,
        ("shop-stable", "shop-canary"),
        8080,
        10,
        Some(&h),
    )
    .unwrap();
    assert!(out[0]["matches"][0].get("headers").is_none(), "{}", out[0]);
}

#[test]
fn the_cookie_pattern_matches_the_cookie_among_others_and_nothing_like_it() {
    let pattern = regex::Regex::new(&crate::api::cookie_pattern("tier", "gold.1")).unwrap();
    for yes in [
        "tier=gold.1",
        "a=b; tier=gold.1",
        "tier=gold.1; a=b",
        "a=b;tier=gold.1;c=d",
    ] {
        assert!(pattern.is_match(yes), "{yes}");
    }
    for no in [
        "tier=goldx1",
        "xtier=gold.1",
        "tier=gold.12",
        "a=tier=gold.1",
        "tier=gold",
    ] {
        assert!(!pattern.is_match(no), "{no}");
    }
}

/// GRPCRoutes (issue 75).
mod grpc;

/// The baseline's Service (issue 75).
mod baseline;
