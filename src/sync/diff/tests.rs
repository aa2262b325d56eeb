use super::*;
use serde_json::json;

fn key(kind: &str, name: &str) -> ObjectKey {
    ObjectKey::new("v1", kind, "default", name)
}

fn desired(name: &str, data: Value) -> DesiredObject {
    let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "annotations": {APPLIED_HASH_ANNOTATION: "h1", REVISION_ANNOTATION: "r2"}},
        "data": data});
    DesiredObject {
        key: key("ConfigMap", name),
        object: crate::specs::Spec::new(&object),
        hash: "h1".into(),
        source_path: "a.yaml".into(),
        location: crate::specs::Location {
            file: "a.yaml".into(),
            line: 1,
            column: 1,
        },
    }
}

fn existing(labels: Value, annotations: Value, owners: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a",
        "labels": labels, "annotations": annotations, "ownerReferences": owners}})
}

#[test]
fn an_unlabelled_object_is_taken_over_only_when_allowed() {
    let cm = existing(json!({}), json!({}), json!([]));
    let e = takeover_refusal(&cm, "prod", false).unwrap();
    assert!(e.contains("not managed by linnet"), "{e}");
    assert_eq!(takeover_refusal(&cm, "prod", true), None, "--adopt");
    let annotated = existing(json!({}), json!({ADOPT_ANNOTATION: "true"}), json!([]));
    assert_eq!(takeover_refusal(&annotated, "prod", false), None);
}

#[test]
fn a_source_does_not_take_over_anothers_objects() {
    let theirs = existing(
        json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE, SOURCE_LABEL: "team-b"}),
        json!({}),
        json!([]),
    );
    let e = takeover_refusal(&theirs, "team-a", false).unwrap();
    assert!(e.contains("\"team-b\""), "{e}");
    assert_eq!(takeover_refusal(&theirs, "team-b", false), None);
    // Adopted once by annotation, the annotation stays: it does not open it again.
    let adopted = existing(
        json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE, SOURCE_LABEL: "team-b"}),
        json!({ADOPT_ANNOTATION: "true"}),
        json!([]),
    );
    assert!(takeover_refusal(&adopted, "team-a", false).is_some());
    assert_eq!(takeover_refusal(&adopted, "team-a", true), None, "--adopt");
}

#[test]
fn a_rollouts_own_object_is_never_taken_over() {
    let child = existing(
        json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE, SOURCE_LABEL: "prod"}),
        json!({ADOPT_ANNOTATION: "true"}),
        json!([{"apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
            "name": "db", "uid": "u", "controller": true}]),
    );
    let e = takeover_refusal(&child, "prod", true).unwrap();
    assert!(e.contains("CanaryStatefulSet db"), "{e}");
}

#[test]
fn projection_keeps_what_ownership_needs() {
    let want =
        json!({"metadata": {"name": "a", "labels": {MANAGED_BY_LABEL: "linnet"}}, "data": {}});
    let have = existing(
        json!({SOURCE_LABEL: "x", "other": "y"}),
        json!({ADOPT_ANNOTATION: "true", "note": "n"}),
        json!([{"kind": "Foo"}]),
    );
    let kept = project_owned(&want, &have);
    assert_eq!(kept["metadata"]["labels"][SOURCE_LABEL], "x");
    assert_eq!(kept["metadata"]["annotations"][ADOPT_ANNOTATION], "true");
    assert_eq!(kept["metadata"]["ownerReferences"][0]["kind"], "Foo");
    assert!(kept["metadata"]["labels"].get("other").is_none());
}

/// What a Git change to a Service a blue-green rollout switches applies keeps the rollout's
/// version key (the projection is what the apply is built from).
#[test]
fn projection_keeps_a_switched_services_version_key() {
    let version = crate::api::VERSION_LABEL;
    let want = json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}}});
    let mut have = want.clone();
    have["spec"]["selector"][version] = json!("abcd1234");
    assert!(
        project_owned(&want, &have)["spec"]["selector"]
            .get(version)
            .is_none()
    );
    have["metadata"]["annotations"] =
        json!({crate::api::TRAFFIC_ANNOTATION: "CanaryDeployment/web"});
    assert_eq!(
        project_owned(&want, &have)["spec"]["selector"][version],
        "abcd1234"
    );
}

