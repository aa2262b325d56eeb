//! Issue 73, the fleet soak: a fleet of three clusters with every other feature on, for longer
//! than the default drift interval (3 minutes). One repository (Flux's layout: a base and an
//! overlay per cluster), three local control planes and three agents, each checking drift
//! every 15 s and writing its status files back to Git. eu-1, the canary wave, runs `web` on
//! the real node behind the real gateway (Traefik) with traffic weights from its overlay;
//! eu-2 and us-1 run it on kwok. Every cluster gates each rollout on an analysis, and the
//! second wave also on the wave's analysis. Images are pushed to the base in pairs (the second
//! 20 s after the first, overtaking it; then 70 s for the fleet to move), for
//! `LINNET_FLEET_SOAK_SECS` (240 by default), and a request goes through the gateway every
//! 100 ms.
//!
//! Checked over the whole run, each a line of the report (`LINNET_FLEET_SOAK_REPORT`, else
//! target/fleet-soak.md):
//! - a cluster of a later wave started an image only after every cluster of the earlier waves
//!   had it Completed and baked (after the push that asked for it);
//! - no cluster went back to an image a later push replaced;
//! - the canary share at eu-1's gateway stays within the binomial's bounds of its weight, and
//!   no request fails;
//! - no agent reverted its own writes (the route's weights among them) as drift;
//! - while everything is settled (more than two drift intervals), no agent writes to its
//!   cluster or to Git;
//! - the status branch only moves forward, and ends with every cluster Completed on the last
//!   image;
//! - each agent's memory is flat.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use linnet::api::CanaryDeployment;
use serde_json::{Value, json};
use support::agent::{Agent, start_agent_env, wait_ready};
use support::fleet::{Hooks, Member, push, relay_webhooks, start_clusters, three_members, web_of};
use support::gateway::{Converger, Gateway, http_route};
use support::soak::{
    Checks, Samples, Weighed, canary_share, failed_requests, gateway_answering, listed,
    memory_flat, requests_every_100ms, rss_kib, stretches_of,
};
use support::{git, node};

const PORT: u16 = 8080;
const DRIFT: &str = "15s";
const TAGS: [&str; 3] = ["v1", "v2", "v3"];
/// Each cluster's wave, and that wave's bake in seconds.
const WAVES: [(&str, usize, i64); 3] = [("eu-1", 0, 8), ("eu-2", 1, 8), ("us-1", 2, 0)];

const FLEET: &str = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: Fleet
metadata:
  name: shop
spec:
  waves:
  - name: canary
    clusters: [eu-1]
    bakeSeconds: 8
  - name: europe
    matchLabels: {region: eu}
    bakeSeconds: 8
    analysis:
      templates: [{templateName: wave-health}]
  - name: rest
    matchLabels: {}
";

fn image(tag: &str) -> String {
    format!("{}:{tag}", node::KV_IMAGE)
}

/// The base's `web`: two batches, each gated by the analysis `health`.
fn base_web(ns: &str, tag: &str) -> String {
    let spec = support::rollout::batched_web(
        ns,
        json!({"image": image(tag), "pause": "None", "rollbackOnFailure": true,
               "progressDeadlineSeconds": 120, "replicas": 2,
               "analysis": {"gates": [{"after": 1, "templates": [{"templateName": "health"}]}]}}),
    );
    serde_saphyr::to_string(&spec).unwrap()
}

/// AnalysisTemplate `name`: the test's web endpoint, which always answers ok.
fn health(ns: &str, name: &str, port: u16) -> String {
    let t = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"metrics": [{"name": "health", "successCondition": "result == true",
            "count": 2, "interval": "1s",
            "provider": {"web": {"url": format!("http://127.0.0.1:{port}/health"),
                                 "jsonPath": "$.data.ok"}}}]}
    });
    serde_saphyr::to_string(&t).unwrap()
}

/// eu-1's patch of the base: three replicas of the key-value server on the real node (serving
/// 8 s after being told to stop, as behind a load balancer), behind its HTTPRoute with weights.
fn eu1_patch(ns: &str) -> String {
    let mut container = node::kv_container("v1");
    container["name"] = json!("web");
    container["lifecycle"] = json!({"preStop": {"sleep": {"seconds": 8}}});
    container["volumeMounts"] = json!([]);
    let mut pod =
        json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [container]}});
    node::on_node(&mut pod);
    pod["spec"]["terminationGracePeriodSeconds"] = json!(15);
    let patch = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryDeployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": 3,
            "trafficRouting": {
                "gatewayAPI": {"httpRoutes": ["web"], "port": PORT},
                "weights": [30, 100],
                "settleSeconds": 3,
            },
            "template": {"template": pod},
        }
    });
    serde_saphyr::to_string(&patch).unwrap()
}

