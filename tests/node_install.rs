//! Real-node tier (issue 68): linnet itself as real pods. The image `make image` builds is
//! loaded into the node's containerd (no registry), installed with `kubectl apply -k` of an
//! overlay that sets that image (the documented way), two replicas with leader election.
//! The agent in the pod reaches the API server through the `kubernetes` Service and the Git
//! server on the node's bridge. A rollout of the key-value server is in flight when the
//! leader's container is killed (SIGKILL of its process): the standby takes the Lease and the
//! rollout finishes, every key kept. Then `linnet doctor` in the agent's container (exec'd
//! through containerd: this control plane cannot dial its kubelet) finds nothing wrong, and the agent is upgraded to another image by docs/upgrading.md's steps: no workload
//! pod restarts, no key is lost, the inventory is kept. Its own test binary: it installs
//! cluster-wide objects and the agent's Deployment in linnet-system.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use linnet::api::{CanaryStatefulSet, StatefulSetPhase};
use serde_json::json;
use support::install::{
    IMAGE, agent_processes, build_and_load_image, kubectl, print_agent_logs,
    remove_earlier_install, run, uninstall, write_overlay,
};
use support::node::{self, Ledger};
const TOKEN: &str = "node-install-git-token";

#[tokio::test]
async fn linnet_installed_as_real_pods_hands_over_when_the_leader_is_killed() {
    let admin = support::admin_client().await;
    if !node::require(&admin).await {
        return;
    }
    remove_earlier_install(&admin).await;
    let ns = support::TestNamespace::create(&admin, "node-install").await;
    let dir = tempfile::tempdir().unwrap();
    build_and_load_image(dir.path());

    // The repository: a kv rollout on the real node, auto-promoted after a bake, served where
    // the pods reach this machine.
    let root = dir.path().join("git");
    std::fs::create_dir_all(&root).unwrap();
    let (_bare, work) = support::bare_remote_and_clone(&root);
    // Only `image` changes between commits, as a push of a new version does.
    let rollout = |tag: &str| {
        node::kv_rollout(
            &ns.name,
            "v1",
            json!({"image": format!("linnet.test/kv:{tag}"), "progressDeadlineSeconds": 180,
                "promotion": {"type": "Auto", "bakeSeconds": 25}}),
        )
    };
    let commit = |tag: &str| {
        std::fs::create_dir_all(work.join("apps")).unwrap();
        std::fs::write(
            work.join("apps/kv.yaml"),
            serde_json::to_string_pretty(&rollout(tag)).unwrap(),
        )
        .unwrap();
        support::git(&work, &["add", "-A"]);
        support::git(&work, &["commit", "-qm", &format!("kv {tag}")]);
        support::git(&work, &["push", "-q", "origin", "HEAD:main"]);
    };
    commit("v1");
    let base = support::git_http::serve_on(node::NODE_GATEWAY, root, Some(("git", TOKEN)));

    // An install left by another test (docs/getting-started.md's, in tests/deploy.rs) keeps
    // its ConfigMap, and pods started before this test's is applied would read its repository
    // URL: gone first, so the agents wait for this one.
    kubectl(&[
        "-n",
        "linnet-system",
        "delete",
        "configmap",
        "linnet-config",
        "--ignore-not-found",
    ]);

    // The documented install, with an overlay that sets the image.
    let overlay = dir.path().join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    write_overlay(
        &overlay,
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy"),
    );
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-k",
        overlay.to_str().unwrap(),
    ]);
    let repo = format!("--from-literal=LINNET_REPO_URL={base}/remote.git");
    for (kind, name, literal) in [
        ("configmap", "linnet-config", repo.as_str()),
        (
            "secret generic",
            "linnet-git",
            &format!("--from-literal=token={TOKEN}"),
        ),
        (
            "secret generic",
            "linnet-webhook",
            "--from-literal=secret=node-install-webhook-secret",
        ),
    ] {
        let mut args: Vec<&str> = vec!["-n", "linnet-system", "create"];
        args.extend(kind.split(' '));
        args.extend([name, literal, "--dry-run=client", "-o", "yaml"]);
        let yaml = kubectl(&args);
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        kubectl(&["apply", "-f", file.to_str().unwrap()]);
    }
    let installed = Uninstall {
        ns: ns.name.clone(),
    };

    // Two agents really run; the Lease names the one that acts.
    support::eventually("two agent processes", Duration::from_secs(120), || async {
        (agent_processes().len() == 2).then_some(())
    })
    .await;
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let phase = |r: &CanaryStatefulSet| r.status.as_ref().and_then(|s| s.phase);
    let stable_on = |r: &CanaryStatefulSet, tag: &str| {
        let s = r.status.clone().unwrap_or_default();
        s.phase == Some(StatefulSetPhase::Stable)
            && s.stable_image.as_deref() == Some(&format!("linnet.test/kv:{tag}"))
            && s.ready.as_deref() == Some("3/3")
    };
    support::eventually("kv Stable on v1", Duration::from_secs(240), || async {
        let r = rollouts.get_opt("kv").await.ok()??;
        stable_on(&r, "v1").then_some(())
    })
    .await;
    doctor_in_the_agents_pod().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    let mut ledger = Ledger::default();
    for k in 0..3 {
        let ip = node::ready_pod_ip(&pods, &format!("kv-stable-{k}"), 60).await;
        ledger.write(k, &ip, "before").await;
    }

    // A push starts a canary; while it bakes, the leader's container is killed.
    commit("v2");
    support::eventually("the canary baking", Duration::from_secs(240), || async {
        let r = rollouts.get_opt("kv").await.ok()??;
        (phase(&r) == Some(StatefulSetPhase::CanaryActive)).then_some(())
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "linnet-system");
    let holder = leases
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find_map(|l| l.spec.and_then(|s| s.holder_identity))
        .expect("a Lease with a holder");
    let procs = agent_processes();
    let (leader, pid) = procs
        .iter()
        .find(|(pod, _)| holder.contains(pod.as_str()))
        .unwrap_or_else(|| panic!("no agent process for Lease holder {holder}: {procs:?}"));
    // Its pod deleted at once (grace 0, as when its node dies) and its process killed: a
    // container killed alone is restarted within a second under the same identity, and takes
    // its own Lease back before the standby may.
    Api::<Pod>::namespaced(admin.clone(), "linnet-system")
        .delete(leader, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    eprintln!("deleted the leader's pod {leader} and killed its process {pid}");
    let new_holder = support::eventually(
        "another replica to hold the Lease",
        Duration::from_secs(120),
        || async {
            leases
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter_map(|l| l.spec.and_then(|s| s.holder_identity))
                .find(|h| !h.is_empty() && h != &holder)
        },
    )
    .await;
    eprintln!("the Lease moved from {holder} to {new_holder}");
    support::eventually(
        "kv Stable on v2 after the handover",
        Duration::from_secs(300),
        || async {
            let r = rollouts.get_opt("kv").await.ok()??;
            stable_on(&r, "v2").then_some(())
        },
    )
    .await;
    let names: BTreeMap<i32, String> = (0..3).map(|k| (k, format!("kv-stable-{k}"))).collect();
    ledger.check_all(&pods, &names, "v2").await.unwrap();

    // docs/upgrading.md, as written, to another image while the store runs.
    upgrade_as_documented(&admin, &overlay, &ns.name).await;
    ledger.check_all(&pods, &names, "v2").await.unwrap();
    drop(installed);
}

/// The documented check of an install (docs/getting-started.md, docs/upgrading.md): doctor in
/// the agent's pod, with its settings and credentials, finds nothing wrong (it warns while no
/// replica is Ready yet).
async fn doctor_in_the_agents_pod() {
    let last = std::cell::RefCell::new(String::new());
    let doctor = support::eventually(
        "doctor in the agent's pod with no warning",
        Duration::from_secs(120),
        || async {
            let out = exec_in_an_agent(&["/usr/local/bin/linnet", "doctor"])?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let done = text.contains(" 0 warning(s), 0 failed");
            let said = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
            if !done && last.replace(said.clone()) != said {
                eprintln!("doctor in the agent's pod, not yet clean:\n{said}");
            }
            done.then_some(text)
        },
    )
    .await;
    for (mark, says) in [
        ("ok   cluster:", "Kubernetes v1."),
        ("ok   clock:", "within 5 s"),
        (
            "ok   crd:",
            "canarystatefulsets.rollouts.linnet.dev as this linnet's",
        ),
        (
            "ok   agent:",
            "linnet-system/linnet: 1 of 2 replica(s) Ready",
        ),
        ("ok   rollout images:", "none waiting for an image"),
        ("ok   git:", "answers; main is at"),
    ] {
        assert!(
            doctor
                .lines()
                .any(|l| l.starts_with(mark) && l.contains(says)),
            "doctor in the agent's pod: no `{mark}` line saying {says:?}:\n{doctor}"
        );
    }
}

/// Runs `command` in a running agent container, as `kubectl exec deploy/linnet --` does on a
/// cluster. Here through containerd on the node: the local control plane's API server cannot
/// dial the kubelet (no DNS for the node's name), so `kubectl exec` and `logs` do not work.
/// The process is the container's (its user, environment, network and account token).
fn exec_in_an_agent(command: &[&str]) -> Option<std::process::Output> {
    static EXECS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let sock = node::node_dir().join("containerd.sock");
    let ctr = ["--address", sock.to_str()?, "-n", "k8s.io"];
    let filter = "labels.\"io.kubernetes.pod.namespace\"==linnet-system,\
                  labels.\"io.kubernetes.container.name\"==linnet";
    let listed = Command::new("ctr")
        .args(ctr)
        .args(["containers", "ls", "-q", filter])
        .output()
        .ok()?;
    for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
        let n = EXECS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let exec_id = format!("doctor-{}-{n}", std::process::id());
        let out = Command::new("ctr")
            .args(ctr)
            .args(["tasks", "exec", "--exec-id", &exec_id, id])
            .args(command)
            .output()
            .ok()?;
        // A container of a stopped pod has no task to exec in: the next one.
        if !String::from_utf8_lossy(&out.stderr).contains("not found") {
            return Some(out);
        }
    }
    None
}

