//! A real gateway and real "pods" for the traffic tests. Traefik (built from its Go module by
//! `tests/gateway/build.sh`, cached) runs its Kubernetes Gateway provider against the local
//! control plane and routes requests by the HTTPRoutes linnet weighs. kwok's pods get
//! addresses in 198.18.0.0/16, which `tests/deps.sh` routes to this machine, and
//! [`PodServers`] listens on each pod's address and answers with the pod's image, as the
//! pod's container would: `500` for an image whose tag contains `bad`.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::ports::free_port;

/// The kubeconfig Traefik and the pod servers use: `KUBECONFIG` when the caller runs with one
/// (`make demo`), else the local control plane's admin one (the tests).
pub fn kubeconfig() -> PathBuf {
    if let Some(k) = std::env::var_os("LINNET_GATEWAY_KUBECONFIG") {
        return PathBuf::from(k);
    }
    let dir = std::env::var_os("LINNET_CLUSTER_DIR").map_or_else(
        || std::env::temp_dir().join("linnet-cluster"),
        PathBuf::from,
    );
    dir.join("admin.kubeconfig")
}

async fn client() -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

pub fn http() -> reqwest::Client {
    linnet::net::install_crypto_provider();
    reqwest::Client::new()
}

/// Waits until `check` answers, for at most `timeout`; panics (naming `what`) after it. (The
/// demo includes this file without `support`, so it has its own.)
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The directory with `traefik` and the Gateway API CRDs (`crds/`), built on first use.
pub fn gateway_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(root.join("tests/gateway/build.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("tests/gateway/build.sh runs (it needs Go)");
        assert!(out.status.success(), "tests/gateway/build.sh failed");
        let text = String::from_utf8_lossy(&out.stdout);
        PathBuf::from(text.lines().last().unwrap_or_default())
    })
    .clone()
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", kind),
        plural,
    )
}

/// Installs the Gateway API CRDs (idempotent).
pub async fn install_gateway_api(admin: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds = Api::<CustomResourceDefinition>::all(admin.clone());
    let dir = gateway_dir().join("crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(
            &name,
            &PatchParams::apply("linnet-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
    }
}

/// A GatewayClass of Traefik's for one test: each Traefik selects only its own by label, so
/// two tests' gateways never write the same class's status.
async fn create_class(admin: &Client, name: &str) {
    let classes =
        Api::<DynamicObject>::all_with(admin.clone(), &resource("GatewayClass", "gatewayclasses"));
    let class = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": name, "labels": {"linnet.dev/gateway": name}},
        "spec": {"controllerName": "traefik.io/gateway-controller"},
    });
    // The CRDs may take a moment to be served after they are created.
    eventually(
        "the GatewayClass to be created",
        Duration::from_secs(30),
        || async {
            classes
                .patch(
                    name,
                    &PatchParams::apply("linnet-tests").force(),
                    &Patch::Apply(&class),
                )
                .await
                .ok()
        },
    )
    .await;
}

/// Traefik, serving the Gateway `gw` of one namespace on its own port.
pub struct Gateway {
    child: Child,
    pub port: u16,
    pub metrics_port: u16,
    /// Traefik's own API (`/api/rawdata`: the configuration it runs), for failure messages.
    pub api_port: u16,
    pub log: PathBuf,
    /// The test's own GatewayClass, deleted with the gateway.
    class: String,
    /// The namespace of its Gateway and routes.
    pub ns: String,
    _dir: tempfile::TempDir,
}

