//! What `make demo` and `make demo-fleet` share: Git, waiting, and linnet's installation in a
//! cluster from `deploy/` (CRDs, its ServiceAccount and RBAC, a tenant namespace).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use linnet::api::CanaryStatefulSet;

pub type Step<T> = Result<T, String>;

pub fn git(dir: &Path, args: &[&str]) -> Step<String> {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=Demo",
            "-c",
            "user.email=demo@example.invalid",
        ])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn say(text: &str) {
    println!("\n==> {text}");
}

/// Polls `check` every 200 ms until it gives `Some`, or fails naming `what`.
pub async fn wait<T, F, Fut>(what: &str, secs: u64, mut check: F) -> Step<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("{what} did not happen within {secs}s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn install_crds(client: &Client) -> Step<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in linnet::api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(
            &name,
            &PatchParams::apply("linnet-demo").force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|e| format!("cannot install CRD {name}: {e}"))?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

pub async fn fresh_namespace(client: &Client, ns_name: &str) -> Step<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces
        .get_opt(ns_name)
        .await
        .map_err(|e| e.to_string())?
        .is_some()
    {
        println!("    removing namespace {ns_name} left by an earlier run");
        // No agent runs for it now, so its rollouts' finalizers are taken off by hand.
        release_finalizers(client, ns_name).await;
        let _ = namespaces
            .delete(ns_name, &DeleteParams::foreground())
            .await;
        wait("the old namespace to go", 120, || async {
            matches!(namespaces.get_opt(ns_name).await, Ok(None)).then_some(())
        })
        .await?;
    }
    // A tenant namespace as docs/security.md says: Pod Security `baseline`.
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns_name,
        "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}))
    .map_err(|e| e.to_string())?;
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .map_err(|e| format!("cannot create namespace {ns_name}: {e}"))?;
    Ok(())
}

/// Applies linnet's identity from `deploy/` (namespace, ServiceAccount, ClusterRole and its
/// binding), and returns a kubeconfig that acts as that ServiceAccount, with a token from the
/// TokenRequest API, as a pod running it would have.
pub async fn service_account_kubeconfig(
    client: &Client,
    ns_name: &str,
    admin_kubeconfig: &str,
    dir: &Path,
) -> Step<PathBuf> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let read = |file: &str| {
        let path = deploy.join(file);
        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let parse_err = |e: serde_saphyr::Error| e.to_string();
    let ns: Namespace = serde_saphyr::from_str(&read("namespace.yaml")?).map_err(parse_err)?;
    let sa: ServiceAccount =
        serde_saphyr::from_str(&read("serviceaccount.yaml")?).map_err(parse_err)?;
    let role: ClusterRole = serde_saphyr::from_str(&read("rbac.yaml")?).map_err(parse_err)?;
    let binding: ClusterRoleBinding =
        serde_saphyr::from_str(&read("rbac-binding.yaml")?).map_err(parse_err)?;
    let sa_ns = sa.metadata.namespace.clone().unwrap_or_default();
    let params = PatchParams::apply("linnet-demo").force();
    let failed = |what: &'static str| move |e: kube::Error| format!("cannot apply {what}: {e}");
    Api::<Namespace>::all(client.clone())
        .patch(&sa_ns, &params, &Patch::Apply(&ns))
        .await
        .map_err(failed("the namespace"))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &sa_ns);
    accounts
        .patch("linnet", &params, &Patch::Apply(&sa))
        .await
        .map_err(failed("the ServiceAccount"))?;
    Api::<ClusterRole>::all(client.clone())
        .patch("linnet", &params, &Patch::Apply(&role))
        .await
        .map_err(failed("the ClusterRole"))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch("linnet", &params, &Patch::Apply(&binding))
        .await
        .map_err(failed("the ClusterRoleBinding"))?;
    // The inventory of what the source applied, in linnet's own namespace.
    let state_role: k8s_openapi::api::rbac::v1::Role =
        serde_saphyr::from_str(&read("state-rbac.yaml")?).map_err(parse_err)?;
    let state_binding: k8s_openapi::api::rbac::v1::RoleBinding =
        serde_saphyr::from_str(&read("state-rbac-binding.yaml")?).map_err(parse_err)?;
    Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(client.clone(), &sa_ns)
        .patch("linnet-state", &params, &Patch::Apply(&state_role))
        .await
        .map_err(failed("the Role linnet-state"))?;
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), &sa_ns)
        .patch("linnet-state", &params, &Patch::Apply(&state_binding))
        .await
        .map_err(failed("the RoleBinding linnet-state"))?;
    // What the source may apply, granted in namespace demo only: linnet applies Git's objects
    // as ServiceAccount linnet-default there, never with its own rights.
    let source_role: ClusterRole =
        serde_saphyr::from_str(&read("source-rbac.yaml")?).map_err(parse_err)?;
    Api::<ClusterRole>::all(client.clone())
        .patch("linnet-source", &params, &Patch::Apply(&source_role))
        .await
        .map_err(failed("the ClusterRole linnet-source"))?;
    let grant: k8s_openapi::api::rbac::v1::RoleBinding =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "linnet-source", "namespace": ns_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "linnet-source"},
            "subjects": [{"kind": "ServiceAccount", "name": "linnet-default", "namespace": ns_name}],
        }))
        .map_err(|e| e.to_string())?;
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), ns_name)
        .patch("linnet-source", &params, &Patch::Apply(&grant))
        .await
        .map_err(failed("the source's RoleBinding"))?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = accounts
        .create_token_request("linnet", &PostParams::default(), &request)
        .await
        .map_err(|e| format!("cannot get a token for ServiceAccount linnet: {e}"))?
        .status
        .and_then(|s| s.token)
        .ok_or("the TokenRequest returned no token")?;
    let text = std::fs::read_to_string(admin_kubeconfig).map_err(|e| e.to_string())?;
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .ok_or("the admin kubeconfig has no token")?;
    let path = dir.join("linnet.kubeconfig");
    std::fs::write(&path, text.replace(line, &format!("    token: {token}")))
        .map_err(|e| e.to_string())?;
    Ok(path)
}

/// Takes linnet's finalizer off the rollouts in the demo namespace (only when no agent runs).
pub async fn release_finalizers(client: &Client, ns_name: &str) {
    let api: Api<CanaryStatefulSet> = Api::namespaced(client.clone(), ns_name);
    let Ok(list) = api.list(&ListParams::default()).await else {
        return;
    };
    for r in list.items {
        let name = r.metadata.name.unwrap_or_default();
        let _ = api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
}
