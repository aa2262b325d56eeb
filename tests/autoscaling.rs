//! Issue 72: a HorizontalPodAutoscaler drives a rollout through its `/scale` subresource, as
//! Argo Rollouts allows. Git leaves `replicas` out; the kube-controller-manager's HPA controller
//! (the real one, on the local control plane) scales the rollout; linnet neither applies nor
//! puts the count back over several drift checks; and a canary's batches follow the count.
//! A rollout whose Git sets `replicas` keeps Git's count: a `/scale` write is put back.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use linnet::api::{CanaryDeployment, CanaryStatefulSet, DeploymentPhase, StatefulSetPhase};
use serde_json::{Value, json};
use support::rollout::{Fixture, batched_web, merge, small_redis};

/// Drift checks every 3 s: the hold windows below span several.
const DRIFT: &str = "--drift-interval=3s";

/// The CanaryDeployment `web` of tests/deployment.rs with `replicas` left out of Git, and
/// `patch` merged into its spec.
fn autoscaled_web(ns: &str, patch: Value) -> Value {
    let mut spec = batched_web(ns, json!({}));
    spec["spec"].as_object_mut().unwrap().remove("replicas");
    merge(&mut spec["spec"], patch);
    spec
}

/// An autoscaling/v2 HPA on the rollout `kind`/`name`: CPU at 50 %, which this control plane
/// cannot measure (no metrics API), so it only keeps the count within `min..=max`.
fn hpa(ns: &str, kind: &str, name: &str, min: i32, max: i32) -> HorizontalPodAutoscaler {
    serde_json::from_value(json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "scaleTargetRef": {"apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": kind, "name": name},
            "minReplicas": min,
            "maxReplicas": max,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]
        }
    }))
    .unwrap()
}

async fn create_hpa(f: &Fixture, hpa: HorizontalPodAutoscaler) {
    f.api::<HorizontalPodAutoscaler>()
        .create(&PostParams::default(), &hpa)
        .await
        .unwrap();
}

/// Waits for the HPA to say it can reach its target's `/scale` (condition AbleToScale).
async fn wait_able_to_scale(f: &Fixture, name: &str) {
    let api = f.api::<HorizontalPodAutoscaler>();
    support::eventually("the HPA's AbleToScale", Duration::from_secs(60), || async {
        let hpa = api.get(name).await.unwrap();
        let conditions = hpa.status.and_then(|s| s.conditions).unwrap_or_default();
        conditions
            .iter()
            .any(|c| c.type_ == "AbleToScale" && c.status == "True")
            .then_some(())
    })
    .await;
}

async fn replicas_by_image(f: &Fixture) -> BTreeMap<String, i32> {
    let mut out = f.deployment_replicas_by_image().await;
    out.retain(|_, n| *n > 0);
    out
}

async fn wait_replicas(f: &Fixture, expected: &[(&str, i32)]) {
    let expected: BTreeMap<String, i32> =
        expected.iter().map(|(i, n)| (i.to_string(), *n)).collect();
    let what = format!("the Deployments' replicas by image to be {expected:?}");
    support::eventually(&what, Duration::from_secs(60), || async {
        (replicas_by_image(f).await == expected).then_some(())
    })
    .await;
}

fn deployment_phase(d: &CanaryDeployment) -> Option<DeploymentPhase> {
    d.status.as_ref().and_then(|s| s.phase)
}

