//! The scale benchmark behind `make bench`: linnet at N CanaryStatefulSets on the local control
//! plane, with their specs in a repository served over smart HTTP whose `post-receive` hook
//! sends signed push webhooks. For each size it measures the seven figures of issue 10 and
//! returns them as rows; `main.rs` prints them and writes `bench/RESULTS.md`, and
//! `tests/bench.rs` runs it once, small.
//!
//! Timings come from the benchmark's own watches (an object's new version arriving), so they
//! include the API server's watch delivery, as a user's `kubectl get -w` would.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use linnet::api::{CanaryStatefulSet, StatefulSetPhase};

#[path = "sharded.rs"]
pub mod sharded;

#[path = "fetch.rs"]
pub mod fetch;

#[path = "sittings.rs"]
pub mod sittings;

use crate::support::{self, git};

const SECRET: &str = "bench-webhook-secret";
const GIT_TOKEN: &str = "bench-git-token";

/// What to run.
pub struct Config {
    pub sizes: Vec<usize>,
    /// Pushes per size for figures 1 and 5.
    pub pushes: usize,
    /// The idle window for figures 2, 3 and 6.
    pub idle: Duration,
    /// The churn window for figure 7 (one spec changed per second).
    pub churn: Duration,
    /// Whole-scenario repeats per size; scalar figures are the median over repeats.
    pub repeats: usize,
    /// The window of figures 9 and 10 (every rollout paused mid-canary, analysing).
    pub analysis_window: Duration,
    pub linnet_bin: PathBuf,
    /// Spec files per directory below `apps/`; 0 puts them all in `apps/`.
    pub files_per_dir: usize,
    /// The largest size at which figures 12 and 13 are measured without linnet too.
    pub floor_max: usize,
    /// Replicas splitting the rollouts (`--shards`) in the sharded first sync; below 2 it is
    /// not run.
    pub shards: usize,
    /// Alternating (linnet, floor) first-sync sittings at the largest size up to
    /// `floor_max`, and the pushes in each linnet sitting.
    pub sittings: usize,
    pub sitting_pushes: usize,
    /// One rollout in `pod_sample` runs its pod; the others' pods are created but never
    /// scheduled (1: every pod runs).
    pub pod_sample: usize,
}

/// One line of the results table.
#[derive(Clone, Debug)]
pub struct Row {
    pub size: usize,
    pub figure: &'static str,
    pub unit: &'static str,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub samples: usize,
    pub target: String,
    pub met: Option<bool>,
}

pub const FIGURES: [&str; 13] = [
    "1 push -> CR write (webhook)",
    "2 CPU per idle poll",
    "3 API writes in idle window",
    "4 initial sync",
    "5 step latency (pods Ready -> next action)",
    "6 memory (RSS, steady)",
    "7 CPU under churn (1 change/s)",
    "8 push -> canary pod Ready (TwoSets, 1 volume)",
    "9 CPU with a background analysis per rollout (10 s interval)",
    "10 analysis queries per second",
    "11 CPU per one-file push",
    "12 API writes per rollout in the initial sync",
    "13 start -> every rollout's children Ready",
];

/// What one run at one size measured.
#[derive(Default)]
struct Samples {
    push_to_write_ms: Vec<f64>,
    /// Per push: webhook sent -> the agent read the revision; `git fetch` of the same push.
    webhook_to_read_ms: Vec<f64>,
    git_fetch_ms: Vec<f64>,
    idle_cpu_per_poll_ms: Vec<f64>,
    idle_polls: u64,
    idle_writes: u64,
    idle_lease_writes: u64,
    initial_sync_s: f64,
    crs_applied_s: f64,
    initial_sync_cpu_s: f64,
    all_stable_s: f64,
    restart_settle_s: f64,
    step_latency_ms: Vec<f64>,
    rss_mib: Vec<f64>,
    churn_cpu_percent: f64,
    churn_push_to_write_ms: Vec<f64>,
    /// linnet's gets and lists from its start until it settled after the initial sync.
    initial_reads: f64,
    /// The watches linnet opened in that time.
    initial_watches: f64,
    /// linnet's writes (leases aside) from its start until it settled with every rollout
    /// Stable, per rollout.
    initial_writes_per_rollout: f64,
    /// The agent's writes in that time that are not a rollout's (its inventory, its source's
    /// status, access reviews).
    initial_agent_writes: f64,
    /// Agent CPU from the first push until it settled after the last, per push.
    push_cpu_ms: f64,
    /// Figures 12 and 13 without linnet, at sizes up to `Config::floor_max`.
    floor: Option<Floor>,
    /// kube-apiserver's CPU seconds from the agent's start until every rollout was Stable.
    apiserver_cpu_s: f64,
    /// The agent's peak resident memory (`VmHWM`), in MiB: the agent that made the first sync
    /// (through the pushes); the restarted one until it caught up; the same from then on
    /// (idle and churn; its peak reset once caught up).
    peak_first_mib: f64,
    peak_restart_mib: f64,
    peak_steady_mib: f64,
    /// One drift check (a full comparison of every object, Git unchanged): the agent's CPU
    /// milliseconds, its peak resident memory (MiB) and its gets and lists.
    drift_cpu_ms: f64,
    drift_peak_mib: f64,
    drift_reads: f64,
}

