//! `make demo`: linnet's main job on the local control plane, told step by step.
//!
//! A local Git server stands in for the Git host: a bare repository seeded from
//! `examples/gitops-repo`, served over smart HTTP (`git http-backend`, token auth), whose
//! `post-receive` hook sends a signed GitHub push webhook to the agent, as GitHub would. The
//! agent runs as its ServiceAccount from `deploy/`. The agent follows it (with a one-hour poll, so every change
//! below arrives by webhook), and the story is played by pushing commits:
//!
//! 1. the first sync: redis (a CanaryStatefulSet) and web (a CanaryDeployment) come up;
//! 2. a push of a new redis image: a canary on replica 2, on replica 2's own volume;
//! 3. a "merged pull request" that sets the promote annotation: promoted;
//! 4. a push of a `…:broken` image: rolled back by itself at the deadline;
//! 5. a push of a new web image: batch 1, a pause, then a `currentBatch` bump: done;
//! 6. a push of another web image with an analysis gate: its pods are Ready, but a real
//!    Prometheus (built from its Go module) sees 30% of its requests fail against the stable
//!    version's 0.5%, so the statistical judge (Mann-Whitney, as Kayenta) fails the gate and
//!    linnet rolls back, its verdict naming both medians, the p-value and the samples;
//! 7. traffic shifting through a real gateway;
//! 8. on the real node (where the machine can run one): a key-value store's canary and
//!    promotion on pods that really run, and the keys each replica still holds;
//! 9. image automation: a new tag pushed to a local registry (and its webhook) makes linnet
//!    commit the tag to Git and canary it, with no edit of Git by hand.
//!
//! It exits non-zero, naming the step, if anything does not happen in time. It expects the
//! control plane from `make cluster-up` and the binary from `cargo build`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

// The tests' Git server: the real `git http-backend` behind a small HTTP server.
#[path = "../tests/support/gateway.rs"]
mod gateway;
#[path = "../tests/support/git_http.rs"]
mod git_http;
// gateway.rs's load of gRPC calls, unused by the demo.
#[path = "../tests/support/grpc.rs"]
mod grpc;
#[path = "demo/images.rs"]
mod images;
#[path = "../tests/support/ports.rs"]
mod ports;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/prometheus.rs"]
mod prometheus;
#[path = "../tests/support/push_hook.rs"]
mod push_hook;
#[path = "demo/real_pods.rs"]
mod real_pods;
#[path = "../tests/support/registry.rs"]
mod registry;
#[path = "demo/setup.rs"]
mod setup;
#[path = "../tests/support/tls.rs"]
#[allow(dead_code)]
mod tls;
#[path = "demo/traffic.rs"]
mod traffic;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use linnet::api::{CanaryDeployment, CanaryStatefulSet, DeploymentPhase, StatefulSetPhase};

const NS: &str = "demo";
const SECRET: &str = "demo-webhook-secret";
const GIT_TOKEN: &str = "demo-git-token";

use setup::{Step, fresh_namespace, git, install_crds, say, service_account_kubeconfig, wait};

struct Demo {
    client: Client,
    work: PathBuf,
    bare: PathBuf,
    agent: Child,
    started: Instant,
    /// The linnet binary, for `linnet get -w`.
    bin: String,
    /// A scratch directory for `linnet get -w`'s output.
    scratch: PathBuf,
    /// The agent's webhook address.
    hooks: String,
    /// The dashboard's address.
    dashboard: String,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
    }
}

impl Demo {
    /// Starts `linnet get -w NAME -n demo`, its frames going to a file (not a terminal, so
    /// each drawing follows the last after a line of dashes).
    fn watch(&self, name: &str) -> Step<(Child, PathBuf)> {
        let out = self.scratch.join(format!("get-{name}.txt"));
        let file = std::fs::File::create(&out).map_err(|e| e.to_string())?;
        let child = Command::new(&self.bin)
            .args(["get", "-w", name, "-n", NS])
            .stdout(file)
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start linnet get -w: {e}"))?;
        Ok((child, out))
    }

