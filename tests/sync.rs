//! The desired-state engine against the real control plane: apply the example repository,
//! write nothing when nothing changed, correct drift, prune without touching volumes, and
//! keep going when one file is broken.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Resource};
use linnet::specs::{LoadOptions, load_dir};
use linnet::sync::Syncer;
use serde_json::json;
use support::{
    TestNamespace, admin_client, counting_admin_client, eventually, example_repo_in, from_json,
    install_linnet,
};

const WAIT: Duration = Duration::from_secs(60);

/// A syncer as the agent runs: linnet's shipped identity, applying as the source's account of
/// each namespace (`--apply-as linnet-default`), source `source`.
async fn as_the_source(source: &str) -> Syncer {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let kubeconfig = Kubeconfig::read_from(support::linnet_kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Syncer::new(support::linnet_client().await, source, vec![]).with_apply_as(
        linnet::sync::ApplyAs::AccountPerNamespace {
            name: support::SOURCE_ACCOUNT.into(),
            home: source.to_string(),
        },
        config,
    )
}

fn names(keys: &[linnet::specs::ObjectKey]) -> Vec<String> {
    let mut v: Vec<String> = keys
        .iter()
        .map(|k| format!("{}/{}", k.kind, k.name))
        .collect();
    v.sort();
    v
}

fn canary_statefulsets(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("rollouts.linnet.dev", "v1alpha1", "CanaryStatefulSet");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

#[tokio::test]
async fn applying_the_example_twice_writes_nothing_the_second_time() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "sync").await;
    let repo = example_repo_in(&ns.name);
    let opts = LoadOptions::default();
    let source = ns.name.clone(); // a source of the test's own, so tests do not prune each other

    let (client, writes) = counting_admin_client().await;
    let syncer = Syncer::new(client, &source, vec![ns.name.clone()]);
    let specs = load_dir(repo.path(), &opts).unwrap();
    assert_eq!(specs.errors, vec![]);

    let first = syncer.sync(&specs, "rev1", false).await;
    assert_eq!(first.errors, vec![]);
    assert_eq!(
        names(&first.created),
        vec![
            "CanaryDeployment/web",
            "CanaryStatefulSet/redis",
            "Service/redis",
            "Service/web"
        ]
    );
    assert_eq!(writes.writes(), 4);

    // Same content at a new revision: nothing to write.
    let before = writes.writes();
    let second = syncer.sync(&specs, "rev2", false).await;
    assert_eq!(second.errors, vec![]);
    assert_eq!(second.unchanged, 4);
    assert_eq!(second.writes(), 0);
    assert_eq!(
        writes.writes(),
        before,
        "a sync with nothing to change sent write requests"
    );

    // A changed file updates only its own object.
    let web = repo.path().join("apps/web/web.yaml");
    let text = std::fs::read_to_string(&web).unwrap();
    std::fs::write(
        &web,
        text.replace(
            "image: nginx:1.27\n  strategy",
            "image: nginx:1.28\n  strategy",
        ),
    )
    .unwrap();
    let specs = load_dir(repo.path(), &opts).unwrap();
    let third = syncer.sync(&specs, "rev3", false).await;
    assert_eq!(names(&third.updated), vec!["CanaryDeployment/web"]);
    assert_eq!(third.unchanged, 3);

    // Drift made by hand in the cluster is put back.
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns.name);
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": {"app": "someone-else"}}})),
        )
        .await
        .unwrap();
    let fourth = syncer.sync(&specs, "rev3", false).await;
    assert_eq!(names(&fourth.updated), vec!["Service/web"]);
    let selector = services
        .get("web")
        .await
        .unwrap()
        .spec
        .unwrap()
        .selector
        .unwrap();
    assert_eq!(selector["app"], "web");

    // And the object carries linnet's bookkeeping.
    let redis = canary_statefulsets(&admin, &ns.name)
        .get("redis")
        .await
        .unwrap();
    let annotations = redis.metadata.annotations.unwrap();
    assert_eq!(
        annotations["rollouts.linnet.dev/source-path"],
        "apps/redis/redis.yaml"
    );
    assert_eq!(annotations["rollouts.linnet.dev/revision"], "rev1");
}

