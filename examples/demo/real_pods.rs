//! The demo's last step, on the real node (`tests/node/`, started by `make demo` where the
//! machine can run it): a key-value store whose replicas really run and keep their keys as
//! files on their volumes. Keys are written to every replica; a push starts a canary, which
//! answers replica 2's keys from replica 2's own volume; a merged promotion puts every replica
//! on the new version; and the step prints the keys each replica still holds.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client};
use linnet::api::{CanaryStatefulSet, StatefulSetPhase};

use super::{NS, Step, git, say, wait};

const NODE: &str = "linnet-node-0";

const KV: &str = "\
# A key-value store on the real node: each replica keeps its keys as files on its own volume.
apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryStatefulSet
metadata:
  name: kv
  namespace: demo
spec:
  replicas: 3
  canaryReplicas: 1
  image: linnet.test/kv:v1
  progressDeadlineSeconds: 120
  template:
    serviceName: kv
    selector:
      matchLabels:
        app: kv
    template:
      metadata:
        labels:
          app: kv
      spec:
        # The real node (its kubelet runs containerd and runc); kwok's pods stay off it.
        nodeSelector:
          linnet.dev/node: real
        tolerations:
        - key: linnet.dev/real-node
          operator: Exists
          effect: NoSchedule
        automountServiceAccountToken: false
        terminationGracePeriodSeconds: 5
        containers:
        - name: kv
          image: linnet.test/kv:v1
          imagePullPolicy: Never
          readinessProbe:
            httpGet:
              path: /ready
              port: 8080
            periodSeconds: 1
          volumeMounts:
          - name: data
            mountPath: /data
    volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        accessModes: [ReadWriteOnce]
        resources:
          requests:
            storage: 1Gi
";

fn http() -> reqwest::Client {
    linnet::net::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap_or_default()
}

async fn get(ip: &str, path: &str) -> Option<String> {
    let r = http()
        .get(format!("http://{ip}:8080{path}"))
        .send()
        .await
        .ok()?;
    r.status().is_success().then_some(())?;
    r.text().await.ok()
}

/// The IP of pod `name` once it is Ready and answers `version`.
async fn serving(pods: &Api<Pod>, name: &str, version: &str) -> Step<String> {
    wait(&format!("{name} serving {version}"), 120, || async {
        let pod = pods.get_opt(name).await.ok()??;
        let status = pod.status?;
        let ready = status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let ip = status.pod_ip?;
        (ready && get(&ip, "/version").await?.trim() == version).then_some(ip)
    })
    .await
}

async fn kv_in(client: &Client, phase: StatefulSetPhase, image: &str) -> Option<()> {
    let r = Api::<CanaryStatefulSet>::namespaced(client.clone(), NS)
        .get_opt("kv")
        .await
        .ok()??;
    let s = r.status?;
    (s.phase == Some(phase)
        && (phase != StatefulSetPhase::Stable || s.stable_image.as_deref() == Some(image)))
    .then_some(())
}

/// Why the real node is not here, or `None` when it is Ready.
async fn node_missing(client: &Client) -> Option<String> {
    if let Ok(why) = std::env::var("LINNET_NODE_UNSUPPORTED")
        && !why.is_empty()
    {
        return Some(why);
    }
    let node = Api::<Node>::all(client.clone())
        .get_opt(NODE)
        .await
        .ok()??;
    let ready = node
        .status?
        .conditions?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    (!ready).then(|| format!("node {NODE} is not Ready"))
}

/// The dashboard's replica map of kv, as its page draws it: ordinal 2's volume must be held
/// by the canary's claim.
async fn dashboard_map(dashboard: &str) -> Step<()> {
    let url = format!("{dashboard}/api/rollouts/csts/{NS}/kv/replicas");
    println!("    the dashboard's replica map ({dashboard}/#/csts/{NS}/kv):");
    let map: serde_json::Value = http()
        .get(&url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let mut canary_holds_two = false;
    for row in map["replicas"].as_array().into_iter().flatten() {
        let pods: Vec<String> = row["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let ready = if p["ready"] == true {
                    "ready"
                } else {
                    "not ready"
                };
                format!(
                    "{} ({ready}, {} restarts)",
                    p["name"].as_str().unwrap_or("?"),
                    p["restarts"]
                )
            })
            .collect();
        for v in row["volumes"].as_array().into_iter().flatten() {
            let held = v["heldBy"].as_str().unwrap_or("no claim yet");
            println!(
                "      kv-{}: {} on {}, held by the {held} set's claim {}",
                row["ordinal"],
                pods.join(", "),
                v["volume"].as_str().unwrap_or("?"),
                v["claim"].as_str().unwrap_or("-")
            );
            canary_holds_two |= row["ordinal"] == 2 && held == "canary";
        }
    }
    if !canary_holds_two {
        return Err(format!(
            "the dashboard's map does not show ordinal 2's volume with the canary: {map}"
        ));
    }
    Ok(())
}

