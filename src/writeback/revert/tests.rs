use super::*;

const REDIS: &str = "\
# Redis, rolled out as a canary.
apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryStatefulSet
metadata:
  name: redis
  namespace: demo
spec:
  replicas: 3
  image: redis:7.4   # bumped by the release bot
  template:
    serviceName: redis
    template:
      spec:
        initContainers:
        - name: init
          image: busybox:1.36
        containers:
        - name: redis
          image: redis:7.4
        - name: exporter
          image: \"redis-exporter:1.0\"
";

fn revert(kind: &'static str, name: &str, failed: &str, good: &str) -> Revert {
    Revert {
        path: "apps/redis.yaml".into(),
        kind,
        namespace: "demo".into(),
        name: name.into(),
        failed: failed.into(),
        good: good.into(),
        why: "analysis error-rate failed: 0.2 > 0.05".into(),
        mode: RevertMode::Commit,
        revision: None,
        shared_base: false,
        cluster: None,
        failed_in: None,
    }
}

#[test]
fn the_image_and_the_containers_running_it_go_back_and_nothing_else_changes() {
    let r = revert("CanaryStatefulSet", "redis", "redis:7.4", "redis:7.2");
    let out = set_image(REDIS, &r).unwrap().unwrap();
    assert_eq!(out, REDIS.replace("redis:7.4", "redis:7.2"));
    assert!(out.contains("  image: redis:7.2   # bumped by the release bot\n"));
    assert!(out.contains("busybox:1.36") && out.contains("\"redis-exporter:1.0\""));
}

#[test]
fn a_file_that_no_longer_asks_for_the_failed_image_is_left_alone() {
    // Reverted already (a restart after the push), or a person moved on to another image.
    let reverted = REDIS.replace("redis:7.4", "redis:7.2");
    let r = revert("CanaryStatefulSet", "redis", "redis:7.4", "redis:7.2");
    assert_eq!(set_image(&reverted, &r), Ok(None));
    let moved_on = REDIS.replace("redis:7.4", "redis:7.6");
    assert_eq!(set_image(&moved_on, &r), Ok(None));
}

#[test]
fn the_rollout_is_found_among_other_documents_and_keeps_its_quotes() {
    let text = format!(
        "---\nkind: ConfigMap\nmetadata:\n  name: redis\n  namespace: demo\ndata:\n  image: \
         redis:7.4\n---\nkind: CanaryDeployment\nmetadata: {{name: redis}}\nspec:\n  image: \
         'redis:7.4'\n---\n{REDIS}"
    );
    let r = revert("CanaryStatefulSet", "redis", "redis:7.4", "redis:7.2");
    let out = set_image(&text, &r).unwrap().unwrap();
    // Only the CanaryStatefulSet's document changed.
    assert!(out.contains("data:\n  image: redis:7.4\n"), "{out}");
    assert!(out.contains("  image: 'redis:7.4'\n"), "{out}");
    assert_eq!(out.matches("redis:7.2").count(), 2, "{out}");
    let r = revert("CanaryDeployment", "redis", "redis:7.4", "redis:7.2");
    let out = set_image(&text, &r).unwrap().unwrap();
    assert!(out.contains("  image: 'redis:7.2'\n"), "{out}");
    assert_eq!(out.matches("redis:7.2").count(), 1, "{out}");
}

#[test]
fn a_good_image_that_is_no_plain_scalar_is_written_quoted() {
    let r = revert("CanaryStatefulSet", "redis", "redis:7.4", "redis:7.2 #odd");
    let out = set_image(REDIS, &r).unwrap().unwrap();
    assert!(
        out.contains("  image: \"redis:7.2 #odd\"   # bumped"),
        "{out}"
    );
    let reparsed: serde_json::Value = serde_saphyr::from_str(&out).unwrap();
    assert_eq!(reparsed["spec"]["image"], "redis:7.2 #odd");
}