/// The agent's way: after a full sync, a change reads and writes only its own objects, however
/// many others there are; a file removed from Git is still pruned; an error means a full sync
/// next time.
#[tokio::test]
async fn after_a_full_sync_a_change_reads_only_what_changed() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "sync-incr").await;
    let repo = example_repo_in(&ns.name);
    let opts = LoadOptions::default();
    let (client, counter) = counting_admin_client().await;
    let syncer = Syncer::new(client, ns.name.clone(), vec![ns.name.clone()]);
    let specs = load_dir(repo.path(), &opts).unwrap();

    let first = syncer.sync_changes(&specs, "rev1", true).await;
    assert!(first.full, "the first sync is a full one");
    assert_eq!(first.errors, vec![]);
    assert_eq!(first.created.len(), 4);

    // Nothing changed: no request at all.
    let (reads, writes) = (counter.reads(), counter.writes());
    let same = syncer.sync_changes(&specs, "rev2", true).await;
    assert!(!same.full);
    assert_eq!(same.unchanged, 4);
    assert_eq!((counter.reads(), counter.writes()), (reads, writes));

    // One file changed: one read and one write.
    let web = repo.path().join("apps/web/web.yaml");
    let text = std::fs::read_to_string(&web).unwrap();
    std::fs::write(
        &web,
        text.replace("image: nginx:1.27\n", "image: nginx:1.28\n"),
    )
    .unwrap();
    let specs = load_dir(repo.path(), &opts).unwrap();
    let (reads, writes) = (counter.reads(), counter.writes());
    let changed = syncer.sync_changes(&specs, "rev3", true).await;
    assert!(!changed.full);
    assert_eq!(names(&changed.updated), vec!["CanaryDeployment/web"]);
    assert_eq!(changed.unchanged, 3);
    assert_eq!(counter.reads() - reads, 1);
    assert_eq!(counter.writes() - writes, 1);

    // A file removed from Git: its objects are pruned without a list.
    std::fs::remove_file(repo.path().join("apps/redis/service.yaml")).unwrap();
    let specs = load_dir(repo.path(), &opts).unwrap();
    let removed = syncer.sync_changes(&specs, "rev4", true).await;
    assert!(!removed.full);
    assert_eq!(names(&removed.pruned), vec!["Service/redis"]);
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns.name);
    assert!(services.get_opt("redis").await.unwrap().is_none());

    // Drift in an object Git did not change waits for the next full sync (at start, after a
    // failed read, or each --drift-interval): a new agent's first sync brings a deleted Service back.
    services.delete("web", &Default::default()).await.unwrap();
    eventually("Service web to be gone", WAIT, || async {
        services
            .get_opt("web")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let broken = Syncer::new(
        counting_admin_client().await.0,
        ns.name.clone(),
        vec![ns.name.clone()],
    );
    let full = broken.sync_changes(&specs, "rev4", true).await;
    assert!(full.full, "a new agent starts with a full sync");
    assert_eq!(names(&full.created), vec!["Service/web"]);
}

#[tokio::test]
async fn pruning_removes_a_deleted_files_objects_and_keeps_their_volumes() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "prune").await;
    let repo = example_repo_in(&ns.name);
    // A claim declared in Git, to show that pruning never deletes one.
    std::fs::write(
        repo.path().join("apps/redis/scratch.yaml"),
        format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: scratch\n  namespace: {}\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n",
            ns.name
        ),
    )
    .unwrap();
    let opts = LoadOptions::default();
    let syncer = Syncer::new(admin.clone(), &ns.name, vec![ns.name.clone()]);
    let report = syncer
        .sync(&load_dir(repo.path(), &opts).unwrap(), "rev1", true)
        .await;
    assert_eq!(report.errors, vec![]);
    assert_eq!(report.created.len(), 5);

    // What the StatefulSet controller will own: a set, and the claim of its replica.
    let csts = canary_statefulsets(&admin, &ns.name)
        .get("redis")
        .await
        .unwrap();
    let owner = json!({"apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
        "name": "redis", "uid": csts.meta().uid, "controller": true, "blockOwnerDeletion": true});
    let set: StatefulSet = from_json(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "redis-stable", "ownerReferences": [owner]},
        "spec": {
            "replicas": 1, "serviceName": "redis",
            "selector": {"matchLabels": {"app": "redis"}},
            "template": {"metadata": {"labels": {"app": "redis"}},
                         "spec": {"containers": [{"name": "redis", "image": "redis:7.2"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]
        }
    }));
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let set = sets.create(&PostParams::default(), &set).await.unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns.name);
    let bound = |c: Option<&PersistentVolumeClaim>| {
        c.and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Bound")
    };
    tokio::time::timeout(
        WAIT,
        await_condition(claims.clone(), "data-redis-stable-0", bound),
    )
    .await
    .expect("replica claim never bound")
    .unwrap();
    let volume_before = claims
        .get("data-redis-stable-0")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name;

    // Remove the redis files from Git, and sync with pruning.
    std::fs::remove_file(repo.path().join("apps/redis/redis.yaml")).unwrap();
    std::fs::remove_file(repo.path().join("apps/redis/service.yaml")).unwrap();
    std::fs::remove_file(repo.path().join("apps/redis/scratch.yaml")).unwrap();
    let report = syncer
        .sync(&load_dir(repo.path(), &opts).unwrap(), "rev2", true)
        .await;
    assert_eq!(report.errors, vec![]);
    assert_eq!(
        names(&report.pruned),
        vec!["CanaryStatefulSet/redis", "Service/redis"]
    );
    assert_eq!(
        names(&report.kept_volumes),
        vec!["PersistentVolumeClaim/scratch"]
    );
    assert_eq!(report.unchanged, 2);

    // The rollout and what it owned go; the volumes stay, bound as before.
    tokio::time::timeout(
        WAIT,
        await_condition(
            sets.clone(),
            "redis-stable",
            conditions::is_deleted(set.meta().uid.as_ref().unwrap()),
        ),
    )
    .await
    .expect("the owned StatefulSet was not garbage-collected")
    .unwrap();
    let claim = claims.get("data-redis-stable-0").await.unwrap();
    assert!(bound(Some(&claim)));
    assert_eq!(claim.spec.unwrap().volume_name, volume_before);
    assert!(bound(Some(&claims.get("scratch").await.unwrap())));

    // Without --prune nothing is deleted.
    std::fs::remove_dir_all(repo.path().join("apps/web")).unwrap();
    let report = syncer
        .sync(&load_dir(repo.path(), &opts).unwrap(), "rev3", false)
        .await;
    assert_eq!(report.writes(), 0);
    eventually("web Service still there", Duration::from_secs(2), || {
        let services: Api<Service> = Api::namespaced(admin.clone(), &ns.name);
        async move { services.get_opt("web").await.ok().flatten().map(|_| ()) }
    })
    .await;
}

