//! Traffic shifting through the Gateway API, with real requests through a real gateway
//! (Traefik, run against the local control plane) to servers on each pod's address. The
//! split each weight gives is checked against the binomial, header routes exactly, and
//! promotion and rollback under steady load lose no request.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use linnet::api::{
    CanaryDeployment, CanaryStatefulSet, DeploymentPhase, PROMOTE_ANNOTATION, StatefulSetPhase,
};
use serde_json::{Value, json};
use support::gateway::{
    Converger, Gateway, Load, PodServers, Protocol, Tally, grpc_route, http_route, routes, send,
    within_binomial,
};
use support::grpc::send_grpc;
use support::prometheus::Prometheus;
use support::rollout::{Fixture, merge};

/// The real node's key-value server listens on this port.
const PORT: u16 = 8080;
/// kwok pods are answered for by [`PodServers`], one listener on every 198.18.0.0/16
/// address: a port no other process of the suite takes. On 8080 (the agent's default
/// `--listen`), an agent a concurrent test binary started held it for a moment, these pod
/// servers fell back to a listener per pod address, and the promotion got thousands of 502s
/// from addresses not yet bound. Under 32768, so never an ephemeral port either.
const KWOK_PORT: u16 = 18080;

fn shop(ns: &str, patch: Value) -> Value {
    let mut spec = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryStatefulSet",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "replicas": 4,
            "canaryReplicas": 1,
            "image": "shop:v1",
            "progressDeadlineSeconds": 120,
            "trafficRouting": {
                "gatewayAPI": {"httpRoutes": ["shop"], "port": KWOK_PORT},
                "weights": [20],
                "headerRoute": {"headers": [{"name": "x-canary", "value": "always"}],
                    "queryParams": [{"name": "beta", "value": "on"}],
                    "cookie": {"name": "tier", "value": "gold"}},
                "settleSeconds": 5,
            },
            "template": {
                "serviceName": "shop",
                "selector": {"matchLabels": {"app": "shop"}},
                "template": {
                    "metadata": {"labels": {"app": "shop"}},
                    "spec": {"containers": [{"name": "shop", "image": "shop:v1",
                        "ports": [{"containerPort": KWOK_PORT}]}]}
                }
            }
        }
    });
    merge(&mut spec["spec"], patch);
    spec
}

fn web(ns: &str) -> Value {
    web_with(ns, json!({}))
}

fn web_with(ns: &str, patch: Value) -> Value {
    let mut spec = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryDeployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": 4,
            "image": "web:v1",
            "strategy": {"type": "Batches"},
            "batches": 2,
            "pause": "First",
            "currentBatch": 1,
            "progressDeadlineSeconds": 120,
            "trafficRouting": {
                "gatewayAPI": {"httpRoutes": ["web"], "port": KWOK_PORT},
                "weights": [30, 100],
                "headerRoute": {"headers": [{"name": "x-canary", "value": "always"}]},
                "settleSeconds": 5,
            },
            "template": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "web:v1",
                        "ports": [{"containerPort": KWOK_PORT}]}]}
                }
            }
        }
    });
    merge(&mut spec["spec"], patch);
    spec
}

/// The Gateway API CRDs, before the test's agent starts (it would see them within a minute).
async fn gateway_api_first() {
    support::gateway::install_gateway_api(&support::admin_client().await).await;
}

/// A gateway and pod servers for the fixture's namespace, and the route `name` in Git.
async fn serve(f: &Fixture, name: &str) -> (Gateway, &'static PodServers) {
    let gateway = Gateway::start(&f.admin, &f.ns.name).await;
    let pods = PodServers::start(KWOK_PORT);
    f.write_file(
        "route.yaml",
        &[http_route(
            &f.ns.name,
            name,
            &format!("{name}-stable"),
            KWOK_PORT,
        )],
    );
    (gateway, pods)
}

/// Stops `load` and checks that none of its requests failed `during` what it names (the
/// gateway's failed requests in the message if some did); returns the tally, also printed.
fn stop_without_a_failed_request(load: Load, gateway: &Gateway, during: &str) -> Tally {
    let tally = load.stop();
    eprintln!("{during}: {tally:?}");
    assert_eq!(
        tally.total_failed(),
        0,
        "requests failed {during}: {tally:?}\n{}",
        gateway.failed_requests(10)
    );
    tally
}

/// Waits until every one of a few requests through the gateway is answered by `image`. Every
/// 10 s it is not, it touches the namespace's routes (an annotation): Traefik's Gateway
/// provider was seen, under the load of three test binaries, to keep a route's first
/// configuration back until some later event (see `support::gateway::Converger`).
async fn wait_serving(gateway: &Gateway, image: &str) {
    wait_serving_by(gateway, image, Protocol::Http).await
}

/// [`wait_serving`], for requests or gRPC calls.
async fn wait_serving_by(gateway: &Gateway, image: &str, protocol: Protocol) {
    let admin = support::admin_client().await;
    let routes = support::gateway::routes(&admin, &gateway.ns);
    let started = std::time::Instant::now();
    let mut nudges = 0u32;
    support::eventually(
        &format!("the gateway to serve {image}"),
        Duration::from_secs(120),
        || {
            let routes = routes.clone();
            let due = started.elapsed() > Duration::from_secs(10 * (u64::from(nudges) + 1));
            if due {
                nudges += 1;
            }
            let n = nudges;
            async move {
                let t = match protocol {
                    Protocol::Http => send(&gateway.url(), 20, &[]).await,
                    Protocol::Grpc => send_grpc(&gateway.url(), 20, &[]).await,
                };
                if t.count(image) == 20 {
                    return Some(());
                }
                if due {
                    eprintln!(
                        "gateway: not serving {image} yet ({t:?}); touching the routes (nudge {n})"
                    );
                    if n % 3 == 1 {
                        eprintln!("traefik runs: {}", gateway.rawdata().await);
                    }
                    let touch = json!({"metadata": {"annotations": {"linnet.dev/test-nudge": n.to_string()}}});
                    for r in routes.list(&Default::default()).await.ok()?.items {
                        let name = r.metadata.name.unwrap_or_default();
                        let _ = routes
                            .patch(&name, &Default::default(), &kube::api::Patch::Merge(&touch))
                            .await;
                    }
                }
                None
            }
        },
    )
    .await;
}