impl Gateway {
    pub async fn start(admin: &Client, ns: &str) -> Gateway {
        install_gateway_api(admin).await;
        let class = format!("traefik-{ns}");
        create_class(admin, &class).await;
        let (port, metrics_port, api_port) = (free_port(), free_port(), free_port());
        let gateways = Api::<DynamicObject>::namespaced_with(
            admin.clone(),
            ns,
            &resource("Gateway", "gateways"),
        );
        let gw = json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": ns},
            "spec": {
                "gatewayClassName": class,
                "listeners": [{"name": "web", "port": port, "protocol": "HTTP",
                    "allowedRoutes": {"namespaces": {"from": "Same"}}}],
            },
        });
        gateways
            .patch(
                "gw",
                &PatchParams::apply("linnet-tests").force(),
                &Patch::Apply(&gw),
            )
            .await
            .unwrap();
        // Not in a directory the agent follows: Traefik writes its log all the time.
        let dir = tempfile::tempdir().unwrap();
        let log = std::env::var_os("LINNET_TRAEFIK_LOG_DIR").map_or_else(
            || dir.path().join("traefik.log"),
            |d| PathBuf::from(d).join(format!("traefik-{ns}.log")),
        );
        let child = Command::new(gateway_dir().join("traefik"))
            .args([
                format!("--entryPoints.web.address=127.0.0.1:{port}"),
                format!("--entryPoints.metrics.address=127.0.0.1:{metrics_port}"),
                format!("--entryPoints.traefik.address=127.0.0.1:{api_port}"),
                "--api.insecure=true".into(),
                "--metrics.prometheus=true".into(),
                "--metrics.prometheus.entryPoint=metrics".into(),
                "--metrics.prometheus.addServicesLabels=true".into(),
                "--providers.kubernetesgateway=true".into(),
                format!("--providers.kubernetesgateway.labelselector=linnet.dev/gateway={class}"),
                "--providers.kubernetesgateway.throttleDuration=1s".into(),
                "--global.checkNewVersion=false".into(),
                "--global.sendAnonymousUsage=false".into(),
                "--log.level=INFO".into(),
                // Failed requests only, with the backend they went to: a failure explains itself.
                "--accesslog=true".into(),
                "--accesslog.format=json".into(),
                "--accesslog.filters.statuscodes=500-599".into(),
                "--log.noColor=true".into(),
            ])
            .env("KUBECONFIG", kubeconfig())
            // Traefik logs to stdout.
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("stderr")).unwrap())
            .spawn()
            .unwrap();
        let g = Gateway {
            child,
            port,
            metrics_port,
            api_port,
            log,
            class,
            _dir: dir,
            ns: ns.to_string(),
        };
        eventually(
            "the Gateway to be Programmed",
            Duration::from_secs(60),
            || async {
                let gw = gateways.get("gw").await.ok()?;
                let conditions = gw.data.pointer("/status/conditions")?.as_array()?.clone();
                conditions
                    .iter()
                    .any(|c| c["type"] == "Programmed" && c["status"] == "True")
                    .then_some(())
            },
        )
        .await;
        g
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// A handle on Traefik's API alone (for a task that outlives a borrow of the gateway).
    fn probe(api_port: u16) -> Probe {
        Probe { api_port }
    }

    /// Traefik's access log of failed requests (status, backend address, time): the first
    /// `n` lines and how many there were, for a failure message.
    pub fn failed_requests(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let failed: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("\"DownstreamStatus\""))
            .collect();
        format!(
            "{} failed request(s) in Traefik's access log; the first {n}:\n{}",
            failed.len(),
            failed[..failed.len().min(n)].join("\n")
        )
    }

    /// The HTTP services and routers Traefik runs now, as JSON text.
    pub async fn rawdata(&self) -> String {
        Self::probe(self.api_port).rawdata().await
    }

    /// The weights Traefik runs for the HTTPRoute `route`'s rules, by rule.
    pub async fn running_weights(&self, ns: &str, route: &str) -> Vec<Vec<i64>> {
        Self::probe(self.api_port).running_weights(ns, route).await
    }

    /// The weights Traefik runs for the GRPCRoute `route`'s rules, by rule.
    pub async fn running_grpc_weights(&self, ns: &str, route: &str) -> Vec<Vec<i64>> {
        let raw: Value =
            serde_json::from_str(&Self::probe(self.api_port).rawdata().await).unwrap_or_default();
        backends_of(&raw, "grpcroute", ns, route)
            .into_iter()
            .map(|rule| rule.into_iter().map(|(_, w)| w).collect())
            .collect()
    }

    /// The backends (Traefik's service names, which contain the Service's) and weights that
    /// Traefik runs for each of `routes`' rules, from one read of its configuration.
    pub async fn running_backends_of(
        &self,
        ns: &str,
        routes: &[String],
    ) -> Vec<Vec<Vec<(String, i64)>>> {
        let raw: Value =
            serde_json::from_str(&Self::probe(self.api_port).rawdata().await).unwrap_or_default();
        routes.iter().map(|r| backends_in(&raw, ns, r)).collect()
    }

    /// Whether Traefik's servers for Service `svc` are its ready endpoints.
    pub async fn runs_endpoints_of(&self, admin: &Client, ns: &str, svc: &str) -> bool {
        Self::probe(self.api_port).running_servers(ns, svc).await
            == ready_addresses(admin, ns, svc).await
    }

    /// Where Traefik serves its Prometheus metrics (`/metrics`).
    pub fn metrics_url(&self) -> String {
        format!("127.0.0.1:{}", self.metrics_port)
    }
}

