//! Installing linnet itself as real pods (tests/node_install.rs, tests/node_namespace_install.rs):
//! the image built and loaded into the node's containerd, an overlay of an install directory
//! that sets it, kubectl as the admin, and the agents' processes and logs on the node.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use linnet::api::CanaryStatefulSet;
use serde_json::json;

use super::node::{self, on_node};

/// The agent's image, as `make image` names it for these tests (no registry: loaded into the
/// node's containerd).
pub const IMAGE: &str = "linnet.test/linnet:dev";

pub fn run(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("KUBECONFIG", super::admin_kubeconfig())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn kubectl(args: &[&str]) -> String {
    run(&super::tools_bin().join("kubectl"), args)
}

/// `make image` (dev profile), written as an archive named [`IMAGE`] and imported into the
/// node's containerd.
pub fn build_and_load_image(dir: &Path) {
    let archive = dir.join("linnet.tar");
    run(
        Path::new("make"),
        &[
            "image",
            "IMAGE_PROFILE=dev",
            &format!("IMAGE_DIR={}", dir.join("layout").display()),
            &format!("IMAGE_NAME={IMAGE}"),
            &format!("IMAGE_ARCHIVE={}", archive.display()),
        ],
    );
    let sock = node::node_dir().join("containerd.sock");
    run(
        Path::new("ctr"),
        &[
            "--address",
            sock.to_str().unwrap(),
            "-n",
            "k8s.io",
            "images",
            "import",
            archive.to_str().unwrap(),
        ],
    );
}

/// An overlay of the install directory `deploy` (deploy/, deploy/namespaced/) that sets the
/// image and puts the agent on the real node.
pub fn write_overlay(dir: &Path, deploy: &Path) {
    // kustomize takes a base by a path relative to the overlay.
    let base = pathdiff(deploy, dir);
    let (name, tag) = IMAGE.split_once(':').unwrap();
    let mut pod = json!({"spec": {}});
    on_node(&mut pod);
    pod["spec"]
        .as_object_mut()
        .unwrap()
        .remove("automountServiceAccountToken");
    pod["spec"]["containers"] = json!([{"name": "linnet", "imagePullPolicy": "Never"}]);
    let patch = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "linnet", "namespace": "linnet-system"},
        "spec": {"template": pod}
    });
    std::fs::write(
        dir.join("node.yaml"),
        serde_json::to_string_pretty(&patch).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n- {base}\nimages:\n- name: ghcr.io/linnet-dev/linnet\n  newName: {name}\n  newTag: {tag}\n\
             patches:\n- path: node.yaml\n"
        ),
    )
    .unwrap();
}

/// `to` relative to `from` (both absolute).
pub fn pathdiff(to: &Path, from: &Path) -> String {
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".into(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// The agent processes running on this machine for pods of linnet-system: pod name -> pid.
pub fn agent_processes() -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if !std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "linnet") {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let vars: BTreeMap<String, String> = env
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let s = String::from_utf8_lossy(kv);
                s.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        if vars.get("POD_NAMESPACE").map(String::as_str) == Some("linnet-system")
            && let Some(pod) = vars.get("POD_NAME")
        {
            out.insert(pod.clone(), pid);
        }
    }
    out
}

/// The last lines of each agent container's log on the node, for a failing test.
pub fn print_agent_logs() {
    let Ok(dirs) = std::fs::read_dir(node::node_dir().join("logs/pods")) else {
        return;
    };
    for d in dirs.flatten() {
        if !d
            .file_name()
            .to_string_lossy()
            .starts_with("linnet-system_")
        {
            continue;
        }
        for f in std::fs::read_dir(d.path().join("linnet"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!("---- {}", f.path().display());
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// Deletes the tests' rollout `kv` in `ns` while the agents still run (they release its
/// finalizer; one no agent released would keep its namespace Terminating, and every later
/// agent watching all namespaces would meet it), then the agent's Deployment (its pods stop).
/// A finalizer no agent took off within a minute is taken off by hand, as a person would.
pub async fn uninstall(client: kube::Client, ns: &str) {
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(client.clone(), ns);
    let _ = rollouts.delete("kv", &DeleteParams::default()).await;
    let gone = tokio::time::timeout(Duration::from_secs(60), async {
        while rollouts.get_opt("kv").await.is_ok_and(|r| r.is_some()) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    if gone.is_err() {
        let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        let _ = rollouts
            .patch("kv", &PatchParams::default(), &release)
            .await;
    }
    let _ = Api::<Deployment>::namespaced(client, "linnet-system")
        .delete("linnet", &DeleteParams::foreground())
        .await;
}

/// Removes an install an earlier test left (tests/deploy.rs leaves its kwok one; a failed run
/// may leave a real one) and waits until its agents are gone: a Deployment still being deleted
/// would take this run's apply and then go, leaving its old pods (following the old
/// repository) as the only agents.
pub async fn remove_earlier_install(admin: &kube::Client) {
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "linnet-system");
    let _ = deployments
        .delete("linnet", &DeleteParams::foreground())
        .await;
    super::eventually(
        "an earlier install's agents to be gone",
        Duration::from_secs(120),
        || async {
            (deployments.get_opt("linnet").await.ok()?.is_none() && agent_processes().is_empty())
                .then_some(())
        },
    )
    .await;
}
