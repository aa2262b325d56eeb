use super::*;

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

#[test]
fn analysis_runs_show_counts_and_last_values() {
    let runs: Vec<crate::api::AnalysisRunStatus> = from(serde_json::json!([{
        "name": "background", "phase": "Failed", "startedAt": "2023-11-14T22:13:20Z",
        "metrics": [{"name": "error-rate", "phase": "Failed", "count": 3, "successful": 1,
            "failed": 2, "errors": 1, "measurements": [
                {"phase": "Error", "at": "2023-11-14T22:13:20Z", "message": "no samples"},
                {"phase": "Successful", "value": "0.01", "at": "2023-11-14T22:13:22Z"},
                {"phase": "Failed", "value": "0.31", "at": "2023-11-14T22:13:24Z"},
                {"phase": "Failed", "value": "0.3\u{1b}[2J", "at": "2023-11-14T22:13:26Z"}]},
            {"name": "smoke", "phase": "Error", "errors": 1, "measurements": [
                {"phase": "Error", "at": "2023-11-14T22:13:26Z", "message": "cannot create Job x"}]}]
    }]));
    let lines = analysis_lines(&runs);
    assert_eq!(
        lines,
        [(
            "Analysis",
            "background Failed: error-rate 1/3 ok, 2 failed, 1 errors [err 0.01 0.31 0.3\u{1b}[2J]; \
             smoke 0/0 ok, 0 failed, 1 errors [err], last error: cannot create Job x"
                .to_string()
        )]
    );
    let mut out = String::new();
    header(&mut out, lines[0].0, &lines[0].1);
    assert!(!out.contains('\u{1b}'), "{out}");
}

#[test]
fn a_metric_judged_against_a_baseline_shows_the_evidence() {
    let runs: Vec<crate::api::AnalysisRunStatus> = from(serde_json::json!([{
        "name": "after-1", "phase": "Inconclusive", "startedAt": "2023-11-14T22:13:20Z",
        "metrics": [{"name": "error-rate", "phase": "Inconclusive", "count": 3, "successful": 3,
            "canarySamples": [0.02, 0.021, 0.019], "baselineSamples": [0.005, 0.005, 0.004],
            "comparison": "not enough data: 3 canary and 3 baseline samples, 10 needed on each side",
            "measurements": [
                {"phase": "Successful", "value": "canary 0.02, baseline 0.005", "at": "2023-11-14T22:13:20Z"}]}]
    }]));
    let (_, line) = &analysis_lines(&runs)[0];
    assert_eq!(
        line,
        "after-1 Inconclusive: error-rate 3/3 ok, 0 failed [canary 0.02, baseline 0.005], judged: \
         not enough data: 3 canary and 3 baseline samples, 10 needed on each side"
    );
}

#[test]
fn a_canary_shows_each_set_its_pods_their_images_and_volumes() {
    let now = jiff::Timestamp::from_second(1_700_000_100).unwrap();
    let t = "2023-11-14T22:13:20Z";
    let rollout: CanaryStatefulSet = from(serde_json::json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
        "metadata": {"name": "redis", "namespace": "demo", "creationTimestamp": t,
            "annotations": {"rollouts.linnet.dev/source-path": "apps/redis/redis.yaml"}},
        "spec": {"replicas": 3, "canaryReplicas": 1, "image": "redis:2",
            "strategy": {"type": "TwoSets"}, "template": {}},
        "status": {"phase": "CanaryActive", "stableImage": "redis:1", "canaryImage": "redis:2",
            "ready": "3/3", "readyReplicas": 3, "canaryReadyReplicas": 1,
            "message": "waiting for promotion",
            "sourceRevision": "0123456789abcdef0123",
            "conditions": [{"type": "Reconciling", "status": "True", "reason": "CanaryActive",
                "message": "", "lastTransitionTime": t}]}
    }));
    let set = |name: &str, role: &str, n: i32, image: &str| -> StatefulSet {
        from(serde_json::json!({
            "metadata": {"name": name, "namespace": "demo", "labels": {ROLE_LABEL: role}},
            "spec": {"replicas": n, "serviceName": "redis", "selector": {},
                "template": {"spec": {"containers": [{"name": "redis", "image": image}]}}},
            "status": {"replicas": n, "readyReplicas": n}
        }))
    };
    let pod = |name: &str, set: &str, image: &str, claim: &str| -> Pod {
        from(serde_json::json!({
            "metadata": {"name": name, "namespace": "demo", "creationTimestamp": "2023-11-14T22:13:20Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": set, "uid": "u"}]},
            "spec": {"containers": [{"name": "redis", "image": image}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
    };
    let claim = |name: &str, pv: &str| -> PersistentVolumeClaim {
        from(serde_json::json!({"metadata": {"name": name}, "spec": {"volumeName": pv}}))
    };
    let event: Event = from(serde_json::json!({
        "metadata": {"name": "e1"}, "involvedObject": {},
        "type": "Normal", "reason": "CanaryStarted", "message": "canary redis:2 on replica 2",
        "lastTimestamp": t
    }));
    let snapshot = Snapshot {
        rollout: RolloutObject::StatefulSet(Box::new(rollout)),
        stateful_sets: vec![
            set("redis-stable", "stable", 2, "redis:1"),
            set("redis-canary", "canary", 1, "redis:2"),
        ],
        deployments: vec![],
        pods: vec![
            pod("redis-stable-0", "redis-stable", "redis:1", "data-redis-0"),
            pod("redis-stable-1", "redis-stable", "redis:1", "data-redis-1"),
            pod(
                "redis-canary-2",
                "redis-canary",
                "redis:2",
                "data-redis-canary-2",
            ),
        ],
        claims: vec![
            claim("data-redis-0", "pv-a"),
            claim("data-redis-1", "pv-b"),
            claim("data-redis-canary-2", "pv-c"),
        ],
        events: vec![event],
    };
    let text = snapshot.render(now);
    for want in [
        "Phase:       CanaryActive",
        "Images:      redis:1 (stable), redis:2 (canary)",
        "Conditions:  Reconciling=True",
        "Source:      apps/redis/redis.yaml @ 0123456789ab",
        "├── redis-canary",
        "└── redis-stable",
        "│   └── redis-canary-2",
        "    ├── redis-stable-0",
        "CanaryStarted",
    ] {
        assert!(text.contains(want), "no {want:?} in\n{text}");
    }
    let canary_pod = text.lines().find(|l| l.contains("redis-canary-2")).unwrap();
    assert!(
        canary_pod.contains("redis:2")
            && canary_pod.contains("pv-c")
            && canary_pod.contains("Ready"),
        "{canary_pod}"
    );
    assert!(canary_pod.ends_with("100s"), "{canary_pod}");
}
