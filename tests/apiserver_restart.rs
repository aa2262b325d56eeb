//! A kube-apiserver restart in the middle of a rollout, on the real control plane: the agent
//! is not restarted, and it must act again within seconds of the API server answering. In a
//! test binary of its own, so that no other test runs while the API server is down.
//!
//! Issue 44: every child watch failed and then answered 410 Gone, one error after another,
//! and kube's Controller paused all its triggers for up to 30 s after each: a TwoSets canary
//! sat in DeployingCanary for 71 to over 250 s.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use linnet::api::{CanaryStatefulSet, PROMOTE_ANNOTATION, StatefulSetPhase};
use serde_json::{Value, json};
use support::rollout::Fixture;

fn redis(ns: &str) -> Value {
    json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryStatefulSet",
        "metadata": {"name": "redis", "namespace": ns},
        "spec": {
            "replicas": 3,
            "canaryReplicas": 1,
            "image": "redis:7.2",
            "progressDeadlineSeconds": 600,
            "template": {
                "serviceName": "redis",
                "selector": {"matchLabels": {"app": "redis"}},
                "template": {
                    "metadata": {"labels": {"app": "redis"}},
                    "spec": {"containers": [{
                        "name": "redis", "image": "redis:7.2",
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    }]}
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
                }]
            }
        }
    })
}

fn phase(r: &CanaryStatefulSet) -> Option<StatefulSetPhase> {
    r.status.as_ref().and_then(|s| s.phase)
}

/// Restarts the controller-manager and scheduler when dropped, pass or fail: after an API
/// server restart alone their watches lag for up to a minute, and the test binaries after
/// this one (the chaos soak among them) must not wait on that.
struct FreshControllersAfter;

impl Drop for FreshControllersAfter {
    fn drop(&mut self) {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/cluster/restart-controllers.sh"
        );
        if !Command::new(script).status().is_ok_and(|s| s.success()) {
            eprintln!("could not restart the controller-manager and scheduler");
        }
    }
}

fn restart_apiserver() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/cluster/restart-apiserver.sh"
    );
    let status = Command::new(script).status().unwrap();
    assert!(status.success(), "could not restart the kube-apiserver");
}

#[tokio::test]
async fn a_kube_apiserver_restart_mid_handoff_is_followed_at_once() {
    let mut f = Fixture::start("apiserver-restart", redis).await;
    f.wait_for("Stable on redis:7.2", 120, |r: &CanaryStatefulSet| {
        phase(r) == Some(StatefulSetPhase::Stable)
    })
    .await;
    f.annotate(PROMOTE_ANNOTATION, "redis:7.4");
    f.patch_spec(json!({"image": "redis:7.4"}));
    f.wait_for("the canary under way", 120, |r: &CanaryStatefulSet| {
        matches!(
            phase(r),
            Some(StatefulSetPhase::ScalingDownStable | StatefulSetPhase::DeployingCanary)
        )
    })
    .await;
    let _fresh_controllers = FreshControllersAfter;
    restart_apiserver();
    let back = Instant::now();
    // The rest of the canary and its promotion take a few seconds when the watches work
    // (9.4 s measured); before the fix the rollout waited for minutes (kube's shared trigger
    // backoff alone paused every watch for up to 30 s after each error).
    f.wait_for("Stable on redis:7.4", 30, |r: &CanaryStatefulSet| {
        let s = r.status.clone().unwrap_or_default();
        s.phase == Some(StatefulSetPhase::Stable) && s.stable_image.as_deref() == Some("redis:7.4")
    })
    .await;
    let took = back.elapsed();
    eprintln!("Stable on redis:7.4 {took:?} after the kube-apiserver answered again");
    let agent = f.agent.as_mut().unwrap();
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent exited; it must ride the restart out"
    );
    let lapses = support::metric(&agent.metrics().await, "linnet_own_write_wait_lapses_total");
    assert_eq!(lapses, 0.0, "an own-write wait lapsed");
    assert!(took < Duration::from_secs(30));
}
