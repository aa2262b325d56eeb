//! The chaos soak behind `make chaos` (and, short, `tests/chaos.rs`): rollouts of both kinds
//! and both StatefulSet strategies, with a volume per replica, rolled out again and again from
//! a Git repository served over smart HTTP, while the agent is killed with SIGKILL at a random
//! moment of each rollout. Seeded, so a failing run can be replayed.
//!
//! Each run pushes a new image for every rollout, waits a random time, uniform over a rollout's
//! life (measured by a first run without faults), kills the agent that holds the Lease, and
//! restarts it: half the time with the same identity (it takes its Lease back at once), half
//! the time with a new one, so the standby replica takes over when the Lease expires (a
//! handover), and some of those kill the new leader again during the handover. It then waits
//! for every rollout to be done on the new image and records how long that took from the
//! restart. Watches record, the whole time, any ordinal with two pods and any rollout whose
//! children ask for more replicas than its spec; after each run every replica's volume (name
//! and uid) is compared with the first run's. `make chaos` adds kube-apiserver restarts and
//! etcd freezes (SIGSTOP, then SIGCONT), each at a random moment of a rollout, and a Git outage
//! of 60 s, none with a kill of the agent (an agent that exits by itself is restarted, as its
//! Deployment would be, and counted). Lapsed waits for the agent's own writes are counted from
//! its log (issue 44: the target is 0).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use linnet::api::{CanaryDeployment, CanaryStatefulSet, DeploymentPhase, StatefulSetPhase};

use crate::support::{self, git};

const GIT_TOKEN: &str = "chaos-git-token";
/// The agents' Lease duration; a handover converges within it plus 10 s.
pub const LEASE_SECS: u64 = 4;

/// What to run.
pub struct Config {
    pub seed: u64,
    /// Runs with a kill of the agent.
    pub kills: usize,
    /// kube-apiserver restarts, each at a random moment of a rollout.
    pub apiserver_restarts: usize,
    /// Restarts of the whole control plane but etcd (kube-apiserver, kube-controller-manager
    /// and kube-scheduler together), each at a random moment of a rollout.
    pub control_plane_restarts: usize,
    /// etcd freezes (SIGSTOP for `etcd_freeze`, then SIGCONT), each at a random moment.
    pub etcd_freezes: usize,
    pub etcd_freeze: Duration,
    /// How long the Git remote is gone, once (zero: not at all).
    pub git_outage: Duration,
    pub linnet_bin: PathBuf,
}

/// A small seeded generator (xorshift64*): the same seed, the same kills.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What the soak saw.
#[derive(Debug, Default)]
pub struct Report {
    pub runs: usize,
    pub converged: usize,
    /// Seconds from the restart (or the fault's end) to every rollout done, per converged run.
    pub converge_s: Vec<f64>,
    pub handovers: usize,
    pub pvs_moved: usize,
    pub pvs_deleted: usize,
    pub two_pods_on_an_ordinal: Vec<String>,
    pub replicas_above_spec: Vec<String>,
    /// Runs that did not converge, with what was seen.
    pub stalls: Vec<String>,
    /// Seconds from the API server answering again to every rollout done, per restart.
    pub apiserver_restart_s: Vec<f64>,
    /// Seconds from the API server answering again to the agent putting back a rollout's spec
    /// edited in the cluster at that moment: its next needed action, whatever the
    /// controller-manager does.
    pub edit_reverted_s: Vec<f64>,
    /// Seconds from the control plane answering again to every rollout done, per restart.
    pub control_plane_restart_s: Vec<f64>,
    /// Seconds from etcd going on again to every rollout done, per freeze.
    pub etcd_freeze_s: Vec<f64>,
    /// Faults after which the rollouts were not done within their limit.
    pub fault_stalls: Vec<String>,
    /// Faults run, by kind.
    pub faults_run: FaultsRun,
    /// Agents that exited by themselves (restarted, as a Deployment would).
    pub agent_exits: usize,
    /// Waits for the agent's own write of a child that lapsed (log lines).
    pub own_write_lapses: usize,
    pub git_outage_s: Option<f64>,
    pub git_outage_run: bool,
    pub rollout_life_s: f64,
}

