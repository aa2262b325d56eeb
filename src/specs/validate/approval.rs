//! Per kind, strategy and phase: whether the rollout waits for a person, and that the change
//! the page suggests is one the CRD accepts and the planner acts on.

use serde_json::{Value, json};

use super::crd_errors;
use crate::api::{ABORT_ANNOTATION, CanaryDeployment, CanaryStatefulSet, PROMOTE_ANNOTATION};
use crate::plan::approval::{Approval, deployment_approval, statefulset_approval};
use crate::plan::deployment::batch_allowed;
use crate::plan::{WAITING_FOR_PROMOTION, annotation_acts};

const TEMPLATE: &str = r#"{"selector": {"matchLabels": {"app": "web"}},
    "template": {"metadata": {"labels": {"app": "web"}},
                 "spec": {"containers": [{"name": "web", "image": "web:2"}]}}}"#;

fn deployment(spec: Value, status: Value) -> CanaryDeployment {
    let mut s = json!({"replicas": 4, "image": "web:2", "strategy": {"type": "Batches"},
        "batches": 3, "pause": "All", "currentBatch": 1,
        "template": serde_json::from_str::<Value>(TEMPLATE).unwrap()});
    json_patch::merge(&mut s, &spec);
    serde_json::from_value(json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryDeployment",
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": s, "status": status,
    }))
    .unwrap()
}

fn paused_at(n: i32) -> Value {
    json!({"phase": "Paused", "currentBatch": n, "stableImage": "web:1", "canaryImage": "web:2"})
}

fn statefulset(promotion: &str, status: Value) -> CanaryStatefulSet {
    let mut template: Value = serde_json::from_str(TEMPLATE).unwrap();
    template["serviceName"] = json!("web");
    serde_json::from_value(json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": {"replicas": 3, "canaryReplicas": 1, "image": "web:2",
            "promotion": {"type": promotion}, "template": template},
        "status": status,
    }))
    .unwrap()
}

fn waiting_canary(promote_at_start: Option<&str>) -> Value {
    json!({"phase": "CanaryActive", "stableImage": "web:1", "canaryImage": "web:2",
        "promoteAtStart": promote_at_start,
        "message": format!("canary of web:2 Ready on 1 replica(s); {WAITING_FOR_PROMOTION}: set the annotation")})
}

/// The rollout's file in Git with `approval`'s change made: what the API server would be
/// sent. Panics with the CRD's errors if it would refuse it.
fn approved<K: serde::Serialize + serde::de::DeserializeOwned>(
    kind: &str,
    rollout: &K,
    approval: &Approval,
) -> K {
    let mut file = serde_json::to_value(rollout).unwrap();
    file.as_object_mut().unwrap().remove("status");
    json_patch::merge(&mut file, &approval.change);
    let errors = crd_errors(kind, &file);
    assert!(
        errors.is_empty(),
        "the CRD refuses {}: {errors:?}",
        approval.change
    );
    let mut typed = serde_json::to_value(rollout).unwrap();
    json_patch::merge(&mut typed, &approval.change);
    serde_json::from_value(typed).unwrap()
}

#[test]
fn a_paused_batch_asks_for_the_next_current_batch_which_the_crd_takes_and_the_planner_allows() {
    let r = deployment(json!({}), paused_at(1));
    let a = deployment_approval(&r).expect("waits for batch 2");
    assert_eq!(a.what, "start batch 2 of 3 (2 new replica(s) on web:2)");
    assert!(
        a.how.contains("set spec.currentBatch to 2 in Git"),
        "{}",
        a.how
    );
    assert!(
        !a.how.contains(&format!("{PROMOTE_ANNOTATION}:")),
        "{}",
        a.how
    );
    assert!(!batch_allowed(&r.spec, 2));
    let after = approved("CanaryDeployment", &r, &a);
    assert!(batch_allowed(&after.spec, 2), "the planner starts batch 2");
    // The check is real: a batch past the last is refused.
    let mut file = serde_json::to_value(&r).unwrap();
    file.as_object_mut().unwrap().remove("status");
    file["spec"]["currentBatch"] = json!(4);
    assert!(!crd_errors("CanaryDeployment", &file).is_empty());
    // Batch 2 of 3, then nothing to approve after the last.
    let a = deployment_approval(&deployment(json!({"currentBatch": 2}), paused_at(2))).unwrap();
    assert_eq!(a.change, json!({"spec": {"currentBatch": 3}}));
    assert_eq!(
        deployment_approval(&deployment(json!({"currentBatch": 3}), paused_at(3))),
        None
    );
}

