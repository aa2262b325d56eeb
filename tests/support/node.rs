//! The real-node tier (tests/node/): pods that really run under containerd and runc on node
//! `linnet-node-0`, whose volumes are real directories. Helpers to put a workload on that
//! node, to talk to the tests' key-value server (tests/node/kvserver) in its pods, to keep a
//! ledger of every key a replica acknowledged and check it after each step, and to see the
//! real processes behind the pods.
//!
//! A test of this tier starts with [`require`]. On a machine that cannot run the node (not
//! root, no overlayfs, no containerd), `tests/cluster/with-cluster.sh` says why in
//! `LINNET_NODE_UNSUPPORTED`, and the test prints it and passes having checked nothing. On a
//! machine that can, a node that is not running fails the test: it is never skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client};
use serde_json::{Value, json};

pub const NODE: &str = "linnet-node-0";
pub const KV_IMAGE: &str = "linnet.test/kv";
const TAINT: &str = "linnet.dev/real-node";
/// This machine's address on the node's bridge (tests/node/env.sh): pods reach a test's
/// servers there.
pub const NODE_GATEWAY: &str = "10.246.0.1";

/// The repository's tests/node directory.
pub fn node_scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node")
}

/// Where the running node keeps its files, as tests/node/env.sh chooses it.
pub fn node_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LINNET_NODE_DIR") {
        return PathBuf::from(dir);
    }
    std::env::temp_dir().join("linnet-node")
}

/// Whether this test can run on the real node. `false` (after saying why) only where the
/// machine cannot run one; panics where it can but the node is not up.
pub async fn require(client: &Client) -> bool {
    if let Ok(why) = std::env::var("LINNET_NODE_UNSUPPORTED")
        && !why.is_empty()
    {
        eprintln!("real-node tier not run: this machine cannot run the real node: {why}");
        return false;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..120 {
        if let Ok(Some(n)) = nodes.get_opt(NODE).await
            && n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let why = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            ". {}/env.sh && node_unsupported",
            node_scripts().display()
        ))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if !why.is_empty() {
        eprintln!("real-node tier not run: this machine cannot run the real node: {why}");
        return false;
    }
    panic!(
        "the real node {NODE} is not Ready, though this machine can run it.\n\
         Start it with `make node-up` (or run everything with `make test`); its logs are in {}/logs",
        node_dir().display()
    );
}

/// Places the pod template `pod` (a PodTemplateSpec) on the real node: its node selector,
/// the toleration of the node's taint, no service account token, a short grace period.
pub fn on_node(pod: &mut Value) {
    let spec = &mut pod["spec"];
    spec["nodeSelector"] = json!({"linnet.dev/node": "real"});
    spec["tolerations"] = json!([{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]);
    spec["automountServiceAccountToken"] = json!(false);
    spec["terminationGracePeriodSeconds"] = json!(5);
}

/// The key-value server's container (image `linnet.test/kv:<tag>`), its volume `data` at
/// /data, ready when its `/ready` answers (checked every second).
pub fn kv_container(tag: &str) -> Value {
    json!({
        "name": "kv",
        "image": format!("{KV_IMAGE}:{tag}"),
        "imagePullPolicy": "Never",
        "env": [
            {"name": "KV_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "KV_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [{"containerPort": 8080, "name": "http"}],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": 8080},
            "periodSeconds": 1, "failureThreshold": 1, "timeoutSeconds": 1
        },
        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
    })
}

/// A CanaryStatefulSet `kv` in `ns`: 3 replicas (1 canary) of the key-value server on image
/// tag `tag`, on the real node, each with a 1Gi volume `data`, with `patch` merged into its
/// spec. What every real-node test, `make bench` and the install test roll out.
pub fn kv_rollout(ns: &str, tag: &str, patch: Value) -> Value {
    let mut pod =
        json!({"metadata": {"labels": {"app": "kv"}}, "spec": {"containers": [kv_container(tag)]}});
    on_node(&mut pod);
    let mut spec = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryStatefulSet",
        "metadata": {"name": "kv", "namespace": ns},
        "spec": {
            "replicas": 3,
            "canaryReplicas": 1,
            "image": format!("{KV_IMAGE}:{tag}"),
            "progressDeadlineSeconds": 90,
            "template": {
                "serviceName": "kv",
                "selector": {"matchLabels": {"app": "kv"}},
                "template": pod,
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
                }]
            }
        }
    });
    super::rollout::merge(&mut spec["spec"], patch);
    spec
}

