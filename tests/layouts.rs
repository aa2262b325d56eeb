//! Issue 72: the repository layouts teams bring from Flux and Argo CD, synced end to end on the
//! local control plane from fixtures (`tests/fixtures/*/SOURCE.md` says where each comes from
//! and under which licence). The repository is the boundary; `--path` picks what is applied.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use support::agent::{start_agent, wait_ready};
use support::{TestNamespace, admin_client, eventually, from_json, git, install_linnet};

const WAIT: Duration = Duration::from_secs(60);

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Copies the files below `from` into `to`, each through `edit` (its path, its text).
fn copy_tree(from: &Path, to: &Path, edit: &dyn Fn(&str, String) -> String) {
    for entry in walk(from) {
        let rel = entry
            .strip_prefix(from)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let text = std::fs::read_to_string(&entry).unwrap();
        let target = to.join(&rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, edit(&rel, text)).unwrap();
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// A CRD that takes any object of `kind`, as Flux's own would for what the test reads.
async fn install_crd(admin: &kube::Client, group: &str, version: &str, kind: &str) {
    let lower = kind.to_lowercase();
    // As Flux's own CRDs name them (and kube's ApiResource::from_gvk guesses).
    let plural = match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{lower}s"),
    };
    let name = format!("{plural}.{group}");
    let crd: CustomResourceDefinition = from_json(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
            "versions": [{"name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }));
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    crds.patch(
        &name,
        &PatchParams::apply("linnet-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        WAIT,
        await_condition(crds, &name, conditions::is_crd_established()),
    )
    .await
    .expect("CRD never established")
    .unwrap();
}

/// Lets the source's account (`--apply-as`) in each of `namespaces` do what the fixture's
/// objects need (a Namespace, Flux's kinds), as a cluster admin would; undone when dropped.
async fn grant_cluster_admin(
    admin: &kube::Client,
    name: &str,
    namespaces: &[&str],
) -> support::TestClusterRoleBinding {
    let subjects: Vec<serde_json::Value> = namespaces
        .iter()
        .map(|ns| json!({"kind": "ServiceAccount", "name": support::SOURCE_ACCOUNT, "namespace": ns}))
        .collect();
    support::TestClusterRoleBinding::apply(admin, name, "cluster-admin", json!(subjects)).await
}

fn push(work: &Path, message: &str) {
    git(work, &["add", "-A"]);
    git(work, &["commit", "-qm", message]);
    git(work, &["push", "-q", "origin", "HEAD:main"]);
}

fn field<'o>(o: &'o DynamicObject, pointer: &str) -> &'o str {
    o.data
        .pointer(pointer)
        .and_then(|v| v.as_str())
        .unwrap_or_default()
}

/// Flux's `apps/staging` uses `../base/podinfo`, outside the path: refused while `--path` was
/// the boundary. Now the overlay renders over its base, nothing of `apps/production` is
/// applied, a push that changes only production syncs nothing, and one to the base re-renders
/// staging.
#[tokio::test]
async fn flux_layout_the_staging_overlay_syncs_over_a_base_outside_its_path() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    install_crd(&admin, "helm.toolkit.fluxcd.io", "v2", "HelmRelease").await;
    install_crd(&admin, "source.toolkit.fluxcd.io", "v1", "HelmRepository").await;
    let ns = TestNamespace::create(&admin, "flux").await;
    // The fixture's namespace `podinfo`, one per run: the test's own, adopted.
    let podinfo = TestNamespace::create(&admin, "podinfo").await;
    let _grant = grant_cluster_admin(&admin, &ns.name, &[&ns.name, &podinfo.name]).await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    let ns_line = format!("namespace: {}", podinfo.name);
    let name_line = format!("name: {}", podinfo.name);
    copy_tree(
        &fixture("flux2-kustomize-helm-example"),
        &work,
        &|rel, text| {
            let text = text.replace("namespace: podinfo", &ns_line);
            match rel {
                "apps/base/podinfo/namespace.yaml" => text.replace("name: podinfo", &name_line),
                _ => text,
            }
        },
    );
    push(&work, "Flux's example layout");
    let bin = support::render_bin();
    let agent = start_agent(
        tmp.path(),
        &[
            format!("--repo-url=file://{}", bare.display()),
            "--path=apps/staging".into(),
            "--allow-cluster-kind=Namespace".into(),
            format!("--agent-namespace={}", ns.name),
            format!("--allow-namespace={}", podinfo.name),
            "--adopt".into(),
            "--prune".into(),
            format!("--kustomize={}", bin.join("kustomize").display()),
            format!("--helm={}", bin.join("helm").display()),
        ],
        &ns.name,
    );
    wait_ready(&agent).await;
    let gvk = GroupVersionKind::gvk("helm.toolkit.fluxcd.io", "v2", "HelmRelease");
    let releases: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), &podinfo.name, &ApiResource::from_gvk(&gvk));
    let staged = |o: &DynamicObject| {
        field(o, "/spec/chart/spec/version") == ">=1.0.0-alpha"
            && field(o, "/spec/values/httpRoute/hostnames/0") == "podinfo.staging"
    };
    let release = eventually("the staging HelmRelease", WAIT, || async {
        releases.get_opt("podinfo").await.unwrap().filter(staged)
    })
    .await;
    // From the base, outside --path.
    assert_eq!(field(&release, "/spec/values/redis/tag"), "8.6.2");
    let repository = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "source.toolkit.fluxcd.io",
        "v1",
        "HelmRepository",
    ));
    let repositories: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), &podinfo.name, &repository);
    assert!(repositories.get_opt("podinfo").await.unwrap().is_some());
    let status = agent.status().await;
    assert_eq!(status["specErrors"], json!([]), "{status:#}");

    // Production only: the staging release is untouched, and no sync is started.
    let values = work.join("apps/production/podinfo-values.yaml");
    let text = std::fs::read_to_string(&values).unwrap();
    std::fs::write(&values, text.replace("podinfo.production", "podinfo.prod")).unwrap();
    push(&work, "production only");
    let tip = git(&work, &["rev-parse", "HEAD"]).trim().to_string();
    assert_eq!(agent.push_webhook().await, 202);
    eventually("the production-only revision seen", WAIT, || async {
        agent
            .log_text()
            .lines()
            .any(|l| l.contains(&tip) && l.contains("changes no spec"))
            .then_some(())
    })
    .await;
    assert!(staged(&releases.get("podinfo").await.unwrap()));

    // The base: staging renders again with it.
    let base = work.join("apps/base/podinfo/release.yaml");
    let text = std::fs::read_to_string(&base).unwrap();
    std::fs::write(&base, text.replace("tag: 8.6.2", "tag: 8.6.3")).unwrap();
    push(&work, "a new redis in the base");
    assert_eq!(agent.push_webhook().await, 202);
    eventually("the base's change in staging", WAIT, || async {
        releases
            .get_opt("podinfo")
            .await
            .unwrap()
            .filter(|o| field(o, "/spec/values/redis/tag") == "8.6.3" && staged(o))
    })
    .await;
}

