//! Shared set-up for the integration tests: clients for the local control plane
//! (`tests/cluster/up.sh`) and a namespace per test, deleted afterwards.
//!
//! Tests that need the cluster fail loudly when it is not running; they are never skipped.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

pub mod agent;
pub mod bench;
pub mod browser;
pub mod fleet;
pub mod gateway;
pub mod git_http;
pub mod gitea;
pub mod grpc;
pub mod install;
pub mod node;
pub mod otel;
pub mod ports;
pub mod process;
pub mod prometheus;
pub mod push_hook;
pub mod registry;
pub mod rollout;
pub mod soak;
pub mod stall;
pub mod status_host;
pub mod tls;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// An HTTP client for the tests' own calls (reqwest is built without a crypto provider; the
/// agent installs ring, and so does this). A new one each time: a pool shared by the tests'
/// separate runtimes would keep connections of a runtime that has ended.
pub fn http() -> reqwest::Client {
    linnet::net::install_crypto_provider();
    reqwest::Client::new()
}

/// Where the test cluster's audit log of linnet's requests ends now (tests/cluster/up.sh).
pub fn audit_offset() -> u64 {
    std::fs::metadata(cluster_dir().join("logs/audit.log")).map_or(0, |m| m.len())
}

/// The lists of `resource` (`"*"`: of any kind) linnet made since `from` (an
/// [`audit_offset`]) with a label selector naming source `source`: their request URIs.
pub fn audit_lists(from: u64, resource: &str, source: &str) -> Vec<String> {
    let log = std::fs::read(cluster_dir().join("logs/audit.log")).unwrap_or_default();
    let selector = format!("source%3D{source}");
    String::from_utf8_lossy(log.get(from as usize..).unwrap_or_default())
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            e["verb"] == "list"
                && e["stage"] == "ResponseComplete"
                && (resource == "*" || e["objectRef"]["resource"] == resource)
                && e["requestURI"].as_str().unwrap_or("").contains(&selector)
        })
        .map(|e| e["requestURI"].as_str().unwrap_or("").to_string())
        .collect()
}

/// How many `verb` requests linnet made since `from` (an [`audit_offset`]) of the object
/// `resource` `namespace`/`name`.
pub fn audit_requests(
    from: u64,
    verb: &str,
    resource: &str,
    (namespace, name): (&str, &str),
) -> usize {
    let log = std::fs::read(cluster_dir().join("logs/audit.log")).unwrap_or_default();
    String::from_utf8_lossy(log.get(from as usize..).unwrap_or_default())
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            let o = &e["objectRef"];
            e["verb"] == verb
                && e["stage"] == "ResponseComplete"
                && o["resource"] == resource
                && o["namespace"] == namespace
                && o["name"] == name
        })
        .count()
}

/// The run directory of the local control plane, as `tests/cluster/env.sh` chooses it.
pub fn cluster_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LINNET_CLUSTER_DIR") {
        return PathBuf::from(dir);
    }
    std::env::temp_dir().join("linnet-cluster")
}

/// Path of the admin kubeconfig written by `up.sh`.
pub fn admin_kubeconfig() -> PathBuf {
    cluster_dir().join("admin.kubeconfig")
}

/// Path of the kubeconfig for linnet's own, non-admin identity (user `linnet`).
pub fn linnet_kubeconfig() -> PathBuf {
    cluster_dir().join("linnet.kubeconfig")
}

async fn client_from(path: PathBuf) -> Client {
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
        panic!(
            "the local control plane is not running: cannot read {}: {e}\n\
             Start it with `make cluster-up` (or run everything with `make test`).",
            path.display()
        )
    });
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("bad kubeconfig {}: {e}", path.display()));
    let client = Client::try_from(config).expect("build a kube client");
    // Fail here, with a clear message, rather than in the middle of a test.
    if let Err(e) = client.apiserver_version().await {
        panic!(
            "the local control plane at {} does not answer: {e}\n\
             Start it with `make cluster-up` (or run everything with `make test`).",
            path.display()
        );
    }
    client
}

/// A kubeconfig in `dir` that acts as `user` (the admin's token, impersonating `user`), for
/// identities the test cluster has no token for.
pub fn impersonating_kubeconfig(dir: &std::path::Path, user: &str) -> PathBuf {
    let text = std::fs::read_to_string(admin_kubeconfig()).expect("admin kubeconfig");
    let token_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .expect("a token in the admin kubeconfig");
    let path = dir.join(format!("{user}.kubeconfig"));
    std::fs::write(
        &path,
        text.replace(token_line, &format!("{token_line}\n    as: {user}")),
    )
    .unwrap();
    path
}