#[tokio::test]
async fn a_broken_file_blocks_only_its_own_objects() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "broken-file").await;
    let repo = example_repo_in(&ns.name);
    let web = repo.path().join("apps/web/web.yaml");
    let text = std::fs::read_to_string(&web).unwrap();
    std::fs::write(
        &web,
        text.replace("  batches: 2\n", "  batches: 2\n  batchez: 3\n"),
    )
    .unwrap();

    let specs = load_dir(repo.path(), &LoadOptions::default()).unwrap();
    assert_eq!(specs.blocked_files, vec!["apps/web/web.yaml"]);
    assert_eq!(specs.errors.len(), 1);
    assert!(
        specs.errors[0]
            .to_string()
            .starts_with("apps/web/web.yaml:14:3: CanaryDeployment: unknown field `batchez`"),
        "{}",
        specs.errors[0]
    );

    let syncer = Syncer::new(admin.clone(), &ns.name, vec![ns.name.clone()]);
    let report = syncer.sync(&specs, "rev1", true).await;
    assert_eq!(report.errors, vec![]);
    assert_eq!(
        names(&report.created),
        vec!["CanaryStatefulSet/redis", "Service/redis"]
    );
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns.name);
    assert!(services.get_opt("web").await.unwrap().is_none());
}

#[tokio::test]
async fn linnet_diff_shows_what_would_change_and_exits_1() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "diff").await;
    let repo = example_repo_in(&ns.name);
    let syncer = Syncer::new(admin.clone(), &ns.name, vec![ns.name.clone()]);
    let specs = load_dir(repo.path(), &LoadOptions::default()).unwrap();
    assert_eq!(syncer.sync(&specs, "rev1", false).await.errors, vec![]);

    let admin_kubeconfig = support::admin_kubeconfig();
    let admin_kubeconfig = admin_kubeconfig.to_str().unwrap();
    // `linnet diff` with KUBECONFIG `kubeconfig` and the `cluster` flags.
    let diff = |dir: &std::path::Path, kubeconfig: &str, cluster: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
            .args(["diff", dir.to_str().unwrap(), "--source-name", &ns.name])
            .args(["--allow-namespace", &ns.name])
            .args(cluster)
            .env("KUBECONFIG", kubeconfig)
            .output()
            .unwrap()
    };
    let out = diff(repo.path(), admin_kubeconfig, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("0 to change, 4 unchanged"), "{stdout}");

    let redis = repo.path().join("apps/redis/redis.yaml");
    let text = std::fs::read_to_string(&redis).unwrap();
    std::fs::write(
        &redis,
        text.replace(
            "  image: redis:7.2\n  strategy",
            "  image: redis:7.4\n  strategy",
        ),
    )
    .unwrap();
    // Regression (issue 72): `diff` took no --kubeconfig or --context, though its error
    // said to pass them. KUBECONFIG names nothing here: the flags alone find the cluster.
    let flags = [
        "--kubeconfig",
        admin_kubeconfig,
        "--context",
        "admin@linnet-local",
    ];
    let out = diff(repo.path(), "/nonexistent/kubeconfig", &flags);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "~ update CanaryStatefulSet {}/redis (apps/redis/redis.yaml)",
            ns.name
        )),
        "{stdout}"
    );
    assert!(stdout.contains("-  image: redis:7.2"), "{stdout}");
    assert!(stdout.contains("+  image: redis:7.4"), "{stdout}");
    assert!(stdout.contains("1 to change, 3 unchanged"), "{stdout}");
    println!("{stdout}");
}

