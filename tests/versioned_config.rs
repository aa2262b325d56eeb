//! Config that rides with the canary (issue 50, `versionedConfig`) end to end: a real bare
//! repository, the agent binary and the real control plane. One commit changes an image and
//! the ConfigMap and Secret its pods read: only the canary's pods mount copies of the new
//! ones (read from the pods' volumes), the rollback leaves the stable pods as they were, the
//! revert commit puts back image and config, and copies no pod mounts any more go.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use linnet::api::{
    CanaryDeployment, CanaryStatefulSet, DeploymentPhase, ROLLOUT_LABEL, StatefulSetPhase,
};
use support::agent::{start_writing_agent, wait_ready};
use support::{TestNamespace, admin_client, git, install_linnet};

const PASSWORD: &str = "s3cr3t-never-logged";

fn config(maxmemory: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\n  namespace: NS\ndata:\n  maxmemory: \"{maxmemory}\"\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: app-auth\n  namespace: NS\nstringData:\n  password: {PASSWORD}-{maxmemory}\n"
    )
}

/// The template's config: a ConfigMap volume and a Secret in the environment.
const MOUNTS: &str = "          envFrom:\n          - secretRef:\n              name: app-auth\n          volumeMounts:\n          - name: config\n            mountPath: /etc/app\n";
const VOLUMES: &str = "        volumes:\n        - name: config\n          configMap:\n            name: app-config\n";

/// The example's `web` with `versionedConfig` (and `more` spec lines), mounting `app-config`
/// and taking its environment from Secret `app-auth`.
fn web_with_versioned_config(work: &Path, more: &str) {
    let web = work.join("apps/web/web.yaml");
    let text = std::fs::read_to_string(&web)
        .unwrap()
        .replacen(
            "  currentBatch: 1\n",
            &format!("  currentBatch: 1\n  versionedConfig: true\n{more}"),
            1,
        )
        .replacen(
            "          - containerPort: 80\n",
            &format!("          - containerPort: 80\n{MOUNTS}{VOLUMES}"),
            1,
        );
    std::fs::write(&web, text).unwrap();
}

fn write(work: &Path, path: &str, text: &str, ns: &str) {
    std::fs::write(work.join(path), text.replace("NS", ns)).unwrap();
}

fn push(work: &Path, message: &str) {
    git(work, &["add", "-A"]);
    git(work, &["commit", "-qm", message]);
    // linnet's revert commits land on main too.
    if !git(work, &["ls-remote", "origin", "main"]).is_empty() {
        git(work, &["pull", "-q", "--rebase", "origin", "main"]);
    }
    git(work, &["push", "-q", "origin", "HEAD:main"]);
}

/// The ConfigMap and Secret names each pod of `rollout` reads, by the pod's image.
async fn mounted_by_image(
    admin: &kube::Client,
    ns: &str,
    rollout: &str,
) -> BTreeMap<String, BTreeSet<String>> {
    let pods = Api::<Pod>::namespaced(admin.clone(), ns)
        .list(&ListParams::default().labels(&format!("{ROLLOUT_LABEL}={rollout}")))
        .await
        .unwrap();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for pod in pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let spec = pod.spec.as_ref().unwrap();
        let image = spec.containers[0].image.clone().unwrap();
        // Not the API server's CA, which every pod's token volume names.
        let names = linnet::plan::config::references(spec)
            .into_iter()
            .map(|(_, n)| n)
            .filter(|n| n != "kube-root-ca.crt");
        out.entry(image).or_default().extend(names);
    }
    out
}

async fn wait_mounted(
    admin: &kube::Client,
    ns: &str,
    rollout: &str,
    what: &str,
    done: impl Fn(&BTreeMap<String, BTreeSet<String>>) -> bool,
) -> BTreeMap<String, BTreeSet<String>> {
    support::eventually(what, Duration::from_secs(90), || async {
        let m = mounted_by_image(admin, ns, rollout).await;
        done(&m).then_some(m)
    })
    .await
}

/// The one copy of `name` in `names` (`<name>-<hash>`).
fn copy_of<'a>(names: &'a BTreeSet<String>, name: &str) -> &'a str {
    let copies: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with(&format!("{name}-")) && n.len() == name.len() + 11)
        .collect();
    assert_eq!(copies.len(), 1, "{name} in {names:?}");
    copies[0]
}