    /// Waits until a `linnet get -w` has drawn `phase` (it draws every change, so it must),
    /// stops it, and prints how often it drew and its last drawing.
    async fn show_watch(
        &self,
        name: &str,
        phase: &str,
        (mut child, out): (Child, PathBuf),
    ) -> Step<()> {
        let drawn = format!("Phase:       {phase}");
        let seen = wait(&format!("linnet get -w to draw {phase}"), 10, || async {
            let text = std::fs::read_to_string(&out).ok()?;
            let last = text.rsplit(&"-".repeat(78)).next()?;
            last.contains(&drawn).then_some(())
        })
        .await;
        let _ = child.kill();
        let _ = child.wait();
        let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
        let frames: Vec<&str> = text
            .split(&"-".repeat(78))
            .filter(|f| !f.trim().is_empty())
            .collect();
        let Some(last) = frames.last() else {
            return Err(format!("linnet get -w {name} drew nothing"));
        };
        println!(
            "    $ linnet get -w {name} -n {NS}    (drew {} times as the rollout moved; the last:)",
            frames.len()
        );
        for line in last.trim_matches('\n').lines() {
            println!("    {line}");
        }
        // Shown either way; a watch that never drew the phase fails the demo.
        seen
    }

    /// Prints `linnet get NAME -n demo`.
    fn show_get(&self, name: &str) -> Step<()> {
        let out = Command::new(&self.bin)
            .args(["get", name, "-n", NS])
            .output()
            .map_err(|e| format!("cannot run linnet get: {e}"))?;
        println!("    $ linnet get {name} -n {NS}");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("    {line}");
        }
        if !out.status.success() {
            return Err(format!(
                "linnet get {name} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    fn edit(&self, file: &str, from: &str, to: &str) -> Step<()> {
        let path = self.work.join(file);
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        if !text.contains(from) {
            return Err(format!("{file} does not contain {from:?}"));
        }
        std::fs::write(&path, text.replacen(from, to, 1)).map_err(|e| e.to_string())
    }

    fn push(&self, message: &str) -> Step<()> {
        git(&self.work, &["commit", "-qam", message])?;
        // linnet commits to main too (step 4's revert): a person's push goes on top.
        git(&self.work, &["pull", "-q", "--rebase", "origin", "main"])?;
        git(&self.work, &["push", "-q", "origin", "HEAD:main"])?;
        println!("    $ git commit -am {message:?} && git push");
        Ok(())
    }

    async fn redis(&self) -> Option<CanaryStatefulSet> {
        Api::<CanaryStatefulSet>::namespaced(self.client.clone(), NS)
            .get_opt("redis")
            .await
            .ok()
            .flatten()
    }

    async fn web(&self) -> Option<CanaryDeployment> {
        Api::<CanaryDeployment>::namespaced(self.client.clone(), NS)
            .get_opt("web")
            .await
            .ok()
            .flatten()
    }

    async fn redis_in(&self, phase: StatefulSetPhase, image: Option<&str>) -> Option<()> {
        let s = self.redis().await?.status?;
        (s.phase == Some(phase) && image.is_none_or(|i| s.stable_image.as_deref() == Some(i)))
            .then_some(())
    }

    async fn web_in(&self, phase: DeploymentPhase, image: Option<&str>) -> Option<()> {
        let s = self.web().await?.status?;
        (s.phase == Some(phase) && image.is_none_or(|i| s.stable_image.as_deref() == Some(i)))
            .then_some(())
    }

    /// The ConfigMaps and Secrets web's pods read, by image (`versionedConfig`).
    async fn web_config(&self) -> BTreeMap<String, Vec<String>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let listed = pods
            .list(&ListParams::default().labels("rollouts.linnet.dev/rollout=web"))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for spec in listed
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.spec)
        {
            let image = spec.containers[0].image.clone().unwrap_or_default();
            // Not the API server's CA, which every pod's token volume names.
            let names = linnet::plan::config::references(&spec)
                .into_iter()
                .map(|(_, n)| n)
                .filter(|n| n != "kube-root-ca.crt");
            let entry = out.entry(image).or_default();
            for n in names {
                if !entry.contains(&n) {
                    entry.push(n);
                }
            }
        }
        out
    }

