//! GRPCRoutes: weighed like HTTPRoutes, their canary route of headers alone.

use super::*;

/// A GRPCRoute as the API server returns it: one rule for a service's methods.
fn grpc_rules() -> Value {
    json!([{
        "matches": [{"method": {"type": "Exact", "service": "linnet.kv.Kv"}}],
        "backendRefs": [{"group": "", "kind": "Service", "name": "shop-stable", "port": 9090, "weight": 1}]
    }])
}

#[test]
fn a_grpc_route_is_weighed_and_its_canary_route_keeps_the_method_and_adds_the_headers() {
    let mut h = routing(None).header_route.unwrap();
    h.query_params = vec![HeaderMatch {
        name: "beta".into(),
        value: "on".into(),
    }];
    let sides = ("shop-stable", "shop-canary");
    let out = route_rules(&grpc_rules(), RouteKind::Grpc, sides, 9090, 30, Some(&h)).unwrap();
    assert_eq!(out.as_array().unwrap().len(), 2, "{out}");
    let m = &out[0]["matches"][0];
    assert_eq!(m["method"]["service"], "linnet.kv.Kv", "{m}");
    assert_eq!(
        m["headers"],
        json!([{"type": "Exact", "name": "x-canary", "value": "yes"}])
    );
    // A gRPC request has no query: no queryParams in a GRPCRoute match.
    assert!(m.get("queryParams").is_none(), "{m}");
    assert_eq!(
        out[0]["backendRefs"],
        json!([{"group": "", "kind": "Service",
        "name": "shop-canary", "port": 9090, "weight": 1}])
    );
    assert_eq!(current_weight(&out, sides.0, sides.1), Some(30));
    assert!(has_header_rule(&out, sides.1));
    // Rewriting is stable, and without the header route its rule goes.
    let again = route_rules(&out, RouteKind::Grpc, sides, 9090, 30, Some(&h)).unwrap();
    assert_eq!(again, out);
    let back = route_rules(&out, RouteKind::Grpc, sides, 9090, 0, None).unwrap();
    assert_eq!(back.as_array().unwrap().len(), 1, "{back}");
}

#[test]
fn a_grpc_rule_without_matches_gets_a_canary_route_of_headers_alone() {
    let mut rules = grpc_rules();
    rules[0].as_object_mut().unwrap().remove("matches");
    let h = routing(None).header_route.unwrap();
    let sides = ("shop-stable", "shop-canary");
    let out = route_rules(&rules, RouteKind::Grpc, sides, 9090, 0, Some(&h)).unwrap();
    // No HTTP path in a GRPCRoute match: the API server would refuse it.
    assert_eq!(
        out[0]["matches"],
        json!([{"headers": [{"type": "Exact", "name": "x-canary", "value": "yes"}]}])
    );
}

#[test]
fn a_header_route_of_query_parameters_alone_adds_no_grpc_rule_that_would_match_everything() {
    let h = HeaderRoute {
        headers: Vec::new(),
        query_params: vec![HeaderMatch {
            name: "beta".into(),
            value: "on".into(),
        }],
        cookie: None,
    };
    let sides = ("shop-stable", "shop-canary");
    let out = route_rules(&grpc_rules(), RouteKind::Grpc, sides, 9090, 10, Some(&h)).unwrap();
    assert_eq!(out.as_array().unwrap().len(), 1, "{out}");
    assert!(!has_header_rule(&out, sides.1));
    // The same header route still makes an HTTPRoute's canary route.
    let http = route_rules(&user_rules(), RouteKind::Http, sides, 8080, 10, Some(&h)).unwrap();
    assert_eq!(http.as_array().unwrap().len(), 2, "{http}");
}

#[test]
fn an_http_and_a_grpc_route_of_the_same_name_move_together_and_each_is_waited_for() {
    let mut r = routing(None);
    r.gateway_api.grpc_routes = vec!["web".into()];
    let mut v = view(user_rules(), 3, 1, Some(3));
    // The Services as applied for GRPCRoutes: their port speaks h2c.
    for (svc, selector) in v.services.iter_mut().zip([sides().stable, sides().canary]) {
        let desired = service(
            &rollout(),
            "CanaryStatefulSet",
            &svc.name,
            (8080, app_protocol(&r)),
            &selector,
        );
        svc.applied_hash = applied(&desired).cloned();
    }
    let step = settled_step(&r, want(10, false, 1), &v);
    // The GRPCRoute is not there yet: the HTTPRoute moves, and the step waits for the other.
    assert_eq!(step.actions.len(), 1, "{:?}", step.actions);
    let waiting = step.waiting.unwrap();
    assert!(waiting.contains("GRPCRoute web not found"), "{waiting}");
    v.routes.push(RouteView {
        kind: RouteKind::Grpc,
        name: "web".into(),
        rules: grpc_rules(),
        generation: 1,
        accepted_generation: Some(1),
        resource_version: Some("20".into()),
    });
    let step = settled_step(&r, want(10, false, 1), &v);
    let kinds: Vec<RouteKind> = step
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::UpdateRoute { kind, name, .. } if name == "web" => Some(*kind),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, [RouteKind::Http, RouteKind::Grpc]);
    // Once both are at the weight and accepted, nothing is left to do.
    let sides = ("shop-stable", "shop-canary");
    v.routes[0].rules =
        route_rules(&v.routes[0].rules, RouteKind::Http, sides, 8080, 10, None).unwrap();
    v.routes[1].rules = route_rules(&grpc_rules(), RouteKind::Grpc, sides, 8080, 10, None).unwrap();
    let step = settled_step(&r, want(10, false, 1), &v);
    assert!(step.actions.is_empty(), "{:?}", step.actions);
    assert_eq!(step.waiting, None);
    // A GRPCRoute its gateway has not accepted yet holds the step.
    v.routes[1].generation = 2;
    let step = settled_step(&r, want(10, false, 1), &v);
    let waiting = step.waiting.unwrap();
    assert!(
        waiting.contains("waiting for the gateway to accept GRPCRoute web (generation 2)"),
        "{waiting}"
    );
}

#[test]
fn services_behind_grpc_routes_say_their_port_speaks_cleartext_http2() {
    let mut r = routing(None);
    let protocol = |r: &TrafficRouting| {
        let step = settled_step(r, want(0, false, 0), &TrafficView::default());
        step.actions
            .iter()
            .filter_map(|a| match a {
                Action::ApplyService(s) => Some(
                    s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
                        .app_protocol
                        .clone(),
                ),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(protocol(&r), [None, None]);
    r.gateway_api.grpc_routes = vec!["web".into()];
    let h2c = Some("kubernetes.io/h2c".to_string());
    assert_eq!(protocol(&r), [h2c.clone(), h2c]);
}
