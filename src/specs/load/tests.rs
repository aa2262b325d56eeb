use super::*;

const STS: &str = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryStatefulSet
metadata:
  name: redis
spec:
  replicas: 3
  canaryReplicas: 1
  image: redis:7.2
  template:
    serviceName: redis
    selector:
      matchLabels: {app: redis}
    template:
      metadata:
        labels: {app: redis}
      spec:
        containers:
        - name: redis
          image: redis:7.0
";

fn load(text: &str) -> FileSpecs {
    load_file("apps/redis.yaml", text.as_bytes(), &LoadOptions::default())
}

fn only_error(text: &str) -> SpecError {
    let specs = load(text);
    assert!(
        specs.objects.is_empty(),
        "objects from a file with errors: {specs:?}"
    );
    assert_eq!(specs.errors.len(), 1, "errors: {:#?}", specs.errors);
    specs.errors[0].clone()
}

#[test]
fn loads_a_valid_canary_statefulset() {
    let specs = load(STS);
    assert_eq!(specs.errors, vec![]);
    assert_eq!(specs.objects.len(), 1);
    let o = &specs.objects[0];
    assert_eq!(o.key.kind, "CanaryStatefulSet");
    assert_eq!(o.key.namespace, "default");
    assert_eq!(o.key.name, "redis");
    let s = o.spec.typed::<CanaryStatefulSet>();
    assert_eq!(s.as_ref().map(|s| s.spec.replicas), Some(3));
    assert_eq!(s.as_ref().map(|s| s.spec.image.as_str()), Some("redis:7.2"));
}

#[test]
fn multi_document_files_mix_linnet_kinds_and_manifests() {
    let text = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: redis\nspec:\n  clusterIP: None\n---\n{STS}---\n# only a comment\n"
    );
    let specs = load(&text);
    assert_eq!(specs.errors, vec![]);
    let kinds: Vec<&str> = specs.objects.iter().map(|o| o.key.kind.as_str()).collect();
    assert_eq!(kinds, vec!["Service", "CanaryStatefulSet"]);
    assert_eq!(specs.objects[1].location.line, 7);
}

#[test]
fn syntax_error_is_located() {
    let e = only_error("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: [unclosed\n");
    assert_eq!(&*e.location.file, "apps/redis.yaml");
    assert!(e.location.line >= 4, "{e}");
    assert!(e.message.starts_with("invalid YAML"), "{e}");
}

#[test]
fn syntax_error_in_second_document_counts_lines_from_file_start() {
    let e = only_error(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: : :\n  - x\n",
    );
    assert!(e.location.line >= 9, "{e}");
}

#[test]
fn unknown_field_in_linnet_kind_is_located_and_named() {
    let e = only_error(&STS.replace(
        "  canaryReplicas: 1\n",
        "  canaryReplicas: 1\n  canaryReplicaz: 2\n",
    ));
    // In a flow mapping: at `strategy`, the nearest key the locator sees.
    assert_eq!((e.location.line, e.location.column), (8, 3), "{e}");
    assert!(e.message.contains("canaryReplicaz"), "{e}");
}

#[test]
fn unknown_top_level_field_is_located() {
    let e = only_error(&format!("{STS}specs: {{}}\n"));
    assert_eq!(e.location.line, 20, "{e}");
    assert!(e.message.contains("unknown field `specs`"), "{e}");
}

#[test]
fn wrong_type_is_located() {
    let e = only_error(&STS.replace("replicas: 3", "replicas: three"));
    assert_eq!(e.location.line, 6, "{e}");
}

#[test]
fn missing_required_field_is_reported() {
    let e = only_error(&STS.replace("  image: redis:7.2\n", ""));
    assert!(e.message.contains("image"), "{e}");
}

#[test]
fn cel_rule_is_checked_offline_with_its_message() {
    let e = only_error(&STS.replace("canaryReplicas: 1", "canaryReplicas: 5"));
    assert!(
        e.message
            .contains("canaryReplicas must not exceed replicas"),
        "{e}"
    );
    assert_eq!((e.location.line, e.location.column), (7, 3), "{e}");
}

#[test]
fn steps_must_ascend() {
    let e = only_error(&STS.replace("canaryReplicas: 1", "canaryReplicas: 2\n  steps: [2, 1]"));
    assert!(
        e.message.contains("steps must be strictly ascending"),
        "{e}"
    );
}

