//! The rollout API: the checked-in CRDs match the Rust types, and the API server enforces the
//! CRDs' validation rules with linnet's messages.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use kube::Api;
use kube::api::{DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use support::{TestNamespace, admin_client, from_json, install_linnet};

#[test]
fn checked_in_crds_match_the_rust_types() {
    let generated = linnet::api::crds_yaml().unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crds/crds.yaml");
    let checked_in = std::fs::read_to_string(path).unwrap();
    assert!(
        generated == checked_in,
        "deploy/crds/crds.yaml is stale; regenerate it with `make crds`"
    );
}

fn statefulset(spec_patch: Value) -> Value {
    let mut spec = json!({
        "replicas": 3,
        "canaryReplicas": 1,
        "image": "redis:7.2",
        "template": {
            "serviceName": "redis",
            "selector": {"matchLabels": {"app": "redis"}},
            "template": {
                "metadata": {"labels": {"app": "redis"}},
                "spec": {"containers": [{"name": "redis", "image": "redis:7.0"}]}
            }
        }
    });
    merge(&mut spec, spec_patch);
    json!({"apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
           "metadata": {"name": "redis"}, "spec": spec})
}

fn deployment(spec_patch: Value) -> Value {
    let mut spec = json!({
        "replicas": 4,
        "image": "web:2",
        "strategy": {"type": "Batches"},
        "batches": 2,
        "pause": "First",
        "currentBatch": 1,
        "template": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "web:1"}]}
            }
        }
    });
    merge(&mut spec, spec_patch);
    json!({"apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryDeployment",
           "metadata": {"name": "web"}, "spec": spec})
}

fn merge(base: &mut Value, patch: Value) {
    if let (Value::Object(b), Value::Object(p)) = (base, patch) {
        for (k, v) in p {
            b.insert(k, v);
        }
    }
}

async fn create(client: &kube::Client, ns: &str, object: Value) -> Result<(), String> {
    let kind = object["kind"].as_str().unwrap().to_string();
    let gvk = GroupVersionKind::gvk("rollouts.linnet.dev", "v1alpha1", &kind);
    let ar = ApiResource::from_gvk(&gvk);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let obj: DynamicObject = from_json(object);
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 422 => Err(s.message),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test]
async fn api_server_refuses_each_invalid_object_with_linnets_message() {
    let client = admin_client().await;
    install_linnet(&client).await;
    let ns = TestNamespace::create(&client, "cel").await;

    // Valid objects pass.
    create(&client, &ns.name, statefulset(json!({})))
        .await
        .unwrap();
    create(&client, &ns.name, deployment(json!({})))
        .await
        .unwrap();

    let cases = [
        (
            statefulset(json!({"canaryReplicas": 4})),
            "canaryReplicas must not exceed replicas",
        ),
        (
            statefulset(json!({"canaryReplicas": 2, "steps": [2, 1]})),
            "steps must be strictly ascending",
        ),
        (
            statefulset(json!({"canaryReplicas": 2, "steps": [1, 1]})),
            "steps must be strictly ascending",
        ),
        (
            statefulset(json!({"canaryReplicas": 1, "steps": [1, 2]})),
            "every step must be at least 1 and at most canaryReplicas",
        ),
        (statefulset(json!({"image": ""})), "image must not be empty"),
        (deployment(json!({"image": ""})), "image must not be empty"),
        (
            deployment(json!({"batches": 0, "currentBatch": 0})),
            "batches must be at least 1",
        ),
        (
            deployment(json!({"currentBatch": 3})),
            "currentBatch must be between 1 and batches",
        ),
        (
            deployment(json!({"currentBatch": 0})),
            "currentBatch must be between 1 and batches",
        ),
    ];
    for (i, (mut object, message)) in cases.into_iter().enumerate() {
        object["metadata"]["name"] = json!(format!("bad-{i}"));
        let err = create(&client, &ns.name, object.clone())
            .await
            .expect_err(&format!("API server accepted {object}"));
        assert!(
            err.contains(message),
            "case {i}: expected {message:?} in {err:?}"
        );

        // `linnet validate` finds the same problem offline, with the same words.
        let offline = linnet::specs::load_file(
            "case.yaml",
            serde_json::to_string(&object).unwrap().as_bytes(),
            &linnet::specs::LoadOptions::default(),
        );
        assert!(
            offline.errors.iter().any(|e| e.message.contains(message)),
            "case {i}: offline validation missed {message:?}: {:?}",
            offline.errors
        );
    }
}
