//! Real-node tier (issue 68): the seeds replayed on pods that really run, with a key-value
//! server (tests/node/kvserver) whose data lives on each replica's volume, a real directory.
//! Keys are written to every replica before a rollout and during it; after every step
//! (canary, promotion, abort, a rollback at the deadline or on analysis) each replica must
//! answer every key it ever acknowledged and none of another's, and no ordinal may have two
//! live processes (seen in /proc, not in the API). Needs `tests/node/up.sh` beside the
//! control plane; `make test` starts both.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use linnet::api::{CanaryDeployment, CanaryStatefulSet, DeploymentPhase, StatefulSetPhase};
use serde_json::{Value, json};
use support::node::{self, Ledger, check_one_process_per_replica, kv_container, on_node};
use support::rollout::Fixture;

/// The fixture of `make`'s rollout on the real node, or `None` (having said why) where the
/// machine cannot run it.
async fn start_on_node(prefix: &str, make: impl FnOnce(&str) -> Value) -> Option<Fixture> {
    let admin = support::admin_client().await;
    if !node::require(&admin).await {
        return None;
    }
    Some(Fixture::start(prefix, make).await)
}

/// [`start_on_node`] for the key-value CanaryStatefulSet at v1.
async fn start(prefix: &str, patch: Value) -> Option<Fixture> {
    start_on_node(prefix, |ns| node::kv_rollout(ns, "v1", patch)).await
}

/// [`start_on_node`] for the batched CanaryDeployment [`batched_web`].
async fn start_batched(prefix: &str, patch: Value) -> Option<Fixture> {
    start_on_node(prefix, |ns| batched_web(ns, patch)).await
}

fn phase(r: &CanaryStatefulSet) -> Option<StatefulSetPhase> {
    r.status.as_ref().and_then(|s| s.phase)
}

async fn wait_phase(f: &Fixture, want: StatefulSetPhase, secs: u64) -> CanaryStatefulSet {
    f.wait_for(&format!("phase {want:?}"), secs, |r: &CanaryStatefulSet| {
        phase(r) == Some(want)
    })
    .await
}

async fn wait_stable_on(f: &Fixture, tag: &str, secs: u64) -> CanaryStatefulSet {
    let image = format!("{}:{tag}", node::KV_IMAGE);
    f.wait_for(
        &format!("Stable on {image}"),
        secs,
        |r: &CanaryStatefulSet| {
            let s = r.status.clone().unwrap_or_default();
            s.phase == Some(StatefulSetPhase::Stable)
                && s.stable_image.as_deref() == Some(image.as_str())
                && s.ready.as_deref() == Some("3/3")
        },
    )
    .await
}

fn set_tag(f: &mut Fixture, tag: &str) {
    f.patch_spec(json!({"image": format!("{}:{tag}", node::KV_IMAGE)}));
}

/// Pod name of each ordinal: `kv-stable-k`, except `canary` ordinals in `kv-canary-k`.
fn two_sets(canary: &[i32]) -> BTreeMap<i32, String> {
    (0..3)
        .map(|k| {
            let set = if canary.contains(&k) {
                "canary"
            } else {
                "stable"
            };
            (k, format!("kv-{set}-{k}"))
        })
        .collect()
}