/// A client with cluster-admin rights, for the tests' own set-up.
pub async fn admin_client() -> Client {
    client_from(admin_kubeconfig()).await
}

/// A client for linnet's non-admin identity; it can do only what RBAC grants user `linnet`.
pub async fn linnet_client() -> Client {
    client_from(linnet_kubeconfig()).await
}

/// A namespace of the test's own, deleted when dropped (also when the test panics).
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    /// Creates `t-<prefix>-<unique suffix>`.
    pub async fn create(client: &Client, prefix: &str) -> Self {
        recycle_volumes(client).await;
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "t-{prefix}-{:x}{:x}{n}",
            std::process::id() % 4096,
            nanos % 65536
        );
        // A tenant namespace as docs/security.md asks a cluster admin to set
        // one up: Pod Security admission enforcing `baseline`.
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {
                "linnet.dev/test": "true",
                "pod-security.kubernetes.io/enforce": "baseline",
            }},
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        grant_source(client, &name, SOURCE_ACCOUNT).await;
        grant_state(client, &name).await;
        TestNamespace { name }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("LINNET_KEEP_NAMESPACES").is_some() {
            eprintln!("keeping namespace {} (LINNET_KEEP_NAMESPACES)", self.name);
            return;
        }
        let name = self.name.clone();
        clean_up(|client| async move {
            // The test's agent is gone by now; take linnet's finalizers off so the namespace
            // can go (and its volumes be recycled).
            let rollouts: Api<linnet::api::CanaryStatefulSet> =
                Api::namespaced(client.clone(), &name);
            if let Ok(list) = rollouts.list(&Default::default()).await {
                for r in list.items {
                    let _ = rollouts
                        .patch(
                            r.metadata.name.as_deref().unwrap_or_default(),
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(
                                serde_json::json!({"metadata": {"finalizers": null}}),
                            ),
                        )
                        .await;
                }
            }
            let _ = Api::<Namespace>::all(client)
                .delete(&name, &DeleteParams::background())
                .await;
        });
    }
}

/// Runs `work` with an admin client to its end, on a thread with a runtime of its own: for a
/// `Drop` that cleans up, since the test's runtime may be single-threaded and busy dropping.
pub fn clean_up<F, Fut>(work: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { work(client_from(admin_kubeconfig()).await).await });
    })
    .join();
}

/// Makes the static pool's volumes whose claims went with a deleted test namespace
/// Available again. The pool is Retain (linnet must never lose a volume), so without this a
/// long-lived test cluster runs out of volumes after a few suite runs. A volume whose claim's
/// namespace still exists (also one released inside a handoff) is left alone.
pub async fn recycle_volumes(client: &Client) {
    use k8s_openapi::api::core::v1::PersistentVolume;
    use kube::api::{ListParams, Patch, PatchParams};
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let Ok(list) = pvs
        .list(&ListParams::default().labels("linnet.dev/pool=static"))
        .await
    else {
        return;
    };
    let mut gone = std::collections::BTreeMap::new();
    for pv in list.items {
        let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let Some(ns) = pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.namespace.clone())
        else {
            continue;
        };
        if !released {
            continue;
        }
        let ns_gone = match gone.get(&ns) {
            Some(g) => *g,
            None => {
                let g = matches!(namespaces.get_opt(&ns).await, Ok(None));
                gone.insert(ns.clone(), g);
                g
            }
        };
        if ns_gone {
            // On the real node a volume is a real directory: empty it before another test's
            // claim gets it, or that replica would start with a stranger's data.
            if let Some(path) = pv
                .spec
                .as_ref()
                .and_then(|s| s.host_path.as_ref())
                .map(|h| PathBuf::from(&h.path))
                && path.starts_with(cluster_dir().join("pv"))
                && let Ok(entries) = std::fs::read_dir(&path)
            {
                for e in entries.flatten() {
                    let p = e.path();
                    let _ = if p.is_dir() {
                        std::fs::remove_dir_all(&p)
                    } else {
                        std::fs::remove_file(&p)
                    };
                }
            }
            let _ = pvs
                .patch(
                    pv.metadata.name.as_deref().unwrap_or_default(),
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({
                        "metadata": {
                            "labels": {"rollouts.linnet.dev/rollout": null, "rollouts.linnet.dev/namespace": null},
                            "annotations": {"rollouts.linnet.dev/handoff-to": null},
                        },
                        "spec": {"claimRef": null},
                    })),
                )
                .await;
        }
    }
}

