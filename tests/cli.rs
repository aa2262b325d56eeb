//! The `linnet` binary's command line, run as a user would run it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::process::Command;

fn linnet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(args)
        // No cluster: these are the offline checks (validate asks a cluster it can reach).
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        // The example repository holds Kustomize overlays and a chart.
        .envs(support::render_env())
        .output()
        .expect("run the linnet binary")
}

/// `linnet validate DIR` offline with `extra` flags: its exit code, and stdout then stderr.
fn validate_offline(dir: &std::path::Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = vec!["validate", "--check-namespaces", "never"];
    args.extend_from_slice(extra);
    args.push(dir.to_str().unwrap());
    let out = linnet(&args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn help_lists_every_subcommand() {
    let out = linnet(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for sub in [
        "agent",
        "diff",
        "validate",
        "status",
        "get",
        "promote",
        "abort",
        "crds",
        "completion",
        "doctor",
    ] {
        assert!(help.contains(sub), "--help does not list `{sub}`:\n{help}");
    }
}

/// Regression (issue 72): `agent` and `diff` took no --kubeconfig or --context, though the
/// message for a missing kubeconfig told users to pass them. Each reads the file it is given.
#[test]
fn agent_and_diff_take_the_kubeconfig_and_context_flags() {
    let dir = tempfile::tempdir().unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gitops-repo");
    let given = dir.path().join("given-kubeconfig");
    let given = given.to_str().unwrap();
    for args in [
        vec![
            "agent",
            "--repo-path",
            example,
            "--kubeconfig",
            given,
            "--context",
            "c",
        ],
        vec!["diff", example, "--kubeconfig", given, "--context", "c"],
    ] {
        let out = linnet(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
        assert!(
            err.contains("given-kubeconfig"),
            "{args:?} names the file it read: {err}"
        );
    }
}

#[test]
fn agent_without_a_source_says_what_to_give() {
    let out = linnet(&["agent"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--repo-url") && err.contains("--repo-path"),
        "stderr: {err}"
    );
}

#[test]
fn validate_accepts_the_example_repository() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gitops-repo");
    let out = linnet(&["validate", dir]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("no errors"), "{stdout}");
}

#[test]
fn validate_accepts_the_example_analysis_template() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/analysis");
    let out = linnet(&["validate", dir]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("2 objects in 2 files, no errors"),
        "{stdout}"
    );
}

#[test]
fn validate_prints_a_located_error_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryDeployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  image: web:1\n  batches: 2\n  currentBatch: 3\n  template:\n    selector:\n      matchLabels: {app: web}\n    template:\n      metadata:\n        labels: {app: web}\n      spec:\n        containers:\n        - name: web\n          image: web:1\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("good.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\n",
    )
    .unwrap();
    let out = linnet(&["validate", dir.path().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("bad.yaml:9:3: currentBatch must be between 1 and batches"),
        "{stdout}"
    );
    assert!(stdout.contains("1 file(s) blocked: bad.yaml"), "{stdout}");
}

#[test]
fn a_ca_file_without_a_certificate_stops_the_agent_saying_what_it_must_hold() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("ca.pem");
    std::fs::write(&bad, "-----BEGIN PRIVATE KEY-----\nnot a CA\n").unwrap();
    for file in [bad, dir.path().join("missing.pem")] {
        let out = linnet(&[
            "agent",
            "--repo-url=https://git.example.invalid/acme/gitops.git",
            &format!("--ca-file={}", file.display()),
        ]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--ca-file"), "stderr: {err}");
        assert!(
            err.contains("BEGIN CERTIFICATE") || err.contains("cannot read"),
            "stderr: {err}"
        );
    }
}

#[test]
fn diff_exits_2_not_1_when_the_cluster_cannot_be_read() {
    // Issue 24: 1 (what `diff` says for a pending change) for an unreachable API server.
    let dir = tempfile::tempdir().unwrap();
    let port = support::ports::free_port();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n"
        ),
    )
    .unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gitops-repo");
    let out = Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["diff", example])
        .env("KUBECONFIG", &kubeconfig)
        .envs(support::render_env())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}{err}",
        String::from_utf8_lossy(&out.stdout),
    );
    // Regression (issue 72): the client's own "ERROR ... failed with error" line came first.
    assert!(
        err.trim_start().starts_with("linnet:") && !err.contains("ERROR"),
        "linnet's message alone: {err}"
    );
}

