//! Real-node tier (issue 68): the node's kubelet killed mid-handoff and started again 30 s
//! later. Its pods keep running meanwhile (as on a real node), so the stable pod of the replica
//! being handed over cannot be stopped while the kubelet is away, and the canary must not start
//! on that volume until it is: no ordinal may ever have two live processes, and no
//! acknowledged key may be lost. Its own test binary, so that no other real-node test shares
//! the node while its kubelet is down (cargo runs test binaries one at a time).
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use linnet::api::{CanaryStatefulSet, StatefulSetPhase};
use serde_json::json;
use support::node::{self, Ledger, check_one_process_per_replica};
use support::rollout::Fixture;

fn kubelet(action: &str) {
    let status = Command::new(node::node_scripts().join("kubelet.sh"))
        .arg(action)
        .status()
        .unwrap();
    assert!(status.success(), "tests/node/kubelet.sh {action} failed");
}

/// Starts the kubelet again when dropped, so a failing test leaves the node running.
struct KubeletDown;

impl Drop for KubeletDown {
    fn drop(&mut self) {
        kubelet("start");
    }
}

#[tokio::test]
async fn the_kubelet_stopped_for_30_s_mid_handoff_loses_no_key_and_never_runs_a_replica_twice() {
    let admin = support::admin_client().await;
    if !node::require(&admin).await {
        return;
    }
    let mut f = Fixture::start("node-kubelet", |ns| {
        let mut spec = node::kv_rollout(ns, "v1", json!({"progressDeadlineSeconds": 180}));
        spec["metadata"]["annotations"] =
            json!({linnet::api::PROMOTE_ANNOTATION: "linnet.test/kv:v2"});
        spec
    })
    .await;
    let ns = f.ns.name.clone();
    let pods = f.api::<Pod>();
    let stable_on = |tag: &'static str| {
        move |r: &CanaryStatefulSet| {
            let s = r.status.clone().unwrap_or_default();
            s.phase == Some(StatefulSetPhase::Stable)
                && s.stable_image.as_deref() == Some(&format!("linnet.test/kv:{tag}"))
                && s.ready.as_deref() == Some("3/3")
        }
    };
    f.wait_for("Stable on v1", 180, stable_on("v1")).await;
    let mut ledger = Ledger::default();
    let mut ips = BTreeMap::new();
    for k in 0..3 {
        let ip = node::ready_pod_ip(&pods, &format!("kv-stable-{k}"), 60).await;
        ledger.write(k, &ip, "before").await;
        ips.insert(k, ip);
    }

    f.patch_spec(json!({"image": "linnet.test/kv:v2"}));
    f.wait_for("the handoff", 120, |r: &CanaryStatefulSet| {
        matches!(
            r.status.as_ref().and_then(|s| s.phase),
            Some(StatefulSetPhase::ScalingDownStable | StatefulSetPhase::DeployingCanary)
        )
    })
    .await;
    kubelet("stop");
    let down = KubeletDown;
    // 30 s without a kubelet: the processes still serve and acknowledge writes; and never
    // two processes for one ordinal.
    let until = Instant::now() + Duration::from_secs(30);
    let mut violation = None;
    while Instant::now() < until {
        if let Err(e) = check_one_process_per_replica(&ns) {
            violation.get_or_insert(e);
        }
        for p in node::kv_processes(&ns) {
            if let Some(k) = node::ordinal_of(&p.pod)
                && p.pod.starts_with("kv-stable-")
                && k < 2
            {
                ledger.write(k, &ips[&k], "kubelet-down").await;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(down);
    // Until the end, sample the processes as the rollout goes on.
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Err(e) = check_one_process_per_replica(&ns) {
            violation.get_or_insert(e);
        }
        let r = f.api::<CanaryStatefulSet>().get("kv").await.unwrap();
        if stable_on("v2")(&r) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not Stable on v2 within 240 s: {:?}",
            r.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(violation, None, "seen on the node");
    let names: BTreeMap<i32, String> = (0..3).map(|k| (k, format!("kv-stable-{k}"))).collect();
    ledger.check_all(&pods, &names, "v2").await.unwrap();
}