#[tokio::test]
async fn a_canary_mounts_its_own_config_and_the_revert_puts_back_image_and_config() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "vconfig").await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    support::commit_example(&work, &ns.name);
    web_with_versioned_config(&work, "  onFailure:\n    revert: commit\n");
    write(&work, "apps/web/config.yaml", &config("1gb"), &ns.name);
    push(&work, "web with its config");
    let first = start_writing_agent(&tmp.path().join("agent"), &bare, &ns.name);
    wait_ready(&first).await;
    let deployments = Api::<CanaryDeployment>::namespaced(admin.clone(), &ns.name);
    let wait_web = |what: &'static str, done: fn(&CanaryDeployment) -> bool| {
        let api = deployments.clone();
        async move {
            support::eventually(what, Duration::from_secs(120), || async {
                api.get_opt("web").await.unwrap().filter(done)
            })
            .await
        }
    };
    wait_web("web Completed on 1.27", |r| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Completed)
    })
    .await;
    let settled = wait_mounted(&admin, &ns.name, "web", "4 pods on copies", |m| {
        m.len() == 1 && m.values().all(|n| n.len() == 2)
    })
    .await;
    let old = &settled["nginx:1.27"];
    let (old_config, old_auth) = (
        copy_of(old, "app-config").to_string(),
        copy_of(old, "app-auth").to_string(),
    );
    // The copies: the content of Git's, immutable, the rollout's (not the source's).
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), &ns.name);
    let secrets = Api::<Secret>::namespaced(admin.clone(), &ns.name);
    let copy = configmaps.get(&old_config).await.unwrap();
    assert_eq!(copy.immutable, Some(true));
    assert_eq!(copy.data.as_ref().unwrap()["maxmemory"], "1gb");
    assert_eq!(copy.owner_references()[0].kind, "CanaryDeployment");
    assert!(!copy.labels().contains_key(linnet::api::SOURCE_LABEL));
    let auth = secrets.get(&old_auth).await.unwrap();
    assert_eq!(
        auth.data.as_ref().unwrap()["password"].0,
        format!("{PASSWORD}-1gb").into_bytes()
    );

    // One commit: a new image and a new config.
    let web = work.join("apps/web/web.yaml");
    std::fs::write(
        &web,
        std::fs::read_to_string(&web)
            .unwrap()
            .replace("nginx:1.27", "nginx:1.28"),
    )
    .unwrap();
    write(&work, "apps/web/config.yaml", &config("0"), &ns.name);
    push(&work, "web 1.28 with maxmemory 0");
    assert_eq!(first.push_webhook().await, 202);
    wait_web("web Paused after batch 1", |r| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Paused)
    })
    .await;
    // The rollout is applied before its config: the canary may start on the old one, and is
    // moved onto the new one once it is there.
    let canary = wait_mounted(&admin, &ns.name, "web", "3 old and 1 new pod", |m| {
        m.len() == 2
            && m.get("nginx:1.28")
                .is_some_and(|n| n.len() == 2 && n.is_disjoint(old))
    })
    .await;
    assert_eq!(
        canary["nginx:1.27"], *old,
        "the stable pods keep their config"
    );
    let new = &canary["nginx:1.28"];
    let new_config = copy_of(new, "app-config").to_string();
    assert_ne!(new_config, old_config);
    assert_ne!(copy_of(new, "app-auth"), old_auth);
    let new_copy = configmaps.get(&new_config).await.unwrap();
    assert_eq!(new_copy.data.as_ref().unwrap()["maxmemory"], "0");
    // Git's own ConfigMap is the new one; the old copy still holds the old content.
    let gits = configmaps.get("app-config").await.unwrap();
    assert_eq!(gits.data.as_ref().unwrap()["maxmemory"], "0");
    assert_eq!(
        configmaps.get(&old_config).await.unwrap().data.unwrap()["maxmemory"],
        "1gb"
    );
    // Batch 1 scales the old version from 4 to 3 once the new pod is available.
    let pods = Api::<Pod>::namespaced(admin.clone(), &ns.name);
    let stable_pods: BTreeSet<String> =
        support::eventually("3 stable pods", Duration::from_secs(60), || async {
            let uids: BTreeSet<String> = pods
                .list(&ListParams::default().labels(&format!("{ROLLOUT_LABEL}=web")))
                .await
                .unwrap()
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("nginx:1.27")
                })
                .filter_map(|p| p.uid())
                .collect();
            (uids.len() == 3).then_some(uids)
        })
        .await;

    // The new config breaks it, a person aborts from Git: rolled back, and linnet's revert
    // commit puts back the image and the config (they came in one commit).
    std::fs::write(
        &web,
        std::fs::read_to_string(&web).unwrap().replacen(
            "  name: web\n",
            "  name: web\n  annotations:\n    rollouts.linnet.dev/abort: \"true\"\n",
            1,
        ),
    )
    .unwrap();
    push(&work, "abort web 1.28");
    assert_eq!(first.push_webhook().await, 202);
    wait_web("web RolledBack", |r| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::RolledBack)
    })
    .await;
    let back = wait_mounted(
        &admin,
        &ns.name,
        "web",
        "every pod on the old config",
        |m| m.len() == 1 && m.contains_key("nginx:1.27"),
    )
    .await;
    assert_eq!(back["nginx:1.27"], *old);
    let still: BTreeSet<String> = Api::<Pod>::namespaced(admin.clone(), &ns.name)
        .list(&ListParams::default().labels(&format!("{ROLLOUT_LABEL}=web")))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    assert!(
        stable_pods.is_subset(&still),
        "the rollback left the stable pods running"
    );
    support::eventually("the revert commit", Duration::from_secs(60), || {
        let subject = git(&bare, &["log", "-1", "--format=%an %s", "main"]);
        async move { subject.starts_with("linnet").then_some(()) }
    })
    .await;
    let reverted = support::show_on(&bare, "main", "apps/web/config.yaml").unwrap();
    assert_eq!(
        reverted.trim_end(),
        config("1gb").replace("NS", &ns.name).trim_end()
    );
    let spec = support::show_on(&bare, "main", "apps/web/web.yaml").unwrap();
    assert!(
        spec.contains("image: nginx:1.27") && !spec.contains("nginx:1.28"),
        "{spec}"
    );

    // Synced: Completed on the old image, the old copies (same content, same names), and the
    // new ones collected.
    assert_eq!(first.push_webhook().await, 202);
    wait_web("web Completed on 1.27 again", |r| {
        r.status.as_ref().is_some_and(|s| {
            s.phase == Some(DeploymentPhase::Completed)
                && s.stable_image.as_deref() == Some("nginx:1.27")
        })
    })
    .await;
    assert_eq!(
        mounted_by_image(&admin, &ns.name, "web").await["nginx:1.27"],
        *old
    );
    support::eventually(
        "the new copy collected",
        Duration::from_secs(60),
        || async {
            configmaps
                .get_opt(&new_config)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(configmaps.get_opt(&old_config).await.unwrap().is_some());
    // A Secret's data is copied, never logged.
    assert!(
        !first.log_text().contains(PASSWORD),
        "a secret's value in the log"
    );
}

#[tokio::test]
async fn a_statefulset_canary_mounts_its_own_config_and_a_config_change_alone_rolls_every_pod() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "vconfig-sts").await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    support::commit_example(&work, &ns.name);
    let redis = work.join("apps/redis/redis.yaml");
    let text = std::fs::read_to_string(&redis)
        .unwrap()
        .replacen(
            "  canaryReplicas: 1\n",
            "  canaryReplicas: 1\n  versionedConfig: true\n",
            1,
        )
        .replacen(
            "          volumeMounts:\n",
            "          envFrom:\n          - secretRef:\n              name: app-auth\n          volumeMounts:\n          - name: config\n            mountPath: /etc/app\n",
            1,
        )
        .replacen("    volumeClaimTemplates:\n", &format!("{VOLUMES}    volumeClaimTemplates:\n"), 1);
    std::fs::write(&redis, text).unwrap();
    write(&work, "apps/redis/config.yaml", &config("1gb"), &ns.name);
    push(&work, "redis with its config");
    let first = start_writing_agent(&tmp.path().join("agent"), &bare, &ns.name);
    wait_ready(&first).await;
    let api = Api::<CanaryStatefulSet>::namespaced(admin.clone(), &ns.name);
    let wait_redis = |what: &'static str, done: fn(&CanaryStatefulSet) -> bool| {
        let api = api.clone();
        async move {
            support::eventually(what, Duration::from_secs(120), || async {
                api.get_opt("redis").await.unwrap().filter(done)
            })
            .await
        }
    };
    wait_redis("redis Stable", |r| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::Stable)
    })
    .await;
    let old = wait_mounted(&admin, &ns.name, "redis", "3 pods on copies", |m| {
        m.get("redis:7.2").is_some_and(|n| n.len() == 2)
    })
    .await["redis:7.2"]
        .clone();
    assert!(
        !old.contains("app-config") && !old.contains("app-auth"),
        "{old:?}"
    );

    std::fs::write(
        &redis,
        std::fs::read_to_string(&redis)
            .unwrap()
            .replace("redis:7.2", "redis:7.4"),
    )
    .unwrap();
    write(&work, "apps/redis/config.yaml", &config("0"), &ns.name);
    push(&work, "redis 7.4 with maxmemory 0");
    assert_eq!(first.push_webhook().await, 202);
    wait_redis("redis CanaryActive", |r| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::CanaryActive)
    })
    .await;
    let canary = wait_mounted(
        &admin,
        &ns.name,
        "redis",
        "2 stable and 1 canary pod",
        |m| {
            m.len() == 2
                && m.get("redis:7.4")
                    .is_some_and(|n| n.len() == 2 && n.is_disjoint(&old))
        },
    )
    .await;
    assert_eq!(
        canary["redis:7.2"], old,
        "the stable pods keep their config"
    );
    let new = canary["redis:7.4"].clone();
    assert!(new.is_disjoint(&old), "{new:?} {old:?}");

    // Promoted from Git: every pod on the new copies, the old ones collected.
    std::fs::write(
        &redis,
        std::fs::read_to_string(&redis).unwrap().replacen(
            "  name: redis\n",
            "  name: redis\n  annotations:\n    rollouts.linnet.dev/promote: \"true\"\n",
            1,
        ),
    )
    .unwrap();
    push(&work, "promote redis 7.4");
    assert_eq!(first.push_webhook().await, 202);
    wait_redis("redis Stable on 7.4", |r| {
        r.status.as_ref().is_some_and(|s| {
            s.phase == Some(StatefulSetPhase::Stable)
                && s.stable_image.as_deref() == Some("redis:7.4")
        })
    })
    .await;
    wait_mounted(
        &admin,
        &ns.name,
        "redis",
        "every pod on the new config",
        |m| m.len() == 1 && m.get("redis:7.4") == Some(&new),
    )
    .await;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), &ns.name);
    let old_config = copy_of(&old, "app-config").to_string();
    support::eventually(
        "the old copy collected",
        Duration::from_secs(60),
        || async {
            configmaps
                .get_opt(&old_config)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;

    // A config change alone (no new image): the ConfigMap's watch wakes the rollout, and
    // every pod rolls onto the new copy; no canary.
    write(&work, "apps/redis/config.yaml", &config("2gb"), &ns.name);
    push(&work, "maxmemory 2gb");
    assert_eq!(first.push_webhook().await, 202);
    let rolled = wait_mounted(
        &admin,
        &ns.name,
        "redis",
        "every pod on the 2gb copy",
        |m| {
            m.len() == 1
                && m.get("redis:7.4")
                    .is_some_and(|n| n.len() == 2 && n.is_disjoint(&new))
        },
    )
    .await;
    let newest = copy_of(&rolled["redis:7.4"], "app-config").to_string();
    assert_eq!(
        configmaps.get(&newest).await.unwrap().data.unwrap()["maxmemory"],
        "2gb"
    );
    let r = api.get("redis").await.unwrap();
    assert_eq!(r.status.unwrap().phase, Some(StatefulSetPhase::Stable));
    assert!(
        !first.log_text().contains(PASSWORD),
        "a secret's value in the log"
    );
}

/// A ConfigMap someone else made under the name a copy would have is never mounted in its
/// place: the rollout stops with a message that names it.
#[tokio::test]
async fn an_object_that_is_not_the_rollouts_copy_is_never_mounted() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "vconfig-taken").await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    support::commit_example(&work, &ns.name);
    web_with_versioned_config(&work, "");
    write(&work, "apps/web/config.yaml", &config("1gb"), &ns.name);
    push(&work, "web with its config");
    // The name web's copy of app-config will have, taken by another ConfigMap.
    let gits = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("app-config".into()),
            ..Default::default()
        },
        data: Some([("maxmemory".to_string(), "1gb".to_string())].into()),
        ..Default::default()
    };
    let taken = linnet::plan::config::config_map_copy_name("web", &gits);
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), &ns.name);
    let squatter = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(taken.clone()),
            ..Default::default()
        },
        data: Some([("maxmemory".to_string(), "hostile".to_string())].into()),
        ..Default::default()
    };
    configmaps
        .create(&Default::default(), &squatter)
        .await
        .unwrap();
    let first = start_writing_agent(&tmp.path().join("agent"), &bare, &ns.name);
    wait_ready(&first).await;
    let refusal = format!("{}/{taken} exists and is not web's config copy", ns.name);
    support::eventually("the refusal in the log", Duration::from_secs(60), || {
        let found = first.log_text().contains(&refusal);
        async move { found.then_some(()) }
    })
    .await;
    let mounted = mounted_by_image(&admin, &ns.name, "web").await;
    assert!(
        mounted.values().all(|names| !names.contains(&taken)),
        "{mounted:?}"
    );
    // Left as it was.
    assert_eq!(
        configmaps.get(&taken).await.unwrap().data.unwrap()["maxmemory"],
        "hostile"
    );
}