/// Waits until Traefik runs `weights` (by rule, in any order) for the route, and for each of
/// its two Services the ready endpoints as servers.
async fn wait_running(gateway: &Gateway, f: &Fixture, route: &str, weights: &[Vec<i64>]) {
    let mut want = weights.to_vec();
    want.sort();
    let services = [format!("{route}-stable"), format!("{route}-canary")];
    support::eventually(
        &format!(
            "the gateway to run weights {weights:?} for route {route}, and the Services' endpoints"
        ),
        Duration::from_secs(30),
        || async {
            let mut have = gateway.running_weights(&f.ns.name, route).await;
            have.sort();
            let mut same = have == want;
            for svc in &services {
                same &= gateway.runs_endpoints_of(&f.admin, &f.ns.name, svc).await;
            }
            same.then_some(())
        },
    )
    .await;
}

fn weight_of_sts(r: &CanaryStatefulSet) -> Option<i32> {
    r.status.as_ref().and_then(|s| s.canary_weight)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_canary_gets_its_weight_and_canary_route_and_promotes_without_a_failed_request()
{
    gateway_api_first().await;
    let mut f = Fixture::start("traffic-sts", |ns| shop(ns, json!({}))).await;
    let (gateway, _pods) = serve(&f, "shop").await;
    let converger = Converger::start(
        &gateway,
        &f.admin,
        &f.ns.name,
        "shop",
        &["shop-stable", "shop-canary"],
    );
    f.wait_for("Stable at weight 0", 120, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::Stable)
            && weight_of_sts(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, "shop:v1").await;

    f.patch_spec(json!({"image": "shop:v2"}));
    f.wait_for("CanaryActive at weight 20", 120, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::CanaryActive)
            && weight_of_sts(r) == Some(20)
    })
    .await;
    wait_running(&gateway, &f, "shop", &[vec![1], vec![80, 20]]).await;
    let n = 2000;
    let t = send(&gateway.url(), n, &[]).await;
    assert_eq!(
        t.total_failed(),
        0,
        "{t:?}\n{}",
        gateway.failed_requests(10)
    );
    assert_eq!(t.total_ok(), n, "{t:?}");
    let canary = t.count("shop:v2");
    assert!(
        within_binomial(canary, n, 20),
        "{canary} of {n} requests reached the canary at weight 20: {t:?}\n{}\nagain: {:?}\ntraefik: {}",
        debug_state(&f, "shop").await,
        send(&gateway.url(), n, &[]).await,
        gateway.rawdata().await
    );
    // 1 canary pod of 4 would have taken about 25 % without traffic routing; the weight is
    // the route's, not the pods'.
    // The canary route: the header, the query parameter and the cookie (among others), all
    // three; without any one of them, the weight decides.
    let beta = format!("{}?beta=on", gateway.url());
    let cookies = ("cookie", "session=abc; tier=gold");
    let routed = send(&beta, 200, &[("x-canary", "always"), cookies]).await;
    assert_eq!(routed.count("shop:v2"), 200, "canary route: {routed:?}");
    for (without, url, headers) in [
        (
            "the cookie",
            &beta,
            vec![("x-canary", "always"), ("cookie", "tier=golden")],
        ),
        (
            "the query parameter",
            &gateway.url(),
            vec![("x-canary", "always"), cookies],
        ),
        ("the header", &beta, vec![cookies]),
    ] {
        let t = send(url, 400, &headers).await;
        assert_eq!(t.total_ok(), 400, "{t:?}");
        assert!(
            within_binomial(t.count("shop:v2"), 400, 20),
            "without {without}, the weight decides: {t:?}"
        );
    }

    // A route edited by hand is put back.
    let api = routes(&f.admin, &f.ns.name);
    api.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"rules": [{"backendRefs": [{"name": "shop-stable", "port": KWOK_PORT}]}]}}),
        ),
    )
    .await
    .unwrap();
    support::eventually(
        "the route's weights to be put back",
        Duration::from_secs(30),
        || async {
            let route = api.get("shop").await.ok()?;
            let rules = route.data.pointer("/spec/rules")?.as_array()?.clone();
            rules
                .iter()
                .any(|r| {
                    r["backendRefs"]
                        .as_array()
                        .is_some_and(|b| b.len() == 2 && b[1]["weight"] == 20)
                })
                .then_some(())
        },
    )
    .await;

    // Promotion under steady load: all traffic to the canary before a stable pod restarts,
    // back to the (updated) stable pods before the canary stops.
    let load = Load::start(&gateway.url());
    load.flowing().await;
    f.annotate(PROMOTE_ANNOTATION, "true");
    f.wait_for(
        "Stable on shop:v2 at weight 0",
        180,
        |r: &CanaryStatefulSet| {
            let s = r.status.clone().unwrap_or_default();
            s.phase == Some(StatefulSetPhase::Stable)
                && s.stable_image.as_deref() == Some("shop:v2")
                && s.canary_weight == Some(0)
        },
    )
    .await;
    wait_serving(&gateway, "shop:v2").await;
    let during = stop_without_a_failed_request(load, &gateway, "during promotion");
    assert!(during.total_ok() > 100, "the load ran: {during:?}");
    let after = send(&gateway.url(), 300, &[]).await;
    assert_eq!(after.count("shop:v2"), 300, "{after:?}");
    eprintln!("the gateway needed {} nudge(s)", converger.stop().await);
}

