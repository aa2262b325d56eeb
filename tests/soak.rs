//! Issue 69, the soak: every feature on at once, over time, on pods that really run. A
//! batched CanaryDeployment `web` with baseline pods behind the real gateway (Traefik) with an analysis gate on
//! the gateway's metrics through Prometheus, a TwoSets CanaryStatefulSet `kv` with
//! versionedConfig, and a Partition one `kvp`; write-back with commit statuses; notifications
//! to a signed webhook receiver that answers 503 to every third request; drift checks every
//! `LINNET_SOAK_DRIFT` (10 s); a push every 30 s changing one rollout in turn; a request
//! through the gateway every 100 ms. `web`'s turn is an image pushed to a registry, not a
//! Git push: the image automation (an `ImagePolicy`, scans every 2 s) commits the new tag to
//! Git, and the node's containerd pulls it from the registry. It runs `LINNET_SOAK_SECS` (180 in `make test`, 3600 in
//! `make soak`) and writes its report to `LINNET_SOAK_REPORT` (bench/SOAK.md for `make soak`).
//!
//! Checked over the whole run, each a line of the report:
//! - the canary share of the sampled requests stays within the binomial's bounds of the
//!   weight the rollout's status shows (each stretch of one weight, after 5 s for the
//!   gateway to take it);
//! - no pod is made or deleted outside a rollout's run (from the push that changed it until
//!   it settled);
//! - no write by linnet to the namespace while everything is settled (the audit log; the
//!   Lease renewals excepted);
//! - each rollout's CanaryStarted and Promoted reach the receiver exactly once per push;
//! - each pushed commit ends with a `success` commit status for the rollout it changed, and
//!   the status files on `linnet/status` end on the last images;
//! - the agent never reverted its own writes as drift, and its memory is flat.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use linnet::api::{CanaryDeployment, CanaryStatefulSet};
use serde_json::{Value, json};
use support::agent::{Agent, start_agent, wait_ready};
use support::gateway::{Converger, Gateway, http_route};
use support::prometheus::Prometheus;
use support::soak::{
    Checks, Samples, Weighed, canary_share, failed_requests, gateway_answering, listed,
    memory_flat, requests_every_100ms, rss_kib, stretches_of,
};
use support::{TestNamespace, admin_client, git, install_linnet, node};

#[path = "soak/web_images.rs"]
mod web_images;
use web_images::WebImages;

const PORT: u16 = 8080;
const PUSH_EVERY: Duration = Duration::from_secs(30);
const APPS: [&str; 3] = ["web", "kv", "kvp"];
const TAGS: [&str; 3] = ["v1", "v2", "v3"];

fn env_secs(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn secs_since(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64()
}

// ---- the specs -------------------------------------------------------------------------

/// A pod of app `app` on the real node running the key-value server, which answers its
/// image's name on `/`. Behind the gateway (`web`, no volume) it keeps serving 8 s after it
/// is told to stop, as a pod behind a load balancer should: Traefik 3.6.12 ignores an EndpointSlice change of conditions alone
/// (a pod terminating), so the test's Converger makes it current within its 3 s and Traefik's
/// 2 s throttle (tests/support/gateway.rs); with 2 s, one request in about 2,000 reached a
/// stopped pod (502).
fn real_pod(app: &str, volume: bool) -> Value {
    let mut container = node::kv_container("v1");
    container["name"] = json!(app);
    let stopping = if volume { 2 } else { 8 };
    container["lifecycle"] = json!({"preStop": {"sleep": {"seconds": stopping}}});
    if !volume {
        container["volumeMounts"] = json!([]);
    }
    let mut pod =
        json!({"metadata": {"labels": {"app": app}}, "spec": {"containers": [container]}});
    node::on_node(&mut pod);
    pod["spec"]["terminationGracePeriodSeconds"] = json!(stopping + 7);
    pod
}

fn web(ns: &str, image: &str, prometheus: &str) -> Value {
    let mut pod = real_pod("web", false);
    // Pulled from the soak's registry by the node's containerd.
    pod["spec"]["containers"][0]["image"] = json!(image);
    pod["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryDeployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": 3,
            "image": image,
            // Baseline pods beside each batch (issue 75): they get the canary's share of the
            // routes, answer with the stable image, and go once the routes settle.
            "strategy": {"type": "Batches", "baseline": true},
            "batches": 2,
            "pause": "None",
            "progressDeadlineSeconds": 120,
            "trafficRouting": {
                "gatewayAPI": {"httpRoutes": ["web"], "port": PORT},
                "weights": [30, 100],
                "headerRoute": {"headers": [{"name": "x-canary", "value": "always"}]},
                "settleSeconds": 3,
            },
            "analysis": {
                "args": [{"name": "prometheus", "value": prometheus}],
                "gates": [{"after": 1, "templates": [{"templateName": "gateway-errors"}]}],
            },
            "template": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": pod,
            }
        }
    })
}

