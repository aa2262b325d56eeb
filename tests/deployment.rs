//! CanaryDeployment end to end on the real control plane: the agent binary follows a spec
//! directory (`--repo-path`), and each human gate is an edit of the spec, as a merged pull
//! request would make it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use linnet::api::{BatchState, CanaryDeployment, DeploymentPhase};
use serde_json::{Value, json};
use support::rollout::{Fixture, batched_web as web};

async fn start(prefix: &str, patch: Value) -> Fixture {
    Fixture::start(prefix, |ns| web(ns, patch)).await
}

fn phase_of(d: &CanaryDeployment) -> Option<DeploymentPhase> {
    d.status.as_ref().and_then(|s| s.phase)
}

async fn wait_phase(f: &Fixture, phase: DeploymentPhase, secs: u64) -> CanaryDeployment {
    f.wait_for(&format!("{phase:?}"), secs, |d: &CanaryDeployment| {
        phase_of(d) == Some(phase)
    })
    .await
}

async fn wait_completed_on(f: &Fixture, image: &str, secs: u64) -> CanaryDeployment {
    f.wait_for(
        &format!("Completed on {image}"),
        secs,
        |d: &CanaryDeployment| {
            let s = d.status.clone().unwrap_or_default();
            s.phase == Some(DeploymentPhase::Completed) && s.stable_image.as_deref() == Some(image)
        },
    )
    .await
}