fn weight_of_deploy(r: &CanaryDeployment) -> Option<i32> {
    r.status.as_ref().and_then(|s| s.canary_weight)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_batch_gets_its_weight_and_rollback_moves_traffic_back_first() {
    gateway_api_first().await;
    let mut f = Fixture::prepare("traffic-deploy", web).await;
    let port = support::ports::free_port();
    f.start_agent_with(&[format!("--dashboard-listen=127.0.0.1:{port}")])
        .await;
    let (gateway, _pods) = serve(&f, "web").await;
    let f = batch_weight_and_rollback_story(f, gateway, "web:v1", "web:v2").await;
    // Issue 76: the rollout's page charts the share the routes gave the canary over time.
    let mut browser = support::browser::Browser::start().await;
    browser
        .open(&format!(
            "http://127.0.0.1:{port}/#/cdeploy/{}/web",
            f.ns.name
        ))
        .await;
    browser
        .wait_text(&["Over time", "Traffic to the canary (%)"], 30)
        .await;
    let values = browser
        .eval("document.querySelector('[data-chart=\"traffic\"] polyline[data-series=\"canary\"]').dataset.values")
        .await;
    let values: Vec<&str> = values.as_str().unwrap().split(',').collect();
    assert_eq!(
        (values.first(), values.last()),
        (Some(&"0"), Some(&"0")),
        "{values:?}"
    );
    assert!(values.contains(&"30"), "the batch's 30 %: {values:?}");
}

/// A batched CanaryDeployment whose first batch gets weight 30 (checked against the binomial
/// and by header), then an abort under steady load that loses no request.
async fn batch_weight_and_rollback_story(
    mut f: Fixture,
    gateway: Gateway,
    old: &str,
    new: &str,
) -> Fixture {
    let converger = Converger::start(
        &gateway,
        &f.admin,
        &f.ns.name,
        "web",
        &["web-stable", "web-canary"],
    );
    f.wait_for("Completed at weight 0", 120, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Completed)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, old).await;

    f.patch_spec(json!({"image": new}));
    wait_paused_at_30(&f).await;
    wait_running(&gateway, &f, "web", &[vec![1], vec![70, 30]]).await;
    let n = 2000;
    let t = send(&gateway.url(), n, &[]).await;
    assert_eq!(
        t.total_failed(),
        0,
        "{t:?}\n{}",
        gateway.failed_requests(10)
    );
    let canary = t.count(new);
    assert!(
        within_binomial(canary, n, 30),
        "{canary} of {n} requests reached the new version at weight 30: {t:?}"
    );
    let header = send(&gateway.url(), 200, &[("x-canary", "always")]).await;
    assert_eq!(header.count(new), 200, "header route: {header:?}");

    // Abort under steady load: traffic back to the old version before a new pod stops.
    let load = Load::start(&gateway.url());
    load.flowing().await;
    f.annotate(linnet::api::ABORT_ANNOTATION, "true");
    f.wait_for("RolledBack at weight 0", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::RolledBack)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, old).await;
    let during = stop_without_a_failed_request(load, &gateway, "during the rollback");
    assert!(
        during.count(new) > 0,
        "the load saw the canary before the abort: {during:?}"
    );
    eprintln!("the gateway needed {} nudge(s)", converger.stop().await);
    f
}

/// Waits until the batched rollout is Paused after batch 1, at weight 30.
async fn wait_paused_at_30(f: &Fixture) {
    f.wait_for(
        "Paused after batch 1 at weight 30",
        120,
        |r: &CanaryDeployment| {
            r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Paused)
                && weight_of_deploy(r) == Some(30)
        },
    )
    .await;
}

/// The route and the EndpointSlices, for a failure's message.
async fn debug_state(f: &Fixture, route: &str) -> String {
    let r = routes(&f.admin, &f.ns.name).get(route).await.unwrap();
    let slices = f
        .api::<k8s_openapi::api::discovery::v1::EndpointSlice>()
        .list(&Default::default())
        .await
        .unwrap();
    let slices: Vec<String> = slices
        .items
        .iter()
        .map(|s| {
            format!(
                "{}: {:?}",
                s.metadata.name.clone().unwrap_or_default(),
                s.endpoints
                    .iter()
                    .flatten()
                    .map(|e| (
                        e.addresses.clone(),
                        e.conditions.as_ref().and_then(|c| c.ready)
                    ))
                    .collect::<Vec<_>>()
            )
        })
        .collect();
    let mut direct = Vec::new();
    for ip in slices.iter().flat_map(|s| {
        s.split('"')
            .filter(|p| p.starts_with("198.18."))
            .map(str::to_string)
            .collect::<Vec<_>>()
    }) {
        let body = match support::http()
            .get(format!("http://{ip}:{KWOK_PORT}/"))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        direct.push(format!("{ip} -> {body}"));
    }
    format!(
        "route: {}\nslices: {slices:#?}\ndirect: {direct:?}",
        serde_json::to_string(&r.data).unwrap()
    )
}

