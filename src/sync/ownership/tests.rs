use serde_json::json;

use super::*;

fn route(managed: Value) -> Value {
    json!({
        "metadata": {"name": "shop", "managedFields": managed},
        "spec": {
            "parentRefs": [{"name": "gw"}],
            "rules": [{"backendRefs": [{"name": "shop-stable", "port": 8080}]}],
        },
    })
}

#[test]
fn the_traffic_writers_fields_are_its_own_and_nobody_elses() {
    let live = route(json!([
        {"manager": "linnet", "operation": "Apply",
         "fieldsV1": {"f:spec": {"f:parentRefs": {}, "f:rules": {}}}},
        {"manager": "linnet-traffic", "operation": "Update",
         "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:rollouts.linnet.dev/traffic-of": {}}},
                      "f:spec": {"f:rules": {}}}},
        {"manager": "kubectl-edit", "operation": "Update",
         "fieldsV1": {"f:spec": {"f:parentRefs": {}}}},
    ]));
    let owned = controller_owned(&live);
    assert_eq!(
        owned,
        vec![
            vec![
                Step::Field("metadata".into()),
                Step::Field("annotations".into()),
                Step::Field("rollouts.linnet.dev/traffic-of".into())
            ],
            vec![Step::Field("spec".into()), Step::Field("rules".into())],
        ]
    );
    let mut git = route(json!(null));
    without(&mut git, &owned);
    assert_eq!(git["spec"], json!({"parentRefs": [{"name": "gw"}]}));
}

#[test]
fn a_status_entry_and_other_managers_own_nothing_here() {
    let live = route(json!([
        {"manager": "linnet-traffic", "operation": "Update", "subresource": "status",
         "fieldsV1": {"f:status": {}}},
        {"manager": "kube-controller-manager", "operation": "Update",
         "fieldsV1": {"f:spec": {"f:rules": {}}}},
    ]));
    assert!(controller_owned(&live).is_empty());
    assert_eq!(controller_entries(&live), None);
}

#[test]
fn a_route_weighed_by_an_older_linnet_has_its_annotation_only() {
    let mut live = route(json!([]));
    live["metadata"]["annotations"] = json!({TRAFFIC_ANNOTATION: "CanaryDeployment/shop"});
    assert_eq!(
        controller_owned(&live),
        vec![vec![
            Step::Field("spec".into()),
            Step::Field("rules".into())
        ]]
    );
}

#[test]
fn list_elements_are_found_by_key_value_and_index() {
    let mut object = json!({"spec": {
        "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}],
        "finalizers": ["one", "two"],
        "ports": [1, 2, 3],
    }});
    let fields = json!({"f:spec": {
        "f:containers": {"k:{\"name\":\"b\"}": {".": {}, "f:image": {}}},
        "f:finalizers": {"v:\"one\"": {}},
        "f:ports": {"i:0": {}},
    }});
    let mut owned = Vec::new();
    leaves(&fields, &mut Vec::new(), &mut owned);
    without(&mut object, &owned);
    assert_eq!(
        object,
        json!({"spec": {
            "containers": [{"name": "a", "image": "x"}, {"name": "b"}],
            "finalizers": ["two"],
            "ports": [2, 3],
        }})
    );
}

#[test]
fn malformed_fields_are_ignored() {
    let live = route(json!([
        {"manager": "linnet-traffic", "fieldsV1": {"x:odd": {}, "k:not json": {}, "f:spec": 3}},
        {"manager": "linnet-traffic", "fieldsV1": "text"},
        "not an entry",
    ]));
    // `f:spec: 3` is a leaf: the spec as a whole.
    assert_eq!(
        controller_owned(&live),
        vec![vec![Step::Field("spec".into())]]
    );
}

/// Blue-green by Service selector: a Git change to the Service applied its selector whole (an
/// atomic map), dropping the rollout's version key, so the Service selected every version.
#[test]
fn a_git_change_to_a_switched_service_keeps_the_rollouts_version_key() {
    let version = crate::api::VERSION_LABEL;
    let live = json!({
        "metadata": {"name": "web", "annotations": {TRAFFIC_ANNOTATION: "CanaryDeployment/web"}},
        "spec": {"selector": {"app": "web", version: "abcd1234"}},
    });
    let git =
        json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web", "tier": "front"}}});
    let mut applied = git.clone();
    keep_switched_version(&mut applied, &live);
    assert_eq!(
        applied["spec"]["selector"],
        json!({"app": "web", "tier": "front", version: "abcd1234"})
    );
    // A Service no rollout switches keeps Git's selector as it is.
    let plain =
        json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web", version: "x"}}});
    let mut applied = git.clone();
    keep_switched_version(&mut applied, &plain);
    assert_eq!(applied, git);
}