#[test]
fn a_rollout_not_in_the_file_is_an_error_that_names_it() {
    let r = revert("CanaryStatefulSet", "cache", "redis:7.4", "redis:7.2");
    let e = set_image(REDIS, &r).unwrap_err();
    assert!(
        e.to_string()
            .contains("apps/redis.yaml has no CanaryStatefulSet cache"),
        "{e}"
    );
    // Another namespace's rollout of the same name is another rollout.
    let mut other = revert("CanaryStatefulSet", "redis", "redis:7.4", "redis:7.2");
    other.namespace = "prod".into();
    assert!(set_image(REDIS, &other).is_err());
}

fn rolled_back_redis(revert: &str) -> CanaryStatefulSet {
    let mut r: CanaryStatefulSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryStatefulSet",
        "metadata": {"name": "redis", "namespace": "demo",
            "annotations": {SOURCE_PATH_ANNOTATION: "apps/redis.yaml"}},
        "spec": {"replicas": 3, "image": "redis:7.4", "onFailure": {"revert": revert},
            "template": {"serviceName": "redis", "selector": {"matchLabels": {"app": "redis"}},
                "template": {"metadata": {"labels": {"app": "redis"}},
                    "spec": {"containers": [{"name": "redis", "image": "redis:7.4"}]}}}},
    }))
    .unwrap();
    r.status = Some(crate::api::CanaryStatefulSetStatus {
        phase: Some(StatefulSetPhase::RolledBack),
        stable_image: Some("redis:7.2".into()),
        canary_image: Some("redis:7.4".into()),
        message: Some("rolled back to redis:7.2".into()),
        ..Default::default()
    });
    r
}

#[test]
fn only_a_rolled_back_rollout_that_asks_for_it_is_reverted() {
    let r = rolled_back_redis("commit");
    let want = for_statefulset(&r).unwrap();
    // The source path is the repository's: --path only picks what is applied.
    assert_eq!(want.path, "apps/redis.yaml");
    assert_eq!(
        (want.failed.as_str(), want.good.as_str()),
        ("redis:7.4", "redis:7.2")
    );
    assert!(
        want.message()
            .starts_with("linnet: revert demo/redis to redis:7.2\n\n")
    );
    // The image automation reads it: redis:7.4 is not proposed again.
    assert!(
        want.message()
            .ends_with("\nLinnet-Failed-Image: redis:7.4\n"),
        "{}",
        want.message()
    );
    assert!(for_statefulset(&rolled_back_redis("none")).is_none());
    // Any other phase: nothing to revert.
    let mut active = rolled_back_redis("commit");
    active.status.as_mut().unwrap().phase = Some(StatefulSetPhase::CanaryActive);
    assert!(for_statefulset(&active).is_none());
    // Git already asks for another image than the one rolled back from.
    let mut moved_on = rolled_back_redis("commit");
    moved_on.spec.image = "redis:7.6".into();
    assert!(for_statefulset(&moved_on).is_none());
}

#[test]
fn an_alias_bomb_in_the_file_is_refused_within_the_parse_budget() {
    // Whoever can push controls the file a revert edits: ten levels of ten aliases would be
    // ten billion nodes.
    let mut bomb = String::from(
        "kind: CanaryStatefulSet\nmetadata: {name: redis}\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n",
    );
    for i in 1..10 {
        let p = i - 1;
        bomb.push_str(&format!(
            "l{i}: &l{i} [*l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}]\n"
        ));
    }
    bomb.push_str("spec:\n  image: redis:7.4\n");
    let r = revert("CanaryStatefulSet", "redis", "redis:7.4", "redis:7.2");
    assert!(set_image(&bomb, &r).is_err());
    assert!(rollout_image(&bomb, "CanaryStatefulSet", "redis").is_none());
}

fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    if let (Some(b), serde_json::Value::Object(p)) = (base.as_object_mut(), patch) {
        b.extend(p);
    }
}