/// The share of the canary Service's requests that the gateway answered with a 5xx, over
/// the last 5 s, from Traefik's own metrics (0 while it gets none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_answering_500s_to_its_share_is_rolled_back_by_the_gateways_metrics_traffic_first()
{
    gateway_api_first().await;
    let mut f = Fixture::start("traffic-analysis", web).await;
    let (gateway, _pods) = serve(&f, "web").await;
    let converger = Converger::start(
        &gateway,
        &f.admin,
        &f.ns.name,
        "web",
        &["web-stable", "web-canary"],
    );
    let prometheus = Prometheus::scraping(&gateway.metrics_url()).await;
    f.write_file(
        "templates.yaml",
        &[support::gateway::gateway_errors(&f.ns.name, None)],
    );
    f.wait_for("Completed on web:v1", 120, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Completed)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, "web:v1").await;

    let load = Load::start(&gateway.url());
    f.patch_spec(json!({
        "image": "web:bad",
        "analysis": {
            "args": [{"name": "prometheus", "value": prometheus.address()}],
            "background": {"templates": [{"templateName": "gateway-errors"}]},
        },
    }));
    let done = f
        .wait_for("RolledBack at weight 0", 180, |r: &CanaryDeployment| {
            r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::RolledBack)
                && weight_of_deploy(r) == Some(0)
        })
        .await;
    wait_serving(&gateway, "web:v1").await;
    let during = load.stop();
    let status = done.status.unwrap();
    let message = status.message.clone().unwrap_or_default();
    assert!(message.contains("canary-5xx"), "{message}");
    // The canary's 500s are what the analysis saw; nothing else failed: no request reached a
    // pod that was gone, before, during or after the rollback.
    let failed: Vec<&String> = during.failed.keys().collect();
    assert!(
        during.failed.keys().all(|k| k == "500 web:bad"),
        "only the bad canary's own answers failed: {failed:?}"
    );
    assert!(
        during.total_failed() > 0,
        "the canary got its share: {during:?}"
    );
    let after = send(&gateway.url(), 300, &[]).await;
    assert_eq!(after.count("web:v1"), 300, "{after:?}");
    eprintln!("the gateway needed {} nudge(s)", converger.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_canary_keeps_its_weight_across_a_kill_9_and_an_abort_moves_traffic_back_first() {
    gateway_api_first().await;
    let mut f = Fixture::start("traffic-part", |ns| {
        shop(
            ns,
            json!({
                "strategy": {"type": "Partition"},
                "canaryReplicas": 2,
                "trafficRouting": {"weights": [50]},
            }),
        )
    })
    .await;
    let (gateway, _pods) = serve(&f, "shop").await;
    let converger = Converger::start(
        &gateway,
        &f.admin,
        &f.ns.name,
        "shop",
        &["shop-stable", "shop-canary"],
    );
    f.wait_for("Stable at weight 0", 120, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::Stable)
            && weight_of_sts(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, "shop:v1").await;

    f.patch_spec(json!({"image": "shop:v2"}));
    f.wait_for("CanaryActive at weight 50", 120, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::CanaryActive)
            && weight_of_sts(r) == Some(50)
    })
    .await;
    // The route is re-derived from status by a restarted agent: it stays at 50 %.
    f.kill_agent();
    f.start_agent().await;
    wait_running(&gateway, &f, "shop", &[vec![1], vec![50, 50]]).await;
    let n = 2000;
    let t = send(&gateway.url(), n, &[]).await;
    assert_eq!(
        t.total_failed(),
        0,
        "{t:?}\n{}",
        gateway.failed_requests(10)
    );
    let canary = t.count("shop:v2");
    assert!(
        within_binomial(canary, n, 50),
        "{canary} of {n} requests reached the canary (the two top ordinals, by revision) at weight 50: {t:?}"
    );

    let load = Load::start(&gateway.url());
    load.flowing().await;
    f.annotate(linnet::api::ABORT_ANNOTATION, "true");
    f.wait_for("RolledBack at weight 0", 180, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::RolledBack)
            && weight_of_sts(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, "shop:v1").await;
    let during = load.stop();
    assert_eq!(
        during.total_failed(),
        0,
        "requests failed during the rollback: {during:?}\n{}\npods: {:?}\n{}",
        debug_state(&f, "shop").await,
        _pods.images(&f.ns.name),
        gateway.failed_requests(10)
    );
    assert!(
        during.count("shop:v2") > 0,
        "the load saw the canary before the abort: {during:?}"
    );
    eprintln!("the gateway needed {} nudge(s)", converger.stop().await);
}

/// The pod template of app `app` on the real node: the key-value server on port PORT, which
/// answers its image's name, and stops as a real pod does (a 2 s preStop sleep, then SIGTERM).
fn real_pod(app: &str) -> Value {
    let mut container = support::node::kv_container("v1");
    container["name"] = json!(app);
    container["ports"] = json!([{"containerPort": PORT}]);
    container["lifecycle"] = json!({"preStop": {"sleep": {"seconds": 2}}});
    container["volumeMounts"] = json!([]);
    let mut pod =
        json!({"metadata": {"labels": {"app": app}}, "spec": {"containers": [container]}});
    support::node::on_node(&mut pod);
    pod
}

/// The fixture `prefix` of `make` (shop or web_with) on the real node, on image
/// linnet.test/kv:v1, with a gateway and the route `app` to `<app>-stable`, its agent checking
/// drift every 2 s (issue 69: the stories hold with the drift check on); `None` (having said
/// why) where the machine cannot run the node.
async fn on_the_real_node(
    prefix: &str,
    app: &str,
    make: fn(&str, Value) -> Value,
) -> Option<(Fixture, Gateway)> {
    let admin = support::admin_client().await;
    if !support::node::require(&admin).await {
        return None;
    }
    gateway_api_first().await;
    let pod = real_pod(app);
    let mut f = Fixture::prepare(prefix, |ns| {
        make(
            ns,
            json!({"image": "linnet.test/kv:v1", "template": {"template": pod},
                "trafficRouting": {"gatewayAPI": {"httpRoutes": [app], "port": PORT}}}),
        )
    })
    .await;
    let gateway = Gateway::start(&f.admin, &f.ns.name).await;
    f.write_file(
        "route.yaml",
        &[http_route(&f.ns.name, app, &format!("{app}-stable"), PORT)],
    );
    f.start_agent_with(&["--drift-interval=2s".to_string()])
        .await;
    Some((f, gateway))
}