/// Replicas per image over the rollout's Deployments.
/// Waits for the Deployments to run `expected`: a plan writes its status before it acts (so a
/// crash in between only means acting again), so a phase seen in the status may be a few
/// requests ahead of the Deployments it scales.
async fn wait_replicas(f: &Fixture, expected: BTreeMap<String, i32>) {
    let mut last = BTreeMap::new();
    for _ in 0..300 {
        last = replicas_by_image(f).await;
        if last == expected {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(last, expected, "the replicas by image");
}

async fn replicas_by_image(f: &Fixture) -> BTreeMap<String, i32> {
    f.deployment_replicas_by_image().await
}

/// One `status.batches` as (batch, target, state) rows.
type Batches = Vec<(i32, i32, BatchState)>;

/// Collects, from a watch, every distinct `status.batches` the rollout shows, and the most
/// replicas each Deployment was ever asked for.
#[derive(Clone, Default)]
struct Recorder {
    batches: Arc<Mutex<Vec<Batches>>>,
    max_replicas: Arc<Mutex<BTreeMap<String, i32>>>,
    /// The most replicas the rollout's Deployments were asked for together, at any moment.
    max_total: Arc<Mutex<(i32, BTreeMap<String, i32>)>>,
    /// Whether the Deployments' watch has its first list.
    listed: Arc<std::sync::atomic::AtomicBool>,
}

impl Recorder {
    fn start(f: &Fixture) -> Recorder {
        let r = Recorder::default();
        let rec = r.clone();
        let rollouts = f.api::<CanaryDeployment>();
        tokio::spawn(async move {
            let mut s = watcher(rollouts, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(Ok(d)) = s.next().await {
                let b: Vec<_> = d
                    .status
                    .unwrap_or_default()
                    .batches
                    .iter()
                    .map(|b| (b.batch, b.target, b.state))
                    .collect();
                let mut all = rec.batches.lock().unwrap();
                if !b.is_empty() && all.last() != Some(&b) {
                    all.push(b);
                }
            }
        });
        let rec = r.clone();
        let deployments = f.api::<Deployment>();
        tokio::spawn(async move {
            let mut s = watcher(deployments, watcher::Config::default()).boxed();
            let mut now = BTreeMap::new();
            while let Some(Ok(event)) = s.next().await {
                match event {
                    watcher::Event::Apply(d) | watcher::Event::InitApply(d) => {
                        let n = d.spec.and_then(|s| s.replicas).unwrap_or(0);
                        let name = d.metadata.name.unwrap();
                        let mut max = rec.max_replicas.lock().unwrap();
                        let e = max.entry(name.clone()).or_insert(0);
                        *e = (*e).max(n);
                        now.insert(name, n);
                    }
                    watcher::Event::Delete(d) => {
                        now.remove(&d.metadata.name.unwrap());
                    }
                    watcher::Event::InitDone => {
                        rec.listed.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    _ => {}
                }
                let total: i32 = now.values().sum();
                let mut max = rec.max_total.lock().unwrap();
                if total > max.0 {
                    *max = (total, now.clone());
                }
            }
        });
        r
    }

    /// Waits until the Deployments' watch has its first list: a change made after is seen.
    async fn listed(&self) {
        let listed = self.listed.clone();
        support::eventually(
            "the recorder's watch of Deployments",
            std::time::Duration::from_secs(30),
            || {
                let listed = listed.load(std::sync::atomic::Ordering::SeqCst);
                async move { listed.then_some(()) }
            },
        )
        .await
    }

    fn max_total(&self) -> (i32, BTreeMap<String, i32>) {
        self.max_total.lock().unwrap().clone()
    }

    fn batches(&self) -> Vec<Batches> {
        self.batches.lock().unwrap().clone()
    }
}

use BatchState::{Finished, InProgress, Pending};

#[tokio::test]
async fn the_seeds_example_four_replicas_two_batches_pause_first() {
    let mut f = start("cd-seed", json!({})).await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    let rec = Recorder::start(&f);
    rec.listed().await;
    f.patch_spec(json!({"image": "nginx:1.28"}));

    // 1. After batch 1: new = 1, old = 3, and it pauses.
    let paused = wait_phase(&f, DeploymentPhase::Paused, 90).await;
    wait_replicas(
        &f,
        BTreeMap::from([("nginx:1.27".into(), 3), ("nginx:1.28".into(), 1)]),
    )
    .await;
    let status = paused.status.unwrap();
    assert_eq!(status.batch.as_deref(), Some("1/2"));
    assert!(status.message.unwrap().contains("set currentBatch to 2"));
    assert_eq!(
        f.api::<Deployment>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    // 2. A merged pull request raises currentBatch to 2.
    f.patch_spec(json!({"currentBatch": 2}));

    // 3. new = 4, old = 0, and the old Deployment is deleted.
    wait_completed_on(&f, "nginx:1.28", 90).await;
    support::eventually(
        "the old Deployment to go",
        std::time::Duration::from_secs(30),
        || async {
            (replicas_by_image(&f).await == BTreeMap::from([("nginx:1.28".into(), 4)]))
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        rec.batches(),
        vec![
            vec![(1, 1, InProgress), (2, 4, Pending)],
            vec![(1, 1, Finished), (2, 4, Pending)],
            vec![(1, 1, Finished), (2, 4, InProgress)],
            vec![(1, 1, Finished), (2, 4, Finished)],
        ],
        "the per-batch status sequence"
    );
    f.wait_event_reasons(&["BatchStarted", "Paused", "RolloutComplete"], 10)
        .await;
}

#[tokio::test]
async fn pause_all_with_three_batches() {
    let mut f = start(
        "cd-all",
        json!({"replicas": 6, "batches": 3, "pause": "All"}),
    )
    .await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    f.patch_spec(json!({"image": "nginx:1.28"}));
    wait_phase(&f, DeploymentPhase::Paused, 90).await;
    support::eventually(
        "one replica on the canary",
        std::time::Duration::from_secs(30),
        || async { (replicas_by_image(&f).await.get("nginx:1.28") == Some(&1)).then_some(()) },
    )
    .await;
    f.patch_spec(json!({"currentBatch": 2}));
    f.wait_for("paused at batch 2", 90, |d: &CanaryDeployment| {
        let s = d.status.clone().unwrap_or_default();
        s.phase == Some(DeploymentPhase::Paused) && s.current_batch == Some(2)
    })
    .await;
    wait_replicas(
        &f,
        BTreeMap::from([("nginx:1.27".into(), 3), ("nginx:1.28".into(), 3)]),
    )
    .await;
    f.patch_spec(json!({"currentBatch": 3}));
    wait_completed_on(&f, "nginx:1.28", 90).await;
}

#[tokio::test]
async fn pause_none_runs_every_batch() {
    let mut f = start("cd-none", json!({"batches": 3, "pause": "None"})).await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    let rec = Recorder::start(&f);
    rec.listed().await;
    f.patch_spec(json!({"image": "nginx:1.28"}));
    wait_completed_on(&f, "nginx:1.28", 120).await;
    assert!(!f.event_reasons().await.iter().any(|r| r == "Paused"));
    assert!(rec.batches().iter().all(|b| b.len() == 3));
}

#[tokio::test]
async fn rolling_corrects_drift_made_by_hand() {
    let mut f = start("cd-roll", json!({"strategy": {"type": "Rolling"}})).await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    f.patch_spec(json!({"image": "nginx:1.28", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}));
    wait_completed_on(&f, "nginx:1.28", 90).await;
    let deployments = f.api::<Deployment>();
    // kubectl scale and kubectl set image, by hand.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [
                {"name": "web", "image": "nginx:hacked", "resources": {"requests": {"cpu": "1"}}}
            ]}}}})),
        )
        .await
        .unwrap();
    support::eventually(
        "drift to be corrected",
        std::time::Duration::from_secs(30),
        || async {
            let d = deployments.get("web").await.unwrap();
            let spec = d.spec.unwrap();
            let c = &spec.template.spec.unwrap().containers[0];
            let cpu = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("cpu"))
                .map(|q| q.0.clone());
            (spec.replicas == Some(4)
                && c.image.as_deref() == Some("nginx:1.28")
                && cpu.as_deref() == Some("100m"))
            .then_some(())
        },
    )
    .await;
}