fn spec_files(ns: &str, image: &str) -> Vec<(String, String)> {
    let volume = "    volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        accessModes: [ReadWriteOnce]
        resources:
          requests:
            storage: 1Gi
";
    let sts = |name: &str, strategy: &str| {
        format!(
            "apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryStatefulSet
metadata:
  name: {name}
  namespace: {ns}
spec:
  replicas: 3
  canaryReplicas: 1
  image: {image}
  strategy:
    type: {strategy}
  promotion:
    type: Auto
  progressDeadlineSeconds: 600
  template:
    serviceName: {name}
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
          volumeMounts:
          - name: data
            mountPath: /data
{volume}"
        )
    };
    let web = format!(
        "apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryDeployment
metadata:
  name: web
  namespace: {ns}
spec:
  replicas: 4
  image: {image}
  strategy:
    type: Batches
  batches: 2
  pause: None
  progressDeadlineSeconds: 600
  template:
    selector:
      matchLabels:
        app: web
    template:
      metadata:
        labels:
          app: web
      spec:
        containers:
        - name: web
          image: {image}
"
    );
    vec![
        ("apps/two.yaml".into(), sts("two", "TwoSets")),
        ("apps/part.yaml".into(), sts("part", "Partition")),
        ("apps/web.yaml".into(), web),
    ]
}

/// Faults run, by kind.
#[derive(Debug, Default)]
pub struct FaultsRun {
    pub apiserver: usize,
    pub control_plane: usize,
    pub etcd: usize,
}

/// A fault of the control plane, numbered within its kind.
#[derive(Clone, Copy)]
enum Fault {
    ApiServer(usize),
    ControlPlane(usize),
    Etcd(usize),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::ApiServer(i) => write!(f, "kube-apiserver restart {i}"),
            Fault::ControlPlane(i) => write!(f, "control-plane restart {i}"),
            Fault::Etcd(i) => write!(f, "etcd freeze {i}"),
        }
    }
}

struct Agent {
    child: Child,
    identity: String,
}

impl Agent {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Harness<'a> {
    cfg: &'a Config,
    admin: Client,
    ns: String,
    dir: PathBuf,
    work: PathBuf,
    bare: PathBuf,
    url: String,
    starts: usize,
    agents: Vec<Agent>,
    /// Agents that exited by themselves during faults.
    exits: usize,
}

