//! `deploy/` installs: every resource its kustomization lists is applied to the real API
//! server (server-side apply, as `kubectl apply -k deploy/` does), and what lands has the
//! safety properties the README promises.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use serde_json::{Value, json};
use support::admin_client;

/// The tests here install the same cluster-wide objects (CRDs, ClusterRoles, namespace
/// linnet-system) with different clients; one at a time, or a create races another's.
static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn deploy_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy"))
}

/// The documents of every file the kustomization lists.
fn kustomized() -> Vec<Value> {
    let k: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let mut docs = Vec::new();
    for file in k["resources"].as_array().unwrap() {
        let text = std::fs::read_to_string(deploy_dir().join(file.as_str().unwrap())).unwrap();
        for part in text.split("\n---\n") {
            let doc: Value = serde_saphyr::from_str(part).unwrap_or(Value::Null);
            if doc.get("kind").is_some() {
                docs.push(doc);
            }
        }
    }
    docs
}

#[tokio::test]
async fn kubectl_apply_k_deploy_installs_everything() {
    let _one = CLUSTER.lock().await;
    let client = admin_client().await;
    let docs = kustomized();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    for kind in [
        "CustomResourceDefinition",
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "NetworkPolicy",
    ] {
        assert!(kinds.contains(&kind), "deploy/ has no {kind}: {kinds:?}");
    }
    // Issue 20: the Service and the NetworkPolicy expose the webhook port to anyone, and
    // nothing else; issue 52: the metrics port, to the monitoring namespace only.
    let of_kind = |kind: &'static str| docs.iter().filter(move |d| d["kind"] == kind);
    for service in of_kind("Service") {
        let only = match service["metadata"]["name"].as_str() {
            Some("linnet-metrics") => "metrics",
            _ => "http",
        };
        for port in service["spec"]["ports"].as_array().unwrap() {
            assert_eq!(port["targetPort"], only, "{service}");
        }
    }
    let policy = of_kind("NetworkPolicy").next().unwrap();
    for rule in policy["spec"]["ingress"].as_array().unwrap() {
        let ports: Vec<&Value> = rule["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["port"])
            .collect();
        match rule.get("from") {
            None => assert!(
                ports.iter().all(|p| *p == "http" || *p == "probes"),
                "open to anyone: {rule}"
            ),
            Some(from) => {
                assert_eq!(ports, [&json!("metrics")], "{rule}");
                assert_eq!(
                    from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
                    "monitoring",
                    "{rule}"
                );
            }
        }
    }
    // Issue 24: nothing the user sets is in deploy/, so applying it again resets nothing.
    assert!(of_kind("Secret").next().is_none());
    assert!(of_kind("ConfigMap").next().is_none());
    // Namespace first, as kubectl orders them.
    let mut ordered = docs.clone();
    ordered.sort_by_key(|d| d["kind"] != "Namespace" && d["kind"] != "CustomResourceDefinition");
    for doc in ordered {
        let (group, version) = doc["apiVersion"]
            .as_str()
            .unwrap()
            .rsplit_once('/')
            .unwrap_or(("", doc["apiVersion"].as_str().unwrap()));
        let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().unwrap());
        let (ar, caps) = pinned_kind(&client, &gvk).await.unwrap();
        let name = doc["metadata"]["name"].as_str().unwrap();
        let api: Api<DynamicObject> = match (caps.scope, doc["metadata"]["namespace"].as_str()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
            _ => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            name,
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap_or_else(|e| panic!("{} {name} is refused: {e}", gvk.kind));
    }

    let d = Api::<Deployment>::namespaced(client.clone(), "linnet-system")
        .get("linnet")
        .await
        .unwrap();
    let spec = d.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("linnet"));
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .clone()
            .unwrap()
    };
    assert_eq!(probe(&c.liveness_probe), "/healthz");
    assert_eq!(probe(&c.readiness_probe), "/readyz");
    let resources = c.resources.as_ref().unwrap();
    assert!(resources.requests.is_some() && resources.limits.is_some());
    // Issue 51: the shipped limit fits the 10,000-rollout figures (docs/performance.md).
    let memory = resources.limits.as_ref().and_then(|l| l.get("memory"));
    assert_eq!(memory.map(|q| q.0.as_str()), Some("384Mi"));
    // The clone cache is on an emptyDir; Secrets are files.
    let volumes = pod.volumes.unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v.name == "cache" && v.empty_dir.is_some())
    );
    assert!(volumes.iter().filter(|v| v.secret.is_some()).count() >= 2);
    // Every environment variable it sets is one of linnet agent's.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["agent", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for e in c.env.iter().flatten() {
        assert!(
            help.contains(&format!("env: {}=", e.name)),
            "{} is not a flag's variable",
            e.name
        );
    }

    let binding = Api::<ClusterRoleBinding>::all(client)
        .get("linnet")
        .await
        .unwrap();
    assert_eq!(binding.role_ref.name, "linnet");
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", "linnet", Some("linnet-system"))
    );
}

/// The commands of docs/getting-started.md between its install-steps markers.
fn install_steps() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/getting-started.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let block = text
        .split_once("<!-- install-steps:begin -->")
        .and_then(|(_, rest)| rest.split_once("<!-- install-steps:end -->"))
        .map(|(block, _)| block)
        .expect("docs/getting-started.md marks its install steps");
    let block = block.trim();
    block
        .strip_prefix("```sh")
        .and_then(|b| b.strip_suffix("```"))
        .expect("the install steps are one sh block")
        .to_string()
}