/// The AnalysisTemplate `health` in `ns`: one metric measured every second from the
/// [`web_gate`] on `port`, passing while the gate is ok; `metric` is merged into the metric
/// (e.g. `{"count": 2}`).
pub fn web_gate_template(ns: &str, port: u16, metric: serde_json::Value) -> serde_json::Value {
    let mut m = serde_json::json!({"name": "health", "successCondition": "result == true",
        "interval": "1s",
        "provider": {"web": {"url": format!("http://127.0.0.1:{port}/health"),
            "jsonPath": "$.data.ok"}}});
    rollout::merge(&mut m, metric);
    serde_json::json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": "health", "namespace": ns},
        "spec": {"metrics": [m]}
    })
}

/// A `web` analysis provider's endpoint on 127.0.0.1: `GET /health` answers
/// `{"data": {"ok": <ok>}}`, so a test passes or fails a gate by setting `ok`. Returns the
/// port; the server runs as long as the test's runtime.
pub async fn web_gate(ok: std::sync::Arc<std::sync::atomic::AtomicBool>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router =
        axum::Router::new().route(
            "/health",
            axum::routing::get(move || {
                let ok = ok.clone();
                async move {
                    axum::Json(serde_json::json!({"data": {"ok": ok.load(Ordering::Relaxed)}}))
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

/// Polls `check` until it returns `Some`, failing the test with `what` after `timeout`.
/// Use a watch (`kube::runtime::wait::await_condition`) where one fits; this is for checks
/// that span several objects.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks `check` through `window`, failing the test with `what` and the check's own words at
/// the first time it does not hold. For what must not happen (a canary must not start, a
/// write must not come back, a warning must not repeat): a window the behaviour under test
/// would have used, stated with its reason, instead of a sleep and one look at the end that
/// misses a change and its undoing in between.
pub async fn holds_for<F, Fut>(what: &str, window: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + window;
    loop {
        if let Err(why) = check().await {
            panic!("{what} did not hold through {window:?}: {why}");
        }
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Lets `time` pass, said in the test's output with `why`. Only where time itself is what the
/// test is about: a fault that must outlast a lease, a key that must expire, a stretch whose
/// events are counted. Never to order steps: wait for the step's effect with [`eventually`].
pub async fn let_time_pass(why: &str, time: Duration) {
    eprintln!("letting {time:?} pass: {why}");
    tokio::time::sleep(time).await;
}

/// Watches `api` (with `config`) and, once the watch's initial list is in, returns a task that
/// resolves to the moment the first version satisfying `done` arrived (one already there
/// counts). Call it before the change to time, so the change is timed against an open watch.
pub async fn first_seen<K>(
    api: Api<K>,
    config: kube::runtime::watcher::Config,
    done: impl Fn(&K) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<std::time::Instant>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::watcher::{Event, watcher};
    let (listed, ready) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut events = std::pin::pin!(watcher(api, config));
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(o) | Event::InitApply(o)) if done(&o) => {
                    return std::time::Instant::now();
                }
                Ok(Event::InitDone) => {
                    if let Some(tx) = listed.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
        }
        panic!("the watch ended");
    });
    // Err: the task already returned (or failed), which the caller sees when it awaits it.
    let _ = ready.await;
    task
}

/// A watch of the one object named `name`.
pub fn watch_named(name: &str) -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"))
}

/// The value of the metric line for `key` (a name, or a name with its labels) in Prometheus
/// text; 0 when absent.
pub fn metric(text: &str, key: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of the metric lines named `name` in Prometheus text whose labels include each of
/// `labels` exactly (`("subresource", "")` matches an empty value only); 0 when none.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (set, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let has = |k: &str, v: &str| {
                set.split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .any(|(key, val)| key == k && val.trim_matches('"') == v)
            };
            labels
                .iter()
                .all(|(k, v)| has(k, v))
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

/// Builds a typed object from JSON, for compact test fixtures.
pub fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("fixture matches its type")
}

/// Installs what `kubectl apply -k deploy/` would give linnet: its CRDs, its ClusterRole
/// from `deploy/rbac.yaml` bound to user `linnet`, the identity the test agents run as, and
/// ClusterRole `linnet-source`, which [`TestNamespace::create`] binds to the source's account. Uses
/// server-side apply, so parallel tests can all call it.
pub async fn install_linnet(client: &Client) {
    install_rbac(client, "linnet", None).await;
    {
        use kube::api::{Patch, PatchParams};
        Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
            .patch(
                "linnet-source",
                &PatchParams::apply("linnet-tests").force(),
                &Patch::Apply(&shipped_source_role()),
            )
            .await
            .unwrap_or_else(|e| panic!("install ClusterRole linnet-source: {e}"));
    }
    install_crds(client).await;
}

/// The account the test agents apply Git's objects as (`--apply-as`), in each namespace: the
/// one the shipped ClusterRole may impersonate.
pub const SOURCE_ACCOUNT: &str = "linnet-default";

/// What a cluster admin does to let a source deploy to `namespace` (docs/security.md, Permissions):
/// binds ClusterRole `linnet-source` (deploy/source-rbac.yaml) to the source's account there.
pub async fn grant_source(client: &Client, namespace: &str, account: &str) {
    use k8s_openapi::api::rbac::v1::RoleBinding;
    use kube::api::{Patch, PatchParams};
    let binding: RoleBinding = from_json(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": format!("linnet-source-{account}"), "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "linnet-source"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }));
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .patch(
            &format!("linnet-source-{account}"),
            &PatchParams::apply("linnet-tests").force(),
            &Patch::Apply(&binding),
        )
        .await
        .unwrap_or_else(|e| panic!("grant the source in {namespace}: {e}"));
}

