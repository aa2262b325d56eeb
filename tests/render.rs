//! Kustomize overlays and Helm charts rendered by the real tools (built from their Go modules
//! by deploy/render-tools/build.sh), through `linnet validate`: located errors for broken
//! units while the rest is read, and hostile units (a remote base, an exec plugin, an output
//! bomb, a memory bomb, a template that loops, too many objects) held to their limits.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Writes `files` (path, content) under `dir`.
fn write_tree(dir: &Path, files: &[(&str, &str)]) {
    for (path, content) in files {
        let to = dir.join(path);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, content).unwrap();
    }
}

/// `linnet validate DIR extra...` with the renderers; (exit code, stdout, how long it took).
fn validate(dir: &Path, extra: &[&str]) -> (i32, String, Duration) {
    support::validate_offline(dir, extra)
}

const ROLLOUT: &str = "apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryDeployment
metadata:
  name: api
spec:
  replicas: 2
  image: nginx:1.26
  template:
    selector:
      matchLabels: {app: api}
    template:
      metadata:
        labels: {app: api}
      spec:
        containers:
        - name: api
          image: nginx:1.26
";

const CHART: &str = "apiVersion: v2\nname: c\nversion: 0.1.0\n";

#[test]
fn broken_units_are_located_errors_and_the_rest_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let bad_rollout = ROLLOUT.replace("replicas: 2", "replicas: two");
    write_tree(
        dir.path(),
        &[
            (
                "plain.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain}\n",
            ),
            ("base/kustomization.yaml", "resources: [api.yaml]\n"),
            ("base/api.yaml", ROLLOUT),
            (
                "good/kustomization.yaml",
                "resources: [../base]\nnamespace: good\n",
            ),
            // A rendered object with a type error: located in the base it came from.
            ("badbase/kustomization.yaml", "resources: [api.yaml]\n"),
            ("badbase/api.yaml", &bad_rollout),
            (
                "bad/kustomization.yaml",
                "resources: [../badbase]\nnamespace: bad\n",
            ),
            // A type error brought in by an overlay's patch: located in the patch.
            (
                "patched/kustomization.yaml",
                "resources: [../base]\nnamespace: patched\npatches:\n- path: replicas.yaml\n",
            ),
            (
                "patched/replicas.yaml",
                "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryDeployment\nmetadata:\n  name: api\nspec:\n  replicas: three\n",
            ),
            // A patch whose target is not there: kustomize's error, at the kustomization.
            (
                "nopatch/kustomization.yaml",
                "resources: [../base]\nnamespace: nopatch\npatches:\n- path: missing.yaml\n",
            ),
            // A template error: at the template's line and column.
            ("charts/c/Chart.yaml", CHART),
            (
                "charts/c/templates/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n  a: {{ .Values.a | nosuchfunction }}\n",
            ),
            ("rel/linnet-helm.yaml", "chart: ../charts/c\n"),
            // A values file that is not YAML: at the values file.
            ("charts/d/Chart.yaml", CHART),
            (
                "charts/d/templates/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n  a: {{ .Values.a | quote }}\n",
            ),
            (
                "reld/linnet-helm.yaml",
                "chart: ../charts/d\nvaluesFiles: [values.yaml]\n",
            ),
            ("reld/values.yaml", "a: 1\nb: [unclosed\n"),
            // A good chart beside them.
            (
                "relgood/linnet-helm.yaml",
                "chart: ../charts/d\nnamespace: helm\nvalues: {a: x}\n",
            ),
        ],
    );
    let (code, out, _) = validate(dir.path(), &[]);
    assert_eq!(code, 1, "{out}");
    let line = |prefix: &str| {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no error at {prefix}:\n{out}"))
            .to_string()
    };
    assert!(
        line("badbase/api.yaml:6:")
            .contains("bad/kustomization.yaml renders from badbase/api.yaml"),
        "{out}"
    );
    assert!(
        line("patched/replicas.yaml:6:3:").contains("renders from base/api.yaml"),
        "{out}"
    );
    assert!(
        line("nopatch/kustomization.yaml:4:").contains("missing.yaml"),
        "{out}"
    );
    assert!(
        line("charts/c/templates/cm.yaml:6:").contains("nosuchfunction"),
        "{out}"
    );
    assert!(
        line("reld/values.yaml:2:").contains("helm template failed"),
        "{out}"
    );
    // Only the broken units are blocked: the good overlay, the good chart and the plain file
    // are read.
    assert!(
        out.contains("5 file(s) blocked: bad/kustomization.yaml, nopatch/kustomization.yaml, patched/kustomization.yaml, rel/linnet-helm.yaml, reld/linnet-helm.yaml"),
        "{out}"
    );
}

