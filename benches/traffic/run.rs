//! The traffic benchmark behind `make bench` (issue 49): N batched CanaryDeployments, each
//! weighing its own HTTPRoute (host `web-<i>.bench`) through one real gateway (Traefik, as in
//! `tests/traffic.rs`), with a server on every pod's address. Every rollout gets a new image in
//! one change; batch 1 asks for 50 %, and after a bump of `currentBatch` in the specs batch 2
//! asks for 100 % (the old version goes next). For each rollout and step it measures:
//!
//! - **step -> route updated**: from the step's new pods available (the bench's Deployment
//!   watch) to the route carrying the step's weight (its HTTPRoute watch), which is linnet's
//!   reaction, the EndpointSlice controller's included;
//! - **route updated -> split at the gateway**: from there to Traefik running those weights
//!   (its `/api/rawdata`, read every 100 ms).
//!
//! and, after each step, the split that requests through the gateway observe (100 per route).
//! Traefik 3.6.12 sometimes keeps an old configuration until another change arrives
//! (tests/support/gateway.rs, `Converger`): a route 10 s behind is touched, and counted.
//!
//! Timings come from watch events as they arrive here, so they include the API server's watch
//! delivery, as `kubectl get -w` would.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use linnet::api::{CanaryDeployment, DeploymentPhase};
use serde_json::{Value, json};

use crate::support::gateway::{self, Gateway, PodServers, send};
use crate::support::rollout::Fixture;

const PORT: u16 = 8080;

pub struct Config {
    pub rollouts: usize,
    /// Requests per route after each step, for the observed split.
    pub requests_per_route: usize,
}

/// One line of the results table.
#[derive(Clone, Debug)]
pub struct Row {
    pub figure: String,
    pub unit: &'static str,
    pub median: f64,
    pub max: f64,
    pub samples: usize,
}

pub const FIGURES: [&str; 5] = [
    "step -> route updated",
    "route updated -> split at the gateway",
    "route updates the gateway applied untouched",
    "observed split, batch 1 (weight 50)",
    "observed split, batch 2 (weight 100)",
];

fn log(msg: &str) {
    eprintln!("bench: {msg}");
}

fn name(i: usize) -> String {
    format!("web-{i:03}")
}

fn host(i: usize) -> String {
    format!("{}.bench", name(i))
}

fn rollout(ns: &str, i: usize, image: &str, current_batch: i32) -> Value {
    let n = name(i);
    json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryDeployment",
        "metadata": {"name": n, "namespace": ns},
        "spec": {
            "replicas": 2,
            "image": image,
            "strategy": {"type": "Batches"},
            "batches": 2,
            "pause": "First",
            "currentBatch": current_batch,
            "progressDeadlineSeconds": 600,
            "trafficRouting": {
                "gatewayAPI": {"httpRoutes": [n], "port": PORT},
                "weights": [50, 100],
                "settleSeconds": 5,
            },
            "template": {
                "selector": {"matchLabels": {"app": n}},
                "template": {
                    "metadata": {"labels": {"app": n}},
                    "spec": {"containers": [{"name": "web", "image": image,
                        "ports": [{"containerPort": PORT}]}]}
                }
            }
        }
    })
}

fn route(ns: &str, i: usize) -> Value {
    let mut r = gateway::http_route(ns, &name(i), &format!("{}-stable", name(i)), PORT);
    r["spec"]["hostnames"] = json!([host(i)]);
    r
}

fn write_rollouts(f: &Fixture, n: usize, image: &str, current_batch: i32) {
    let docs: Vec<Value> = (0..n)
        .map(|i| rollout(&f.ns.name, i, image, current_batch))
        .collect();
    f.write_file("rollout.yaml", &docs);
}

/// When each rollout reached each mark of the step under way.
#[derive(Default)]
struct Marks {
    /// The step's new pods available.
    ready: HashMap<String, Instant>,
    /// The route carrying the step's weight.
    routed: HashMap<String, Instant>,
    /// Traefik running it.
    running: HashMap<String, Instant>,
}

/// The step being measured: the canary's available replicas and weight it waits for.
#[derive(Clone, Copy, Default)]
struct Step {
    available: i32,
    weight: i64,
}

type Shared = Arc<Mutex<(Step, Marks)>>;

/// Records each rollout's new pods available, from a Deployment watch.
fn watch_deployments(api: Api<Deployment>, image: &'static str, shared: Shared) {
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = events.next().await {
            let (Event::Apply(d) | Event::InitApply(d)) = event else {
                continue;
            };
            let at = Instant::now();
            let runs = d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.as_deref())
                == Some(image);
            let available = d
                .status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0);
            let Some(rollout) = d
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(linnet::api::ROLLOUT_LABEL))
            else {
                continue;
            };
            let mut g = shared.lock().unwrap();
            let (step, marks) = &mut *g;
            if runs && step.available > 0 && available >= step.available {
                marks.ready.entry(rollout.clone()).or_insert(at);
            }
        }
    });
}

