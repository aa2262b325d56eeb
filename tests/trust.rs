//! The repository's trust boundary (issue 19), on the local control plane, with the agent
//! running as the shipped identity (`deploy/rbac.yaml`) and applying Git's objects as the
//! source's account: a hostile commit changes nothing it may not change, each refusal is a
//! located error, and the legitimate files of the same commit still sync. With a policy and
//! grants that allow it, the same objects apply, and prune later.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use linnet::agent::SourceStatus;
use serde_json::json;
use support::agent::{Agent, start_agent, wait_ready};
use support::{TestNamespace, admin_client, eventually, from_json, grant_source, install_linnet};

/// The hostile commit's targets, named after the test's namespace so parallel runs differ.
struct Targets {
    /// Where the legitimate files go.
    tenant: TestNamespace,
    /// Holds an unlabelled ConfigMap and a Lease; the source may write ConfigMaps here.
    other: TestNamespace,
    /// The source has no rights here at all.
    victim: TestNamespace,
    /// A PersistentVolume bound to a claim in `victim`.
    pv: String,
    /// Names of the objects in `kube-system` and of the cluster-scoped ones.
    pwn: String,
}

/// Deletes what an allowed run may have made outside the test's namespaces, also when the
/// test fails.
struct Leftovers(String, String);

impl Drop for Leftovers {
    fn drop(&mut self) {
        let (pwn, pv) = (self.0.clone(), self.1.clone());
        support::clean_up(|admin| async move {
            let dp = DeleteParams::background();
            let _ = Api::<Deployment>::namespaced(admin.clone(), "kube-system")
                .delete(&pwn, &dp)
                .await;
            let _ = Api::<RoleBinding>::namespaced(admin.clone(), "kube-system")
                .delete(&format!("{pwn}-source"), &dp)
                .await;
            for crb in [pwn.clone(), format!("{pwn}-ops")] {
                let _ = Api::<ClusterRoleBinding>::all(admin.clone())
                    .delete(&crb, &dp)
                    .await;
            }
            let _ = Api::<Namespace>::all(admin.clone())
                .delete(&format!("{pwn}-made"), &dp)
                .await;
            let _ = Api::<PersistentVolume>::all(admin).delete(&pv, &dp).await;
        });
    }
}