    async fn show_web_config(&self) -> BTreeMap<String, Vec<String>> {
        let config = self.web_config().await;
        for (image, names) in &config {
            println!(
                "    web's pods on {image} read ConfigMap {}",
                names.join(", ")
            );
        }
        config
    }

    /// The `kubectl get csts,cdeploy -n demo` view.
    async fn show(&self) {
        println!("    $ kubectl get csts,cdeploy -n {NS}");
        println!(
            "    {:<24} {:<14} {:<13} {:<13} {:<6} {:<6}",
            "NAME", "PHASE", "STABLE", "CANARY", "BATCH", "READY"
        );
        if let Some(r) = self.redis().await {
            let s = r.status.unwrap_or_default();
            println!(
                "    {:<24} {:<14} {:<13} {:<13} {:<6} {:<6}",
                "canarystatefulset/redis",
                s.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
                s.stable_image.unwrap_or_default(),
                s.canary_image.unwrap_or_default(),
                "",
                s.ready.unwrap_or_default()
            );
            if let Some(m) = s.message {
                println!("      {m}");
            }
        }
        if let Some(w) = self.web().await {
            let s = w.status.unwrap_or_default();
            println!(
                "    {:<24} {:<14} {:<13} {:<13} {:<6} {:<6}",
                "canarydeployment/web",
                s.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
                s.stable_image.unwrap_or_default(),
                s.canary_image.unwrap_or_default(),
                s.batch.unwrap_or_default(),
                s.ready.unwrap_or_default()
            );
            if let Some(m) = s.message {
                println!("      {m}");
            }
        }
    }

    /// Ordinal -> (claim, volume, volume uid) of redis's bound claims.
    async fn volumes(&self) -> BTreeMap<String, (String, String, String)> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), NS);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut out = BTreeMap::new();
        let Ok(list) = claims.list(&ListParams::default()).await else {
            return out;
        };
        for c in list.items {
            let name = c.metadata.name.clone().unwrap_or_default();
            let bound = c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            let Some(pv) = c.spec.and_then(|s| s.volume_name) else {
                continue;
            };
            if !bound || !name.starts_with("data-redis-") {
                continue;
            }
            let uid = pvs
                .get(&pv)
                .await
                .ok()
                .and_then(|p| p.metadata.uid)
                .unwrap_or_default();
            let ordinal = name.rsplit('-').next().unwrap_or_default().to_string();
            out.insert(ordinal, (name, pv, uid));
        }
        out
    }

    async fn show_volumes(&self) -> BTreeMap<String, (String, String, String)> {
        let v = self.volumes().await;
        println!("    replica  claim                   volume   volume uid");
        for (k, (claim, pv, uid)) in &v {
            println!("    {k:<8} {claim:<23} {pv:<8} {uid}");
        }
        v
    }

    async fn show_sets(&self) {
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), NS);
        let deps: Api<Deployment> = Api::namespaced(self.client.clone(), NS);
        let mut line = Vec::new();
        for s in sets
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            line.push(format!(
                "statefulset/{} {}",
                s.metadata.name.unwrap_or_default(),
                s.spec.and_then(|s| s.replicas).unwrap_or(0)
            ));
        }
        for d in deps
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let spec = d.spec.unwrap_or_default();
            let image = spec
                .template
                .spec
                .and_then(|p| p.containers.first().and_then(|c| c.image.clone()))
                .unwrap_or_default();
            line.push(format!(
                "deployment/{} {} ({image})",
                d.metadata.name.unwrap_or_default(),
                spec.replicas.unwrap_or(0)
            ));
        }
        println!("    workloads: {}", line.join(", "));
    }
}

