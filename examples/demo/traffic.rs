//! The demo's traffic step: a web app rolled out in batches through a real gateway (Traefik,
//! `tests/gateway/`), 10 % of requests to the new version, then 50 %, then promoted, with the
//! split each time as real requests through the gateway observed it.

use std::path::Path;
use std::time::Duration;

use kube::{Api, Client};
use linnet::api::{CanaryDeployment, DeploymentPhase};

use super::gateway::{Converger, Gateway, Load, PodServers, send};
use super::{NS, Step, git, say, wait};

const PORT: u16 = 8080;

const SHOP: &str = "\
# A web shop rolled out in three batches through the Gateway API: the new version gets 10 %
# of the requests, then 50 %, then all of them, whatever its share of the pods.
apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryDeployment
metadata:
  name: shop
  namespace: demo
spec:
  replicas: 6
  image: shop:v1
  strategy:
    type: Batches
  batches: 3
  pause: All
  currentBatch: 1
  trafficRouting:
    gatewayAPI:
      httpRoutes: [shop]
      port: 8080
    weights: [10, 50, 100]
    settleSeconds: 3
  template:
    selector:
      matchLabels:
        app: shop
    template:
      metadata:
        labels:
          app: shop
      spec:
        containers:
        - name: shop
          image: shop:v1
          ports:
          - containerPort: 8080
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: shop
  namespace: demo
spec:
  parentRefs:
  - name: gw
  rules:
  - backendRefs:
    - name: shop-stable
      port: 8080
";

async fn shop_in(client: &Client, phase: DeploymentPhase, weight: i32) -> Option<()> {
    let s = Api::<CanaryDeployment>::namespaced(client.clone(), NS)
        .get_opt("shop")
        .await
        .ok()??
        .status?;
    (s.phase == Some(phase) && s.canary_weight == Some(weight)).then_some(())
}

/// Waits until Traefik runs `weights` for the route and the Services' ready endpoints.
async fn until_running(gateway: &Gateway, client: &Client, weights: &[i64]) -> Step<()> {
    wait("the gateway to run the route's weights", 60, || async {
        let running = gateway.running_weights(NS, "shop").await;
        let endpoints = gateway.runs_endpoints_of(client, NS, "shop-stable").await
            && gateway.runs_endpoints_of(client, NS, "shop-canary").await;
        (running.iter().any(|w| w == weights) && endpoints).then_some(())
    })
    .await
}

async fn split(gateway: &Gateway, weight: i32) {
    let n = 1000;
    let t = send(&gateway.url(), n, &[]).await;
    println!(
        "    {n} requests through the gateway: {} answered by shop:v1, {} by shop:v2 ({:.1} %; the route gives the canary {weight} %), {} failed",
        t.count("shop:v1"),
        t.count("shop:v2"),
        100.0 * t.count("shop:v2") as f64 / n as f64,
        t.total_failed()
    );
}

pub async fn traffic_step(
    client: &Client,
    work: &Path,
    push: impl Fn(&str) -> Step<()>,
) -> Step<()> {
    say(
        "7. Traffic shifting: a real gateway (Traefik, built from its Go module) in front of a shop app rolled out in 3 batches, 10 % then 50 % of the requests to the new version, then all",
    );
    let gateway = Gateway::start(client, NS).await;
    let _pods = PodServers::start(PORT);
    println!(
        "    Traefik serves Gateway demo/gw on {}; a server on each pod's address answers with its image",
        gateway.url()
    );
    std::fs::create_dir_all(work.join("apps/shop")).map_err(|e| e.to_string())?;
    std::fs::write(work.join("apps/shop/shop.yaml"), SHOP).map_err(|e| e.to_string())?;
    git(work, &["add", "apps/shop/shop.yaml"])?;
    push("shop: a CanaryDeployment with trafficRouting, and its HTTPRoute")?;
    wait("shop to be Completed at weight 0", 120, || {
        shop_in(client, DeploymentPhase::Completed, 0)
    })
    .await?;
    let converger = Converger::start(
        &gateway,
        client,
        NS,
        "shop",
        &["shop-stable", "shop-canary"],
    );
    until_running(&gateway, client, &[100, 0]).await?;
    split(&gateway, 0).await;

    let edit = |from: &str, to: &str| -> Step<()> {
        let path = work.join("apps/shop/shop.yaml");
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        std::fs::write(&path, text.replace(from, to)).map_err(|e| e.to_string())
    };
    edit("image: shop:v1", "image: shop:v2")?;
    push("shop v2")?;
    wait("batch 1 at 10 %", 120, || {
        shop_in(client, DeploymentPhase::Paused, 10)
    })
    .await?;
    until_running(&gateway, client, &[90, 10]).await?;
    split(&gateway, 10).await;

    edit("currentBatch: 1", "currentBatch: 2")?;
    push("Merge pull request: shop batch 2")?;
    wait("batch 2 at 50 %", 120, || {
        shop_in(client, DeploymentPhase::Paused, 50)
    })
    .await?;
    until_running(&gateway, client, &[50, 50]).await?;
    split(&gateway, 50).await;

    let load = Load::start(&gateway.url());
    edit("currentBatch: 2", "currentBatch: 3")?;
    push("Merge pull request: shop batch 3")?;
    wait(
        "shop to be promoted (Completed on shop:v2 at weight 0)",
        180,
        || async {
            let s = Api::<CanaryDeployment>::namespaced(client.clone(), NS)
                .get_opt("shop")
                .await
                .ok()??
                .status?;
            (s.phase == Some(DeploymentPhase::Completed)
                && s.stable_image.as_deref() == Some("shop:v2")
                && s.canary_weight == Some(0))
            .then_some(())
        },
    )
    .await?;
    until_running(&gateway, client, &[100, 0]).await?;
    let during = load.stop();
    println!(
        "    during the last batch and the promotion: {} requests, {} failed ({} on shop:v1, {} on shop:v2)",
        during.total_ok() + during.total_failed(),
        during.total_failed(),
        during.count("shop:v1"),
        during.count("shop:v2")
    );
    println!("    shop:v2 is the stable version now; its Service gets every request:");
    split(&gateway, 0).await;
    let nudges = converger.stop().await;
    println!(
        "    (the demo touched the route {nudges} time(s), when Traefik 3.6.12's configuration was more than 3 s behind it: docs/traffic.md)"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    if during.total_failed() > 0 {
        return Err(format!(
            "{} requests failed during the promotion",
            during.total_failed()
        ));
    }
    Ok(())
}