/// `kv` (TwoSets, versionedConfig, its config in ConfigMap `kv-config`) or `kvp` (Partition).
fn stateful(ns: &str, name: &str, tag: &str) -> Value {
    let mut pod = real_pod(name, true);
    if name == "kv" {
        pod["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "KV_MODE", "valueFrom": {"configMapKeyRef": {"name": "kv-config", "key": "mode"}}}));
    }
    let mut spec = node::kv_rollout(
        ns,
        tag,
        json!({
            "promotion": {"type": "Auto", "bakeSeconds": 3},
            "progressDeadlineSeconds": 120,
            "versionedConfig": name == "kv",
            "strategy": {"type": if name == "kv" { "TwoSets" } else { "Partition" }},
        }),
    );
    spec["metadata"]["name"] = json!(name);
    spec["spec"]["template"]["serviceName"] = json!(name);
    spec["spec"]["template"]["selector"] = json!({"matchLabels": {"app": name}});
    spec["spec"]["template"]["template"] = pod;
    spec
}

fn kv_config(ns: &str, mode: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kv-config", "namespace": ns}, "data": {"mode": mode}})
}

fn write_yaml(work: &std::path::Path, file: &str, docs: &[Value]) {
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string_pretty(d).unwrap())
        .collect();
    std::fs::write(work.join("soak").join(file), text.join("\n---\n")).unwrap();
}

/// Pushes `work`'s main, rebased on the remote's when the image automation committed in
/// between.
fn push_rebased(work: &std::path::Path) {
    for _ in 0..10 {
        let pushed = std::process::Command::new("git")
            .args(["push", "-q", "origin", "HEAD:main"])
            .current_dir(work)
            .output()
            .unwrap();
        if pushed.status.success() {
            return;
        }
        git(work, &["pull", "-q", "--rebase", "origin", "main"]);
    }
    panic!("could not push to main in 10 tries");
}

/// The image automation's commit that put `reference` in `soak/web.yaml` on main.
async fn image_committed(bare: &std::path::Path, reference: &str) -> String {
    support::eventually(
        &format!("the image automation to commit {reference}"),
        Duration::from_secs(60),
        || async {
            let text = support::show_on(bare, "main", "soak/web.yaml").unwrap_or_default();
            text.contains(&format!("{reference} #")).then(|| {
                git(
                    bare,
                    &["log", "-1", "--format=%H", "main", "--", "soak/web.yaml"],
                )
            })
        },
    )
    .await
}

// ---- what the soak records -------------------------------------------------------------

/// One rollout's status as sampled.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    phase: String,
    weight: i32,
    stable: String,
    canary: String,
    current: bool,
}