#[test]
fn named_container_must_exist() {
    let e = only_error(&STS.replace(
        "  image: redis:7.2\n",
        "  image: redis:7.2\n  container: sidecar\n",
    ));
    assert!(
        e.message
            .contains("container \"sidecar\" is not in the template"),
        "{e}"
    );
    assert_eq!(e.location.line, 9, "{e}");
}

#[test]
fn document_without_kind() {
    let e = only_error("apiVersion: v1\nmetadata:\n  name: a\n");
    assert!(e.message.contains("no `kind`"), "{e}");
    assert_eq!((e.location.line, e.location.column), (1, 1));
}

#[test]
fn namespace_outside_allow_list_is_refused_at_the_namespace_key() {
    let opts = LoadOptions {
        policy: crate::specs::Policy {
            allowed_namespaces: vec!["apps".into()],
            ..Default::default()
        },
        ..LoadOptions::default()
    };
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: kube-system\n";
    let specs = load_file("x.yaml", text.as_bytes(), &opts);
    assert!(specs.objects.is_empty());
    assert_eq!(specs.errors[0].location.line, 5);
    assert!(
        specs.errors[0]
            .message
            .contains("\"kube-system\" is not allowed")
    );
}

#[test]
fn non_utf8_file_is_located_at_the_bad_byte() {
    let mut bytes = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: caf".to_vec();
    bytes.push(0xe9);
    bytes.extend_from_slice(b"\n");
    let specs = load_file("x.yaml", &bytes, &LoadOptions::default());
    let e = &specs.errors[0];
    assert_eq!((e.location.line, e.location.column), (4, 12));
    assert!(e.message.contains("not valid UTF-8"), "{e}");
}

#[test]
fn oversized_file_is_refused_whole() {
    let opts = LoadOptions {
        max_file_bytes: 10,
        ..LoadOptions::default()
    };
    let specs = load_file("x.yaml", STS.as_bytes(), &opts);
    assert!(specs.objects.is_empty());
    assert!(
        specs.errors[0]
            .message
            .contains("over the limit of 10 bytes")
    );
}

#[test]
fn one_bad_document_blocks_its_whole_file() {
    let text = format!("{STS}---\napiVersion: v1\nmetadata:\n  name: nokind\n");
    let specs = load(&text);
    assert!(specs.objects.is_empty());
    assert_eq!(specs.errors.len(), 1);
}

#[test]
fn object_declared_in_two_files_names_both_and_blocks_only_that_object() {
    let cm = |name: &str| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n");
    let opts = LoadOptions::default();
    let mut files = BTreeMap::new();
    files.insert(
        "a.yaml".to_string(),
        load_file("a.yaml", cm("shared").as_bytes(), &opts),
    );
    files.insert(
        "b.yaml".to_string(),
        load_file(
            "b.yaml",
            format!("{}---\n{}", cm("shared"), cm("other")).as_bytes(),
            &opts,
        ),
    );
    let set = SpecSet::from_files(files);
    assert_eq!(set.errors.len(), 1);
    let e = &set.errors[0];
    assert_eq!(&*e.location.file, "b.yaml");
    assert!(e.message.contains("a.yaml:1:1"), "{e}");
    let names: Vec<&str> = set.objects.keys().map(|k| k.name.as_str()).collect();
    assert_eq!(names, vec!["other"]);
}

proptest::proptest! {
    #[test]
    fn loader_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = load_file("fuzz.yaml", &bytes, &LoadOptions::default());
    }

    #[test]
    fn loader_never_panics_on_yaml_like_text(text in "([a-zA-Z:\\-\\[\\]{}#'\" \n]|---\n|  ){0,200}") {
        let _ = load_file("fuzz.yaml", text.as_bytes(), &LoadOptions::default());
        let with_header = format!("apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryStatefulSet\n{text}");
        let _ = load_file("fuzz.yaml", with_header.as_bytes(), &LoadOptions::default());
    }
}

