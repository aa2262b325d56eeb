//! `make bench`, fleets (issue 73): three local control planes, one repository served over
//! smart HTTP whose push hook sends a webhook to every agent (for the followed branch and
//! the status branch), and three agents in waves (eu-1, then eu-2, then us-1; 5 s bakes).
//! Each agent reaches Git through a proxy of its own that counts its bytes. It measures:
//! - a wave's bake end -> the next wave's first canary pod: from the moment the earlier
//!   cluster's bake ends (its status file's `since` plus the bake) to the first pod of the new
//!   image in the next cluster, for each image and each of the two transitions;
//! - Git traffic per agent at rest: bytes and connections over an idle window with the
//!   default 60 s poll, as per hour.
//!
//! Writes bench/FLEET.md between its markers. `LINNET_BENCH_FLEET_ROUNDS` (3) images,
//! `LINNET_BENCH_FLEET_IDLE_SECS` (180).
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;
use support::agent::{Agent, SECRET, start_agent_env, wait_ready};
use support::bench::{env_or, sh};
use support::fleet::{Member, completed_since, push, start_clusters, three_members};
use support::stall::StallProxy;
use support::{git_http, push_hook};

const BAKE: i64 = 5;
const FLEET: &str = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: Fleet
metadata:
  name: shop
spec:
  waves:
  - {name: canary, clusters: [eu-1], bakeSeconds: 5}
  - {name: europe, clusters: [eu-2], bakeSeconds: 5}
  - {name: rest, matchLabels: {}}
";

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("fleet: a benchmark; run it with `make bench`");
        return;
    }
    let rounds: usize = env_or("LINNET_BENCH_FLEET_ROUNDS", 3);
    let idle: u64 = env_or("LINNET_BENCH_FLEET_IDLE_SECS", 180);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let table = rt.block_on(run(rounds, idle));
    println!("{table}");
    let root = env!("CARGO_MANIFEST_DIR");
    let commit = sh("git", &["-C", root, "rev-parse", "--short", "HEAD"]);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let section = format!(
        "<!-- bench:begin (written by `make bench`; edit outside the markers) -->\n\
         Machine: {cores} cores. Commit `{commit}`. Run {}. {rounds} images through three \
         clusters (three control planes on this machine), webhooks on, 5 s bakes; {idle} s idle \
         at the default 60 s poll.\n\n{table}<!-- bench:end -->",
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
    );
    support::bench::write_section(
        &format!("{root}/bench/FLEET.md"),
        "Fleet benchmark results",
        &section,
    );
}

fn web(ns: &str, image: &str) -> String {
    let spec =
        support::rollout::batched_web(ns, json!({"image": image, "pause": "None", "replicas": 2}));
    serde_saphyr::to_string(&spec).unwrap()
}

/// When the first pod of `image` showed in `m`'s cluster (polled every 50 ms).
async fn first_pod(m: &Member, ns: &str, image: &str) -> jiff::Timestamp {
    let pods: Api<Pod> = Api::namespaced(m.client.clone(), ns);
    support::eventually(
        &format!("a pod of {image} in {}", m.name),
        Duration::from_secs(120),
        || async {
            let list = pods.list(&Default::default()).await.ok()?;
            let found = list.items.iter().any(|p| {
                p.spec.as_ref().is_some_and(|s| {
                    s.containers
                        .iter()
                        .any(|c| c.image.as_deref() == Some(image))
                })
            });
            found.then(jiff::Timestamp::now)
        },
    )
    .await
}

fn ms(d: jiff::SignedDuration) -> i64 {
    d.as_millis() as i64
}