/// Traefik's API port, to read what it runs.
struct Probe {
    api_port: u16,
}

impl Probe {
    /// The weights Traefik runs for the HTTPRoute `route`'s rules, by rule: what the
    /// gateway does now, as opposed to what the route says.
    async fn running_weights(&self, ns: &str, route: &str) -> Vec<Vec<i64>> {
        let raw: Value = serde_json::from_str(&self.rawdata().await).unwrap_or_default();
        weights_in(&raw, ns, route)
    }

    /// The server addresses Traefik runs for Service `svc`, for HTTPRoutes
    /// (`<ns>-<svc>-http-<port>`) and GRPCRoutes (`<ns>-<svc>-<port>-grpc`).
    async fn running_servers(&self, ns: &str, svc: &str) -> std::collections::BTreeSet<String> {
        let raw: Value = serde_json::from_str(&self.rawdata().await).unwrap_or_default();
        let prefix = format!("{ns}-{svc}-");
        // Traefik's names end in the provider's (`@kubernetesgateway`).
        let of_svc = |n: &str| {
            let n = n.split('@').next().unwrap_or(n);
            n.strip_prefix(&prefix).is_some_and(|rest| {
                rest.starts_with("http-")
                    || rest
                        .strip_suffix("-grpc")
                        .is_some_and(|port| port.bytes().all(|b| b.is_ascii_digit()))
            })
        };
        raw["services"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(n, _)| of_svc(n))
            .flat_map(|(_, s)| {
                s["loadBalancer"]["servers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|s| {
                s["url"].as_str().map(|u| {
                    u.rsplit("://")
                        .next()
                        .unwrap_or("")
                        .split(':')
                        .next()
                        .unwrap_or("")
                        .to_string()
                })
            })
            .collect()
    }

    async fn rawdata(&self) -> String {
        let url = format!("http://127.0.0.1:{}/api/rawdata", self.api_port);
        match http().get(url).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => format!("no rawdata: {e}"),
        }
    }
}

/// The weights Traefik's configuration `raw` (its `/api/rawdata`) runs for the HTTPRoute
/// `route`'s rules, by rule.
fn weights_in(raw: &Value, ns: &str, route: &str) -> Vec<Vec<i64>> {
    backends_in(raw, ns, route)
        .into_iter()
        .map(|rule| rule.into_iter().map(|(_, w)| w).collect())
        .collect()
}

/// The backends (Traefik's service names) and weights that the configuration `raw` runs for
/// the HTTPRoute `route`'s rules, by rule.
fn backends_in(raw: &Value, ns: &str, route: &str) -> Vec<Vec<(String, i64)>> {
    backends_of(raw, "httproute", ns, route)
}

