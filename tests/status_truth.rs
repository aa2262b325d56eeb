//! Issue 69, status from the children: in each phase a person can meet (Stable, a canary
//! waiting for promotion, a canary that never gets ready, Failed mid-canary, RolledBack,
//! promoted), on pods that really run, every place that says what runs says what the pods
//! run: the CR status (`readyByImage`, `ready`, `canaryReadyReplicas`), the write-back
//! commit subject, the dashboard's `/api/rollouts` and `linnet get`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use linnet::api::{
    ABORT_ANNOTATION, CanaryDeployment, CanaryStatefulSet, PROMOTE_ANNOTATION, RolloutView,
};
use serde_json::{Value, json};
use support::node;
use support::ports::free_port;
use support::rollout::Fixture;

fn image(tag: &str) -> String {
    format!("{}:{tag}", node::KV_IMAGE)
}

/// What differs between the two kinds here.
trait Kind:
    RolloutView
    + kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
    const APP: &'static str;
    fn by_image(&self) -> Vec<linnet::api::ImageReplicas>;
    fn desired(&self) -> i32;
    /// Ready pods on the canary image, as the status counts them (None: not counted).
    fn canary_ready(&self) -> Option<i32>;
    fn status_file(&self) -> Option<linnet::writeback::status_files::StatusFile>;
    /// What `linnet get` says of replicas, given the ready count and canary-ready pods.
    fn get_says(&self, ready: &str, canary_ready: i32) -> String;
}

impl Kind for CanaryStatefulSet {
    const APP: &'static str = "kv";
    fn by_image(&self) -> Vec<linnet::api::ImageReplicas> {
        self.status.clone().unwrap_or_default().ready_by_image
    }
    fn desired(&self) -> i32 {
        self.spec.replicas
    }
    fn canary_ready(&self) -> Option<i32> {
        self.status.as_ref().map(|s| s.canary_ready_replicas)
    }
    fn status_file(&self) -> Option<linnet::writeback::status_files::StatusFile> {
        linnet::writeback::status_files::for_statefulset(self, "default")
    }
    fn get_says(&self, ready: &str, canary_ready: i32) -> String {
        format!("{ready} ready, {canary_ready} canary ready")
    }
}

impl Kind for CanaryDeployment {
    const APP: &'static str = "web";
    fn by_image(&self) -> Vec<linnet::api::ImageReplicas> {
        self.status.clone().unwrap_or_default().available_by_image
    }
    fn desired(&self) -> i32 {
        self.spec.replicas
    }
    fn canary_ready(&self) -> Option<i32> {
        None
    }
    fn status_file(&self) -> Option<linnet::writeback::status_files::StatusFile> {
        linnet::writeback::status_files::for_deployment(self, "default")
    }
    fn get_says(&self, ready: &str, _: i32) -> String {
        format!("{ready} ready (desired {})", self.spec.replicas)
    }
}

/// Ready pods of app `app` by the image their first container runs.
async fn ready_pods_by_image(f: &Fixture, app: &str) -> BTreeMap<String, i32> {
    let pods = f
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap();
    let mut by_image = BTreeMap::new();
    for p in pods.items {
        let status = p.status.unwrap_or_default();
        let ready = p.metadata.deletion_timestamp.is_none()
            && status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
        let running = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .next()
            .map(|c| c.image);
        let spec_image = p
            .spec
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.image);
        if ready {
            // The image the pod was made with: the runtime may report it another way.
            let image = spec_image.or(running).unwrap_or_default();
            *by_image.entry(image).or_default() += 1;
        }
    }
    by_image
}