/// What `deploy/state-rbac.yaml` grants linnet in its own namespace (the inventory), granted
/// to user `linnet` in `namespace`: the test agents keep their state in the test's namespace.
pub async fn grant_state(client: &Client, namespace: &str) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Patch, PatchParams};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/state-rbac.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/state-rbac.yaml");
    let mut role: Role =
        serde_saphyr::from_str(&text).expect("deploy/state-rbac.yaml holds a Role");
    role.metadata.namespace = Some(namespace.to_string());
    let params = PatchParams::apply("linnet-tests").force();
    Api::<Role>::namespaced(client.clone(), namespace)
        .patch("linnet-state", &params, &Patch::Apply(&role))
        .await
        .unwrap_or_else(|e| panic!("install Role linnet-state in {namespace}: {e}"));
    let binding: RoleBinding = from_json(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "linnet-state", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "linnet-state"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "linnet"}],
    }));
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .patch("linnet-state", &params, &Patch::Apply(&binding))
        .await
        .unwrap_or_else(|e| panic!("bind Role linnet-state in {namespace}: {e}"));
}

/// ClusterRole `linnet-source` as shipped in `deploy/source-rbac.yaml`.
pub fn shipped_source_role() -> k8s_openapi::api::rbac::v1::ClusterRole {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/source-rbac.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/source-rbac.yaml");
    serde_saphyr::from_str(&text).expect("deploy/source-rbac.yaml holds a ClusterRole")
}

/// linnet's ClusterRole as shipped in `deploy/rbac.yaml`.
pub fn shipped_cluster_role() -> k8s_openapi::api::rbac::v1::ClusterRole {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rbac.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/rbac.yaml");
    serde_saphyr::from_str(&text).expect("deploy/rbac.yaml holds a ClusterRole")
}

/// Binds `role` (the shipped ClusterRole when `None`) to `user`: ClusterRole `user`,
/// ClusterRoleBinding `linnet-tests-<user>` (`deploy/` has its own binding, `linnet`).
pub async fn install_rbac(
    client: &Client,
    user: &str,
    role: Option<k8s_openapi::api::rbac::v1::ClusterRole>,
) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::{Patch, PatchParams};
    let mut role = role.unwrap_or_else(shipped_cluster_role);
    role.metadata.name = Some(user.to_string());
    let params = PatchParams::apply("linnet-tests").force();
    Api::<ClusterRole>::all(client.clone())
        .patch(user, &params, &Patch::Apply(&role))
        .await
        .unwrap_or_else(|e| panic!("install ClusterRole {user}: {e}"));
    let binding: ClusterRoleBinding = from_json(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("linnet-tests-{user}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }));
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            &format!("linnet-tests-{user}"),
            &params,
            &Patch::Apply(&binding),
        )
        .await
        .unwrap_or_else(|e| panic!("bind ClusterRole {user}: {e}"));
}