/// A first sync of many objects of one kind in one namespace finds the unlabelled ones with
/// one list, not one get each: it adopts those Git declares, creates the rest, and leaves
/// alone what Git does not declare. A Namespace Git declares is created in the same sync as
/// the objects in it (the order is `sync::diff::prerequisites_first`'s, unit-tested).
#[tokio::test]
async fn with_adopt_a_first_sync_adopts_many_unlabelled_objects_with_one_list() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "adopt").await;
    // Git's own Namespace, deleted with the test's.
    let apps = TestNamespace {
        name: format!("{}-apps", ns.name),
    };
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns.name);
    for name in ["cm-0", "cm-1", "cm-2", "bystander"] {
        let cm: ConfigMap = from_json(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"v": "old"}
        }));
        config_maps
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
    }
    let repo = tempfile::tempdir().unwrap();
    let mut text = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}\n  labels: {{linnet.dev/test: \"true\"}}\n",
        apps.name
    );
    for i in 0..10 {
        text += &format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\n  namespace: {}\ndata:\n  v: new\n",
            ns.name
        );
    }
    for i in 0..8 {
        text += &format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-{i}\n  namespace: {}\ndata:\n  v: new\n",
            apps.name
        );
    }
    std::fs::write(repo.path().join("all.yaml"), text).unwrap();
    let may_make_namespaces = LoadOptions {
        policy: linnet::specs::Policy {
            cluster_kinds: vec!["Namespace".into()],
            ..Default::default()
        },
        ..LoadOptions::default()
    };
    let specs = load_dir(repo.path(), &may_make_namespaces).unwrap();
    assert_eq!(specs.errors, vec![]);
    let namespaces = vec![ns.name.clone(), apps.name.clone()];
    let (client, counter) = counting_admin_client().await;

    // What the same syncer reads with nothing declared: its labelled lists and discovery.
    let empty = load_dir(tempfile::tempdir().unwrap().path(), &LoadOptions::default()).unwrap();
    let baseline = Syncer::new(client.clone(), &ns.name, namespaces.clone());
    let before = counter.reads();
    assert_eq!(baseline.sync(&empty, "rev0", false).await.errors, vec![]);
    let labelled_lists = counter.reads() - before;

    let syncer = Syncer::new(client, &ns.name, namespaces)
        .with_adopt(true)
        .with_policy(may_make_namespaces.policy.clone());
    let before = counter.reads();
    let report = syncer.sync(&specs, "rev1", true).await;
    let reads = counter.reads() - before;
    assert_eq!(report.errors, vec![]);
    let mut created: Vec<String> = (3..10).map(|i| format!("ConfigMap/cm-{i}")).collect();
    created.extend((0..8).map(|i| format!("ConfigMap/app-{i}")));
    created.push(format!("Namespace/{}", apps.name));
    created.sort();
    assert_eq!(names(&report.created), created);
    assert_eq!(
        names(&report.updated),
        vec!["ConfigMap/cm-0", "ConfigMap/cm-1", "ConfigMap/cm-2"]
    );
    assert_eq!(report.pruned, vec![]);
    // One get per unlabelled object would be 18 reads more than the labelled lists.
    assert!(
        reads < labelled_lists + 8,
        "{reads} reads; {labelled_lists} with nothing declared"
    );
    let adopted = config_maps.get("cm-0").await.unwrap();
    assert_eq!(adopted.data.unwrap()["v"], "new");
    let bystander = config_maps.get("bystander").await.unwrap();
    assert_eq!(bystander.data.unwrap()["v"], "old");
    assert!(
        bystander.metadata.labels.is_none(),
        "the bystander was not touched"
    );
}