fn live_of(d: &DesiredObject, revision: &str) -> Value {
    let mut l = d.value();
    l["metadata"]["annotations"][REVISION_ANNOTATION] = json!(revision);
    l["metadata"]["uid"] = json!("123");
    l["metadata"]["resourceVersion"] = json!("9");
    l
}

#[test]
fn missing_object_is_created() {
    let d = desired("a", json!({"k": "v"}));
    let plan = plan_changes(vec![d], &BTreeMap::new(), &Default::default(), Prune::OFF);
    assert_eq!(plan[0].change, Change::Create);
}

#[test]
fn same_content_from_an_older_revision_is_unchanged() {
    let d = desired("a", json!({"k": "v"}));
    let live = BTreeMap::from([(d.key.clone(), live_of(&d, "r1"))]);
    let plan = plan_changes(vec![d], &live, &Default::default(), Prune::OFF);
    assert_eq!(plan[0].change, Change::Unchanged);
}

/// Issue 51: a full sync keeps an object it found unchanged when listing only by identity;
/// the plan takes the listing's word for it, and still records its uid for the inventory.
#[test]
fn an_object_found_unchanged_when_listed_is_planned_unchanged_from_its_identity() {
    let d = desired("a", json!({"k": "v"}));
    let mut full = live_of(&d, "r1");
    full["metadata"]["uid"] = json!("u1");
    assert!(is_unchanged(&d, &full));
    let identity = identity_only(&full);
    assert!(
        !is_unchanged(&d, &identity),
        "the identity alone is not the content"
    );
    let live = BTreeMap::from([(d.key.clone(), identity)]);
    let unchanged = std::collections::BTreeSet::from([d.key.clone()]);
    let plan = plan_changes(vec![d.clone()], &live, &unchanged, Prune::OFF);
    assert_eq!(plan[0].change, Change::Unchanged);
    assert_eq!(plan[0].uid.as_deref(), Some("u1"));
    // Without the listing's word, the identity alone would be an update.
    let plan = plan_changes(vec![d], &live, &Default::default(), Prune::OFF);
    assert_eq!(plan[0].change, Change::Update);
}

#[test]
fn drift_names_the_fields_changed_outside_git_and_a_git_change_is_not_drift() {
    let d = desired("app", json!({"a": "1", "b": "2"}));
    let mut live = d.value();
    live["data"]["b"] = json!("changed");
    live["metadata"]["uid"] = json!("u1");
    assert_eq!(drifted_fields(&d, &live), vec!["data.b".to_string()]);
    assert!(drifted_fields(&d, &d.value()).is_empty());
    live["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!("an older content");
    assert!(drifted_fields(&d, &live).is_empty());
}

#[test]
fn drift_in_the_cluster_is_an_update() {
    let d = desired("a", json!({"k": "v"}));
    let mut l = live_of(&d, "r1");
    l["data"]["k"] = json!("edited by hand");
    let live = BTreeMap::from([(d.key.clone(), l)]);
    let plan = plan_changes(vec![d], &live, &Default::default(), Prune::OFF);
    assert_eq!(plan[0].change, Change::Update);
    let diff = render_diff(&plan[0]);
    assert!(diff.contains("-  k: edited by hand"), "{diff}");
    assert!(diff.contains("+  k: v"), "{diff}");
    assert!(!diff.contains("resourceVersion"), "{diff}");
}

#[test]
fn a_file_with_an_error_keeps_what_it_applied_earlier() {
    let live = identity_only(&json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "a", "namespace": "default",
            "uid": "u1",
            "labels": {"rollouts.linnet.dev/source": "prod"},
            "annotations": {SOURCE_PATH_ANNOTATION: "apps/a.yaml", "other": "x"}}}));
    assert!(live["metadata"]["annotations"].get("other").is_none());
    let key = key("ConfigMap", "a");
    let applied = Inventory::from([(key.clone(), "u1".to_string())]);
    let live = BTreeMap::from([(key, live)]);
    assert_eq!(
        plan_changes(vec![], &live, &Default::default(), Prune::on(&applied)).len(),
        1
    );
    let other_file = ["apps/b.yaml".to_string()];
    let prune = Prune {
        enabled: true,
        blocked_files: &other_file,
        applied: &applied,
    };
    assert_eq!(
        plan_changes(vec![], &live, &Default::default(), prune).len(),
        1,
        "another file's error"
    );
    let its_file = ["apps/a.yaml".to_string()];
    let prune = Prune {
        enabled: true,
        blocked_files: &its_file,
        applied: &applied,
    };
    assert!(
        plan_changes(vec![], &live, &Default::default(), prune).is_empty(),
        "pruned although its file only has an error"
    );
}