#[test]
fn a_remote_base_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    write_tree(
        dir.path(),
        &[(
            "app/kustomization.yaml",
            "resources:\n- https://github.com/kubernetes-sigs/kustomize//examples/helloWorld?ref=v5.8.1\n",
        )],
    );
    let (code, out, took) = validate(dir.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("app/kustomization.yaml:2:3: `https://github.com/"),
        "{out}"
    );
    assert!(out.contains("--render-allow-host github.com"), "{out}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_remote_chart_is_refused_unless_its_host_is_allowed_and_then_goes_offline_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    write_tree(
        dir.path(),
        &[(
            "r/linnet-helm.yaml",
            "chart: web\nrepository: https://charts.example.invalid\nversion: 1.0.0\n",
        )],
    );
    let (code, out, _) = validate(dir.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("r/linnet-helm.yaml:2:"), "{out}");
    assert!(
        out.contains("--render-allow-host charts.example.invalid"),
        "{out}"
    );
    // Allowed, the fetch is tried (and fails here, with no such host), within the time limit.
    let (code, out, took) = validate(
        dir.path(),
        &[
            "--render-allow-host",
            "charts.example.invalid",
            "--render-timeout",
            "10s",
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("helm template failed"), "{out}");
    assert!(took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn an_exec_plugin_does_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let script = format!("#!/bin/sh\ntouch {}\ncat\n", marker.display());
    write_tree(
        dir.path(),
        &[
            (
                "app/kustomization.yaml",
                "resources: [cm.yaml]\ntransformers: [fn.yaml]\n",
            ),
            (
                "app/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
            ),
            (
                "app/fn.yaml",
                "apiVersion: example.com/v1\nkind: Run\nmetadata:\n  name: run\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: ./run.sh\n",
            ),
            ("app/run.sh", &script),
        ],
    );
    let mut perms = std::fs::metadata(dir.path().join("app/run.sh"))
        .unwrap()
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(dir.path().join("app/run.sh"), perms).unwrap();
    let (code, out, _) = validate(dir.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("app/kustomization.yaml:"), "{out}");
    assert!(!marker.exists(), "the plugin ran: {out}");
}

/// A chart whose one template is `body`.
fn chart_with(dir: &Path, body: &str) {
    write_tree(
        dir,
        &[
            ("charts/b/Chart.yaml", CHART),
            ("charts/b/templates/t.yaml", body),
            ("r/linnet-helm.yaml", "chart: ../charts/b\n"),
        ],
    );
}

/// `linnet validate DIR extra...`, and the largest resident set of linnet and the renderer it
/// waited for (from `wait4`, which counts a process's waited-for children), in bytes.
#[allow(clippy::zombie_processes)] // waited for by wait4, which std does not know of
fn validate_peak_rss(dir: &Path, extra: &[&str]) -> (String, u64) {
    use std::io::Read as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["validate", "--check-namespaces", "never"])
        .args(extra)
        .arg(dir)
        .envs(support::render_env())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run linnet");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: wait4 fills the struct it is given; the child is not waited for elsewhere.
    #[allow(unsafe_code)]
    let usage = unsafe {
        libc::wait4(
            child.id() as libc::pid_t,
            &mut status,
            0,
            usage.as_mut_ptr(),
        );
        usage.assume_init()
    };
    (out, usage.ru_maxrss as u64 * 1024)
}