/// The canary weight of an HTTPRoute's rules, if a rule weighs `<route>-canary`.
fn canary_weight(route: &str, rules: &Value) -> Option<i64> {
    let canary = format!("{route}-canary");
    rules.as_array()?.iter().find_map(|r| {
        r["backendRefs"]
            .as_array()?
            .iter()
            .find(|b| b["name"] == canary.as_str())
            .map(|b| b["weight"].as_i64().unwrap_or(1))
    })
}

/// Records each route carrying the step's weight, from an HTTPRoute watch.
fn watch_routes(api: Api<kube::api::DynamicObject>, shared: Shared) {
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = events.next().await {
            let (Event::Apply(r) | Event::InitApply(r)) = event else {
                continue;
            };
            let at = Instant::now();
            let Some(name) = r.metadata.name.clone() else {
                continue;
            };
            let weight = r
                .data
                .pointer("/spec/rules")
                .and_then(|rules| canary_weight(&name, rules));
            let mut g = shared.lock().unwrap();
            let (step, marks) = &mut *g;
            if step.available > 0 && weight == Some(step.weight) {
                marks.routed.entry(name).or_insert(at);
            }
        }
    });
}

/// The canary weight Traefik runs for a route (0 when no rule has `<route>-canary`).
fn running_canary_weight(route: &str, rules: &[Vec<(String, i64)>]) -> i64 {
    let canary = format!("-{route}-canary-");
    rules
        .iter()
        .flatten()
        .find(|(service, _)| service.contains(&canary))
        .map_or(0, |(_, w)| *w)
}

fn median_max(mut v: Vec<f64>) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[v.len() - 1])
}