async fn run(rounds: usize, idle: u64) -> String {
    let extra = start_clusters(&["fa", "fb"], 23910);
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "fleet-bench").await;
    let tmp = tempfile::tempdir().unwrap();
    let fleet = three_members(&extra, &ns.name, tmp.path()).await;
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    push(
        &work,
        &[
            ("fleet.yaml", FLEET),
            ("apps/web.yaml", &web(&ns.name, "web:1")),
        ],
        "web:1 and the fleet",
    );
    let server = git_http::serve(tmp.path().to_path_buf(), Some(("git", "t0ken")));
    let server_addr = server.trim_start_matches("http://").parse().unwrap();
    let token = tmp.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let proxies: Vec<StallProxy> = fleet
        .iter()
        .map(|_| StallProxy::start(server_addr))
        .collect();
    let agents: Vec<Agent> = fleet
        .iter()
        .zip(&proxies)
        .map(|(m, proxy)| {
            std::fs::create_dir_all(&m.dir).unwrap();
            let args = vec![
                format!("--repo-url={}/remote.git", proxy.http_base()),
                "--git-username=git".into(),
                format!("--git-password-file={}", token.display()),
                "--path=apps".into(),
                "--fleet=fleet.yaml".into(),
                format!("--cluster={}", m.name),
                format!("--cluster-label={}", m.labels),
                "--writeback-interval=300ms".into(),
                "--poll-interval=60s".into(),
            ];
            start_agent_env(&m.dir, &args, &ns.name, &m.kubeconfig, &[])
        })
        .collect();
    for a in &agents {
        wait_ready(a).await;
    }
    let hooks: Vec<String> = agents
        .iter()
        .map(|a| format!("{}/hooks/github", a.hooks))
        .collect();
    // curl posts the same event to every URL it is given.
    push_hook::install_github_push_hook(&bare, SECRET, &hooks.join(" ")).unwrap();
    for m in &fleet {
        completed_since(m, &ns.name, "web:1", 120).await;
    }

    let mut rows = String::from(
        "| image | eu-1 bake end -> eu-2 first canary pod | eu-2 bake end -> us-1 first canary pod |\n|---|---|---|\n",
    );
    let mut all = Vec::new();
    for round in 0..rounds {
        let image = format!("web:{}", round + 2);
        push(&work, &[("apps/web.yaml", &web(&ns.name, &image))], &image);
        let mut cells = Vec::new();
        for k in 0..2 {
            let done = completed_since(&fleet[k], &ns.name, &image, 120).await;
            let bake_end = done + jiff::SignedDuration::from_secs(BAKE);
            let first = first_pod(&fleet[k + 1], &ns.name, &image).await;
            let took = first.duration_since(bake_end);
            all.push(ms(took));
            cells.push(format!("{} ms", ms(took)));
        }
        completed_since(&fleet[2], &ns.name, &image, 120).await;
        rows += &format!("| {image} | {} | {} |\n", cells[0], cells[1]);
    }
    all.sort();
    let median = all[all.len() / 2];
    let max = all[all.len() - 1];

    // At rest: every agent settled; count each one's Git traffic over the idle window.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before: Vec<(u64, usize)> = proxies.iter().map(StallProxy::traffic).collect();
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let mut rest = String::from(
        "| agent | bytes in the window | connections | per hour |\n|---|---|---|---|\n",
    );
    for ((m, p), (b0, c0)) in fleet.iter().zip(&proxies).zip(before) {
        let (b1, c1) = p.traffic();
        let (bytes, conns) = (b1 - b0, c1 - c0);
        let per_hour = bytes as f64 * 3600.0 / idle as f64;
        rest += &format!(
            "| {} | {bytes} | {conns} | {:.1} KiB, {:.0} connections |\n",
            m.name,
            per_hour / 1024.0,
            conns as f64 * 3600.0 / idle as f64
        );
    }
    drop(agents);
    drop(extra);
    format!(
        "Bake end to the next wave's first canary pod (target: seconds, under one poll \
         interval): median {median} ms, max {max} ms over {} transitions.\n\n{rows}\n\
         Git traffic per agent at rest ({idle} s, default 60 s poll; each look asks for the \
         followed branch's and the status branch's tips):\n\n{rest}",
        all.len()
    )
}