fn http() -> reqwest::Client {
    linnet::net::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap()
}

/// The IP of pod `name` once it runs and is Ready (waits up to `secs`).
pub async fn ready_pod_ip(pods: &Api<Pod>, name: &str, secs: u64) -> String {
    super::eventually(
        &format!("pod {name} Ready with an IP"),
        Duration::from_secs(secs),
        || async {
            let pod = pods.get_opt(name).await.ok().flatten()?;
            let status = pod.status?;
            let ready = status
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let ip = status.pod_ip?;
            (ready && pod.metadata.deletion_timestamp.is_none()).then_some(ip)
        },
    )
    .await
}

/// GET `path` of the server at `ip`: (status, body).
pub async fn get(ip: &str, path: &str) -> Result<(u16, String), String> {
    let r = http()
        .get(format!("http://{ip}:8080{path}"))
        .send()
        .await
        .map_err(|e| format!("GET {ip}{path}: {e}"))?;
    let status = r.status().as_u16();
    Ok((status, r.text().await.map_err(|e| e.to_string())?))
}

/// PUT `key` = `value` at `ip`; Ok only when the server acknowledged it (204, after fsync).
pub async fn put(ip: &str, key: &str, value: &str) -> Result<(), String> {
    let r = http()
        .put(format!("http://{ip}:8080/kv/{key}"))
        .body(value.to_string())
        .send()
        .await
        .map_err(|e| format!("PUT {ip} {key}: {e}"))?;
    if r.status().as_u16() == 204 {
        Ok(())
    } else {
        Err(format!("PUT {ip} {key}: {}", r.status()))
    }
}

/// The version the server at `ip` answers.
pub async fn version(ip: &str) -> String {
    get(ip, "/version")
        .await
        .map(|(_, b)| b.trim().to_string())
        .unwrap_or_default()
}

/// Every key a replica (by ordinal) acknowledged, with its value: what must survive.
#[derive(Default, Debug)]
pub struct Ledger {
    pub acked: BTreeMap<i32, BTreeMap<String, String>>,
    counter: u32,
}

impl Ledger {
    /// Writes a new key to replica `ordinal` through the pod at `ip`, and records it once
    /// acknowledged. Panics when the write is refused.
    pub async fn write(&mut self, ordinal: i32, ip: &str, tag: &str) {
        self.counter += 1;
        let key = format!("r{ordinal}-{tag}-{}", self.counter);
        let value = format!("value of {key} written to replica {ordinal}");
        put(ip, &key, &value).await.unwrap();
        self.acked.entry(ordinal).or_default().insert(key, value);
    }

    /// Checks the replica at `ip` (ordinal `ordinal`): it answers exactly the keys acknowledged
    /// to that ordinal (none lost, none of another replica's), each with its value, and its
    /// volume was first used by a pod of the same ordinal.
    pub async fn check(&self, ordinal: i32, ip: &str) -> Result<(), String> {
        let empty = BTreeMap::new();
        let acked = self.acked.get(&ordinal).unwrap_or(&empty);
        let (status, keys) = get(ip, "/keys").await?;
        if status != 200 {
            return Err(format!("replica {ordinal} ({ip}): /keys answered {status}"));
        }
        let held: BTreeSet<&str> = keys.lines().collect();
        let wanted: BTreeSet<&str> = acked.keys().map(String::as_str).collect();
        if held != wanted {
            let lost: Vec<_> = wanted.difference(&held).collect();
            let foreign: Vec<_> = held.difference(&wanted).collect();
            return Err(format!(
                "replica {ordinal} ({ip}) lost {lost:?} and holds {foreign:?} it never acknowledged"
            ));
        }
        for (key, value) in acked {
            let (status, got) = get(ip, &format!("/kv/{key}")).await?;
            if status != 200 || &got != value {
                return Err(format!(
                    "replica {ordinal} ({ip}): {key} is {status} {got:?}, not {value:?}"
                ));
            }
        }
        let (_, id) = get(ip, "/id").await?;
        let owner = id.split_whitespace().nth(1).unwrap_or_default();
        if !owner.ends_with(&format!("-{ordinal}")) {
            return Err(format!(
                "replica {ordinal} ({ip}) runs on a volume first used by {owner}"
            ));
        }
        Ok(())
    }