#[test]
fn hostile_charts_are_held_to_the_limits() {
    // An output bomb: a loop printing 16 MiB, stopped at 1 MiB.
    let bomb = tempfile::tempdir().unwrap();
    chart_with(
        bomb.path(),
        "{{- range until 250000 }}\n# {{ repeat 64 \"x\" }}\n{{- end }}\n",
    );
    let (code, out, took) = validate(bomb.path(), &["--render-max-bytes", "1048576"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "r/linnet-helm.yaml:1:1: helm template failed: it printed more than the 1048576 bytes"
        ),
        "{out}"
    );
    println!("output bomb stopped after {took:?}");

    // A template that loops for ever, in effect: stopped at the time limit.
    let looping = tempfile::tempdir().unwrap();
    chart_with(
        looping.path(),
        "{{- range until 3000 }}{{- range until 3000 }}{{- range until 3000 }}{{- end }}{{- end }}{{- end }}\n",
    );
    let (code, out, took) = validate(looping.path(), &["--render-timeout", "2s"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("ran longer than the 2s"), "{out}");
    assert!(took < Duration::from_secs(8), "{took:?}");

    // A memory bomb: a string doubled until memory runs out, stopped at 256 MiB.
    let memory = tempfile::tempdir().unwrap();
    chart_with(
        memory.path(),
        "{{- $s := \"xxxxxxxxxxxxxxxx\" }}{{- range until 40 }}{{- $s = print $s $s }}{{- end }}\na: {{ len $s }}\n",
    );
    let limit: u64 = 256 * 1024 * 1024;
    let (out, peak) =
        validate_peak_rss(memory.path(), &["--render-max-memory", &limit.to_string()]);
    assert!(
        out.contains("ran out of the 268435456 bytes of memory"),
        "{out}"
    );
    println!(
        "memory bomb: peak RSS {} MiB against a limit of {} MiB",
        peak >> 20,
        limit >> 20
    );
    assert!(peak < limit + 32 * 1024 * 1024, "peak {peak}");

    // Too many objects: 300 ConfigMaps against a limit of 100.
    let many = tempfile::tempdir().unwrap();
    chart_with(
        many.path(),
        "{{- range until 300 }}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{{ . }}\n{{- end }}\n",
    );
    let (code, out, _) = validate(many.path(), &["--render-max-objects", "100"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("renders 300 objects, over the 100"), "{out}");
}

/// Regression (issue 70): `--render-max-memory` above the container's memory limit let the
/// cgroup's OOM killer stop helm first, and the render said "it printed no reason". Run here
/// in a real memory cgroup (v2, or v1's memory controller) of 160 MiB with a 1 GiB render
/// limit: the kernel kills the render, and the error says that is what happened.
#[test]
fn a_render_the_kernel_kills_for_memory_says_so() {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let (root, limit_file) = if v2 {
        ("/sys/fs/cgroup", "memory.max")
    } else {
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
    };
    let group = Path::new(root).join(format!("linnet-render-test-{}", std::process::id()));
    std::fs::create_dir(&group).unwrap_or_else(|e| {
        panic!(
            "cannot make the memory cgroup {} (the tests run as root): {e}",
            group.display()
        )
    });
    std::fs::write(group.join(limit_file), (160u64 << 20).to_string()).unwrap();
    let bomb = tempfile::tempdir().unwrap();
    chart_with(
        bomb.path(),
        "{{- $s := \"xxxxxxxxxxxxxxxx\" }}{{- range until 40 }}{{- $s = print $s $s }}{{- end }}\na: {{ len $s }}\n",
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
            group.display()
        ))
        .arg(env!("CARGO_BIN_EXE_linnet"))
        .args(["validate", "--check-namespaces", "never"])
        .args(["--render-max-memory", &(1u64 << 30).to_string()])
        .arg(bomb.path())
        .envs(support::render_env())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&group);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("it was killed (SIGKILL) before it finished: most likely the container ran out of memory")
            && text.contains("--render-max-memory"),
        "{text}"
    );
}

#[test]
fn the_example_repository_renders_its_overlays_and_chart() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gitops-repo");
    let (code, out, _) = validate(&example, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no errors"), "{out}");
}