/// Samples the real processes of a namespace every 50 ms until dropped, keeping the first
/// time an ordinal had two live processes or a volume was mounted by two.
struct ProcessWatch {
    stop: Arc<AtomicBool>,
    violation: Arc<Mutex<Option<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProcessWatch {
    fn start(ns: &str) -> ProcessWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let violation = Arc::new(Mutex::new(None));
        let (s, v, ns) = (stop.clone(), violation.clone(), ns.to_string());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Err(e) = check_one_process_per_replica(&ns) {
                    v.lock().unwrap().get_or_insert(e);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        ProcessWatch {
            stop,
            violation,
            thread: Some(thread),
        }
    }

    /// Fails the test if any sample saw two processes for one ordinal or one volume.
    fn assert_clean(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        if let Some(v) = self.violation.lock().unwrap().clone() {
            panic!("seen on the node: {v}");
        }
    }
}

impl Drop for ProcessWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Writes `n` keys to each ordinal's pod in `names`.
async fn write_each(
    ledger: &mut Ledger,
    pods: &Api<Pod>,
    names: &BTreeMap<i32, String>,
    tag: &str,
) {
    for (k, name) in names {
        let ip = node::ready_pod_ip(pods, name, 120).await;
        for _ in 0..2 {
            ledger.write(*k, &ip, tag).await;
        }
    }
}

/// A first version with keys on every replica; returns the ledger.
async fn stable_with_keys(f: &Fixture) -> Ledger {
    wait_stable_on(f, "v1", 180).await;
    let mut ledger = Ledger::default();
    write_each(&mut ledger, &f.api(), &two_sets(&[]), "before").await;
    ledger
}

#[tokio::test]
async fn two_sets_keep_every_key_through_canary_promotion_and_abort() {
    let Some(mut f) = start("node-walk", json!({})).await else {
        return;
    };
    let mut watch = ProcessWatch::start(&f.ns.name);
    let pods = f.api::<Pod>();
    let mut ledger = stable_with_keys(&f).await;

    // The canary: replica 2 on v2 serves replica 2's keys from the same volume.
    set_tag(&mut f, "v2");
    wait_phase(&f, StatefulSetPhase::CanaryActive, 180).await;
    let canary = two_sets(&[2]);
    ledger
        .check_all(&pods, &BTreeMap::from([(2, canary[&2].clone())]), "v2")
        .await
        .unwrap();
    ledger
        .check_all(
            &pods,
            &BTreeMap::from([(0, canary[&0].clone()), (1, canary[&1].clone())]),
            "v1",
        )
        .await
        .unwrap();
    write_each(&mut ledger, &pods, &canary, "canary").await;

    // Promotion: every replica on v2, every key kept.
    f.annotate(linnet::api::PROMOTE_ANNOTATION, "linnet.test/kv:v2");
    wait_stable_on(&f, "v2", 180).await;
    ledger.check_all(&pods, &two_sets(&[]), "v2").await.unwrap();
    write_each(&mut ledger, &pods, &two_sets(&[]), "promoted").await;

    // A v3 canary that takes writes, then an abort: back on v2, and the keys the canary
    // acknowledged are still replica 2's.
    set_tag(&mut f, "v3");
    wait_phase(&f, StatefulSetPhase::CanaryActive, 180).await;
    let ip = node::ready_pod_ip(&pods, "kv-canary-2", 60).await;
    assert_eq!(node::version(&ip).await, "v3");
    ledger.write(2, &ip, "v3-canary").await;
    f.annotate(linnet::api::ABORT_ANNOTATION, "true");
    wait_phase(&f, StatefulSetPhase::RolledBack, 180).await;
    ledger.check_all(&pods, &two_sets(&[]), "v2").await.unwrap();
    watch.assert_clean();
}

#[tokio::test]
async fn a_canary_that_never_becomes_ready_rolls_back_at_the_deadline_with_every_key() {
    let Some(mut f) = start("node-deadline", json!({"progressDeadlineSeconds": 10})).await else {
        return;
    };
    let mut watch = ProcessWatch::start(&f.ns.name);
    let pods = f.api::<Pod>();
    let ledger = stable_with_keys(&f).await;
    // `broken` runs, but its readiness probe (a real HTTP GET by the kubelet) never passes.
    set_tag(&mut f, "broken");
    let done = wait_phase(&f, StatefulSetPhase::RolledBack, 180).await;
    assert_eq!(
        done.status.unwrap().stable_image.as_deref(),
        Some("linnet.test/kv:v1")
    );
    f.wait_event_reasons(&["ProgressDeadlineExceeded"], 30)
        .await;
    ledger.check_all(&pods, &two_sets(&[]), "v1").await.unwrap();
    assert!(
        node::kv_processes(&f.ns.name)
            .iter()
            .all(|p| p.version == "v1"),
        "a broken process still runs: {:?}",
        node::kv_processes(&f.ns.name)
    );
    watch.assert_clean();
}

#[tokio::test]
async fn a_canary_failing_its_analysis_rolls_back_with_every_key() {
    let ok = Arc::new(AtomicBool::new(false));
    let port = support::web_gate(ok.clone()).await;
    let analysis = json!({"gates": [{"after": 1, "templates": [{"templateName": "health"}]}]});
    let Some(mut f) = start("node-analysis", json!({"analysis": analysis})).await else {
        return;
    };
    let ns = f.ns.name.clone();
    f.write_file(
        "templates.yaml",
        &[support::web_gate_template(&ns, port, json!({"count": 2}))],
    );
    let mut watch = ProcessWatch::start(&ns);
    let pods = f.api::<Pod>();
    let mut ledger = stable_with_keys(&f).await;
    set_tag(&mut f, "v2");
    // The canary serves and takes writes while its gate measures.
    let ip = node::ready_pod_ip(&pods, "kv-canary-2", 180).await;
    ledger.write(2, &ip, "during-analysis").await;
    let back = wait_phase(&f, StatefulSetPhase::RolledBack, 180).await;
    assert_eq!(
        back.status.unwrap().stable_image.as_deref(),
        Some("linnet.test/kv:v1")
    );
    f.wait_event_reasons(&["AnalysisFailed"], 30).await;
    ledger.check_all(&pods, &two_sets(&[]), "v1").await.unwrap();
    watch.assert_clean();
}

#[tokio::test]
async fn partition_keeps_every_key_through_canary_promotion_and_a_broken_rollback() {
    let Some(mut f) = start(
        "node-part",
        json!({"strategy": {"type": "Partition"}, "progressDeadlineSeconds": 10}),
    )
    .await
    else {
        return;
    };
    let mut watch = ProcessWatch::start(&f.ns.name);
    let pods = f.api::<Pod>();
    let one_set: BTreeMap<i32, String> = (0..3).map(|k| (k, format!("kv-{k}"))).collect();
    wait_stable_on(&f, "v1", 180).await;
    let mut ledger = Ledger::default();
    write_each(&mut ledger, &pods, &one_set, "before").await;

    set_tag(&mut f, "v2");
    wait_phase(&f, StatefulSetPhase::CanaryActive, 180).await;
    // The top ordinal is the canary, on its own volume.
    let canary = BTreeMap::from([(2, "kv-2".to_string())]);
    node::eventually_version(&pods, "kv-2", "v2").await;
    ledger.check_all(&pods, &canary, "v2").await.unwrap();
    write_each(&mut ledger, &pods, &one_set, "canary").await;

    f.annotate(linnet::api::PROMOTE_ANNOTATION, "linnet.test/kv:v2");
    wait_stable_on(&f, "v2", 180).await;
    ledger.check_all(&pods, &one_set, "v2").await.unwrap();

    // A broken version: the canary pod never becomes Ready; the rollback must recreate it on
    // v2, on its own volume.
    set_tag(&mut f, "broken");
    wait_phase(&f, StatefulSetPhase::RolledBack, 180).await;
    node::eventually_version(&pods, "kv-2", "v2").await;
    ledger.check_all(&pods, &one_set, "v2").await.unwrap();
    watch.assert_clean();
}

/// Kills the agent (`kill -9`) as soon as the rollout is in `phases` (the handoff), restarts
/// it, promotes, and checks every key.
#[tokio::test]
async fn killed_during_the_volume_handoff_loses_no_key() {
    let Some(mut f) = start("node-kill", json!({})).await else {
        return;
    };
    let mut watch = ProcessWatch::start(&f.ns.name);
    let pods = f.api::<Pod>();
    let mut ledger = stable_with_keys(&f).await;
    f.annotate(linnet::api::PROMOTE_ANNOTATION, "linnet.test/kv:v2");
    set_tag(&mut f, "v2");
    use StatefulSetPhase::*;
    f.wait_for("the handoff", 120, |r: &CanaryStatefulSet| {
        matches!(phase(r), Some(ScalingDownStable | DeployingCanary))
    })
    .await;
    f.kill_agent();
    f.start_agent().await;
    wait_stable_on(&f, "v2", 240).await;
    ledger.check_all(&pods, &two_sets(&[]), "v2").await.unwrap();
    write_each(&mut ledger, &pods, &two_sets(&[]), "after").await;
    ledger.check_all(&pods, &two_sets(&[]), "v2").await.unwrap();
    watch.assert_clean();
}

/// A v2 canary of the fixture `prefix` that has taken a key of its own, with the keys of
/// [`stable_with_keys`] and a watch of the processes.
async fn canary_with_a_new_key(prefix: &str) -> Option<(Fixture, ProcessWatch, Ledger)> {
    let mut f = start(prefix, json!({})).await?;
    let watch = ProcessWatch::start(&f.ns.name);
    let pods = f.api::<Pod>();
    let mut ledger = stable_with_keys(&f).await;
    set_tag(&mut f, "v2");
    wait_phase(&f, StatefulSetPhase::CanaryActive, 180).await;
    let ip = node::ready_pod_ip(&pods, "kv-canary-2", 60).await;
    ledger.write(2, &ip, "canary").await;
    Some((f, watch, ledger))
}

#[tokio::test]
async fn the_canary_pod_deleted_mid_canary_keeps_every_key() {
    let Some((mut f, mut watch, mut ledger)) = canary_with_a_new_key("node-podgone").await else {
        return;
    };
    let pods = f.api::<Pod>();

    // The canary pod deleted: its set makes it again, on the same claim and volume.
    let uid = pods.get("kv-canary-2").await.unwrap().metadata.uid;
    pods.delete("kv-canary-2", &DeleteParams::default())
        .await
        .unwrap();
    support::eventually("a new canary pod", Duration::from_secs(90), || async {
        let p = pods.get_opt("kv-canary-2").await.ok()??;
        (p.metadata.uid != uid).then_some(())
    })
    .await;
    ledger
        .check_all(
            &pods,
            &BTreeMap::from([(2, "kv-canary-2".to_string())]),
            "v2",
        )
        .await
        .unwrap();
    let ip = node::ready_pod_ip(&pods, "kv-canary-2", 60).await;
    ledger.write(2, &ip, "canary-again").await;

    f.annotate(linnet::api::PROMOTE_ANNOTATION, "linnet.test/kv:v2");
    wait_stable_on(&f, "v2", 240).await;
    ledger.check_all(&pods, &two_sets(&[]), "v2").await.unwrap();
    watch.assert_clean();
}

/// The canary's claim deleted with its pod: the StatefulSet controller makes a new claim on
/// a fresh volume. linnet must never hand that volume on as replica 2's: it stops and says
/// what to do (issue 44), and once the operator has done it, rolls the canary back onto
/// replica 2's own volume, every key there.
#[tokio::test]
async fn the_canary_claim_deleted_with_its_pod_stops_the_rollout_and_loses_no_key() {
    let Some((mut f, mut watch, ledger)) = canary_with_a_new_key("node-claimgone").await else {
        return;
    };
    let pods = f.api::<Pod>();

    // Protected while the pod uses it; gone with the pod.
    let claims = f.api::<PersistentVolumeClaim>();
    let old_claim = claims.get("data-kv-canary-2").await.unwrap().metadata.uid;
    claims
        .delete("data-kv-canary-2", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("kv-canary-2", &DeleteParams::default())
        .await
        .unwrap();
    // The set's new claim must exist before the promotion: promoted sooner, linnet finds
    // only the old volume and hands it back, which keeps every key but tests nothing here.
    support::eventually(
        "the canary set's new claim, bound",
        Duration::from_secs(90),
        || async {
            let c = claims.get_opt("data-kv-canary-2").await.ok()??;
            let bound = c.spec.and_then(|s| s.volume_name).is_some();
            (c.metadata.uid != old_claim && bound).then_some(())
        },
    )
    .await;
    f.annotate(linnet::api::PROMOTE_ANNOTATION, "linnet.test/kv:v2");
    let stopped = f
        .wait_for(
            "linnet to stop on the new claim",
            120,
            |r: &CanaryStatefulSet| {
                r.status
                    .as_ref()
                    .and_then(|s| s.message.as_deref())
                    .is_some_and(|m| m.contains("never hands"))
            },
        )
        .await;
    let message = stopped.status.unwrap().message.unwrap();
    assert!(
        message.contains("scale StatefulSet kv-canary to 0"),
        "{message}"
    );

    // What the message says to do.
    use kube::api::{Patch, PatchParams};
    f.api::<k8s_openapi::api::apps::v1::StatefulSet>()
        .patch(
            "kv-canary",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    support::eventually("the canary pod to go", Duration::from_secs(60), || async {
        pods.get_opt("kv-canary-2")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    f.api::<PersistentVolumeClaim>()
        .delete("data-kv-canary-2", &DeleteParams::default())
        .await
        .unwrap();
    let done = f
        .wait_for(
            "back on replica 2's own volume",
            240,
            |r: &CanaryStatefulSet| {
                let s = r.status.clone().unwrap_or_default();
                matches!(
                    s.phase,
                    Some(StatefulSetPhase::RolledBack | StatefulSetPhase::Stable)
                ) && s.ready.as_deref() == Some("3/3")
            },
        )
        .await;
    let stable = done.status.unwrap().stable_image.unwrap();
    let tag = stable.rsplit(':').next().unwrap().to_string();
    ledger.check_all(&pods, &two_sets(&[]), &tag).await.unwrap();
    watch.assert_clean();
}

/// The check can fail: replica 1 handed an empty volume (its claim and pod deleted by hand,
/// so its set makes a new claim on a fresh volume) is caught, and linnet says so.
#[tokio::test]
async fn a_replica_handed_an_empty_volume_fails_the_check() {
    let Some(f) = start("node-empty", json!({})).await else {
        return;
    };
    let pods = f.api::<Pod>();
    let ledger = stable_with_keys(&f).await;
    ledger.check_all(&pods, &two_sets(&[]), "v1").await.unwrap();
    let old = pods.get("kv-stable-1").await.unwrap().metadata.uid;
    let claims = f.api::<PersistentVolumeClaim>();
    let own_volume = claims
        .get("data-kv-stable-1")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    claims
        .delete("data-kv-stable-1", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("kv-stable-1", &DeleteParams::default())
        .await
        .unwrap();
    support::eventually("a new kv-stable-1", Duration::from_secs(120), || async {
        let p = pods.get_opt("kv-stable-1").await.ok()??;
        (p.metadata.uid != old).then_some(())
    })
    .await;
    let ip = node::ready_pod_ip(&pods, "kv-stable-1", 120).await;
    let err = ledger.check(1, &ip).await.unwrap_err();
    assert!(err.contains("replica 1") && err.contains("lost"), "{err}");

    // Regression (issue 69): linnet says so, naming both volumes (it said nothing).
    let new_volume = claims
        .get("data-kv-stable-1")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    assert_ne!(new_volume, own_volume);
    let said = f
        .wait_for(
            "the condition VolumeReplaced",
            60,
            |r: &CanaryStatefulSet| {
                r.status.as_ref().is_some_and(|s| {
                    linnet::api::find_condition(&s.conditions, "VolumeReplaced")
                        .is_some_and(|c| c.status == "True")
                })
            },
        )
        .await;
    let status = said.status.unwrap();
    let c = linnet::api::find_condition(&status.conditions, "VolumeReplaced").unwrap();
    assert!(
        c.message.contains(&own_volume) && c.message.contains(&new_volume),
        "{}",
        c.message
    );
    assert!(
        f.event_reasons_of("CanaryStatefulSet")
            .await
            .iter()
            .any(|r| r == "VolumeReplaced"),
        "a VolumeReplaced event"
    );
}

/// The seed's batched CanaryDeployment on real pods: its new pods become Ready only through
/// a real readiness probe, and a version that never does rolls back instead of hanging, while
/// the old version keeps serving.
#[tokio::test]
async fn a_batched_deployment_whose_canary_never_becomes_ready_rolls_back() {
    let Some(mut f) = start_batched(
        "node-batches",
        json!({"replicas": 4, "batches": 2, "progressDeadlineSeconds": 10,
                "rollbackOnFailure": true}),
    )
    .await
    else {
        return;
    };
    f.wait_for("Completed on v1", 180, completed_on("v1")).await;
    // v2 through both batches, each batch Ready by its probes.
    f.patch_spec(json!({"image": "linnet.test/kv:v2"}));
    f.wait_for("Completed on v2", 180, completed_on("v2")).await;
    // The status is written before the old Deployment goes, and a real pod takes a moment
    // to stop.
    support::eventually("only v2 pods serving", Duration::from_secs(60), || async {
        let serving = serving_versions(&f).await;
        (serving == BTreeMap::from([("v2".to_string(), 4)])).then_some(())
    })
    .await;

    f.patch_spec(json!({"image": "linnet.test/kv:broken"}));
    f.wait_for("RolledBack", 180, |d: &CanaryDeployment| {
        d.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::RolledBack)
    })
    .await;
    support::eventually("only v2 pods serving", Duration::from_secs(60), || async {
        let serving = serving_versions(&f).await;
        (serving == BTreeMap::from([("v2".to_string(), 4)])).then_some(())
    })
    .await;
}

/// Issue 75: baseline pods on real pods. Paused after batch 1 of a rollout with
/// `strategy.baseline`, the baseline's pods are Ready by their probes and answer the stable
/// version, as many as the batch's new ones, beside the old version's full share; once the
/// rollout completes only the new version's pods serve.
#[tokio::test]
async fn baseline_pods_serve_the_stable_version_beside_the_batch_and_go_at_the_end() {
    let Some(mut f) = start_batched(
        "node-baseline",
        json!({"replicas": 4, "batches": 2, "pause": "All",
                "strategy": {"type": "Batches", "baseline": true}}),
    )
    .await
    else {
        return;
    };
    f.wait_for("Completed on v1", 180, completed_on("v1")).await;
    f.patch_spec(json!({"image": "linnet.test/kv:v2"}));
    let paused = f
        .wait_for("Paused after batch 1", 180, |d: &CanaryDeployment| {
            d.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Paused)
        })
        .await;
    let target = paused
        .status
        .unwrap_or_default()
        .batches
        .first()
        .map_or(0, |b| b.target) as usize;
    assert!(target > 0);
    let baseline = ListParams::default().labels("rollouts.linnet.dev/version=baseline");
    support::eventually(
        "the baseline serving v1",
        Duration::from_secs(60),
        || async {
            let serving = serving_versions_of(&f, &baseline).await;
            (serving == BTreeMap::from([("v1".to_string(), target)])).then_some(())
        },
    )
    .await;
    // Every old pod stays beside it: the baseline is extra, not taken from the stable share.
    support::eventually("old, baseline and new", Duration::from_secs(60), || async {
        let serving = serving_versions(&f).await;
        let want = BTreeMap::from([("v1".to_string(), 4), ("v2".to_string(), target)]);
        (serving == want).then_some(())
    })
    .await;
    f.patch_spec(json!({"currentBatch": 2}));
    f.wait_for("Completed on v2", 180, completed_on("v2")).await;
    support::eventually("only v2 pods serving", Duration::from_secs(60), || async {
        let serving = serving_versions(&f).await;
        (serving == BTreeMap::from([("v2".to_string(), 4)])).then_some(())
    })
    .await;
}

/// A batched CanaryDeployment `web` in `ns` of the key-value server on the real node (image
/// tag v1, an emptyDir for its data, no pause), with `patch` merged into its spec.
fn batched_web(ns: &str, patch: Value) -> Value {
    let mut container = kv_container("v1");
    container["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    let mut pod = json!({"metadata": {"labels": {"app": "web"}}, "spec": {
        "containers": [container], "volumes": [{"name": "data", "emptyDir": {}}]}});
    on_node(&mut pod);
    let mut spec = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryDeployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "image": "linnet.test/kv:v1",
            "strategy": {"type": "Batches"}, "pause": "None", "currentBatch": 1,
            "progressDeadlineSeconds": 120,
            "template": {"selector": {"matchLabels": {"app": "web"}}, "template": pod}
        }
    });
    support::rollout::merge(&mut spec["spec"], patch);
    spec
}