/// Installs linnet's CRDs (server-side apply, so parallel tests can all call it) and waits
/// until the API server serves them.
pub async fn install_crds(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    use kube::runtime::wait::{await_condition, conditions};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in linnet::api::crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(
            &name,
            &PatchParams::apply("linnet-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("install CRD {name}: {e}"));
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("CRD {name} never became Established"))
        .unwrap();
    }
}

/// Counts the requests a client sends: reads (GET) and writes (anything else).
#[derive(Clone, Default)]
pub struct RequestCounter {
    writes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    reads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl RequestCounter {
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

impl<S> tower::Layer<S> for RequestCounter {
    type Service = CountedService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CountedService {
            inner,
            counter: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct CountedService<S> {
    inner: S,
    counter: RequestCounter,
}

impl<S, B> tower::Service<http::Request<B>> for CountedService<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let count = if req.method() == http::Method::GET {
            &self.counter.reads
        } else {
            &self.counter.writes
        };
        count.fetch_add(1, Ordering::SeqCst);
        self.inner.call(req)
    }
}

/// An admin client whose requests are counted.
pub async fn counting_admin_client() -> (Client, RequestCounter) {
    let kubeconfig = Kubeconfig::read_from(admin_kubeconfig()).expect("admin kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    let counter = RequestCounter::default();
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&counter)
        .build();
    (client, counter)
}

/// Copies `examples/gitops-repo/apps` into a temporary directory (as `apps/`), moving every
/// object into namespace `ns`.
pub fn example_repo_in(ns: &str) -> tempfile::TempDir {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gitops-repo");
    let dst = tempfile::tempdir().expect("temp dir");
    // Its plain YAML (`apps/`); the overlays and the chart are tests/render.rs's.
    copy_tree(&src.join("apps"), &dst.path().join("apps"), ns);
    dst
}

fn copy_tree(src: &std::path::Path, dst: &std::path::Path, ns: &str) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to, ns);
        } else {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            std::fs::write(
                &to,
                text.replace("namespace: demo", &format!("namespace: {ns}")),
            )
            .unwrap();
        }
    }
}

/// Copies the example repository's `apps/` (in namespace `ns`) into the work tree `work` and
/// commits it as "seed".
/// The whole of examples/gitops-repo as it ships (namespaces `demo`, `staging` and
/// `production`; plain YAML, overlays and a chart), committed in `work`.
pub fn commit_whole_example(work: &std::path::Path) {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gitops-repo");
    copy_tree(&src, work, "demo");
    git(work, &["add", "-A"]);
    git(work, &["commit", "-qm", "the example repository"]);
}

pub fn commit_example(work: &std::path::Path, ns: &str) {
    let seed = example_repo_in(ns);
    copy_tree(&seed.path().join("apps"), &work.join("apps"), ns);
    git(work, &["add", "-A"]);
    git(work, &["commit", "-qm", "seed"]);
}

/// An empty bare repository `dir/remote.git` (the "remote") and a clone of it,
/// `dir/work`, to commit and push from. Returns `(bare, work)`.
pub fn bare_remote_and_clone(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let bare = dir.join("remote.git");
    std::fs::create_dir_all(&bare).unwrap();
    git(&bare, &["init", "--bare", "-q"]);
    git(dir, &["clone", "-q", bare.to_str().unwrap(), "work"]);
    (bare, dir.join("work"))
}

/// Runs the `git` command line in `dir` as a user would, and returns its trimmed stdout.
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.invalid",
        ])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        // A machine-wide CA bundle in the environment would win over a test repository's
        // own `http.sslCAInfo` (the test's CA).
        .env_remove("GIT_SSL_CAINFO")
        .env_remove("GIT_SSL_CAPATH")
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Replaces the first `from` in `work/file` with `to`; the file must contain `from`.
pub fn edit_file(work: &std::path::Path, file: &str, from: &str, to: &str) {
    let path = work.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{file} has no {from:?}:\n{text}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

/// `path` on `branch` of the repository in `dir` (a bare one, say), if it is there.
pub fn show_on(dir: &std::path::Path, branch: &str, path: &str) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["show", &format!("{branch}:{path}")])
        .current_dir(dir)
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).to_string())
}