/// Issue 48, through the agent on the real control plane: a repository of Kustomize overlays
/// (a base with staging and production) and a chart syncs; an `images:` change in one overlay
/// starts a canary there; an overlay broken and a chart made an output bomb in the same push
/// are located errors whose objects stay (pruning is on), while the rest syncs; only the
/// three units the push touched are rendered.
#[tokio::test]
async fn the_agent_renders_overlays_and_a_chart_and_an_images_change_starts_a_canary() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::DynamicObject;
    use kube::core::{ApiResource, GroupVersionKind};
    use support::agent::{start_agent, wait_ready};
    use support::{TestNamespace, admin_client, git, install_linnet};

    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "render").await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    let redis = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gitops-repo/apps/redis/redis.yaml"),
    )
    .unwrap()
    .replace("  namespace: demo\n", "");
    let overlay = |suffix: &str, tag: &str| {
        format!(
            "namespace: {}\nnameSuffix: -{suffix}\nresources: [../base]\nimages:\n- name: redis\n  newTag: \"{tag}\"\n",
            ns.name
        )
    };
    let keep = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: keep}\ndata: {a: b}\n";
    write_tree(
        &work,
        &[
            ("base/kustomization.yaml", "resources: [redis.yaml]\n"),
            ("base/redis.yaml", &redis),
            ("staging/kustomization.yaml", &overlay("staging", "7.2")),
            (
                "production/kustomization.yaml",
                &overlay("production", "7.2"),
            ),
            (
                "other/kustomization.yaml",
                &format!("namespace: {}\nresources: [keep.yaml]\n", ns.name),
            ),
            ("other/keep.yaml", keep),
            ("charts/settings/Chart.yaml", CHART),
            (
                "charts/settings/templates/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n  level: {{ .Values.level | quote }}\n",
            ),
            (
                "releases/settings/linnet-helm.yaml",
                &format!(
                    "chart: ../../charts/settings\nnamespace: {}\nvaluesFiles: [values.yaml]\n",
                    ns.name
                ),
            ),
            ("releases/settings/values.yaml", "level: info\n"),
        ],
    );
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "overlays and a chart"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let bin = support::render_bin();
    let agent = start_agent(
        tmp.path(),
        &[
            format!("--repo-url=file://{}", bare.display()),
            "--prune".into(),
            format!("--kustomize={}", bin.join("kustomize").display()),
            format!("--helm={}", bin.join("helm").display()),
        ],
        &ns.name,
    );
    wait_ready(&agent).await;
    let gvk = GroupVersionKind::gvk("rollouts.linnet.dev", "v1alpha1", "CanaryStatefulSet");
    let rollouts: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), &ns.name, &ApiResource::from_gvk(&gvk));
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns.name);
    let field = |o: &DynamicObject, pointer: &str| {
        o.data
            .pointer(pointer)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    for name in ["redis-staging", "redis-production"] {
        support::eventually(name, Duration::from_secs(60), || async {
            rollouts.get_opt(name).await.unwrap().filter(|o| {
                field(o, "/spec/image") == "redis:7.2" && field(o, "/status/phase") == "Stable"
            })
        })
        .await;
    }
    let settings =
        support::eventually("the chart's ConfigMap", Duration::from_secs(30), || async {
            config_maps.get_opt("settings").await.unwrap()
        })
        .await;
    assert_eq!(settings.data.unwrap()["level"], "info");
    support::eventually(
        "the other overlay's ConfigMap",
        Duration::from_secs(30),
        || async { config_maps.get_opt("keep").await.unwrap() },
    )
    .await;

    // One push: staging's image by `images:`, the other overlay broken, and the chart made an
    // output bomb (16 MiB against the 8 MiB a render may print).
    write_tree(
        &work,
        &[
            ("staging/kustomization.yaml", &overlay("staging", "7.4")),
            (
                "charts/settings/templates/cm.yaml",
                "{{- range until 250000 }}\n# {{ repeat 64 \"x\" }}\n{{- end }}\n",
            ),
            (
                "other/kustomization.yaml",
                &format!(
                    "namespace: {}\nresources: [keep.yaml]\npatches:\n- path: missing.yaml\n",
                    ns.name
                ),
            ),
        ],
    );
    git(
        &work,
        &[
            "commit",
            "-qam",
            "staging on redis 7.4; other broken; a bomb",
        ],
    );
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let head = git(&work, &["rev-parse", "HEAD"]);
    let webhook = agent.push_webhook().await;
    assert_eq!(webhook, 202);
    support::eventually("a canary in staging", Duration::from_secs(60), || async {
        rollouts
            .get_opt("redis-staging")
            .await
            .unwrap()
            .filter(|o| {
                field(o, "/spec/image") == "redis:7.4" && field(o, "/status/phase") != "Stable"
            })
    })
    .await;
    let status = support::eventually(
        "the revision in /status",
        Duration::from_secs(30),
        || async {
            let s: serde_json::Value = agent.status().await;
            (s["revision"].as_str() == Some(head.as_str())).then_some(s)
        },
    )
    .await;
    let errors = status["specErrors"].to_string();
    assert!(errors.contains("other/kustomization.yaml:4:"), "{status}");
    assert!(errors.contains("missing.yaml"), "{status}");
    assert!(
        errors.contains("releases/settings/linnet-helm.yaml:1:1"),
        "{status}"
    );
    assert!(
        errors.contains("printed more than the 8388608 bytes"),
        "{status}"
    );
    // Production was not touched, and the broken units' objects are kept as they were.
    let production = rollouts.get("redis-production").await.unwrap();
    assert_eq!(field(&production, "/spec/image"), "redis:7.2");
    assert!(
        config_maps.get_opt("keep").await.unwrap().is_some(),
        "a broken unit's object was pruned"
    );
    let settings = config_maps.get("settings").await.unwrap();
    assert_eq!(
        settings.data.unwrap()["level"],
        "info",
        "the bomb's unit was pruned or changed"
    );
    // Three units changed, three renders: the unchanged overlay was not rendered.
    let log = agent.log_text();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("new revision") && l.contains(&head[..12.min(head.len())]))
        .unwrap_or_else(|| panic!("no new revision line for {head}:\n{log}"));
    assert!(line.contains("parsed=3"), "{line}");
}