/// Runs `linnet agent` as the kubelet would run deploy/'s Deployment: its args, its env (with
/// `envFrom` and the downward API), its Secret volumes as files, as its ServiceAccount.
async fn run_as_deployed(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    dir: &Path,
) -> std::process::Child {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let d = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap();
    let pod = d.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    let mut env: Vec<(String, String)> = Vec::new();
    for from in c.env_from.iter().flatten() {
        let name = &from.config_map_ref.as_ref().unwrap().name;
        let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("ConfigMap {name} the Deployment reads: {e}"));
        env.extend(cm.data.unwrap_or_default());
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().unwrap().field_path.as_str() {
                "metadata.name" => "linnet-install-test".into(),
                "metadata.namespace" => namespace.into(),
                other => panic!("a field the test does not know: {other}"),
            },
            (None, None) => String::new(),
        };
        env.push((e.name.clone(), value));
    }
    // Volumes: Secrets as files, emptyDirs as directories, at a path under `dir`.
    let mut mounts: Vec<(String, std::path::PathBuf)> = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let local = dir.join(m.mount_path.trim_start_matches('/'));
        std::fs::create_dir_all(&local).unwrap();
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .unwrap();
        if let Some(secret) = &volume.secret {
            let name = secret.secret_name.as_deref().unwrap();
            let s = Api::<Secret>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .unwrap_or_else(|e| panic!("Secret {name} the Deployment mounts: {e}"));
            for (key, value) in s.data.unwrap_or_default() {
                std::fs::write(local.join(key), value.0).unwrap();
            }
        }
        mounts.push((m.mount_path.clone(), local));
    }
    let kubeconfig = support::service_account_kubeconfig(
        client,
        namespace,
        pod.service_account_name.as_deref().unwrap(),
        dir,
    )
    .await;
    let log = std::fs::File::create(dir.join("agent.log")).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_linnet"));
    cmd.args(c.args.iter().flatten())
        .env_clear()
        // The image has kustomize and helm on its PATH.
        .env(
            "PATH",
            format!(
                "{}:{}",
                support::render_bin().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("KUBECONFIG", &kubeconfig)
        .stderr(log)
        .stdout(std::process::Stdio::null());
    for (name, mut value) in env {
        for (path, local) in &mounts {
            if let Some(rest) = value.strip_prefix(path.as_str()) {
                value = format!("{}{rest}", local.display());
            }
        }
        // The pod's ports are its own; here they would collide with other tests'.
        if name.ends_with("LISTEN") {
            value = format!("127.0.0.1:{}", support::ports::free_port());
        }
        cmd.env(name, value);
    }
    cmd.env(
        "LINNET_ADMIN_LISTEN",
        format!("127.0.0.1:{}", support::ports::free_port()),
    );
    cmd.spawn().unwrap()
}

/// A copy of examples/gitops-repo (its objects moved to namespace `ns`) on branch main of a
/// repository served over HTTP with Basic auth (user `git`, password `token`). Returns the
/// repository's URL; the files live as long as `dir`.
fn serve_example(dir: &Path, token: &str) -> String {
    let root = dir.join("git");
    std::fs::create_dir_all(&root).unwrap();
    let (_bare, work) = support::bare_remote_and_clone(&root);
    support::commit_whole_example(&work);
    support::git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let base = support::git_http::serve(root, Some(("git", token)));
    format!("{base}/remote.git")
}

/// The example repository's namespaces and rollouts: `apps/` in `demo`, the overlays of
/// `environments/` in `staging` and `production`, the chart `releases/cache-staging` renders
/// in `staging`.
const EXAMPLE_NAMESPACES: [&str; 3] = ["demo", "staging", "production"];
const EXAMPLE_ROLLOUTS: [(&str, &str, &str); 5] = [
    ("demo", "CanaryStatefulSet", "redis"),
    ("demo", "CanaryDeployment", "web"),
    ("staging", "CanaryDeployment", "api"),
    ("staging", "CanaryStatefulSet", "cache"),
    ("production", "CanaryDeployment", "api"),
];

/// Runs `program` with the test tools (kubectl) and the renderers (helm) first on PATH, as the
/// cluster's admin, from the checkout's root; panics with its output unless it succeeds.
/// Returns stdout.
fn run_tool(program: &str, args: &[&str]) -> String {
    let path = format!(
        "{}:{}:{}",
        support::tools_bin().display(),
        support::render_bin().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("PATH", path)
        .env("KUBECONFIG", support::admin_kubeconfig())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until every rollout of the example repository is Ready, then stops the agent,
/// releases the rollouts and deletes their namespaces. Panics with the agent's log if they
/// never are, or if the log holds a debug dump.
async fn example_becomes_ready(client: &kube::Client, mut agent: std::process::Child, log: &Path) {
    // Both kinds through one dynamic Api: only their Ready condition and finalizers are read.
    let api = |ns: &str, kind: &str| {
        let gvk = GroupVersionKind::gvk(linnet::api::GROUP, "v1alpha1", kind);
        let plural = format!("{}s", kind.to_lowercase());
        let resource = kube::core::ApiResource::from_gvk_with_plural(&gvk, &plural);
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
    };
    let is_ready = |ns: &'static str, kind: &'static str, name: &'static str| {
        let api = api(ns, kind);
        async move {
            let r = api.get_opt(name).await.ok().flatten();
            r.and_then(|r| r.data["status"]["conditions"].as_array().cloned())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        }
    };
    let mut waiting: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while std::time::Instant::now() < deadline {
        waiting.clear();
        for (ns, kind, name) in EXAMPLE_ROLLOUTS {
            if !is_ready(ns, kind, name).await {
                waiting.push(format!("{kind} {ns}/{name}"));
            }
        }
        if waiting.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let _ = agent.kill();
    let _ = agent.wait();
    let log_text = std::fs::read_to_string(log).unwrap_or_default();
    // Leave the cluster as it was: rollouts released (no agent runs now), namespaces gone.
    let release = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    for (ns, kind, name) in EXAMPLE_ROLLOUTS {
        let _ = api(ns, kind)
            .patch(name, &PatchParams::default(), &release)
            .await;
    }
    for ns in EXAMPLE_NAMESPACES {
        gone(client, ns).await;
    }
    assert!(
        waiting.is_empty(),
        "not Ready within 180 s: {waiting:?}; agent log:\n{log_text}"
    );
    assert!(!log_text.contains("Status {"), "a debug dump:\n{log_text}");
}

/// Issue 24: the example repository did not sync with the shipped install (namespace `demo`
/// undeclared, four raw Status dumps). This follows docs/getting-started.md word for word: a
/// copy of examples/gitops-repo served over HTTP with a token, the page's commands run by
/// bash with a real kubectl, then the Deployment's agent as the kubelet would start it. Every
/// rollout of the example must become Ready: regression (issue 72), the install made and
/// bound only `demo`, and the test copied only `apps/`, so the overlays' and the chart's
/// `staging` and `production` failed unseen.
#[tokio::test]
async fn the_readme_install_syncs_the_example() {
    const TOKEN: &str = "install-test-git-token";
    let _one = CLUSTER.lock().await;
    let client = admin_client().await;
    let dir = tempfile::tempdir().unwrap();
    let repo_url = serve_example(dir.path(), TOKEN);
    let steps = install_steps()
        .replace("https://github.com/YOU/gitops.git", &repo_url)
        .replace("YOUR-GIT-TOKEN", TOKEN);
    run_tool("bash", &["-euo", "pipefail", "-c", &steps]);
    let agent = run_as_deployed(&client, "linnet-system", "linnet", dir.path()).await;
    example_becomes_ready(&client, agent, &dir.path().join("agent.log")).await;
}

fn chart_dir() -> String {
    format!("{}/deploy/helm/linnet", env!("CARGO_MANIFEST_DIR"))
}

/// `helm template` of the chart as release `release` in `namespace`, parsed.
fn render_chart(release: &str, namespace: &str, set: &[String]) -> Vec<Value> {
    let mut args = vec![
        "template".to_string(),
        release.to_string(),
        chart_dir(),
        "--namespace".into(),
        namespace.into(),
        "--include-crds".into(),
    ];
    for s in set {
        args.push("--set".into());
        args.push(s.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let yaml = run_tool("helm", &args);
    yaml.split("\n---")
        .map(|part| {
            serde_saphyr::from_str::<Value>(part)
                .unwrap_or_else(|e| panic!("helm rendered YAML that does not parse: {e}\n{part}"))
        })
        .filter(|doc| doc.get("kind").is_some())
        .collect()
}

/// Drops what may differ between the chart and deploy/: labels, annotations, the selector
/// label Helm adds (`app.kubernetes.io/instance`), and the image's pull policy.
fn normalized(mut doc: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.remove("labels");
                map.remove("annotations");
                map.remove("app.kubernetes.io/instance");
                map.remove("imagePullPolicy");
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut doc);
    doc
}

/// Issue 24: the Helm chart installs what deploy/ installs: the same CRDs, RBAC rules,
/// Deployment (securityContext, probes, env, volumes), Service and NetworkPolicy, named the
/// same for release `linnet` in `linnet-system`; `helm lint` passes, and a missing required
/// value fails with a message that says what to set.
#[test]
fn the_helm_chart_renders_what_deploy_installs() {
    let set = [
        "repo.url=https://github.com/YOU/gitops.git".to_string(),
        "git.token=t".into(),
        "webhook.secret=0123456789abcdef0123".into(),
    ];
    let mut lint = vec!["lint".to_string(), chart_dir()];
    for s in &set {
        lint.push("--set".into());
        lint.push(s.clone());
    }
    run_tool("helm", &lint.iter().map(String::as_str).collect::<Vec<_>>());
    let rendered = render_chart("linnet", "linnet-system", &set);
    for doc in kustomized() {
        let (kind, name) = (&doc["kind"], &doc["metadata"]["name"]);
        if kind == "Namespace" {
            continue; // helm install --create-namespace
        }
        let found = rendered
            .iter()
            .find(|r| &r["kind"] == kind && &r["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("the chart has no {kind} {name}"));
        assert_eq!(
            normalized(found.clone()),
            normalized(doc.clone()),
            "the chart's {kind} {name} differs from deploy/'s"
        );
    }
    let config = rendered
        .iter()
        .find(|r| r["kind"] == "ConfigMap" && r["metadata"]["name"] == "linnet-config")
        .expect("the chart makes ConfigMap linnet-config, as the docs have you do");
    assert_eq!(
        config["data"]["LINNET_REPO_URL"],
        "https://github.com/YOU/gitops.git"
    );
    let out = std::process::Command::new(support::render_bin().join("helm"))
        .args(["template", "linnet", &chart_dir(), "--set", "git.token=t"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("set repo.url") || err.contains("set webhook.secret"),
        "{err}"
    );
}

/// Issue 74: `imageAutomation` turns the image automation on, and mounts a docker config
/// Secret for `--registry-credentials`.
#[test]
fn the_helm_chart_turns_on_image_automation_with_a_registry_secret() {
    let set = [
        "repo.url=https://github.com/YOU/gitops.git".to_string(),
        "git.token=t".into(),
        "webhook.secret=0123456789abcdef0123".into(),
        "imageAutomation.enabled=true".into(),
        "imageAutomation.scanInterval=30s".into(),
        "imageAutomation.registryCredentialsSecret=regcred".into(),
    ];
    let rendered = render_chart("linnet", "linnet-system", &set);
    let deployment = rendered
        .iter()
        .find(|r| r["kind"] == "Deployment")
        .expect("a Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let env: Vec<(String, String)> = pod["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let value = e["value"].as_str().unwrap_or_default().to_string();
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect();
    for (name, value) in [
        ("LINNET_IMAGE_AUTOMATION", "true"),
        ("LINNET_IMAGE_SCAN_INTERVAL", "30s"),
        (
            "LINNET_REGISTRY_CREDENTIALS",
            "/etc/linnet/registry/.dockerconfigjson",
        ),
    ] {
        assert!(
            env.contains(&(name.to_string(), value.to_string())),
            "{name}={value} in {env:?}"
        );
    }
    let volumes = pod["volumes"].as_array().unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v["name"] == "registry-credentials" && v["secret"]["secretName"] == "regcred"),
        "{volumes:?}"
    );
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(
        mounts.iter().any(
            |m| m["name"] == "registry-credentials" && m["mountPath"] == "/etc/linnet/registry"
        ),
        "{mounts:?}"
    );
}

/// Issue 24: the chart installed on the control plane (rendered by a real helm, applied by a
/// real kubectl) runs an agent that syncs the example: another release, namespace and source
/// name than deploy/'s, with the source's RoleBinding made by the chart.
#[tokio::test]
async fn the_helm_chart_installs_and_syncs_the_example() {
    const TOKEN: &str = "helm-test-git-token";
    let _one = CLUSTER.lock().await;
    let client = admin_client().await;
    let dir = tempfile::tempdir().unwrap();
    let repo_url = serve_example(dir.path(), TOKEN);
    for ns in ["linnet-helm"].into_iter().chain(EXAMPLE_NAMESPACES) {
        let script =
            format!("kubectl create namespace {ns} --dry-run=client -o yaml | kubectl apply -f -");
        run_tool("bash", &["-euo", "pipefail", "-c", &script]);
    }
    let rendered = render_chart(
        "linnet-helm",
        "linnet-helm",
        &[
            format!("repo.url={repo_url}"),
            format!("git.token={TOKEN}"),
            "webhook.secret=0123456789abcdef0123".into(),
            "sourceName=helm".into(),
            "sourceNamespaces={demo,staging,production}".into(),
            "policy.allowNamespaces={demo,staging,production}".into(),
        ],
    );
    let file = dir.path().join("rendered.yaml");
    let text: Vec<String> = rendered
        .iter()
        .map(|d| serde_json::to_string(d).unwrap())
        .collect();
    // kubectl reads a stream of JSON documents as well as YAML.
    std::fs::write(&file, text.join("\n")).unwrap();
    run_tool("kubectl", &["apply", "-f", file.to_str().unwrap()]);
    let agent = run_as_deployed(&client, "linnet-helm", "linnet-helm", dir.path()).await;
    example_becomes_ready(&client, agent, &dir.path().join("agent.log")).await;
    gone(&client, "linnet-helm").await;
}

/// Deletes namespace `ns` and waits (a minute at most) until it is gone, so that a test run
/// right after this one can make it again.
async fn gone(client: &kube::Client, ns: &str) {
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    let _ = namespaces.delete(ns, &Default::default()).await;
    for _ in 0..120 {
        if matches!(namespaces.get_opt(ns).await, Ok(None)) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Issue 52: the chart's prometheus-operator monitors are deploy/monitoring's (the same
/// selector, port and honorLabels), and both select what the chart and deploy/ serve: a
/// `metrics` port on the pods, behind a Service labelled as the ServiceMonitor selects.
#[test]
fn the_charts_monitors_are_deploy_monitorings() {
    let rendered = render_chart(
        "linnet",
        "linnet-system",
        &[
            "repo.url=https://github.com/YOU/gitops.git".to_string(),
            "git.token=t".into(),
            "webhook.secret=0123456789abcdef0123".into(),
            "metrics.serviceMonitor.enabled=true".into(),
            "metrics.podMonitor.enabled=true".into(),
        ],
    );
    for file in ["servicemonitor.yaml", "podmonitor.yaml"] {
        let path = format!("{}/deploy/monitoring/{file}", env!("CARGO_MANIFEST_DIR"));
        let doc: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let found = rendered
            .iter()
            .find(|r| r["kind"] == doc["kind"])
            .unwrap_or_else(|| panic!("the chart makes no {}", doc["kind"]));
        assert_eq!(
            normalized(found.clone()),
            normalized(doc.clone()),
            "the chart's {} differs from deploy/monitoring/{file}",
            doc["kind"]
        );
    }
    let service = kustomized()
        .into_iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == "linnet-metrics")
        .expect("deploy/ has Service linnet-metrics");
    let monitor: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(format!(
            "{}/deploy/monitoring/servicemonitor.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][key], value,
            "the ServiceMonitor selects {key}={value}; Service linnet-metrics lacks it"
        );
    }
    assert_eq!(service["spec"]["publishNotReadyAddresses"], true);
    // Without the metrics port, the chart makes neither the Service nor a monitor.
    let off = render_chart(
        "linnet",
        "linnet-system",
        &[
            "repo.url=https://github.com/YOU/gitops.git".to_string(),
            "git.token=t".into(),
            "webhook.secret=0123456789abcdef0123".into(),
            "metrics.enabled=false".into(),
            "metrics.serviceMonitor.enabled=true".into(),
        ],
    );
    assert!(
        !off.iter()
            .any(|d| d["kind"] == "ServiceMonitor" || d["metadata"]["name"] == "linnet-metrics"),
        "metrics.enabled=false still renders the metrics Service or a monitor"
    );
    let deployment = off.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert!(
        !serde_json::to_string(deployment)
            .unwrap()
            .contains("LINNET_METRICS_LISTEN"),
        "metrics.enabled=false still listens on the metrics port"
    );
}

/// Issue 52: the chart's notifications: the receivers in a ConfigMap the agent's own parser
/// takes, mounted where LINNET_NOTIFICATIONS_FILE says, each listed Secret mounted where a
/// receiver's urlFile can name it; with no receivers, none of it.
#[test]
fn the_charts_notifications_are_a_file_the_agent_reads() {
    let base = [
        "repo.url=https://github.com/YOU/gitops.git".to_string(),
        "git.token=t".into(),
        "webhook.secret=0123456789abcdef0123".into(),
    ];
    let mut set = base.to_vec();
    set.extend([
        "notifications.receivers[0].name=oncall".to_string(),
        "notifications.receivers[0].type=slack".into(),
        "notifications.receivers[0].urlFile=/etc/linnet/notify/linnet-slack/url".into(),
        "notifications.receivers[0].events={AnalysisFailed,RolledBack}".into(),
        "notifications.secrets={linnet-slack}".into(),
    ]);
    let rendered = render_chart("linnet", "linnet-system", &set);
    let config = rendered
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "linnet-notifications")
        .expect("ConfigMap linnet-notifications");
    let text = config["data"]["notifications.yaml"].as_str().unwrap();
    let parsed = linnet::notify::config::parse("notifications.yaml", text)
        .unwrap_or_else(|e| panic!("the agent refuses the chart's file: {e}\n{text}"));
    assert_eq!(parsed.receivers[0].name, "oncall");
    let deployment = rendered.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env = container["env"].as_array().unwrap();
    let file = env
        .iter()
        .find(|e| e["name"] == "LINNET_NOTIFICATIONS_FILE")
        .expect("LINNET_NOTIFICATIONS_FILE")["value"]
        .as_str()
        .unwrap();
    let mounts = container["volumeMounts"].as_array().unwrap();
    let mounted_at = |volume: &str| {
        mounts
            .iter()
            .find(|m| m["name"] == volume)
            .unwrap_or_else(|| panic!("no mount of {volume}"))["mountPath"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(file.starts_with(&format!("{}/", mounted_at("notifications"))));
    let url_file = parsed.receivers[0].url_file.as_ref().unwrap();
    assert!(url_file.starts_with(mounted_at("notify-linnet-slack")));
    let volumes = pod["volumes"].as_array().unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v["secret"]["secretName"] == "linnet-slack")
    );
    assert!(
        deployment["spec"]["template"]["metadata"]["annotations"]["checksum/notifications"]
            .is_string()
    );
    let none = render_chart("linnet", "linnet-system", &base);
    assert!(
        !none
            .iter()
            .any(|d| d["metadata"]["name"] == "linnet-notifications")
    );
    assert!(
        !serde_json::to_string(&none)
            .unwrap()
            .contains("LINNET_NOTIFICATIONS_FILE")
    );
}

/// Issue 52: the dashboard is off in deploy/ and the chart, and one value turns it on, on
/// localhost (for `kubectl port-forward`).
#[test]
fn the_dashboard_is_off_until_one_value_turns_it_on() {
    let base = [
        "repo.url=https://github.com/YOU/gitops.git".to_string(),
        "git.token=t".into(),
        "webhook.secret=0123456789abcdef0123".into(),
    ];
    let env_of = |docs: &[Value]| {
        let d = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["env"].clone()
    };
    let dashboard = |env: &Value| {
        env.as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "LINNET_DASHBOARD_LISTEN")
            .map(|e| e["value"].as_str().unwrap().to_string())
    };
    assert_eq!(dashboard(&env_of(&kustomized())), None);
    assert_eq!(
        dashboard(&env_of(&render_chart("linnet", "linnet-system", &base))),
        None
    );
    let mut on = base.to_vec();
    on.push("dashboard.enabled=true".into());
    assert_eq!(
        dashboard(&env_of(&render_chart("linnet", "linnet-system", &on))).as_deref(),
        Some("127.0.0.1:8090")
    );
}

/// Regression (issue 72): the chart had no value for the alert rules (and no label for a
/// kube-prometheus-stack to select them by), the Grafana dashboard came only as JSON, and the
/// alert texts named `linnet-system` whatever the namespace. The chart's copies are
/// deploy/monitoring's, and its rules and dashboard name the release's namespace.
#[test]
fn the_chart_ships_the_alert_rules_and_dashboard_for_its_own_namespace() {
    let root = env!("CARGO_MANIFEST_DIR");
    for file in ["alerts.yaml", "grafana-dashboard.json"] {
        assert_eq!(
            std::fs::read_to_string(format!("{root}/deploy/helm/linnet/files/{file}")).unwrap(),
            std::fs::read_to_string(format!("{root}/deploy/monitoring/{file}")).unwrap(),
            "deploy/helm/linnet/files/{file} differs from deploy/monitoring/{file}: copy it"
        );
    }
    let rendered = render_chart(
        "ops",
        "observability",
        &[
            "repo.url=https://github.com/YOU/gitops.git".to_string(),
            "git.token=t".into(),
            "webhook.secret=0123456789abcdef0123".into(),
            "metrics.prometheusRule.enabled=true".into(),
            "metrics.prometheusRule.labels.release=kube-prometheus-stack".into(),
            "metrics.grafanaDashboard.enabled=true".into(),
        ],
    );
    let rule = rendered
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let alerts: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(format!("{root}/deploy/monitoring/alerts.yaml")).unwrap(),
    )
    .unwrap();
    let names = |groups: &Value| -> Vec<String> {
        groups[0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["alert"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(names(&rule["spec"]["groups"]), names(&alerts["groups"]));
    let dashboard = rendered
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("a dashboard ConfigMap for Grafana's sidecar");
    let json: Value =
        serde_json::from_str(dashboard["data"]["linnet.json"].as_str().unwrap()).unwrap();
    assert_eq!(json["uid"], "linnet");
    for (what, doc) in [("rules", rule), ("dashboard", dashboard)] {
        let text = serde_json::to_string(doc).unwrap();
        assert!(
            !text.contains("linnet-system"),
            "the {what} name linnet-system"
        );
        assert!(text.contains("kubectl -n observability"), "the {what}");
    }
    let off = render_chart(
        "ops",
        "observability",
        &[
            "repo.url=https://github.com/YOU/gitops.git".to_string(),
            "git.token=t".into(),
            "webhook.secret=0123456789abcdef0123".into(),
        ],
    );
    assert!(
        !off.iter()
            .any(|d| d["kind"] == "PrometheusRule"
                || d["metadata"]["name"] == "ops-grafana-dashboard"),
        "off by default"
    );
}

/// Regression (issue 72): the documented way to use your own image was `kubectl set image`,
/// which every later `kubectl apply -k deploy/` undid. examples/install-overlay, built by a
/// real kustomize, is deploy/ with only the agent's image changed.
#[test]
fn the_registry_overlay_changes_the_agents_image_and_nothing_else() {
    let overlay = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/install-overlay"
    ));
    let built = run_tool("kustomize", &["build", overlay.to_str().unwrap()]);
    let mut docs: Vec<Value> = built
        .split("\n---\n")
        .filter_map(|part| serde_saphyr::from_str::<Value>(part).ok())
        .filter(|d| d.get("kind").is_some())
        .collect();
    let mut base = kustomized();
    assert_eq!(docs.len(), base.len(), "the overlay has deploy/'s objects");
    let image = |docs: &mut Vec<Value>| {
        let d = docs
            .iter_mut()
            .find(|d| d["kind"] == "Deployment")
            .expect("the agent's Deployment");
        let image = d["spec"]["template"]["spec"]["containers"][0]["image"].clone();
        d["spec"]["template"]["spec"]["containers"][0]["image"] = Value::Null;
        image
    };
    assert_eq!(image(&mut docs), "registry.example.com/team/linnet:0.1.0");
    assert_eq!(image(&mut base), "ghcr.io/linnet-dev/linnet:0.1.0");
    let key = |d: &Value| format!("{}/{}", d["kind"], d["metadata"]["name"]);
    docs.sort_by_key(key);
    base.sort_by_key(key);
    // Kustomize writes `0.0` as `0`: numbers compare as numbers.
    fn numbers_as_floats(v: &mut Value) {
        match v {
            Value::Number(n) => *v = serde_json::json!(n.as_f64()),
            Value::Array(a) => a.iter_mut().for_each(numbers_as_floats),
            Value::Object(o) => o.values_mut().for_each(numbers_as_floats),
            _ => {}
        }
    }
    for (o, b) in docs.iter().zip(&base) {
        let (mut o, mut b) = (normalized(o.clone()), normalized(b.clone()));
        numbers_as_floats(&mut o);
        numbers_as_floats(&mut b);
        assert_eq!(o, b, "{}", key(&b));
    }
}

/// Regression (issue 72): the Dockerfile's image had no kustomize or helm, so an agent built
/// with it could not render, though the README called it equivalent to `make image`'s. Both
/// put the two renderers, built from deploy/render-tools, in /usr/local/bin. (No Docker
/// here: this reads the Dockerfile; tests/image.rs runs `make image`'s.)
#[test]
fn the_dockerfile_ships_the_renderers_make_image_ships() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dockerfile = std::fs::read_to_string(format!("{root}/Dockerfile")).unwrap();
    let makefile = std::fs::read_to_string(format!("{root}/Makefile")).unwrap();
    let build = std::fs::read_to_string(format!("{root}/deploy/image/build.py")).unwrap();
    assert!(build.contains("\"usr/local/bin/\" + os.path.basename(tool)"));
    for tool in ["kustomize", "helm"] {
        assert!(
            makefile.contains(&format!(
                "--tool \"$$(deploy/render-tools/build.sh)/{tool}\""
            )),
            "make image ships {tool}"
        );
    }
    let last_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    assert!(
        last_stage.contains(
            "COPY --from=render-tools /usr/local/bin/kustomize /usr/local/bin/helm /usr/local/bin/"
        ),
        "the Dockerfile's image ships kustomize and helm:\n{last_stage}"
    );
    assert!(
        dockerfile.contains("./build.sh"),
        "built by deploy/render-tools/build.sh"
    );
}

/// The YAML documents of `file` (relative to the repository) that have a kind.
fn documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    text.split("\n---\n")
        .filter_map(|part| serde_saphyr::from_str::<Value>(part).ok())
        .filter(|doc| doc.get("kind").is_some())
        .collect()
}

/// Each (group, resource, verb, name) a Role or ClusterRole `name` of `kind` in `docs` grants.
fn grants(docs: &[Value], kind: &str, name: &str) -> std::collections::BTreeSet<String> {
    let role = docs
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"));
    let list = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_else(|| vec!["*".to_string()])
    };
    let mut out = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for group in list(&rule["apiGroups"]) {
            for resource in list(&rule["resources"]) {
                for verb in list(&rule["verbs"]) {
                    for named in list(&rule["resourceNames"]) {
                        out.insert(format!("{group}/{resource} {verb} {named}"));
                    }
                }
            }
        }
    }
    out
}

/// Issue 72: the namespace-scoped install's Roles grant what the cluster-wide ClusterRoles do,
/// less the cluster-scoped kinds: a rule added to deploy/rbac.yaml or deploy/source-rbac.yaml
/// and not to examples/namespace-install fails here.
#[test]
fn the_namespace_scoped_roles_grant_what_the_cluster_roles_do_in_one_namespace() {
    let dir = "examples/namespace-install";
    // Reviews are cluster-scoped too: the dashboard's actions in a namespace-scoped install
    // need a ClusterRole for them (docs/dashboard.md#actions).
    let cluster_scoped = [
        "/persistentvolumes ",
        "/namespaces ",
        "/customresourcedefinitions ",
        "/tokenreviews ",
        "/subjectaccessreviews ",
    ];
    let agent: std::collections::BTreeSet<String> =
        grants(&documents("deploy/rbac.yaml"), "ClusterRole", "linnet")
            .into_iter()
            .filter(|g| !cluster_scoped.iter().any(|c| g.contains(c)))
            .collect();
    let mut scoped = grants(&documents(&format!("{dir}/role.yaml")), "Role", "linnet");
    scoped.extend(grants(
        &documents(&format!("{dir}/agent-state-role.yaml")),
        "Role",
        "linnet-agent",
    ));
    assert_eq!(
        scoped, agent,
        "Roles linnet and linnet-agent against ClusterRole linnet"
    );
    assert_eq!(
        grants(
            &documents(&format!("{dir}/source-role.yaml")),
            "Role",
            "linnet-source"
        ),
        grants(
            &documents("deploy/source-rbac.yaml"),
            "ClusterRole",
            "linnet-source"
        ),
    );
    let volumes = grants(
        &documents(&format!("{dir}/volumes/volumes.yaml")),
        "ClusterRole",
        "linnet-volumes",
    );
    let from_cluster_role: std::collections::BTreeSet<String> =
        grants(&documents("deploy/rbac.yaml"), "ClusterRole", "linnet")
            .into_iter()
            .filter(|g| g.contains("/persistentvolumes "))
            .collect();
    assert_eq!(volumes, from_cluster_role);
}

/// Issue 72: the namespace-scoped install renders without anything cluster-scoped, the
/// watched namespace (named once) in every Role, binding and the agent's environment.
#[test]
fn the_namespace_scoped_install_renders_roles_only() {
    let rendered = run_tool("kubectl", &["kustomize", "examples/namespace-install"]);
    let docs: Vec<Value> = rendered
        .split("\n---\n")
        .filter_map(|part| serde_saphyr::from_str::<Value>(part).ok())
        .collect();
    for doc in &docs {
        let kind = doc["kind"].as_str().unwrap();
        assert!(
            doc["metadata"]["namespace"].is_string(),
            "{kind} {} is cluster-scoped",
            doc["metadata"]["name"]
        );
    }
    let in_demo = |kind: &str, name: &str| {
        docs.iter().any(|d| {
            d["kind"] == kind
                && d["metadata"]["name"] == name
                && d["metadata"]["namespace"] == "demo"
        })
    };
    for (kind, name) in [
        ("Role", "linnet"),
        ("RoleBinding", "linnet"),
        ("Role", "linnet-source"),
        ("RoleBinding", "linnet-source"),
    ] {
        assert!(in_demo(kind, name), "{kind} {name} not in demo");
    }
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "RoleBinding" && d["metadata"]["name"] == "linnet-source")
        .unwrap();
    assert_eq!(binding["subjects"][0]["namespace"], "demo");
    let agent = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "linnet")
        .unwrap();
    let env = agent["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "LINNET_WATCH_NAMESPACE" && e["value"] == "demo"),
        "{env:?}"
    );
}