/// The directory of the test tools (kubectl, kstatus) that `tests/tools/build.sh`
/// builds once per machine from their pinned Go modules (a warm cache builds nothing).
/// The renderers the agent runs (kustomize, helm), built from deploy/render-tools/.
pub fn render_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = std::process::Command::new(root.join("deploy/render-tools/build.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("deploy/render-tools/build.sh runs (it needs Go)");
        assert!(out.status.success(), "deploy/render-tools/build.sh failed");
        let text = String::from_utf8_lossy(&out.stdout);
        PathBuf::from(text.lines().last().unwrap_or_default())
    })
    .clone()
}

/// The environment that points linnet at [`render_bin`]'s kustomize and helm.
pub fn render_env() -> [(&'static str, PathBuf); 2] {
    let bin = render_bin();
    [
        ("LINNET_KUSTOMIZE", bin.join("kustomize")),
        ("LINNET_HELM", bin.join("helm")),
    ]
}

pub fn tools_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(build_tools).clone()
}

fn build_tools() -> PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("tests/tools/build.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("tests/tools/build.sh runs (it needs Go)");
    assert!(out.status.success(), "tests/tools/build.sh failed");
    let text = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(text.lines().last().unwrap_or_default())
}

/// A kubeconfig in `dir` that acts as ServiceAccount `namespace/name`, with a token from the
/// TokenRequest API, as a pod running as that account would have.
pub async fn service_account_kubeconfig(
    client: &Client,
    namespace: &str,
    name: &str,
    dir: &std::path::Path,
) -> PathBuf {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for ServiceAccount {namespace}/{name}: {e}"))
        .status
        .and_then(|s| s.token)
        .expect("a token");
    let text = std::fs::read_to_string(admin_kubeconfig()).expect("admin kubeconfig");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .expect("a token in the admin kubeconfig");
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, text.replace(line, &format!("    token: {token}"))).unwrap();
    path
}

/// Waits (up to `secs`) for an event with `reason` in namespace `ns`, and returns it.
pub async fn wait_event(
    admin: &kube::Client,
    ns: &str,
    reason: &str,
    secs: u64,
) -> k8s_openapi::api::events::v1::Event {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(admin.clone(), ns);
    eventually(
        &format!("a {reason} event"),
        std::time::Duration::from_secs(secs),
        || async {
            events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
        },
    )
    .await
}

/// A ClusterRoleBinding a test makes (a grant a cluster admin would give), deleted when
/// dropped, also when the test fails.
pub struct TestClusterRoleBinding(String);

impl TestClusterRoleBinding {
    /// Binds ClusterRole `role` to `subjects` (as in a binding's `subjects`) under `name`.
    pub async fn apply(
        client: &Client,
        name: &str,
        role: &str,
        subjects: serde_json::Value,
    ) -> TestClusterRoleBinding {
        use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
        use kube::api::{Patch, PatchParams};
        let binding: ClusterRoleBinding = from_json(serde_json::json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": subjects,
        }));
        Api::<ClusterRoleBinding>::all(client.clone())
            .patch(
                name,
                &PatchParams::apply("linnet-tests").force(),
                &Patch::Apply(&binding),
            )
            .await
            .unwrap_or_else(|e| panic!("bind ClusterRole {role} as {name}: {e}"));
        TestClusterRoleBinding(name.to_string())
    }
}

impl Drop for TestClusterRoleBinding {
    fn drop(&mut self) {
        let name = self.0.clone();
        clean_up(|client| async move {
            let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client)
                .delete(&name, &DeleteParams::background())
                .await;
        });
    }
}

/// `linnet validate EXTRA DIR`, offline, with the built renderers: its exit code, what it
/// printed (stdout, then stderr) and how long it took.
pub fn validate_offline(dir: &std::path::Path, extra: &[&str]) -> (i32, String, Duration) {
    let started = std::time::Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["validate", "--check-namespaces", "never"])
        .args(extra)
        .arg(dir)
        .envs(render_env())
        .output()
        .expect("run linnet");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text, started.elapsed())
}

/// Where the browser tests save screenshots (docs/dashboard.md shows them):
/// `<target>/dashboard-screenshots`, wherever CARGO_TARGET_DIR puts the target directory.
pub fn screenshots_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("dashboard-screenshots")
}