/// `linnet diff` renders as the agent does: a new overlay's objects are creates, named by the
/// overlay they come from.
#[tokio::test]
async fn diff_renders_overlays_against_the_cluster() {
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "render-diff").await;
    let dir = tempfile::tempdir().unwrap();
    write_tree(
        dir.path(),
        &[
            ("base/kustomization.yaml", "resources: [api.yaml]\n"),
            ("base/api.yaml", ROLLOUT),
            (
                "staging/kustomization.yaml",
                &format!(
                    "resources: [../base]\nnamespace: {}\nimages:\n- name: nginx\n  newTag: \"1.27\"\n",
                    ns.name
                ),
            ),
        ],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["diff", dir.path().to_str().unwrap()])
        .env("KUBECONFIG", support::admin_kubeconfig())
        .envs(support::render_env())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("CanaryDeployment {}/api", ns.name)),
        "{text}"
    );
    assert!(text.contains("nginx:1.27"), "{text}");
    assert!(
        !text.contains("nginx:1.26"),
        "the base's image, not the overlay's: {text}"
    );
}

/// A chart from a chart repository, fetched over HTTPS from a host `--render-allow-host`
/// names (the repository here is a local server whose CA the renderer is given by
/// `SSL_CERT_FILE`, as a pod's trust store would hold it), at an exact version.
#[tokio::test(flavor = "multi_thread")]
async fn a_remote_chart_from_an_allowed_host_renders() {
    use axum::extract::Path as UrlPath;
    let dir = tempfile::tempdir().unwrap();
    let helm = support::render_bin().join("helm");
    // The chart, packaged and indexed as a chart repository serves it.
    let repo = dir.path().join("repo");
    write_tree(
        dir.path(),
        &[
            (
                "src/web/Chart.yaml",
                "apiVersion: v2\nname: web\nversion: 1.2.3\n",
            ),
            (
                "src/web/templates/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n  from: repository\n",
            ),
        ],
    );
    std::fs::create_dir_all(&repo).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(&helm).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "package",
        dir.path().join("src/web").to_str().unwrap(),
        "-d",
        repo.to_str().unwrap(),
    ]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    run(&["repo", "index", repo.to_str().unwrap(), "--url", &url]);
    let ca = support::tls::TestCa::new("chart repository");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let served = repo.clone();
    let app = axum::Router::new().route(
        "/{file}",
        axum::routing::get(move |UrlPath(file): UrlPath<String>| {
            let served = served.clone();
            async move {
                std::fs::read(served.join(file)).map_err(|_| axum::http::StatusCode::NOT_FOUND)
            }
        }),
    );
    tokio::spawn(support::tls::serve_https(listener, app, ca.server_config()));
    let specs = dir.path().join("specs");
    write_tree(
        &specs,
        &[(
            "web/linnet-helm.yaml",
            &format!("repository: {url}\nchart: web\nversion: 1.2.3\nnamespace: shop\n"),
        )],
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_linnet"))
            .args([
                "validate",
                "--check-namespaces",
                "never",
                "--render-allow-host",
                "127.0.0.1",
            ])
            .arg(&specs)
            .envs(support::render_env())
            .env("SSL_CERT_FILE", &ca_file)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 objects in 1 files, no errors"), "{text}");
}

/// `linnet agent --repo-path` renders a working tree's overlays too (off the async runtime's
/// threads), and an edit to the overlay on disk reaches the cluster.
#[tokio::test(flavor = "multi_thread")]
async fn repo_path_renders_a_working_tree_overlay() {
    use kube::Api;
    use linnet::api::CanaryDeployment;
    use support::agent::{start_agent, wait_ready};
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "render-local").await;
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    let overlay = |tag: &str| {
        format!(
            "resources: [../base]\nnamespace: {}\nimages:\n- name: nginx\n  newTag: \"{tag}\"\n",
            ns.name
        )
    };
    write_tree(
        &tree,
        &[
            ("base/kustomization.yaml", "resources: [api.yaml]\n"),
            ("base/api.yaml", ROLLOUT),
            ("staging/kustomization.yaml", &overlay("1.27")),
        ],
    );
    let bin = support::render_bin();
    let agent = start_agent(
        tmp.path(),
        &[
            format!("--repo-path={}", tree.display()),
            format!("--kustomize={}", bin.join("kustomize").display()),
        ],
        &ns.name,
    );
    wait_ready(&agent).await;
    let rollouts: Api<CanaryDeployment> = Api::namespaced(admin.clone(), &ns.name);
    for tag in ["1.27", "1.28"] {
        if tag == "1.28" {
            write_tree(&tree, &[("staging/kustomization.yaml", &overlay(tag))]);
        }
        let want = format!("nginx:{tag}");
        support::eventually(&want, Duration::from_secs(30), || async {
            rollouts
                .get_opt("api")
                .await
                .unwrap()
                .filter(|r| r.spec.image == want)
        })
        .await;
    }
}

