//! `linnet get` as a person runs it: as the kubectl plugin `kubectl linnet` (kubectl built
//! from its Go module), listing rollouts, printing them as YAML or JSON, and a table of
//! mistakes, each with the exact message and exit code a person gets (issue 47).
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kube::Api;
use kube::api::PostParams;
use linnet::api::{CanaryDeployment, CanaryStatefulSet};
use serde_json::json;
use support::TestNamespace;

/// A directory holding `kubectl-linnet`, a link to the built binary, as an installation has it.
fn plugin_dir(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let link = bin.join("kubectl-linnet");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_linnet"), &link).unwrap();
    }
    bin
}

/// Runs `program` with the plugin and the test tools first on PATH, as the cluster's admin.
fn run(dir: &Path, program: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let path = format!(
        "{}:{}:{}",
        plugin_dir(dir).display(),
        support::tools_bin().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new(program);
    command
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", support::admin_kubeconfig());
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn succeeded(out: &Output) -> String {
    let (stdout, stderr) = text(out);
    assert!(out.status.success(), "{stdout}{stderr}");
    stdout
}

/// A rollout of each kind named `shared`, and a CanaryStatefulSet `redis`, as kubectl would
/// apply them (no agent runs here: they have no status).
async fn rollouts(ns: &str) {
    let client = support::admin_client().await;
    support::install_crds(&client).await;
    let template = json!({
        "selector": {"matchLabels": {"app": "x"}},
        "template": {"metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "x", "image": "x:1"}]}}
    });
    for name in ["shared", "redis"] {
        let sts: CanaryStatefulSet = serde_json::from_value(json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 3, "image": "redis:7.2",
                "template": {"serviceName": name, "selector": template["selector"],
                    "template": template["template"]}}
        }))
        .unwrap();
        Api::<CanaryStatefulSet>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &sts)
            .await
            .unwrap();
    }
    let deploy: CanaryDeployment = serde_json::from_value(json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryDeployment",
        "metadata": {"name": "shared", "namespace": ns},
        "spec": {"replicas": 4, "image": "web:1", "template": template}
    }))
    .unwrap();
    Api::<CanaryDeployment>::namespaced(client, ns)
        .create(&PostParams::default(), &deploy)
        .await
        .unwrap();
}

#[tokio::test]
async fn kubectl_linnet_lists_shows_and_prints_rollouts() {
    let client = support::admin_client().await;
    let ns = TestNamespace::create(&client, "plugin").await;
    let ns = ns.name.as_str();
    rollouts(ns).await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();

    // kubectl finds the plugin on PATH; its help names the command as typed.
    let help = succeeded(&run(dir, "kubectl", &["linnet", "--help"], &[]));
    assert!(help.contains("Usage: kubectl linnet"), "{help}");

    // A list of both kinds, rows named kind/name.
    let list = succeeded(&run(dir, "kubectl", &["linnet", "get", "-n", ns], &[]));
    let lines: Vec<&str> = list.lines().collect();
    assert!(lines[0].starts_with("NAME "), "{list}");
    assert_eq!(lines.len(), 4, "{list}");
    for name in ["cdeploy/shared", "csts/redis", "csts/shared"] {
        assert!(list.contains(name), "no {name} in\n{list}");
    }
    // -A adds the namespace; -o wide the step, source and message.
    let all = succeeded(&run(dir, "kubectl", &["linnet", "get", "-A"], &[]));
    assert!(
        all.lines()
            .any(|l| l.starts_with(&format!("{ns} ")) && l.contains("csts/redis")),
        "{all}"
    );
    let wide = succeeded(&run(
        dir,
        "kubectl",
        &["linnet", "get", "-n", ns, "-o", "wide"],
        &[],
    ));
    assert!(wide.contains("(not from Git)"), "{wide}");

    // kind/name picks one of two rollouts of the same name.
    let tree = succeeded(&run(
        dir,
        "kubectl",
        &["linnet", "get", "cdeploy/shared", "-n", ns],
        &[],
    ));
    assert!(tree.contains("Kind:        CanaryDeployment"), "{tree}");

    // -o yaml and -o json print the objects, with apiVersion and kind.
    let yaml = succeeded(&run(
        dir,
        "kubectl",
        &["linnet", "get", "csts/redis", "-n", ns, "-o", "yaml"],
        &[],
    ));
    assert!(yaml.contains("kind: CanaryStatefulSet"), "{yaml}");
    let json = succeeded(&run(
        dir,
        "kubectl",
        &["linnet", "get", "-n", ns, "-o", "json"],
        &[],
    ));
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap().len(), 3, "{json}");
    assert_eq!(
        list["items"][0]["apiVersion"],
        "rollouts.linnet.dev/v1alpha1"
    );

    // --context and --kubeconfig name the cluster as for kubectl.
    let context = std::fs::read_to_string(support::admin_kubeconfig())
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("current-context:"))
        .map(|c| c.trim().trim_matches('"').to_string())
        .unwrap();
    let elsewhere = dir.join("empty.kubeconfig");
    std::fs::write(&elsewhere, "apiVersion: v1\nkind: Config\n").unwrap();
    let admin = support::admin_kubeconfig();
    let chosen = succeeded(&run(
        dir,
        "kubectl",
        &[
            "linnet",
            "get",
            "csts/redis",
            "-n",
            ns,
            "--kubeconfig",
            admin.to_str().unwrap(),
            "--context",
            &context,
        ],
        &[("KUBECONFIG", elsewhere.to_str().unwrap())],
    ));
    assert!(chosen.contains("Name:        redis"), "{chosen}");
}

