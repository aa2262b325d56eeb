//! What Git may not ask for (closed namespaces, cluster-scoped kinds, volumes, objects posing as a
//! rollout's), YAML bombs, local trees, and analysis templates.

use super::*;

#[test]
fn kube_system_is_closed_by_default_at_the_namespace_key() {
    let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: pwn\n  namespace: kube-system\nspec: {}\n";
    let e = only_error_with(text, &LoadOptions::default());
    assert_eq!((e.location.line, e.location.column), (5, 3), "{e}");
    assert!(e.message.contains("closed to this source"), "{e}");
}

#[test]
fn a_closed_default_namespace_is_refused_at_the_document() {
    let opts = LoadOptions {
        default_namespace: "kube-system".into(),
        ..LoadOptions::default()
    };
    let e = only_error_with(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n",
        &opts,
    );
    assert_eq!(e.location.line, 1);
    assert!(
        e.message.contains("the default namespace applies here"),
        "{e}"
    );
}

#[test]
fn cluster_scoped_kinds_are_refused_unless_allowed() {
    let crb = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: own\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\n";
    let e = only_error_with(crb, &LoadOptions::default());
    assert_eq!((e.location.line, e.location.column), (2, 1), "{e}");
    assert!(
        e.message
            .contains("--allow-cluster-kind ClusterRoleBinding"),
        "{e}"
    );
    let allowed = LoadOptions {
        policy: crate::specs::Policy {
            cluster_kinds: vec!["ClusterRoleBinding".into()],
            ..Default::default()
        },
        ..LoadOptions::default()
    };
    let specs = load_file("x.yaml", crb.as_bytes(), &allowed);
    assert_eq!(specs.errors, vec![]);
}

#[test]
fn a_closed_namespace_cannot_be_declared_as_a_namespace_object() {
    let opts = LoadOptions {
        policy: crate::specs::Policy {
            cluster_kinds: vec!["Namespace".into()],
            ..Default::default()
        },
        ..LoadOptions::default()
    };
    let e = only_error_with(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kube-system\n",
        &opts,
    );
    assert_eq!(e.location.line, 4, "{e}");
}

#[test]
fn a_persistent_volume_is_never_applied_from_git_whatever_the_policy() {
    let opts = LoadOptions {
        policy: crate::specs::Policy {
            cluster_kinds: vec!["PersistentVolume".into()],
            ..Default::default()
        },
        ..LoadOptions::default()
    };
    let pv = "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv-1\nspec:\n  persistentVolumeReclaimPolicy: Delete\n";
    let e = only_error_with(pv, &opts);
    assert_eq!(e.location.line, 2, "{e}");
    assert!(e.message.contains("never applied from Git"), "{e}");
}

#[test]
fn an_object_posing_as_a_rollouts_claim_is_refused_at_the_label() {
    let text = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data-db-canary-0\n  labels:\n    rollouts.linnet.dev/rollout: db\nspec:\n  volumeName: someone-elses\n";
    let e = only_error_with(text, &LoadOptions::default());
    assert_eq!((e.location.line, e.location.column), (6, 5), "{e}");
    assert!(e.message.contains("only by linnet's controllers"), "{e}");
}

#[test]
fn a_pod_template_posing_as_a_rollouts_pods_is_refused() {
    let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: fake\nspec:\n  template:\n    metadata:\n      labels:\n        rollouts.linnet.dev/role: canary\n";
    let e = only_error_with(text, &LoadOptions::default());
    assert_eq!(e.location.line, 5, "{e}");
    assert!(e.message.contains("spec.template.metadata.labels"), "{e}");
}

#[test]
fn git_may_not_adopt_on_its_own_behalf() {
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  annotations:\n    rollouts.linnet.dev/adopt: \"true\"\n";
    let e = only_error_with(text, &LoadOptions::default());
    assert_eq!(e.location.line, 6, "{e}");
}

/// Ten documents of aliases, each under the parser's own default limits: issue 20's file
/// that passed `validate` and then took the agent to 1.36 GB.
fn ten_document_alias_bomb() -> String {
    let mut text = String::new();
    for d in 0..10 {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bomb-{d}\ndata:\n  x: &a0 \"lollollollollollollollollollollol\"\n"
        ));
        text.push_str("  l:\n");
        for level in 1..6 {
            let prev = level - 1;
            text.push_str(&format!(
                "  - &a{level} [{}]\n",
                vec![format!("*a{prev}"); 11].join(", ")
            ));
        }
    }
    text
}