/// The same for a route of `kind` (Traefik's lower-case name of it: `httproute`, `grpcroute`).
fn backends_of(raw: &Value, kind: &str, ns: &str, route: &str) -> Vec<Vec<(String, i64)>> {
    let prefix = format!("{kind}-{ns}-{route}-");
    let mut rules: Vec<(String, Vec<(String, i64)>)> = raw["services"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, _)| name.starts_with(&prefix) && name.contains("-wrr"))
        .map(|(name, s)| {
            let backends = s["weighted"]["services"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|w| {
                    let name = w["name"].as_str().unwrap_or_default().to_string();
                    (name, w["weight"].as_i64().unwrap_or(1))
                })
                .collect();
            (name.clone(), backends)
        })
        .collect();
    rules.sort();
    rules.into_iter().map(|(_, b)| b).collect()
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The class is cluster-wide: delete it from a thread with a runtime of its own (the
        // test's may be busy dropping us).
        let class = self.class.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let client = client().await;
                let classes = Api::<DynamicObject>::all_with(
                    client,
                    &resource("GatewayClass", "gatewayclasses"),
                );
                let _ = classes.delete(&class, &Default::default()).await;
            });
        })
        .join();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(400).collect();
            eprintln!("--- traefik log (last 40 lines) ---");
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// A GRPCRoute `name` on Gateway `gw` that sends every call of the key-value server's gRPC
/// service (`linnet.kv.Kv`) to Service `backend`.
pub fn grpc_route(ns: &str, name: &str, backend: &str, port: u16) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "parentRefs": [{"name": "gw"}],
            "rules": [{
                "matches": [{"method": {"service": "linnet.kv.Kv"}}],
                "backendRefs": [{"name": backend, "port": port}],
            }],
        },
    })
}

/// An HTTPRoute `name` on Gateway `gw` that sends every request to Service `backend`.
pub fn http_route(ns: &str, name: &str, backend: &str, port: u16) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "parentRefs": [{"name": "gw"}],
            "rules": [{"backendRefs": [{"name": backend, "port": port}]}],
        },
    })
}

/// The HTTPRoute API of a namespace.
pub fn routes(admin: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(admin.clone(), ns, &resource("HTTPRoute", "httproutes"))
}

/// The GRPCRoute API of a namespace.
pub fn grpc_routes(admin: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(admin.clone(), ns, &resource("GRPCRoute", "grpcroutes"))
}

/// How long a deleted pod goes on answering (a preStop sleep's worth).
const TERMINATION_GRACE: Duration = Duration::from_secs(5);

/// One pod as the pod servers know it.
#[derive(Clone, Debug)]
struct KnownPod {
    /// namespace/name
    name: String,
    ip: IpAddr,
    image: String,
    created: String,
    terminating: bool,
    /// When it was deleted (it answers for TERMINATION_GRACE more).
    gone: Option<std::time::Instant>,
}

/// Every pod with a kwok address, by uid. kwok reuses a deleted pod's address, so several
/// pods may have had one: who answers on an address is decided when asked (see
/// [`owner_of`]), never by the order the watch's events came in (a terminating pod's late
/// update, or a relist, must not take an address back from the pod that has it now).
type Addresses = Arc<Mutex<HashMap<String, KnownPod>>>;

/// The pod that answers on `ip`: a running pod, the newest first; else a terminating one;
/// else one deleted less than TERMINATION_GRACE ago.
fn owner_of(pods: &HashMap<String, KnownPod>, ip: IpAddr) -> Option<&KnownPod> {
    let now = std::time::Instant::now();
    pods.values()
        .filter(|p| p.ip == ip)
        .filter(|p| {
            p.gone
                .is_none_or(|t| now.duration_since(t) < TERMINATION_GRACE)
        })
        .max_by_key(|p| (p.gone.is_none(), !p.terminating, p.created.clone()))
}

