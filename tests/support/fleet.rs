//! A fleet's clusters for tests (issue 73): more local control planes beside the test
//! cluster (each its own etcd, API server, controller-manager, scheduler and kwok, on ports of
//! its own, from tests/cluster/up.sh), and what a test reads of a fleet's `web` rollout.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube::Client;
use linnet::api::{CanaryDeployment, DeploymentPhase};
use serde_json::json;

/// Another control plane beside the test cluster, stopped (and its directory removed) when
/// dropped.
pub struct ExtraCluster {
    dir: PathBuf,
    ports: [u16; 3],
}

impl ExtraCluster {
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("LINNET_CLUSTER_DIR", self.dir.display().to_string()),
            ("CP_ETCD_PORT", self.ports[0].to_string()),
            ("CP_ETCD_PEER_PORT", self.ports[1].to_string()),
            ("CP_API_PORT", self.ports[2].to_string()),
            ("CP_PV_COUNT", "2".into()),
            ("CP_NO_NODE", "1".into()),
        ]
    }

    fn script(&self, name: &str) -> Command {
        let mut c = Command::new(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/cluster")
                .join(name),
        );
        c.envs(self.env());
        c
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }
}

impl Drop for ExtraCluster {
    fn drop(&mut self) {
        let _ = self.script("down.sh").output();
    }
}

/// Starts control planes `names` at once (each takes about 20 s).
pub fn start_clusters(names: &[&str], base_port: u16) -> Vec<ExtraCluster> {
    let clusters: Vec<ExtraCluster> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let p = base_port + 10 * i as u16;
            ExtraCluster {
                dir: std::env::temp_dir()
                    .join(format!("linnet-fleet-{name}-{}", std::process::id())),
                ports: [p, p + 1, p + 2],
            }
        })
        .collect();
    let mut children: Vec<_> = clusters
        .iter()
        .map(|c| {
            c.script("up.sh")
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for (c, child) in clusters.iter().zip(&mut children) {
        assert!(
            child.wait().unwrap().success(),
            "control plane {} did not start",
            c.dir.display()
        );
    }
    clusters
}

pub async fn client_for(kubeconfig: &Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// What a cluster admin does in each cluster of the fleet: linnet's CRDs and RBAC, and the
/// fleet's namespace with the source's grants.
pub async fn prepare(client: &Client, ns: &str) {
    super::install_linnet(client).await;
    let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    let _ = namespaces
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await;
    super::grant_source(client, ns, super::SOURCE_ACCOUNT).await;
    super::grant_state(client, ns).await;
}

/// One cluster of a test's fleet and its agent's directory.
pub struct Member {
    pub name: &'static str,
    pub labels: &'static str,
    pub kubeconfig: PathBuf,
    pub client: Client,
    pub dir: PathBuf,
}

pub async fn web_of(m: &Member, ns: &str) -> Option<CanaryDeployment> {
    kube::Api::<CanaryDeployment>::namespaced(m.client.clone(), ns)
        .get_opt("web")
        .await
        .ok()
        .flatten()
}

/// The image `web` is settled on in `m`'s cluster (Completed), or `None`.
pub async fn completed_on(m: &Member, ns: &str) -> Option<String> {
    let d = web_of(m, ns).await?;
    let s = d.status?;
    (s.phase == Some(DeploymentPhase::Completed))
        .then_some(s.stable_image)
        .flatten()
}

/// How long ago `web` entered its phase in `m`'s cluster (the time the fleet bakes from).
pub async fn in_phase_for(m: &Member, ns: &str) -> Duration {
    let since = web_of(m, ns)
        .await
        .and_then(|d| d.status?.phase_since)
        .unwrap();
    Duration::try_from(jiff::Timestamp::now().duration_since(since.0)).unwrap_or_default()
}

pub async fn message(m: &Member, ns: &str) -> String {
    web_of(m, ns)
        .await
        .and_then(|d| d.status?.message)
        .unwrap_or_default()
}

/// The three clusters of a fleet test: eu-1 (the test cluster, as linnet's own identity),
/// eu-2 and us-1 (`extra`, as their admins, prepared for namespace `ns`); each agent's
/// directory under `dir`.
pub async fn three_members(extra: &[ExtraCluster], ns: &str, dir: &Path) -> Vec<Member> {
    let members = [
        ("eu-1", "region=eu", super::linnet_kubeconfig()),
        ("eu-2", "region=eu", extra[0].admin_kubeconfig()),
        ("us-1", "region=us", extra[1].admin_kubeconfig()),
    ];
    let mut fleet = Vec::new();
    for (name, labels, kubeconfig) in members {
        let client = client_for(&kubeconfig).await;
        if name != "eu-1" {
            prepare(&client, ns).await;
        }
        fleet.push(Member {
            name,
            labels,
            kubeconfig,
            client,
            dir: dir.join(name),
        });
    }
    fleet
}

/// Writes `files` in clone `work`, commits them and pushes to `main` (after any commit another
/// pushed, as a person would).
pub fn push(work: &Path, files: &[(&str, &str)], message: &str) {
    for (path, text) in files {
        let p = work.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    super::git(work, &["add", "-A"]);
    super::git(work, &["commit", "-qm", message]);
    if !super::git(work, &["ls-remote", "--heads", "origin", "main"]).is_empty() {
        super::git(work, &["pull", "-q", "--rebase", "origin", "main"]);
    }
    super::git(work, &["push", "-q", "origin", "HEAD:main"]);
}

/// When `web` Completed `image` in `m`'s cluster (its status's `since`, whole seconds, as its
/// status file says and the fleet bakes from), waiting up to `within` seconds.
pub async fn completed_since(m: &Member, ns: &str, image: &str, within: u64) -> jiff::Timestamp {
    super::eventually(
        &format!("{} Completed on {image}", m.name),
        Duration::from_secs(within),
        || async {
            let s = web_of(m, ns).await?.status?;
            (s.phase == Some(DeploymentPhase::Completed)
                && s.stable_image.as_deref() == Some(image))
            .then_some(s.phase_since?.0)
        },
    )
    .await
}

/// The agents' webhook addresses (a restarted agent listens on a new one).
pub type Hooks = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Every agent hears of every push, as from a Git host's webhook on the repository: a signed
/// webhook to each of `hooks` every 700 ms.
pub fn relay_webhooks(hooks: Hooks) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let body = br#"{"ref":"refs/heads/linnet/status"}"#;
        let sig = linnet::source::webhook::sign_hex(super::agent::SECRET.as_bytes(), body);
        loop {
            let now: Vec<String> = hooks.lock().unwrap().clone();
            for h in &now {
                let _ = super::http()
                    .post(format!("{h}/hooks/generic"))
                    .header("x-linnet-signature", format!("sha256={sig}"))
                    .body(body.to_vec())
                    .send()
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
    })
}