/// The repository's first commit: the fleet, the base on v1, an overlay per cluster.
fn push_first(work: &Path, ns: &str, health_port: u16) {
    let route = serde_saphyr::to_string(&http_route(ns, "web", "web-stable", PORT)).unwrap();
    let plain = "resources: [../../base]\n";
    let files = [
        ("fleet.yaml", FLEET.to_string()),
        ("base/web.yaml", base_web(ns, "v1")),
        ("base/health.yaml", health(ns, "health", health_port)),
        (
            "base/wave-health.yaml",
            health(ns, "wave-health", health_port),
        ),
        (
            "base/kustomization.yaml",
            "resources: [web.yaml, health.yaml, wave-health.yaml]\n".into(),
        ),
        (
            "clusters/eu-1/kustomization.yaml",
            "resources: [../../base, route.yaml]\npatches:\n- path: web-on-node.yaml\n".into(),
        ),
        ("clusters/eu-1/route.yaml", route),
        ("clusters/eu-1/web-on-node.yaml", eu1_patch(ns)),
        ("clusters/eu-2/kustomization.yaml", plain.into()),
        ("clusters/us-1/kustomization.yaml", plain.into()),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    push(work, &files, "web on v1, its overlays and the fleet");
}

fn start(m: &Member, bare: &Path, ns: &str) -> Agent {
    std::fs::create_dir_all(&m.dir).unwrap();
    let args = vec![
        format!("--repo-url=file://{}", bare.display()),
        format!("--path=clusters/{}", m.name),
        "--fleet=fleet.yaml".into(),
        format!("--cluster={}", m.name),
        format!("--cluster-label={}", m.labels),
        "--writeback-interval=300ms".into(),
        format!("--drift-interval={DRIFT}"),
    ];
    let render = support::render_env();
    let env: Vec<(&str, &str)> = render
        .iter()
        .map(|(k, v)| (*k, v.to_str().unwrap()))
        .collect();
    start_agent_env(&m.dir, &args, ns, &m.kubeconfig, &env)
}

/// `web`'s status in one cluster, as sampled.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    phase: String,
    weight: i32,
    stable: String,
    canary: String,
    since: Option<Timestamp>,
    current: bool,
}

fn seen(d: &CanaryDeployment) -> Seen {
    let s = d.status.clone().unwrap_or_default();
    Seen {
        phase: s.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
        weight: s.canary_weight.unwrap_or(0),
        stable: s.stable_image.unwrap_or_default(),
        canary: s.canary_image.unwrap_or_default(),
        since: s.phase_since.map(|t| t.0),
        current: s.observed_generation == d.metadata.generation,
    }
}

impl Seen {
    fn settled_on(&self, image: &str) -> bool {
        self.phase == "Completed" && self.current && self.stable == image
    }

    fn rolling(&self) -> Option<&str> {
        let moving = matches!(self.phase.as_str(), "Progressing" | "Paused");
        (moving && !self.canary.is_empty() && self.canary != self.stable)
            .then_some(self.canary.as_str())
    }
}

/// One sampled change: when (monotonic and wall clock), which cluster (index in `WAVES`).
type Change = (Instant, Timestamp, usize, Seen);

#[derive(Default)]
struct Record {
    changes: Vec<Change>,
    /// (wall time, image) of each push.
    pushes: Vec<(Timestamp, String)>,
    /// The status branch's tips, in the order seen.
    status_tips: Vec<String>,
    /// Each agent's RSS in KiB, every 5 s.
    memory: [Vec<u64>; 3],
}