pub async fn real_pods_step(
    client: &Client,
    work: &Path,
    dashboard: &str,
    push: impl Fn(&str) -> Step<()>,
) -> Step<()> {
    say(
        "8. Real pods: a key-value store on the real node (a kubelet with containerd and runc), whose replicas keep their keys on their own volumes through a canary and a promotion",
    );
    if let Some(why) = node_missing(client).await {
        println!(
            "    skipped: this machine cannot run the real node ({why}); the steps above ran on kwok"
        );
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    std::fs::create_dir_all(work.join("apps/kv")).map_err(|e| e.to_string())?;
    std::fs::write(work.join("apps/kv/kv.yaml"), KV).map_err(|e| e.to_string())?;
    git(work, &["add", "apps/kv/kv.yaml"])?;
    push("kv: a key-value store on the real node")?;
    wait("kv to be Stable on v1", 180, || {
        kv_in(client, StatefulSetPhase::Stable, "linnet.test/kv:v1")
    })
    .await?;
    let mut written: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for k in 0..3 {
        let ip = serving(&pods, &format!("kv-stable-{k}"), "v1").await?;
        for n in 1..=2 {
            let key = format!("order-{k}{n}");
            let r = http()
                .put(format!("http://{ip}:8080/kv/{key}"))
                .body(format!("written to replica {k}"))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if r.status().as_u16() != 204 {
                return Err(format!("replica {k} refused {key}: {}", r.status()));
            }
            written.entry(k).or_default().push(key);
        }
        println!("    kv-stable-{k} ({ip}): wrote {:?}", written[&k]);
    }

    let edit = |from: &str, to: &str| -> Step<()> {
        let path = work.join("apps/kv/kv.yaml");
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        std::fs::write(&path, text.replace(from, to)).map_err(|e| e.to_string())
    };
    edit("image: linnet.test/kv:v1", "image: linnet.test/kv:v2")?;
    push("kv v2")?;
    wait("kv's canary", 180, || {
        kv_in(client, StatefulSetPhase::CanaryActive, "")
    })
    .await?;
    let ip = serving(&pods, "kv-canary-2", "v2").await?;
    let keys = get(&ip, "/keys").await.unwrap_or_default();
    println!(
        "    kv-canary-2 on v2 ({ip}) answers replica 2's keys from replica 2's volume: {:?}",
        keys.lines().collect::<Vec<_>>()
    );
    if keys.lines().collect::<Vec<_>>() != written[&2] {
        return Err(format!(
            "the canary holds {keys:?}, not replica 2's {:?}",
            written[&2]
        ));
    }
    dashboard_map(dashboard).await?;

    edit(
        "  name: kv\n  namespace: demo\n",
        "  name: kv\n  namespace: demo\n  annotations:\n    rollouts.linnet.dev/promote: linnet.test/kv:v2\n",
    )?;
    push("Merge pull request: promote kv v2")?;
    wait("kv to be Stable on v2", 180, || {
        kv_in(client, StatefulSetPhase::Stable, "linnet.test/kv:v2")
    })
    .await?;
    println!("    the keys each replica still holds, after the canary and the promotion:");
    for k in 0..3 {
        let name = format!("kv-stable-{k}");
        let ip = serving(&pods, &name, "v2").await?;
        let held: Vec<String> = get(&ip, "/keys")
            .await
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        println!("    {name} on v2 ({ip}): {held:?}");
        if held != written[&k] {
            return Err(format!("{name} holds {held:?}, not {:?}", written[&k]));
        }
    }
    Ok(())
}