#[test]
fn prune_never_deletes_what_a_rollout_owns_whatever_its_labels() {
    // Issue 18: `--prune` deleted redis-stable and redis-canary, which carried the
    // source label then. Owned children are skipped even with it.
    let owned = |api_version: &str, controller: bool| {
        identity_only(&json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "redis-stable", "namespace": "ns", "uid": "u",
                "labels": {"rollouts.linnet.dev/source": "prod"},
                "ownerReferences": [{"apiVersion": api_version, "kind": "CanaryStatefulSet",
                    "name": "redis", "uid": "r", "controller": controller}]}}))
    };
    let plan_for = |live: Value| {
        let k = ObjectKey::new("apps/v1", "StatefulSet", "ns", "redis-stable");
        let applied = Inventory::from([(k.clone(), "u".to_string())]);
        plan_changes(
            vec![],
            &BTreeMap::from([(k, live)]),
            &Default::default(),
            Prune::on(&applied),
        )
    };
    assert!(plan_for(owned("rollouts.linnet.dev/v1alpha1", true)).is_empty());
    // Issue 19: made by any controller (a pod of a Deployment whose template carried the
    // source label): not Git's to prune either.
    assert!(plan_for(owned("example.com/v1", true)).is_empty());
    // Owned, but not by a controller: Git's to prune as before.
    assert_eq!(
        plan_for(owned("rollouts.linnet.dev/v1alpha1", false))[0].change,
        Change::Prune
    );
}

#[test]
fn finalizers_added_by_controllers_are_not_drift_but_a_removed_one_is() {
    let mut d = desired("a", json!({"k": "v"}));
    let mut with_hold = d.value();
    with_hold["metadata"]["finalizers"] = json!(["example.com/hold"]);
    d.object = crate::specs::Spec::new(&with_hold);
    let plan_for = |finalizers: Value| {
        let mut l = live_of(&d, "r1");
        l["metadata"]["finalizers"] = finalizers;
        let live = BTreeMap::from([(d.key.clone(), l)]);
        plan_changes(vec![d.clone()], &live, &Default::default(), Prune::OFF)[0].change
    };
    // Before: the controller's finalizer made the list differ, and every full sync wrote.
    assert_eq!(
        plan_for(json!(["rollouts.linnet.dev/cleanup", "example.com/hold"])),
        Change::Unchanged
    );
    assert_eq!(plan_for(json!(["example.com/hold"])), Change::Unchanged);
    assert_eq!(
        plan_for(json!(["rollouts.linnet.dev/cleanup"])),
        Change::Update
    );
    assert_eq!(plan_for(Value::Null), Change::Update);
}

#[test]
fn namespaces_and_crds_to_apply_come_first_and_prunes_wait() {
    let change = |kind: &str, name: &str, change: Change| PlannedChange {
        key: key(kind, name),
        change,
        desired: None,
        live: None,
        uid: None,
    };
    let plan = vec![
        change("ConfigMap", "a", Change::Create),
        change("CustomResourceDefinition", "crd", Change::Update),
        change("Namespace", "gone", Change::Prune),
        change("Namespace", "apps", Change::Create),
    ];
    let (first, rest) = prerequisites_first(&plan);
    let names = |cs: Vec<&PlannedChange>| -> Vec<String> {
        cs.iter().map(|c| c.key.name.clone()).collect()
    };
    assert_eq!(names(first), vec!["crd", "apps"]);
    assert_eq!(names(rest), vec!["a", "gone"]);
}