/// Whether the batched rollout is Completed on image tag `tag`.
fn completed_on(tag: &'static str) -> impl Fn(&CanaryDeployment) -> bool {
    move |d: &CanaryDeployment| {
        let s = d.status.clone().unwrap_or_default();
        s.phase == Some(DeploymentPhase::Completed)
            && s.stable_image.as_deref() == Some(&format!("linnet.test/kv:{tag}"))
    }
}

/// Ready pods of the namespace by the version they answer.
async fn serving_versions(f: &Fixture) -> BTreeMap<String, usize> {
    serving_versions_of(f, &ListParams::default()).await
}

/// Ready pods `which` selects by the version they answer.
async fn serving_versions_of(f: &Fixture, which: &ListParams) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in f.api::<Pod>().list(which).await.unwrap().items {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(status) = p.status else { continue };
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if let (true, Some(ip)) = (ready, status.pod_ip) {
            *out.entry(node::version(&ip).await).or_insert(0) += 1;
        }
    }
    out
}

/// Issue 69: in 4 of 25 batched runs, live pods briefly reached 17 to 18 against the
/// documented bound of 16, counting pods still stopping. The bound is on pods that are not
/// being deleted, as Kubernetes' own maxSurge is (docs/canarydeployment.md). On the real node,
/// where a pod takes real time to stop, every pod event of a 4-batch rollout of 8 replicas is
/// checked: pods not being deleted never exceed 8 plus the most one batch adds (3); the peak
/// with stopping pods counted is printed for the record.
#[tokio::test]
async fn a_batched_rollout_on_real_pods_keeps_its_surge_bound() {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let Some(mut f) = start_batched("node-surge", json!({"replicas": 8, "batches": 4})).await
    else {
        return;
    };
    f.wait_for("Completed on v1", 180, completed_on("v1")).await;
    // Every pod event from now: live (not being deleted) and all, at their peaks.
    let peaks = Arc::new(Mutex::new((0usize, 0usize, String::new())));
    let seen = peaks.clone();
    let pods = f.api::<Pod>();
    let watching = tokio::spawn(async move {
        let mut pods_now: BTreeMap<String, bool> = BTreeMap::new();
        let mut events = std::pin::pin!(watcher::watcher(pods, watcher::Config::default()));
        while let Some(Ok(event)) = events.next().await {
            match event {
                Event::Apply(p) | Event::InitApply(p) => {
                    let deleting = p.metadata.deletion_timestamp.is_some();
                    pods_now.insert(p.metadata.name.unwrap_or_default(), deleting);
                }
                Event::Delete(p) => {
                    pods_now.remove(&p.metadata.name.unwrap_or_default());
                }
                _ => continue,
            }
            let live = pods_now.values().filter(|d| !**d).count();
            let mut peaks = seen.lock().unwrap();
            if live > peaks.0 {
                peaks.2 = format!("{pods_now:?}");
            }
            peaks.0 = peaks.0.max(live);
            peaks.1 = peaks.1.max(pods_now.len());
        }
    });
    f.patch_spec(json!({"image": "linnet.test/kv:v2"}));
    f.wait_for("Completed on v2", 300, completed_on("v2")).await;
    support::eventually("only v2 pods", Duration::from_secs(60), || async {
        (serving_versions(&f).await == BTreeMap::from([("v2".to_string(), 8)])).then_some(())
    })
    .await;
    watching.abort();
    let (live, all, at) = peaks.lock().unwrap().clone();
    eprintln!("peak pods not being deleted: {live}; with stopping pods counted: {all}");
    assert!(
        live <= 8 + 3,
        "{live} pods not being deleted at once (bound 11): {at}"
    );
}