/// A second kube-apiserver on the local control plane's etcd, under its own prefix: a real,
/// empty cluster where linnet is not installed (`tests/cluster/bare-apiserver.sh`). Stopped
/// when dropped.
struct BareCluster {
    kubeconfig: String,
    pid: String,
}

impl BareCluster {
    fn start() -> BareCluster {
        let port = support::ports::free_port().to_string();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/bare-apiserver.sh");
        let out = Command::new(script)
            .arg(&port)
            .env("LINNET_CLUSTER_DIR", support::cluster_dir())
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}{stderr}");
        let pid_file = support::cluster_dir().join(format!("pid/bare-apiserver-{port}.pid"));
        BareCluster {
            kubeconfig: stdout.trim().to_string(),
            pid: std::fs::read_to_string(pid_file)
                .unwrap()
                .trim()
                .to_string(),
        }
    }
}

impl Drop for BareCluster {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-9", &self.pid]).status();
    }
}

/// A row of the table: the mistake, the command's arguments, its environment, and the start
/// of what it must print on stderr.
type Mistake<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>, String);

/// Each mistake a person makes, the exact message they get (a part of it that says what is
/// wrong and what to do), and the exit code; run as the kubectl plugin against the real
/// control plane.
#[tokio::test]
async fn each_mistake_gets_a_message_that_says_what_to_do() {
    let client = support::admin_client().await;
    let ns = TestNamespace::create(&client, "mistakes").await;
    let ns = ns.name.as_str();
    rollouts(ns).await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let home = dir.to_str().unwrap();
    let missing = dir.join("nope.kubeconfig");
    let missing = missing.to_str().unwrap();
    let bare = BareCluster::start();
    let specs = dir.join("specs");
    std::fs::create_dir_all(&specs).unwrap();
    let specs = format!("--repo-path={}", specs.display());
    let no_namespace = format!("t-nope-{}", std::process::id());
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(
        elsewhere.join("cm.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: \
             {no_namespace}\ndata:\n  a: b\n"
        ),
    )
    .unwrap();
    let elsewhere = elsewhere.to_str().unwrap();
    let crds_missing = "linnet: this cluster does not serve rollouts.linnet.dev/v1alpha1: linnet's \
         CustomResourceDefinitions are not installed. Install them with `kubectl apply -f \
         deploy/crds/crds.yaml` (or `linnet crds | kubectl apply -f -`), as an administrator";
    let table: Vec<Mistake> = vec![
        (
            "a rollout that does not exist",
            vec!["get", "nothing-here", "-n", ns],
            vec![],
            format!(
                "linnet: no CanaryStatefulSet or CanaryDeployment nothing-here in namespace {ns} \
                 (linnet get -A lists them; -n names the namespace)"
            ),
        ),
        (
            "a name both kinds have",
            vec!["get", "shared", "-n", ns],
            vec![],
            format!(
                "linnet: both a CanaryStatefulSet and a CanaryDeployment are named shared in \
                 namespace {ns}: say csts/shared or cdeploy/shared"
            ),
        ),
        (
            "a kind that is not a rollout",
            vec!["get", "pods/redis", "-n", ns],
            vec![],
            "linnet: pods/redis: no such kind of rollout; say csts/NAME (CanaryStatefulSet) or \
             cdeploy/NAME (CanaryDeployment)"
                .to_string(),
        ),
        (
            "promoting a rollout with no canary",
            vec!["promote", "csts/redis", "-n", ns],
            vec![],
            "linnet: redis has no canary to promote now: no phase under way reads the promote \
             lever (linnet get redis shows its phase)"
                .to_string(),
        ),
        (
            "aborting a rollout with no canary",
            vec!["abort", "cdeploy/shared", "-n", ns],
            vec![],
            "linnet: shared has no canary to abort now".to_string(),
        ),
        (
            "a cluster without linnet's CRDs: linnet get",
            vec!["get", "-A"],
            vec![("KUBECONFIG", bare.kubeconfig.as_str())],
            crds_missing.to_string(),
        ),
        (
            "a cluster without linnet's CRDs: the agent refuses to start",
            vec!["agent", specs.as_str(), "--leader-elect=false"],
            vec![("KUBECONFIG", bare.kubeconfig.as_str())],
            crds_missing.to_string(),
        ),
        (
            "a Git token file that is not there: the agent refuses to start",
            vec![
                "agent",
                "--repo-url=https://git.example/acme/gitops.git",
                "--git-password-file=/nonexistent/token",
            ],
            vec![],
            "linnet: --git-password-file /nonexistent/token: the file does not exist; it must \
             hold a token of the Git host that can read the repository (in a cluster: the \
             Secret mounted there, see docs/getting-started.md)"
                .to_string(),
        ),
        (
            "a spec in a namespace that does not exist: linnet diff",
            vec!["diff", elsewhere, "--allow-namespace", &no_namespace],
            vec![],
            format!(
                "error: ConfigMap {no_namespace}/settings: cm.yaml:1:1: namespace {no_namespace} \
                 does not exist: a cluster admin creates it and lets the source deploy there (a \
                 RoleBinding to ClusterRole linnet-source, docs/getting-started.md), or the \
                 revision creates it (a Namespace in Git, with --allow-cluster-kind Namespace)"
            ),
        ),
        (
            "a spec directory that does not exist",
            vec!["validate", "/nonexistent/specs"],
            vec![],
            "linnet: /nonexistent/specs: no such file".to_string(),
        ),
        (
            "a webhook secret file that is not there",
            vec![
                "agent",
                "--repo-url=https://git.example/acme/gitops.git",
                "--webhook-secret-file=/nonexistent/secret",
            ],
            vec![],
            "linnet: cannot read /nonexistent/secret: no such file (--webhook-secret-file)"
                .to_string(),
        ),
        (
            "a CA file that is not there",
            vec![
                "agent",
                "--repo-url=https://git.example/acme/gitops.git",
                "--ca-file=/nonexistent/ca.pem",
            ],
            vec![],
            "linnet: cannot read --ca-file /nonexistent/ca.pem: no such file".to_string(),
        ),
        (
            "a context the kubeconfig does not have",
            vec!["get", "-n", ns, "--context", "nope"],
            vec![],
            "linnet: cannot connect to Kubernetes: --context nope: the kubeconfig has no such \
             context (it has: "
                .to_string(),
        ),
        (
            "a kubeconfig file that does not exist",
            vec!["get", "-n", ns, "--kubeconfig", missing],
            vec![],
            format!("linnet: cannot connect to Kubernetes: --kubeconfig {missing}: no such file"),
        ),
        (
            "KUBECONFIG naming no file, outside a pod",
            vec!["get", "-n", ns],
            vec![("KUBECONFIG", missing), ("HOME", home)],
            format!(
                "linnet: cannot connect to Kubernetes: no cluster configured: KUBECONFIG \
                 ({missing}) names no readable kubeconfig, and this is not a pod \
                 (KUBERNETES_SERVICE_HOST is not set). Set KUBECONFIG or pass --kubeconfig \
                 (and --context) as for kubectl"
            ),
        ),
    ];
    // validate asks the cluster it can reach too (exit 1: an error in the specs).
    let validate = run(dir, "kubectl", &["linnet", "validate", elsewhere], &[]);
    let (stdout, stderr) = text(&validate);
    assert_eq!(validate.status.code(), Some(1), "{stdout}{stderr}");
    let want = format!("cm.yaml:1:1: namespace {no_namespace} does not exist");
    assert!(
        stdout
            .lines()
            .chain(stderr.lines())
            .any(|l| l.starts_with(&want)),
        "{stdout}{stderr}"
    );
    let offline = run(
        dir,
        "kubectl",
        &[
            "linnet",
            "validate",
            elsewhere,
            "--check-namespaces",
            "never",
        ],
        &[],
    );
    assert_eq!(offline.status.code(), Some(0), "{:?}", text(&offline));

    let mut wrong = Vec::new();
    for (mistake, args, env, want) in &table {
        let mut all = vec!["linnet"];
        all.extend(args);
        let out = run(dir, "kubectl", &all, env);
        let (stdout, stderr) = text(&out);
        // The message is a line of its own (a log line may come before it).
        if out.status.code() != Some(2) || !stderr.lines().any(|l| l.starts_with(want.as_str())) {
            wrong.push(format!(
                "{mistake}: exit {:?}\n  want: {want}\n  got:  {stderr}{stdout}",
                out.status.code()
            ));
        }
        for bad in ["Status {", "(os error", "Failed to infer", "Error {"] {
            if stderr.contains(bad) {
                wrong.push(format!("{mistake}: {bad:?} in {stderr}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
