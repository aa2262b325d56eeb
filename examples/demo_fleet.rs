//! `make demo-fleet`: one repository, three clusters, a new image that moves in waves.
//!
//! Beside the local control plane of `make demo` it starts two more (each its own etcd, API
//! server, controller-manager, scheduler and kwok), installs linnet's CRDs and RBAC from
//! `deploy/` in each, and runs three agents, one per cluster, each as its own cluster's
//! ServiceAccount and with no access to the others. A bare repository served over smart HTTP
//! stands in for the Git host: its `post-receive` hook sends a signed push webhook to every
//! agent, for the followed branch and for the status branch the agents write to. The story:
//!
//! 1. `web` (a CanaryDeployment) on nginx:1.27 in every cluster;
//! 2. a push of nginx:1.28: the first wave (eu-1) rolls it out at once, the others hold and
//!    say why; eu-1 bakes it;
//! 3. the second wave (eu-2) is manual: it waits until a commit approves nginx:1.28 for it in
//!    the Fleet, then rolls it out; the last wave (us-1) follows after eu-2's bake;
//! 4. a push of an image whose pods never become Ready: eu-1 rolls it back, and no other
//!    cluster ever starts it.
//!
//! `linnet fleet status` shows the waves after each step, from a clone alone. It exits
//! non-zero, naming the step, if anything does not happen in time.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/support/git_http.rs"]
mod git_http;
#[path = "../tests/support/ports.rs"]
mod ports;
#[path = "../tests/support/push_hook.rs"]
mod push_hook;
#[path = "demo/setup.rs"]
mod setup;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use kube::{Api, Client};
use linnet::api::{CanaryDeployment, DeploymentPhase};
use setup::{Step, fresh_namespace, git, install_crds, say, service_account_kubeconfig, wait};

const NS: &str = "shop";
const SECRET: &str = "demo-fleet-webhook-secret";
const GIT_TOKEN: &str = "demo-fleet-git-token";

const FLEET: &str = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: Fleet
metadata:
  name: shop
spec:
  rollouts:
  - {namespace: shop, name: web, kind: CanaryDeployment}
  waves:
  - name: canary
    clusters: [eu-1]
    bakeSeconds: 10
  - name: europe
    matchLabels: {region: eu}
    bakeSeconds: 10
    approval: manual
  - name: rest
    matchLabels: {}
";

fn web(image: &str) -> String {
    format!(
        "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryDeployment
metadata:
  name: web
  namespace: {NS}
spec:
  replicas: 4
  image: {image}
  strategy: {{type: Batches}}
  batches: 2
  pause: None
  rollbackOnFailure: true
  progressDeadlineSeconds: 15
  template:
    selector:
      matchLabels: {{app: web}}
    template:
      metadata:
        labels: {{app: web}}
      spec:
        containers:
        - name: web
          image: {image}
"
    )
}

/// A control plane beside the demo's, stopped when dropped.
struct Cluster {
    name: &'static str,
    labels: &'static str,
    /// `None` for the demo's own control plane (KUBECONFIG).
    dir: Option<PathBuf>,
    admin_kubeconfig: PathBuf,
    env: Vec<(&'static str, String)>,
}

impl Cluster {
    fn script(&self, name: &str) -> Command {
        let mut c = Command::new(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/cluster")
                .join(name),
        );
        c.envs(self.env.iter().map(|(k, v)| (*k, v.as_str())));
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.dir.is_some() {
            let _ = self.script("down.sh").stdout(Stdio::null()).status();
        }
    }
}

fn extra_cluster(name: &'static str, labels: &'static str, port: u16) -> Cluster {
    let dir = std::env::temp_dir().join(format!("linnet-demo-fleet-{name}"));
    Cluster {
        name,
        labels,
        admin_kubeconfig: dir.join("admin.kubeconfig"),
        env: vec![
            ("LINNET_CLUSTER_DIR", dir.display().to_string()),
            ("CP_ETCD_PORT", port.to_string()),
            ("CP_ETCD_PEER_PORT", (port + 1).to_string()),
            ("CP_API_PORT", (port + 2).to_string()),
            ("CP_PV_COUNT", "0".into()),
            ("CP_NO_NODE", "1".into()),
        ],
        dir: Some(dir),
    }
}

async fn client_for(kubeconfig: &Path) -> Step<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    Client::try_from(config).map_err(|e| e.to_string())
}

struct Member {
    cluster: Cluster,
    client: Client,
    agent: Option<Child>,
    log: PathBuf,
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
    }
}

/// Where `web` stands in `m`'s cluster: (phase, stable image, message).
async fn web_in(m: &Member) -> Option<(DeploymentPhase, String, String)> {
    let d = Api::<CanaryDeployment>::namespaced(m.client.clone(), NS)
        .get_opt("web")
        .await
        .ok()??;
    let s = d.status?;
    Some((s.phase?, s.stable_image?, s.message.unwrap_or_default()))
}