#[derive(Default)]
struct Record {
    /// (time, app, status) at each change.
    statuses: Vec<(Instant, String, Seen)>,
    /// (time, app, "created"/"deleting", pod).
    pods: Vec<(Instant, String, &'static str, String)>,
    /// (time, app, image, commit) of each push (web's: to the registry, and the image
    /// automation's commit).
    pushes: Vec<(Instant, String, String, String)>,
    /// Agent RSS in KiB, every 5 s.
    memory: Vec<(Instant, u64)>,
}

/// A notification the receiver took: event, rollout, image, revision.
type Taken = (String, String, String, String);

/// What the webhook receiver took (answered 204).
#[derive(Clone, Default)]
struct Receiver {
    requests: Arc<AtomicUsize>,
    taken: Arc<Mutex<Vec<Taken>>>,
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, raw: Bytes) -> StatusCode {
    if r.requests.fetch_add(1, Ordering::SeqCst) % 3 == 2 {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let event = headers
        .get("x-linnet-event")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let field = |k: &str| body[k].as_str().unwrap_or_default().to_string();
    r.taken
        .lock()
        .unwrap()
        .push((event, field("name"), field("image"), field("revision")));
    StatusCode::NO_CONTENT
}

fn seen_sts(r: &CanaryStatefulSet) -> Seen {
    let s = r.status.clone().unwrap_or_default();
    Seen {
        phase: s.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
        weight: s.canary_weight.unwrap_or(0),
        stable: s.stable_image.unwrap_or_default(),
        canary: s.canary_image.unwrap_or_default(),
        current: s.observed_generation == r.metadata.generation,
    }
}

fn seen_deploy(r: &CanaryDeployment) -> Seen {
    let s = r.status.clone().unwrap_or_default();
    Seen {
        phase: s.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
        weight: s.canary_weight.unwrap_or(0),
        stable: s.stable_image.unwrap_or_default(),
        canary: s.canary_image.unwrap_or_default(),
        current: s.observed_generation == r.metadata.generation,
    }
}

fn settled(seen: &Seen, image: &str) -> bool {
    matches!(seen.phase.as_str(), "Stable" | "Completed") && seen.current && seen.stable == image
}

/// Linnet's writes (not Lease renewals) to namespace `ns` in the audit log (and the file the
/// API server rotated it to, if it did) since `from`: (wall time, verb, resource/name).
fn audit_writes(from: SystemTime, ns: &str) -> Vec<(SystemTime, String, String)> {
    let dir = support::cluster_dir().join("logs");
    let mut text = String::new();
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|f| {
        f.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("audit"))
    });
    for f in files {
        text.push_str(&String::from_utf8_lossy(
            &std::fs::read(f).unwrap_or_default(),
        ));
        text.push('\n');
    }
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && matches!(
                    e["verb"].as_str(),
                    Some("create" | "update" | "patch" | "delete" | "deletecollection")
                )
                && e["objectRef"]["namespace"] == ns
                && e["objectRef"]["resource"] != "leases"
        })
        .filter_map(|e| {
            let at: jiff::Timestamp = e["requestReceivedTimestamp"].as_str()?.parse().ok()?;
            let what = format!(
                "{}{} {}",
                e["objectRef"]["resource"].as_str().unwrap_or(""),
                e["objectRef"]["subresource"]
                    .as_str()
                    .map(|s| format!("/{s}"))
                    .unwrap_or_default(),
                e["objectRef"]["name"].as_str().unwrap_or("")
            );
            Some((SystemTime::from(at), e["verb"].as_str()?.to_string(), what))
        })
        .filter(|(at, _, _)| *at >= from)
        .collect()
}

