//! `make bench`, the real node (issue 68): how long a change takes to show in pods that really
//! run, with their data. A CanaryStatefulSet of the tests' key-value server (3 replicas, a
//! volume each) on the real node (`tests/node/`); each round writes a key to every replica,
//! then measures:
//! - push -> canary serving its replica's old data: from the spec's new image on disk (what a
//!   sync sees) to the canary pod, Ready on the new version, answering the key replica 2 held;
//! - abort -> stable serving again: from the abort annotation to replica 2's stable pod, Ready
//!   on the old version, answering that key (and the one the canary took).
//!
//! and the CPU and memory of the node (kubelet, containerd), the agent and the control plane
//! (kube-apiserver, etcd) over the rounds. Prints a table and writes it into bench/RESULTS.md
//! between its `node` markers. `LINNET_BENCH_NODE_ROUNDS` (4).
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use linnet::api::{CanaryStatefulSet, StatefulSetPhase};
use serde_json::json;
use support::bench::{env_or, sh};
use support::node;
use support::rollout::Fixture;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("node: a benchmark; run it with `make bench`");
        return;
    }
    let rounds: usize = env_or("LINNET_BENCH_NODE_ROUNDS", 4);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    match rt.block_on(run(rounds)) {
        Ok(Some(table)) => {
            println!("{table}");
            let root = env!("CARGO_MANIFEST_DIR");
            let commit = sh("git", &["-C", root, "rev-parse", "--short", "HEAD"]);
            let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
            let section = format!(
                "<!-- bench:begin (written by `make bench`; edit outside the markers) -->\n\
                 Machine: {cores} cores. Commit `{commit}`. Run {}. {rounds} rounds on the real node.\n\n{table}<!-- bench:end -->",
                sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            );
            support::bench::write_section(
                &format!("{root}/bench/NODE.md"),
                "Real-node benchmark results",
                &section,
            );
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("bench: failed: {e}");
            std::process::exit(1);
        }
    }
}

fn pid_of(comm: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
        (std::fs::read_to_string(e.path().join("comm")).ok()?.trim() == comm).then_some(pid)
    })
}

/// (name, pid) of what the table reports.
fn processes(agent: u32) -> Vec<(&'static str, u32)> {
    let mut out = vec![("agent", agent)];
    for (name, comm) in [
        ("kubelet", "kubelet"),
        ("containerd", "containerd"),
        ("kube-apiserver", "kube-apiserver"),
        ("etcd", "etcd"),
    ] {
        if let Some(pid) = pid_of(comm) {
            out.push((name, pid));
        }
    }
    out
}

async fn until<T, F, Fut>(what: &str, secs: u64, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {secs} s"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The IP of `pod` once Ready, answering `version` and holding `key`.
async fn serving_key(pods: &Api<Pod>, pod: &str, version: &str, key: &str) -> Option<String> {
    let p = pods.get_opt(pod).await.ok()??;
    let status = p.status?;
    let ready = status
        .conditions?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip = status.pod_ip?;
    if !ready || node::version(&ip).await != version {
        return None;
    }
    let (code, _) = node::get(&ip, &format!("/kv/{key}")).await.ok()?;
    (code == 200).then_some(ip)
}

async fn run(rounds: usize) -> Result<Option<String>, String> {
    let admin = support::admin_client().await;
    if !node::require(&admin).await {
        return Ok(None);
    }
    let mut f = Fixture::start("bench-node", |ns| {
        node::kv_rollout(ns, "v1", json!({"progressDeadlineSeconds": 120}))
    })
    .await;
    let pods = f.api::<Pod>();
    let rollouts = f.api::<CanaryStatefulSet>();
    let stable_v1 = || async {
        let r = rollouts.get_opt("kv").await.ok()??;
        let s = r.status?;
        (s.phase == Some(StatefulSetPhase::Stable)
            && s.stable_image.as_deref() == Some("linnet.test/kv:v1")
            && s.ready.as_deref() == Some("3/3"))
        .then_some(())
    };
    until("Stable on v1", 180, stable_v1).await?;
    let agent = f.agent.as_ref().unwrap().child.id();
    let procs = processes(agent);
    let before: Vec<(f64, f64)> = procs
        .iter()
        .map(|(_, pid)| support::process::usage(*pid).unwrap_or_default())
        .collect();
    let started = Instant::now();
    let (mut to_canary, mut to_stable) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let tag = if round % 2 == 0 { "v2" } else { "v3" };
        let key = format!("bench-{round}");
        for k in 0..3 {
            let ip = node::ready_pod_ip(&pods, &format!("kv-stable-{k}"), 60).await;
            node::put(&ip, &key, "v").await?;
        }
        let t0 = Instant::now();
        f.patch_spec(json!({"image": format!("linnet.test/kv:{tag}")}));
        until("the canary serving replica 2's key", 120, || {
            serving_key(&pods, "kv-canary-2", tag, &key)
        })
        .await?;
        to_canary.push(t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        f.annotate(linnet::api::ABORT_ANNOTATION, "true");
        until("the stable pod serving replica 2's key again", 120, || {
            serving_key(&pods, "kv-stable-2", "v1", &key)
        })
        .await?;
        to_stable.push(t1.elapsed().as_secs_f64());
        eprintln!(
            "round {round}: push -> canary serving {:.2} s, abort -> stable serving {:.2} s",
            to_canary[round], to_stable[round]
        );
        // Back to v1 in Git, the abort taken off, before the next round.
        f.patch_spec(json!({"image": "linnet.test/kv:v1"}));
        let mut meta = f.spec["metadata"].clone();
        meta["annotations"]
            .as_object_mut()
            .map(|a| a.remove(linnet::api::ABORT_ANNOTATION));
        f.spec["metadata"] = meta;
        f.write();
        until("Stable on v1 again", 180, stable_v1).await?;
    }
    let wall = started.elapsed().as_secs_f64();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        (v[v.len() / 2], v[v.len() - 1])
    };
    let (c_med, c_max) = median(&mut to_canary);
    let (s_med, s_max) = median(&mut to_stable);
    let mut table = String::from("| measure | median | max |\n|---|---:|---:|\n");
    table += &format!(
        "| push -> canary pod serving its replica's old data | {c_med:.2} s | {c_max:.2} s |\n"
    );
    table += &format!("| abort -> stable pod serving again | {s_med:.2} s | {s_max:.2} s |\n");
    table += &format!(
        "\nOver the {rounds} rounds ({wall:.0} s), CPU as a share of one core and resident memory at the end:\n\n\
         | process | CPU | RSS |\n|---|---:|---:|\n"
    );
    for ((name, pid), (_, cpu0)) in procs.iter().zip(&before) {
        let (rss, cpu) = support::process::usage(*pid).unwrap_or_default();
        table += &format!(
            "| {name} | {:.1} % | {rss:.1} MiB |\n",
            (cpu - cpu0) / wall * 100.0
        );
    }
    Ok(Some(table))
}