async fn targets(admin: &Client, prefix: &str) -> Targets {
    let tenant = TestNamespace::create(admin, prefix).await;
    let other = TestNamespace::create(admin, &format!("{prefix}-o")).await;
    let victim = TestNamespace::create(admin, &format!("{prefix}-v")).await;
    // The victim namespace never granted the source anything.
    Api::<RoleBinding>::namespaced(admin.clone(), &victim.name)
        .delete(
            &format!("linnet-source-{}", support::SOURCE_ACCOUNT),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    let cm: ConfigMap =
        from_json(json!({"metadata": {"name": "settings"}, "data": {"v": "theirs"}}));
    Api::<ConfigMap>::namespaced(admin.clone(), &other.name)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let lease: Lease = from_json(json!({"metadata": {"name": "leader"},
        "spec": {"holderIdentity": "theirs"}}));
    Api::<Lease>::namespaced(admin.clone(), &other.name)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let pv_name = format!("{}-pv", tenant.name);
    let pv: PersistentVolume = from_json(json!({"metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "trust-manual",
            "hostPath": {"path": "/tmp/trust"},
            "claimRef": {"namespace": victim.name, "name": "data"}}}));
    Api::<PersistentVolume>::all(admin.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    let pwn = tenant.name.clone();
    Targets {
        tenant,
        other,
        victim,
        pv: pv_name,
        pwn,
    }
}

/// The commit: one hostile object per file, and two legitimate files.
fn write_repository(dir: &Path, t: &Targets) {
    let files = [
        (
            "pwn-deployment.yaml",
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {pwn}\n  namespace: kube-system\nspec:\n  selector: {{matchLabels: {{app: pwn}}}}\n  template:\n    metadata: {{labels: {{app: pwn}}}}\n    spec:\n      serviceAccountName: generic-garbage-collector\n      hostNetwork: true\n      containers:\n      - name: c\n        image: busybox\n        securityContext: {{privileged: true}}\n        volumeMounts: [{{name: root, mountPath: /host}}]\n      volumes: [{{name: root, hostPath: {{path: /}}}}]\n",
                pwn = t.pwn
            ),
        ),
        (
            "cluster-admin.yaml",
            format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}\nsubjects: [{{kind: User, name: attacker, apiGroup: rbac.authorization.k8s.io}}]\n",
                t.pwn
            ),
        ),
        (
            "settings.yaml",
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: {}\ndata:\n  v: attacker\n",
                t.other.name
            ),
        ),
        (
            "lease.yaml",
            format!(
                "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: leader\n  namespace: {}\nspec:\n  holderIdentity: attacker\n",
                t.other.name
            ),
        ),
        (
            "pv.yaml",
            format!(
                "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {}\nspec:\n  persistentVolumeReclaimPolicy: Delete\n  claimRef: {{namespace: {}, name: loot}}\n",
                t.pv, t.tenant.name
            ),
        ),
        (
            "namespace.yaml",
            format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}-made\n  labels: {{linnet.dev/test: \"true\"}}\n",
                t.pwn
            ),
        ),
        (
            "secret.yaml",
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: planted\n  namespace: {}\nstringData:\n  token: attacker\n",
                t.victim.name
            ),
        ),
        (
            "app/config.yaml",
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\n  namespace: {}\ndata:\n  mode: fast\n",
                t.tenant.name
            ),
        ),
        (
            "app/service.yaml",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: app\n  namespace: {}\nspec:\n  selector: {{app: app}}\n  ports: [{{port: 80}}]\n",
                t.tenant.name
            ),
        ),
    ];
    for (file, text) in files {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

/// Writes the commit into a directory and starts the agent on it (`--repo-path`, every
/// namespace allowed unless denied, pruning on) with `flags`, as the shipped identity.
async fn follow_the_commit(
    t: &Targets,
    flags: &[String],
) -> (tempfile::TempDir, tempfile::TempDir, Agent) {
    let repo = tempfile::tempdir().unwrap();
    write_repository(repo.path(), t);
    let scratch = tempfile::tempdir().unwrap();
    let mut args = vec![
        format!("--repo-path={}", repo.path().display()),
        "--allow-namespace=".into(),
        "--prune".into(),
    ];
    args.extend_from_slice(flags);
    let agent = start_agent(scratch.path(), &args, &t.tenant.name);
    wait_ready(&agent).await;
    (repo, scratch, agent)
}

async fn source_status(agent: &Agent) -> SourceStatus {
    support::from_json(agent.status().await)
}

/// The errors `/status` reports, spec and sync errors together.
fn all_errors(s: &SourceStatus) -> Vec<String> {
    s.spec_errors
        .iter()
        .chain(&s.sync_errors)
        .cloned()
        .collect()
}

/// Whether any error of `errors` starts at `file` (`file:line:column: ...`) and says `says`.
fn has_error(errors: &[String], file: &str, says: &str) -> bool {
    errors.iter().any(|e| {
        let located = e
            .split_once(": ")
            .map(|(_, rest)| rest)
            .unwrap_or(e)
            .starts_with(&format!("{file}:"))
            || e.starts_with(&format!("{file}:"));
        located && e.contains(says)
    })
}

async fn pv_state(admin: &Client, name: &str) -> (String, String, Option<String>) {
    let pv = Api::<PersistentVolume>::all(admin.clone())
        .get(name)
        .await
        .unwrap();
    let spec = pv.spec.unwrap();
    let claim = spec.claim_ref.unwrap();
    (
        spec.persistent_volume_reclaim_policy.unwrap_or_default(),
        format!(
            "{}/{}",
            claim.namespace.unwrap_or_default(),
            claim.name.unwrap_or_default()
        ),
        pv.metadata
            .labels
            .and_then(|l| l.get("rollouts.linnet.dev/rollout").cloned()),
    )
}

#[tokio::test]
async fn a_hostile_commit_changes_nothing_and_its_legitimate_files_still_sync() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let t = targets(&admin, "trust").await;
    let _leftovers = Leftovers(t.pwn.clone(), t.pv.clone());
    let pv_before = pv_state(&admin, &t.pv).await;
    // The default policy, no namespace allow-list, the shipped source account (linnet-default
    // in each namespace), pruning on. The source name is the test's own: a live agent (the
    // install test's) may hold "default", and a second agent with it refuses to start.
    let (repo, _scratch, agent) = follow_the_commit(
        &t,
        &[
            format!("--source-name={}", t.tenant.name),
            format!("--apply-as={}", support::SOURCE_ACCOUNT),
        ],
    )
    .await;

    // The legitimate files sync.
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &t.tenant.name);
    eventually(
        "the legitimate ConfigMap",
        Duration::from_secs(30),
        || async { config_maps.get_opt("app-config").await.unwrap().map(|_| ()) },
    )
    .await;
    let status = {
        let mut found = None;
        for _ in 0..100 {
            let s = source_status(&agent).await;
            if s.sync_errors.len() >= 3 {
                found = Some(s);
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        found.unwrap_or_else(|| panic!("no sync errors; agent log:\n{}", agent.log_text()))
    };
    let errors = all_errors(&status);
    for (file, says) in [
        ("pwn-deployment.yaml:5:3", "closed to this source"),
        ("cluster-admin.yaml:2:1", "cluster-scoped"),
        ("namespace.yaml:2:1", "cluster-scoped"),
        ("pv.yaml:2:1", "never applied from Git"),
        ("settings.yaml:1:1", "not managed by linnet"),
        ("lease.yaml:1:1", "not managed by linnet"),
        ("secret.yaml:1:1", "system:serviceaccount:"),
    ] {
        assert!(
            has_error(&errors, file, says),
            "no error at {file} saying {says:?}: {errors:#?}"
        );
    }
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .expect("a Degraded condition");
    assert_eq!(degraded.status, "True", "{degraded:?}");

    // Nothing in the cluster changed.
    assert!(
        Api::<Deployment>::namespaced(admin.clone(), "kube-system")
            .get_opt(&t.pwn)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ClusterRoleBinding>::all(admin.clone())
            .get_opt(&t.pwn)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Namespace>::all(admin.clone())
            .get_opt(&format!("{}-made", t.pwn))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Secret>::namespaced(admin.clone(), &t.victim.name)
            .get_opt("planted")
            .await
            .unwrap()
            .is_none()
    );
    let settings = Api::<ConfigMap>::namespaced(admin.clone(), &t.other.name)
        .get("settings")
        .await
        .unwrap();
    assert_eq!(settings.data.unwrap()["v"], "theirs");
    assert!(
        settings.metadata.labels.is_none(),
        "the ConfigMap was labelled"
    );
    let lease = Api::<Lease>::namespaced(admin.clone(), &t.other.name)
        .get("leader")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("theirs")
    );
    assert_eq!(pv_state(&admin, &t.pv).await, pv_before, "the PV changed");

    // `linnet validate` with the same flags finds the policy errors offline.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["validate", repo.path().to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    for at in [
        "pwn-deployment.yaml:5:3:",
        "cluster-admin.yaml:2:1:",
        "namespace.yaml:2:1:",
        "pv.yaml:2:1:",
    ] {
        assert!(
            stdout.contains(at),
            "validate does not report {at}:\n{stdout}"
        );
    }
}