#[test]
fn an_alias_bomb_spread_over_documents_is_refused_at_its_line() {
    let text = ten_document_alias_bomb();
    assert!(text.len() < 40_000, "{}", text.len());
    let specs = load(&text);
    assert!(specs.objects.is_empty());
    assert_eq!(specs.errors.len(), 1, "{:#?}", specs.errors);
    let e = &specs.errors[0];
    assert!(e.message.starts_with("over the parse budget"), "{e}");
    assert!(e.location.line > 1, "{e}");
}

#[test]
fn a_merge_key_bomb_is_refused() {
    let mut text = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: m\ndata:\n  a0: &a0 {k: v, l: w}\n",
    );
    for level in 1..20 {
        let prev = level - 1;
        text.push_str(&format!(
            "  a{level}: &a{level} {{<<: [*a{prev}], x{level}: [*a{prev}, *a{prev}, *a{prev}]}}\n"
        ));
    }
    assert!(text.len() < 4096);
    let e = only_error(&text);
    assert!(e.message.starts_with("over the parse budget"), "{e}");
}

#[test]
fn ordinary_anchors_still_load() {
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: &l {app: web}\n  annotations: *l\ndata:\n  k: v\n";
    let specs = load(text);
    assert_eq!(specs.errors, vec![]);
}

mod local_tree {
    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    fn errors_of(dir: &Path) -> Vec<String> {
        load_dir(dir, &LoadOptions::default())
            .unwrap()
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_symlink_to_an_outside_file_is_reported_not_followed() {
        let outside = dir_with(&[(
            "secret.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: stolen\n",
        )]);
        let dir = dir_with(&[(
            "ok.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n",
        )]);
        std::os::unix::fs::symlink(
            outside.path().join("secret.yaml"),
            dir.path().join("x.yaml"),
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("linked-dir")).unwrap();
        let set = load_dir(dir.path(), &LoadOptions::default()).unwrap();
        let names: Vec<&str> = set.objects.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(names, vec!["ok"]);
        let errors: Vec<String> = set.errors.iter().map(ToString::to_string).collect();
        // The linked directory is not entered (nothing of it is read), as in Git mode.
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("x.yaml:1:1: is a symbolic link"),
            "{errors:?}"
        );
    }

    #[test]
    fn a_link_to_dev_zero_is_not_read() {
        let dir = dir_with(&[]);
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.yaml")).unwrap();
        let errors = errors_of(dir.path());
        assert!(errors[0].contains("symbolic link"), "{errors:?}");
    }

    #[test]
    fn a_fifo_is_reported_without_opening_it() {
        let dir = dir_with(&[]);
        let fifo = dir.path().join("pipe.yaml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Opening it for reading would block this test forever.
        let errors = errors_of(dir.path());
        assert!(errors[0].contains("not a regular file"), "{errors:?}");
    }

    #[test]
    fn a_large_file_is_refused_from_its_size_before_it_is_read() {
        let dir = dir_with(&[]);
        let big = std::fs::File::create(dir.path().join("big.yaml")).unwrap();
        big.set_len(512 * 1024 * 1024).unwrap(); // sparse: no disk, but 512 MiB to read
        let errors = errors_of(dir.path());
        assert!(errors[0].contains("over the limit"), "{errors:?}");
    }

    #[test]
    fn a_file_swapped_for_a_link_after_listing_is_not_followed() {
        let outside = dir_with(&[(
            "s.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: s\n",
        )]);
        let dir = dir_with(&[(
            "a.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n",
        )]);
        let files = list_local_spec_files(dir.path(), &Default::default()).unwrap();
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("s.yaml"), dir.path().join("a.yaml"))
            .unwrap();
        let content = read_local_spec_file(&files[0], 1024);
        assert!(matches!(content, FileContent::Refused(_)), "{content:?}");
    }
}

#[test]
fn an_image_with_a_line_break_or_of_60_kb_is_refused_at_its_line() {
    let e = only_error(&STS.replace(
        "image: redis:7.2",
        "image: \"redis:7.2\\nSigned-off-by: x\"",
    ));
    assert_eq!(e.location.line, 8, "{e}");
    assert!(e.message.contains("line breaks"), "{e}");
    let e = only_error(&STS.replace(
        "image: redis:7.2",
        &format!("image: redis:{}", "7".repeat(60_000)),
    ));
    assert!(e.message.contains("over 512"), "{e}");
}

