//! Issue 72, real-node tier: the namespace-scoped install (docs/namespace-install.md) run as
//! written. The admin's steps (CRDs, the two namespaces, ClusterRole linnet-volumes) and the
//! team's (`kubectl apply -k examples/namespace-install`, with its one namespace setting
//! changed and the image set by an overlay) install the agent as real pods with Roles only.
//! A CanaryStatefulSet of the key-value server rolls out with its volumes handed over, every
//! key kept; an object for another namespace is a located error that blocks only itself; and
//! the agent's account may list nothing outside its two namespaces. Its own test binary: it
//! installs the agent's Deployment in linnet-system, as tests/node_install.rs does.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use linnet::api::{CanaryStatefulSet, LinnetSource, StatefulSetPhase};
use serde_json::json;
use support::install::{
    agent_processes, build_and_load_image, kubectl, pathdiff, print_agent_logs,
    remove_earlier_install, uninstall, write_overlay,
};
use support::node::{self, Ledger};

const TOKEN: &str = "namespace-install-git-token";
const AGENT: &str = "system:serviceaccount:linnet-system:linnet";

/// The commands of docs/namespace-install.md between its markers.
fn documented_steps() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/namespace-install.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let block = text
        .split_once("<!-- namespace-install-steps:begin -->")
        .and_then(|(_, rest)| rest.split_once("<!-- namespace-install-steps:end -->"))
        .map(|(block, _)| block.trim())
        .expect("docs/namespace-install.md marks its steps");
    block
        .strip_prefix("```sh")
        .and_then(|b| b.strip_suffix("```"))
        .expect("the steps are one sh block")
        .to_string()
}

/// examples/namespace-install copied to `dir`, its `resources` pointed at deploy/ and its
/// namespace set as the page says (`value: demo` in watch-namespace.yaml, the one place).
fn copy_namespace_install(dir: &Path, namespace: &str) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let from = root.join("examples/namespace-install");
    let to = dir.join("namespace-install");
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(&from).unwrap().flatten() {
        if entry.path().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
    let kustomization = to.join("kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization).unwrap().replace(
        "- ../../deploy\n",
        &format!("- {}\n", pathdiff(&root.join("deploy"), &to)),
    );
    std::fs::write(&kustomization, text).unwrap();
    let setting = to.join("watch-namespace.yaml");
    let text = std::fs::read_to_string(&setting).unwrap();
    assert!(text.contains("value: demo"), "{text}");
    std::fs::write(
        &setting,
        text.replace("value: demo", &format!("value: {namespace}")),
    )
    .unwrap();
    to
}