/// Issue 68: the same story with pods that really run (the real-node tier): the key-value
/// server answers its image's name, the gateway reaches each pod on its bridge address, and
/// each pod stops as a real one does (a 2 s preStop sleep, then SIGTERM). The weight's split
/// is checked against the binomial, and neither promotion nor an abort under steady load
/// loses a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_pods_get_their_weight_and_promotion_and_abort_lose_no_request() {
    let Some((mut f, gateway)) = on_the_real_node("traffic-node", "shop", shop).await else {
        return;
    };
    let converger = Converger::start(
        &gateway,
        &f.admin,
        &f.ns.name,
        "shop",
        &["shop-stable", "shop-canary"],
    );
    let sts_in = |phase: StatefulSetPhase, image: &'static str, weight: i32| {
        move |r: &CanaryStatefulSet| {
            let s = r.status.clone().unwrap_or_default();
            s.phase == Some(phase)
                && s.canary_weight == Some(weight)
                && (phase != StatefulSetPhase::Stable || s.stable_image.as_deref() == Some(image))
        }
    };
    f.wait_for(
        "Stable at weight 0",
        180,
        sts_in(StatefulSetPhase::Stable, "linnet.test/kv:v1", 0),
    )
    .await;
    wait_serving(&gateway, "linnet.test/kv:v1").await;

    f.patch_spec(json!({"image": "linnet.test/kv:v2"}));
    f.wait_for(
        "CanaryActive at weight 20",
        180,
        sts_in(StatefulSetPhase::CanaryActive, "", 20),
    )
    .await;
    // Issue 75: the weight is a metric too (Flagger's flagger_canary_weight).
    let metrics = f.agent.as_ref().unwrap().metrics().await;
    let series = format!(
        r#"linnet_rollout_canary_weight{{kind="CanaryStatefulSet",namespace="{}",name="shop"}} 20"#,
        f.ns.name
    );
    assert!(metrics.contains(&series), "no {series} in:\n{metrics}");
    wait_running(&gateway, &f, "shop", &[vec![1], vec![80, 20]]).await;
    let n = 1000;
    let t = send(&gateway.url(), n, &[]).await;
    assert_eq!(
        t.total_failed(),
        0,
        "{t:?}\n{}",
        gateway.failed_requests(10)
    );
    let canary = t.count("linnet.test/kv:v2");
    assert!(
        within_binomial(canary, n, 20),
        "{canary} of {n} requests reached the real canary pod at weight 20: {t:?}"
    );
    // The canary route (`shop`'s header, query parameter and cookie).
    let header = send(
        &format!("{}?beta=on", gateway.url()),
        100,
        &[("x-canary", "always"), ("cookie", "tier=gold")],
    )
    .await;
    assert_eq!(
        header.count("linnet.test/kv:v2"),
        100,
        "canary route: {header:?}"
    );

    // Promotion under steady load.
    let load = Load::start(&gateway.url());
    load.flowing().await;
    f.annotate(PROMOTE_ANNOTATION, "linnet.test/kv:v2");
    f.wait_for(
        "Stable on v2 at weight 0",
        180,
        sts_in(StatefulSetPhase::Stable, "linnet.test/kv:v2", 0),
    )
    .await;
    wait_serving(&gateway, "linnet.test/kv:v2").await;
    let during = stop_without_a_failed_request(load, &gateway, "during promotion");
    assert!(during.total_ok() > 100, "the load ran: {during:?}");

    // An abort under steady load: traffic back to stable before the canary pod stops.
    f.patch_spec(json!({"image": "linnet.test/kv:v3"}));
    f.wait_for(
        "a v3 canary at weight 20",
        180,
        sts_in(StatefulSetPhase::CanaryActive, "", 20),
    )
    .await;
    let load = Load::start(&gateway.url());
    load.flowing().await;
    f.annotate(linnet::api::ABORT_ANNOTATION, "true");
    f.wait_for("RolledBack", 180, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::RolledBack)
    })
    .await;
    wait_serving(&gateway, "linnet.test/kv:v2").await;
    stop_without_a_failed_request(load, &gateway, "during the abort");
    f.assert_no_drift_reverted();
    eprintln!("the gateway needed {} nudge(s)", converger.stop().await);
}

/// Issue 68: the batched story on pods that really run (the real-node tier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_pods_of_a_batch_get_their_weight_and_an_abort_loses_no_request() {
    let Some((f, gateway)) = on_the_real_node("traffic-node-batch", "web", web_with).await else {
        return;
    };
    let f =
        batch_weight_and_rollback_story(f, gateway, "linnet.test/kv:v1", "linnet.test/kv:v2").await;
    f.assert_no_drift_reverted();
}

/// `web` as a blue-green rollout (issue 75): the preview waits for approval (`pause: First`),
/// and the old version outlives the switch by a long delay unless `patch` says otherwise.
fn blue_green_web(ns: &str, patch: Value) -> Value {
    let mut spec = web_with(
        ns,
        json!({"replicas": 2, "strategy": {"type": "BlueGreen",
            "blueGreen": {"scaleDownDelaySeconds": 600}}}),
    );
    if let Some(routing) = spec["spec"]["trafficRouting"].as_object_mut() {
        routing.remove("weights");
    }
    spec["spec"].as_object_mut().unwrap().remove("batches");
    merge(&mut spec["spec"], patch);
    spec
}

/// The names of the running pods of the rollout on `image`.
async fn pods_on(f: &Fixture, image: &str) -> Vec<String> {
    let pods = f.api::<k8s_openapi::api::core::v1::Pod>();
    let list = pods.list(&Default::default()).await.unwrap();
    let mut names: Vec<String> = list
        .items
        .into_iter()
        .filter(|p| {
            p.spec.as_ref().is_some_and(|s| {
                s.containers
                    .iter()
                    .any(|c| c.image.as_deref() == Some(image))
            }) && p.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

fn message_of(r: &CanaryDeployment) -> String {
    r.status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}

/// Issue 75: blue-green on pods that really run, through the real gateway. The new version
/// runs whole beside the old one and answers only the header route (the preview); the
/// approval in Git switches every request at once, and an abort switches them straight
/// back to the old version's pods, which never stopped; a later image completes once the
/// scale-down delay is over. No request fails across the switches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blue_green_on_real_pods_switches_and_switches_back_without_a_failed_request() {
    let Some((mut f, gateway)) = on_the_real_node("traffic-node-bg", "web", blue_green_web).await
    else {
        return;
    };
    let (v1, v2, v3) = (
        "linnet.test/kv:v1",
        "linnet.test/kv:v2",
        "linnet.test/kv:v3",
    );
    let converger = Converger::start(
        &gateway,
        &f.admin,
        &f.ns.name,
        "web",
        &["web-stable", "web-canary"],
    );
    f.wait_for("Completed at weight 0", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Completed)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, v1).await;
    let old_pods = pods_on(&f, v1).await;
    assert_eq!(old_pods.len(), 2, "{old_pods:?}");

    // The preview: the whole new version, reached only by the header route.
    f.patch_spec(json!({"image": v2}));
    f.wait_for("Paused before the switch", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Paused)
            && message_of(r).contains("waiting for approval to switch")
    })
    .await;
    assert_eq!(pods_on(&f, v2).await.len(), 2, "the preview is whole");
    support::eventually(
        "the gateway to run the header route",
        Duration::from_secs(60),
        || async {
            let t = send(&gateway.url(), 20, &[("x-canary", "always")]).await;
            (t.count(v2) == 20).then_some(())
        },
    )
    .await;
    let plain = send(&gateway.url(), 200, &[]).await;
    assert_eq!(plain.count(v1), 200, "before the switch: {plain:?}");
    let preview = send(&gateway.url(), 100, &[("x-canary", "always")]).await;
    assert_eq!(preview.count(v2), 100, "the preview by header: {preview:?}");

    switch_under_load(&mut f, &gateway, (v1, v2), &old_pods).await;
    abort_under_load(&mut f, &gateway, v1, &old_pods).await;

    // A later image, approved ahead (currentBatch stays 2), completes after a short delay.
    let load = Load::start(&gateway.url());
    load.flowing().await;
    f.patch_spec(json!({"image": v3, "strategy": {"blueGreen": {"scaleDownDelaySeconds": 5}}}));
    f.wait_for(
        "Completed on v3 at weight 0",
        240,
        |r: &CanaryDeployment| {
            let s = r.status.clone().unwrap_or_default();
            s.phase == Some(DeploymentPhase::Completed)
                && s.stable_image.as_deref() == Some(v3)
                && s.canary_weight == Some(0)
        },
    )
    .await;
    wait_serving(&gateway, v3).await;
    let during = stop_without_a_failed_request(load, &gateway, "during the completion");
    assert!(during.count(v3) > 0, "{during:?}");
    support::eventually("the old version gone", Duration::from_secs(60), || async {
        pods_on(&f, v1).await.is_empty().then_some(())
    })
    .await;
    f.assert_no_drift_reverted();
    eprintln!("the gateway needed {} nudge(s)", converger.stop().await);
}