async fn completed_on(m: &Member, image: &str, secs: u64) -> Step<()> {
    wait(
        &format!("{} Completed on {image}", m.cluster.name),
        secs,
        || async {
            let (phase, stable, _) = web_in(m).await?;
            (phase == DeploymentPhase::Completed && stable == image).then_some(())
        },
    )
    .await
}

async fn show_clusters(fleet: &[Member]) {
    for m in fleet {
        if let Some((phase, stable, message)) = web_in(m).await {
            println!("    {:<5} {phase:?} on {stable}: {message}", m.cluster.name);
        }
    }
}

fn fleet_status(bin: &str, work: &Path) {
    let _ = git(
        work,
        &["fetch", "-q", "origin", "+linnet/status:linnet/status"],
    );
    let out = Command::new(bin)
        .args(["fleet", "status", "--fleet", "fleet.yaml", "--repo"])
        .arg(work)
        .output();
    println!("    $ linnet fleet status --fleet fleet.yaml");
    if let Ok(out) = out {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("    {line}");
        }
    }
}

fn push(work: &Path, files: &[(&str, &str)], message: &str) -> Step<()> {
    for (path, text) in files {
        let p = work.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).map_err(|e| e.to_string())?;
        std::fs::write(p, text).map_err(|e| e.to_string())?;
    }
    git(work, &["add", "-A"])?;
    git(work, &["commit", "-qm", message])?;
    git(work, &["push", "-q", "origin", "HEAD:main"])?;
    println!("    $ git commit -m {message:?} && git push");
    Ok(())
}

fn start_agent(
    bin: &str,
    m: &Member,
    kubeconfig: &Path,
    repo_url: &str,
    port: u16,
    dir: &Path,
    cache: &Path,
) -> Step<Child> {
    let labels = format!("--cluster-label={}", m.cluster.labels);
    Command::new(bin)
        .env("KUBECONFIG", kubeconfig)
        .args(["agent", "--repo-url", repo_url, "--path", "apps"])
        .args([
            "--fleet",
            "fleet.yaml",
            "--cluster",
            m.cluster.name,
            &labels,
        ])
        .args([
            "--git-password-file",
            dir.join("git-token").to_str().unwrap_or_default(),
            "--webhook-secret-file",
            dir.join("secret").to_str().unwrap_or_default(),
            "--cache-dir",
            cache.to_str().unwrap_or_default(),
        ])
        .args([
            "--poll-interval",
            "1h",
            "--writeback-interval",
            "500ms",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            "127.0.0.1:0",
            "--source-name",
            "default",
            "--allow-namespace",
            NS,
            "--lease-identity",
            &format!("demo-fleet-{}", m.cluster.name),
            "--lease-namespace",
            "linnet-system",
            "--agent-namespace",
            "linnet-system",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&m.log).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("cannot start {bin}: {e}; run `cargo build` first"))
}