/// Issue 50: a rollout that an overlay renders is reverted where its image is set, the
/// overlay's `images:` (the shared base is not touched), and is Completed again on the good
/// image once that commit is synced.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_canary_of_an_overlay_is_reverted_in_the_overlays_images() {
    let overlay = |ns: &str, tag: &str| {
        format!(
            "# staging\nresources: [../base]\nnamespace: {ns}\nimages:\n- name: nginx\n  newTag: \"{tag}\"\n"
        )
    };
    revert_where_the_render_sets_the_image(Layout {
        files: &|ns, rollout| {
            vec![
                ("base/kustomization.yaml", "resources: [api.yaml]\n".into()),
                ("base/api.yaml", rollout.to_string()),
                ("staging/kustomization.yaml", overlay(ns, "1.27")),
            ]
        },
        image_file: ("staging/kustomization.yaml", &|ns, tag| overlay(ns, tag)),
        rollout_file: "base/api.yaml",
    })
    .await;
}

/// Issue 50: the same for a Helm release: its values file gets the good image back.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_canary_of_a_helm_release_is_reverted_in_its_values() {
    let values = |_: &str, tag: &str| format!("# the release's image\nimage: nginx:{tag}\n");
    revert_where_the_render_sets_the_image(Layout {
        files: &|ns, rollout| {
            vec![
                ("charts/api/Chart.yaml", CHART.into()),
                (
                    "charts/api/templates/api.yaml",
                    rollout.replace("image: nginx:1.26", "image: {{ .Values.image }}"),
                ),
                (
                    "releases/api/linnet-helm.yaml",
                    format!(
                        "chart: ../../charts/api\nnamespace: {ns}\nvaluesFiles:\n- values.yaml\n"
                    ),
                ),
                ("releases/api/values.yaml", values(ns, "1.27")),
            ]
        },
        image_file: ("releases/api/values.yaml", &values),
        rollout_file: "charts/api/templates/api.yaml",
    })
    .await;
}

/// The files of a layout, given the namespace and the rollout (on nginx:1.26).
type LayoutFiles<'a> = &'a dyn Fn(&str, &str) -> Vec<(&'static str, String)>;
/// A file's text, given the namespace and a tag.
type TextForTag<'a> = &'a dyn Fn(&str, &str) -> String;

/// A repository where a render sets rollout `api`'s image.
struct Layout<'a> {
    files: LayoutFiles<'a>,
    /// The file that sets the image, and its text for a tag.
    image_file: (&'static str, TextForTag<'a>),
    /// The file with the rollout's metadata (the abort annotation goes there).
    rollout_file: &'static str,
}

/// On 1.27, then a canary of 1.28 aborted from Git: linnet's revert commit sets 1.27 back
/// in the layout's image file, only there, and the rollout is Completed on it again.
async fn revert_where_the_render_sets_the_image(layout: Layout<'_>) {
    use kube::Api;
    use linnet::api::{CanaryDeployment, DeploymentPhase};
    use support::agent::{start_agent, wait_ready};
    use support::git;
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "render-revert").await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    let rollout = ROLLOUT.replace(
        "  replicas: 2\n",
        "  replicas: 2\n  strategy: {type: Batches}\n  batches: 2\n  pause: First\n  currentBatch: 1\n  onFailure: {revert: commit}\n",
    );
    let push = |message: &str| {
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "-qm", message]);
        if !git(&work, &["ls-remote", "origin", "main"]).is_empty() {
            git(&work, &["pull", "-q", "--rebase", "origin", "main"]);
        }
        git(&work, &["push", "-q", "origin", "HEAD:main"]);
    };
    let files = (layout.files)(&ns.name, &rollout);
    let rollout_text = files
        .iter()
        .find(|(p, _)| *p == layout.rollout_file)
        .map(|(_, t)| t.clone())
        .unwrap();
    let borrowed: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    write_tree(&work, &borrowed);
    push("on 1.27");
    let bin = support::render_bin();
    let agent = start_agent(
        tmp.path(),
        &[
            format!("--repo-url=file://{}", bare.display()),
            "--writeback-interval=500ms".into(),
            format!("--kustomize={}", bin.join("kustomize").display()),
            format!("--helm={}", bin.join("helm").display()),
        ],
        &ns.name,
    );
    wait_ready(&agent).await;
    let rollouts: Api<CanaryDeployment> = Api::namespaced(admin.clone(), &ns.name);
    let wait = |what: &'static str, image: &'static str, phase: DeploymentPhase| {
        let rollouts = rollouts.clone();
        async move {
            support::eventually(what, Duration::from_secs(90), || async {
                rollouts.get_opt("api").await.unwrap().filter(|r| {
                    let s = r.status.as_ref();
                    r.spec.image == image && s.and_then(|s| s.phase) == Some(phase)
                })
            })
            .await
        }
    };
    wait(
        "Completed on 1.27",
        "nginx:1.27",
        DeploymentPhase::Completed,
    )
    .await;
    let (image_file, image_text) = layout.image_file;
    write_tree(&work, &[(image_file, &image_text(&ns.name, "1.28"))]);
    push("on 1.28");
    assert_eq!(agent.push_webhook().await, 202);
    wait(
        "the first batch of 1.28",
        "nginx:1.28",
        DeploymentPhase::Paused,
    )
    .await;
    write_tree(
        &work,
        &[(
            layout.rollout_file,
            &rollout_text.replacen(
                "  name: api\n",
                "  name: api\n  annotations:\n    rollouts.linnet.dev/abort: \"true\"\n",
                1,
            ),
        )],
    );
    push("abort api 1.28");
    assert_eq!(agent.push_webhook().await, 202);
    support::eventually("the revert commit", Duration::from_secs(90), || {
        let subject = git(&bare, &["log", "-1", "--format=%an %s", "main"]);
        async move { subject.starts_with("linnet").then_some(()) }
    })
    .await;
    let reverted = support::show_on(&bare, "main", image_file).unwrap();
    assert_eq!(
        reverted,
        image_text(&ns.name, "1.27"),
        "only the tag's characters change"
    );
    let shared = support::show_on(&bare, "main", layout.rollout_file).unwrap();
    assert!(
        !shared.contains("1.27"),
        "the rollout's own file is not edited: {shared}"
    );
    // Synced: Completed on the good image again, with no person touching the cluster.
    assert_eq!(agent.push_webhook().await, 202);
    wait(
        "Completed on 1.27 again",
        "nginx:1.27",
        DeploymentPhase::Completed,
    )
    .await;
}