/// Regression (issue 69): every drift check (every 3 minutes, and at start) put Git's rules
/// back on a route a rollout weighs ("reverted changes made outside Git ... spec.rules"), and
/// the rollout set its weights again: the canary share went 50 → 0 → 50, and the stable
/// Deployment was scaled up and down. Here drift checks run every 2 s, for 12 s at weight 30
/// and again after completion: the route is never written, no pod made or deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drift_check_never_undoes_the_weights_a_rollout_set() {
    gateway_api_first().await;
    let mut f = Fixture::prepare("traffic-drift", web).await;
    let (gateway, _pods) = serve(&f, "web").await;
    f.start_agent_with(&["--drift-interval=2s".to_string()])
        .await;
    f.wait_for("Completed at weight 0", 120, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Completed)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, "web:v1").await;
    quiet_for(&f, "completed at weight 0").await;

    f.patch_spec(json!({"image": "web:v2"}));
    wait_paused_at_30(&f).await;
    wait_running(&gateway, &f, "web", &[vec![1], vec![70, 30]]).await;
    quiet_for(&f, "paused at weight 30").await;
    wait_running(&gateway, &f, "web", &[vec![1], vec![70, 30]]).await;
    assert!(
        !f.event_reasons_of("HTTPRoute")
            .await
            .iter()
            .any(|r| r == "DriftReverted"),
        "a DriftReverted event on the route"
    );
    f.assert_no_drift_reverted();
}

/// Asserts that for 12 s (six drift checks) the route `web` is not written and no pod of the
/// namespace comes or goes.
async fn quiet_for(f: &Fixture, what: &str) {
    use k8s_openapi::api::core::v1::Pod;
    let route_generation = || async {
        routes(&f.admin, &f.ns.name)
            .get("web")
            .await
            .unwrap()
            .metadata
            .generation
    };
    let pod_names = || async {
        let mut names: Vec<String> = f
            .api::<Pod>()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        names.sort();
        names
    };
    let (generation, pods) = (route_generation().await, pod_names().await);
    support::holds_for(
        &format!("{what}: the route and the pods through six drift checks"),
        Duration::from_secs(12),
        || async {
            if route_generation().await != generation {
                return Err(format!(
                    "the route was rewritten during drift checks\n{}",
                    debug_state(f, "web").await
                ));
            }
            match pod_names().await {
                now if now == pods => Ok(()),
                now => Err(format!("pods came or went: {pods:?} -> {now:?}")),
            }
        },
    )
    .await;
}

/// `web` weighed through a GRPCRoute alone (issue 75): the key-value server's gRPC service
/// behind GRPCRoute `web-grpc`.
fn web_grpc(ns: &str, patch: Value) -> Value {
    let mut spec = web_with(ns, patch);
    spec["spec"]["trafficRouting"]["gatewayAPI"] =
        json!({"grpcRoutes": ["web-grpc"], "port": PORT});
    spec
}

