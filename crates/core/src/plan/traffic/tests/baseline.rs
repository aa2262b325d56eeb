//! A CanaryDeployment's baseline Service as a third backend; for a kind without one, a
//! `<name>-baseline` backend is someone else's.

use super::*;

#[test]
fn a_baseline_takes_its_share_from_the_stable_service_and_is_counted_in_the_weights() {
    let sides = ("shop-stable", "shop-canary");
    let split = Split {
        canary: 30,
        baseline: Some(Some(30)),
    };
    let out = weighed_rules(&user_rules(), RouteKind::Http, sides, 8080, split, None).unwrap();
    let weights: Vec<(&str, i64)> = out[0]["backendRefs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["name"].as_str().unwrap(), b["weight"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        weights,
        [
            ("shop-stable", 40),
            ("shop-canary", 30),
            ("shop-baseline", 30)
        ]
    );
    assert_eq!(current_weight(&out, sides.0, sides.1), Some(30));
    assert_eq!(baseline_weight(&out, sides.0, sides.1), Some(30));
    // Left out again (the rollout ended), the baseline backend goes and stable takes it all.
    let split = Split {
        canary: 0,
        baseline: Some(None),
    };
    let back = weighed_rules(&out, RouteKind::Http, sides, 8080, split, None).unwrap();
    assert!(!back.to_string().contains("shop-baseline"), "{back}");
    assert_eq!(current_weight(&back, sides.0, sides.1), Some(0));
}

/// Found by review: every rollout took a `<name>-baseline` backend for its own.
#[test]
fn a_baseline_backend_is_someone_elses_for_a_kind_without_one() {
    let mut rules = user_rules();
    rules[0]["backendRefs"]
        .as_array_mut()
        .unwrap()
        .push(json!({"group": "", "kind": "Service", "name": "shop-baseline", "port": 8080}));
    let sides = ("shop-stable", "shop-canary");
    let err = route_rules(&rules, RouteKind::Http, sides, 8080, 10, None).unwrap_err();
    assert!(err.to_string().contains("shop-baseline"), "{err}");
}