#[test]
fn new_hash_is_an_update() {
    let d = desired("a", json!({"k": "v"}));
    let mut l = live_of(&d, "r1");
    l["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!("old");
    let live = BTreeMap::from([(d.key.clone(), l)]);
    assert_eq!(
        plan_changes(vec![d], &live, &Default::default(), Prune::OFF)[0].change,
        Change::Update
    );
}

#[test]
fn pruning_is_opt_in_and_never_touches_volumes() {
    let cm = key("ConfigMap", "gone");
    let pvc = key("PersistentVolumeClaim", "data-redis-0");
    let uid = |u: &str| json!({"metadata": {"uid": u}});
    let live = BTreeMap::from([(cm.clone(), uid("u1")), (pvc.clone(), uid("u2"))]);
    let applied = Inventory::from([(cm.clone(), "u1".into()), (pvc.clone(), "u2".into())]);
    assert!(plan_changes(vec![], &live, &Default::default(), Prune::OFF).is_empty());
    let plan = plan_changes(vec![], &live, &Default::default(), Prune::on(&applied));
    let by_key: BTreeMap<_, _> = plan.iter().map(|c| (c.key.clone(), c.change)).collect();
    assert_eq!(by_key[&cm], Change::Prune);
    assert_eq!(by_key[&pvc], Change::KeepVolume);
}

#[test]
fn subset_allows_server_defaults_but_not_changes() {
    let want = json!({"spec": {"ports": [{"port": 80}]}});
    let have =
        json!({"spec": {"ports": [{"port": 80, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}});
    assert!(is_subset(&want, &have));
    assert!(!is_subset(
        &json!({"spec": {"ports": [{"port": 81}]}}),
        &have
    ));
    assert!(!is_subset(&json!({"spec": {"ports": []}}), &have));
    assert!(is_subset(&json!({"port": "80"}), &json!({"port": 80})));
}

#[test]
fn prune_deletes_only_what_the_inventory_holds_with_its_uid() {
    // Issue 45: prune selected by linnet's two labels, and a hand-made ConfigMap carrying
    // them (a copied manifest) was deleted by the first sync.
    let labelled = |uid: &str| {
        identity_only(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "default", "uid": uid,
                "labels": {"rollouts.linnet.dev/source": "prod",
                    "app.kubernetes.io/managed-by": "linnet"}}}))
    };
    let applied_key = key("ConfigMap", "applied");
    let copy_key = key("ConfigMap", "copy");
    let live = BTreeMap::from([
        (applied_key.clone(), labelled("u1")),
        (copy_key.clone(), labelled("u2")),
    ]);
    let applied = Inventory::from([(applied_key.clone(), "u1".to_string())]);
    let plan = plan_changes(vec![], &live, &Default::default(), Prune::on(&applied));
    assert_eq!(
        plan.iter().map(|c| &c.key).collect::<Vec<_>>(),
        vec![&applied_key]
    );
    assert_eq!(plan[0].uid.as_deref(), Some("u1"));
    // Made again under the same name since: another object, not pruned.
    let remade = Inventory::from([(applied_key, "u0".to_string())]);
    assert!(plan_changes(vec![], &live, &Default::default(), Prune::on(&remade)).is_empty());
}

/// Regression (review of issue 49): every full sync found a weighed route's rules changed
/// (Git's one backend against the rollout's two) and applied Git's, resetting the weights.
#[test]
fn the_rules_of_a_route_a_rollout_weighs_are_not_a_change_from_git() {
    let mut d = desired("shop", json!({}));
    d.object = crate::specs::Spec::new(
        &json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "shop", "annotations": {APPLIED_HASH_ANNOTATION: "h1"}},
        "spec": {"parentRefs": [{"name": "gw"}],
            "rules": [{"backendRefs": [{"name": "shop-stable", "port": 8080}]}]}}),
    );
    let mut live = live_of(&d, "r1");
    live["spec"]["rules"] = json!([{"backendRefs": [
        {"name": "shop-stable", "port": 8080, "weight": 80},
        {"name": "shop-canary", "port": 8080, "weight": 20}]}]);
    // Without the rollout's mark, that is drift from Git.
    let plan = plan_changes(
        vec![d.clone()],
        &BTreeMap::from([(d.key.clone(), live.clone())]),
        &Default::default(),
        Prune::OFF,
    );
    assert_eq!(plan[0].change, Change::Update);
    live["metadata"]["annotations"][crate::api::TRAFFIC_ANNOTATION] =
        json!("CanaryDeployment/shop");
    let plan = plan_changes(
        vec![d.clone()],
        &BTreeMap::from([(d.key.clone(), live.clone())]),
        &Default::default(),
        Prune::OFF,
    );
    assert_eq!(plan[0].change, Change::Unchanged);
    assert!(drifted_fields(&d, &live).is_empty());
    // Anything else Git sets still counts.
    live["spec"]["parentRefs"] = json!([{"name": "other"}]);
    assert_eq!(
        drifted_fields(&d, &live),
        vec!["spec.parentRefs[0].name".to_string()]
    );
}