/// A server on the address of every pod of the cluster, on `port`, answering with the pod's
/// image. Addresses are the cluster's (kwok reuses a deleted pod's), so one set serves every
/// test of a process; it runs on a thread of its own so that a busy test runtime never
/// delays an answer.
pub struct PodServers {
    addresses: Addresses,
}

impl PodServers {
    pub fn start(port: u16) -> &'static PodServers {
        static SERVERS: std::sync::OnceLock<PodServers> = std::sync::OnceLock::new();
        SERVERS.get_or_init(|| {
            let addresses: Addresses = Arc::default();
            let watched = addresses.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(serve_pods(port, watched));
            });
            PodServers { addresses }
        })
    }

    /// The images the pods of namespace `ns` answer with, by address.
    pub fn images(&self, ns: &str) -> BTreeMap<String, String> {
        let pods = self.addresses.lock().unwrap();
        let ips: HashSet<IpAddr> = pods.values().map(|p| p.ip).collect();
        ips.into_iter()
            .filter_map(|ip| owner_of(&pods, ip))
            .filter(|p| p.name.starts_with(&format!("{ns}/")))
            .map(|p| (p.ip.to_string(), p.image.clone()))
            .collect()
    }
}

/// The pod's entry, if it has a kwok address (198.18.0.0/16): a pod on the real node
/// (tests/node/) answers for itself.
fn known_pod(pod: &Pod) -> Option<(String, KnownPod)> {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok())?;
    if !matches!(ip, IpAddr::V4(v4) if v4.octets()[..2] == [198, 18]) {
        return None;
    }
    let meta = &pod.metadata;
    let image = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let known = KnownPod {
        name: format!(
            "{}/{}",
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default()
        ),
        ip,
        image,
        created: meta
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        terminating: meta.deletion_timestamp.is_some(),
        gone: None,
    };
    Some((meta.uid.clone().unwrap_or_default(), known))
}

async fn serve_pods(port: u16, addresses: Addresses) {
    let client = client().await;
    // One listener for every address (198.18.0.0/16 is routed to lo): a pod is answered for
    // from its first request, however late the watch tells of it. Never one per address: an
    // address not yet bound refuses, and Traefik turns that into 502s.
    let listener = bind_every_address(port).await;
    tokio::spawn(serve_every_address(
        listener,
        addresses.clone(),
        client.clone(),
    ));
    let pods = Api::<Pod>::all(client.clone());
    // The uids a relist has listed so far: at its end, the pods it did not list are gone.
    let mut relisted: Option<HashSet<String>> = None;
    let mut events = watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let Ok(event) = event else { continue };
        let now = std::time::Instant::now();
        let pod = match event {
            watcher::Event::Init => {
                relisted = Some(HashSet::new());
                continue;
            }
            watcher::Event::InitDone => {
                let listed = relisted.take().unwrap_or_default();
                let mut a = addresses.lock().unwrap();
                for (uid, p) in a.iter_mut() {
                    if !listed.contains(uid) && p.gone.is_none() {
                        p.gone = Some(now);
                    }
                }
                a.retain(|_, p| {
                    p.gone
                        .is_none_or(|t| now.duration_since(t) < TERMINATION_GRACE)
                });
                continue;
            }
            watcher::Event::Delete(p) => {
                if let Some(uid) = p.metadata.uid.as_ref() {
                    let mut a = addresses.lock().unwrap();
                    if let Some(known) = a.get_mut(uid) {
                        known.gone = Some(now);
                    }
                    a.retain(|_, p| {
                        p.gone
                            .is_none_or(|t| now.duration_since(t) < 2 * TERMINATION_GRACE)
                    });
                }
                continue;
            }
            watcher::Event::Apply(p) => p,
            watcher::Event::InitApply(p) => {
                if let (Some(listed), Some(uid)) = (relisted.as_mut(), p.metadata.uid.as_ref()) {
                    listed.insert(uid.clone());
                }
                p
            }
        };
        if let Some((uid, known)) = known_pod(&pod) {
            addresses.lock().unwrap().insert(uid, known);
        }
    }
}