/// Adoption is explicit: an object that exists and that linnet did not apply is a located
/// error for its file, left as it is (and never pruned), while the other objects sync; the
/// adoption annotation, put on by someone with rights on the object, lets linnet take it over.
#[tokio::test]
async fn an_existing_object_linnet_did_not_apply_is_not_taken_over() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "noadopt").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns.name);
    let theirs: ConfigMap = from_json(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "theirs"}, "data": {"v": "old"}
    }));
    config_maps
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(
        repo.path().join("theirs.yaml"),
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: theirs\n  namespace: {}\ndata:\n  v: new\n", ns.name),
    )
    .unwrap();
    std::fs::write(
        repo.path().join("ours.yaml"),
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ours\n  namespace: {}\ndata:\n  v: new\n", ns.name),
    )
    .unwrap();
    let specs = load_dir(repo.path(), &LoadOptions::default()).unwrap();
    let syncer = Syncer::new(admin.clone(), &ns.name, vec![ns.name.clone()]);
    let report = syncer.sync(&specs, "rev1", true).await;
    assert_eq!(names(&report.created), vec!["ConfigMap/ours"]);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    let (key, e) = &report.errors[0];
    assert_eq!(key.name, "theirs");
    assert!(e.starts_with("theirs.yaml:1:1: "), "{e}");
    assert!(e.contains("not managed by linnet"), "{e}");
    assert_eq!(report.pruned, vec![]);
    let left = config_maps.get("theirs").await.unwrap();
    assert_eq!(left.data.unwrap()["v"], "old");
    assert!(left.metadata.labels.is_none());

    // `linnet diff` says the same, located.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args([
            "diff",
            repo.path().to_str().unwrap(),
            "--source-name",
            &ns.name,
        ])
        .args(["--allow-namespace", &ns.name])
        .env("KUBECONFIG", support::admin_kubeconfig())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("theirs.yaml:1:1: exists and is not managed by linnet"),
        "{stderr}"
    );

    // Opted in by annotation: taken over on the next sync.
    config_maps
        .patch(
            "theirs",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"rollouts.linnet.dev/adopt": "true"}}}),
            ),
        )
        .await
        .unwrap();
    let report = syncer.sync(&specs, "rev2", true).await;
    assert_eq!(report.errors, vec![]);
    assert_eq!(names(&report.updated), vec!["ConfigMap/theirs"]);
    assert_eq!(
        config_maps.get("theirs").await.unwrap().data.unwrap()["v"],
        "new"
    );
}