#[test]
fn a_deployment_that_needs_no_person_asks_for_nothing() {
    for (what, spec, status) in [
        (
            "allowed already (an analysis holds it)",
            json!({"currentBatch": 2}),
            paused_at(1),
        ),
        (
            "pause First after batch 2",
            json!({"pause": "First", "currentBatch": 2}),
            paused_at(2),
        ),
        ("pause None", json!({"pause": "None"}), paused_at(1)),
        (
            "progressing",
            json!({}),
            json!({"phase": "Progressing", "currentBatch": 1, "canaryImage": "web:2"}),
        ),
        (
            "completed",
            json!({}),
            json!({"phase": "Completed", "currentBatch": 3, "canaryImage": "web:2"}),
        ),
        (
            "rolled back",
            json!({}),
            json!({"phase": "RolledBack", "currentBatch": 1, "canaryImage": "web:2"}),
        ),
        (
            "rolling",
            json!({"strategy": {"type": "Rolling"}}),
            paused_at(1),
        ),
        ("no status", json!({}), Value::Null),
    ] {
        assert_eq!(
            deployment_approval(&deployment(spec, status)),
            None,
            "{what}"
        );
    }
}

#[test]
fn a_blue_green_preview_asks_for_the_switch_as_current_batch_2() {
    let routing = json!({"gatewayAPI": {"httpRoutes": ["web"], "port": 8080}});
    let r = deployment(
        json!({"strategy": {"type": "BlueGreen"}, "batches": 2, "trafficRouting": routing}),
        paused_at(1),
    );
    let a = deployment_approval(&r).expect("the preview waits for the switch");
    assert!(
        a.what.starts_with("switch every request to web:2"),
        "{}",
        a.what
    );
    assert_eq!(a.change, json!({"spec": {"currentBatch": 2}}));
    let after = approved("CanaryDeployment", &r, &a);
    assert!(batch_allowed(&after.spec, 2));
    // Switched: nothing more to approve.
    let r = deployment(
        json!({"strategy": {"type": "BlueGreen"}, "batches": 2, "trafficRouting": routing, "currentBatch": 2}),
        paused_at(2),
    );
    assert_eq!(deployment_approval(&r), None);
}

#[test]
fn a_statefulset_canary_waiting_for_promotion_asks_for_the_annotation_that_acts_on_it() {
    for (at_start, value) in [(None, "true"), (Some("true"), "web:2")] {
        let r = statefulset("Manual", waiting_canary(at_start));
        let a = statefulset_approval(&r).expect("waits for promotion");
        assert_eq!(
            a.what,
            "promote web:2 to all 3 replicas (the canary's volumes stay with their ordinals)"
        );
        assert_eq!(
            a.how,
            format!("set the annotation {PROMOTE_ANNOTATION}: \"{value}\" in Git")
        );
        let after = approved("CanaryStatefulSet", &r, &a);
        let set = after
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PROMOTE_ANNOTATION));
        assert!(
            annotation_acts(set.map(String::as_str), at_start, "web:2"),
            "the promote value {value} acts on the canary (at start: {at_start:?})"
        );
    }
}

#[test]
fn a_statefulset_that_needs_no_person_asks_for_nothing() {
    let baking = json!({"phase": "CanaryActive", "canaryImage": "web:2",
        "message": "baking: canary Ready for 3s of 60s"});
    for (what, r) in [
        ("promotion Auto", statefulset("Auto", waiting_canary(None))),
        ("baking", statefulset("Manual", baking)),
        (
            "stable",
            statefulset("Manual", json!({"phase": "Stable", "stableImage": "web:2"})),
        ),
        ("no status", statefulset("Manual", Value::Null)),
    ] {
        assert_eq!(statefulset_approval(&r), None, "{what}");
    }
}