/// Issue 24: CanaryDeployment had no abort annotation; `linnet abort` sets it (to the image
/// being rolled out), the batches roll back, and `linnet get` shows both Deployments.
#[tokio::test]
async fn linnet_abort_rolls_a_paused_rollout_back() {
    let mut f = start("cd-abort", json!({})).await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    f.patch_spec(json!({"image": "nginx:1.28"}));
    wait_phase(&f, DeploymentPhase::Paused, 90).await;
    let ns = f.ns.name.clone();
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
            .args(args)
            .env("KUBECONFIG", support::admin_kubeconfig())
            .output()
            .unwrap()
    };
    let get = cli(&["get", "web", "-n", &ns]);
    let tree = String::from_utf8_lossy(&get.stdout);
    assert!(
        tree.contains("Phase:       Paused") && tree.contains("Batch:       1/2"),
        "{tree}"
    );
    assert!(tree.matches("nginx:1.2").count() >= 2, "{tree}");
    let promote = cli(&["promote", "web", "-n", &ns]);
    assert_eq!(promote.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&promote.stderr).contains("currentBatch"));
    let abort = cli(&["abort", "web", "-n", &ns]);
    assert!(
        abort.status.success(),
        "{}",
        String::from_utf8_lossy(&abort.stderr)
    );
    let done = wait_phase(&f, DeploymentPhase::RolledBack, 90).await;
    let status = done.status.unwrap();
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Stalled" && c.status == "True"),
        "{:?}",
        status.conditions
    );
    support::eventually(
        "the new Deployment to go",
        std::time::Duration::from_secs(30),
        || async {
            (replicas_by_image(&f).await == BTreeMap::from([("nginx:1.27".into(), 4)]))
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn rollback_from_the_middle_of_batches() {
    let mut f = start("cd-rb", json!({})).await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    f.patch_spec(json!({"image": "nginx:1.28"}));
    wait_phase(&f, DeploymentPhase::Paused, 90).await;
    f.patch_spec(json!({"strategy": {"type": "Rollback"}}));
    let done = wait_phase(&f, DeploymentPhase::RolledBack, 90).await;
    let rb = done.status.unwrap().rollback.unwrap();
    assert_eq!(
        (rb.from_image.as_str(), rb.to_image.as_str(), rb.state),
        ("nginx:1.28", "nginx:1.27", Finished)
    );
    support::eventually(
        "the new Deployment to go",
        std::time::Duration::from_secs(30),
        || async {
            (replicas_by_image(&f).await == BTreeMap::from([("nginx:1.27".into(), 4)]))
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_rolling_rollback_sets_the_image_back() {
    let mut f = start("cd-rollrb", json!({"strategy": {"type": "Rolling"}})).await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    f.patch_spec(json!({"image": "nginx:1.28"}));
    wait_completed_on(&f, "nginx:1.28", 90).await;
    f.patch_spec(json!({"strategy": {"type": "Rollback"}}));
    wait_phase(&f, DeploymentPhase::RolledBack, 90).await;
    wait_replicas(&f, BTreeMap::from([("nginx:1.27".into(), 4)])).await;
}

#[tokio::test]
async fn a_broken_image_hits_the_deadline_and_the_old_version_serves() {
    let mut f = start(
        "cd-broken",
        json!({"progressDeadlineSeconds": 8, "pause": "None"}),
    )
    .await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    f.patch_spec(json!({"image": "nginx:broken"}));
    let failed = wait_phase(&f, DeploymentPhase::Failed, 90).await;
    assert!(
        failed
            .status
            .unwrap()
            .message
            .unwrap()
            .contains("nginx:1.27 keeps serving")
    );
    assert_eq!(replicas_by_image(&f).await["nginx:1.27"], 4);
    f.wait_event_reasons(&["ProgressDeadlineExceeded"], 10)
        .await;
    // Automatic rollback, once configured, cleans up. The status says RolledBack in the
    // plan that deletes the broken Deployment (status is written before the actions), so the
    // delete may land a moment later.
    f.patch_spec(json!({"rollbackOnFailure": true}));
    wait_phase(&f, DeploymentPhase::RolledBack, 90).await;
    support::eventually(
        "the broken Deployment to go",
        std::time::Duration::from_secs(30),
        || async {
            (replicas_by_image(&f).await == BTreeMap::from([("nginx:1.27".into(), 4)]))
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn killed_mid_batch_carries_on_without_scaling_twice() {
    let mut f = start(
        "cd-kill",
        json!({"replicas": 6, "batches": 3, "pause": "All"}),
    )
    .await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    let rec = Recorder::start(&f);
    rec.listed().await;
    f.patch_spec(json!({"image": "nginx:1.28", "currentBatch": 2}));
    // Kill it as soon as batch 2 is recorded, then bring it back.
    f.wait_for("batch 2", 90, |d: &CanaryDeployment| {
        d.status.as_ref().and_then(|s| s.current_batch) == Some(2)
    })
    .await;
    f.kill_agent();
    f.start_agent().await;
    f.wait_for("paused at batch 2", 90, |d: &CanaryDeployment| {
        let s = d.status.clone().unwrap_or_default();
        s.phase == Some(DeploymentPhase::Paused) && s.current_batch == Some(2)
    })
    .await;
    wait_replicas(
        &f,
        BTreeMap::from([("nginx:1.27".into(), 3), ("nginx:1.28".into(), 3)]),
    )
    .await;
    let new = f
        .api::<Deployment>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|d| {
            d.spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .image
                .as_deref()
                == Some("nginx:1.28")
        })
        .unwrap()
        .metadata
        .name
        .unwrap();
    let max = rec.max_replicas.lock().unwrap().clone();
    assert_eq!(
        max[&new], 3,
        "the new version went past batch 2's target: {max:?}"
    );
    f.patch_spec(json!({"currentBatch": 3}));
    wait_completed_on(&f, "nginx:1.28", 90).await;
}

/// Issue 18: with --prune, a restart pruned the old-version Deployment of a Paused rollout,
/// and it was never recreated: 1 of 4 replicas served while status said "1 new, 3 old".
#[tokio::test]
async fn a_restart_with_prune_keeps_a_paused_rollouts_deployments_and_a_deleted_one_returns() {
    let mut f = start("dep-prune", json!({})).await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    f.patch_spec(json!({"image": "nginx:1.28"}));
    wait_phase(&f, DeploymentPhase::Paused, 90).await;
    let expected = BTreeMap::from([("nginx:1.27".into(), 3), ("nginx:1.28".into(), 1)]);
    assert_eq!(replicas_by_image(&f).await, expected);
    let uids = |list: Vec<Deployment>| {
        list.into_iter()
            .map(|d| (d.metadata.name.unwrap(), d.metadata.uid.unwrap()))
            .collect::<BTreeMap<_, _>>()
    };
    let before = uids(
        f.api::<Deployment>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );

    f.kill_agent();
    let agent = f.spawn_agent("pruning", &["--prune".into()]);
    support::agent::wait_ready(&agent).await;
    support::eventually(
        "the pruning agent's first sync",
        std::time::Duration::from_secs(30),
        || async { agent.log_text().contains("synced").then_some(()) },
    )
    .await;
    support::holds_for(
        "nothing pruned by the pruning agent",
        std::time::Duration::from_secs(3),
        || async {
            let log = agent.log_text();
            match log.contains("pruned: no longer in Git") {
                true => Err(log),
                false => Ok(()),
            }
        },
    )
    .await;
    f.agent = Some(agent);
    let now = uids(
        f.api::<Deployment>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    assert_eq!(now, before, "a Deployment was pruned or recreated");

    // The old version deleted by hand comes back at its size; the rollout stays Paused.
    let old = f
        .api::<Deployment>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|d| {
            d.spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .image
                .as_deref()
                == Some("nginx:1.27")
        })
        .unwrap();
    let old_name = old.metadata.name.unwrap();
    f.api::<Deployment>()
        .delete(&old_name, &Default::default())
        .await
        .unwrap();
    support::eventually(
        "the old version back",
        std::time::Duration::from_secs(30),
        || async {
            let d = f.api::<Deployment>().get_opt(&old_name).await.unwrap()?;
            (d.metadata.uid.as_ref() != before.get(&old_name)).then_some(())
        },
    )
    .await;
    assert_eq!(replicas_by_image(&f).await, expected);
    assert_eq!(
        phase_of(&f.api::<CanaryDeployment>().get("web").await.unwrap()),
        Some(DeploymentPhase::Paused)
    );
}

/// Issue 18: adding a selector label to a live rollout's template was a 422 retried forever.
#[tokio::test]
async fn a_selector_change_on_a_live_rollout_is_refused_and_named() {
    let mut f = start("dep-selector", json!({})).await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    f.patch_spec(json!({"template": {
        "selector": {"matchLabels": {"app": "web", "tier": "front"}},
        "template": {"metadata": {"labels": {"app": "web", "tier": "front"}}}
    }}));
    let failed = wait_phase(&f, DeploymentPhase::Failed, 30).await;
    let message = failed.status.unwrap().message.unwrap();
    assert!(
        message.starts_with("rollout.yaml: spec.template.selector changed"),
        "{message}"
    );
    f.wait_event_reasons(&["UnsafeChange"], 10).await;
    for labels in [
        "/spec/template/selector/matchLabels",
        "/spec/template/template/metadata/labels",
    ] {
        let labels = f.spec.pointer_mut(labels).unwrap();
        labels.as_object_mut().unwrap().remove("tier");
    }
    f.write();
    wait_completed_on(&f, "nginx:1.27", 30).await;
}

/// Issue 44: replicas 10, batches 3: at batch 2 and again at batch 3 the old version went
/// back to 10 before coming down again, 20 replicas asked for a 10-replica rollout. While
/// batch N runs, the two Deployments ask for at most `replicas` plus what batch N adds.
#[tokio::test]
async fn batches_never_ask_for_more_than_the_replicas_a_batch_adds() {
    let mut f = start(
        "cd-surge",
        json!({"replicas": 10, "batches": 3, "pause": "None"}),
    )
    .await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    let rec = Recorder::start(&f);
    rec.listed().await;
    f.patch_spec(json!({"image": "nginx:1.28"}));
    wait_completed_on(&f, "nginx:1.28", 180).await;
    // The status is written before its actions are done (a crash in between redoes them):
    // Completed may be seen a moment before the old version's Deployment goes.
    support::eventually(
        "only nginx:1.28's 10 replicas",
        Duration::from_secs(30),
        || async {
            let now = replicas_by_image(&f).await;
            (now == BTreeMap::from([("nginx:1.28".to_string(), 10)])).then_some(())
        },
    )
    .await;
    // Targets 1, 4, 10: batch 3 adds 6, the most of any batch.
    let (most, when) = rec.max_total();
    assert!(most <= 16, "{most} replicas asked for at once: {when:?}");
}

/// Issue 44: a `kubectl patch` of a CanaryDeployment's strategy to Rollback rolled it back,
/// and it stayed RolledBack after the drift check reverted the patch. Now the edit is never
/// acted on, and Git's spec is put back at once.
#[tokio::test]
async fn a_strategy_edited_in_the_cluster_is_never_acted_on() {
    let mut f = start("cd-edit", json!({"pause": "None"})).await;
    wait_completed_on(&f, "nginx:1.27", 90).await;
    f.patch_spec(json!({"image": "nginx:1.28"}));
    wait_completed_on(&f, "nginx:1.28", 120).await;
    let phases = Arc::new(Mutex::new(Vec::new()));
    let seen = phases.clone();
    let rollouts = f.api::<CanaryDeployment>();
    let recorder = tokio::spawn(async move {
        let mut s = watcher(rollouts, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(d)) = s.next().await {
            seen.lock().unwrap().push(phase_of(&d));
        }
    });
    f.api::<CanaryDeployment>()
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"strategy": {"type": "Rollback"}}})),
        )
        .await
        .unwrap();
    f.wait_event_reasons(&["SpecDrift"], 15).await;
    f.wait_for("Git's strategy back", 15, |d: &CanaryDeployment| {
        d.spec.strategy.type_ == linnet::api::DeploymentStrategyType::Batches
    })
    .await;
    // Long enough for a rollback to have started, had the edit been acted on.
    support::holds_for(
        "no rollback for the edit",
        std::time::Duration::from_secs(5),
        || {
            let phases = phases.lock().unwrap().clone();
            async move {
                match phases
                    .iter()
                    .all(|p| *p == Some(DeploymentPhase::Completed))
                {
                    true => Ok(()),
                    false => Err(format!("the edit was acted on: {phases:?}")),
                }
            }
        },
    )
    .await;
    recorder.abort();
    wait_completed_on(&f, "nginx:1.28", 10).await;
    assert_eq!(
        replicas_by_image(&f).await,
        BTreeMap::from([("nginx:1.28".to_string(), 4)])
    );
}

/// Issue 51, the neighbour of the CanaryStatefulSet case: a CanaryDeployment that starts as
/// Git asks writes one status (Completed, with what kstatus reads) and no event.
#[tokio::test]
async fn a_new_rollout_that_starts_as_git_asks_writes_one_status_and_no_event() {
    let mut f = Fixture::prepare("cd-first", |ns| web(ns, json!({}))).await;
    let statuses = f.record_statuses(|d: CanaryDeployment| d.status);
    f.start_agent().await;
    let done = wait_completed_on(&f, "nginx:1.27", 90).await;
    let status = done.status.unwrap();
    assert_eq!(status.observed_generation, done.metadata.generation);
    let ready = linnet::api::find_condition(&status.conditions, "Ready");
    assert_eq!(ready.map(|c| c.status.as_str()), Some("True"));
    // Regression (CI, under load): the recording watch showed the status after the GET above.
    support::eventually("the status recorded", Duration::from_secs(10), || {
        let n = statuses.lock().unwrap().len();
        async move { (n > 0).then_some(()) }
    })
    .await;
    support::holds_for(
        "one status: Completed",
        std::time::Duration::from_secs(2),
        || {
            let seen = statuses.lock().unwrap().clone();
            async move {
                let phases: Vec<_> = seen.iter().map(|s| s.phase).collect();
                match phases == vec![Some(DeploymentPhase::Completed)] {
                    true => Ok(()),
                    false => Err(format!("{seen:#?}")),
                }
            }
        },
    )
    .await;
    let reasons = f.event_reasons_of("CanaryDeployment").await;
    assert!(
        reasons.is_empty(),
        "no event for an ordinary start: {reasons:?}"
    );
}

/// A CanaryDeployment has no finalizer, so no reconcile sees it once it is deleted. One pruned
/// while its first status waited stayed counted: in the phase metric and in the wait of later
/// new rollouts (issue 51). The rollout watch's deletion takes it out of both.
#[tokio::test]
async fn a_canary_deployment_deleted_while_its_first_status_waits_leaves_no_count() {
    let broken = json!({"image": "nginx:broken", "template": {"template": {"spec": {
        "containers": [{"name": "web", "image": "nginx:broken"}]}}}});
    let mut f = Fixture::prepare("dep-gone", |ns| web(ns, broken)).await;
    let args = ["--prune", "--allow-empty", "--first-status-wait=10m"].map(String::from);
    f.start_agent_with(&args).await;
    let initializing = r#"linnet_rollouts{kind="CanaryDeployment",phase="Initializing"} 1"#;
    support::eventually("the rollout counted", Duration::from_secs(60), || async {
        let metrics = f.agent.as_ref().unwrap().metrics().await;
        metrics.contains(initializing).then_some(())
    })
    .await;
    let young: CanaryDeployment = f.api().get("web").await.unwrap();
    assert!(
        phase_of(&young).is_none(),
        "its first status waits: {young:?}"
    );

    f.write_file("rollout.yaml", &[]);
    let rollouts = f.api::<CanaryDeployment>();
    support::eventually("the rollout pruned", Duration::from_secs(60), || async {
        rollouts
            .get_opt("web")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let gone = r#"linnet_rollouts{kind="CanaryDeployment",phase="Initializing"} 0"#;
    support::eventually("the count back to 0", Duration::from_secs(30), || async {
        let metrics = f.agent.as_ref().unwrap().metrics().await;
        metrics.contains(gone).then_some(())
    })
    .await;
}