/// Issue 76, reach it safely: examples/dashboard/{ingress,gateway} put the dashboard behind
/// oauth2-proxy and TLS. The dashboard stays on loopback, answers only to its public name,
/// the proxy is the one way in and the only port the NetworkPolicy adds; the Ingress and
/// the HTTPRoute reach the proxy's Service by that name over TLS; and the API server accepts
/// every object they add (server-side dry run, Gateway API's CRDs installed).
#[tokio::test]
async fn the_dashboard_examples_put_it_behind_a_signing_in_proxy_and_tls() {
    let _one = CLUSTER.lock().await;
    let client = admin_client().await;
    support::gateway::install_gateway_api(&client).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "linnet-system"}})).unwrap();
    let _ = namespaces.create(&Default::default(), &ns).await;
    let host = "linnet.example.com";
    for (overlay, route_kind) in [("ingress", "Ingress"), ("gateway", "HTTPRoute")] {
        let dir = format!(
            "{}/examples/dashboard/{overlay}",
            env!("CARGO_MANIFEST_DIR")
        );
        let built = run_tool("kustomize", &["build", &dir]);
        let docs: Vec<Value> = built
            .split("\n---\n")
            .filter_map(|part| serde_saphyr::from_str::<Value>(part).ok())
            .filter(|d| d.get("kind").is_some())
            .collect();
        let find = |kind: &str, name: &str| {
            docs.iter()
                .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("{overlay}: no {kind} {name}"))
                .clone()
        };
        let pod = find("Deployment", "linnet")["spec"]["template"]["spec"].clone();
        let container = |name: &str| {
            pod["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
                .unwrap_or_else(|| panic!("{overlay}: no container {name}"))
                .clone()
        };
        let env = |c: &Value, key: &str| {
            c["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == key)
                .map(|e| e["value"].as_str().unwrap_or_default().to_string())
        };
        let agent = container("linnet");
        let listen = env(&agent, "LINNET_DASHBOARD_LISTEN").expect("the dashboard is on");
        assert!(
            listen.starts_with("127.0.0.1:"),
            "{overlay}: on loopback, not {listen}"
        );
        assert_eq!(
            env(&agent, "LINNET_ALLOWED_HOST_NAMES").as_deref(),
            Some(host)
        );
        let proxy = container("oauth2-proxy");
        let args: Vec<&str> = proxy["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let port = listen.rsplit(':').next().unwrap();
        assert!(
            args.contains(&format!("--upstream=http://127.0.0.1:{port}/").as_str()),
            "{args:?}"
        );
        assert!(args.contains(&"--cookie-secure=true"), "{args:?}");
        let service = find("Service", "linnet-dashboard");
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "dashboard");
        assert_eq!(proxy["ports"][0]["name"], "dashboard");
        let policy = find("NetworkPolicy", "linnet-dashboard");
        assert_eq!(
            policy["spec"]["ingress"][0]["ports"][0]["port"],
            "dashboard"
        );
        let route = find(route_kind, "linnet-dashboard");
        match route_kind {
            "Ingress" => {
                assert_eq!(route["spec"]["tls"][0]["hosts"][0], host);
                assert_eq!(route["spec"]["rules"][0]["host"], host);
                let backend = &route["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"];
                assert_eq!(backend["name"], "linnet-dashboard");
            }
            _ => {
                assert_eq!(route["spec"]["hostnames"][0], host);
                assert_eq!(
                    route["spec"]["rules"][0]["backendRefs"][0]["name"],
                    "linnet-dashboard"
                );
                // The listener it names terminates TLS for the same name.
                let gateway: Value = serde_saphyr::from_str(
                    &std::fs::read_to_string(format!("{dir}/gateway.yaml")).unwrap(),
                )
                .unwrap();
                let listener = gateway["spec"]["listeners"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|l| l["name"] == route["spec"]["parentRefs"][0]["sectionName"])
                    .expect("the listener the route names")
                    .clone();
                assert_eq!(
                    (listener["protocol"].as_str(), listener["hostname"].as_str()),
                    (Some("HTTPS"), Some(host))
                );
                assert_eq!(listener["tls"]["mode"], "Terminate");
            }
        }
        // What the example adds, as the API server validates it.
        let added: Vec<String> = [find("Deployment", "linnet"), service, policy, route]
            .iter()
            .map(|d| serde_json::to_string(d).unwrap())
            .collect();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), added.join("\n")).unwrap();
        let applied = run_tool(
            "kubectl",
            &[
                "apply",
                "--dry-run=server",
                "--server-side",
                // deploy/'s Deployment may be installed already (by `kubectl`): a dry run
                // takes its fields over without changing it.
                "--force-conflicts",
                "--field-manager=linnet-test",
                "-f",
                file.path().to_str().unwrap(),
            ],
        );
        assert_eq!(
            applied.matches("(server dry run)").count(),
            4,
            "{overlay}: {applied}"
        );
    }
}