/// Runs one step: sets what the watches wait for, makes the change, and waits until Traefik
/// runs every route's new weights. Returns (step -> route ms, route -> running ms, touches).
async fn measure_step(
    f: &Fixture,
    n: usize,
    gateway: &Gateway,
    shared: &Shared,
    step: Step,
    change: impl FnOnce(),
) -> Result<(Vec<f64>, Vec<f64>, usize), String> {
    let names: Vec<String> = (0..n).map(name).collect();
    *shared.lock().unwrap() = (step, Marks::default());
    change();
    let routes = gateway::routes(&f.admin, &f.ns.name);
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut touched_at: HashMap<String, Instant> = HashMap::new();
    let mut touches = 0;
    loop {
        let running = gateway.running_backends_of(&f.ns.name, &names).await;
        let at = Instant::now();
        let mut late = Vec::new();
        {
            let mut g = shared.lock().unwrap();
            let marks = &mut g.1;
            for (name, rules) in names.iter().zip(&running) {
                let Some(&routed) = marks.routed.get(name) else {
                    continue;
                };
                if running_canary_weight(name, rules) == step.weight {
                    marks.running.entry(name.clone()).or_insert(at);
                } else if !marks.running.contains_key(name) {
                    let since = touched_at.get(name).copied().unwrap_or(routed);
                    if at.duration_since(since) > Duration::from_secs(10) {
                        late.push(name.clone());
                    }
                }
            }
            if marks.running.len() == n {
                break;
            }
        }
        for name in late {
            touches += 1;
            log(&format!(
                "Traefik runs an old configuration of route {name} 10 s after its update; touching it"
            ));
            let _ = routes
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        "linnet.dev/bench-touch": touches.to_string()}}})),
                )
                .await;
            touched_at.insert(name, Instant::now());
        }
        if Instant::now() > deadline {
            let g = shared.lock().unwrap();
            return Err(format!(
                "step to weight {}: after 300 s, {} of {n} rollouts had their pods available, {} their route updated, {} the gateway running it",
                step.weight,
                g.1.ready.len(),
                g.1.routed.len(),
                g.1.running.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let g = shared.lock().unwrap();
    let marks = &g.1;
    let mut to_route = Vec::new();
    let mut to_running = Vec::new();
    for name in &names {
        let (Some(ready), Some(routed), Some(running)) = (
            marks.ready.get(name),
            marks.routed.get(name),
            marks.running.get(name),
        ) else {
            continue;
        };
        // The bench's watch may see the Deployment after linnet has acted on it.
        to_route.push(routed.saturating_duration_since(*ready).as_secs_f64() * 1000.0);
        to_running.push(running.saturating_duration_since(*routed).as_secs_f64() * 1000.0);
    }
    Ok((to_route, to_running, touches))
}

/// The percent of `per_route` requests to each route that the new version answered.
async fn observed_split(
    gateway: &Gateway,
    n: usize,
    per_route: usize,
    image: &str,
) -> (f64, usize) {
    let (mut canary, mut total) = (0, 0);
    for i in 0..n {
        let h = host(i);
        let t = send(&gateway.url(), per_route, &[("host", h.as_str())]).await;
        canary += t.count(image);
        total += t.total_ok() + t.total_failed();
    }
    (100.0 * canary as f64 / total.max(1) as f64, total)
}

/// Runs the scenario and returns the rows and the touches the gateway needed.
pub async fn run(cfg: &Config) -> Result<(Vec<Row>, usize), String> {
    let n = cfg.rollouts;
    gateway::install_gateway_api(&crate::support::admin_client().await).await;
    let f = Fixture::start("bench-traffic", |ns| rollout(ns, 0, "web:v1", 1)).await;
    let gateway = Gateway::start(&f.admin, &f.ns.name).await;
    let _pods = PodServers::start(PORT);
    let routes: Vec<Value> = (0..n).map(|i| route(&f.ns.name, i)).collect();
    f.write_file("routes.yaml", &routes);
    write_rollouts(&f, n, "web:v1", 1);
    log(&format!(
        "{n} rollouts with routes, waiting for them to complete on web:v1"
    ));
    wait_all(&f.admin, &f.ns.name, n, |s| {
        s.phase == Some(DeploymentPhase::Completed)
    })
    .await?;

    let shared: Shared = Arc::default();
    watch_deployments(
        Api::namespaced(f.admin.clone(), &f.ns.name),
        "web:v2",
        shared.clone(),
    );
    watch_routes(gateway::routes(&f.admin, &f.ns.name), shared.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    log("batch 1 (weight 50): a new image for every rollout in one change");
    let (r1, s1, t1) = measure_step(
        &f,
        n,
        &gateway,
        &shared,
        Step {
            available: 1,
            weight: 50,
        },
        || write_rollouts(&f, n, "web:v2", 1),
    )
    .await?;
    let split1 = observed_split(&gateway, n, cfg.requests_per_route, "web:v2").await;
    wait_all(&f.admin, &f.ns.name, n, |s| {
        s.phase == Some(DeploymentPhase::Paused)
    })
    .await?;

    log("batch 2 (weight 100): currentBatch 2 for every rollout in one change");
    let (r2, s2, t2) = measure_step(
        &f,
        n,
        &gateway,
        &shared,
        Step {
            available: 2,
            weight: 100,
        },
        || write_rollouts(&f, n, "web:v2", 2),
    )
    .await?;
    let split2 = observed_split(&gateway, n, cfg.requests_per_route, "web:v2").await;

    let row = |figure: &str, unit, v: Vec<f64>| {
        let samples = v.len();
        let (median, max) = median_max(v);
        Row {
            figure: figure.to_string(),
            unit,
            median,
            max,
            samples,
        }
    };
    let to_split = [s1, s2].concat();
    // Applied within the 10 s before the bench touches a route: Traefik's own doing.
    let untouched = to_split.iter().filter(|ms| **ms < 10_000.0).count();
    let untouched = 100.0 * untouched as f64 / to_split.len().max(1) as f64;
    let rows = vec![
        row(FIGURES[0], "ms", [r1, r2].concat()),
        row(FIGURES[1], "ms", to_split.clone()),
        Row {
            figure: FIGURES[2].into(),
            unit: "%",
            median: untouched,
            max: untouched,
            samples: to_split.len(),
        },
        Row {
            figure: FIGURES[3].into(),
            unit: "% new",
            median: split1.0,
            max: split1.0,
            samples: split1.1,
        },
        Row {
            figure: FIGURES[4].into(),
            unit: "% new",
            median: split2.0,
            max: split2.0,
            samples: split2.1,
        },
    ];
    Ok((rows, t1 + t2))
}

/// Waits (up to 10 minutes) until all `n` rollouts' statuses satisfy `done`.
async fn wait_all(
    admin: &Client,
    ns: &str,
    n: usize,
    done: impl Fn(&linnet::api::CanaryDeploymentStatus) -> bool,
) -> Result<(), String> {
    let api = Api::<CanaryDeployment>::namespaced(admin.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let list = api
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let count = list
            .items
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(&done))
            .count();
        if count == n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {count} of {n} rollouts got there in 10 minutes"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub fn table(rows: &[Row], touches: usize) -> String {
    let mut t = String::from("| Figure | Median | Max | Samples |\n|---|---|---|---|\n");
    for r in rows {
        t.push_str(&format!(
            "| {} | {:.1} {} | {:.1} {} | {} |\n",
            r.figure, r.median, r.unit, r.max, r.unit, r.samples
        ));
    }
    t.push_str(&format!(
        "\nRoutes touched because Traefik ran an old configuration 10 s after their update: {touches}.\n"
    ));
    t
}