/// Regression (issue 70): an offline render checked only `resources`, `bases` and
/// `components` for URLs, so a kustomization's `configMapGenerator` file at the agent's own
/// admin port (`/status`, `/metrics`) was fetched (Go skips the proxy for loopback) and
/// applied as a ConfigMap the repository's writer could read. Now every field kustomize
/// reads a file from is checked: the unit is a located error and nothing is fetched.
#[tokio::test(flavor = "multi_thread")]
async fn a_generator_file_at_the_agents_own_admin_port_is_refused_not_fetched() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use support::agent::{start_agent, wait_ready};
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "render-leak").await;
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    let plain = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: plain, namespace: {}}}\ndata: {{a: b}}\n",
        ns.name
    );
    write_tree(&tree, &[("plain/cm.yaml", &plain)]);
    let bin = support::render_bin();
    let agent = start_agent(
        tmp.path(),
        &[
            format!("--repo-path={}", tree.display()),
            format!("--kustomize={}", bin.join("kustomize").display()),
        ],
        &ns.name,
    );
    wait_ready(&agent).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns.name);
    support::eventually("the plain ConfigMap", Duration::from_secs(30), || async {
        config_maps.get_opt("plain").await.unwrap()
    })
    .await;
    let leak = format!(
        "namespace: {}\nconfigMapGenerator:\n- name: leak\n  files:\n  - status={}/status\n  - metrics={}/metrics\n",
        ns.name, agent.base, agent.base
    );
    write_tree(&tree, &[("leak/kustomization.yaml", &leak)]);
    let said = support::eventually(
        "a spec error for the leaking kustomization",
        Duration::from_secs(30),
        || async {
            let s = agent.status().await;
            s["specErrors"].as_array()?.iter().find_map(|e| {
                e.as_str()
                    .filter(|e| e.contains("leak/kustomization.yaml"))
                    .map(str::to_string)
            })
        },
    )
    .await;
    assert!(
        said.contains("leak/kustomization.yaml:5:")
            && said.contains("configMapGenerator[0].files")
            && said.contains("rendering is offline"),
        "{said}"
    );
    support::holds_for(
        "no ConfigMap with the agent's own metrics",
        Duration::from_secs(3),
        || async {
            let leaked = config_maps.list(&Default::default()).await.unwrap();
            let names: Vec<_> = leaked
                .items
                .iter()
                .filter(|cm| format!("{:?}", cm.data).contains("linnet_"))
                .map(|c| c.metadata.name.clone())
                .collect();
            match names.is_empty() {
                true => Ok(()),
                false => Err(format!("the agent's own metrics reached {names:?}")),
            }
        },
    )
    .await;
}