#[test]
fn with_json_logs_an_error_at_start_is_a_json_line() {
    let out = linnet(&[
        "--log-format",
        "json",
        "agent",
        "--repo-url=https://git.example.invalid/acme/gitops.git",
        "--ca-file=/nonexistent/ca.pem",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let line: serde_json::Value = serde_json::from_str(err.trim()).expect("one JSON line");
    assert_eq!(line["level"], "ERROR", "{err}");
    assert!(
        line["fields"]["error"]
            .as_str()
            .unwrap()
            .contains("--ca-file"),
        "{err}"
    );
}

#[test]
fn validate_refuses_a_directory_without_specs_unless_told() {
    // Issue 24: a wrong path passed with exit 0.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "not a spec\n").unwrap();
    let out = linnet(&["validate", dir.path().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("no specs found"), "{stdout}");
    let out = linnet(&["validate", "--allow-empty", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn validate_writes_github_annotations_and_json() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: one\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: one\n",
    )
    .unwrap();
    let root = dir.path().to_str().unwrap();
    let out = linnet(&["validate", "--output", "github", root]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let annotation = stdout
        .lines()
        .find(|l| l.starts_with("::error file="))
        .unwrap_or_else(|| panic!("no annotation in {stdout}"));
    assert!(
        annotation.starts_with(&format!("::error file={root}/bad.yaml,line=5,col=1::")),
        "{annotation}"
    );
    let out = linnet(&["validate", "--output", "json", root]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["errors"][0]["file"], "bad.yaml");
    assert_eq!(report["errors"][0]["line"], 5);
}

/// Issue 24: a typo in a built-in kind (`portz:` in a Service) passed validate and failed at
/// apply time without a line; a typo in a template (`containerz:`) was reported as
/// "containers is empty". Both are now unknown fields at their own line and column.
#[test]
fn validate_reports_unknown_fields_in_built_in_kinds_and_templates_at_their_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("service.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: demo\nspec:\n  selector:\n    app: web\n  ports:\n  - port: 80\n    portz: 81\n",
    )
    .unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/gitops-repo/apps/web/web.yaml");
    let web = std::fs::read_to_string(example).unwrap().replacen(
        "        containers:",
        "        containerz:",
        1,
    );
    std::fs::write(dir.path().join("web.yaml"), &web).unwrap();
    let out = linnet(&["validate", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("service.yaml:11:5: unknown field `portz` in spec.ports.0 of Service"),
        "{text}"
    );
    let line = web.lines().position(|l| l.contains("containerz")).unwrap() + 1;
    assert!(
        text.contains(&format!(
            "web.yaml:{line}:9: unknown field `containerz` in spec.template.template.spec of CanaryDeployment"
        )),
        "{text}"
    );
    assert!(
        text.contains("kubectl explain deployment.spec.template.spec"),
        "{text}"
    );
    assert!(!text.contains("containers is empty"), "{text}");
}

#[test]
fn unknown_fields_can_be_ignored_for_a_newer_clusters_fields() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("service.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: demo\nspec:\n  ports:\n  - port: 80\n    newFieldOf137: true\n",
    )
    .unwrap();
    let path = dir.path().to_str().unwrap();
    assert_eq!(linnet(&["validate", path]).status.code(), Some(1));
    let out = linnet(&["validate", "--unknown-fields", "ignore", path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Regression (issue 72): after `make install`, `linnet validate examples/gitops-repo` failed
/// with "cannot run kustomize/helm": the renderers were built into a cache nothing pointed
/// to. `make install` puts them in `lib/linnet` beside `bin/linnet`; this is that layout.
#[test]
fn an_installed_linnet_finds_the_renderers_installed_beside_it() {
    let root = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("install-layout");
    let _ = std::fs::remove_dir_all(&root);
    let (bin, lib) = (root.join("bin"), root.join("lib/linnet"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&lib).unwrap();
    let linnet = bin.join("linnet");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_linnet"), &linnet).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_linnet"), &linnet).unwrap();
    }
    for tool in ["kustomize", "helm"] {
        std::fs::copy(support::render_bin().join(tool), lib.join(tool)).unwrap();
    }
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gitops-repo");
    let out = Command::new(&linnet)
        .args(["validate", "--check-namespaces", "never", example])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &root)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("no errors"), "{text}");
    let _ = std::fs::remove_dir_all(&root);
}

/// Issue 72: shell completion. The bash script loads in a real bash and completes the
/// agent's flags.
#[test]
fn the_completion_script_loads_in_bash_and_knows_the_flags() {
    let out = linnet(&["completion", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(script.contains("--repo-url") && script.contains("--kubeconfig"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("linnet.bash");
    std::fs::write(&file, script.as_bytes()).unwrap();
    let loaded = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p linnet", file.display()))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&loaded.stdout);
    assert!(loaded.status.success() && said.contains("linnet"), "{said}");
}

/// Regression (issue 72): `validate` passed `apps/v1beta1 Deployment`, `kind: Servic` and
/// `rollouts.linnet.io/v1alpha1` ("3 objects in 1 files, no errors"), which the API server
/// refuses. Each is an error at its line, with what it should be; a CRD's kind of another
/// project's group is left to the cluster.
#[test]
fn validate_refuses_kinds_and_versions_kubernetes_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: apps/v1beta1\nkind: Deployment\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Servic\nmetadata:\n  name: b\n---\napiVersion: rollouts.linnet.io/v1alpha1\nkind: CanaryDeployment\nmetadata:\n  name: c\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("fine.yaml"),
        "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata:\n  name: d\nspec: {}\n",
    )
    .unwrap();
    let (code, stdout) = validate_offline(dir.path(), &[]);
    assert_eq!(code, Some(1), "{stdout}");
    for expected in [
        "bad.yaml:1:1: apps/v1beta1 is not served by Kubernetes 1.36; Deployment is apps/v1",
        "bad.yaml:7:1: v1 has no kind Servic; did you mean Service?",
        "bad.yaml:11:1: rollouts.linnet.io/v1alpha1 is not linnet's API; it is rollouts.linnet.dev/v1alpha1",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("fine.yaml"), "{stdout}");
}

/// Regression (issue 72): Argo CD hook Jobs with a `generateName` were refused ("has no
/// metadata.name"), blocking their whole file. A hook is left out with a note saying why,
/// the rest of the file is read; an ordinary object with only a generateName is still an
/// error (Git could not track what it makes).
#[test]
fn argo_cd_hooks_are_left_out_with_a_note_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let hook = |annotations: &str| {
        format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  generateName: migrate-\n{annotations}spec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: m, image: busybox}}]\n"
        )
    };
    let config = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n";
    std::fs::write(
        dir.path().join("hooks.yaml"),
        format!(
            "{}---\n{}---\n{config}",
            hook("  annotations:\n    argocd.argoproj.io/hook: PreSync\n"),
            hook("  annotations:\n    helm.sh/hook: pre-install\n"),
        ),
    )
    .unwrap();
    let (code, stdout) = validate_offline(dir.path(), &[]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("note: hooks.yaml:1:1: Job migrate is an Argo CD hook (argocd.argoproj.io/hook: PreSync), left out"),
        "{stdout}"
    );
    assert!(
        stdout.contains("note: hooks.yaml:12:1: Job migrate is a Helm hook"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 objects in 1 files, no errors"),
        "{stdout}"
    );

    std::fs::write(dir.path().join("hooks.yaml"), hook("")).unwrap();
    let (code, stdout) = validate_offline(dir.path(), &[]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("Job has no `metadata.name`"), "{stdout}");
}

/// Issue 72: a kind of another project's group is judged by its CRD, from the repository or
/// from `--crds`; without one it is noted as not judged.
#[test]
fn validate_judges_a_crds_kinds_by_the_crd_in_the_repository_or_crds() {
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: certificates.cert-manager.io\nspec:\n  group: cert-manager.io\n  names: {kind: Certificate, plural: certificates}\n  scope: Namespaced\n  versions:\n  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}\n";
    let object = |version: &str| {
        format!(
            "apiVersion: cert-manager.io/{version}\nkind: Certificate\nmetadata:\n  name: web\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let specs = dir.path().join("specs");
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::write(specs.join("cert.yaml"), object("v1alpha2")).unwrap();
    let validate = |extra: &[&str]| {
        let mut args = vec!["--allow-cluster-kind", "CustomResourceDefinition"];
        args.extend_from_slice(extra);
        validate_offline(&specs, &args)
    };
    // No CRD: not judged, and said so.
    let (code, text) = validate(&[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("no CRD here declares the group of cert-manager.io/v1alpha2 Certificate"),
        "{text}"
    );
    // The CRD from --crds.
    let crds = dir.path().join("crds.yaml");
    std::fs::write(&crds, crd).unwrap();
    let (code, text) = validate(&["--crds", crds.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("cert.yaml:1:1: cert-manager.io/v1alpha2 is not served by its CRD; Certificate is cert-manager.io/v1"),
        "{text}"
    );
    // The CRD in the repository, and the object right.
    std::fs::write(specs.join("crd.yaml"), crd).unwrap();
    std::fs::write(specs.join("cert.yaml"), object("v1")).unwrap();
    let (code, text) = validate(&[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("no CRD here"), "{text}");
}