    /// [`Ledger::check`] of every replica, `pods` naming the pod of each ordinal; also that
    /// each answers `version`.
    pub async fn check_all(
        &self,
        pods: &Api<Pod>,
        names: &BTreeMap<i32, String>,
        version: &str,
    ) -> Result<(), String> {
        for (ordinal, name) in names {
            let ip = ready_pod_ip(pods, name, 120).await;
            let v = self::version(&ip).await;
            if v != version {
                return Err(format!("{name} answers version {v:?}, not {version}"));
            }
            self.check(*ordinal, &ip).await?;
        }
        Ok(())
    }
}

/// A key-value server process that really runs on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvProcess {
    pub pid: u32,
    pub pod: String,
    pub version: String,
    /// The host directory mounted at /data.
    pub volume: String,
}

/// The key-value server processes of namespace `ns` running on this machine, found in /proc
/// (their environment names the pod), not from the API.
pub fn kv_processes(ns: &str) -> Vec<KvProcess> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let dir = e.path();
        if !std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim() == "kvserver") {
            continue;
        }
        let Ok(environ) = std::fs::read(dir.join("environ")) else {
            continue;
        };
        let env: BTreeMap<String, String> = environ
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let s = String::from_utf8_lossy(kv);
                s.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        if env.get("KV_NAMESPACE").map(String::as_str) != Some(ns) {
            continue;
        }
        // A process that has exited but is not reaped yet is not serving.
        if let Ok(stat) = std::fs::read_to_string(dir.join("stat"))
            && stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        {
            continue;
        }
        let volume = std::fs::read_to_string(dir.join("mountinfo"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.get(4) == Some(&"/data")).then(|| f[3].to_string())
            })
            .unwrap_or_default();
        out.push(KvProcess {
            pid,
            pod: env.get("KV_POD").cloned().unwrap_or_default(),
            version: env.get("KV_VERSION").cloned().unwrap_or_default(),
            volume,
        });
    }
    out.sort_by(|a, b| a.pod.cmp(&b.pod));
    out
}

/// The ordinal at the end of a StatefulSet pod's name.
pub fn ordinal_of(pod: &str) -> Option<i32> {
    pod.rsplit('-').next()?.parse().ok()
}

/// No ordinal has two live processes, and no volume is mounted by two, from the real
/// processes of namespace `ns`.
pub fn check_one_process_per_replica(ns: &str) -> Result<Vec<KvProcess>, String> {
    let procs = kv_processes(ns);
    let mut by_ordinal: BTreeMap<i32, Vec<&str>> = BTreeMap::new();
    let mut by_volume: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in &procs {
        if let Some(k) = ordinal_of(&p.pod) {
            by_ordinal.entry(k).or_default().push(&p.pod);
        }
        by_volume.entry(&p.volume).or_default().push(&p.pod);
    }
    for (k, pods) in &by_ordinal {
        if pods.len() > 1 {
            return Err(format!("ordinal {k} has two live processes: {pods:?}"));
        }
    }
    for (v, pods) in &by_volume {
        if pods.len() > 1 {
            return Err(format!(
                "volume {v} is mounted by two live processes: {pods:?}"
            ));
        }
    }
    Ok(procs)
}

/// Waits until pod `name` is Ready and answers `version` (a pod a StatefulSet replaces keeps
/// its name, so the name alone does not say which version runs).
pub async fn eventually_version(pods: &Api<Pod>, name: &str, want: &str) -> String {
    super::eventually(
        &format!("pod {name} serving {want}"),
        Duration::from_secs(120),
        || async {
            let ip = ready_pod_ip(pods, name, 120).await;
            (version(&ip).await == want).then_some(ip)
        },
    )
    .await
}