fn web(phase: &str, spec: serde_json::Value, status: serde_json::Value) -> CanaryDeployment {
    let mut o = serde_json::json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryDeployment",
        "metadata": {"name": "web", "namespace": "demo",
            "annotations": {SOURCE_PATH_ANNOTATION: "apps/web.yaml"}},
        "spec": {"replicas": 4, "image": "web:2",
            "template": {"selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "web:2"}]}}}},
        "status": {"phase": phase},
    });
    merge(&mut o["spec"], spec);
    merge(&mut o["status"], status);
    serde_json::from_value(o).unwrap()
}

#[test]
fn a_rolled_back_deployment_is_reverted_to_the_image_it_returned_to() {
    let rollback = serde_json::json!({"rollback": {"fromImage": "web:2", "toImage": "web:1",
        "state": "Finished"}, "sourceRevision": "0123456789abcdef0123456789abcdef01234567"});
    let r = web(
        "RolledBack",
        serde_json::json!({"onFailure": {"revert": "pullRequest"}}),
        rollback.clone(),
    );
    let want = for_deployment(&r).unwrap();
    assert_eq!(
        (want.failed.as_str(), want.good.as_str()),
        ("web:2", "web:1")
    );
    assert_eq!(want.mode, RevertMode::PullRequest);
    assert_eq!(want.branch(), "linnet/revert/demo/web/0123456789ab");
    // Not asked for, still rolling back, or Git already moved on: nothing.
    assert!(for_deployment(&web("RolledBack", serde_json::json!({}), rollback.clone()),).is_none());
    let asks = serde_json::json!({"onFailure": {"revert": "commit"}});
    assert!(for_deployment(&web("RollingBack", asks.clone(), rollback.clone())).is_none());
    let mut moved_on = web("RolledBack", asks, rollback);
    moved_on.spec.image = "web:3".into();
    assert!(for_deployment(&moved_on).is_none());
}

/// A revert puts back the config files that came in with the image: which files count.
#[test]
fn only_files_of_configmaps_and_secrets_count_as_config() {
    assert!(holds_only_config("kind: ConfigMap\n---\nkind: Secret\n"));
    assert!(holds_only_config("# a comment\n---\nkind: ConfigMap\n"));
    assert!(!holds_only_config(
        "kind: ConfigMap\n---\nkind: Deployment\n"
    ));
    assert!(!holds_only_config(""), "nothing in it");
    assert!(!holds_only_config("kind: [unclosed\n"), "unreadable");
    assert!(!holds_only_config("data: {a: b}\n"), "no kind");
}

/// Regression: in a fleet, every cluster's agent has the same rollout, and one closing its
/// revert pull requests (Git moved on, or looked for once after a start) closed the other
/// clusters' too: they all started `linnet/revert/<namespace>/<name>/`.
#[test]
fn a_clusters_revert_branches_are_its_own() {
    let mut r = revert("CanaryDeployment", "web", "web:2", "web:1");
    r.namespace = "shop".into();
    let unnamed = r.branch_prefix();
    assert_eq!(unnamed, "linnet/revert/shop/web/");
    r.cluster = Some("eu-1".into());
    let eu1 = r.branch();
    assert!(eu1.starts_with("linnet/revert/@eu-1/shop/web/"), "{eu1}");
    assert_eq!(r.title(), "Revert shop/web in eu-1 to web:1");
    assert!(
        r.body().contains(".linnet/status/eu-1/shop/"),
        "{}",
        r.body()
    );
    for other in [
        unnamed.clone(),
        branch_prefix(Some("eu-2"), "shop", "web"),
        branch_prefix(Some("eu"), "shop", "web"),
        branch_prefix(Some("eu-1"), "shop", "we"),
    ] {
        assert!(!eu1.starts_with(&other), "{other} would close {eu1}");
    }
    // An unnamed agent's branches are not a named one's either.
    r.cluster = None;
    assert!(
        !r.branch()
            .starts_with(&branch_prefix(Some("eu-1"), "shop", "web"))
    );
}