#[test]
fn a_deep_wide_document_is_checked_for_controller_marks_in_linear_time() {
    // Issue 20 review: the nested-metadata check wrote the dotted path at every node, so 55
    // levels of 1,000-character keys over a list of 90,000 items cost gigabytes of copying.
    let key = "k".repeat(1000);
    // (Under `data`: a field ConfigMap does not have is an error of its own.)
    let mut text = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: wide\ndata: ");
    for _ in 0..55 {
        text.push_str(&format!("{{{key}: "));
    }
    text.push_str(&format!("[{}]", vec!["1"; 90_000].join(",")));
    text.push_str(&"}".repeat(55));
    text.push('\n');
    let started = std::time::Instant::now();
    let specs = load(&text);
    assert_eq!(specs.errors, vec![]);
    // A hang detector only: it takes milliseconds.
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn unknown_fields_are_errors_for_validate_and_left_to_the_api_server_in_the_agent() {
    // Issue 24: `portz:` passed validate. The agent keeps loading it: a newer cluster may know
    // a field that k8s-openapi's release does not, and only the API server can tell.
    let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 80\n    portz: 81\n";
    let agent = load_file("apps/web.yaml", text.as_bytes(), &LoadOptions::default());
    assert_eq!(agent.errors, vec![]);
    let checking = LoadOptions {
        unknown_fields_are_errors: true,
        ..LoadOptions::default()
    };
    let validate = load_file("apps/web.yaml", text.as_bytes(), &checking);
    assert_eq!(validate.errors.len(), 1, "{:?}", validate.errors);
    let e = &validate.errors[0];
    assert_eq!((e.location.line, e.location.column), (8, 5), "{e}");
    assert!(e.message.contains("unknown field `portz`"), "{e}");
}

const TEMPLATE: &str = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: AnalysisTemplate
metadata:
  name: error-rate
spec:
  args:
  - name: app
  metrics:
  - name: error-rate
    interval: 30s
    successCondition: result < 0.05
    provider:
      prometheus:
        address: http://prometheus:9090
        query: errors{app=\"{{ args.app }}\"}
";

#[test]
fn a_template_with_bad_cel_names_its_line() {
    assert!(
        load(TEMPLATE).errors.is_empty(),
        "{:?}",
        load(TEMPLATE).errors
    );
    let e = only_error(&TEMPLATE.replace("result < 0.05", "result <"));
    assert_eq!((e.location.line, e.location.column), (11, 5), "{e}");
    assert!(e.message.contains("is not CEL"), "{e}");
    let e = only_error(&TEMPLATE.replace("interval: 30s", "interval: 30 seconds"));
    assert_eq!(e.location.line, 10, "{e}");
    assert!(e.message.contains("is not a duration"), "{e}");
    let e = only_error(&TEMPLATE.replace(
        "    provider:\n",
        "    provider:\n      web: {url: http://x}\n",
    ));
    assert!(
        e.message.contains(
            "exactly one of prometheus, web, datadog, newRelic, cloudWatch, influxdb or job"
        ),
        "{e}"
    );
}

#[test]
fn a_new_relic_template_loads_and_its_bad_timeout_names_its_line() {
    let new_relic = TEMPLATE.replace(
        "      prometheus:\n        address: http://prometheus:9090\n        query: errors{app=\"{{ args.app }}\"}\n",
        "      newRelic:\n        accountId: 4242\n        query: SELECT count(*) FROM Transaction SINCE 5 minutes ago\n        apiKeyFile: /keys/nr\n        timeout: 10s\n",
    );
    assert!(new_relic.contains("newRelic"));
    assert!(
        load(&new_relic).errors.is_empty(),
        "{:?}",
        load(&new_relic).errors
    );
    let e = only_error(&new_relic.replace("timeout: 10s", "timeout: soon"));
    assert_eq!((e.location.line, e.location.column), (17, 9), "{e}");
    assert!(e.message.contains("not a duration"), "{e}");
}

/// Issue 75: InfluxDB 1.x runs a write sent by `GET /query` (found on the real server), so a
/// template whose InfluxQL is not one SELECT or SHOW is an error at its query.
#[test]
fn an_influxdb_template_that_would_write_is_refused_at_its_query() {
    let influx = TEMPLATE.replace(
        "      prometheus:\n        address: http://prometheus:9090\n        query: errors{app=\"{{ args.app }}\"}\n",
        "      influxdb:\n        address: https://influxdb:8086\n        database: app\n        query: SELECT last(rate) FROM errors WHERE app = '{{ args.app }}'\n        tokenFile: /keys/influx\n",
    );
    assert!(influx.contains("influxdb"));
    assert_eq!(load(&influx).errors, vec![]);
    for (query, says) in [
        ("SELECT 1; DROP DATABASE app", "one statement only"),
        ("DROP DATABASE app", "not DROP"),
        ("SELECT * INTO copy FROM errors", "INTO writes"),
    ] {
        let bad = influx.replace(
            "SELECT last(rate) FROM errors WHERE app = '{{ args.app }}'",
            query,
        );
        let e = only_error(&bad);
        assert!(e.message.contains(says), "{query}: {e}");
        assert_eq!(e.location.line, 16, "{query}: {e}");
    }
}

#[test]
fn a_rollout_whose_template_or_argument_is_missing_blocks_its_file() {
    let opts = LoadOptions::default();
    let with_analysis = |args: &str| {
        format!(
            "{STS}  analysis:\n    args: [{args}]\n    background:\n      templates: [{{templateName: error-rate}}]\n    gates:\n    - after: 2\n      templates: [{{templateName: error-rate}}]\n"
        )
    };
    let set_of = |rollout: String, template: bool| {
        let mut files = BTreeMap::new();
        files.insert(
            "redis.yaml".to_string(),
            load_file("redis.yaml", rollout.as_bytes(), &opts),
        );
        if template {
            files.insert(
                "t.yaml".to_string(),
                load_file("t.yaml", TEMPLATE.as_bytes(), &opts),
            );
        }
        SpecSet::from_files(files)
    };
    let set = set_of(with_analysis("{name: app, value: redis}"), false);
    assert_eq!(set.blocked_files, ["redis.yaml"]);
    let messages: Vec<&str> = set.errors.iter().map(|e| e.message.as_str()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("after 2 is past the last step (1)")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("AnalysisTemplate error-rate is not in the repository")),
        "{messages:?}"
    );
    let set = set_of(with_analysis(""), true);
    assert!(
        set.errors
            .iter()
            .any(|e| e.message.contains("needs argument app")),
        "{:?}",
        set.errors
    );
    assert!(set.objects.keys().all(|k| k.kind == "AnalysisTemplate"));
    let typo = with_analysis("{name: app, value: redis}, {name: windw, value: 5s}")
        .replace("after: 2", "after: 1");
    let set = set_of(typo, true);
    assert!(
        set.errors.iter().any(|e| e
            .message
            .contains("argument windw is not an argument of any template the rollout uses")),
        "{:?}",
        set.errors
    );
    let fixed = with_analysis("{name: app, value: redis}").replace("after: 2", "after: 1");
    let set = set_of(fixed, true);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    assert_eq!(set.objects.len(), 2);
}

#[test]
fn gates_on_a_rolling_deployment_are_refused() {
    let opts = LoadOptions::default();
    let web = "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryDeployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  image: web:1\n  template:\n    selector:\n      matchLabels: {app: web}\n    template:\n      metadata:\n        labels: {app: web}\n      spec:\n        containers:\n        - name: web\n          image: web:1\n  analysis:\n    args: [{name: app, value: web}]\n    gates:\n    - after: 1\n      templates: [{templateName: error-rate}]\n";
    let mut files = BTreeMap::new();
    files.insert(
        "web.yaml".to_string(),
        load_file("web.yaml", web.as_bytes(), &opts),
    );
    files.insert(
        "t.yaml".to_string(),
        load_file("t.yaml", TEMPLATE.as_bytes(), &opts),
    );
    let set = SpecSet::from_files(files);
    assert!(
        set.errors
            .iter()
            .any(|e| e.message.contains("a rolling update has no batches")),
        "{:?}",
        set.errors
    );
}

#[test]
fn a_claim_naming_its_volume_is_refused_at_volume_name() {
    // Issue 45: a plain claim from Git could bind any Available PersistentVolume.
    let claim = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: grab\n  namespace: apps\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeName: pv-of-team-b\n  resources:\n    requests:\n      storage: 1Gi\n";
    let e = only_error_with(claim, &LoadOptions::default());
    assert_eq!((e.location.line, e.location.column), (8, 3), "{e}");
    assert!(e.message.contains("--allow-claim-volume-name"), "{e}");
    let allowed = LoadOptions {
        policy: crate::specs::Policy {
            claim_volume_names: true,
            ..Default::default()
        },
        ..LoadOptions::default()
    };
    assert_eq!(
        load_file("x.yaml", claim.as_bytes(), &allowed).errors,
        vec![]
    );
}

#[test]
fn a_claim_selecting_a_reserved_volume_by_label_is_refused_at_selector() {
    // Issue 70: `selector: {matchLabels: {team: victim-reserved}}` bound another team's
    // Available volume labelled for it; only volumeName was refused.
    let claim = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: grab\n  namespace: apps\nspec:\n  accessModes: [ReadWriteOnce]\n  selector:\n    matchLabels: {team: victim-reserved}\n  resources:\n    requests:\n      storage: 1Gi\n";
    let e = only_error_with(claim, &LoadOptions::default());
    assert_eq!((e.location.line, e.location.column), (8, 3), "{e}");
    assert!(
        e.message.contains("victim-reserved") && e.message.contains("--allow-claim-volume-name"),
        "{e}"
    );
    let allowed = LoadOptions {
        policy: crate::specs::Policy {
            claim_volume_names: true,
            ..Default::default()
        },
        ..LoadOptions::default()
    };
    assert_eq!(
        load_file("x.yaml", claim.as_bytes(), &allowed).errors,
        vec![]
    );
}

#[test]
fn a_csi_driver_written_with_a_namespace_meets_the_cluster_kind_policy_offline() {
    // Issue 45: a CSIDriver with a namespace passed `validate`.
    let text = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: fake.csi\n  namespace: apps\nspec: {}\n";
    let e = only_error_with(text, &LoadOptions::default());
    assert_eq!(e.location.line, 2, "{e}");
    assert!(e.message.contains("--allow-cluster-kind CSIDriver"), "{e}");
}

#[test]
fn a_repo_path_tree_is_walked_within_its_shape() {
    // Issue 45: a directory of 200,000 files, or one nested thousands deep, in a --repo-path
    // tree would be walked whole (and the nesting could exhaust the stack).
    let dir = tempfile::tempdir().unwrap();
    let cm = |name: &str| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n");
    std::fs::write(dir.path().join("good.yaml"), cm("good")).unwrap();
    let many = dir.path().join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..30 {
        std::fs::write(many.join(format!("f{i}.yaml")), cm(&format!("f{i}"))).unwrap();
    }
    let mut deep = dir.path().join("deep");
    for _ in 0..70 {
        deep = deep.join("d");
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("x.yaml"), cm("x")).unwrap();
    let shape = crate::specs::RevisionShape {
        max_files: 100,
        max_tree_entries: 20,
    };
    let files = list_local_spec_files(dir.path(), &shape).unwrap();
    let blocked: Vec<&str> = files
        .iter()
        .filter(|f| matches!(f.kind, crate::specs::LocalFileKind::Blocked(_)))
        .map(|f| f.rel.as_str())
        .collect();
    assert_eq!(blocked.len(), 2, "{blocked:?}");
    assert!(blocked.contains(&"many/"), "{blocked:?}");
    assert!(
        blocked.iter().any(|b| b.starts_with("deep/d/")),
        "{blocked:?}"
    );
    assert!(files.iter().any(|f| f.rel == "good.yaml"));
    // The file budget: past it the walk stops, with one entry saying so.
    let small = crate::specs::RevisionShape {
        max_files: 1,
        max_tree_entries: 100,
    };
    let files = list_local_spec_files(dir.path(), &small).unwrap();
    assert!(files.iter().any(|f| f.rel == "./"), "{files:?}");
    let opts = LoadOptions {
        shape,
        ..LoadOptions::default()
    };
    let set = crate::specs::load_dir(dir.path(), &opts).unwrap();
    assert!(set.blocked_files.contains(&"many/".to_string()));
    assert!(set.objects.keys().any(|k| k.name == "good"));
}