/// The Git host's part: a bare repository seeded from the example, whose `post-receive` hook
/// signs a GitHub push event and posts it to the agent.
fn git_host(tmp: &Path, agent: &str) -> Step<(PathBuf, PathBuf)> {
    let bare = tmp.join("gitops.git");
    std::fs::create_dir_all(&bare).map_err(|e| e.to_string())?;
    git(&bare, &["init", "--bare", "-q"])?;
    push_hook::install_github_push_hook(&bare, SECRET, &format!("{agent}/hooks/github"))
        .map_err(|e| format!("cannot install the post-receive hook: {e}"))?;
    let work = tmp.join("work");
    git(
        tmp,
        &["clone", "-q", bare.to_str().unwrap_or_default(), "work"],
    )?;
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gitops-repo");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(example.join("apps"))
        .arg(example.join("README.md"))
        .arg(&work)
        .status()
        .map_err(|e| e.to_string())?;
    if !copied.success() {
        return Err("cannot copy examples/gitops-repo".into());
    }
    git(&work, &["add", "-A"])?;
    git(&work, &["commit", "-qm", "Add redis and web"])?;
    git(&work, &["push", "-q", "origin", "HEAD:main"])?;
    Ok((bare, work))
}

async fn run() -> Step<()> {
    let kubeconfig = std::env::var("KUBECONFIG")
        .map_err(|_| "KUBECONFIG is not set; run `make demo`".to_string())?;
    let client = Client::try_default()
        .await
        .map_err(|e| format!("cannot reach the control plane ({kubeconfig}): {e}"))?;
    let bin = std::env::var("LINNET_BIN").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/debug/linnet")
            .display()
            .to_string()
    });

    say(
        "Setting up: the CRDs, ServiceAccount and RBAC from deploy/ (the source may deploy to namespace demo only), namespace demo, and a Git server (smart HTTP) with a push webhook",
    );
    install_crds(&client).await?;
    // Before the agent starts, which watches HTTPRoutes only if the API server serves them.
    gateway::install_gateway_api(&client).await;
    fresh_namespace(&client, NS).await?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = ports::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let (bare, work) = git_host(tmp.path(), &base)?;
    std::fs::write(tmp.path().join("secret"), SECRET).map_err(|e| e.to_string())?;
    std::fs::write(tmp.path().join("git-token"), GIT_TOKEN).map_err(|e| e.to_string())?;
    let server = git_http::serve(
        bare.parent().map(Path::to_path_buf).unwrap_or_default(),
        Some(("git", GIT_TOKEN)),
    );
    let repo_url = format!("{server}/gitops.git");
    let dashboard_port = ports::free_port();
    let agent_kubeconfig = service_account_kubeconfig(&client, NS, &kubeconfig, tmp.path()).await?;
    let log = tmp.path().join("agent.log");
    println!("    repository: {repo_url}  (token auth; post-receive hook -> {base}/hooks/github)");

    say(
        "Starting the agent as ServiceAccount linnet-system/linnet (only deploy/rbac.yaml's permissions; poll interval 1h: every change below arrives by webhook)",
    );
    let agent = Command::new(&bin)
        .env("KUBECONFIG", &agent_kubeconfig)
        .args(["agent", "--repo-url", &repo_url])
        .args([
            "--git-password-file",
            tmp.path().join("git-token").to_str().unwrap_or_default(),
        ])
        .args([
            "--poll-interval",
            "1h",
            "--listen",
            &format!("127.0.0.1:{port}"),
            // Metrics and status on a port of their own (any free one).
            "--admin-listen",
            "127.0.0.1:0",
            "--dashboard-listen",
            &format!("127.0.0.1:{dashboard_port}"),
            // Step 9: tags from a registry committed to Git.
            "--image-automation=true",
        ])
        .args([
            "--webhook-secret-file",
            tmp.path().join("secret").to_str().unwrap_or_default(),
        ])
        .args([
            "--cache-dir",
            tmp.path().join("cache").to_str().unwrap_or_default(),
        ])
        .args([
            // The shipped source name: Git's objects are applied as linnet-default.
            "--source-name",
            "default",
            "--allow-namespace",
            NS,
            "--lease-identity",
            "demo",
            // Its own namespace, as in a pod: its Lease, LinnetSource and inventory live there.
            "--lease-namespace",
            "linnet-system",
            "--agent-namespace",
            "linnet-system",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("cannot start {bin}: {e}; run `cargo build` first"))?;
    println!(
        "    $ linnet agent --repo-url {repo_url} --git-password-file … --poll-interval 1h --webhook-secret-file …"
    );
    println!(
        "    dashboard: http://127.0.0.1:{dashboard_port}/  (open it in a browser: it follows every step below live)"
    );
    let demo = Demo {
        client,
        work,
        bare: bare.clone(),
        agent,
        started: Instant::now(),
        bin: bin.clone(),
        scratch: tmp.path().to_path_buf(),
        hooks: base.clone(),
        dashboard: format!("http://127.0.0.1:{dashboard_port}"),
    };
    let result = story(&demo).await;
    if result.is_err() {
        eprintln!(
            "---- agent log (last 40 lines)\n{}",
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    if let Some((rss, cpu)) = process::usage(demo.agent.id()) {
        println!(
            "\n    agent: {rss:.1} MiB RSS, {cpu:.2} s CPU over {:.0} s",
            demo.started.elapsed().as_secs_f64()
        );
    }
    say(
        "Cleaning up: namespace demo deleted while the agent runs (its finalizer scales redis down; the volumes are Retain and stay), then the agent stops",
    );
    let namespaces = Api::<Namespace>::all(demo.client.clone());
    let _ = namespaces.delete(NS, &DeleteParams::background()).await;
    let gone = wait("namespace demo to go", 90, || async {
        matches!(namespaces.get_opt(NS).await, Ok(None)).then_some(())
    })
    .await;
    drop(demo);
    result.and(gone)
}

async fn story(d: &Demo) -> Step<()> {
    say("1. First sync: redis stable 3/3, web 4/4");
    wait("redis to be Stable", 120, || {
        d.redis_in(StatefulSetPhase::Stable, None)
    })
    .await?;
    wait("web to be Completed", 120, || {
        d.web_in(DeploymentPhase::Completed, None)
    })
    .await?;
    d.show().await;
    let before = d.show_volumes().await;

    say("2. A push bumps redis's image: a canary on replica 2, with replica 2's own volume");
    d.edit(
        "apps/redis/redis.yaml",
        "  image: redis:7.2",
        "  image: redis:7.4",
    )?;
    let watching = d.watch("redis")?;
    let pushed = Instant::now();
    d.push("redis 7.4")?;
    wait("the canary to start", 30, || async {
        d.redis()
            .await?
            .status?
            .canary_image
            .filter(|i| i == "redis:7.4")
    })
    .await?;
    println!(
        "    the canary started {:.2} s after the push",
        pushed.elapsed().as_secs_f64()
    );
    wait("redis to be CanaryActive", 120, || {
        d.redis_in(StatefulSetPhase::CanaryActive, None)
    })
    .await?;
    d.show().await;
    d.show_watch("redis", "CanaryActive", watching).await?;
    let during = d.show_volumes().await;
    let same = |a: &BTreeMap<String, (String, String, String)>,
                b: &BTreeMap<String, (String, String, String)>| {
        a.len() == 3
            && a.iter()
                .all(|(k, v)| b.get(k).is_some_and(|w| w.1 == v.1 && w.2 == v.2))
    };
    if !same(&before, &during) {
        return Err("a replica's volume changed during the canary".into());
    }
    println!(
        "    replica 2 runs redis:7.4 in redis-canary on the same volume (name and uid) it had"
    );

    say("3. A pull request that sets rollouts.linnet.dev/promote: \"true\" is merged: promoted");
    d.edit(
        "apps/redis/redis.yaml",
        "  name: redis\n",
        "  name: redis\n  annotations:\n    rollouts.linnet.dev/promote: \"true\"\n",
    )?;
    d.push("Merge pull request: promote redis 7.4")?;
    wait("redis to be promoted", 120, || {
        d.redis_in(StatefulSetPhase::Stable, Some("redis:7.4"))
    })
    .await?;
    d.show().await;
    d.show_sets().await;
    if !same(&before, &d.show_volumes().await) {
        return Err("a replica's volume changed during promotion".into());
    }

    say(
        "4. A push of redis:broken (deadline 10s, onFailure.revert: commit): its pod never becomes Ready, so linnet rolls back, and commits redis:7.4 back to Git",
    );
    d.edit(
        "apps/redis/redis.yaml",
        "  image: redis:7.4",
        "  image: redis:broken\n  progressDeadlineSeconds: 10\n  onFailure:\n    revert: commit",
    )?;
    d.push("redis broken")?;
    wait("redis to roll back", 180, || {
        d.redis_in(StatefulSetPhase::RolledBack, Some("redis:7.4"))
    })
    .await?;
    d.show().await;
    let revert = wait("linnet's revert commit on main", 60, || async {
        git(&d.bare, &["log", "-1", "--format=%h %an: %s", "main"])
            .ok()
            .filter(|l| l.contains(" linnet: linnet: revert demo/redis to redis:7.4"))
    })
    .await?;
    println!("    $ git log -1 main\n    {revert}");
    println!(
        "{}",
        git(&d.bare, &["show", "--format=", "--unified=0", "main"])?
            .lines()
            .filter(|l| l.starts_with(['+', '-']) && !l.starts_with("+++") && !l.starts_with("---"))
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    wait(
        "redis to be Stable on redis:7.4 again (the revert synced)",
        60,
        || async {
            d.redis_in(StatefulSetPhase::Stable, Some("redis:7.4"))
                .await?;
            d.redis()
                .await
                .filter(|r| r.spec.image == "redis:7.4")
                .map(|_| ())
        },
    )
    .await?;
    println!("    Git and the cluster agree again: no person edited Git or touched the cluster");
    d.show().await;
    if !same(&before, &d.show_volumes().await) {
        return Err("a replica's volume changed during the rollback".into());
    }

    say(
        "5. web reads ConfigMap web-config, copied per version (versionedConfig: true). Then one push bumps web's image and its config: batch 1 of 2 (1 new pod on the new config, the 3 old ones keep theirs), then a pause for approval",
    );
    d.edit(
        "apps/web/web.yaml",
        "  currentBatch: 1",
        "  currentBatch: 1\n  versionedConfig: true",
    )?;
    d.edit(
        "apps/web/web.yaml",
        "          - containerPort: 80\n",
        "          - containerPort: 80\n          volumeMounts:\n          - name: config\n            mountPath: /etc/nginx/conf.d\n        volumes:\n        - name: config\n          configMap:\n            name: web-config\n",
    )?;
    let web_config = |keepalive: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\n  namespace: {NS}\ndata:\n  keepalive.conf: \"keepalive_timeout {keepalive};\"\n"
        )
    };
    std::fs::write(d.work.join("apps/web/config.yaml"), web_config("65"))
        .map_err(|e| e.to_string())?;
    git(&d.work, &["add", "-A"])?;
    d.push("web reads web-config, copied per version")?;
    let old = wait("web's pods on their copy of web-config", 120, || async {
        let config = d.web_config().await;
        let names = config.get("nginx:1.27")?;
        (config.len() == 1 && names.len() == 1 && names[0] != "web-config")
            .then(|| names[0].clone())
    })
    .await?;
    d.show_web_config().await;
    d.edit(
        "apps/web/web.yaml",
        "  image: nginx:1.27",
        "  image: nginx:1.28",
    )?;
    std::fs::write(d.work.join("apps/web/config.yaml"), web_config("5"))
        .map_err(|e| e.to_string())?;
    d.push("web 1.28, keepalive 5s")?;
    wait("web to pause after batch 1", 120, || {
        d.web_in(DeploymentPhase::Paused, None)
    })
    .await?;
    d.show().await;
    d.show_sets().await;
    let config = wait("web's new pod on a new copy", 60, || async {
        let config = d.web_config().await;
        (config.len() == 2).then_some(config)
    })
    .await?;
    d.show_web_config().await;
    if config.get("nginx:1.27") != Some(&vec![old.clone()])
        || config.get("nginx:1.28").is_none_or(|n| n.contains(&old))
    {
        return Err(format!(
            "only the canary's pod should read the new config: {config:?}"
        ));
    }

    say(
        "   A pull request that sets currentBatch: 2 is merged: batch 2, then the old version goes",
    );
    d.edit(
        "apps/web/web.yaml",
        "  currentBatch: 1",
        "  currentBatch: 2",
    )?;
    d.push("Merge pull request: web batch 2")?;
    wait("web to complete", 120, || {
        d.web_in(DeploymentPhase::Completed, Some("nginx:1.28"))
    })
    .await?;
    d.show().await;
    d.show_sets().await;
    wait("every web pod on the new config", 60, || async {
        let config = d.web_config().await;
        (config.len() == 1 && config.contains_key("nginx:1.28")).then_some(())
    })
    .await?;
    d.show_web_config().await;

    say(
        "6. Analysis: a push of web nginx:1.29 with a gate after batch 1 that judges web's error rate against the stable version's, from Prometheus (examples/analysis/error-rate-vs-stable.yaml, added as apps/web/analysis.yaml). Its pods become Ready, but 30% of its requests fail, against 0.5% of the stable version's",
    );
    let exporter = prometheus::Exporter::start("web").await;
    let prom = prometheus::Prometheus::start(&exporter).await;
    println!(
        "    Prometheus at {} scrapes web's request and error counters every second",
        prom.address()
    );
    exporter.set_error_ratio(0.3);
    // Let the 5 s rate window fill with the new version's errors.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/analysis/error-rate-vs-stable.yaml");
    std::fs::copy(&template, d.work.join("apps/web/analysis.yaml"))
        .map_err(|e| format!("cannot copy {}: {e}", template.display()))?;
    git(&d.work, &["add", "apps/web/analysis.yaml"])?;
    d.edit(
        "apps/web/web.yaml",
        "  image: nginx:1.28",
        &format!(
            "  image: nginx:1.29\n  analysis:\n    args:\n    - name: app\n      value: web\n    - name: prometheus\n      value: {}\n    - name: window\n      value: 5s\n    gates:\n    - after: 1\n      templates:\n      - templateName: error-rate-vs-stable",
            prom.address()
        ),
    )?;
    d.edit(
        "apps/web/web.yaml",
        "  currentBatch: 2",
        "  currentBatch: 1",
    )?;
    d.push("web 1.29, gated by its error rate against the stable version's")?;
    wait("web to roll back", 120, || {
        d.web_in(DeploymentPhase::RolledBack, Some("nginx:1.28"))
    })
    .await?;
    d.show().await;
    d.show_get("web")?;
    let message = d
        .web()
        .await
        .and_then(|w| w.status?.message)
        .unwrap_or_default();
    if !(message.contains("vs baseline") && message.contains(": Fail")) {
        return Err(format!(
            "step 6: the rollback does not carry the judge's verdict: {message}"
        ));
    }
    println!("    the judge's verdict: {message}");

    traffic::traffic_step(&d.client, &d.work, |m| d.push(m)).await?;
    real_pods::real_pods_step(&d.client, &d.work, &d.dashboard, |m| d.push(m)).await?;
    images::images_step(&d.client, &d.work, &d.scratch, &d.hooks, SECRET, |m| {
        d.push(m)
    })
    .await?;

    say("The repository's history (main: people's commits, and linnet's revert in step 4)");
    println!("{}", git(&d.work, &["log", "--oneline"])?);
    say("What linnet wrote back (branch linnet/status: one file per rollout, a commit per change)");
    wait("the last status commit", 30, || async {
        git(
            &d.bare,
            &[
                "show",
                "linnet/status:.linnet/status/default/demo/4b/web.yaml",
            ],
        )
        .ok()
        .filter(|t| t.contains("phase: RolledBack") && t.contains("error-rate"))
    })
    .await?;
    println!(
        "{}",
        git(&d.bare, &["log", "--format=%h %s", "linnet/status"])?
    );
    println!("\n    $ git show linnet/status:.linnet/status/default/demo/4b/web.yaml");
    println!(
        "{}",
        git(
            &d.bare,
            &[
                "show",
                "linnet/status:.linnet/status/default/demo/4b/web.yaml"
            ]
        )?
    );
    println!("\nDone: every step happened.");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ndemo failed: {e}");
            ExitCode::FAILURE
        }
    }
}