// ---- the run ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_with_everything_on_holds_every_invariant() {
    let run_for = Duration::from_secs(env_secs("LINNET_SOAK_SECS", 180));
    let drift = std::env::var("LINNET_SOAK_DRIFT").unwrap_or_else(|_| "10s".into());
    let report_path = std::env::var("LINNET_SOAK_REPORT")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target/soak.md").to_string());
    let admin = admin_client().await;
    if !node::require(&admin).await {
        return;
    }
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "soak").await;
    let ns_name = ns.name.clone();
    let gateway = Gateway::start(&admin, &ns_name).await;
    let prometheus = Prometheus::scraping(&gateway.metrics_url()).await;

    // The receiver, failing a third of the time.
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_url = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(receiver.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (statuses, status_api) = support::status_host::host().await;

    // The repository, seeded with every spec.
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    std::fs::create_dir_all(work.join("soak")).unwrap();
    let mut tags: BTreeMap<&str, usize> = APPS.iter().map(|a| (*a, 0)).collect();
    let mut mode = 0usize;
    // `web.yaml` is written once: from then on only the image automation changes it.
    let images = WebImages::start(tmp.path());
    images.push(0);
    std::fs::write(
        work.join("soak/web.yaml"),
        web_images::web_yaml(
            &[
                http_route(&ns_name, "web", "web-stable", PORT),
                // Six measurements 2 s apart: the first batch holds its weight about 14 s,
                // long enough to check its share.
                support::gateway::gateway_errors(&ns_name, Some(6)),
                web(&ns_name, &images.reference(0), &prometheus.address()),
            ],
            &images.reference(0),
        ),
    )
    .unwrap();
    std::fs::write(work.join("soak/policy.yaml"), images.policy()).unwrap();
    let write_specs = |tags: &BTreeMap<&str, usize>, mode: usize| {
        write_yaml(
            &work,
            "kv.yaml",
            &[
                kv_config(&ns_name, &format!("mode-{mode}")),
                stateful(&ns_name, "kv", TAGS[tags["kv"] % 3]),
            ],
        );
        write_yaml(
            &work,
            "kvp.yaml",
            &[stateful(&ns_name, "kvp", TAGS[tags["kvp"] % 3])],
        );
    };
    write_specs(&tags, mode);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "soak: first specs"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

    let dir = tmp.path().join("agent");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hook-url"), format!("{hook_url}\n")).unwrap();
    std::fs::write(dir.join("hook-key"), "soak-hook-key").unwrap();
    std::fs::write(dir.join("api-token"), "s3cret").unwrap();
    let settings = json!({"receivers": [{
        "name": "hook", "type": "webhook", "perMinute": 600,
        "urlFile": dir.join("hook-url").display().to_string(),
        "secretFile": dir.join("hook-key").display().to_string(),
        "events": ["CanaryStarted", "Promoted", "RolledBack", "AnalysisFailed", "AwaitingApproval"],
    }]});
    std::fs::write(
        dir.join("notifications.yaml"),
        serde_json::to_string(&settings).unwrap(),
    )
    .unwrap();
    let audit_from = SystemTime::now();
    let agent: Agent = start_agent(
        &dir,
        &[
            format!("--repo-url=file://{}", bare.display()),
            format!("--drift-interval={drift}"),
            "--writeback-interval=500ms".into(),
            "--commit-status-provider=github".into(),
            format!("--commit-status-api-url={status_api}"),
            "--commit-status-repo=acme/gitops".into(),
            format!(
                "--commit-status-token-file={}",
                dir.join("api-token").display()
            ),
            "--cluster-name=soak".into(),
            format!(
                "--notifications-file={}",
                dir.join("notifications.yaml").display()
            ),
            "--image-automation=true".into(),
            "--image-scan-interval=2s".into(),
        ],
        &ns_name,
    );
    wait_ready(&agent).await;
    let t0 = Instant::now();
    let record = Arc::new(Mutex::new(Record::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // Sampler of the rollouts' statuses, every 200 ms.
    let sampler = {
        let (record, stop) = (record.clone(), stop.clone());
        let sts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns_name);
        let deploy: Api<CanaryDeployment> = Api::namespaced(admin.clone(), &ns_name);
        tokio::spawn(async move {
            let mut last: BTreeMap<String, Seen> = BTreeMap::new();
            while !stop.load(Ordering::SeqCst) {
                let mut now: Vec<(String, Seen)> = Vec::new();
                if let Ok(Some(r)) = deploy.get_opt("web").await {
                    now.push(("web".into(), seen_deploy(&r)));
                }
                for name in ["kv", "kvp"] {
                    if let Ok(Some(r)) = sts.get_opt(name).await {
                        now.push((name.into(), seen_sts(&r)));
                    }
                }
                let at = Instant::now();
                {
                    let mut rec = record.lock().unwrap();
                    for (app, seen) in now {
                        if last.get(&app) != Some(&seen) {
                            rec.statuses.push((at, app.clone(), seen.clone()));
                            last.insert(app, seen);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    // Pods made and deleted, from a watch.
    let pod_watch = {
        let (record, stop) = (record.clone(), stop.clone());
        let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns_name);
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::watcher;
            let mut known: BTreeMap<String, bool> = BTreeMap::new();
            let mut stream = std::pin::pin!(watcher::watcher(pods, Default::default()));
            while !stop.load(Ordering::SeqCst) {
                let Ok(Some(Ok(event))) =
                    tokio::time::timeout(Duration::from_millis(500), stream.next()).await
                else {
                    continue;
                };
                let list = match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => vec![p],
                    _ => continue,
                };
                for p in list {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let app = p
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("app").cloned())
                        .unwrap_or_default();
                    let deleting = p.metadata.deletion_timestamp.is_some();
                    let at = Instant::now();
                    let mut rec = record.lock().unwrap();
                    match known.get(&uid) {
                        None => {
                            rec.pods.push((at, app.clone(), "created", name.clone()));
                            if deleting {
                                rec.pods.push((at, app, "deleting", name));
                            }
                        }
                        Some(false) if deleting => rec.pods.push((at, app, "deleting", name)),
                        _ => {}
                    }
                    known.insert(uid, deleting);
                }
            }
        })
    };
    // A request through the gateway every 100 ms, on a thread of its own.
    let samples: Samples = Default::default();
    let traffic = requests_every_100ms(gateway.url(), samples.clone(), stop.clone());
    let memory = {
        let (record, stop, pid) = (record.clone(), stop.clone(), agent.child.id());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(kib) = rss_kib(pid) {
                    record.lock().unwrap().memory.push((Instant::now(), kib));
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        })
    };
    let converger = Converger::start(
        &gateway,
        &admin,
        &ns_name,
        "web",
        &["web-stable", "web-canary"],
    );

    // Everything up on v1 first.
    let image_of = |app: &str, n: usize| match app {
        "web" => images.reference(n),
        _ => format!("{}:{}", node::KV_IMAGE, TAGS[n % 3]),
    };
    let all_settled = |rec: &Record, tags: &BTreeMap<&str, usize>| {
        APPS.iter().all(|app| {
            rec.statuses
                .iter()
                .rev()
                .find(|(_, a, _)| a == app)
                .is_some_and(|(_, _, s)| settled(s, &image_of(app, tags[app])))
        })
    };
    support::eventually(
        "every rollout settled on v1",
        Duration::from_secs(300),
        || {
            let ok = all_settled(&record.lock().unwrap(), &tags);
            async move { ok.then_some(()) }
        },
    )
    .await;
    // Up also means the gateway has caught up: Traefik can lag the cluster by seconds at
    // its start, and a 503 then is Traefik's, not a rollout's.
    gateway_answering(&samples).await;
    eprintln!(
        "soak: all settled on v1, the gateway answering, after {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    let started = Instant::now();

    // A push every 30 s, each rollout in turn: web's to the registry, the others' to Git.
    let mut push = 0usize;
    while started.elapsed() < run_for {
        let app = APPS[push % APPS.len()];
        *tags.get_mut(app).unwrap() += 1;
        if app == "web" {
            let pushed_at = Instant::now();
            let reference = images.push(tags["web"]);
            let commit = image_committed(&bare, &reference).await;
            record
                .lock()
                .unwrap()
                .pushes
                .push((pushed_at, app.to_string(), reference, commit));
        } else {
            if app == "kv" {
                mode += 1;
            }
            // The image automation commits to main too: start from its tip.
            git(&work, &["pull", "-q", "--rebase", "origin", "main"]);
            write_specs(&tags, mode);
            git(&work, &["add", "-A"]);
            let tag = TAGS[tags[app] % 3];
            git(&work, &["commit", "-qm", &format!("soak: {app} to {tag}")]);
            push_rebased(&work);
            let commit = git(&work, &["rev-parse", "HEAD"]);
            record.lock().unwrap().pushes.push((
                Instant::now(),
                app.to_string(),
                image_of(app, tags[app]),
                commit,
            ));
            let _ = agent.push_webhook().await;
        }
        push += 1;
        let next = started + PUSH_EVERY * push as u32;
        tokio::time::sleep_until(next.into()).await;
    }
    support::eventually(
        "every rollout settled on its last image",
        Duration::from_secs(300),
        || {
            let ok = all_settled(&record.lock().unwrap(), &tags);
            async move { ok.then_some(()) }
        },
    )
    .await;
    // A quiet stretch at the end: a few drift checks with nothing to do.
    support::let_time_pass(
        "a quiet stretch, its drift checks and writes counted",
        Duration::from_secs(25),
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let nudges = converger.stop().await;
    let _ = (sampler.await, pod_watch.await, memory.await);
    traffic.join().unwrap();
    let (ended, ended_wall) = (Instant::now(), SystemTime::now());
    let wall_at = |t: Instant| ended_wall - ended.saturating_duration_since(t);

    support::let_time_pass(
        "a late notification or status, had one been sent, arriving to be counted",
        Duration::from_secs(5),
    )
    .await;
    let rec = record.lock().unwrap();
    let mut checks = Checks::default();
    let mut check = |name: &str, ok: bool, detail: String| checks.check(name, ok, detail);

    // 1. The canary share.
    // Stretches of one (weight, stable image, canary image), whatever the phase.
    let weighed = stretches_of(rec.statuses.iter().filter(|(_, a, _)| a == "web").map(
        |(at, _, s)| Weighed {
            at: *at,
            weight: s.weight,
            stable: s.stable.clone(),
            canary: s.canary.clone(),
        },
    ));
    let samples = samples.lock().unwrap();
    let (stretches, checked, off) = canary_share(&weighed, &samples, ended, t0);
    let failed_requests = failed_requests(&samples, started, t0);
    let sent = samples.iter().filter(|(t, _)| *t >= started).count();
    drop(samples);
    check(
        "canary share within the binomial bounds of the rollout's weight",
        off.is_empty() && stretches > 0,
        format!(
            "{stretches} stretches of one weight, {checked} requests checked{}",
            listed("; off: ", &off, "; ")
        ),
    );
    let failed: usize = failed_requests.values().map(Vec::len).sum();
    check(
        "no request through the gateway failed once every rollout was up",
        failed == 0,
        format!(
            "{sent} sent, {failed} failed {failed_requests:?}, gateway nudged {nudges} time(s)"
        ),
    );

    // Each rollout's runs: from its push (or the start) until it settled on that image.
    let mut runs: Vec<(String, Instant, Instant)> = Vec::new();
    for app in APPS {
        let mut starts: Vec<(Instant, String)> =
            vec![(t0 - Duration::from_secs(600), image_of(app, 0))];
        starts.extend(
            rec.pushes
                .iter()
                .filter(|(_, a, _, _)| a == app)
                .map(|(t, _, image, _)| (*t, image.clone())),
        );
        for (start, want) in starts {
            let end = rec
                .statuses
                .iter()
                .filter(|(t, a, s)| a == app && *t >= start && settled(s, &want))
                .map(|(t, _, _)| *t)
                .next()
                .unwrap_or(ended);
            runs.push((app.to_string(), start, end));
        }
    }
    // 2. Pods only in a run of their rollout (3 s after it settled for the last to go).
    let stray: Vec<String> = rec
        .pods
        .iter()
        .filter(|(t, app, _, _)| {
            !runs
                .iter()
                .any(|(a, s, e)| a == app && t >= s && *t <= *e + Duration::from_secs(3))
        })
        .map(|(t, _, what, pod)| format!("{pod} {what} at {:.1} s", secs_since(t0, *t)))
        .collect();
    check(
        "no pod made or deleted without a spec change that asks for it",
        stray.is_empty(),
        format!(
            "{} pod creations and deletions seen, {} outside a rollout's run{}",
            rec.pods.len(),
            stray.len(),
            listed(": ", &stray, ", ")
        ),
    );

    // 2b. Baseline pods ran beside web's batches, and none is left.
    let baseline_pods = |what: &str| {
        rec.pods
            .iter()
            .filter(|(_, _, w, pod)| *w == what && pod.starts_with("web-baseline-"))
            .count()
    };
    let web_pushed = rec.pushes.iter().any(|(_, app, _, _)| app == "web");
    let (made, gone) = (baseline_pods("created"), baseline_pods("deleting"));
    check(
        "web's baseline pods ran beside its batches and went with them",
        !web_pushed || (made > 0 && made == gone),
        format!("{made} baseline pods made, {gone} deleted"),
    );

    // 3. No API write while everything is settled.
    let mut quiet: Vec<(Instant, Instant)> = Vec::new();
    {
        let busy: Vec<(Instant, Instant)> = runs
            .iter()
            .map(|(_, s, e)| (*s, *e + Duration::from_secs(5)))
            .collect();
        let mut edges: Vec<Instant> = busy.iter().flat_map(|(s, e)| [*s, *e]).collect();
        edges.push(ended);
        edges.sort();
        for pair in edges.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let mid = a + (b - a) / 2;
            if a >= t0 && b > a && !busy.iter().any(|(s, e)| mid >= *s && mid < *e) {
                quiet.push((a, b));
            }
        }
    }
    let quiet_secs: f64 = quiet.iter().map(|(a, b)| (*b - *a).as_secs_f64()).sum();
    let writes = audit_writes(audit_from, &ns_name);
    let loud: Vec<String> = writes
        .iter()
        .filter(|(at, _, _)| {
            quiet
                .iter()
                .any(|(a, b)| *at >= wall_at(*a) && *at < wall_at(*b))
        })
        .map(|(_, verb, what)| format!("{verb} {what}"))
        .collect();
    let mut loud_counts: BTreeMap<&String, usize> = BTreeMap::new();
    for l in &loud {
        *loud_counts.entry(l).or_default() += 1;
    }
    check(
        "no API write without a change (audit log)",
        loud.is_empty() && quiet_secs > 0.0,
        format!(
            "{} writes by linnet in all; {:.0} s settled in {} stretches, {} writes in them{}",
            writes.len(),
            quiet_secs,
            quiet.len(),
            loud.len(),
            if loud.is_empty() {
                String::new()
            } else {
                format!(": {loud_counts:?}")
            }
        ),
    );

    // 4. Notifications: each push's CanaryStarted and Promoted, once.
    let taken = receiver.taken.lock().unwrap().clone();
    let mut got: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for (event, name, image, _) in &taken {
        *got.entry((name.clone(), event.clone(), image.clone()))
            .or_default() += 1;
    }
    let mut want: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for (_, app, image, _) in &rec.pushes {
        for event in ["CanaryStarted", "Promoted"] {
            *want
                .entry((app.clone(), event.to_string(), image.clone()))
                .or_default() += 1;
        }
    }
    let mut lost = Vec::new();
    let mut extra = Vec::new();
    for (key, n) in &want {
        let g = got.get(key).copied().unwrap_or(0);
        if g < *n {
            lost.push(format!("{key:?} {g} of {n}"));
        }
    }
    for (key, g) in &got {
        let n = want.get(key).copied().unwrap_or(0);
        if *g > n {
            extra.push(format!("{key:?} {g} for {n}"));
        }
    }
    check(
        "no notification lost or duplicated at the receiver",
        lost.is_empty() && extra.is_empty(),
        format!(
            "{} requests to the receiver ({} answered 503), {} taken, {} expected{}{}",
            receiver.requests.load(Ordering::SeqCst),
            receiver.requests.load(Ordering::SeqCst) / 3,
            taken.len(),
            want.values().sum::<usize>(),
            listed("; lost: ", &lost, ", "),
            listed("; more than once or unexpected: ", &extra, ", ")
        ),
    );

    // 5. Commit statuses and status files.
    let posted = statuses.requests.lock().unwrap().clone();
    let mut unfinished = Vec::new();
    for (_, app, _, commit) in &rec.pushes {
        let context = format!("linnet/soak/{ns_name}/{app}");
        let last = posted
            .iter()
            .rfind(|r| r.path.ends_with(commit.as_str()) && r.body["context"] == context.as_str())
            .map(|r| r.body["state"].as_str().unwrap_or("").to_string());
        if last.as_deref() != Some("success") {
            unfinished.push(format!("{app}@{} ended {last:?}", &commit[..8]));
        }
    }
    let mut files_off = Vec::new();
    for app in APPS {
        let path = linnet::writeback::status_files::path("soak", &ns_name, app);
        let want = image_of(app, tags[app]);
        let text = support::show_on(&bare, "linnet/status", &path).unwrap_or_default();
        if !text.contains(&format!("stable: {want}")) {
            files_off.push(format!("{path} does not say stable: {want}"));
        }
    }
    check(
        "every pushed commit ends with a success commit status; status files current",
        unfinished.is_empty() && files_off.is_empty(),
        format!(
            "{} statuses posted for {} pushes{}{}",
            posted.len(),
            rec.pushes.len(),
            listed("; not success: ", &unfinished, ", "),
            listed("; ", &files_off, ", ")
        ),
    );

    // 6. The agent: no drift reverted, memory flat.
    let log = agent.log_text();
    let reverted = log
        .lines()
        .filter(|l| l.contains("reverted changes made outside Git"))
        .count();
    check(
        "no write of linnet's reverted as drift",
        reverted == 0,
        format!(
            "{reverted} reverts logged; {} drift checks logged",
            log.matches("drift interval").count()
        ),
    );
    let memory: Vec<u64> = rec.memory.iter().map(|(_, k)| *k).collect();
    let (flat, first, second) = memory_flat(&memory);
    check(
        "agent memory flat (peak of the second half within 20 % + 8 MiB of the first's)",
        flat,
        format!(
            "peak RSS {first} MiB in the first half, {second} MiB in the second ({} samples)",
            memory.len()
        ),
    );
    let phases: usize = rec.statuses.len();
    drop(rec);

    let text = format!(
        "# Soak\n\n`LINNET_SOAK_SECS={} LINNET_SOAK_DRIFT={drift}` (`make soak` writes this file; \
         `make test` runs 180 s into target/soak.md). Pods on the real node; pushes every \
         {} s, one rollout each in turn (web's an image to the registry, committed by the \
         image automation); {} pushes; {phases} status changes sampled. \
         Written {}.\n\n{}",
        run_for.as_secs(),
        PUSH_EVERY.as_secs(),
        record.lock().unwrap().pushes.len(),
        jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
        checks.table()
    );
    std::fs::write(&report_path, &text).unwrap();
    eprintln!("{text}");
    assert!(
        checks.failures.is_empty(),
        "the soak broke:\n{}",
        checks.failures.join("\n")
    );
}