#[test]
fn the_abort_named_acts_on_the_canary_for_both_kinds() {
    let mut status = paused_at(1);
    status["abortAtStart"] = json!("true");
    let a = deployment_approval(&deployment(json!({}), status)).unwrap();
    assert_eq!(
        a.abort,
        format!(
            "to stop instead, set the annotation {ABORT_ANNOTATION}: \"web:2\" in Git, or put the image web:1 back"
        )
    );
    let a = statefulset_approval(&statefulset("Manual", waiting_canary(None))).unwrap();
    assert!(
        a.abort.contains(&format!("{ABORT_ANNOTATION}: \"true\"")),
        "{}",
        a.abort
    );
    assert!(annotation_acts(Some("true"), None, "web:2"));
}

/// The file as the dashboard's `action` would leave it: the CRD must take it.
fn acted<K: serde::Serialize>(kind: &str, rollout: &K, change: &Value) -> Value {
    let mut file = serde_json::to_value(rollout).unwrap();
    file.as_object_mut().unwrap().remove("status");
    json_patch::merge(&mut file, change);
    let errors = crd_errors(kind, &file);
    assert!(errors.is_empty(), "the CRD refuses {change}: {errors:?}");
    file
}

#[test]
fn each_dashboard_button_asks_for_a_change_the_crd_takes_and_the_planner_acts_on() {
    use crate::plan::approval::{DashboardAction as A, deployment_action, statefulset_action};
    let paused = deployment(json!({}), paused_at(1));
    let advanced = acted(
        "CanaryDeployment",
        &paused,
        &deployment_action(&paused, A::Advance).unwrap(),
    );
    assert_eq!(advanced["spec"]["currentBatch"], 2);
    let aborted = acted(
        "CanaryDeployment",
        &paused,
        &deployment_action(&paused, A::Abort).unwrap(),
    );
    assert_eq!(aborted["metadata"]["annotations"][ABORT_ANNOTATION], "true");
    let err = deployment_action(&paused, A::Promote).unwrap_err();
    assert!(err.0.contains("advance it instead"), "{err}");

    for at_start in [None, Some("true")] {
        let mut status = waiting_canary(at_start);
        status["abortAtStart"] = json!(at_start);
        let waiting = statefulset("Manual", status);
        let promoted = acted(
            "CanaryStatefulSet",
            &waiting,
            &statefulset_action(&waiting, A::Promote).unwrap(),
        );
        let set = promoted["metadata"]["annotations"][PROMOTE_ANNOTATION].as_str();
        assert!(
            annotation_acts(set, at_start, "web:2"),
            "{at_start:?}: {set:?}"
        );
        let aborted = acted(
            "CanaryStatefulSet",
            &waiting,
            &statefulset_action(&waiting, A::Abort).unwrap(),
        );
        let set = aborted["metadata"]["annotations"][ABORT_ANNOTATION].as_str();
        assert!(
            annotation_acts(set, at_start, "web:2"),
            "{at_start:?}: {set:?}"
        );
        assert!(statefulset_action(&waiting, A::Advance).is_err());
    }
}

#[test]
fn a_dashboard_button_that_does_not_apply_now_says_why() {
    use crate::plan::approval::{DashboardAction as A, deployment_action, statefulset_action};
    let stable = statefulset("Manual", json!({"phase": "Stable", "stableImage": "web:2"}));
    for action in [A::Promote, A::Abort] {
        assert!(statefulset_action(&stable, action).is_err(), "{action:?}");
    }
    let auto = statefulset("Auto", waiting_canary(None));
    assert!(statefulset_action(&auto, A::Promote).is_err());
    let done = deployment(
        json!({}),
        json!({"phase": "Completed", "currentBatch": 3, "stableImage": "web:2"}),
    );
    for action in [A::Advance, A::Abort] {
        assert!(deployment_action(&done, action).is_err(), "{action:?}");
    }
    for name in ["promote", "advance", "abort"] {
        assert_eq!(A::parse(name).map(A::name), Some(name));
    }
    assert_eq!(A::parse("delete"), None);
}