/// kube-apiserver's CPU seconds so far (0 when its pid file is not found).
fn apiserver_cpu() -> f64 {
    std::fs::read_to_string(support::cluster_dir().join("pid/kube-apiserver.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .map_or(0.0, |pid| usage(pid).1)
}

/// The agent's peak resident memory so far, in MiB, and resets it (`clear_refs` 5), so
/// that the next reading is the peak of what follows.
fn take_peak(pid: u32) -> f64 {
    let peak = support::process::peak_rss_mib(pid).unwrap_or(f64::NAN);
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    peak
}

fn log(msg: &str) {
    eprintln!("bench: {msg}");
}

/// (RSS in MiB, user+system CPU seconds) of the agent; zeros once it is gone.
fn usage(pid: u32) -> (f64, f64) {
    support::process::usage(pid).unwrap_or((0.0, 0.0))
}

/// Rollout `name`'s spec. `scheduled` false: its pod names a scheduler that does not exist,
/// so it is created but never runs (the sampled pods of `LINNET_BENCH_POD_SAMPLE`).
fn spec(name: &str, ns: &str, image: &str, scheduled: bool) -> String {
    let scheduler = if scheduled {
        ""
    } else {
        "\n        schedulerName: linnet-bench-unscheduled"
    };
    format!(
        r#"apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryStatefulSet
metadata:
  name: {name}
  namespace: {ns}
spec:
  replicas: 1
  canaryReplicas: 1
  image: {image}
  promotion:
    type: Manual
  template:
    serviceName: {name}
    selector:
      matchLabels:
        app: {name}
    template:
      metadata:
        labels:
          app: {name}
      spec:{scheduler}
        containers:
        - name: app
          image: {image}
"#
    )
}

fn rollout_name(i: usize) -> String {
    format!("r-{i:04}")
}

/// Rollout `i`'s spec file below the work tree.
fn spec_file(cfg: &Config, i: usize) -> String {
    support::bench::spec_file(i, cfg.files_per_dir)
}

/// The Git host: a bare repository of `n` specs served over smart HTTP with a token, whose
/// `post-receive` hook posts a signed GitHub push event to the agent in the background (as a
/// host delivers webhooks after accepting the push).
struct GitHost {
    bare: PathBuf,
    work: PathBuf,
    url: String,
}

fn git_host(cfg: &Config, dir: &Path, ns: &str, n: usize, agent_base: &str) -> GitHost {
    let bare = dir.join("repos/gitops.git");
    std::fs::create_dir_all(&bare).unwrap();
    git(&bare, &["init", "--bare", "-q"]);
    support::push_hook::install_github_push_hook(
        &bare,
        SECRET,
        &format!("{agent_base}/hooks/github"),
    )
    .unwrap();
    let work = dir.join("work");
    git(dir, &["clone", "-q", bare.to_str().unwrap(), "work"]);
    std::fs::create_dir_all(work.join("apps")).unwrap();
    for i in 0..n {
        let file = work.join(spec_file(cfg, i));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let scheduled = i % cfg.pod_sample.max(1) == 0;
        std::fs::write(file, spec(&rollout_name(i), ns, "bench:1", scheduled)).unwrap();
    }
    git(&work, &["add", "-A"]);
    git(
        &work,
        &["commit", "--allow-empty", "-qm", &format!("{n} rollouts")],
    );
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let server = support::git_http::serve(dir.join("repos"), Some(("git", GIT_TOKEN)));
    GitHost {
        bare,
        work,
        url: format!("{server}/gitops.git"),
    }
}

/// Commits `work` and pushes; returns the moment `git push` returned.
fn push(work: &Path, message: &str) -> Instant {
    git(work, &["commit", "-qam", message]);
    git(work, &["push", "-q", "origin", "HEAD:main"]);
    Instant::now()
}

struct Agent {
    child: Child,
    base: String,
    port: u16,
}

impl Agent {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn kill(&mut self) {
        if std::env::var_os("LINNET_BENCH_AGENT_WRAPPER").is_some() {
            // A profiler wants a clean exit to write its data: SIGTERM the agent under it.
            let _ = Command::new("pkill")
                .args([
                    "-TERM",
                    "-f",
                    &format!("linnet agent .*127.0.0.1:{}", self.port),
                ])
                .status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
    async fn metrics(&self) -> String {
        linnet::net::install_crypto_provider();
        match reqwest::get(format!("{}/metrics", self.base)).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts an agent polling every `poll`, with a full drift check every `drift`.
fn start_agent(
    cfg: &Config,
    dir: &Path,
    repo_url: &str,
    ns: &str,
    port: u16,
    timers: (&str, &str),
) -> Agent {
    start_agent_with(cfg, dir, repo_url, ns, port, timers, &[])
}

/// [`start_agent`] with `extra` flags (a replica's shard and identity).
fn start_agent_with(
    cfg: &Config,
    dir: &Path,
    repo_url: &str,
    ns: &str,
    port: u16,
    (poll, drift): (&str, &str),
    extra: &[String],
) -> Agent {
    std::fs::write(dir.join("secret"), SECRET).unwrap();
    std::fs::write(dir.join("git-token"), GIT_TOKEN).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("agent.log"))
        .unwrap();
    // LINNET_BENCH_AGENT_WRAPPER runs the agent under a profiler, e.g.
    // `heaptrack -o /tmp/agent-{n}` ({n} counts agent starts) or `perf record -g -o /tmp/perf-{port}.data`.
    let wrapper = std::env::var("LINNET_BENCH_AGENT_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut c = Command::new(program);
            static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let start = STARTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            c.args(words.map(|w| {
                w.replace("{port}", &port.to_string())
                    .replace("{n}", &start.to_string())
            }))
            .arg(&cfg.linnet_bin);
            c
        }
        None => Command::new(&cfg.linnet_bin),
    };
    // Metrics on their own port, as the agent serves them.
    let admin_port = support::ports::free_port();
    let child = command
        .arg("agent")
        .args(["--repo-url", repo_url])
        .args([
            "--git-password-file",
            dir.join("git-token").to_str().unwrap(),
        ])
        .args(["--poll-interval", poll])
        // No periodic drift check (a full sync, every 3 min by default) lands among the pushes
        // of figure 11 by chance (`1h`, but in the drift phase); a restart still syncs in full.
        .args(["--drift-interval", drift])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .args([
            "--webhook-secret-file",
            dir.join("secret").to_str().unwrap(),
        ])
        .args(["--cache-dir", dir.join("cache").to_str().unwrap()])
        .args(["--source-name", ns, "--allow-namespace", ns])
        .args(["--apply-as", support::SOURCE_ACCOUNT])
        .args(["--lease-namespace", ns])
        .args(if extra.iter().any(|a| a.starts_with("--lease-identity")) {
            vec![]
        } else {
            vec!["--lease-identity", "bench"]
        })
        .args(extra)
        // Extra agent flags, to compare settings: LINNET_BENCH_AGENT_ARGS="--flag value".
        .args(
            std::env::var("LINNET_BENCH_AGENT_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .env("KUBECONFIG", support::linnet_kubeconfig())
        // LINNET_BENCH_RUST_LOG="linnet=debug" for a timeline of one run.
        .env(
            "RUST_LOG",
            std::env::var("LINNET_BENCH_RUST_LOG").unwrap_or_else(|_| "linnet=info".into()),
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start linnet agent");
    Agent {
        child,
        base: format!("http://127.0.0.1:{admin_port}"),
        port,
    }
}

/// Waits until `n` distinct objects in `api` satisfy `done`; returns when the last arrived.
async fn count_seen<K>(
    api: Api<K>,
    n: usize,
    timeout: Duration,
    done: impl Fn(&K) -> bool,
) -> Result<Instant, String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut seen = HashSet::new();
    let watch = async {
        let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(o) | Event::InitApply(o)) => {
                    let name = o.meta().name.clone().unwrap_or_default();
                    if done(&o) {
                        seen.insert(name);
                    } else {
                        seen.remove(&name);
                    }
                    if seen.len() >= n {
                        return Instant::now();
                    }
                }
                Ok(Event::Delete(o)) => {
                    seen.remove(&o.meta().name.clone().unwrap_or_default());
                }
                _ => {}
            }
        }
        Instant::now()
    };
    tokio::time::timeout(timeout, watch)
        .await
        .map_err(|_| format!("timed out after {timeout:?}"))
}

fn phase(o: &CanaryStatefulSet) -> Option<StatefulSetPhase> {
    o.status.as_ref().and_then(|s| s.phase)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn since_ms(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        ms(later - earlier)
    } else {
        -ms(earlier - later)
    }
}

/// linnet's writes in the audit log between two byte offsets: (all but leases, leases).
fn audit_writes(from: u64, to: u64) -> (u64, u64, Vec<String>) {
    use std::io::{Read, Seek, SeekFrom};
    // Only the window's bytes: the log holds every test run's writes too.
    let path = support::cluster_dir().join("logs/audit.log");
    let mut bytes = Vec::new();
    if let Ok(mut file) = std::fs::File::open(&path)
        && file.seek(SeekFrom::Start(from)).is_ok()
    {
        let _ = file.take(to.saturating_sub(from)).read_to_end(&mut bytes);
    }
    let text = String::from_utf8_lossy(&bytes);
    let (mut writes, mut leases, mut what) = (0, 0, Vec::new());
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if e["stage"] != "ResponseComplete"
            || !WRITE_VERBS.contains(&e["verb"].as_str().unwrap_or(""))
        {
            continue;
        }
        let resource = e["objectRef"]["resource"].as_str().unwrap_or("?");
        if resource == "leases" {
            leases += 1;
        } else {
            writes += 1;
            what.push(format!(
                "{} {}/{}/{}",
                e["verb"].as_str().unwrap_or("?"),
                resource,
                e["objectRef"]["namespace"].as_str().unwrap_or(""),
                e["objectRef"]["name"].as_str().unwrap_or("?")
            ));
        }
    }
    (writes, leases, what)
}

/// The verbs of a write, as the audit log names them.
const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// linnet's reads in the audit log between two byte offsets: (gets and lists, watches).
fn audit_reads(from: u64, to: u64) -> (u64, u64) {
    use std::io::{Read, Seek, SeekFrom};
    let path = support::cluster_dir().join("logs/audit.log");
    let mut bytes = Vec::new();
    if let Ok(mut file) = std::fs::File::open(&path)
        && file.seek(SeekFrom::Start(from)).is_ok()
    {
        let _ = file.take(to.saturating_sub(from)).read_to_end(&mut bytes);
    }
    let (mut reads, mut watches) = (0, 0);
    for line in String::from_utf8_lossy(&bytes).lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        // A watch is logged when it starts; a get or list when it is answered.
        match (e["verb"].as_str(), e["stage"].as_str()) {
            (Some("watch"), Some("ResponseStarted")) => watches += 1,
            (Some("get" | "list"), Some("ResponseComplete")) => reads += 1,
            _ => {}
        }
    }
    (reads, watches)
}

fn audit_offset() -> u64 {
    std::fs::metadata(support::cluster_dir().join("logs/audit.log"))
        .map(|m| m.len())
        .unwrap_or(0)
}

/// What the agent has done so far: reconciles, syncs and status commits.
fn work_done(metrics: &str) -> f64 {
    // Not fetches: a 1 s poll counts one each second, busy or not.
    const COUNTS: [&str; 3] = [
        "linnet_reconcile_duration_seconds_count",
        "linnet_sync_duration_seconds_count",
        "linnet_writeback_commits_total",
    ];
    COUNTS
        .iter()
        .map(|k| support::metric_sum(metrics, k, &[]))
        .sum()
}

/// Waits until the agent has done no reconcile, sync or status commit for `quiet`: it
/// has caught up, write-back included (a status commit left over from the initial sync would
/// otherwise be counted to the pushes).
async fn settle(agent: &Agent, quiet: Duration, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut last = -1.0;
    let mut since = Instant::now();
    while Instant::now() < deadline {
        let m = agent.metrics().await;
        let now = work_done(&m);
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn one_size(cfg: &Config, admin: &Client, n: usize) -> Result<Samples, String> {
    let mut s = Samples::default();
    let ns = support::TestNamespace::create(admin, &format!("bench-{n}")).await;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = support::ports::free_port();
    let host = git_host(
        cfg,
        tmp.path(),
        &ns.name,
        n,
        &format!("http://127.0.0.1:{port}"),
    );
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    let slow = Duration::from_secs(60 + n as u64 / 2);

    // 4. Initial sync: start -> every CR applied and every stable StatefulSet created.
    log(&format!("size {n}: initial sync"));
    let started = Instant::now();
    let audit_at_start = audit_offset();
    let apiserver_at_start = apiserver_cpu();
    let mut agent = start_agent(cfg, tmp.path(), &host.url, &ns.name, port, ("1h", "1h"));
    let (crs, stables) = tokio::join!(
        count_seen(rollouts.clone(), n, slow, |_| true),
        count_seen(sets.clone(), n, slow, |o: &StatefulSet| o
            .metadata
            .name
            .as_deref()
            .is_some_and(|x| x.ends_with("-stable"))),
    );
    let crs = crs?;
    let synced = crs.max(stables?);
    s.initial_sync_s = (synced - started).as_secs_f64();
    s.crs_applied_s = (crs - started).as_secs_f64();
    s.initial_sync_cpu_s = usage(agent.pid()).1;
    let stable = count_seen(rollouts.clone(), n, slow * 3, |o| {
        phase(o) == Some(StatefulSetPhase::Stable)
    })
    .await?;
    s.all_stable_s = (stable - started).as_secs_f64();
    s.apiserver_cpu_s = apiserver_cpu() - apiserver_at_start;
    log(&format!(
        "size {n}: synced in {:.2} s, all Stable after {:.2} s",
        s.initial_sync_s, s.all_stable_s
    ));
    // The floor copies rollout 0's stable set as linnet made it.
    let first_set = if n <= cfg.floor_max {
        let name = format!("{}-stable", rollout_name(0));
        Some(sets.get(&name).await.map_err(|e| e.to_string())?)
    } else {
        None
    };
    support::agent::wait_ready_at(&agent.base).await;
    settle(&agent, Duration::from_secs(3), slow).await;
    let (reads, watches) = audit_reads(audit_at_start, audit_offset());
    s.initial_reads = reads as f64;
    s.initial_watches = watches as f64;
    let (writes, _, what) = audit_writes(audit_at_start, audit_offset());
    // The rollouts' own writes (their CRs, statuses, children and events) apart from the
    // agent's (its inventory, its source's status, access reviews), which do not grow with
    // the rollouts (one inventory ConfigMap per 5,000 objects).
    let agents = |w: &&String| {
        w.contains(" linnetsources/")
            || w.contains(" selfsubjectaccessreviews/")
            || w.contains("/linnet-inventory-")
    };
    let own = what.iter().filter(|w| !agents(w)).count();
    s.initial_writes_per_rollout = own as f64 / n as f64;
    s.initial_agent_writes = (writes as usize - own) as f64;
    let mut by_kind: std::collections::BTreeMap<String, usize> = Default::default();
    for w in &what {
        let verb_resource = w.split('/').next().unwrap_or(w).to_string();
        *by_kind.entry(verb_resource).or_default() += 1;
    }
    log(&format!(
        "size {n}: initial sync: {writes} writes ({:.2} per rollout): {by_kind:?}",
        s.initial_writes_per_rollout
    ));

    // 1 and 5. Pushes, each changing one rollout's image: push -> CR write; canary pods Ready ->
    // linnet's next action (the CanaryActive status).
    log(&format!("size {n}: {} pushes", cfg.pushes));
    let reader = fetch::Reader::clone(&host.url, GIT_TOKEN, tmp.path());
    let mut fetched = Vec::new();
    let push_cpu_before = usage(agent.pid()).1;
    let mut images = vec![1usize; n];
    for k in 0..cfg.pushes {
        let i = k % n;
        let name = rollout_name(i);
        let (old, new) = (
            format!("bench:{}", images[i]),
            format!("bench:{}", images[i] + 1),
        );
        images[i] += 1;
        let want = new.clone();
        let written =
            support::first_seen(rollouts.clone(), support::watch_named(&name), move |o| {
                o.spec.image == want
            })
            .await;
        let want = new.clone();
        let ready = support::first_seen(
            pods.clone(),
            watcher::Config::default().labels(&format!("app={name}")),
            move |p: &Pod| {
                let image_ok = p.spec.as_ref().is_some_and(|sp| {
                    sp.containers
                        .iter()
                        .any(|c| c.image.as_deref() == Some(&want))
                });
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|st| st.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                image_ok && ready
            },
        )
        .await;
        let want = new.clone();
        let active = support::first_seen(rollouts.clone(), support::watch_named(&name), move |o| {
            phase(o) == Some(StatefulSetPhase::CanaryActive)
                && o.status.as_ref().and_then(|st| st.canary_image.as_deref()) == Some(&want)
        })
        .await;
        let file = host.work.join(spec_file(cfg, i));
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        std::fs::write(
            &file,
            text.replacen(
                &format!("\n  image: {old}\n"),
                &format!("\n  image: {new}\n"),
                1,
            ),
        )
        .map_err(|e| e.to_string())?;
        let pushed = push(&host.work, &format!("{name} {new}"));
        let written = tokio::time::timeout(Duration::from_secs(30), written)
            .await
            .map_err(|_| format!("push {k}: {name} never got {new}"))?
            .map_err(|e| e.to_string())?;
        s.push_to_write_ms.push(since_ms(written, pushed));
        // After the agent read it (it wrote the CR): the same fetch by git, under the
        // rollout's canary work as the agent's was under the last one's.
        fetched.push((git(&host.work, &["rev-parse", "HEAD"]), reader.fetch_ms()));
        let both = async { (ready.await, active.await) };
        let (ready, active) = tokio::time::timeout(Duration::from_secs(60), both)
            .await
            .map_err(|_| format!("push {k}: {name} never became CanaryActive on {new}"))?;
        let (ready, active) = (
            ready.map_err(|e| e.to_string())?,
            active.map_err(|e| e.to_string())?,
        );
        s.step_latency_ms.push(since_ms(active, ready).max(0.0));
    }
    settle(&agent, Duration::from_secs(3), slow).await;
    (s.webhook_to_read_ms, s.git_fetch_ms) =
        fetch::paired(&host.bare, &tmp.path().join("agent.log"), &fetched);
    log(&format!(
        "size {n}: webhook -> revision read {:.0} ms, git fetch {:.0} ms (medians)",
        stats(s.webhook_to_read_ms.clone()).0,
        stats(s.git_fetch_ms.clone()).0
    ));
    let (rss, cpu) = usage(agent.pid());
    s.rss_mib.push(rss);
    s.push_cpu_ms = (cpu - push_cpu_before) * 1000.0 / cfg.pushes.max(1) as f64;
    log(&format!(
        "size {n}: {:.1} ms of CPU per push",
        s.push_cpu_ms
    ));

    // 2, 3 and 6. Idle: the agent restarted (kill -9) with a 1 s poll; once it has caught up,
    // nothing changes for the idle window.
    log(&format!("size {n}: restart and idle for {:?}", cfg.idle));
    s.peak_first_mib = take_peak(agent.pid());
    agent.kill();
    let restarted = Instant::now();
    let idle_poll = std::env::var("LINNET_BENCH_IDLE_POLL").unwrap_or_else(|_| "1s".into());
    let mut agent = start_agent(
        cfg,
        tmp.path(),
        &host.url,
        &ns.name,
        agent.port,
        (&idle_poll, "1h"),
    );
    // Ready after the first sync, which at 10,000 rollouts (on a loaded API server) may take
    // longer than the 30 s a test allows.
    support::agent::wait_ready_within(&agent.base, Duration::from_secs(30 + n as u64 / 50)).await;
    log(&format!(
        "size {n}: ready {:.1} s after the restart",
        restarted.elapsed().as_secs_f64()
    ));
    settle(&agent, Duration::from_secs(3), slow).await;
    s.restart_settle_s = (restarted.elapsed().saturating_sub(Duration::from_secs(3))).as_secs_f64();
    s.peak_restart_mib = take_peak(agent.pid());
    let offset = audit_offset();
    let windows = 5;
    let m = agent.metrics().await;
    let mut polls = support::metric(&m, "linnet_git_fetch_duration_seconds_count");
    let mut cpu = usage(agent.pid()).1;
    for _ in 0..windows {
        let step = cfg.idle / windows;
        let until = Instant::now() + step;
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_secs(1).min(until - Instant::now())).await;
            s.rss_mib.push(usage(agent.pid()).0);
        }
        let m = agent.metrics().await;
        let (p, c) = (
            support::metric(&m, "linnet_git_fetch_duration_seconds_count"),
            usage(agent.pid()).1,
        );
        if p > polls {
            s.idle_cpu_per_poll_ms
                .push((c - cpu) * 1000.0 / (p - polls));
            s.idle_polls += (p - polls) as u64;
        }
        (polls, cpu) = (p, c);
    }
    let (writes, leases, what) = audit_writes(offset, audit_offset());
    s.idle_writes = writes;
    s.idle_lease_writes = leases;
    if writes > 0 {
        log(&format!("size {n}: writes while idle: {what:?}"));
    }

    // 7. Churn: one spec changed every second (an annotation, so no rollout starts).
    log(&format!("size {n}: churn for {:?}", cfg.churn));
    let cpu0 = usage(agent.pid()).1;
    let churn_started = Instant::now();
    let mut tick = 0usize;
    while churn_started.elapsed() < cfg.churn {
        let next = churn_started + Duration::from_secs(tick as u64 + 1);
        let name = rollout_name(tick % n);
        let file = host.work.join(spec_file(cfg, tick % n));
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        let value = format!("churn-{tick}");
        let text = match text.lines().find(|l| l.starts_with("    bench/churn: ")) {
            Some(line) => text.replacen(line, &format!("    bench/churn: {value}"), 1),
            None => text.replacen(
                &format!("  name: {name}\n"),
                &format!("  name: {name}\n  annotations:\n    bench/churn: {value}\n"),
                1,
            ),
        };
        std::fs::write(&file, text).map_err(|e| e.to_string())?;
        let want = value.clone();
        let written =
            support::first_seen(rollouts.clone(), support::watch_named(&name), move |o| {
                o.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("bench/churn"))
                    == Some(&want)
            })
            .await;
        let pushed = push(&host.work, &format!("churn {tick}"));
        if let Ok(Ok(at)) = tokio::time::timeout(Duration::from_secs(10), written).await {
            s.churn_push_to_write_ms.push(since_ms(at, pushed));
        }
        tick += 1;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
    let churn_secs = churn_started.elapsed().as_secs_f64();
    s.churn_cpu_percent = (usage(agent.pid()).1 - cpu0) * 100.0 / churn_secs;
    s.peak_steady_mib = take_peak(agent.pid());

    // 14. The drift check: restarted with a drift interval that falls after its catch-up, the
    // agent's CPU, peak memory and reads for one full comparison of every object.
    agent.kill();
    let drift = Duration::from_secs_f64(s.restart_settle_s * 1.5 + 15.0);
    let mut agent = start_agent(
        cfg,
        tmp.path(),
        &host.url,
        &ns.name,
        agent.port,
        ("1h", &format!("{}s", drift.as_secs())),
    );
    support::agent::wait_ready_within(&agent.base, Duration::from_secs(30 + n as u64 / 50)).await;
    settle(&agent, Duration::from_secs(3), slow).await;
    let syncs = |m: &str| support::metric(m, "linnet_sync_duration_seconds_count");
    let before = syncs(&agent.metrics().await);
    take_peak(agent.pid());
    let (cpu0, offset) = (usage(agent.pid()).1, audit_offset());
    let deadline = Instant::now() + drift * 2 + Duration::from_secs(30);
    while syncs(&agent.metrics().await) <= before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if syncs(&agent.metrics().await) > before {
        s.drift_cpu_ms = (usage(agent.pid()).1 - cpu0) * 1000.0;
        s.drift_peak_mib = take_peak(agent.pid());
        s.drift_reads = audit_reads(offset, audit_offset()).0 as f64;
        log(&format!(
            "size {n}: a drift check: {:.0} ms of CPU, peak {:.1} MiB, {} reads",
            s.drift_cpu_ms, s.drift_peak_mib, s.drift_reads
        ));
    } else {
        (s.drift_cpu_ms, s.drift_peak_mib, s.drift_reads) = (f64::NAN, f64::NAN, f64::NAN);
        log(&format!("size {n}: no drift check within {:?}", drift * 2));
    }
    log(&format!(
        "size {n}: done; {} commits on main",
        git(&host.bare, &["rev-list", "--count", "main"])
    ));

    agent.kill();
    drop(agent);
    deleted(admin, ns).await;
    if let Some(first_set) = first_set {
        log(&format!("size {n}: the same StatefulSets without linnet"));
        let floor = direct_sets_ready(admin, &first_set, n, slow * 3).await?;
        log(&format!(
            "size {n}: without linnet, every set created after {:.2} s and Ready after {:.2} s; \
             the StatefulSet controller wrote {:.2} statuses and {:.2} objects in all per set",
            floor.created_s, floor.ready_s, floor.status_writes, floor.controller_writes
        ));
        s.floor = Some(floor);
    }
    Ok(s)
}

/// What the control plane alone did for `n` of linnet's stable sets.
struct Floor {
    /// Seconds from the first create until every set was created.
    created_s: f64,
    /// Seconds from the first create until every set reported its replica Ready.
    ready_s: f64,
    /// The StatefulSet controller's status writes per set in that time.
    status_writes: f64,
    /// Its writes of every kind per set: status, ControllerRevisions, pods, and its (core
    /// v1) events.
    controller_writes: f64,
    /// kube-apiserver's CPU seconds from the first create until every set was Ready.
    apiserver_cpu_s: f64,
}

/// The StatefulSet controller's writes so far, by the API server's request counts (its
/// `/metrics`, which the admin may read): (set statuses, every kind). Only that controller
/// writes set statuses, ControllerRevisions, pods (not their status) and core v1 events
/// while the floor runs, if nothing else runs on the cluster: the scheduler's events are
/// `events.k8s.io`, kwok patches pod status. Refused requests count, as in the audit log.
async fn set_controller_writes(admin: &Client) -> Result<(f64, f64), String> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = admin
        .request_text(request)
        .await
        .map_err(|e| e.to_string())?;
    let requests =
        |labels: &[(&str, &str)]| support::metric_sum(&text, "apiserver_request_total", labels);
    let status = requests(&[
        ("resource", "statefulsets"),
        ("subresource", "status"),
        ("verb", "PUT"),
    ]);
    let others = requests(&[("resource", "controllerrevisions"), ("verb", "POST")])
        + requests(&[("resource", "pods"), ("subresource", ""), ("verb", "POST")])
        + requests(&[("group", ""), ("resource", "events"), ("verb", "POST")])
        + requests(&[("group", ""), ("resource", "events"), ("verb", "PATCH")]);
    Ok((status, status + others))
}