/// `0.0.0.0:port`, waiting out another process that holds it for a moment (a test's agent
/// started without `--listen`); a port held for a minute fails the test, naming it.
async fn bind_every_address(port: u16) -> tokio::net::TcpListener {
    let started = std::time::Instant::now();
    let mut said = false;
    loop {
        match tokio::net::TcpListener::bind(("0.0.0.0", port)).await {
            Ok(listener) => {
                if said {
                    eprintln!("pod servers: listening after {:?}", started.elapsed());
                }
                return listener;
            }
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                if !std::mem::replace(&mut said, true) {
                    eprintln!("pod servers: cannot listen on 0.0.0.0:{port} yet ({e}); waiting");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!(
                "pod servers: cannot listen on 0.0.0.0:{port} ({e}): another process holds \
                 it (ss -ltnp 'sport = :{port}'); the kwok pods' addresses are answered there"
            ),
        }
    }
}

/// Answers each connection to any local address as the pod with that address would.
async fn serve_every_address(
    listener: tokio::net::TcpListener,
    addresses: Addresses,
    client: Client,
) {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let app = axum::Router::new().fallback(answer).with_state((
            local.ip(),
            addresses.clone(),
            client.clone(),
        ));
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
                .await;
        });
    }
}

/// The pods the API server says have `ip` now, recorded: for an address the watch has not
/// told of yet.
async fn look_up(client: &Client, ip: IpAddr, addresses: &Addresses) {
    let params = kube::api::ListParams::default().fields(&format!("status.podIP={ip}"));
    let Ok(list) = Api::<Pod>::all(client.clone()).list(&params).await else {
        return;
    };
    let mut a = addresses.lock().unwrap();
    for pod in &list.items {
        if let Some((uid, known)) = known_pod(pod) {
            a.entry(uid).or_insert(known);
        }
    }
}

async fn answer(
    axum::extract::State((ip, addresses, client)): axum::extract::State<(
        IpAddr,
        Addresses,
        Client,
    )>,
) -> (axum::http::StatusCode, String) {
    let known = |a: &Addresses| owner_of(&a.lock().unwrap(), ip).map(|p| p.image.clone());
    let mut image = known(&addresses);
    if image.is_none() {
        look_up(&client, ip, &addresses).await;
        image = known(&addresses);
    }
    match image {
        // No pod has this address any more: as a connection refused would, through a gateway.
        None => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("no pod at {ip}"),
        ),
        Some(i) if i.rsplit(':').next().is_some_and(|t| t.contains("bad")) => {
            (axum::http::StatusCode::INTERNAL_SERVER_ERROR, i)
        }
        Some(i) => (axum::http::StatusCode::OK, i),
    }
}

/// What a batch of requests got: answers by body (the image), and failures by status.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub ok: BTreeMap<String, usize>,
    pub failed: BTreeMap<String, usize>,
}

impl Tally {
    pub fn count(&self, image: &str) -> usize {
        self.ok.get(image).copied().unwrap_or(0)
    }

    pub fn total_ok(&self) -> usize {
        self.ok.values().sum()
    }

    pub fn total_failed(&self) -> usize {
        self.failed.values().sum()
    }

    pub fn add(&mut self, outcome: Result<(u16, String), String>) {
        match outcome {
            Ok((200, body)) => *self.ok.entry(body).or_default() += 1,
            Ok((code, body)) => *self.failed.entry(format!("{code} {body}")).or_default() += 1,
            Err(e) => *self.failed.entry(e).or_default() += 1,
        }
    }
}