#[test]
fn replicas_zero_fails_validate_at_its_line_as_the_crd_says() {
    // Issue 18: it passed validate, then the agent got a raw ApiError dump from the server.
    let e = only_error(&STS.replace("replicas: 3", "replicas: 0"));
    assert_eq!(
        e.to_string(),
        "apps/redis.yaml:6:3: spec.replicas: must be at least 1, not 0"
    );
    let e = only_error(&STS.replace("canaryReplicas: 1", "canaryReplicas: 1\n  maxSurge: 2"));
    assert!(e.message.contains("maxSurge"), "{e}");
}

fn only_error_with(text: &str, opts: &LoadOptions) -> SpecError {
    let specs = load_file("x.yaml", text.as_bytes(), opts);
    assert!(specs.objects.is_empty(), "{:?}", specs.objects);
    assert_eq!(specs.errors.len(), 1, "{:?}", specs.errors);
    specs.errors[0].clone()
}

mod trust;

const DEPLOY: &str = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryDeployment
metadata:
  name: web
spec:
  replicas: 4
  image: web:2
  template:
    selector:
      matchLabels: {app: web}
    template:
      metadata:
        labels: {app: web}
      spec:
        containers:
        - name: web
          image: web:1
";

/// Regression (issue 71): a rollout name longer than its objects can carry was taken, then
/// failed late: a batched CanaryDeployment of 51 to 63 characters with trafficRouting got
/// version Deployments without a version label, so its Services selected no pod; a
/// StatefulSet over 52 characters never gets its pods made.
#[test]
fn a_rollout_name_longer_than_its_objects_can_carry_is_refused_at_the_name() {
    let renamed = |text: &str, length: usize| {
        let name = "a".repeat(length);
        text.replacen("  name: redis\n", &format!("  name: {name}\n"), 1)
            .replacen("  name: web\n", &format!("  name: {name}\n"), 1)
    };
    let traffic = "  image: web:2\n  strategy: {type: Batches}\n  batches: 2\n  trafficRouting:\n    gatewayAPI:\n      httpRoutes: [web]\n      port: 8080\n";
    let routed = DEPLOY.replace("  image: web:2\n", traffic);
    let batched = DEPLOY.replace(
        "  image: web:2\n",
        "  image: web:2\n  strategy: {type: Batches}\n",
    );
    let partition = STS.replace(
        "  image: redis:7.2\n",
        "  image: redis:7.2\n  strategy: {type: Partition}\n",
    );
    for (what, text, longest) in [
        ("TwoSets", STS.to_string(), 45),
        ("Partition", partition, 52),
        ("a Deployment with traffic", routed, 50),
        ("a batched Deployment", batched, 50),
        ("a Deployment", DEPLOY.to_string(), 63),
    ] {
        let fits = load(&renamed(&text, longest));
        assert_eq!(fits.errors, vec![], "{what} at {longest}");
        let e = only_error(&renamed(&text, longest + 1));
        assert_eq!(e.location.line, 4, "{what}: {e}");
        assert!(
            e.message
                .contains(&format!("is {} characters long", longest + 1))
                && e.message.contains(&format!("at most {longest}")),
            "{what}: {e}"
        );
    }
}

/// Issue 75: baseline pods need a batched rollout, and are refused beside trafficRouting
/// (its routes would send them nothing), at the field.
#[test]
fn a_baseline_needs_batches_and_no_traffic_routing() {
    let batched = DEPLOY.replace(
        "  image: web:2\n",
        "  image: web:2\n  strategy: {type: Batches, baseline: true}\n  batches: 2\n",
    );
    assert_eq!(load(&batched).errors, vec![]);
    let rolling = DEPLOY.replace(
        "  image: web:2\n",
        "  image: web:2\n  strategy: {baseline: true}\n",
    );
    let e = only_error(&rolling);
    assert!(
        e.message
            .contains("strategy.baseline needs strategy Batches"),
        "{e}"
    );
    // In a flow mapping: at `strategy`, the nearest key the locator sees.
    assert_eq!((e.location.line, e.location.column), (8, 3), "{e}");
    // With traffic routing, the routes weigh the baseline's Service as the canary's.
    let routed = batched.replace(
        "  batches: 2\n",
        "  batches: 2\n  trafficRouting:\n    gatewayAPI:\n      httpRoutes: [web]\n      port: 8080\n",
    );
    assert!(routed.contains("baseline: true"));
    assert_eq!(load(&routed).errors, vec![]);
}