#[tokio::test]
async fn with_a_policy_and_grants_that_allow_it_the_same_commit_applies_and_prunes() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let t = targets(&admin, "trusted").await;
    let _leftovers = Leftovers(t.pwn.clone(), t.pv.clone());
    let ops = TestNamespace::create(&admin, "trusted-ops").await;
    let pv_before = pv_state(&admin, &t.pv).await;
    let account = support::SOURCE_ACCOUNT;
    let params = PatchParams::apply("linnet-tests").force();
    // A cluster admin's grants: the source may deploy to kube-system and to the victim
    // namespace, write Leases in `other`, and make cluster-scoped objects (its account in
    // the agent's namespace, `ops`, is a cluster admin).
    let kube_system_grant: RoleBinding = from_json(json!({
        "metadata": {"name": format!("{}-source", t.pwn), "namespace": "kube-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "linnet-source"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}],
    }));
    Api::<RoleBinding>::namespaced(admin.clone(), "kube-system")
        .patch(
            &format!("{}-source", t.pwn),
            &params,
            &Patch::Apply(&kube_system_grant),
        )
        .await
        .unwrap();
    grant_source(&admin, &t.victim.name, account).await;
    let leases: Role = from_json(
        json!({"metadata": {"name": "leases", "namespace": t.other.name},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "list", "create", "patch", "update", "delete"]}]}),
    );
    Api::<Role>::namespaced(admin.clone(), &t.other.name)
        .patch("leases", &params, &Patch::Apply(&leases))
        .await
        .unwrap();
    let lease_grant: RoleBinding = from_json(json!({
        "metadata": {"name": "leases", "namespace": t.other.name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leases"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": t.other.name}],
    }));
    Api::<RoleBinding>::namespaced(admin.clone(), &t.other.name)
        .patch("leases", &params, &Patch::Apply(&lease_grant))
        .await
        .unwrap();
    let cluster_grant: ClusterRoleBinding = from_json(json!({
        "metadata": {"name": format!("{}-ops", t.pwn)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ops.name}],
    }));
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(
            &format!("{}-ops", t.pwn),
            &params,
            &Patch::Apply(&cluster_grant),
        )
        .await
        .unwrap();

    let (repo, _scratch, agent) = follow_the_commit(
        &t,
        &[
            "--deny-namespace=".into(),
            "--allow-cluster-kind=ClusterRoleBinding,Namespace".into(),
            "--adopt".into(),
            format!("--agent-namespace={}", ops.name),
            format!("--source-name={}", t.tenant.name),
            format!("--apply-as={account}"),
        ],
    )
    .await;

    let deployments = Api::<Deployment>::namespaced(admin.clone(), "kube-system");
    let bindings = Api::<ClusterRoleBinding>::all(admin.clone());
    let namespaces = Api::<Namespace>::all(admin.clone());
    let secrets = Api::<Secret>::namespaced(admin.clone(), &t.victim.name);
    let settings = Api::<ConfigMap>::namespaced(admin.clone(), &t.other.name);
    let lease = Api::<Lease>::namespaced(admin.clone(), &t.other.name);
    let made = format!("{}-made", t.pwn);
    eventually(
        "every allowed object applied",
        Duration::from_secs(60),
        || async {
            let applied = deployments.get_opt(&t.pwn).await.unwrap().is_some()
                && bindings.get_opt(&t.pwn).await.unwrap().is_some()
                && namespaces.get_opt(&made).await.unwrap().is_some()
                && secrets.get_opt("planted").await.unwrap().is_some()
                && settings.get("settings").await.unwrap().data.unwrap()["v"] == "attacker"
                && lease
                    .get("leader")
                    .await
                    .unwrap()
                    .spec
                    .unwrap()
                    .holder_identity
                    .as_deref()
                    == Some("attacker");
            applied.then_some(())
        },
    )
    .await;
    // Only the PersistentVolume is still refused: never from Git, whatever the policy.
    let errors = all_errors(&source_status(&agent).await);
    assert!(
        has_error(&errors, "pv.yaml:2:1", "never applied from Git"),
        "{errors:#?}"
    );
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(pv_state(&admin, &t.pv).await, pv_before, "the PV changed");

    // Removed from Git: pruned, the adopted objects too (they are linnet's now).
    for file in [
        "pwn-deployment.yaml",
        "cluster-admin.yaml",
        "namespace.yaml",
        "secret.yaml",
        "settings.yaml",
        "lease.yaml",
    ] {
        std::fs::remove_file(repo.path().join(file)).unwrap();
    }
    eventually(
        "every removed object pruned",
        Duration::from_secs(60),
        || async {
            let pruned = deployments.get_opt(&t.pwn).await.unwrap().is_none()
                && bindings.get_opt(&t.pwn).await.unwrap().is_none()
                && namespaces
                    .get_opt(&made)
                    .await
                    .unwrap()
                    .is_none_or(|n| n.metadata.deletion_timestamp.is_some())
                && secrets.get_opt("planted").await.unwrap().is_none()
                && settings.get_opt("settings").await.unwrap().is_none()
                && lease.get_opt("leader").await.unwrap().is_none();
            pruned.then_some(())
        },
    )
    .await;
    assert!(
        Api::<ConfigMap>::namespaced(admin.clone(), &t.tenant.name)
            .get_opt("app-config")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(pv_state(&admin, &t.pv).await, pv_before, "the PV changed");
}