/// Whether the agent's account may `verb` `resource` (`group/plural`, `plural` for the core
/// group) in `namespace` (every namespace when empty).
async fn agent_may(admin: &kube::Client, verb: &str, resource: &str, namespace: &str) -> bool {
    let (group, resource) = resource.rsplit_once('/').unwrap_or(("", resource));
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(AGENT.into()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn a_namespace_scoped_install_rolls_out_with_roles_only() {
    let admin = support::admin_client().await;
    if !node::require(&admin).await {
        return;
    }
    // An earlier install goes first, and so does the cluster-wide binding: with it, this
    // agent would hold cluster rights.
    remove_earlier_install(&admin).await;
    let _ = Api::<ClusterRoleBinding>::all(admin.clone())
        .delete("linnet", &DeleteParams::default())
        .await;
    kubectl(&[
        "-n",
        "linnet-system",
        "delete",
        "configmap",
        "linnet-config",
        "--ignore-not-found",
    ]);

    let ns = format!("t-nsinstall-{}", std::process::id());
    let installed = Uninstall { ns: ns.clone() };
    let dir = tempfile::tempdir().unwrap();
    build_and_load_image(dir.path());

    // The repository: the key-value store in the watched namespace, and a ConfigMap for a
    // namespace this agent may not deploy to.
    let root = dir.path().join("git");
    std::fs::create_dir_all(&root).unwrap();
    let (_bare, work) = support::bare_remote_and_clone(&root);
    let commit = |tag: &str| {
        let rollout = node::kv_rollout(
            &ns,
            "v1",
            json!({"image": format!("linnet.test/kv:{tag}"), "progressDeadlineSeconds": 180,
                "promotion": {"type": "Auto", "bakeSeconds": 5}}),
        );
        std::fs::create_dir_all(work.join("apps")).unwrap();
        std::fs::write(
            work.join("apps/kv.yaml"),
            serde_json::to_string_pretty(&rollout).unwrap(),
        )
        .unwrap();
        std::fs::write(
            work.join("apps/elsewhere.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: elsewhere\n  namespace: default\ndata:\n  k: v\n",
        )
        .unwrap();
        support::git(&work, &["add", "-A"]);
        support::git(&work, &["commit", "-qm", &format!("kv {tag}")]);
        support::git(&work, &["push", "-q", "origin", "HEAD:main"]);
    };
    commit("v1");
    let base = support::git_http::serve_on(node::NODE_GATEWAY, root, Some(("git", TOKEN)));

    // The page's steps, as written: another namespace than demo (set in the copy, as the page
    // says), and the copy's overlay that sets the image and puts the agent on the node.
    let install = copy_namespace_install(dir.path(), &ns);
    let overlay = dir.path().join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    write_overlay(&overlay, &install);
    let rendered = kubectl(&["kustomize", overlay.to_str().unwrap()]);
    for cluster_kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "Namespace",
        "CustomResourceDefinition",
    ] {
        assert!(
            !rendered.contains(&format!("\nkind: {cluster_kind}\n")),
            "the namespace-scoped install renders a {cluster_kind}"
        );
    }
    let steps = documented_steps()
        .replace(
            "https://github.com/YOU/gitops.git",
            &format!("{base}/remote.git"),
        )
        .replace("YOUR-GIT-TOKEN", TOKEN)
        .replace("create namespace demo ", &format!("create namespace {ns} "))
        .replace(
            "kubectl apply -k examples/namespace-install\n",
            &format!("kubectl apply -k {}\n", overlay.display()),
        );
    assert!(
        steps.contains(&ns) && steps.contains(overlay.to_str().unwrap()),
        "{steps}"
    );
    let path = format!(
        "{}:{}",
        support::tools_bin().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &steps])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("PATH", path)
        .env("KUBECONFIG", support::admin_kubeconfig())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the documented steps failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Roles only: the agent may list in its two namespaces (once the authorizer has the new
    // bindings), not across the cluster.
    support::eventually("the Roles in effect", Duration::from_secs(30), || async {
        (agent_may(&admin, "list", "pods", &ns).await
            && agent_may(
                &admin,
                "list",
                "coordination.k8s.io/leases",
                "linnet-system",
            )
            .await)
            .then_some(())
    })
    .await;
    for resource in [
        "pods",
        "apps/statefulsets",
        "rollouts.linnet.dev/canarystatefulsets",
        "configmaps",
        "coordination.k8s.io/leases",
    ] {
        assert!(
            !agent_may(&admin, "list", resource, "").await,
            "the agent may list {resource} in every namespace"
        );
    }
    assert!(!agent_may(&admin, "list", "pods", "default").await);

    support::eventually("two agent processes", Duration::from_secs(120), || async {
        (agent_processes().len() == 2).then_some(())
    })
    .await;
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns);
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
    // The object for another namespace: a located error on the source, nothing applied there.
    let sources: Api<LinnetSource> = Api::namespaced(admin.clone(), "linnet-system");
    let refusal = support::eventually(
        "the other namespace's object refused",
        Duration::from_secs(60),
        || async {
            sources
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .flat_map(|s| s.status.map(|st| st.spec_errors).unwrap_or_default())
                .find(|e| e.contains("apps/elsewhere.yaml"))
        },
    )
    .await;
    assert!(
        refusal.contains("not allowed for this agent") && refusal.contains(&ns),
        "{refusal}"
    );
    let elsewhere =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), "default");
    assert!(elsewhere.get_opt("elsewhere").await.unwrap().is_none());

    // A canary with the volume handoff (ClusterRole linnet-volumes): every key kept.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let mut ledger = Ledger::default();
    for k in 0..3 {
        let ip = node::ready_pod_ip(&pods, &format!("kv-stable-{k}"), 60).await;
        ledger.write(k, &ip, "before").await;
    }
    commit("v2");
    support::eventually("kv Stable on v2", Duration::from_secs(300), || async {
        let r = rollouts.get_opt("kv").await.ok()??;
        stable_on(&r, "v2").then_some(())
    })
    .await;
    let names: BTreeMap<i32, String> = (0..3).map(|k| (k, format!("kv-stable-{k}"))).collect();
    ledger.check_all(&pods, &names, "v2").await.unwrap();
    drop(installed);
}

/// [`uninstall`], then the watched namespace and the volume grant; also when the test fails.
struct Uninstall {
    ns: String,
}

impl Drop for Uninstall {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_agent_logs();
        }
        let ns = self.ns.clone();
        support::clean_up(|client| async move {
            uninstall(client.clone(), &ns).await;
            let _ = Api::<Namespace>::all(client.clone())
                .delete(&ns, &DeleteParams::default())
                .await;
            let _ = Api::<ClusterRoleBinding>::all(client)
                .delete("linnet-volumes", &DeleteParams::default())
                .await;
        });
    }
}