/// Issue 75: blue-green switches through the routes, so it needs trafficRouting, and has
/// no use for weights; `blueGreen` needs its strategy, and baseline pods are for batches.
#[test]
fn blue_green_needs_traffic_routing_without_weights() {
    let routing = "  trafficRouting:\n    gatewayAPI:\n      httpRoutes: [web]\n      port: 8080\n";
    let blue_green = DEPLOY.replace(
        "  image: web:2\n",
        &format!("  image: web:2\n  strategy:\n    type: BlueGreen\n    blueGreen: {{scaleDownDelaySeconds: 60}}\n{routing}"),
    );
    assert_eq!(load(&blue_green).errors, vec![]);
    // The approval of the switch: stage 2 of 2, whatever `batches` says.
    let approved = blue_green.replace("  image: web:2\n", "  image: web:2\n  currentBatch: 2\n");
    assert_eq!(load(&approved).errors, vec![]);
    // Rolled back as documented: only the type changes (found by review: refused before).
    let rollback = approved.replace("type: BlueGreen", "type: Rollback");
    assert_eq!(load(&rollback).errors, vec![]);
    let without_block = rollback.replace("    blueGreen: {scaleDownDelaySeconds: 60}\n", "");
    assert!(!without_block.contains("blueGreen"));
    assert_eq!(load(&without_block).errors, vec![]);
    for (what, text, says) in [
        (
            "stage 3",
            approved.replace("currentBatch: 2", "currentBatch: 3"),
            "currentBatch must be between 1 and batches",
        ),
        (
            "stage 3 of 3 batches",
            approved.replace("currentBatch: 2", "currentBatch: 3\n  batches: 3"),
            "currentBatch must be between 1 and batches",
        ),
        (
            "no routes",
            blue_green.replace(routing, ""),
            "strategy BlueGreen needs trafficRouting",
        ),
        (
            "weights",
            blue_green.replace(
                "      port: 8080\n",
                "      port: 8080\n    weights: [100]\n",
            ),
            "trafficRouting.weights has no use with strategy BlueGreen",
        ),
        (
            "blueGreen on Batches",
            blue_green.replace("type: BlueGreen", "type: Batches"),
            "strategy.blueGreen needs strategy type BlueGreen",
        ),
        (
            "a baseline",
            blue_green.replace(
                "    type: BlueGreen\n",
                "    type: BlueGreen\n    baseline: true\n",
            ),
            "strategy.baseline needs strategy Batches",
        ),
    ] {
        let errors = load(&text).errors;
        assert!(
            errors.iter().any(|e| e.message.contains(says)),
            "{what}: {errors:?}"
        );
    }
}

/// Issue 75: blue-green without a gateway switches a Service of the user's by its selector
/// (`activeService`), not both ways at once; a preview Service needs an active one.
#[test]
fn blue_green_by_service_selector_names_an_active_service_not_routes_too() {
    let with = |blue_green: &str, routing: &str| {
        DEPLOY.replace(
            "  image: web:2\n",
            &format!("  image: web:2\n  strategy:\n    type: BlueGreen\n    blueGreen: {blue_green}\n{routing}"),
        )
    };
    let routing = "  trafficRouting:\n    gatewayAPI:\n      httpRoutes: [web]\n      port: 8080\n";
    for ok in [
        with("{activeService: web}", ""),
        with("{activeService: web, previewService: web-preview}", ""),
        with("{scaleDownDelaySeconds: 5}", routing),
    ] {
        assert_eq!(load(&ok).errors, vec![], "{ok}");
    }
    let rollback = with("{activeService: web}", "").replace("type: BlueGreen", "type: Rollback");
    assert_eq!(load(&rollback).errors, vec![]);
    for (what, text, says) in [
        (
            "neither",
            with("{scaleDownDelaySeconds: 5}", ""),
            "or strategy.blueGreen.activeService",
        ),
        (
            "both",
            with("{activeService: web}", routing),
            "activeService and previewService are for a blue-green rollout without trafficRouting",
        ),
        (
            "a preview alone",
            with("{previewService: web-preview}", routing),
            "previewService needs an activeService",
        ),
        (
            "one Service for both",
            with("{activeService: web, previewService: web}", ""),
            "previewService needs an activeService, and another Service than it",
        ),
    ] {
        let errors = load(&text).errors;
        assert!(
            errors.iter().any(|e| e.message.contains(says)),
            "{what}: {errors:?}"
        );
    }
}

