//! Issue 72: `linnet doctor` on the local control plane (and the real node, for an image that
//! cannot be pulled): each trap of a new install found where it is, and not where it is not.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::{TestNamespace, admin_client, from_json, git, install_linnet};

/// `linnet doctor ARGS` as a cluster admin: its exit code and what it printed.
fn doctor(args: &[String]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
        .arg("doctor")
        .args(args)
        .env("KUBECONFIG", support::admin_kubeconfig())
        .env_remove("POD_NAMESPACE")
        .output()
        .expect("run linnet doctor");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The line of `out` that starts with `mark` and says `says`, or a panic showing all of it.
fn line<'o>(out: &'o str, mark: &str, says: &str) -> &'o str {
    out.lines()
        .find(|l| l.starts_with(mark) && l.contains(says))
        .unwrap_or_else(|| panic!("no `{mark}` line saying {says:?} in:\n{out}"))
}

fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn config_map(name: &str, ns: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n")
}

/// The agent's ServiceAccount in `ns` bound to the shipped ClusterRole `linnet`, as
/// deploy/rbac.yaml binds it in linnet-system; unbound when dropped.
async fn bind_agent_account(admin: &kube::Client, ns: &str) -> support::TestClusterRoleBinding {
    let subjects = json!([{"kind": "ServiceAccount", "name": "linnet", "namespace": ns}]);
    support::TestClusterRoleBinding::apply(admin, &format!("{ns}-doctor-agent"), "linnet", subjects)
        .await
}

/// A repository whose objects go to two granted namespaces and one that does not exist, with
/// an overlay and a kustomize that is not there: doctor names each trap, says the CRDs, the
/// clock, the grants and the Git host are fine, and exits 1. Then, for a source name nobody
/// granted or let the agent act as, and a Git host that does not answer, it names those.
#[tokio::test]
async fn doctor_names_each_trap_of_a_new_install() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let home = TestNamespace::create(&admin, "doctor").await;
    // Every test namespace is granted to linnet-default (`TestNamespace::create`).
    let other = TestNamespace::create(&admin, "doctor-other").await;
    // The agent's own namespace, closed to the source as in an install.
    let agent_ns = TestNamespace::create(&admin, "doctor-agent").await;
    let _agent = bind_agent_account(&admin, &agent_ns.name).await;
    let missing = format!("{}-missing", home.name);
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    write(&work, "granted.yaml", &config_map("a", &home.name));
    write(&work, "other.yaml", &config_map("b", &other.name));
    write(&work, "missing.yaml", &config_map("c", &missing));
    write(&work, "app/kustomization.yaml", "resources: [cm.yaml]\n");
    write(&work, "app/cm.yaml", &config_map("d", &home.name));
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "specs"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

    let (rc, out) = doctor(&[
        work.display().to_string(),
        format!("--repo-url=file://{}", bare.display()),
        format!("--agent-namespace={}", agent_ns.name),
        "--kustomize=/nonexistent/kustomize".into(),
    ]);
    assert_eq!(rc, 1, "{out}");
    line(&out, "ok   cluster:", "Kubernetes v1.36");
    line(&out, "ok   clock:", "within 5 s");
    for crd in [
        "canarystatefulsets",
        "canarydeployments",
        "linnetsources",
        "analysistemplates",
    ] {
        line(
            &out,
            "ok   crd:",
            &format!("{crd}.rollouts.linnet.dev as this linnet's"),
        );
    }
    line(
        &out,
        "warn agent:",
        &format!("in namespace {}", agent_ns.name),
    );
    line(
        &out,
        "FAIL render:",
        "kustomize cannot be run as /nonexistent/kustomize",
    );
    line(
        &out,
        "FAIL namespace:",
        &format!("{missing} does not exist"),
    );
    line(&out, "ok   namespace:", &format!("{} exists", home.name));
    line(&out, "warn specs:", "1 error(s) block their files");
    line(
        &out,
        "FAIL grant:",
        &format!("system:serviceaccount:{missing}:linnet-default may not get, patch configmaps"),
    );
    for granted in [&home.name, &other.name] {
        assert!(
            !out.contains(&format!("serviceaccount:{granted}:linnet-default may not")),
            "a granted namespace is refused:\n{out}"
        );
    }
    line(
        &out,
        "ok   impersonation:",
        &format!(
            "may act as system:serviceaccount:{}:linnet-default",
            home.name
        ),
    );
    line(&out, "ok   git:", "answers; main is at");

    // A Git host nobody answers at, and a source name the agent may not act for.
    let closed = support::ports::free_port();
    let (rc, out) = doctor(&[
        work.display().to_string(),
        format!("--repo-url=http://127.0.0.1:{closed}/specs.git"),
        format!("--agent-namespace={}", agent_ns.name),
        "--source-name=payments".into(),
        "--timeout=5s".into(),
    ]);
    assert_eq!(rc, 1, "{out}");
    line(&out, "FAIL git:", "cannot reach");
    line(
        &out,
        "FAIL grant:",
        &format!(
            "system:serviceaccount:{0}:linnet-payments may not get, patch configmaps in namespace {0}",
            home.name
        ),
    );
    line(
        &out,
        "FAIL impersonation:",
        &format!(
            "may not act as system:serviceaccount:{}:linnet-payments",
            home.name
        ),
    );
}

/// The agent's Deployment on an image that does not exist (a `kubectl set image` to a tag
/// never pushed): on the real node its pod waits in ImagePullBackOff, and doctor says so.
#[tokio::test]
async fn doctor_names_an_agent_image_that_cannot_be_pulled() {
    let admin = admin_client().await;
    if !support::node::require(&admin).await {
        return;
    }
    let ns = TestNamespace::create(&admin, "doctor-image").await;
    let image = format!("{}:never-pushed", support::node::KV_IMAGE);
    let mut template = json!({
        "metadata": {"labels": {"app.kubernetes.io/name": "linnet"}},
        "spec": {"containers": [{"name": "linnet", "image": image}]},
    });
    support::node::on_node(&mut template);
    let deployment: Deployment = from_json(json!({
        "metadata": {"name": "linnet", "labels": {"app.kubernetes.io/name": "linnet"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "linnet"}},
            "template": template,
        },
    }));
    Api::<Deployment>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let args = [format!("--agent-namespace={}", ns.name)];
    let out = support::eventually(
        "doctor naming the image",
        Duration::from_secs(90),
        || async {
            let (rc, out) = doctor(&args);
            (rc == 1 && out.contains("FAIL agent image:")).then_some(out)
        },
    )
    .await;
    line(&out, "FAIL agent image:", &format!("cannot pull {image}"));
    line(
        &out,
        "warn agent:",
        &format!("{}/linnet: none of 1 replica(s) Ready", ns.name),
    );
}