/// Issue 75: a GRPCRoute, with real gRPC calls (HTTP/2 without TLS, through Traefik, to the
/// key-value server's grpc-go service on real pods). The first batch's weight is checked
/// against the binomial and the header route exactly (gRPC metadata), and an abort under a
/// steady stream of calls loses none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_route_gets_its_weight_and_canary_route_and_an_abort_loses_no_call() {
    let Some((mut f, gateway)) = on_the_real_node("traffic-grpc", "web", web_grpc).await else {
        return;
    };
    f.write_file(
        "grpc-route.yaml",
        &[grpc_route(&f.ns.name, "web-grpc", "web-stable", PORT)],
    );
    // Traefik keeps a Service's servers from before some changes until a later event (see
    // Converger): touching the HTTPRoute `web` (to web-stable, not weighed here) makes its
    // whole configuration current, the GRPCRoute's servers too.
    let converger = Converger::start(
        &gateway,
        &f.admin,
        &f.ns.name,
        "web",
        &["web-stable", "web-canary"],
    );
    let (old, new) = ("linnet.test/kv:v1", "linnet.test/kv:v2");
    f.wait_for("Completed at weight 0", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Completed)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving_by(&gateway, old, Protocol::Grpc).await;

    f.patch_spec(json!({"image": new}));
    wait_paused_at_30(&f).await;
    support::eventually(
        "the gateway to run weight 30 and the canary route for GRPCRoute web-grpc, and the Services' endpoints",
        Duration::from_secs(60),
        || async {
            let mut have = gateway.running_grpc_weights(&f.ns.name, "web-grpc").await;
            have.sort();
            let mut same = have == [vec![1], vec![70, 30]];
            for svc in ["web-stable", "web-canary"] {
                same &= gateway.runs_endpoints_of(&f.admin, &f.ns.name, svc).await;
            }
            same.then_some(())
        },
    )
    .await;
    let n = 1000;
    let t = send_grpc(&gateway.url(), n, &[]).await;
    assert_eq!(
        t.total_failed(),
        0,
        "{t:?}\n{}",
        gateway.failed_requests(10)
    );
    let canary = t.count(new);
    assert!(
        within_binomial(canary, n, 30),
        "{canary} of {n} gRPC calls reached the new version at weight 30: {t:?}"
    );
    let header = send_grpc(&gateway.url(), 100, &[("x-canary", "always")]).await;
    assert_eq!(header.count(new), 100, "canary route: {header:?}");

    // Abort under a steady stream of calls: traffic back to the old version first.
    let load = Load::start_with(&gateway.url(), Protocol::Grpc);
    load.flowing().await;
    f.annotate(linnet::api::ABORT_ANNOTATION, "true");
    f.wait_for("RolledBack at weight 0", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::RolledBack)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving_by(&gateway, old, Protocol::Grpc).await;
    let during = stop_without_a_failed_request(load, &gateway, "gRPC calls during the rollback");
    assert!(
        during.count(new) > 0,
        "the calls saw the canary before the abort: {during:?}"
    );
    // The route as linnet left it: its own rule, all to stable, and the canary beside it.
    let route = support::gateway::grpc_routes(&f.admin, &f.ns.name)
        .get("web-grpc")
        .await
        .unwrap();
    let rules = route.data.pointer("/spec/rules").unwrap();
    assert_eq!(rules.as_array().unwrap().len(), 1, "{rules}");
    assert_eq!(rules[0]["matches"][0]["method"]["service"], "linnet.kv.Kv");
    assert_eq!(support::gateway::route_weights(rules), [vec![100, 0]]);
    // The Services say their port speaks cleartext HTTP/2, as a GRPCRoute's backend must.
    let stable = f
        .api::<k8s_openapi::api::core::v1::Service>()
        .get("web-stable")
        .await
        .unwrap();
    let port = &stable.spec.unwrap().ports.unwrap()[0];
    assert_eq!(port.app_protocol.as_deref(), Some("kubernetes.io/h2c"));
    f.assert_no_drift_reverted();
    eprintln!("the gateway needed {} nudge(s)", converger.stop().await);
}

/// `web` with baseline pods (issue 75).
fn web_baseline(ns: &str, patch: Value) -> Value {
    let mut spec = web_with(ns, patch);
    spec["spec"]["strategy"]["baseline"] = json!(true);
    spec
}

/// Issue 75: baseline pods with traffic routing, on the real node. At batch 1 (weight 30)
/// the route sends 30 % to the canary's pods, 30 % to the baseline's (pods of the stable
/// image, started with the batch) and the rest to the stable version's, each counted by the
/// pod that answered; an abort under load loses no request and the baseline's pods go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_pods_get_the_canarys_share_and_an_abort_loses_no_request() {
    let Some((mut f, gateway)) = on_the_real_node("traffic-baseline", "web", web_baseline).await
    else {
        return;
    };
    let converger = Converger::start(
        &gateway,
        &f.admin,
        &f.ns.name,
        "web",
        &["web-stable", "web-canary", "web-baseline"],
    );
    let (old, new) = ("linnet.test/kv:v1", "linnet.test/kv:v2");
    f.wait_for("Completed at weight 0", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Completed)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, old).await;

    f.patch_spec(json!({"image": new}));
    wait_paused_at_30(&f).await;
    wait_running(&gateway, &f, "web", &[vec![1], vec![40, 30, 30]]).await;
    assert!(
        gateway
            .runs_endpoints_of(&f.admin, &f.ns.name, "web-baseline")
            .await,
        "the gateway runs the baseline's pods"
    );
    let deployments = f
        .api::<k8s_openapi::api::apps::v1::Deployment>()
        .list(&Default::default())
        .await
        .unwrap();
    let canary = deployments
        .items
        .iter()
        .find(|d| {
            let image = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
            image.is_some_and(|p| p.containers[0].image.as_deref() == Some(new))
        })
        .and_then(|d| d.metadata.name.clone())
        .unwrap();
    // Who answered: /id is the pod's name (and its volume's first owner).
    let n = 1200;
    let t = send(&format!("{}id", gateway.url()), n, &[]).await;
    assert_eq!(
        t.total_failed(),
        0,
        "{t:?}\n{}",
        gateway.failed_requests(10)
    );
    let by = |prefix: &str| -> usize {
        t.ok.iter()
            .filter(|(pod, _)| pod.starts_with(prefix))
            .map(|(_, c)| c)
            .sum()
    };
    let (to_canary, to_baseline) = (by(&format!("{canary}-")), by("web-baseline-"));
    assert!(
        within_binomial(to_canary, n, 30) && within_binomial(to_baseline, n, 30),
        "{to_canary} of {n} to the canary and {to_baseline} to the baseline at 30 % each: {t:?}"
    );

    // Abort under load: the canary's and the baseline's shares back to stable before their
    // pods stop.
    let load = Load::start(&gateway.url());
    load.flowing().await;
    f.annotate(linnet::api::ABORT_ANNOTATION, "true");
    f.wait_for("RolledBack at weight 0", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::RolledBack)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving(&gateway, old).await;
    support::eventually(
        "the baseline's Deployment deleted",
        Duration::from_secs(60),
        || async {
            let d = f.api::<k8s_openapi::api::apps::v1::Deployment>();
            d.get_opt("web-baseline")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    stop_without_a_failed_request(load, &gateway, "during the rollback with a baseline");
    f.assert_no_drift_reverted();
    eprintln!("the gateway needed {} nudge(s)", converger.stop().await);
}

/// A blue-green rollout paused at its preview of `v2` (`old` the pods of `v1`): the approval in
/// Git switches every request under steady load, and no request fails; the old pods stay.
async fn switch_under_load(
    f: &mut Fixture,
    gateway: &Gateway,
    (v1, v2): (&str, &str),
    old: &[String],
) {
    let load = Load::start(&gateway.url());
    load.flowing().await;
    f.patch_spec(json!({"currentBatch": 2}));
    f.wait_for(
        "switched, the old version waiting",
        180,
        |r: &CanaryDeployment| {
            weight_of_deploy(r) == Some(100) && message_of(r).contains("scaleDownDelaySeconds")
        },
    )
    .await;
    wait_serving(gateway, v2).await;
    let during = stop_without_a_failed_request(load, gateway, "during the switch");
    assert!(during.count(v1) > 0 && during.count(v2) > 0, "{during:?}");
    assert_eq!(pods_on(f, v1).await, old, "the old version kept its pods");
}

/// Switching back: an abort puts every request on the old pods of `v1` (`old`), which never
/// stopped, under steady load, and no request fails.
async fn abort_under_load(f: &mut Fixture, gateway: &Gateway, v1: &str, old: &[String]) {
    let load = Load::start(&gateway.url());
    load.flowing().await;
    f.annotate(linnet::api::ABORT_ANNOTATION, "true");
    f.wait_for("RolledBack at weight 0", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::RolledBack)
            && weight_of_deploy(r) == Some(0)
    })
    .await;
    wait_serving(gateway, v1).await;
    stop_without_a_failed_request(load, gateway, "switching back");
    assert_eq!(pods_on(f, v1).await, old, "no old pod restarted");
}