/// Regression (issue 70): a chart repository `https://127.0.0.1:12593#@allowed.example` was
/// read by hand as host `allowed.example` (the text after the last `@`), and helm fetched
/// from 127.0.0.1. Read by a URL parser, its host is 127.0.0.1, which is not allowed.
#[test]
fn a_chart_repository_that_hides_its_host_behind_a_fragment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for repository in [
        "https://127.0.0.1:12593#@allowed.example",
        "https://allowed.example@127.0.0.1:12593/charts",
        "https://127.0.0.1:12593\\\\@allowed.example/",
    ] {
        write_tree(
            dir.path(),
            &[(
                "r/linnet-helm.yaml",
                &format!("chart: web\nrepository: \"{repository}\"\nversion: 1.0.0\n"),
            )],
        );
        let (code, out, _) = validate(dir.path(), &["--render-allow-host", "allowed.example"]);
        assert_eq!(code, 1, "{repository}: {out}");
        // Located on its line, but for the escaped backslash (the parsed text is not the
        // written one): at the file.
        assert!(out.contains("r/linnet-helm.yaml:"), "{repository}: {out}");
        if !repository.contains('\\') {
            assert!(out.contains("r/linnet-helm.yaml:2:"), "{repository}: {out}");
        }
        assert!(
            !out.contains("helm template failed"),
            "fetched {repository}: {out}"
        );
    }
}

/// Issue 72: a chart whose dependencies are charts of the repository (`repository:
/// file://../lib`) renders them, as `helm dependency build` would place them, offline and
/// their own dependencies too; one fetched from elsewhere and not vendored, or outside the
/// repository, is a located error at its `Chart.yaml`, not helm's "run helm dependency
/// build".
#[test]
fn a_charts_dependencies_in_the_repository_are_rendered_with_it() {
    let cm = |name: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata: {{a: \"1\"}}\n")
    };
    let dep = |name: &str, repo: &str| {
        format!(
            "apiVersion: v2\nname: {name}\nversion: 0.1.0\ndependencies:\n- name: lib\n  version: 0.1.0\n  repository: {repo}\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let (app_cm, lib_cm, base_cm) = (cm("app"), cm("lib"), cm("base"));
    let lib_chart = "apiVersion: v2\nname: lib\nversion: 0.1.0\ndependencies:\n- name: base\n  version: 0.1.0\n  repository: file://../base\n";
    write_tree(
        dir.path(),
        &[
            ("charts/app/Chart.yaml", &dep("app", "file://../lib")),
            ("charts/app/templates/cm.yaml", &app_cm),
            ("charts/lib/Chart.yaml", lib_chart),
            ("charts/lib/templates/cm.yaml", &lib_cm),
            (
                "charts/base/Chart.yaml",
                "apiVersion: v2\nname: base\nversion: 0.1.0\n",
            ),
            ("charts/base/templates/cm.yaml", &base_cm),
            (
                "apps/app/linnet-helm.yaml",
                "chart: ../../charts/app\nnamespace: demo\n",
            ),
        ],
    );
    let (code, out, _) = validate(dir.path(), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("3 objects in 1 files"),
        "app, lib and base: {out}"
    );

    // Vendored in charts/: used as it is, the repository's copy not placed over it.
    write_tree(
        dir.path(),
        &[
            (
                "charts/app/charts/lib/Chart.yaml",
                "apiVersion: v2\nname: lib\nversion: 0.1.0\n",
            ),
            (
                "charts/app/charts/lib/templates/cm.yaml",
                &cm("vendored-lib"),
            ),
        ],
    );
    let (code, out, _) = validate(dir.path(), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("2 objects in 1 files"),
        "app and the vendored lib: {out}"
    );
    std::fs::remove_dir_all(dir.path().join("charts/app/charts")).unwrap();

    for (repo, says) in [
        (
            "https://charts.example.com/",
            "rendering is offline: vendor it",
        ),
        ("file://../../..", "outside the repository"),
        ("file://../nothing", "no chart at `file://../nothing`"),
    ] {
        write_tree(dir.path(), &[("charts/app/Chart.yaml", &dep("app", repo))]);
        let (code, out, _) = validate(dir.path(), &[]);
        assert_eq!(code, 1, "{repo}: {out}");
        assert!(
            out.contains("charts/app/Chart.yaml:7:15: dependency lib") && out.contains(says),
            "{repo}: {out}"
        );
        assert!(!out.contains("helm dependency build' to fetch"), "{out}");
    }

    // Hostile: a name that would place a copy outside charts/, and charts that name
    // themselves many times over, which would multiply at every level.
    let escape = "apiVersion: v2\nname: app\nversion: 0.1.0\ndependencies:\n- name: ../../../../../x\n  repository: file://../lib\n";
    write_tree(dir.path(), &[("charts/app/Chart.yaml", escape)]);
    let (code, out, _) = validate(dir.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "charts/app/Chart.yaml:5:9: dependency name `../../../../../x` is not a chart name"
        ),
        "{out}"
    );
    let wide: String = (0..9)
        .map(|i| format!("- name: w{i}\n  repository: file://../app\n"))
        .collect();
    let wide = format!("apiVersion: v2\nname: app\nversion: 0.1.0\ndependencies:\n{wide}");
    write_tree(dir.path(), &[("charts/app/Chart.yaml", &wide)]);
    let (code, out, took) = validate(dir.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("would place more than 64 dependencies"),
        "{out}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}