async fn run() -> Step<()> {
    let kubeconfig = std::env::var("KUBECONFIG")
        .map_err(|_| "KUBECONFIG is not set; run `make demo-fleet`".to_string())?;
    let bin = std::env::var("LINNET_BIN").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/debug/linnet")
            .display()
            .to_string()
    });
    say(
        "Setting up: two more control planes beside the demo's (about 20 s), linnet's CRDs and RBAC from deploy/ in each, namespace shop, and a Git server whose push hook wakes every agent",
    );
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let clusters = vec![
        Cluster {
            name: "eu-1",
            labels: "region=eu",
            dir: None,
            admin_kubeconfig: PathBuf::from(&kubeconfig),
            env: Vec::new(),
        },
        extra_cluster("eu-2", "region=eu", 23950),
        extra_cluster("us-1", "region=us", 23960),
    ];
    let starting: Vec<Child> = clusters[1..]
        .iter()
        .map(|c| c.script("up.sh").stdout(Stdio::null()).spawn())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot run tests/cluster/up.sh: {e}"))?;
    for (mut child, c) in starting.into_iter().zip(&clusters[1..]) {
        let ok = child.wait().map_err(|e| e.to_string())?.success();
        if !ok {
            return Err(format!("the control plane of {} did not start", c.name));
        }
    }
    let ports: Vec<u16> = clusters.iter().map(|_| ports::free_port()).collect();
    let hooks: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}/hooks/github"))
        .collect();
    let bare = tmp.path().join("fleet.git");
    std::fs::create_dir_all(&bare).map_err(|e| e.to_string())?;
    git(&bare, &["init", "--bare", "-q"])?;
    // curl posts the same event to every URL it is given.
    push_hook::install_github_push_hook(&bare, SECRET, &hooks.join(" "))
        .map_err(|e| format!("cannot install the post-receive hook: {e}"))?;
    git(
        tmp.path(),
        &["clone", "-q", bare.to_str().unwrap_or_default(), "work"],
    )?;
    let work = tmp.path().join("work");
    std::fs::write(tmp.path().join("secret"), SECRET).map_err(|e| e.to_string())?;
    std::fs::write(tmp.path().join("git-token"), GIT_TOKEN).map_err(|e| e.to_string())?;
    let server = git_http::serve(tmp.path().to_path_buf(), Some(("git", GIT_TOKEN)));
    let repo_url = format!("{server}/fleet.git");
    push(
        &work,
        &[("fleet.yaml", FLEET), ("apps/web.yaml", &web("nginx:1.27"))],
        "web on nginx:1.27, and the fleet's waves",
    )?;
    println!("    repository: {repo_url}\n{FLEET}");

    let mut fleet = Vec::new();
    for (i, cluster) in clusters.into_iter().enumerate() {
        let client = client_for(&cluster.admin_kubeconfig).await?;
        install_crds(&client).await?;
        fresh_namespace(&client, NS).await?;
        let dir = tmp.path().join(cluster.name);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let agent_kubeconfig = service_account_kubeconfig(
            &client,
            NS,
            cluster.admin_kubeconfig.to_str().unwrap_or_default(),
            &dir,
        )
        .await?;
        let mut m = Member {
            log: dir.join("agent.log"),
            cluster,
            client,
            agent: None,
        };
        m.agent = Some(start_agent(
            &bin,
            &m,
            &agent_kubeconfig,
            &repo_url,
            ports[i],
            tmp.path(),
            &dir.join("cache"),
        )?);
        println!(
            "    agent {}: --cluster {} --cluster-label {} --fleet fleet.yaml (log {})",
            i + 1,
            m.cluster.name,
            m.cluster.labels,
            m.log.display()
        );
        fleet.push(m);
    }
    let result = story(&fleet, &work, &bin).await;
    if result.is_err() {
        for m in &fleet {
            let log = std::fs::read_to_string(&m.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            eprintln!("---- {} agent log (last 15 lines)", m.cluster.name);
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
    say(
        "Cleaning up: the agents stop, namespace shop is deleted, the two extra control planes stop",
    );
    for m in &mut fleet {
        if let Some(mut a) = m.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
        setup::release_finalizers(&m.client, NS).await;
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(m.client.clone())
            .delete(NS, &Default::default())
            .await;
    }
    drop(fleet);
    result
}

async fn story(fleet: &[Member], work: &Path, bin: &str) -> Step<()> {
    say("1. web on nginx:1.27 in every cluster (a rollout's first image is never held)");
    for m in fleet {
        completed_on(m, "nginx:1.27", 120).await?;
    }
    show_clusters(fleet).await;

    say("2. A push of nginx:1.28: the first wave (eu-1) rolls it out; the others hold and say why");
    let pushed = Instant::now();
    push(
        work,
        &[("apps/web.yaml", &web("nginx:1.28"))],
        "web on nginx:1.28",
    )?;
    completed_on(&fleet[0], "nginx:1.28", 60).await?;
    println!(
        "    eu-1 Completed on nginx:1.28 {:.1} s after the push",
        pushed.elapsed().as_secs_f64()
    );
    show_clusters(fleet).await;

    say("3. eu-1 bakes it for 10 s; then the manual wave (eu-2) waits for an approval in Git");
    wait("eu-2 to wait for its approval", 60, || async {
        let (_, _, message) = web_in(&fleet[1]).await?;
        message.contains("waits for an approval").then_some(())
    })
    .await?;
    show_clusters(fleet).await;
    fleet_status(bin, work);

    say(
        "4. A person approves nginx:1.28 for europe (a commit, as a merged pull request would be): eu-2 rolls it out, bakes it, then us-1 follows",
    );
    let approved = format!("{FLEET}  approvals:\n  - {{wave: europe, image: 'nginx:1.28'}}\n");
    push(
        work,
        &[("fleet.yaml", &approved)],
        "Approve nginx:1.28 for europe",
    )?;
    completed_on(&fleet[1], "nginx:1.28", 60).await?;
    println!("    eu-2 Completed on nginx:1.28; us-1 waits for its bake:");
    show_clusters(&fleet[2..]).await;
    completed_on(&fleet[2], "nginx:1.28", 60).await?;
    println!(
        "    every wave on nginx:1.28, {:.0} s after the push (two bakes of 10 s and an approval)",
        pushed.elapsed().as_secs_f64()
    );
    fleet_status(bin, work);

    say(
        "5. A push of nginx:broken (its pods never become Ready): eu-1 rolls it back at its 15 s deadline, and no other wave ever starts it",
    );
    push(
        work,
        &[("apps/web.yaml", &web("nginx:broken"))],
        "web on nginx:broken",
    )?;
    wait("eu-1 to roll back", 90, || async {
        let (phase, _, _) = web_in(&fleet[0]).await?;
        (phase == DeploymentPhase::RolledBack).then_some(())
    })
    .await?;
    wait("us-1 to name the failure", 30, || async {
        let (_, stable, message) = web_in(&fleet[2]).await?;
        (stable == "nginx:1.28" && message.contains("failed in cluster eu-1")).then_some(())
    })
    .await?;
    show_clusters(fleet).await;
    fleet_status(bin, work);
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => {
            println!("\nThe fleet demo is done.");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nThe fleet demo stopped: {e}");
            ExitCode::FAILURE
        }
    }
}