/// Samples every cluster's `web` every 250 ms, the status branch's tip and the agents' memory.
fn record(
    fleet: &[Member],
    ns: &str,
    bare: &Path,
    pids: [u32; 3],
    rec: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let apis: Vec<Api<CanaryDeployment>> = fleet
        .iter()
        .map(|m| Api::namespaced(m.client.clone(), ns))
        .collect();
    let bare = bare.to_path_buf();
    tokio::spawn(async move {
        let mut last: [Option<Seen>; 3] = Default::default();
        let mut ticks = 0u64;
        while !stop.load(Ordering::SeqCst) {
            for (i, api) in apis.iter().enumerate() {
                if let Ok(Some(d)) = api.get_opt("web").await {
                    let s = seen(&d);
                    if last[i].as_ref() != Some(&s) {
                        let at = (Instant::now(), Timestamp::now());
                        rec.lock().unwrap().changes.push((at.0, at.1, i, s.clone()));
                        last[i] = Some(s);
                    }
                }
            }
            if ticks.is_multiple_of(4) {
                let tip = status_tip(&bare);
                let mut r = rec.lock().unwrap();
                if tip.is_some() && r.status_tips.last() != tip.as_ref() {
                    r.status_tips.extend(tip);
                }
            }
            if ticks.is_multiple_of(20) {
                let mut r = rec.lock().unwrap();
                for (i, pid) in pids.iter().enumerate() {
                    r.memory[i].extend(rss_kib(*pid));
                }
            }
            ticks += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

fn status_tip(bare: &Path) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--verify", "-q", "refs/heads/linnet/status"])
        .current_dir(bare)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// What a settled cluster has that any write would change: `web`'s resourceVersion and its
/// Deployments' and (eu-1) route's generations.
async fn at_rest(m: &Member, ns: &str) -> String {
    let web = web_of(m, ns)
        .await
        .and_then(|d| d.metadata.resource_version);
    let mut sets: Vec<(String, i64)> = Api::<Deployment>::namespaced(m.client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|d| {
            (
                d.metadata.name.unwrap_or_default(),
                d.metadata.generation.unwrap_or(0),
            )
        })
        .collect();
    sets.sort();
    // Only eu-1 serves the Gateway API; elsewhere the route's kind is not found.
    let route = match support::gateway::routes(&m.client, ns).get_opt("web").await {
        Ok(route) => route.map(|r| r.metadata.generation),
        Err(kube::Error::Api(e)) if e.code == 404 => None,
        Err(e) => panic!("reading {}'s route: {e}", m.name),
    };
    format!("web {web:?}, deployments {sets:?}, route {route:?}")
}

/// Each start of an image in a later wave, checked against the earlier waves' clusters:
/// (starts checked, starts too early, starts of an image a later push had replaced).
fn wave_order(rec: &Record) -> (usize, Vec<String>, Vec<String>) {
    let (mut checked, mut early, mut back) = (0, Vec::new(), Vec::new());
    let first_push = rec.pushes.first().map(|(t, _)| *t);
    for (i, (cluster, wave, _)) in WAVES.into_iter().enumerate() {
        let mine: Vec<&Change> = rec.changes.iter().filter(|c| c.2 == i).collect();
        let mut last_push = None;
        for (n, (_, wall, _, s)) in mine.iter().enumerate() {
            let Some(x) = s.rolling() else { continue };
            let started = n == 0 || mine[n - 1].3.rolling() != Some(x);
            if !started || first_push.is_none_or(|p| *wall < p) {
                continue;
            }
            // The push this start answers: the last one of the image before it.
            let Some(push) = rec
                .pushes
                .iter()
                .enumerate()
                .rev()
                .find(|(_, (t, img))| t <= wall && img == x)
            else {
                back.push(format!("{cluster} started {x} at {wall}, never pushed"));
                continue;
            };
            if last_push.is_some_and(|l| push.0 < l) {
                back.push(format!("{cluster} went back to {x} at {wall}"));
            }
            last_push = Some(push.0);
            checked += 1;
            if wave == 0 {
                continue;
            }
            for (e, (earlier, _, bake)) in WAVES.iter().enumerate().filter(|(_, w)| w.1 < wave) {
                let baked = rec.changes.iter().any(|(_, at, c, d)| {
                    *c == e
                        && at <= wall
                        && d.settled_on(x)
                        && d.since.is_some_and(|since| {
                            since >= push.1.0 - jiff::SignedDuration::from_secs(1)
                                && since + jiff::SignedDuration::from_secs(*bake) <= *wall
                        })
                });
                if !baked {
                    early.push(format!(
                        "{cluster} started {x} at {wall} before {earlier} had it baked"
                    ));
                }
            }
        }
    }
    (checked, early, back)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_with_traffic_analysis_drift_and_write_back_holds_over_time() {
    let run_for = Duration::from_secs(
        std::env::var("LINNET_FLEET_SOAK_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(240),
    );
    let report_path = std::env::var("LINNET_FLEET_SOAK_REPORT").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/fleet-soak.md").to_string()
    });
    let admin = support::admin_client().await;
    if !node::require(&admin).await {
        return;
    }
    let extra = start_clusters(&["sb", "sc"], 23910);
    support::install_linnet(&admin).await;
    support::gateway::install_gateway_api(&admin).await;
    let ns = support::TestNamespace::create(&admin, "fleet-soak").await;
    let tmp = tempfile::tempdir().unwrap();
    let fleet = three_members(&extra, &ns.name, tmp.path()).await;
    let gateway = Gateway::start(&admin, &ns.name).await;
    let health_port = support::web_gate(Arc::new(AtomicBool::new(true))).await;
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    push_first(&work, &ns.name, health_port);
    let agents: Vec<Agent> = fleet.iter().map(|m| start(m, &bare, &ns.name)).collect();
    for a in &agents {
        wait_ready(a).await;
    }
    let hooks: Hooks = Arc::new(Mutex::new(agents.iter().map(|a| a.hooks.clone()).collect()));
    let relay = relay_webhooks(hooks);
    let t0 = Instant::now();
    let rec = Arc::new(Mutex::new(Record::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let pids = [0, 1, 2].map(|i| agents[i].child.id());
    let sampler = record(&fleet, &ns.name, &bare, pids, rec.clone(), stop.clone());
    let samples: Samples = Default::default();
    let traffic = requests_every_100ms(gateway.url(), samples.clone(), stop.clone());
    let converger = Converger::start(
        &gateway,
        &admin,
        &ns.name,
        "web",
        &["web-stable", "web-canary"],
    );

    let all_settled = |image: String| {
        let rec = rec.clone();
        move || {
            let rec = rec.lock().unwrap();
            let ok = (0..3).all(|i| {
                rec.changes
                    .iter()
                    .rev()
                    .find(|c| c.2 == i)
                    .is_some_and(|c| c.3.settled_on(&image))
            });
            async move { ok.then_some(()) }
        }
    };
    support::eventually(
        "every cluster settled on v1",
        Duration::from_secs(240),
        all_settled(image("v1")),
    )
    .await;
    gateway_answering(&samples).await;
    eprintln!(
        "fleet soak: settled on v1, the gateway answering, after {:.0} s",
        t0.elapsed().as_secs_f64()
    );

    // Pairs of pushes: the second overtakes the first; then the fleet has time to move.
    let started = Instant::now();
    let mut n = 0usize;
    let mut next = started;
    while started.elapsed() < run_for {
        n += 1;
        let tag = TAGS[n % 3];
        push(
            &work,
            &[("base/web.yaml", &base_web(&ns.name, tag))],
            &format!("web to {tag}"),
        );
        rec.lock()
            .unwrap()
            .pushes
            .push((Timestamp::now(), image(tag)));
        next += Duration::from_secs(if n % 2 == 1 { 20 } else { 70 });
        tokio::time::sleep_until(next.into()).await;
    }
    let last = image(TAGS[n % 3]);
    support::eventually(
        &format!("every cluster settled on {last}"),
        Duration::from_secs(300),
        all_settled(last.clone()),
    )
    .await;
    // At rest for more than two drift intervals: nothing written anywhere.
    let before = futures::future::join_all(fleet.iter().map(|m| at_rest(m, &ns.name))).await;
    let tip_before = status_tip(&bare);
    support::let_time_pass(
        "a quiet stretch of two drift intervals",
        Duration::from_secs(35),
    )
    .await;
    let after = futures::future::join_all(fleet.iter().map(|m| at_rest(m, &ns.name))).await;
    let tip_after = status_tip(&bare);
    stop.store(true, Ordering::SeqCst);
    let nudges = converger.stop().await;
    sampler.await.unwrap();
    traffic.join().unwrap();
    relay.abort();
    let ended = Instant::now();

    let rec = rec.lock().unwrap();
    let mut checks = Checks::default();
    let (checked, early, back) = wave_order(&rec);
    checks.check(
        "a later wave starts an image only once every earlier wave's cluster has it Completed and baked",
        early.is_empty() && checked >= 3,
        format!("{checked} starts checked{}", listed("; ", &early, "; ")),
    );
    checks.check(
        "no cluster goes back to an image a later push replaced",
        back.is_empty(),
        format!("{} pushes{}", rec.pushes.len(), listed("; ", &back, "; ")),
    );
    let completed: Vec<String> = WAVES
        .iter()
        .enumerate()
        .map(|(i, (name, _, _))| {
            let mut images: Vec<&str> = rec
                .changes
                .iter()
                .filter(|c| c.2 == i && c.3.phase == "Completed")
                .map(|c| c.3.stable.as_str())
                .collect();
            images.dedup();
            format!("{name} {}", images.len())
        })
        .collect();
    checks.check(
        "every cluster moves: images Completed in turn per cluster",
        !rec.changes.is_empty(),
        completed.join(", "),
    );

    let weighed = stretches_of(
        rec.changes
            .iter()
            .filter(|c| c.2 == 0)
            .map(|(at, _, _, s)| Weighed {
                at: *at,
                weight: s.weight,
                stable: s.stable.clone(),
                canary: s.canary.clone(),
            }),
    );
    let samples = samples.lock().unwrap();
    let (stretches, requests, off) = canary_share(&weighed, &samples, ended, t0);
    let failed = failed_requests(&samples, started, t0);
    let sent = samples.iter().filter(|(t, _)| *t >= started).count();
    drop(samples);
    checks.check(
        "eu-1's canary share at the gateway within the binomial bounds of its weight",
        off.is_empty() && stretches > 0,
        format!(
            "{stretches} stretches of one weight, {requests} requests checked{}",
            listed("; off: ", &off, "; ")
        ),
    );
    let failed_count: usize = failed.values().map(Vec::len).sum();
    checks.check(
        "no request through eu-1's gateway failed",
        failed_count == 0,
        format!("{sent} sent, {failed_count} failed {failed:?}, gateway nudged {nudges} time(s)"),
    );
    let logs: Vec<String> = agents.iter().map(Agent::log_text).collect();
    let reverted: Vec<String> = logs
        .iter()
        .zip(WAVES)
        .map(|(l, (name, _, _))| {
            format!(
                "{name} {} reverts in {} drift checks",
                l.matches("reverted changes made outside Git").count(),
                l.matches("drift interval").count()
            )
        })
        .collect();
    checks.check(
        "no agent reverted its own writes (the route's weights among them) as drift",
        logs.iter()
            .all(|l| !l.contains("reverted changes made outside Git")),
        reverted.join(", "),
    );
    let moved: Vec<String> = before
        .iter()
        .zip(&after)
        .zip(WAVES)
        .filter(|((b, a), _)| b != a)
        .map(|((b, a), (name, _, _))| format!("{name}: {b} → {a}"))
        .collect();
    checks.check(
        "no writes to any cluster or to Git while settled (35 s, two drift intervals)",
        moved.is_empty() && tip_before == tip_after,
        format!(
            "status branch {}{}",
            if tip_before == tip_after {
                "unchanged"
            } else {
                "moved"
            },
            listed("; ", &moved, "; ")
        ),
    );
    let forced: Vec<String> = rec
        .status_tips
        .windows(2)
        .filter(|w| {
            !std::process::Command::new("git")
                .args(["merge-base", "--is-ancestor", &w[0], &w[1]])
                .current_dir(&bare)
                .status()
                .unwrap()
                .success()
        })
        .map(|w| format!("{} → {}", &w[0][..8], &w[1][..8]))
        .collect();
    let files_off: Vec<String> = WAVES
        .iter()
        .filter_map(|(name, _, _)| {
            let path = linnet::api::status_paths::path(name, &ns.name, "web");
            let text = git(&bare, &["show", &format!("linnet/status:{path}")]);
            let doc: Value = serde_saphyr::from_str(&text).unwrap();
            (doc["phase"] != "Completed" || doc["images"]["stable"] != last.as_str())
                .then(|| format!("{name}: {} on {}", doc["phase"], doc["images"]))
        })
        .collect();
    checks.check(
        "the status branch only moves forward and ends on the last image in every cluster",
        forced.is_empty() && files_off.is_empty(),
        format!(
            "{} tips seen{}{}",
            rec.status_tips.len(),
            listed("; not a descendant: ", &forced, ", "),
            listed("; ", &files_off, "; ")
        ),
    );
    let memory: Vec<String> = WAVES
        .iter()
        .enumerate()
        .map(|(i, (name, _, _))| {
            let (flat, first, second) = memory_flat(&rec.memory[i]);
            format!(
                "{name} {first}→{second} MiB{}",
                if flat { "" } else { " (grew)" }
            )
        })
        .collect();
    checks.check(
        "each agent's memory flat (peak of the second half within 20 % + 8 MiB of the first's)",
        (0..3).all(|i| memory_flat(&rec.memory[i]).0),
        memory.join(", "),
    );
    let text = format!(
        "# Fleet soak\n\n`LINNET_FLEET_SOAK_SECS={}`, drift checks every {DRIFT}: three clusters \
         (eu-1 on the real node behind Traefik), {} pushes in pairs, {} status changes sampled. \
         Written {}.\n\n{}",
        run_for.as_secs(),
        rec.pushes.len(),
        rec.changes.len(),
        Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
        checks.table()
    );
    std::fs::write(&report_path, &text).unwrap();
    eprintln!("{text}");
    assert!(
        checks.failures.is_empty(),
        "the fleet soak broke:\n{}",
        checks.failures.join("\n")
    );
    drop(agents);
    drop(extra);
}