/// A Secret, which the agent may not list but its source may write, left Git: a full sync
/// (after a restart of the drift interval) listed Secrets only where Git still had one, so it
/// never pruned it, and forgot it. The source's account now lists it where it applied one.
#[tokio::test]
async fn a_secret_that_left_git_is_pruned_by_a_full_sync() {
    use k8s_openapi::api::core::v1::Secret;
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "secret-prune").await;
    // The agent's shipped identity, applying as the source's account of the namespace.
    let syncer = as_the_source(&ns.name).await;
    let repo = tempfile::tempdir().unwrap();
    let file = repo.path().join("secret.yaml");
    std::fs::write(
        &file,
        format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: token\n  namespace: {}\nstringData:\n  t: x\n", ns.name),
    )
    .unwrap();
    let report = syncer
        .sync(
            &load_dir(repo.path(), &LoadOptions::default()).unwrap(),
            "rev1",
            true,
        )
        .await;
    assert_eq!(report.errors, vec![]);
    assert_eq!(names(&report.created), vec!["Secret/token"]);

    std::fs::remove_file(&file).unwrap();
    let report = syncer
        .sync(
            &load_dir(repo.path(), &LoadOptions::default()).unwrap(),
            "rev2",
            true,
        )
        .await;
    assert!(report.full);
    assert_eq!(report.errors, vec![]);
    assert_eq!(names(&report.pruned), vec!["Secret/token"]);
    assert!(
        Api::<Secret>::namespaced(admin.clone(), &ns.name)
            .get_opt("token")
            .await
            .unwrap()
            .is_none()
    );
}