/// Argo CD's layout: an `Application` per app, one pointed at `kustomize-guestbook`, which
/// `kustomize-guestbook-staging` uses as its base. linnet never rendered such a base on its
/// own; `--path` naming it now does, and the overlay outside every path is not applied.
#[tokio::test]
async fn argocd_layout_a_path_naming_a_base_renders_it_on_its_own() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "argo").await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    copy_tree(&fixture("argocd-layout"), &work, &|_, text| text);
    push(&work, "Argo CD's example layout");
    let bin = support::render_bin();
    let agent = start_agent(
        tmp.path(),
        &[
            format!("--repo-url=file://{}", bare.display()),
            "--path=guestbook".into(),
            "--path=kustomize-guestbook".into(),
            format!("--default-namespace={}", ns.name),
            "--prune".into(),
            format!("--kustomize={}", bin.join("kustomize").display()),
        ],
        &ns.name,
    );
    wait_ready(&agent).await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns.name);
    for name in ["guestbook-ui", "kustomize-guestbook-ui"] {
        eventually(name, WAIT, || async {
            let both = deployments.get_opt(name).await.unwrap().is_some()
                && services.get_opt(name).await.unwrap().is_some();
            both.then_some(())
        })
        .await;
    }
    let names: Vec<String> = deployments
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|d| d.metadata.name)
        .collect();
    assert_eq!(
        names,
        ["guestbook-ui", "kustomize-guestbook-ui"],
        "the overlay is not applied"
    );
    let status = agent.status().await;
    assert_eq!(status["specErrors"], json!([]), "{status:#}");
}

fn validate(dir: &Path, extra: &[&str]) -> (i32, String) {
    let (rc, out, _) = support::validate_offline(dir, extra);
    (rc, out)
}

/// `validate` takes the paths the agent applies: one overlay of Flux's layout passes, both at
/// once declare the same objects twice, a path with no spec is named, and a path that climbs
/// out of the repository is refused before anything is read.
#[test]
fn validate_checks_what_the_paths_pick() {
    let flux = fixture("flux2-kustomize-helm-example");
    let ns = "--allow-cluster-kind=Namespace";
    let (rc, out) = validate(&flux, &[ns, "--path=apps/staging"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("3 objects in 1 files, no errors"), "{out}");
    let (rc, out) = validate(&flux, &[ns, "--path=apps"]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains(
            "apps/staging/kustomization.yaml:1:1: HelmRelease podinfo/podinfo is declared twice"
        ),
        "{out}"
    );
    let (rc, out) = validate(&flux, &[ns, "--path=apps/staging,apps/stagign"]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("(--path apps/stagign)"), "{out}");
    let (rc, out) = validate(&flux, &[ns, "--path=apps/../../elsewhere"]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("leaves the repository"), "{out}");
    // Argo CD's: the base alone where a path names it, the overlay where none does.
    let argo = fixture("argocd-layout");
    let (rc, out) = validate(&argo, &["--path=kustomize-guestbook"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("2 objects in 1 files, no errors"), "{out}");
}