/// Regression (issue 70): a Secret copy the source's account may not read advised granting
/// linnet's own ClusterRole, which must never read Secrets. The account here may not read
/// Secrets (a Role like `linnet-source` without them): the copy is refused, the rollout's
/// pods do not mount a copy, and the advice names the source's account.
#[tokio::test]
async fn a_secret_the_source_may_not_read_is_not_copied_and_the_advice_names_its_account() {
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "vconfig-secret").await;
    let account = support::SOURCE_ACCOUNT;
    let binding = format!("linnet-source-{account}");
    Api::<RoleBinding>::namespaced(admin.clone(), &ns.name)
        .delete(&binding, &Default::default())
        .await
        .unwrap();
    let all = [
        "get", "list", "watch", "create", "patch", "update", "delete",
    ];
    let role: Role = support::from_json(serde_json::json!({
        "metadata": {"name": "source-without-secrets"},
        "rules": [
            {"apiGroups": ["rollouts.linnet.dev"], "resources": ["canarystatefulsets", "canarydeployments", "analysistemplates"], "verbs": all},
            {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": all},
            {"apiGroups": [""], "resources": ["services", "configmaps", "serviceaccounts", "persistentvolumeclaims"], "verbs": all},
        ],
    }));
    Api::<Role>::namespaced(admin.clone(), &ns.name)
        .create(&Default::default(), &role)
        .await
        .unwrap();
    let bound: RoleBinding = support::from_json(serde_json::json!({
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "source-without-secrets"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns.name}],
    }));
    Api::<RoleBinding>::namespaced(admin.clone(), &ns.name)
        .create(&Default::default(), &bound)
        .await
        .unwrap();
    // The Secret is the cluster's, not Git's: the source could not apply it either.
    let secret: Secret = support::from_json(serde_json::json!({
        "metadata": {"name": "app-auth"},
        "stringData": {"password": "theirs"},
    }));
    Api::<Secret>::namespaced(admin.clone(), &ns.name)
        .create(&Default::default(), &secret)
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    support::commit_example(&work, &ns.name);
    web_with_versioned_config(&work, "");
    let config_only = config("1gb");
    let config_only = &config_only[..config_only.find("---").unwrap()];
    write(&work, "apps/web/config.yaml", config_only, &ns.name);
    push(&work, "web with its config");
    let agent = start_writing_agent(&tmp.path().join("agent"), &bare, &ns.name);
    wait_ready(&agent).await;
    let advice = support::eventually(
        "the refused copy, with its advice",
        Duration::from_secs(60),
        || {
            let log = agent.log_text();
            async move {
                log.lines()
                    .find(|l| {
                        l.contains("app-auth") && l.contains("the source's account may not do this")
                    })
                    .map(String::from)
            }
        },
    )
    .await;
    assert!(
        advice.contains("Do not widen linnet's own ClusterRole")
            && !advice.contains("grant it in deploy/rbac.yaml"),
        "{advice}"
    );
    let secrets = Api::<Secret>::namespaced(admin.clone(), &ns.name);
    let names: Vec<String> = secrets
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(names, ["app-auth"], "a copy was made");
}
