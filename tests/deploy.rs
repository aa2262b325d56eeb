//! `deploy/` installs: every resource its kustomization lists is applied to the real API
//! server (server-side apply, as `kubectl apply -k deploy/` does), and what lands has the
//! safety properties the README promises.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use serde_json::Value;
use support::admin_client;

fn deploy_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy"))
}

/// The documents of every file the kustomization lists.
fn kustomized() -> Vec<Value> {
    let k: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let mut docs = Vec::new();
    for file in k["resources"].as_array().unwrap() {
        let text = std::fs::read_to_string(deploy_dir().join(file.as_str().unwrap())).unwrap();
        for part in text.split("\n---\n") {
            let doc: Value = serde_saphyr::from_str(part).unwrap_or(Value::Null);
            if doc.get("kind").is_some() {
                docs.push(doc);
            }
        }
    }
    docs
}

#[tokio::test]
async fn kubectl_apply_k_deploy_installs_everything() {
    let client = admin_client().await;
    let docs = kustomized();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    for kind in [
        "CustomResourceDefinition",
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Secret",
        "Deployment",
        "Service",
        "NetworkPolicy",
    ] {
        assert!(kinds.contains(&kind), "deploy/ has no {kind}: {kinds:?}");
    }
    // Issue 20: the Service and the NetworkPolicy expose the webhook port only, and the
    // shipped webhook secret is a placeholder the agent refuses to start with.
    let of_kind = |kind: &'static str| docs.iter().filter(move |d| d["kind"] == kind);
    for service in of_kind("Service") {
        for port in service["spec"]["ports"].as_array().unwrap() {
            assert_eq!(port["targetPort"], "http", "{service}");
        }
    }
    let policy = of_kind("NetworkPolicy").next().unwrap();
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], "http");
    assert!(policy["spec"]["ingress"][0].get("from").is_none());
    for secret in of_kind("Secret").filter(|s| s["metadata"]["name"] == "linnet-webhook") {
        let value = secret["stringData"]["secret"].as_str().unwrap();
        assert!(linnet::source::hooks::secret_problem(value.as_bytes()).is_some());
    }
    // Namespace first, as kubectl orders them.
    let mut ordered = docs.clone();
    ordered.sort_by_key(|d| d["kind"] != "Namespace" && d["kind"] != "CustomResourceDefinition");
    for doc in ordered {
        let (group, version) = doc["apiVersion"]
            .as_str()
            .unwrap()
            .rsplit_once('/')
            .unwrap_or(("", doc["apiVersion"].as_str().unwrap()));
        let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().unwrap());
        let (ar, caps) = pinned_kind(&client, &gvk).await.unwrap();
        let name = doc["metadata"]["name"].as_str().unwrap();
        let api: Api<DynamicObject> = match (caps.scope, doc["metadata"]["namespace"].as_str()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
            _ => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            name,
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap_or_else(|e| panic!("{} {name} is refused: {e}", gvk.kind));
    }

    let d = Api::<Deployment>::namespaced(client.clone(), "linnet-system")
        .get("linnet")
        .await
        .unwrap();
    let spec = d.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("linnet"));
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .clone()
            .unwrap()
    };
    assert_eq!(probe(&c.liveness_probe), "/healthz");
    assert_eq!(probe(&c.readiness_probe), "/readyz");
    let resources = c.resources.as_ref().unwrap();
    assert!(resources.requests.is_some() && resources.limits.is_some());
    // The clone cache is on an emptyDir; Secrets are files.
    let volumes = pod.volumes.unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v.name == "cache" && v.empty_dir.is_some())
    );
    assert!(volumes.iter().filter(|v| v.secret.is_some()).count() >= 2);
    // Every environment variable it sets is one of linnet agent's.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["agent", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for e in c.env.iter().flatten() {
        assert!(
            help.contains(&format!("env: {}=", e.name)),
            "{} is not a flag's variable",
            e.name
        );
    }

    let binding = Api::<ClusterRoleBinding>::all(client)
        .get("linnet")
        .await
        .unwrap();
    assert_eq!(binding.role_ref.name, "linnet");
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", "linnet", Some("linnet-system"))
    );
}