/// Figures 12 and 13 without linnet, on this machine: `n` copies of `first` (rollout 0's
/// stable set, as linnet made it) created straight through the API, 32 at a time as linnet's
/// reconciles run, in a namespace of their own. What is left of figure 13 above its time is
/// linnet's, and the StatefulSet controller's writes per set are Kubernetes' own count for
/// reporting the same start.
async fn direct_sets_ready(
    admin: &Client,
    first: &StatefulSet,
    n: usize,
    timeout: Duration,
) -> Result<Floor, String> {
    let ns = support::TestNamespace::create(admin, &format!("floor-{n}")).await;
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let mut template = first.clone();
    template.status = None;
    template.metadata = kube::api::ObjectMeta {
        name: template.metadata.name.take(),
        labels: template.metadata.labels.take(),
        annotations: template.metadata.annotations.take(),
        ..Default::default()
    };
    let template = serde_json::to_string(&template).map_err(|e| e.to_string())?;
    let before = set_controller_writes(admin).await?;
    let apiserver_at_start = apiserver_cpu();
    let started = Instant::now();
    let ready = count_seen(sets.clone(), n, timeout, |o: &StatefulSet| {
        o.status.as_ref().and_then(|st| st.ready_replicas) == Some(1)
    });
    let created = futures::stream::iter(0..n)
        .map(|i| {
            let sets = sets.clone();
            let json = template.replace(&rollout_name(0), &rollout_name(i));
            async move {
                let set: StatefulSet = serde_json::from_str(&json).map_err(|e| e.to_string())?;
                sets.create(&Default::default(), &set)
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("create {i}: {e}"))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>();
    // A failed create ends the wait for Ready at once.
    let created = async {
        created
            .await
            .into_iter()
            .collect::<Result<Vec<()>, String>>()?;
        Ok(Instant::now())
    };
    let (ready, created_at) = tokio::try_join!(ready, created)?;
    let apiserver_cpu_s = apiserver_cpu() - apiserver_at_start;
    let ready_s = (ready - started).as_secs_f64();
    let created_s = (created_at - started).as_secs_f64();
    // The last Ready set's status write is counted once its response is complete.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = set_controller_writes(admin).await?;
    deleted(admin, ns).await;
    Ok(Floor {
        created_s,
        ready_s,
        status_writes: (after.0 - before.0) / n as f64,
        controller_writes: (after.1 - before.1) / n as f64,
        apiserver_cpu_s,
    })
}

/// Deletes the namespace and waits (10 minutes at most) until it is gone: the next
/// measurement starts on a quiet cluster.
async fn deleted(admin: &Client, ns: support::TestNamespace) {
    let name = ns.name.clone();
    drop(ns);
    // Kept (at 100,000 rollouts, taking the cluster down is quicker than the deletion).
    if std::env::var_os("LINNET_KEEP_NAMESPACES").is_some() {
        return;
    }
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    while namespaces.get_opt(&name).await.ok().flatten().is_some() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn row(
    size: usize,
    figure: usize,
    unit: &'static str,
    v: Vec<f64>,
    target: &str,
    met: Option<bool>,
) -> Row {
    let samples = v.len();
    let (median, min, max) = stats(v);
    Row {
        size,
        figure: FIGURES[figure - 1],
        unit,
        median,
        min,
        max,
        samples,
        target: target.to_string(),
        met,
    }
}

/// Extra rows that explain the seven figures.
pub const CONTEXT: [&str; 17] = [
    "   leader-election lease writes in idle window",
    "   initial sync -> every rollout Stable (pods Ready)",
    "   restart (kill -9) -> caught up, no writes",
    "   push -> CR write under churn",
    "   idle polls measured",
    "   initial sync: every CR applied",
    "   initial sync: agent CPU time used",
    "   initial sync: linnet's gets and lists",
    "   initial sync: watches linnet opened",
    "   13 kube-apiserver CPU, start -> every rollout Stable",
    "   6 peak RSS: first sync and pushes",
    "   6 peak RSS: restart (kill -9) until caught up",
    "   6 peak RSS: caught up, idle and churn",
    "   12 initial sync: the agent's other writes (inventory, source status, access reviews)",
    "   a drift check (full comparison, Git unchanged): agent CPU",
    "   6 peak RSS: a drift check",
    "   a drift check: linnet's gets and lists",
];

/// Rows of figures 12 and 13 without linnet, at sizes up to `Config::floor_max`.
pub const FLOOR: [&str; 4] = [
    "   13 without linnet: its stable sets created directly -> every one Ready",
    "   12 without linnet: the StatefulSet controller's status writes per set",
    "   12 without linnet: the StatefulSet controller's writes per set (status, revision, pod, events)",
    "   13 without linnet: kube-apiserver CPU, first create -> every set Ready",
];

/// A peak of the agent's memory: under the shipped limit (256 MiB) at 10,000.
fn peak_row(size: usize, label: &'static str, peaks: Vec<f64>) -> Row {
    let met = (size >= 10_000).then(|| peaks.iter().all(|p| *p < 256.0));
    Row {
        figure: label,
        ..row(size, 6, "MiB", peaks, "< 256 MiB at 10,000", met)
    }
}

fn rows_for(size: usize, runs: &[Samples]) -> Vec<Row> {
    let all = |f: &dyn Fn(&Samples) -> Vec<f64>| runs.iter().flat_map(f).collect::<Vec<f64>>();
    let per_run = |f: &dyn Fn(&Samples) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
    let floor = |figure: usize, f: fn(&Floor) -> f64, unit: &'static str, label: &'static str| {
        let v = runs
            .iter()
            .filter_map(|s| s.floor.as_ref().map(f))
            .collect();
        Row {
            figure: label,
            ..row(size, figure, unit, v, "-", None)
        }
    };
    let push = all(&|s| s.push_to_write_ms.clone());
    let (pm, _, px) = stats(push.clone());
    let at_1000 = size >= 1000;
    let poll = all(&|s| s.idle_cpu_per_poll_ms.clone());
    let (poll_median, _, _) = stats(poll.clone());
    let writes = per_run(&|s| s.idle_writes as f64);
    let sync = per_run(&|s| s.initial_sync_s);
    let step = all(&|s| s.step_latency_ms.clone());
    let (sm, _, _) = stats(step.clone());
    let rss = all(&|s| s.rss_mib.clone());
    let (rss_median, _, _) = stats(rss.clone());
    let (sync_median, _, _) = stats(sync.clone());
    vec![
        row(
            size,
            1,
            "ms",
            push,
            "median < 300 ms, max < 1 s at 1,000",
            Some(pm < 300.0 && (!at_1000 || px < 1000.0)),
        ),
        row(
            size,
            2,
            "ms CPU",
            poll,
            "< 5 ms, flat",
            Some(poll_median < 5.0),
        ),
        row(
            size,
            3,
            "writes",
            writes.clone(),
            "0",
            Some(writes.iter().all(|w| *w == 0.0)),
        ),
        row(
            size,
            4,
            "s",
            sync,
            "< 30 s at 1,000",
            Some(sync_median < 30.0),
        ),
        row(size, 5, "ms", step, "median < 200 ms", Some(sm < 200.0)),
        if size >= 10_000 {
            row(
                size,
                6,
                "MiB",
                rss,
                "< 128 MiB at 10,000",
                Some(rss_median < 128.0),
            )
        } else {
            row(
                size,
                6,
                "MiB",
                rss,
                "< 64 MiB at 1,000",
                Some(rss_median < 64.0),
            )
        },
        row(
            size,
            7,
            "% of a core",
            per_run(&|s| s.churn_cpu_percent),
            "report",
            None,
        ),
        row(
            size,
            11,
            "ms CPU",
            per_run(&|s| s.push_cpu_ms),
            "at 10,000 < 1.5 x at 100",
            None,
        ),
        {
            let w = per_run(&|s| s.initial_writes_per_rollout);
            let met = w.iter().all(|w| *w <= 3.0);
            row(size, 12, "writes/rollout", w, "<= 3", Some(met))
        },
        {
            let ready = per_run(&|s| s.all_stable_s);
            let (m, _, _) = stats(ready.clone());
            let floors: Vec<f64> = runs
                .iter()
                .filter_map(|s| s.floor.as_ref().map(|f| f.ready_s))
                .collect();
            let (floor, _, _) = stats(floors);
            row(
                size,
                13,
                "s",
                ready,
                "< 1.3 x without linnet at 1,000",
                (size == 1000 && !floor.is_nan()).then_some(m < 1.3 * floor),
            )
        },
        Row {
            figure: CONTEXT[0],
            ..row(
                size,
                3,
                "writes",
                per_run(&|s| s.idle_lease_writes as f64),
                "-",
                None,
            )
        },
        floor(13, |f| f.ready_s, "s", FLOOR[0]),
        floor(12, |f| f.status_writes, "writes/set", FLOOR[1]),
        floor(12, |f| f.controller_writes, "writes/set", FLOOR[2]),
        floor(13, |f| f.apiserver_cpu_s, "s CPU", FLOOR[3]),
        Row {
            figure: CONTEXT[9],
            ..row(
                size,
                13,
                "s CPU",
                per_run(&|s| s.apiserver_cpu_s),
                "-",
                None,
            )
        },
        peak_row(size, CONTEXT[10], per_run(&|s| s.peak_first_mib)),
        peak_row(size, CONTEXT[11], per_run(&|s| s.peak_restart_mib)),
        peak_row(size, CONTEXT[12], per_run(&|s| s.peak_steady_mib)),
        Row {
            figure: CONTEXT[13],
            ..row(
                size,
                12,
                "writes",
                per_run(&|s| s.initial_agent_writes),
                "-",
                None,
            )
        },
        Row {
            figure: CONTEXT[14],
            ..row(size, 11, "ms", per_run(&|s| s.drift_cpu_ms), "-", None)
        },
        peak_row(size, CONTEXT[15], per_run(&|s| s.drift_peak_mib)),
        Row {
            figure: CONTEXT[16],
            ..row(size, 11, "reads", per_run(&|s| s.drift_reads), "-", None)
        },
        Row {
            figure: CONTEXT[2],
            ..row(size, 4, "s", per_run(&|s| s.restart_settle_s), "-", None)
        },
        Row {
            figure: CONTEXT[3],
            ..row(
                size,
                1,
                "ms",
                all(&|s| s.churn_push_to_write_ms.clone()),
                "-",
                None,
            )
        },
        Row {
            figure: CONTEXT[5],
            ..row(size, 4, "s", per_run(&|s| s.crs_applied_s), "-", None)
        },
        Row {
            figure: CONTEXT[6],
            ..row(
                size,
                4,
                "s CPU",
                per_run(&|s| s.initial_sync_cpu_s),
                "-",
                None,
            )
        },
        Row {
            figure: CONTEXT[7],
            ..row(
                size,
                4,
                "requests",
                per_run(&|s| s.initial_reads),
                "-",
                None,
            )
        },
        Row {
            figure: CONTEXT[8],
            ..row(
                size,
                4,
                "watches",
                per_run(&|s| s.initial_watches),
                "-",
                None,
            )
        },
        Row {
            figure: CONTEXT[4],
            ..row(
                size,
                2,
                "polls",
                per_run(&|s| s.idle_polls as f64),
                "-",
                None,
            )
        },
    ]
    .into_iter()
    .chain(fetch::rows(
        size,
        all(&|s| s.webhook_to_read_ms.clone()),
        all(&|s| s.git_fetch_ms.clone()),
    ))
    // The floor runs only up to `Config::floor_max`.
    .filter(|r| r.samples > 0 || !FLOOR.contains(&r.figure))
    .collect()
}

/// A TwoSets rollout of 2 replicas with one volume each, promoted as soon as its canary is
/// Ready: each push starts from Stable, the headline path of a stateful canary.
fn volume_spec(ns: &str, image: &str) -> String {
    format!(
        r#"apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryStatefulSet
metadata:
  name: vol
  namespace: {ns}
spec:
  replicas: 2
  canaryReplicas: 1
  image: {image}
  promotion:
    type: Auto
  template:
    serviceName: vol
    selector:
      matchLabels:
        app: vol
    template:
      metadata:
        labels:
          app: vol
      spec:
        containers:
        - name: app
          image: {image}
          volumeMounts:
          - name: data
            mountPath: /data
    volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        accessModes: [ReadWriteOnce]
        resources:
          requests:
            storage: 1Gi
"#
    )
}

/// Figure 8: `git push` of a new image -> the canary pod (on the replica's own volume, handed
/// over from the stable set) Ready, `pushes` times.
async fn volume_canary(cfg: &Config, admin: &Client) -> Result<Vec<f64>, String> {
    let ns = support::TestNamespace::create(admin, "bench-vol").await;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = support::ports::free_port();
    let host = git_host(
        cfg,
        tmp.path(),
        &ns.name,
        0,
        &format!("http://127.0.0.1:{port}"),
    );
    let file = host.work.join("apps/vol.yaml");
    std::fs::write(&file, volume_spec(&ns.name, "bench:1")).map_err(|e| e.to_string())?;
    git(&host.work, &["add", "-A"]);
    push(&host.work, "vol");
    let _agent = start_agent(cfg, tmp.path(), &host.url, &ns.name, port, ("1h", "1h"));
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    let stable_on = |image: String| {
        support::first_seen(rollouts.clone(), support::watch_named("vol"), move |o| {
            phase(o) == Some(StatefulSetPhase::Stable)
                && o.status.as_ref().and_then(|s| s.stable_image.as_deref()) == Some(&image)
        })
    };
    tokio::time::timeout(Duration::from_secs(120), async {
        stable_on("bench:1".into()).await.await
    })
    .await
    .map_err(|_| "vol never became Stable".to_string())?
    .map_err(|e| e.to_string())?;
    let mut samples = Vec::new();
    for k in 1..=cfg.pushes.min(7) {
        let (old, new) = (format!("bench:{k}"), format!("bench:{}", k + 1));
        let want = new.clone();
        let ready = support::first_seen(
            pods.clone(),
            watcher::Config::default().labels("app=vol,rollouts.linnet.dev/role=canary"),
            move |p: &Pod| {
                let image_ok = p.spec.as_ref().is_some_and(|sp| {
                    sp.containers
                        .iter()
                        .any(|c| c.image.as_deref() == Some(&want))
                });
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|st| st.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                image_ok && ready
            },
        )
        .await;
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        std::fs::write(&file, text.replace(&old, &new)).map_err(|e| e.to_string())?;
        let pushed = push(&host.work, &format!("vol {new}"));
        let ready = tokio::time::timeout(Duration::from_secs(60), ready)
            .await
            .map_err(|_| format!("volume push {k}: no Ready canary pod on {new}"))?
            .map_err(|e| e.to_string())?;
        samples.push(since_ms(ready, pushed));
        log(&format!(
            "volume push {k}: canary pod Ready after {:.0} ms",
            since_ms(ready, pushed)
        ));
        tokio::time::timeout(Duration::from_secs(120), async {
            stable_on(new.clone()).await.await
        })
        .await
        .map_err(|_| format!("vol never became Stable on {new}"))?
        .map_err(|e| e.to_string())?;
    }
    Ok(samples)
}

/// Runs every size `cfg.repeats` times and returns the rows, sizes in order.
pub async fn run(cfg: &Config) -> Result<Vec<Row>, String> {
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let mut rows = Vec::new();
    // LINNET_BENCH_ONLY=analysis measures figures 9 and 10 alone; =sharded, the sharded
    // first sync alone (with LINNET_BENCH_SHARDS).
    let only = std::env::var("LINNET_BENCH_ONLY").unwrap_or_default();
    let (only_analysis, only_sharded) = (only == "analysis", only == "sharded");
    let only_sittings = only == "sittings";
    if only == "shards" {
        let mut rows = Vec::new();
        for &n in &cfg.sizes {
            log(&format!("size {n}: {} shards, per shard", cfg.shards));
            rows.extend(sharded::per_shard(cfg, &admin, n, cfg.shards.max(2)).await?);
        }
        return Ok(rows);
    }
    let sittings_at = cfg
        .sizes
        .iter()
        .copied()
        .filter(|n| *n <= cfg.floor_max)
        .max();
    if only_sittings {
        let n = sittings_at.ok_or("LINNET_BENCH_ONLY=sittings: no size up to the floor's")?;
        return sittings::alternating(cfg, &admin, n, cfg.sittings, cfg.sitting_pushes).await;
    }
    if !only_analysis && !only_sharded {
        log("volume canary: TwoSets, one volume per replica");
        let volume = volume_canary(cfg, &admin).await?;
        let (vm, _, _) = stats(volume.clone());
        rows.push(row(1, 8, "ms", volume, "median < 2 s", Some(vm < 2000.0)));
    }
    for &n in &cfg.sizes {
        if only_sharded {
            log(&format!("size {n}: one agent, as sharded is measured"));
            rows.extend(sharded::first_sync(cfg, &admin, n, 1).await?);
            log(&format!("size {n}: {} shards", cfg.shards));
            rows.extend(sharded::first_sync(cfg, &admin, n, cfg.shards).await?);
            continue;
        }
        if !only_analysis {
            let mut runs = Vec::new();
            for r in 0..cfg.repeats {
                log(&format!("size {n}, run {} of {}", r + 1, cfg.repeats));
                runs.push(one_size(cfg, &admin, n).await?);
            }
            rows.extend(rows_for(n, &runs));
            if Some(n) == sittings_at && cfg.sittings > 0 {
                rows.extend(
                    sittings::alternating(cfg, &admin, n, cfg.sittings, cfg.sitting_pushes).await?,
                );
            }
            if cfg.shards > 1 {
                log(&format!("size {n}: {} shards", cfg.shards));
                rows.extend(sharded::first_sync(cfg, &admin, n, cfg.shards).await?);
            }
        }
        // LINNET_BENCH_ANALYSIS=0 leaves figures 9 and 10 out (make bench-large: another
        // 10,000 rollouts would double its time).
        if std::env::var("LINNET_BENCH_ANALYSIS").as_deref() == Ok("0") {
            continue;
        }
        log(&format!("size {n}: background analysis"));
        let (cpu, qps) = analysis_load(cfg, &admin, n).await?;
        rows.push(row(n, 9, "% of a core", vec![cpu], "report", None));
        rows.push(row(
            n,
            10,
            "/s",
            vec![qps],
            &format!("{:.0} (1 per rollout per 10 s)", n as f64 / 10.0),
            Some((qps - n as f64 / 10.0).abs() <= n as f64 / 10.0 * 0.2 + 0.5),
        ));
    }
    Ok(rows)
}

/// A CanaryDeployment of 2 replicas in 2 batches that pauses after the first, with a
/// background analysis of the error-rate template.
fn analysed_spec(name: &str, ns: &str, image: &str) -> String {
    format!(
        r#"apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryDeployment
metadata:
  name: {name}
  namespace: {ns}
spec:
  replicas: 2
  image: {image}
  strategy:
    type: Batches
  batches: 2
  pause: First
  analysis:
    background:
      templates:
      - templateName: error-rate
  template:
    selector:
      matchLabels:
        app: {name}
    template:
      metadata:
        labels:
          app: {name}
      spec:
        containers:
        - name: app
          image: {image}
"#
    )
}

/// Figures 9 and 10: `n` CanaryDeployments, each paused mid-rollout with a background
/// analysis that queries a real Prometheus every 10 s; the agent's CPU and the measurements
/// it took (its own counter) over `cfg.analysis_window`.
async fn analysis_load(cfg: &Config, admin: &Client, n: usize) -> Result<(f64, f64), String> {
    use linnet::api::{CanaryDeployment, DeploymentPhase};
    let ns = support::TestNamespace::create(admin, &format!("bench-an-{n}")).await;
    let exporter = support::prometheus::Exporter::start("bench").await;
    let prometheus = support::prometheus::Prometheus::start(&exporter).await;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = support::ports::free_port();
    let host = git_host(
        cfg,
        tmp.path(),
        &ns.name,
        0,
        &format!("http://127.0.0.1:{port}"),
    );
    std::fs::write(
        host.work.join("apps/error-rate.yaml"),
        format!(
            r#"apiVersion: rollouts.linnet.dev/v1alpha1
kind: AnalysisTemplate
metadata:
  name: error-rate
  namespace: {}
spec:
  metrics:
  - name: error-rate
    interval: 10s
    successCondition: result < 0.05
    provider:
      prometheus:
        address: {}
        query: sum(rate(app_errors_total{{app="bench"}}[1m])) / sum(rate(app_requests_total{{app="bench"}}[1m]))
"#,
            ns.name,
            prometheus.address()
        ),
    )
    .map_err(|e| e.to_string())?;
    for i in 0..n {
        let file = host.work.join(spec_file(cfg, i));
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(file, analysed_spec(&rollout_name(i), &ns.name, "bench:1"))
            .map_err(|e| e.to_string())?;
    }
    git(&host.work, &["add", "-A"]);
    push(&host.work, "analysed rollouts");
    let slow = Duration::from_secs(120 + n as u64 / 2);
    let rollouts: Api<CanaryDeployment> = Api::namespaced(admin.clone(), &ns.name);
    let mut agent = start_agent(cfg, tmp.path(), &host.url, &ns.name, port, ("1h", "1h"));
    count_seen(rollouts.clone(), n, slow * 3, |o: &CanaryDeployment| {
        o.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Completed)
    })
    .await?;
    for i in 0..n {
        let file = host.work.join(spec_file(cfg, i));
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        std::fs::write(&file, text.replace("bench:1", "bench:2")).map_err(|e| e.to_string())?;
    }
    push(&host.work, "every rollout to bench:2");
    count_seen(rollouts.clone(), n, slow * 3, |o: &CanaryDeployment| {
        o.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Paused)
    })
    .await?;
    // Every rollout's background analysis is under way; let first measurements pass.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let measured =
        |text: &str| support::metric_sum(text, "linnet_analysis_measurements_total", &[]);
    let (m0, cpu0, t0) = (
        measured(&agent.metrics().await),
        usage(agent.pid()).1,
        Instant::now(),
    );
    tokio::time::sleep(cfg.analysis_window).await;
    let (m1, cpu1, secs) = (
        measured(&agent.metrics().await),
        usage(agent.pid()).1,
        t0.elapsed().as_secs_f64(),
    );
    let (cpu, qps) = ((cpu1 - cpu0) * 100.0 / secs, (m1 - m0) / secs);
    log(&format!(
        "size {n}: background analysis: {cpu:.1}% of a core, {qps:.1} measurements/s over {secs:.0} s"
    ));
    agent.kill();
    drop(agent);
    deleted(admin, ns).await;
    Ok((cpu, qps))
}

fn fmt_value(v: f64, unit: &str) -> String {
    if v.is_nan() {
        return "-".into();
    }
    let digits = if unit == "ms CPU" || v.abs() < 10.0 && v.fract() != 0.0 {
        3
    } else {
        1
    };
    let digits = if unit == "writes" || unit == "polls" {
        0
    } else {
        digits
    };
    format!("{v:.digits$}")
}

/// The results as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| size | figure | unit | median | min | max | samples | target | met |\n|---:|---|---|---:|---:|---:|---:|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.size,
            r.figure.trim(),
            r.unit,
            fmt_value(r.median, r.unit),
            fmt_value(r.min, r.unit),
            fmt_value(r.max, r.unit),
            r.samples,
            r.target,
            match r.met {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "-",
            }
        ));
    }
    out
}