impl Harness<'_> {
    fn start_agent(&mut self, identity: &str) {
        self.starts += 1;
        let dir = self.dir.join(format!("agent-{identity}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("git-token"), GIT_TOKEN).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agents.log"))
            .unwrap();
        let child = Command::new(&self.cfg.linnet_bin)
            .arg("agent")
            .arg(format!("--repo-url={}", self.url))
            .args(["--git-username", "git", "--git-password-file"])
            .arg(dir.join("git-token"))
            .args(["--poll-interval", "1s", "--git-timeout", "10s"])
            .args([
                "--listen",
                &format!("127.0.0.1:{}", support::ports::free_port()),
                "--admin-listen",
                &format!("127.0.0.1:{}", support::ports::free_port()),
            ])
            .args(["--cache-dir", dir.join("cache").to_str().unwrap()])
            .args(["--source-name", &self.ns, "--allow-namespace", &self.ns])
            .args(["--apply-as", support::SOURCE_ACCOUNT])
            .args(["--lease-namespace", &self.ns])
            .args(["--lease-duration", &format!("{LEASE_SECS}s")])
            .args(["--lease-identity", identity])
            .args(["--writeback=false"])
            .env("KUBECONFIG", support::linnet_kubeconfig())
            .env(
                "RUST_LOG",
                std::env::var("LINNET_CHAOS_LOG").unwrap_or_else(|_| "linnet=info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.agents.push(Agent {
            child,
            identity: identity.to_string(),
        });
    }

    async fn leader(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(self.admin.clone(), &self.ns);
        let lease = leases
            .get_opt(&format!("linnet-{}", self.ns))
            .await
            .ok()
            .flatten()?;
        lease.spec?.holder_identity
    }

    /// Restarts every agent that exited by itself, as its Deployment would; how many.
    fn restart_exited(&mut self) -> usize {
        let exited: Vec<String> = self
            .agents
            .iter_mut()
            .filter_map(|a| matches!(a.child.try_wait(), Ok(Some(_))).then(|| a.identity.clone()))
            .collect();
        for identity in &exited {
            self.kill(identity);
            self.start_agent(identity);
        }
        exited.len()
    }

    /// [`Harness::converge`] after a fault, restarting agents that exit meanwhile.
    async fn converge_after_fault(
        &mut self,
        image: &str,
        limit: Duration,
    ) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            match self.done_on(image).await {
                Ok(()) => return Ok(started.elapsed()),
                Err(what) if started.elapsed() > limit => return Err(what),
                Err(_) => {
                    // The control plane's own processes, as their supervisor would: a
                    // scheduler that lost its leader election in an API server restart exits.
                    if started.elapsed().as_millis() % 2000 < 250 {
                        let _ = Command::new(concat!(
                            env!("CARGO_MANIFEST_DIR"),
                            "/tests/cluster/revive.sh"
                        ))
                        .status();
                    }
                    let exits = self.restart_exited();
                    if exits > 0 {
                        log(&format!(
                            "{exits} agent(s) exited during a fault; restarted"
                        ));
                    }
                    self.exits += exits;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Kills the agent named `identity` (SIGKILL).
    fn kill(&mut self, identity: &str) {
        self.agents.retain(|a| a.identity != identity);
    }

    fn push_image(&self, image: &str, to: &Path) {
        for (path, text) in spec_files(&self.ns, image) {
            std::fs::write(self.work.join(path), text).unwrap();
        }
        git(&self.work, &["add", "-A"]);
        git(&self.work, &["commit", "-qm", image]);
        git(
            &self.work,
            &["push", "-q", to.to_str().unwrap(), "HEAD:main"],
        );
    }

    /// Whether every rollout is done on `image`, and if not, what each shows.
    async fn done_on(&self, image: &str) -> Result<(), String> {
        let csts: Api<CanaryStatefulSet> = Api::namespaced(self.admin.clone(), &self.ns);
        let cdeploy: Api<CanaryDeployment> = Api::namespaced(self.admin.clone(), &self.ns);
        let mut not = Vec::new();
        for name in ["two", "part"] {
            let s = csts
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|r| r.status)
                .unwrap_or_default();
            let ok = s.phase == Some(StatefulSetPhase::Stable)
                && s.stable_image.as_deref() == Some(image)
                && s.ready.as_deref() == Some("3/3");
            if !ok {
                not.push(format!(
                    "{name}: {:?} {:?} {:?}",
                    s.phase, s.ready, s.message
                ));
            }
        }
        let s = cdeploy
            .get_opt("web")
            .await
            .ok()
            .flatten()
            .and_then(|r| r.status)
            .unwrap_or_default();
        let ok = s.phase == Some(DeploymentPhase::Completed)
            && s.stable_image.as_deref() == Some(image)
            && s.ready.as_deref() == Some("4/4");
        if !ok {
            not.push(format!("web: {:?} {:?} {:?}", s.phase, s.ready, s.message));
        }
        if not.is_empty() {
            Ok(())
        } else {
            Err(not.join("; "))
        }
    }

    /// Waits up to `limit` for every rollout to be done on `image`; the time it took.
    /// Waits until every rollout is done on `image`, restarting agents that exit by
    /// themselves meanwhile (as their Deployment would: an agent that loses the Lease exits on
    /// purpose), counted in `exits`.
    async fn converge(&mut self, image: &str, limit: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            match self.done_on(image).await {
                Ok(()) => return Ok(started.elapsed()),
                Err(what) if started.elapsed() > limit => return Err(what),
                Err(_) => {
                    let exits = self.restart_exited();
                    if exits > 0 {
                        log(&format!("{exits} agent(s) exited by themselves; restarted"));
                    }
                    self.exits += exits;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// The error for a run that never converged: what each rollout shows, which agents
    /// still run, and the agents' log kept in `target/` (the scratch directory goes with the
    /// harness).
    fn never_converged(&mut self, run: &str, what: &str) -> String {
        let running: Vec<String> = self
            .agents
            .iter_mut()
            .map(|a| match a.child.try_wait() {
                Ok(None) => format!("{} running", a.identity),
                Ok(Some(status)) => format!("{} exited ({status})", a.identity),
                Err(e) => format!("{} unknown ({e})", a.identity),
            })
            .collect();
        let kept = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chaos-agents.log");
        let log = match std::fs::copy(self.dir.join("agents.log"), &kept) {
            Ok(_) => format!("the agents' log is kept in {}", kept.display()),
            Err(e) => format!("the agents' log could not be kept: {e}"),
        };
        format!(
            "{run} never converged: {what}; agents: {}; {log}",
            running.join(", ")
        )
    }

    /// Edits rollout `two`'s spec in the cluster, as a person with kubectl would, and waits
    /// for the agent to put Git's back; the time from the edit.
    async fn edit_reverted(&self, limit: Duration) -> Result<Duration, String> {
        let api: Api<CanaryStatefulSet> = Api::namespaced(self.admin.clone(), &self.ns);
        let started = Instant::now();
        let edit = serde_json::json!({"spec": {"progressDeadlineSeconds": 599}});
        // The API server may refuse a write for a moment after its /readyz answers.
        while let Err(e) = api
            .patch("two", &PatchParams::default(), &Patch::Merge(&edit))
            .await
        {
            if started.elapsed() > limit {
                return Err(format!("could not edit: {e}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        loop {
            let deadline = api
                .get_opt("two")
                .await
                .ok()
                .flatten()
                .map(|r| r.spec.progress_deadline_seconds);
            if deadline == Some(600) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > limit {
                return Err(format!("progressDeadlineSeconds still {deadline:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Ordinal -> (PV name, uid) of each StatefulSet rollout, from its bound claims.
    async fn volumes(&self) -> BTreeMap<String, (String, String)> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.admin.clone(), &self.ns);
        let pvs: Api<PersistentVolume> = Api::all(self.admin.clone());
        let mut out = BTreeMap::new();
        for c in claims.list(&Default::default()).await.unwrap().items {
            let bound = c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            let (Some(pv), true) = (c.spec.as_ref().and_then(|s| s.volume_name.clone()), bound)
            else {
                continue;
            };
            let name = c.name_any();
            let rollout = c
                .labels()
                .get(linnet::api::ROLLOUT_LABEL)
                .cloned()
                .unwrap_or_default();
            let ordinal = name.rsplit('-').next().unwrap_or_default().to_string();
            let uid = pvs
                .get_opt(&pv)
                .await
                .ok()
                .flatten()
                .and_then(|p| p.metadata.uid)
                .unwrap_or_default();
            out.insert(format!("{rollout}/{ordinal}"), (pv, uid));
        }
        out
    }
}

/// Watches pods and workloads for the whole soak, recording what must never happen.
fn watch_invariants(admin: &Client, ns: &str, report: Arc<Mutex<Report>>) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let seen: Arc<Mutex<BTreeMap<String, (String, String)>>> = Arc::default();
    let rep = report.clone();
    tokio::spawn(async move {
        let mut stream = watcher(pods, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = stream.next().await {
            let mut seen = seen.lock().unwrap();
            match event {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    let rollout = p.labels().get(linnet::api::ROLLOUT_LABEL).cloned();
                    let ordinal = p.labels().get("apps.kubernetes.io/pod-index").cloned();
                    if let (Some(r), Some(o)) = (rollout, ordinal) {
                        seen.insert(p.name_any(), (r, o));
                    }
                }
                watcher::Event::Delete(p) => {
                    seen.remove(&p.name_any());
                }
                _ => continue,
            }
            let mut per: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
            for (pod, key) in seen.iter() {
                per.entry(key.clone()).or_default().push(pod.clone());
            }
            for ((r, o), pods) in per.into_iter().filter(|(_, p)| p.len() > 1) {
                let what = format!("{r} ordinal {o}: {}", pods.join(", "));
                let mut rep = rep.lock().unwrap();
                if !rep.two_pods_on_an_ordinal.contains(&what) {
                    rep.two_pods_on_an_ordinal.push(what);
                }
            }
        }
    });
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    let asked: Arc<Mutex<BTreeMap<String, (String, i32)>>> = Arc::default();
    let check = move |name: String, rollout: Option<String>, replicas: i32| {
        let Some(rollout) = rollout else { return };
        let mut asked = asked.lock().unwrap();
        asked.insert(name, (rollout.clone(), replicas));
        let total: i32 = asked
            .values()
            .filter(|(r, _)| *r == rollout)
            .map(|(_, n)| n)
            .sum();
        // A StatefulSet rollout never runs more than its replicas (one pod per ordinal and
        // volume). A batched rollout asks for at most its replicas plus what the running
        // batch adds (docs/canarydeployment.md): 4 + 3 for the second of two batches.
        let (spec, bound) = if rollout == "web" { (4, 7) } else { (3, 3) };
        if total > bound {
            let what = format!("{rollout}: {total} replicas asked for {spec} (at most {bound})");
            let mut rep = report.lock().unwrap();
            if !rep.replicas_above_spec.contains(&what) {
                rep.replicas_above_spec.push(what);
            }
        }
    };
    let check = Arc::new(check);
    let c = check.clone();
    tokio::spawn(async move {
        let mut stream = watcher(sets, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = stream.next().await {
            if let watcher::Event::Apply(s) | watcher::Event::InitApply(s) = event {
                let replicas = s.spec.as_ref().and_then(|x| x.replicas).unwrap_or(0);
                c(
                    s.name_any(),
                    s.labels().get(linnet::api::ROLLOUT_LABEL).cloned(),
                    replicas,
                );
            } else if let watcher::Event::Delete(s) = event {
                c(
                    s.name_any(),
                    s.labels().get(linnet::api::ROLLOUT_LABEL).cloned(),
                    0,
                );
            }
        }
    });
    tokio::spawn(async move {
        let mut stream = watcher(deployments, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = stream.next().await {
            if let watcher::Event::Apply(d) | watcher::Event::InitApply(d) = event {
                let replicas = d.spec.as_ref().and_then(|x| x.replicas).unwrap_or(0);
                check(
                    d.name_any(),
                    d.labels().get(linnet::api::ROLLOUT_LABEL).cloned(),
                    replicas,
                );
            } else if let watcher::Event::Delete(d) = event {
                check(
                    d.name_any(),
                    d.labels().get(linnet::api::ROLLOUT_LABEL).cloned(),
                    0,
                );
            }
        }
    });
}

fn log(msg: &str) {
    eprintln!("chaos: {msg}");
}

/// Runs the soak; the report, or why it could not run.
pub async fn run(cfg: &Config) -> Result<Report, String> {
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "chaos").await;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let bare = tmp.path().join("repos/gitops.git");
    std::fs::create_dir_all(&bare).unwrap();
    git(&bare, &["init", "--bare", "-q"]);
    let work = tmp.path().join("work");
    git(tmp.path(), &["clone", "-q", bare.to_str().unwrap(), "work"]);
    std::fs::create_dir_all(work.join("apps")).unwrap();
    let server = support::git_http::serve(tmp.path().join("repos"), Some(("git", GIT_TOKEN)));
    let report = Arc::new(Mutex::new(Report::default()));
    watch_invariants(&admin, &ns.name, report.clone());
    let mut h = Harness {
        cfg,
        admin: admin.clone(),
        ns: ns.name.clone(),
        dir: tmp.path().to_path_buf(),
        work,
        bare: bare.clone(),
        url: format!("{server}/gitops.git"),
        starts: 0,
        agents: Vec::new(),
        exits: 0,
    };
    let mut rng = Rng::new(cfg.seed);

    // Two replicas, as deployed; the first run, without faults, measures a rollout's life.
    h.start_agent("a-0");
    h.start_agent("b-0");
    h.push_image("chaos:1", &bare);
    h.converge("chaos:1", Duration::from_secs(180))
        .await
        .map_err(|e| format!("the first rollout never finished: {e}"))?;
    let first_volumes = h.volumes().await;
    let all_pvs: BTreeSet<String> = first_volumes.values().map(|(_, uid)| uid.clone()).collect();
    h.push_image("chaos:2", &bare);
    let life = h
        .converge("chaos:2", Duration::from_secs(180))
        .await
        .map_err(|e| format!("the second rollout never finished: {e}"))?;
    report.lock().unwrap().rollout_life_s = life.as_secs_f64();
    log(&format!(
        "a rollout takes {:.1} s; seed {}",
        life.as_secs_f64(),
        cfg.seed
    ));

    let limit = Duration::from_secs(LEASE_SECS + 10);
    for run in 0..cfg.kills {
        let image = format!("chaos:{}", run + 3);
        h.push_image(&image, &bare);
        let delay = life.mul_f64(rng.unit());
        tokio::time::sleep(delay).await;
        let leader = h
            .leader()
            .await
            .unwrap_or_else(|| h.agents[0].identity.clone());
        h.kill(&leader);
        let handover = rng.unit() < 0.5;
        let mut restarted = Instant::now();
        if handover {
            // A new identity: the standby takes over when the Lease expires.
            let (side, _) = leader.split_once('-').unwrap_or(("a", ""));
            h.start_agent(&format!("{side}-{}", h.starts));
            report.lock().unwrap().handovers += 1;
            if rng.unit() < 0.3 {
                // Kill the new leader during the handover, and restart it at once.
                let wait = Duration::from_secs_f64(LEASE_SECS as f64 * rng.unit());
                tokio::time::sleep(wait).await;
                if let Some(next) = h.leader().await.filter(|l| *l != leader) {
                    h.kill(&next);
                    h.start_agent(&next);
                    restarted = Instant::now();
                }
            }
        } else {
            h.start_agent(&leader);
        }
        let outcome = h.converge(&image, limit).await;
        let stalled = {
            let mut rep = report.lock().unwrap();
            rep.runs += 1;
            match outcome {
                Ok(_) => {
                    rep.converged += 1;
                    rep.converge_s.push(restarted.elapsed().as_secs_f64());
                    None
                }
                Err(what) => {
                    rep.stalls.push(format!(
                        "run {run} (kill after {:.2} s, handover {handover}): {what}",
                        delay.as_secs_f64()
                    ));
                    Some(what)
                }
            }
        };
        if let Some(what) = stalled {
            log(&format!(
                "run {run} did not converge in time; waiting on: {what}"
            ));
            if let Err(what) = h.converge(&image, Duration::from_secs(180)).await {
                return Err(h.never_converged(&format!("run {run}"), &what));
            }
            continue;
        }
        let volumes = h.volumes().await;
        let mut rep = report.lock().unwrap();
        rep.pvs_moved += volumes
            .iter()
            .filter(|(k, v)| first_volumes.get(*k).is_some_and(|f| f != *v))
            .count();
        let now: BTreeSet<String> = volumes.values().map(|(_, uid)| uid.clone()).collect();
        rep.pvs_deleted = all_pvs.difference(&now).count();
        if run % 10 == 9 {
            log(&format!("{} runs, {} converged", rep.runs, rep.converged));
        }
    }

    let faults = cfg.apiserver_restarts + cfg.control_plane_restarts + cfg.etcd_freezes;
    let mut next_image = cfg.kills + 3;
    for i in 0..faults {
        let image = format!("chaos:{next_image}");
        next_image += 1;
        h.push_image(&image, &bare);
        tokio::time::sleep(life.mul_f64(rng.unit())).await;
        let fault = if i < cfg.apiserver_restarts {
            Fault::ApiServer(i)
        } else if i < cfg.apiserver_restarts + cfg.control_plane_restarts {
            Fault::ControlPlane(i - cfg.apiserver_restarts)
        } else {
            Fault::Etcd(i - cfg.apiserver_restarts - cfg.control_plane_restarts)
        };
        match fault {
            Fault::ApiServer(_) | Fault::ControlPlane(_) => {
                // Restarted mid-rollout with the same flags; with the controllers, as a
                // control-plane node's restart would.
                let mut restart = Command::new(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/cluster/restart-apiserver.sh"
                ));
                if matches!(fault, Fault::ControlPlane(_)) {
                    restart.arg("--with-controllers");
                }
                let status = restart.status().map_err(|e| e.to_string())?;
                if !status.success() {
                    return Err(format!("{fault}: the restart script failed"));
                }
            }
            Fault::Etcd(_) => {
                // etcd stops answering (a frozen disk, a paused VM), then goes on.
                let pid = std::fs::read_to_string(support::cluster_dir().join("pid/etcd.pid"))
                    .map_err(|e| e.to_string())?;
                let signal = |sig: &str| {
                    Command::new("kill")
                        .args([sig, pid.trim()])
                        .status()
                        .map_err(|e| e.to_string())
                };
                signal("-STOP")?;
                tokio::time::sleep(cfg.etcd_freeze).await;
                signal("-CONT")?;
            }
        }
        let what = fault.to_string();
        let back = Instant::now();
        if matches!(fault, Fault::ApiServer(_)) {
            // The agent's own next action, which needs no controller-manager: a rollout
            // edited in the cluster now is put back (its watches work again, and it acts).
            let reverted = h.edit_reverted(limit).await;
            let mut rep = report.lock().unwrap();
            match reverted {
                Ok(took) => rep.edit_reverted_s.push(took.as_secs_f64()),
                Err(not) => rep
                    .fault_stalls
                    .push(format!("{what}: edit not reverted: {not}")),
            }
        }
        // After an API server restart alone, the controller-manager may lag for a minute
        // (see restart-apiserver.sh): that fault is judged by the revert above, and its
        // convergence is recorded as it comes.
        let converge_limit = match fault {
            Fault::ApiServer(_) => Duration::from_secs(240),
            _ => limit,
        };
        let outcome = h.converge_after_fault(&image, converge_limit).await;
        let stalled = {
            let mut guard = report.lock().unwrap();
            let rep = &mut *guard;
            let (run, converged) = match fault {
                Fault::ApiServer(_) => {
                    (&mut rep.faults_run.apiserver, &mut rep.apiserver_restart_s)
                }
                Fault::ControlPlane(_) => (
                    &mut rep.faults_run.control_plane,
                    &mut rep.control_plane_restart_s,
                ),
                Fault::Etcd(_) => (&mut rep.faults_run.etcd, &mut rep.etcd_freeze_s),
            };
            *run += 1;
            match outcome {
                Ok(_) => {
                    converged.push(back.elapsed().as_secs_f64());
                    false
                }
                Err(not) => {
                    rep.fault_stalls.push(format!("{what}: {not}"));
                    true
                }
            }
        };
        if stalled {
            log(&format!("{what} did not converge in time; waiting on"));
            if let Err(not) = h
                .converge_after_fault(&image, Duration::from_secs(240))
                .await
            {
                return Err(h.never_converged(&what, &not));
            }
        }
    }
    if !cfg.git_outage.is_zero() {
        report.lock().unwrap().git_outage_run = true;
        // The Git remote gone for a while; a push lands meanwhile.
        let image = format!("chaos:{next_image}");
        let down = h.bare.with_extension("git.down");
        std::fs::rename(&h.bare, &down).map_err(|e| e.to_string())?;
        h.push_image(&image, &down);
        tokio::time::sleep(cfg.git_outage).await;
        std::fs::rename(&down, &h.bare).map_err(|e| e.to_string())?;
        let back = Instant::now();
        let ok = h
            .converge_after_fault(&image, Duration::from_secs(120))
            .await;
        report.lock().unwrap().git_outage_s = ok.ok().map(|_| back.elapsed().as_secs_f64());
    }
    report.lock().unwrap().agent_exits = h.exits;
    // Every agent logs to one file: a lapsed own-write wait is a WARN line there.
    report.lock().unwrap().own_write_lapses = std::fs::read_to_string(h.dir.join("agents.log"))
        .unwrap_or_default()
        .matches("the watch never showed this agent's write of a child")
        .count();
    drop(h);
    let mut out = std::mem::take(&mut *report.lock().unwrap());
    out.runs = out.runs.max(out.converge_s.len());
    Ok(out)
}

/// "median / max" of a list of seconds.
fn pair(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".to_string();
    }
    let (median, max) = stats(v);
    format!("{median:.1} / {max:.1} s")
}

fn stats(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[v.len() - 1])
}

/// The report as a Markdown table.
pub fn table(r: &Report) -> String {
    let (median, max) = stats(&r.converge_s);
    let opt = |v: Option<f64>| match v {
        Some(s) => format!("{s:.1} s"),
        None if r.git_outage_run => "did not converge".to_string(),
        None => "not run".to_string(),
    };
    let mut out = String::from("| figure | value | target |\n|---|---:|---|\n");
    for (figure, value, target) in [
        (
            "runs (kill -9 at a random moment)",
            r.runs.to_string(),
            "≥ 200 for `make chaos`".to_string(),
        ),
        (
            "  of them, handovers to the standby",
            r.handovers.to_string(),
            "-".to_string(),
        ),
        (
            "converged",
            format!("{} of {}", r.converged, r.runs),
            "all".to_string(),
        ),
        (
            "restart -> converged, median",
            format!("{median:.1} s"),
            "-".to_string(),
        ),
        (
            "restart -> converged, max",
            format!("{max:.1} s"),
            format!("< {} s (lease + 10 s)", LEASE_SECS + 10),
        ),
        ("PVs moved", r.pvs_moved.to_string(), "0".to_string()),
        ("PVs deleted", r.pvs_deleted.to_string(), "0".to_string()),
        (
            "ordinals with two pods",
            r.two_pods_on_an_ordinal.len().to_string(),
            "0".to_string(),
        ),
        (
            "replica counts above the spec",
            r.replicas_above_spec.len().to_string(),
            "0".to_string(),
        ),
        (
            "kube-apiserver restarts, converged",
            format!(
                "{} of {}",
                r.apiserver_restart_s.len(),
                r.faults_run.apiserver
            ),
            "all".to_string(),
        ),
        (
            "  API server back -> a rollout edited then put back, median / max",
            pair(&r.edit_reverted_s),
            format!("max < {} s (lease + 10 s)", LEASE_SECS + 10),
        ),
        (
            "  API server back -> converged, median / max",
            pair(&r.apiserver_restart_s),
            "converges (the controller-manager's own lag included)".to_string(),
        ),
        (
            "control-plane restarts (API server, controller-manager, scheduler), converged",
            format!(
                "{} of {}",
                r.control_plane_restart_s.len(),
                r.faults_run.control_plane
            ),
            "all".to_string(),
        ),
        (
            "  control plane back -> converged, median / max",
            pair(&r.control_plane_restart_s),
            format!("max < {} s (lease + 10 s)", LEASE_SECS + 10),
        ),
        (
            "etcd freezes, converged",
            format!("{} of {}", r.etcd_freeze_s.len(), r.faults_run.etcd),
            "all".to_string(),
        ),
        (
            "  etcd back -> converged, median / max",
            pair(&r.etcd_freeze_s),
            format!("max < {} s (lease + 10 s)", LEASE_SECS + 10),
        ),
        (
            "agents that exited by themselves (restarted)",
            r.agent_exits.to_string(),
            "-".to_string(),
        ),
        (
            "lapsed waits for the agent's own writes",
            r.own_write_lapses.to_string(),
            "0".to_string(),
        ),
        (
            "Git remote down, back -> converged",
            opt(r.git_outage_s),
            "converges, agent not restarted".to_string(),
        ),
        (
            "a rollout's life (the kill window)",
            format!("{:.1} s", r.rollout_life_s),
            "-".to_string(),
        ),
    ] {
        out.push_str(&format!("| {figure} | {value} | {target} |\n"));
    }
    for s in r
        .stalls
        .iter()
        .chain(&r.fault_stalls)
        .chain(&r.two_pods_on_an_ordinal)
        .chain(&r.replicas_above_spec)
    {
        out.push_str(&format!("\n- {s}"));
    }
    out.push('\n');
    out
}