/// Regression (issue 70): `volumeName` was refused, but a claim from Git with
/// `selector: {matchLabels: {team: victim-reserved}}` bound another team's Available volume
/// labelled for it. The claim is refused, located, and the volume stays Available; the
/// commit's other file syncs.
#[tokio::test]
async fn a_claim_from_git_cannot_pick_a_reserved_volume_by_label() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let tenant = TestNamespace::create(&admin, "trust-claim").await;
    let reserved = format!("{}-reserved", tenant.name);
    let volumes = Api::<PersistentVolume>::all(admin.clone());
    let pv: PersistentVolume = from_json(json!({
        "metadata": {"name": reserved, "labels": {"team": reserved}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "hostPath": {"path": "/tmp/trust-reserved"}}}));
    volumes.create(&PostParams::default(), &pv).await.unwrap();
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(
        repo.path().join("claim.yaml"),
        format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: loot\n  namespace: {ns}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: \"\"\n  resources: {{requests: {{storage: 1Gi}}}}\n  selector: {{matchLabels: {{team: {reserved}}}}}\n",
            ns = tenant.name
        ),
    )
    .unwrap();
    std::fs::write(
        repo.path().join("config.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\n  namespace: {}\ndata:\n  mode: fast\n",
            tenant.name
        ),
    )
    .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let agent = start_agent(
        scratch.path(),
        &[format!("--repo-path={}", repo.path().display())],
        &tenant.name,
    );
    wait_ready(&agent).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &tenant.name);
    eventually(
        "the commit's other file",
        Duration::from_secs(30),
        || async { config_maps.get_opt("app-config").await.unwrap().map(|_| ()) },
    )
    .await;
    let errors = all_errors(&source_status(&agent).await);
    assert!(
        has_error(&errors, "claim.yaml", "selects volumes by label")
            && errors.iter().any(|e| e.contains("claim.yaml:10:")),
        "{errors:#?}"
    );
    // A while for the binder to bind it, were the claim there.
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(admin.clone(), &tenant.name);
    support::holds_for(
        "no claim, the volume Available",
        Duration::from_secs(3),
        || async {
            if claims.get_opt("loot").await.unwrap().is_some() {
                return Err("the claim was made".to_string());
            }
            let pv = volumes.get(&reserved).await.unwrap();
            let bound = pv.spec.and_then(|s| s.claim_ref).is_some();
            let phase = pv.status.and_then(|s| s.phase);
            match (bound, phase.as_deref()) {
                (false, Some("Available")) => Ok(()),
                (bound, phase) => Err(format!("bound: {bound}, phase {phase:?}")),
            }
        },
    )
    .await;
    volumes
        .delete(&reserved, &DeleteParams::default())
        .await
        .unwrap();
}