#[tokio::test]
async fn an_autoscaler_sets_the_replicas_git_leaves_out_and_batches_follow_them() {
    let mut f = Fixture::prepare("hpa-web", |ns| autoscaled_web(ns, json!({}))).await;
    f.start_agent_with(&[DRIFT.to_string()]).await;
    let rollouts = f.api::<CanaryDeployment>();
    let done = f
        .wait_for(
            "Completed at the CRD's default count",
            60,
            |d: &CanaryDeployment| deployment_phase(d) == Some(DeploymentPhase::Completed),
        )
        .await;
    assert_eq!(done.spec.replicas, 1, "the CRD's default");
    let status = done.status.clone().unwrap();
    assert_eq!(
        status.selector.as_deref(),
        Some("rollouts.linnet.dev/rollout=web"),
        "/scale's selector: every pod of the rollout"
    );

    create_hpa(&f, hpa(&f.ns.name, "CanaryDeployment", "web", 3, 4)).await;
    wait_able_to_scale(&f, "web").await;
    f.wait_for("the HPA's minimum", 60, |d: &CanaryDeployment| {
        d.spec.replicas == 3
    })
    .await;
    wait_replicas(&f, &[("nginx:1.27", 3)]).await;

    // `kubectl scale` goes through the same subresource; the HPA leaves 4 alone (its maximum,
    // and no metrics to say otherwise).
    rollouts
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    wait_replicas(&f, &[("nginx:1.27", 4)]).await;
    let scale = rollouts.get_scale("web").await.unwrap();
    let scale_status = scale.status.unwrap();
    assert_eq!(
        scale_status.selector.as_deref(),
        Some("rollouts.linnet.dev/rollout=web")
    );
    // Several drift checks: the count is not Git's, so none puts it back.
    f.holds("the count /scale set", 10, |d: &CanaryDeployment| {
        d.spec.replicas == 4
    })
    .await;
    f.assert_no_drift_reverted();
    assert!(
        !f.event_reasons().await.iter().any(|r| r == "SpecDrift"),
        "a /scale write is not an edit of Git's spec: {:?}",
        f.event_reasons().await
    );
    f.wait_for("status.replicas", 30, |d: &CanaryDeployment| {
        d.status.as_ref().is_some_and(|s| s.replicas == 4)
    })
    .await;

    // A rollout in two batches of the autoscaled count: the first brings 1 new pod, the old
    // version keeps the other 3 of 4, and the last batch targets all 4.
    f.patch_spec(json!({"image": "nginx:1.28"}));
    let paused = f
        .wait_for("Paused after batch 1", 90, |d: &CanaryDeployment| {
            deployment_phase(d) == Some(DeploymentPhase::Paused)
        })
        .await;
    let targets: Vec<i32> = paused
        .status
        .unwrap()
        .batches
        .iter()
        .map(|b| b.target)
        .collect();
    assert_eq!(targets, [1, 4], "the batches of the autoscaled count");
    wait_replicas(&f, &[("nginx:1.27", 3), ("nginx:1.28", 1)]).await;
    f.patch_spec(json!({"currentBatch": 2}));
    f.wait_for("Completed on 1.28", 90, |d: &CanaryDeployment| {
        let s = d.status.clone().unwrap_or_default();
        s.phase == Some(DeploymentPhase::Completed)
            && s.stable_image.as_deref() == Some("nginx:1.28")
    })
    .await;
    wait_replicas(&f, &[("nginx:1.28", 4)]).await;
    assert_eq!(rollouts.get("web").await.unwrap().spec.replicas, 4);
    f.assert_no_drift_reverted();
}

/// The neighbour: when Git sets `replicas`, the count is Git's, and a `/scale` write (an HPA
/// on a rollout Git also sizes, `kubectl scale`) is put back like any edit.
#[tokio::test]
async fn a_scale_of_a_rollout_whose_git_sets_replicas_is_put_back() {
    let mut f = Fixture::prepare("hpa-gits", |ns| autoscaled_web(ns, json!({"replicas": 2}))).await;
    f.start_agent_with(&[DRIFT.to_string()]).await;
    let rollouts = f.api::<CanaryDeployment>();
    f.wait_for("Completed", 60, |d: &CanaryDeployment| {
        deployment_phase(d) == Some(DeploymentPhase::Completed)
    })
    .await;
    rollouts
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    f.wait_event_reasons(&["SpecDrift"], 15).await;
    f.wait_for("Git's count back", 15, |d: &CanaryDeployment| {
        d.spec.replicas == 2
    })
    .await;
    wait_replicas(&f, &[("nginx:1.27", 2)]).await;
}

/// The same for a CanaryStatefulSet: the HPA sizes the stable set, a canary takes the top
/// ordinal of the autoscaled count.
#[tokio::test]
async fn an_autoscaler_sizes_a_canary_statefulset_git_leaves_replicas_out() {
    let mut f = Fixture::prepare("hpa-sts", |ns| {
        let mut spec = small_redis(ns, json!({}));
        spec["spec"].as_object_mut().unwrap().remove("replicas");
        spec
    })
    .await;
    f.start_agent_with(&[DRIFT.to_string()]).await;
    f.wait_for("Stable", 60, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::Stable)
    })
    .await;
    create_hpa(&f, hpa(&f.ns.name, "CanaryStatefulSet", "redis", 3, 3)).await;
    wait_able_to_scale(&f, "redis").await;
    f.wait_for("3 ready, as the HPA asks", 90, |r: &CanaryStatefulSet| {
        r.spec.replicas == 3
            && r.status.as_ref().is_some_and(|s| {
                s.ready_replicas == 3
                    && s.replicas == 3
                    && s.selector.as_deref() == Some("rollouts.linnet.dev/rollout=redis")
            })
    })
    .await;
    let sets = f
        .api::<StatefulSet>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let asked: i32 = sets
        .items
        .iter()
        .filter_map(|s| s.spec.as_ref()?.replicas)
        .sum();
    assert_eq!(asked, 3, "the rollout's sets together");
    f.holds("the HPA's count", 8, |r: &CanaryStatefulSet| {
        r.spec.replicas == 3
    })
    .await;
    f.assert_no_drift_reverted();
}