/// The store's pods: name -> (uid, restarts of each container).
async fn workload_pods(pods: &Api<Pod>) -> BTreeMap<String, (String, i32)> {
    pods.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let restarts = p
                .status
                .and_then(|s| s.container_statuses)
                .into_iter()
                .flatten()
                .map(|c| c.restart_count)
                .sum();
            let uid = p.metadata.uid.unwrap_or_default();
            (p.metadata.name.unwrap_or_default(), (uid, restarts))
        })
        .collect()
}

/// The inventory's data: what the source applied, by key.
async fn inventory(admin: &kube::Client) -> BTreeMap<String, String> {
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), "linnet-system");
    let params = ListParams::default();
    let mut data = BTreeMap::new();
    for cm in config_maps.list(&params).await.unwrap().items {
        if cm
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("linnet-inventory-"))
        {
            data.extend(cm.data.unwrap_or_default());
        }
    }
    data
}

/// The steps of docs/upgrading.md: the CRDs, then the overlay on a new tag, `rollout status`,
/// and `linnet doctor` in the new pod. The rollout and its pods are not touched, the inventory
/// is kept, and the new pods run the new image.
async fn upgrade_as_documented(admin: &kube::Client, overlay: &Path, ns: &str) {
    let next = IMAGE.replace(":dev", ":next");
    let sock = node::node_dir().join("containerd.sock");
    let ctr = [
        "--address",
        sock.to_str().unwrap(),
        "-n",
        "k8s.io",
        "images",
    ];
    run(
        Path::new("ctr"),
        &[&ctr[..], &["tag", "--force", IMAGE, &next]].concat(),
    );
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let (pods_before, inventory_before) = (workload_pods(&pods).await, inventory(admin).await);
    assert!(
        !inventory_before.is_empty(),
        "no inventory before the upgrade"
    );
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "deploy/crds/crds.yaml",
    ]);
    let kustomization = overlay.join("kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization).unwrap();
    std::fs::write(&kustomization, text.replace("newTag: dev", "newTag: next")).unwrap();
    let overlay = overlay.to_str().unwrap();
    kubectl(&["apply", "--server-side", "--force-conflicts", "-k", overlay]);
    let deployment = ["-n", "linnet-system", "get", "deploy/linnet", "-o"];
    let generation = kubectl(&[&deployment[..], &["jsonpath={.metadata.generation}"]].concat());
    for wanted in [
        format!("{{.status.observedGeneration}}={}", generation.trim()),
        "{.status.updatedReplicas}=2".to_string(),
        "{.status.readyReplicas}=1".to_string(),
    ] {
        kubectl(&[
            "-n",
            "linnet-system",
            "wait",
            &format!("--for=jsonpath={wanted}"),
            "deploy/linnet",
            "--timeout=240s",
        ]);
    }
    let agents: Api<Pod> = Api::namespaced(admin.clone(), "linnet-system");
    support::eventually(
        "the agents on the new image",
        Duration::from_secs(120),
        || async {
            let labelled = ListParams::default().labels("app.kubernetes.io/name=linnet");
            let images: Vec<String> = agents
                .list(&labelled)
                .await
                .ok()?
                .items
                .into_iter()
                .flat_map(|p| p.spec.map(|s| s.containers).unwrap_or_default())
                .filter_map(|c| c.image)
                .collect();
            (images.len() == 2 && images.iter().all(|i| *i == next)).then_some(())
        },
    )
    .await;
    doctor_in_the_agents_pod().await;
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), ns);
    let kv = rollouts.get("kv").await.unwrap().status.unwrap_or_default();
    assert_eq!(kv.phase, Some(StatefulSetPhase::Stable), "{kv:?}");
    assert_eq!(
        workload_pods(&pods).await,
        pods_before,
        "a workload pod restarted"
    );
    assert_eq!(
        inventory(admin).await,
        inventory_before,
        "the inventory changed"
    );
}

/// [`uninstall`] at the end of the test, also when it fails.
struct Uninstall {
    ns: String,
}

impl Drop for Uninstall {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_agent_logs();
        }
        let ns = self.ns.clone();
        support::clean_up(|client| async move { uninstall(client, &ns).await });
    }
}