/// The user's Service `name` for `web`'s pods (all versions: linnet adds the version).
fn web_service(ns: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": PORT}]},
    })
}

/// The version label Service `name` selects.
async fn selected_version(f: &Fixture, name: &str) -> Option<String> {
    let svc = f
        .api::<k8s_openapi::api::core::v1::Service>()
        .get(name)
        .await
        .ok()?;
    svc.spec?
        .selector?
        .get("rollouts.linnet.dev/version")
        .cloned()
}

/// Issue 75: blue-green without a gateway of linnet's (`blueGreen.activeService`), on pods that
/// really run. The user's own Services, in Git, are switched by their selector: `web` (the
/// active one) selects the old version until the approval, then the new one; `web-preview`
/// the new one. The user's route (to those Services) only carries the requests, as a
/// kube-proxy would. Neither the switch nor the abort under load fails a request; a Git change
/// to the Service keeps the version linnet set (its selector is an atomic map); drift checks
/// every 2 s never undo it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blue_green_by_service_selector_switches_and_switches_back_without_a_failed_request() {
    let admin = support::admin_client().await;
    if !support::node::require(&admin).await {
        return;
    }
    gateway_api_first().await;
    let (v1, v2) = ("linnet.test/kv:v1", "linnet.test/kv:v2");
    let mut f = Fixture::prepare("traffic-node-bgsvc", |ns| {
        let mut spec = blue_green_web(
            ns,
            json!({"image": v1, "template": {"template": real_pod("web")},
                "strategy": {"blueGreen": {"activeService": "web",
                    "previewService": "web-preview"}}}),
        );
        spec["spec"]
            .as_object_mut()
            .unwrap()
            .remove("trafficRouting");
        spec
    })
    .await;
    let ns = f.ns.name.clone();
    let gateway = Gateway::start(&f.admin, &ns).await;
    let mut route = http_route(&ns, "web", "web", PORT);
    route["spec"]["rules"] = json!([
        {"matches": [{"headers": [{"name": "x-preview", "value": "yes"}]}],
         "backendRefs": [{"name": "web-preview", "port": PORT}]},
        {"backendRefs": [{"name": "web", "port": PORT}]},
    ]);
    let services = |tier: &str| {
        vec![
            web_service(&ns, "web", json!({"tier": tier})),
            web_service(&ns, "web-preview", json!({})),
            route.clone(),
        ]
    };
    f.write_file("route.yaml", &services("front"));
    f.start_agent_with(&["--drift-interval=2s".to_string()])
        .await;
    let converger = Converger::start(&gateway, &f.admin, &ns, "web", &["web", "web-preview"]);
    f.wait_for("Completed", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Completed)
    })
    .await;
    let v1_version = selected_version(&f, "web").await;
    assert!(
        v1_version.is_some(),
        "the active Service points at v1's version"
    );
    wait_serving(&gateway, v1).await;
    let old_pods = pods_on(&f, v1).await;
    assert_eq!(old_pods.len(), 2, "{old_pods:?}");

    // The preview: the new version whole, through the preview Service only.
    f.patch_spec(json!({"image": v2}));
    f.wait_for("Paused before the switch", 180, |r: &CanaryDeployment| {
        r.status.as_ref().and_then(|s| s.phase) == Some(DeploymentPhase::Paused)
            && message_of(r).contains("waiting for approval to switch")
    })
    .await;
    support::eventually(
        "the preview through its Service",
        Duration::from_secs(60),
        || async {
            let t = send(&gateway.url(), 20, &[("x-preview", "yes")]).await;
            (t.count(v2) == 20).then_some(())
        },
    )
    .await;
    let plain = send(&gateway.url(), 200, &[]).await;
    assert_eq!(plain.count(v1), 200, "before the switch: {plain:?}");

    // A Git change to the active Service keeps its version key.
    f.write_file("route.yaml", &services("web"));
    support::eventually(
        "Git's label on the Service",
        Duration::from_secs(60),
        || async {
            let svc = f
                .api::<k8s_openapi::api::core::v1::Service>()
                .get("web")
                .await
                .ok()?;
            (svc.metadata.labels?.get("tier")? == "web").then_some(())
        },
    )
    .await;
    assert_eq!(selected_version(&f, "web").await, v1_version);
    let plain = send(&gateway.url(), 100, &[]).await;
    assert_eq!(
        plain.count(v1),
        100,
        "after Git changed the Service: {plain:?}"
    );

    switch_under_load(&mut f, &gateway, (v1, v2), &old_pods).await;
    assert_ne!(selected_version(&f, "web").await, v1_version);
    abort_under_load(&mut f, &gateway, v1, &old_pods).await;
    assert_eq!(selected_version(&f, "web").await, v1_version);
    f.assert_no_drift_reverted();
    eprintln!("the gateway needed {} nudge(s)", converger.stop().await);
}