/// `2 on a, 1 on b`: the stable image first, then the others by name.
fn serving_of(by_image: &BTreeMap<String, i32>, stable: Option<&str>) -> String {
    let mut images: Vec<(&String, &i32)> = by_image.iter().filter(|(_, n)| **n > 0).collect();
    images.sort_by_key(|(i, _)| (Some(i.as_str()) != stable, i.to_string()));
    images
        .iter()
        .map(|(i, n)| format!("{n} on {i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `n on image` parts of a serving line, in order of image (the kinds order them
/// differently; the parts are what must agree).
fn parts(serving: &str) -> Vec<String> {
    let mut parts: Vec<String> = serving
        .split(", ")
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    parts.sort_by_key(|p| p.split(" on ").nth(1).map(str::to_string));
    parts
}

/// What each place says, or why they disagree with the pods.
async fn disagreement<K: Kind>(
    f: &Fixture,
    name: &str,
    dashboard: &str,
    phase: &str,
) -> Result<String, String> {
    let pods = ready_pods_by_image(f, K::APP).await;
    let cr: K = f.api().get(name).await.unwrap();
    let have = cr.phase_name().unwrap_or_default();
    if have != phase {
        return Err(format!("phase {have}, waiting for {phase}"));
    }
    let cr_by_image: BTreeMap<String, i32> = cr
        .by_image()
        .iter()
        .filter(|r| r.replicas > 0)
        .map(|r| (r.image.clone(), r.replicas))
        .collect();
    if cr_by_image != pods {
        return Err(format!("by image {cr_by_image:?}, pods {pods:?}"));
    }
    let total: i32 = pods.values().sum();
    let ready = format!("{total}/{}", cr.desired());
    if cr.ready() != Some(ready.as_str()) {
        return Err(format!("ready {:?}, pods {ready}", cr.ready()));
    }
    let canary_ready = cr
        .canary_image()
        .filter(|c| Some(*c) != cr.stable_image())
        .and_then(|c| pods.get(c))
        .copied()
        .unwrap_or(0);
    if cr.canary_ready().is_some_and(|n| n != canary_ready) {
        return Err(format!(
            "canaryReadyReplicas {:?}, pods {canary_ready}",
            cr.canary_ready()
        ));
    }
    let serving = serving_of(&pods, cr.stable_image());
    if parts(&cr.serving()) != parts(&serving) {
        return Err(format!("serving {:?}, pods {serving}", cr.serving()));
    }
    let serving = cr.serving();
    let subject = cr.status_file().map(|f| f.summary).unwrap_or_default();
    if !subject.contains(&format!("{serving}; {ready} ready)")) {
        return Err(format!("write-back subject {subject:?}, pods {serving}"));
    }
    let all: Value = support::http()
        .get(format!("{dashboard}/api/rollouts"))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let rows = all
        .as_array()
        .or_else(|| all["rollouts"].as_array())
        .cloned()
        .unwrap_or_default();
    let row = rows
        .iter()
        .find(|r| r["name"] == name && r["namespace"] == f.ns.name.as_str())
        .cloned()
        .unwrap_or(Value::Null);
    if row["serving"] != serving.as_str() || row["ready"] != ready.as_str() || row["phase"] != phase
    {
        return Err(format!(
            "dashboard phase {} serving {} ready {}, pods {serving} {ready}",
            row["phase"], row["serving"], row["ready"]
        ));
    }
    let get = std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["get", name, "-n", &f.ns.name, "--kubeconfig"])
        .arg(support::admin_kubeconfig())
        .output()
        .unwrap();
    let get = String::from_utf8_lossy(&get.stdout).to_string();
    let says = cr.get_says(&ready, canary_ready);
    if !get.contains(&says) || !get.contains(phase) {
        return Err(format!(
            "linnet get does not say {says:?} and {phase}:\n{get}"
        ));
    }
    Ok(format!("{phase}: {serving}; {says}"))
}

async fn agree<K: Kind>(f: &Fixture, dashboard: &str, phase: &str) {
    let name = f.spec["metadata"]["name"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        match disagreement::<K>(f, &name, dashboard, phase).await {
            Ok(said) => {
                eprintln!("all agree with the pods: {said}");
                return;
            }
            Err(why) if Instant::now() > deadline => {
                panic!("in phase {phase}, not every place says what the pods run: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

#[tokio::test]
async fn every_place_says_what_the_pods_run_in_every_phase() {
    let admin = support::admin_client().await;
    if !node::require(&admin).await {
        return;
    }
    let mut f = Fixture::prepare("status-truth", |ns| {
        node::kv_rollout(ns, "v1", json!({"progressDeadlineSeconds": 40}))
    })
    .await;
    let port = free_port();
    f.start_agent_with(&[format!("--dashboard-listen=127.0.0.1:{port}")])
        .await;
    let dashboard = format!("http://127.0.0.1:{port}");

    agree::<CanaryStatefulSet>(&f, &dashboard, "Stable").await;

    // A canary waiting for promotion: 2 on v1, 1 on v2.
    f.patch_spec(json!({"image": image("v2")}));
    agree::<CanaryStatefulSet>(&f, &dashboard, "CanaryActive").await;

    // Failed mid-canary (the strategy switched to Partition while the two sets run, an
    // unsafe change): the canary pod still runs v2 and is Ready (issue 69 saw `0 canary
    // ready` and `3 on v1`).
    f.patch_spec(json!({"strategy": {"type": "Partition"}}));
    agree::<CanaryStatefulSet>(&f, &dashboard, "Failed").await;

    // Git puts it back and aborts: back on v1.
    f.patch_spec(json!({"strategy": {"type": "TwoSets"}}));
    f.annotate(ABORT_ANNOTATION, "true");
    agree::<CanaryStatefulSet>(&f, &dashboard, "RolledBack").await;

    // A canary that never gets ready: rolled back at its deadline.
    f.spec["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(ABORT_ANNOTATION);
    f.patch_spec(json!({"image": image("broken")}));
    f.wait_for("a canary of kv:broken", 60, |r: &CanaryStatefulSet| {
        r.status.as_ref().is_some_and(|s| {
            s.canary_image.as_deref() == Some(image("broken").as_str())
                && s.phase.map(|p| p.as_str()) == Some("DeployingCanary")
        })
    })
    .await;
    agree::<CanaryStatefulSet>(&f, &dashboard, "DeployingCanary").await;
    f.wait_for(
        "rolled back from kv:broken",
        120,
        |r: &CanaryStatefulSet| {
            r.status.as_ref().is_some_and(|s| {
                s.phase.map(|p| p.as_str()) == Some("RolledBack")
                    && s.message.as_deref().is_some_and(|m| !m.contains("abort"))
            })
        },
    )
    .await;
    agree::<CanaryStatefulSet>(&f, &dashboard, "RolledBack").await;

    // Promoted: 3 on v3.
    f.patch_spec(json!({"image": image("v3")}));
    agree::<CanaryStatefulSet>(&f, &dashboard, "CanaryActive").await;
    f.annotate(PROMOTE_ANNOTATION, &image("v3"));
    agree::<CanaryStatefulSet>(&f, &dashboard, "Stable").await;
    let cr: CanaryStatefulSet = f.api().get("kv").await.unwrap();
    assert_eq!(
        cr.status.unwrap().stable_image.as_deref(),
        Some(image("v3").as_str())
    );
    f.assert_no_drift_reverted();
}

/// A batched CanaryDeployment on the real node (pauses after the first batch): Completed,
/// paused mid-rollout, rolled back by an abort, and completed on the new image.
#[tokio::test]
async fn every_place_says_what_the_pods_of_a_batched_deployment_run() {
    let admin = support::admin_client().await;
    if !node::require(&admin).await {
        return;
    }
    let mut f = Fixture::prepare("status-truth-batch", |ns| {
        let mut container = node::kv_container("v1");
        container["name"] = json!("web");
        container["volumeMounts"] = json!([]);
        let mut pod =
            json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [container]}});
        node::on_node(&mut pod);
        json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1",
            "kind": "CanaryDeployment",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {
                "replicas": 4,
                "image": image("v1"),
                "strategy": {"type": "Batches"},
                "batches": 2,
                "pause": "First",
                "progressDeadlineSeconds": 60,
                "template": {"selector": {"matchLabels": {"app": "web"}}, "template": pod}
            }
        })
    })
    .await;
    let port = free_port();
    f.start_agent_with(&[format!("--dashboard-listen=127.0.0.1:{port}")])
        .await;
    let dashboard = format!("http://127.0.0.1:{port}");
    agree::<CanaryDeployment>(&f, &dashboard, "Completed").await;
    f.patch_spec(json!({"image": image("v2")}));
    agree::<CanaryDeployment>(&f, &dashboard, "Paused").await;
    f.annotate(ABORT_ANNOTATION, "true");
    agree::<CanaryDeployment>(&f, &dashboard, "RolledBack").await;
    f.spec["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(ABORT_ANNOTATION);
    f.patch_spec(json!({"image": image("v3"), "pause": "None"}));
    f.wait_for("a rollout of v3", 60, |r: &CanaryDeployment| {
        r.status
            .as_ref()
            .is_some_and(|s| s.canary_image.as_deref() == Some(image("v3").as_str()))
    })
    .await;
    f.wait_for("Completed on v3", 180, |r: &CanaryDeployment| {
        r.status.as_ref().is_some_and(|s| {
            s.phase.map(|p| p.as_str()) == Some("Completed")
                && s.stable_image.as_deref() == Some(image("v3").as_str())
        })
    })
    .await;
    agree::<CanaryDeployment>(&f, &dashboard, "Completed").await;
    f.assert_no_drift_reverted();
}