/// Issue 75: GRPCRoutes beside or instead of HTTPRoutes; at least one route, and a header
/// route a gRPC call can match.
#[test]
fn grpc_routes_need_a_route_and_a_header_route_grpc_can_match() {
    let with = |gateway: &str, header: &str| {
        DEPLOY.replace(
            "  image: web:2\n",
            &format!("  image: web:2\n  strategy: {{type: Batches}}\n  trafficRouting:\n    gatewayAPI: {gateway}\n{header}"),
        )
    };
    let query = "    headerRoute: {queryParams: [{name: beta, value: 'on'}]}\n";
    let header = "    headerRoute: {headers: [{name: x-canary, value: 'on'}]}\n";
    for ok in [
        with("{grpcRoutes: [web], port: 8080}", header),
        with("{grpcRoutes: [web], httpRoutes: [web], port: 8080}", ""),
        with("{httpRoutes: [web], port: 8080}", query),
    ] {
        assert_eq!(load(&ok).errors, vec![], "{ok}");
    }
    for (text, says) in [
        (
            with("{port: 8080}", ""),
            "trafficRouting.gatewayAPI names no route",
        ),
        (
            with("{httpRoutes: [], grpcRoutes: [], port: 8080}", ""),
            "trafficRouting.gatewayAPI names no route",
        ),
        (
            with("{grpcRoutes: [web], port: 8080}", query),
            "a gRPC request has no query parameters",
        ),
    ] {
        let errors = load(&text).errors;
        assert!(
            errors.iter().any(|e| e.message.contains(says)),
            "{text}: {errors:?}"
        );
    }
}

/// Issue 73: a Fleet beside the specs is checked and left out (agents read it with --fleet);
/// a mistake in it is located and blocks only its file.
#[test]
fn a_fleet_is_checked_and_never_applied() {
    let fleet = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: Fleet
metadata: {name: shop}
spec:
  waves:
  - name: canary
    clusters: [eu-1]
    bakeSeconds: 600
  - {name: rest, matchLabels: {}}
";
    let specs = load(&format!("{fleet}---\n{STS}"));
    assert_eq!(specs.errors, vec![]);
    assert_eq!(specs.objects.len(), 1, "only the rollout is applied");
    assert_eq!(specs.left_out.len(), 1);
    assert!(
        specs.left_out[0].message.contains("never applied"),
        "{:?}",
        specs.left_out
    );
    let e = only_error(&fleet.replace("bakeSeconds: 600", "bakeSecs: 600"));
    assert_eq!(
        (e.location.line, e.message.contains("bakeSecs")),
        (8, true),
        "{e:?}"
    );
    let e = only_error(&fleet.replace("clusters: [eu-1]", "clusters: [EU_1]"));
    assert!(
        e.message.contains("not a DNS label") && e.location.line == 7,
        "{e:?}"
    );
}

/// Issue 74: an ImagePolicy is checked and left out (agents read it with
/// --image-automation); a bad range, pattern or image is located at its field.
#[test]
fn an_image_policy_is_checked_and_never_applied() {
    let policy = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: ImagePolicy
metadata: {name: web}
spec:
  image: reg.example:5000/team/web
  policy:
    semver:
      range: '>=1.0.0 <2.0.0'
";
    let specs = load(&format!("{policy}---\n{STS}"));
    assert_eq!(specs.errors, vec![]);
    assert_eq!(specs.objects.len(), 1, "only the rollout is applied");
    assert!(specs.left_out[0].message.contains("--image-automation"));
    let e = only_error(&policy.replace(">=1.0.0 <2.0.0", ">=one"));
    assert_eq!((e.location.line, e.location.column), (8, 7), "{e:?}");
    assert!(e.message.contains("does not parse"), "{e:?}");
    let e = only_error(&policy.replace("team/web", "team/web:1.0"));
    assert_eq!(e.location.line, 5, "{e:?}");
    let e = only_error(&policy.replace("    semver:\n      range: '>=1.0.0 <2.0.0'\n", "    {}\n"));
    assert_eq!(e.location.line, 6, "{e:?}");
    assert!(e.message.contains("exactly one"), "{e:?}");
}