async fn request(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let mut req = client.get(url).timeout(Duration::from_secs(10));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let code = resp.status().as_u16();
    let body = resp.text().await.map_err(|e| format!("body failed: {e}"))?;
    Ok((code, body.trim().to_string()))
}

/// Sends `n` requests, 8 at a time, with `headers`.
pub async fn send(url: &str, n: usize, headers: &[(&str, &str)]) -> Tally {
    let client = http();
    let outcomes: Vec<_> = futures::stream::iter(0..n)
        .map(|_| request(&client, url, headers))
        .buffer_unordered(8)
        .collect()
        .await;
    let mut t = Tally::default();
    for o in outcomes {
        t.add(o);
    }
    t
}

/// What a [`Load`] sends: plain HTTP GETs, or gRPC calls of the key-value server's
/// `linnet.kv.Kv/Image` over h2c ([`super::grpc`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
}

/// Requests sent without a pause, 4 at a time, on a thread of their own, until stopped.
pub struct Load {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<std::thread::JoinHandle<Tally>>,
    /// Requests answered so far.
    answered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Load {
    pub fn start(url: &str) -> Load {
        Load::start_with(url, Protocol::Http)
    }

    pub fn start_with(url: &str, protocol: Protocol) -> Load {
        let url = url.to_string();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = answered.clone();
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = http();
                let grpc = super::grpc::GrpcClient::default();
                let one = || async {
                    match protocol {
                        Protocol::Http => request(&client, &url, &[]).await,
                        Protocol::Grpc => grpc.image(&url, &[]).await,
                    }
                };
                let mut tally = Tally::default();
                loop {
                    let batch = futures::future::join_all((0..4).map(|_| one())).await;
                    for o in batch {
                        tally.add(o);
                    }
                    counted.fetch_add(4, std::sync::atomic::Ordering::Relaxed);
                    if stopped.try_recv().is_ok() {
                        return tally;
                    }
                }
            })
        });
        Load {
            stop: Some(stop),
            done: Some(done),
            answered,
        }
    }

    /// Waits until the load is under way (a few batches answered), so that what a test does
    /// next happens under it.
    pub async fn flowing(&self) {
        let answered = self.answered.clone();
        eventually("the load flowing", Duration::from_secs(30), || {
            let n = answered.load(std::sync::atomic::Ordering::Relaxed);
            async move { (n >= 16).then_some(()) }
        })
        .await
    }

    pub fn stop(mut self) -> Tally {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.done.take().unwrap().join().unwrap()
    }
}

/// Whether `count` of `n` requests is what weight `percent` gives, within 5 standard
/// deviations of the binomial (a false alarm once in about 3.5 million runs).
pub fn within_binomial(count: usize, n: usize, percent: i32) -> bool {
    let p = f64::from(percent) / 100.0;
    let expected = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt().max(1.0);
    (count as f64 - expected).abs() <= 5.0 * sd
}

/// The weights of `rules` (an HTTPRoute's), by rule, as Traefik would run them.
pub fn route_weights(rules: &Value) -> Vec<Vec<i64>> {
    rules
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            r["backendRefs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|b| b["weight"].as_i64().unwrap_or(1))
                .collect()
        })
        .collect()
}

/// The ready addresses of Service `svc`'s EndpointSlices.
async fn ready_addresses(
    admin: &Client,
    ns: &str,
    svc: &str,
) -> std::collections::BTreeSet<String> {
    let slices =
        Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(admin.clone(), ns)
            .list(
                &kube::api::ListParams::default()
                    .labels(&format!("kubernetes.io/service-name={svc}")),
            )
            .await
            .map(|l| l.items)
            .unwrap_or_default();
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| e.addresses.clone())
        .collect()
}