/// Events go through one Recorder per bucket of objects (`linnet::events`): an event
/// repeated on one object is still one series, and the same event on objects in other
/// buckets is an event of its own.
#[tokio::test]
async fn a_repeated_event_is_one_series_with_the_recorder_split_in_buckets() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::{Event, EventType, Reporter};

    let client = admin_client().await;
    let ns = TestNamespace::create(&client, "events").await;
    let recorders = linnet::events::EventRecorders::new(
        client.clone(),
        Reporter {
            controller: "linnet".into(),
            instance: None,
        },
    );
    let regarding = |name: &str| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: Some(ns.name.clone()),
        name: Some(name.into()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: "Available".into(),
        note: Some("1 of 1 on redis:7.4".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    // Enough objects that some share a bucket and most do not.
    let names: Vec<String> = (0..300).map(|i| format!("app-{i:03}")).collect();
    for name in &names {
        recorders.publish(&event, &regarding(name)).await.unwrap();
    }
    recorders
        .publish(&event, &regarding("app-007"))
        .await
        .unwrap();
    recorders
        .publish(&event, &regarding("app-007"))
        .await
        .unwrap();

    let events = Api::<K8sEvent>::namespaced(client.clone(), &ns.name)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert_eq!(events.len(), names.len(), "one event per object");
    let about = |name: &str| {
        events
            .iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .unwrap()
    };
    let repeated = about("app-007");
    assert_eq!(
        repeated.series.as_ref().map(|s| s.count),
        Some(3),
        "{repeated:?}"
    );
    assert!(about("app-008").series.is_none());
}

/// Issue 45: a cluster-scoped kind the loader does not know (a CSIDriver then; here a CRD's
/// kind), written with a namespace, passed `validate`, and the sync advised widening the
/// agent's own ClusterRole: only the source's RBAC stopped it. The policy now refuses every
/// kind the cluster serves without namespaces, before anything is read.
#[tokio::test]
async fn an_unknown_cluster_scoped_kind_meets_the_cluster_kind_policy() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "gadget").await;
    let crd: CustomResourceDefinition = support::from_json(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.scope.test.linnet.dev"},
        "spec": {
            "group": "scope.test.linnet.dev",
            "scope": "Cluster",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }));
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    crds.patch(
        "gadgets.scope.test.linnet.dev",
        &PatchParams::apply("linnet-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        WAIT,
        await_condition(
            crds,
            "gadgets.scope.test.linnet.dev",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("CRD never established")
    .unwrap();
    let syncer = as_the_source(&ns.name).await;
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(
        repo.path().join("gadget.yaml"),
        format!(
            "apiVersion: scope.test.linnet.dev/v1\nkind: Gadget\nmetadata:\n  name: g-{ns}\n  namespace: {ns}\n",
            ns = ns.name
        ),
    )
    .unwrap();
    let specs = load_dir(repo.path(), &LoadOptions::default()).unwrap();
    assert_eq!(specs.errors.len(), 0, "offline, the kind is unknown");
    for full in [true, false] {
        let report = if full {
            syncer.sync(&specs, "rev1", true).await
        } else {
            syncer.sync_changes(&specs, "rev2", true).await
        };
        assert_eq!(report.created, vec![]);
        let [(_, e)] = report.errors.as_slice() else {
            panic!("{:?}", report.errors)
        };
        assert!(
            e.starts_with("gadget.yaml:1:1: ")
                && e.contains("--allow-cluster-kind Gadget")
                && e.contains("without namespaces"),
            "{e}"
        );
        assert!(
            !e.contains("deploy/rbac.yaml"),
            "advises widening the agent's rights: {e}"
        );
    }
}

/// Regression (issue 69): a `--repo-path` agent whose specs hold an object the API server
/// refuses re-synced the whole tree about 5 times a second, for ever (173 syncs in 38 s).
/// Refused by validation (422) and by RBAC (403, a kind the agent's account may not write):
/// in 20 s a few tries, each further apart than the last, and each error said once.
#[tokio::test]
async fn a_refused_object_is_retried_with_backoff_not_five_times_a_second() {
    let f = support::rollout::Fixture::start("refused-retry", |ns| {
        support::rollout::small_redis(ns, json!({}))
    })
    .await;
    f.write_file(
        "refused.yaml",
        &[
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "invalid", "namespace": f.ns.name},
                "spec": {"ports": [{"port": 0}]}}),
            json!({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "refused", "namespace": f.ns.name},
                "spec": {"hard": {"pods": "10"}}}),
        ],
    );
    // Over 20 s, never more than 8 tries and 3 warnings; at least 2 tries by the end.
    let agent = f.agent.as_ref().unwrap();
    support::holds_for(
        "a refused object retried with backoff",
        Duration::from_secs(20),
        || async move {
            let log = agent.log_text();
            let (tries, warned) = (
                log.matches("errors=2").count(),
                log.matches(" WARN ").count(),
            );
            match tries <= 8 && warned <= 3 {
                true => Ok(()),
                false => Err(format!("{tries} tries, {warned} warnings:\n{log}")),
            }
        },
    )
    .await;
    let log = agent.log_text();
    let tries = log.matches("errors=2").count();
    assert!(
        (2..=8).contains(&tries),
        "{tries} tries in 20 s of a refused object:\n{log}"
    );
    // Said once, not at every try.
    let warned = log.matches(" WARN ").count();
    assert_eq!(
        warned, 3,
        "one warning per object and one for the loop:\n{log}"
    );
    for object in ["Service", "ResourceQuota"] {
        assert!(
            log.lines()
                .any(|l| l.contains("object not applied") && l.contains(object)),
            "{object} is named:\n{log}"
        );
    }
}

/// Issue 72: the kinds `validate` takes as Kubernetes 1.36's are exactly what the test
/// control plane's API server (1.36) serves, less the groups of its CRDs.
#[tokio::test]
async fn the_built_in_kinds_validate_knows_are_what_the_api_server_serves() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let admin = admin_client().await;
    let crd_groups: std::collections::BTreeSet<String> =
        Api::<CustomResourceDefinition>::all(admin.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|c| c.spec.group)
            .collect();
    let discovery = kube::Discovery::new(admin.clone()).run().await.unwrap();
    let mut served = std::collections::BTreeSet::new();
    for group in discovery.groups() {
        if crd_groups.contains(group.name()) {
            continue;
        }
        for version in group.versions() {
            for (resource, _) in group.versioned_resources(version) {
                served.insert((resource.api_version.clone(), resource.kind.clone()));
            }
        }
    }
    let known: std::collections::BTreeSet<(String, String)> = linnet::specs::kinds::BUILT_IN_KINDS
        .iter()
        .map(|(v, k)| (v.to_string(), k.to_string()))
        .collect();
    assert_eq!(
        known.difference(&served).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "known but not served"
    );
    assert_eq!(
        served.difference(&known).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "served but not known: add them to src/specs/kinds.rs"
    );
}