/// Keeps Traefik's running configuration in step with an HTTPRoute. Traefik 3.6.12's Gateway
/// provider was seen to keep the configuration from before a burst of changes (a canary
/// start: a set scaled down, another scaled up and the route reweighed within half a second)
/// until some later event of its watches, also with a pod gone from a Service's endpoints for
/// seconds (its provider ignores an EndpointSlice update that changes only an endpoint's
/// conditions); any change of the route made it current. Whenever the running weights differ
/// from the route's, or the servers of one of `services` from its ready endpoints, for 3 s
/// (longer than Traefik's own 2 s providers throttle),
/// this touches an annotation of the route (never its rules) and counts it, so a test can say
/// how often the gateway needed it.
pub struct Converger {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<usize>>,
}

impl Converger {
    pub fn start(
        gateway: &Gateway,
        admin: &Client,
        ns: &str,
        route: &str,
        services: &[&str],
    ) -> Converger {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let api = routes(admin, ns);
        let admin = admin.clone();
        let services: Vec<String> = services.iter().map(|s| s.to_string()).collect();
        let (ns, route) = (ns.to_string(), route.to_string());
        let api_port = gateway.api_port;
        let done = tokio::spawn(async move {
            let probe = Gateway::probe(api_port);
            let mut nudges = 0;
            let mut differs_since: Option<std::time::Instant> = None;
            loop {
                if stopped.try_recv().is_ok() {
                    return nudges;
                }
                if let Ok(r) = api.get(&route).await {
                    let want = route_weights(r.data.pointer("/spec/rules").unwrap_or(&Value::Null));
                    let mut have = probe.running_weights(&ns, &route).await;
                    let mut want_sorted = want.clone();
                    want_sorted.sort();
                    have.sort();
                    let mut same = want_sorted == have;
                    for svc in &services {
                        if probe.running_servers(&ns, svc).await
                            != ready_addresses(&admin, &ns, svc).await
                        {
                            same = false;
                        }
                    }
                    if same {
                        differs_since = None;
                    } else if differs_since.is_some_and(|t| t.elapsed() > Duration::from_secs(3)) {
                        nudges += 1;
                        eprintln!(
                            "gateway: Traefik's configuration for route {ns}/{route} is 3 s behind the cluster (weights {have:?}, the route's {want:?}); touching the route (nudge {nudges})"
                        );
                        let _ = api
                            .patch(
                                &route,
                                &PatchParams::default(),
                                &Patch::Merge(json!({"metadata": {"annotations": {"linnet.dev/test-nudge": nudges.to_string()}}})),
                            )
                            .await;
                        differs_since = None;
                    } else if differs_since.is_none() {
                        differs_since = Some(std::time::Instant::now());
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Converger {
            stop: Some(stop),
            done: Some(done),
        }
    }

    /// Stops, and says how many times the route was touched.
    pub async fn stop(mut self) -> usize {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.done.take().unwrap().await.unwrap_or(0)
    }
}

/// AnalysisTemplate `gateway-errors`: the share of 5xx answers of `web`'s canary Service at
/// the gateway (Traefik's metrics through Prometheus, at `{{ args.prometheus }}`), measured
/// every 2 s, failing above 5 %; `count` measurements pass it (none: until the canary ends).
pub fn gateway_errors(ns: &str, count: Option<u32>) -> Value {
    let canary = r#"service=~".*-web-canary-http-.*""#;
    let mut metric = json!({
        "name": "canary-5xx",
        "interval": "2s",
        "initialDelay": "2s",
        "successCondition": "result < 0.05",
        "failureLimit": 1,
        "provider": {"prometheus": {
            "address": "{{ args.prometheus }}",
            "query": format!(
                "(sum(rate(traefik_service_requests_total{{{canary},code=~\"5..\"}}[5s])) or vector(0)) \
                 / (sum(rate(traefik_service_requests_total{{{canary}}}[5s])) > 0 or vector(1))"
            ),
            "timeout": "2s"
        }}
    });
    if let Some(count) = count {
        metric["count"] = json!(count);
    }
    json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": "gateway-errors", "namespace": ns},
        "spec": {"args": [{"name": "prometheus"}], "metrics": [metric]}
    })
}
