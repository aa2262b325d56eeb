//! Issue 52, the dashboard: a real agent on the local control plane serves it
//! (`--dashboard-listen`), and a real Chromium (headless, driven over DevTools) shows a
//! rollout through a canary, its wait for approval and its promotion, following each change
//! by server-sent events in the same page (no reload, no polling). Screenshots are saved
//! under target/dashboard-screenshots/ for a person to look at.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::PathBuf;

use serde_json::{Value, json};
use support::agent::wait_ready;
use support::browser::Browser;
use support::ports::free_port;
use support::rollout::{Fixture, merge};

fn redis(ns: &str) -> Value {
    let mut spec = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryStatefulSet",
        "metadata": {"name": "redis", "namespace": ns},
        "spec": {
            "replicas": 3,
            "canaryReplicas": 1,
            "image": "redis:7.2",
            "template": {
                "serviceName": "redis",
                "selector": {"matchLabels": {"app": "redis"}},
                "template": {
                    "metadata": {"labels": {"app": "redis"}},
                    "spec": {"containers": [{
                        "name": "redis", "image": "redis:7.2",
                        "env": [{"name": "REDIS_PASSWORD", "value": "hunter2-not-for-the-page"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    }]}
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
                }]
            }
        }
    });
    merge(
        &mut spec["spec"],
        json!({"analysis": {"background": {"templates": [{"templateName": "health"}]}}}),
    );
    spec
}

/// A `/latency` endpoint answering `{"ms": n}`, n growing by 7 with each request.
async fn health_endpoint() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let router = axum::Router::new().route(
        "/latency",
        axum::routing::get(move || {
            let n = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { axum::Json(json!({"ms": 20 + 7 * n})) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

fn screenshots() -> PathBuf {
    support::screenshots_dir()
}

#[tokio::test]
async fn the_dashboard_follows_a_canary_live_in_a_real_browser() {
    let mut f = Fixture::prepare("dash", redis).await;
    let ns = f.ns.name.clone();
    // A web analysis whose value changes with each measurement, for its small chart.
    let health = health_endpoint().await;
    f.write_file(
        "templates.yaml",
        &[json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1",
            "kind": "AnalysisTemplate",
            "metadata": {"name": "health", "namespace": ns},
            "spec": {"metrics": [{"name": "latency", "successCondition": "result < 1000",
                "interval": "1s",
                "provider": {"web": {"url": format!("http://127.0.0.1:{health}/latency"),
                    "jsonPath": "$.ms"}}}]}
        })],
    );
    let port = free_port();
    f.start_agent_with(&[format!("--dashboard-listen=127.0.0.1:{port}")])
        .await;
    let base = format!("http://127.0.0.1:{port}");

    let mut browser = Browser::start().await;
    browser.open(&format!("{base}/")).await;
    let list = browser
        .wait_text(&[&format!("{ns}/redis"), "Stable", "redis:7.2", "live"], 90)
        .await;
    assert!(list.contains("CanaryStatefulSet"), "{list}");
    shot(&mut browser, "1-list-stable.png").await;
    // The same document from here on: a reload or a new page would lose this mark.
    browser.eval("window.linnetMark = 'same page'").await;

    // A canary, seen on the rollout's page as it happens.
    browser
        .eval(&format!("location.hash = '#/csts/{ns}/redis'"))
        .await;
    browser
        .wait_text(&["Settled: nothing to do", "Replicas by ordinal"], 10)
        .await;
    f.patch_spec(json!({"image": "redis:7.4"}));
    let waiting = browser
        .wait_text(
            &[
                "Waiting for you: approve in Git",
                "rollouts.linnet.dev/promote: \"true\"",
                "canary · redis:7.4",
                "stable · redis:7.2",
                "redis:7.2 → redis:7.4",
            ],
            90,
        )
        .await;
    // The analysis run and its measurements, drawn as a small chart.
    // The run shows with its first measurement; the chart needs a second (seen once in a
    // run where the page was read between the two).
    browser.wait_text(&["Analysis", "latency"], 30).await;
    // Issue 75: what decides the metric and what it asks, under it.
    browser
        .wait_text(
            &[
                "success when result < 1000; failureLimit 0",
                &format!("GET http://127.0.0.1:{health}/latency"),
            ],
            30,
        )
        .await;
    let mut points = Value::Null;
    for _ in 0..60 {
        points = browser
            .eval("(document.querySelector('svg.spark polyline') || {getAttribute: () => ''}).getAttribute('points')")
            .await;
        if points.as_str().is_some_and(|p| p.split(' ').count() >= 2) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(
        points.as_str().is_some_and(|p| p.split(' ').count() >= 2),
        "no chart of two measurements or more: {points}"
    );
    // The metric's threshold (`result < 1000`) is drawn as a rule on its chart.
    wait_eval(
        &mut browser,
        "[...document.querySelectorAll('svg.spark line.rule')].map(l => l.dataset.y).join(' ')",
        "1000",
        10,
    )
    .await;
    // Ready pods per version over time, as the cluster has them now: 1 on the canary, 2 stable.
    wait_eval(&mut browser, &last_ready("redis:7.4"), "1", 30).await;
    wait_eval(&mut browser, &last_ready("redis:7.2"), "2", 30).await;
    for ordinal in ["redis-0", "redis-1", "redis-2"] {
        assert!(waiting.contains(ordinal), "{ordinal} not shown:\n{waiting}");
    }
    // Its events and history loaded (history is off: no write-back here).
    browser.wait_text(&["write-back is off", " ago"], 20).await;
    shot(&mut browser, "2-rollout-awaiting-approval.png").await;

    // Promoted in Git: the page settles by itself.
    f.annotate("rollouts.linnet.dev/promote", "true");
    let settled = browser
        .wait_text(&["Settled: nothing to do", "stable · redis:7.4"], 90)
        .await;
    assert!(!settled.contains("canary · "), "{settled}");
    // The canary's timeline: the step the commit opened, and the promotion the annotation did.
    browser
        .wait_text(
            &["Timeline", "CanaryStarted", "PromotionStarted", "Promoted"],
            30,
        )
        .await;
    wait_eval(&mut browser, STAGES, "Step 1:done Promotion:done", 30).await;
    wait_eval(&mut browser, &last_ready("redis:7.4"), "3", 30).await;
    wait_eval(&mut browser, &last_ready("redis:7.2"), "0", 30).await;
    // The rollout's Kubernetes events, as the API server has them, on its page.
    let reasons = f.event_reasons_of("CanaryStatefulSet").await;
    assert!(!reasons.is_empty(), "the rollout recorded no event");
    let shown = browser.wait_text(&["Events", "ago"], 20).await;
    assert!(
        reasons.iter().any(|r| shown.contains(r.as_str())),
        "none of {reasons:?} on the page:\n{shown}"
    );
    shot(&mut browser, "3-rollout-promoted.png").await;
    browser.eval("location.hash = '#/'").await;
    browser.wait_text(&["redis:7.4", "Stable"], 10).await;
    shot(&mut browser, "4-list-promoted.png").await;

    // The source at the top of the list: a spec with an error is named by file:line:column,
    // and the rest of the revision still syncs.
    std::fs::write(
        f.dir.path().join("specs/broken.yaml"),
        format!("apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryStatefulSet\nmetadata:\n  name: broken\n  namespace: {ns}\nspec:\n  replicas: three\n"),
    )
    .unwrap();
    let source = browser
        .wait_text(&["part of it is not applied", "broken.yaml:7:"], 60)
        .await;
    assert!(source.contains("revision "), "{source}");
    shot(&mut browser, "4-list-spec-error.png").await;
    let api: Value = support::http()
        .get(format!("{base}/api/source"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(api["specErrorCount"], 1, "{api}");

    assert_eq!(browser.eval("window.linnetMark").await, "same page");
    let updates = browser.eval("window.linnetUpdates").await.as_i64().unwrap();
    assert!(updates >= 4, "only {updates} live updates");

    // Read-only, and nothing of the pod template reaches the page or its data.
    let html = browser.eval("document.documentElement.outerHTML").await;
    assert!(!html.as_str().unwrap().contains("hunter2"));
    let api = support::http()
        .get(format!("{base}/api/rollouts"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        api.contains("redis:7.4") && !api.contains("hunter2"),
        "{api}"
    );
    // Events only of a rollout this agent runs: the names go into a field selector.
    for other in [
        format!("{base}/api/rollouts/csts/{ns}/nope/events"),
        format!("{base}/api/rollouts/pods/{ns}/redis/events"),
        format!("{base}/api/rollouts/csts/{ns}/redis,regarding.kind=Pod/events"),
    ] {
        let status = support::http().get(&other).send().await.unwrap().status();
        assert_eq!(status, 404, "{other}");
    }
    let post = support::http()
        .post(format!("{base}/api/rollouts"))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 405);
    // Without --dashboard-actions there is no sign-in and no action.
    for path in [
        "/api/session".to_string(),
        format!("/api/rollouts/csts/{ns}/redis/actions/promote"),
    ] {
        let post = support::http().post(format!("{base}{path}"));
        assert_eq!(post.send().await.unwrap().status(), 404, "{path}");
    }

    // Issue 76: the pull request linnet opened (its event, as the revert loop records it) is
    // linked on the rollout's page; nothing but an http(s) address becomes a link.
    let url = "https://git.example/acme/gitops/pull/7";
    let event: k8s_openapi::api::events::v1::Event = serde_json::from_value(json!({
        "metadata": {"name": "redis.revert-pr", "namespace": ns},
        "eventTime": "2026-12-05T12:00:00.000000Z",
        "reportingController": "linnet",
        "reportingInstance": "linnet-test",
        "action": "Revert",
        "reason": "RevertPullRequestOpened",
        "type": "Normal",
        "regarding": {"apiVersion": "rollouts.linnet.dev/v1alpha1",
            "kind": "CanaryStatefulSet", "name": "redis", "namespace": ns},
        "note": format!("{url} puts redis:7.2 back in specs/rollout.yaml; merging it makes the rollout Stable (not javascript:alert(1))"),
    }))
    .unwrap();
    let events = f.api::<k8s_openapi::api::events::v1::Event>();
    events.create(&Default::default(), &event).await.unwrap();
    // The same reason from another controller (anyone who may create events) is no fact.
    let mut forged = event.clone();
    forged.metadata.name = Some("redis.forged-pr".into());
    forged.reporting_controller = Some("someone-else".into());
    forged.note = Some("https://evil.example/pull/1 puts a fake link here".into());
    events.create(&Default::default(), &forged).await.unwrap();
    browser.eval("location.hash = '#/'").await;
    browser
        .eval(&format!("location.hash = '#/csts/{ns}/redis'"))
        .await;
    browser.wait_text(&["Revert pull request", url], 20).await;
    let links = browser
        .eval("JSON.stringify([...document.querySelectorAll('a.pull-request')].map(a => a.getAttribute('href')))")
        .await;
    assert_eq!(
        links.as_str().unwrap(),
        format!("[\"{url}\"]"),
        "linnet's event gives the fact, not the forged one"
    );
    let in_messages = browser
        .eval("JSON.stringify([...document.querySelectorAll('td.msg a')].map(a => a.getAttribute('href')).sort())")
        .await;
    assert_eq!(
        in_messages.as_str().unwrap(),
        format!("[\"https://evil.example/pull/1\",\"{url}\"]"),
        "addresses in messages are links, and nothing else is"
    );
    // Everything the page loaded came from the agent: no CDN, no other host (the browser
    // reaches none: see support::browser).
    let asked = browser.requests().await;
    assert!(asked.iter().any(|u| u.ends_with("/app.js")), "{asked:?}");
    let elsewhere: Vec<&String> = asked
        .iter()
        .filter(|u| !u.starts_with(&format!("{base}/")))
        .collect();
    assert!(elsewhere.is_empty(), "asked other hosts: {elsewhere:?}");
    // And it could not have: a request elsewhere fails at the proxy that is not there.
    browser
        .eval(
            "fetch('http://example.com/', {mode: 'no-cors'}).then(() => 'reached', () => 'failed')",
        )
        .await;
    assert_eq!(
        browser.failures_of("http://example.com/").await,
        ["net::ERR_PROXY_CONNECTION_FAILED"],
        "the browser must reach no other host"
    );
    for shot in [
        "1-list-stable",
        "2-rollout-awaiting-approval",
        "3-rollout-promoted",
    ] {
        let png = std::fs::read(screenshots().join(format!("{shot}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{shot}");
    }
}

/// Issue 52: with write-back, a rollout's page lists the commits of the status branch that
/// changed its status file, newest first, read from the agent's write-back clone.
#[tokio::test]
async fn a_rollouts_page_shows_its_status_commits_from_git() {
    use support::{TestNamespace, admin_client, git, install_linnet};
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "dash-git").await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    support::commit_example(&work, &ns.name);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let port = free_port();
    let dir = tmp.path().join("agent");
    std::fs::create_dir_all(&dir).unwrap();
    let agent = support::agent::start_agent(
        &dir,
        &[
            format!("--repo-url=file://{}", bare.display()),
            "--writeback-interval=500ms".into(),
            "--commit-link=https://git.example/acme/gitops/commit/{commit}".into(),
            format!("--dashboard-listen=127.0.0.1:{port}"),
        ],
        &ns.name,
    );
    wait_ready(&agent).await;
    let base = format!("http://127.0.0.1:{port}");
    let url = format!("{base}/api/rollouts/csts/{}/redis/history", ns.name);
    let history = support::eventually(
        "redis's Stable status commit in the dashboard's history",
        std::time::Duration::from_secs(90),
        || {
            let url = url.clone();
            async move {
                let v: Value = support::http()
                    .get(&url)
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let list = v["history"].as_array()?.clone();
                list.iter().any(|c| c["phase"] == "Stable").then_some(list)
            }
        },
    )
    .await;
    let newest = &history[0];
    let log = git(&bare, &["log", "--format=%H %s", "linnet/status"]);
    let commit = newest["commit"].as_str().unwrap();
    assert!(
        log.lines()
            .any(|l| l.starts_with(commit) && l.ends_with(newest["summary"].as_str().unwrap())),
        "{newest} is not a commit of the status branch:\n{log}"
    );
    let mut browser = Browser::start().await;
    browser
        .open(&format!("{base}/#/csts/{}/redis", ns.name))
        .await;
    browser
        .wait_text(&["History in Git (status branch)", commit], 30)
        .await;
    // Commits link to the Git host (--commit-link): the rollout's own and the status branch's.
    let links = browser
        .eval("JSON.stringify([...document.querySelectorAll('a.commit')].map(a => a.getAttribute('href')))")
        .await;
    let links: Vec<String> = serde_json::from_str(links.as_str().unwrap()).unwrap();
    let synced = git(&bare, &["rev-parse", "HEAD"]);
    for want in [synced.trim(), commit] {
        assert!(
            links
                .iter()
                .any(|l| l.starts_with("https://git.example/acme/gitops/commit/")
                    && l.ends_with(want)),
            "no link to {want}: {links:?}"
        );
    }
    shot(&mut browser, "5-rollout-history.png").await;
    drop(agent);
}

/// Issue 76: a batched CanaryDeployment's page shows its batches on a timeline (state,
/// when each started and how long it took, from the status), asks for the approval this kind
/// takes (`currentBatch`), and follows the approval live.
#[tokio::test]
async fn a_batched_canarys_page_shows_its_batches_on_a_timeline() {
    let mut f = Fixture::prepare("dash-batches", |ns| {
        support::rollout::batched_web(ns, json!({}))
    })
    .await;
    let mut browser = dashboard_at(&mut f, "cdeploy", "web").await;
    browser.wait_text(&["Completed", "nginx:1.27"], 90).await;
    f.patch_spec(json!({"image": "nginx:1.28"}));
    let paused = browser
        .wait_text(
            &["Paused", "Batches", "batch 1 · 1 new · Finished", "took"],
            90,
        )
        .await;
    assert!(paused.contains("batch 2 · 4 new · Pending"), "{paused}");
    assert!(
        paused.contains("currentBatch"),
        "the approval this kind takes:\n{paused}"
    );
    assert!(!paused.contains("rollouts.linnet.dev/promote"), "{paused}");
    let states = browser
        .eval("[...document.querySelectorAll('[data-batch]')].map(li => li.dataset.state + ':' + li.className).join(' ')")
        .await;
    assert_eq!(states, "Finished:done Pending:");
    shot(&mut browser, "6-batches-paused.png").await;
    f.patch_spec(json!({"currentBatch": 2}));
    browser.wait_text(&["Completed", "nginx:1.28"], 90).await;
    let states = browser
        .eval(
            "[...document.querySelectorAll('[data-batch]')].map(li => li.dataset.state).join(' ')",
        )
        .await;
    assert_eq!(states, "Finished Finished");
    let took = browser
        .eval("[...document.querySelectorAll('[data-batch] .when')].filter(w => w.textContent.includes('took')).length")
        .await;
    assert_eq!(took, 2, "both batches say how long they took");
    shot(&mut browser, "7-batches-completed.png").await;
}

/// The volume of claim `claim`, as the API server has it.
async fn volume_of(f: &Fixture, claim: &str) -> String {
    let claims = f.api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>();
    let c = claims.get(claim).await.unwrap();
    c.spec.and_then(|s| s.volume_name).unwrap()
}

/// Where the page draws each ordinal's volume: `ordinal:volume:held-by:moving-to`.
const PLACES: &str = "[...document.querySelectorAll('.map-row[data-ordinal]')].map(r => r.dataset.ordinal + ':' + [...r.querySelectorAll('.volume')].map(v => v.dataset.volume + ':' + v.dataset.heldBy + ':' + v.dataset.movingTo).join(',')).join(' ')";

/// Starts the fixture's agent with the dashboard, and opens rollout `short`/`name`'s page.
async fn dashboard_at(f: &mut Fixture, short: &str, name: &str) -> Browser {
    let port = free_port();
    f.start_agent_with(&[format!("--dashboard-listen=127.0.0.1:{port}")])
        .await;
    let mut browser = Browser::start().await;
    let ns = &f.ns.name;
    browser
        .open(&format!("http://127.0.0.1:{port}/#/{short}/{ns}/{name}"))
        .await;
    browser
}

/// Ordinal 2's slides seen so far, in order: `volume:from>to`.
async fn slides(browser: &mut Browser) -> Vec<String> {
    let seen = browser.eval("JSON.stringify(window.slides)").await;
    serde_json::from_str(seen.as_str().unwrap()).unwrap()
}

/// Whether the page shows pod kv-canary-2 ready.
const CANARY_READY: &str =
    "(document.querySelector('[data-pod=\"kv-canary-2\"]') || {dataset: {}}).dataset.ready || ''";

/// The newest value of `image`'s line on the ready-pods chart.
fn last_ready(image: &str) -> String {
    format!(
        "((document.querySelector('[data-chart=\"pods\"] polyline[data-series=\"{image}\"]') || {{dataset: {{values: ''}}}}).dataset.values || '').split(',').pop()"
    )
}

/// The timeline's rows: `stage:class`.
const STAGES: &str = "[...document.querySelectorAll('table.stages tr[data-stage]')].map(t => t.dataset.stage + ':' + t.className).join(' ')";

/// Whether no volume is sliding on the page (for a still screenshot).
const NO_SLIDE: &str = "String(!document.getAnimations().some(a => a.animationName === 'slide' && a.playState === 'running'))";

/// A screenshot under target/dashboard-screenshots/ once no volume is sliding.
async fn shot(browser: &mut Browser, name: &str) {
    wait_eval(browser, NO_SLIDE, "true", 10).await;
    browser.screenshot(&screenshots().join(name)).await;
}

/// Waits until `expression` gives `want` in the page.
async fn wait_eval(browser: &mut Browser, expression: &str, want: &str, secs: u64) {
    let mut got = Value::Null;
    for _ in 0..secs * 4 {
        got = browser.eval(expression).await;
        if got == want {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    panic!("{expression} is {got}, not {want}");
}

/// Issue 76, on the real node: a CanaryStatefulSet's page maps each ordinal's pods (set,
/// version, readiness, restarts as the kubelet counts them) and its volume as the API server
/// has it, and draws the handoff: the PersistentVolume of ordinal 2 slides from the stable
/// set's claim to the canary's, and back when a canary that keeps restarting is rolled back.
#[tokio::test]
async fn the_replica_map_shows_each_pod_and_its_volume_moving_on_the_real_node() {
    use support::node;
    let admin = support::admin_client().await;
    if !node::require(&admin).await {
        return;
    }
    let mut f = Fixture::prepare("dash-node", |ns| {
        let mut spec = node::kv_rollout(ns, "v1", json!({"progressDeadlineSeconds": 40}));
        // `broken` never passes /ready: with this probe the kubelet restarts it.
        spec["spec"]["template"]["template"]["spec"]["containers"][0]["livenessProbe"] = json!({
            "httpGet": {"path": "/ready", "port": 8080},
            "initialDelaySeconds": 2, "periodSeconds": 1, "failureThreshold": 2
        });
        spec
    })
    .await;
    let mut browser = dashboard_at(&mut f, "csts", "kv").await;
    browser
        .wait_text(
            &[
                "Settled: nothing to do",
                "kv-stable-2",
                "ready · 0 restarts",
            ],
            180,
        )
        .await;
    let mut volumes = Vec::new();
    for k in 0..3 {
        volumes.push(volume_of(&f, &format!("data-kv-stable-{k}")).await);
    }
    let stable_places = volumes
        .iter()
        .enumerate()
        .map(|(k, v)| format!("{k}:{v}:stable:"))
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(browser.eval(PLACES).await, stable_places.as_str());
    // Every 100 ms, how ordinal 2's volume is drawn, to see it slide.
    browser
        .eval("window.slides = []; setInterval(() => { const v = document.querySelector('.map-row[data-ordinal=\"2\"] .volume[data-slid]'); const seen = v && v.dataset.volume + ':' + v.dataset.slid; if (seen && window.slides[window.slides.length - 1] !== seen) window.slides.push(seen); }, 100)")
        .await;

    // The canary takes ordinal 2 on its volume: the page shows it held by the canary's claim.
    f.patch_spec(json!({"image": format!("{}:v2", node::KV_IMAGE)}));
    browser
        .wait_text(
            &[
                "Waiting for you: approve in Git",
                "kv-canary-2",
                "canary · linnet.test/kv:v2",
            ],
            180,
        )
        .await;
    let pv2 = &volumes[2];
    let handed = format!("{}:{}:{}:", 0, volumes[0], "stable");
    browser
        .wait_text(&[pv2.as_str(), "data: data-kv-canary-2"], 30)
        .await;
    let places = browser.eval(PLACES).await;
    assert!(
        places.as_str().unwrap().starts_with(&handed)
            && places
                .as_str()
                .unwrap()
                .ends_with(&format!("2:{pv2}:canary:")),
        "{places}"
    );
    assert_eq!(volume_of(&f, "data-kv-canary-2").await, *pv2);
    wait_eval(&mut browser, CANARY_READY, "true", 30).await;
    // It slid from the stable side toward the canary's.
    let forward = slides(&mut browser).await;
    assert!(
        forward
            .iter()
            .any(|s| s.starts_with(&format!("{pv2}:at-stable>"))),
        "the volume did not slide from the stable side: {forward:?}"
    );
    shot(&mut browser, "8-replica-map-canary.png").await;

    // A canary that never becomes ready: the page counts its restarts as the kubelet does.
    f.patch_spec(json!({"image": format!("{}:broken", node::KV_IMAGE)}));
    let pods = f.api::<k8s_openapi::api::core::v1::Pod>();
    let mut agreed = None;
    for _ in 0..120 {
        let shown = browser
            .eval("(document.querySelector('[data-pod=\"kv-canary-2\"]') || {dataset: {}}).dataset.restarts || ''")
            .await;
        let pod = pods.get_opt("kv-canary-2").await.unwrap();
        let counted: i32 = pod
            .iter()
            .flat_map(|p| {
                p.status
                    .iter()
                    .flat_map(|s| s.container_statuses.iter().flatten())
            })
            .map(|c| c.restart_count)
            .sum();
        if counted >= 1 && shown.as_str() == Some(counted.to_string().as_str()) {
            agreed = Some(counted);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(
        agreed.is_some(),
        "the page never showed the canary's restarts"
    );
    wait_eval(&mut browser, CANARY_READY, "false", 30).await;
    shot(&mut browser, "9-replica-map-restarting.png").await;

    // Rolled back at the deadline: the same volume is back with the stable set.
    f.wait_for("RolledBack", 180, |r: &linnet::api::CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(linnet::api::StatefulSetPhase::RolledBack)
    })
    .await;
    let mut places = Value::Null;
    for _ in 0..60 {
        places = browser.eval(PLACES).await;
        if places == stable_places.as_str() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert_eq!(
        places,
        stable_places.as_str(),
        "ordinal 2's volume went back to the stable claim"
    );
    // Why, on the timeline: the deadline closed the step and opened the rollback.
    browser
        .wait_text(&["ProgressDeadlineExceeded", "RolledBack"], 30)
        .await;
    wait_eval(&mut browser, STAGES, "Step 1:done Rollback:done bad", 30).await;
    // And the volume slid back, after the canary took it: toward the stable side.
    let all = slides(&mut browser).await;
    assert!(
        all[forward.len()..]
            .iter()
            .any(|s| s.starts_with(&format!("{pv2}:")) && s.ends_with(">at-stable")),
        "the volume did not slide back to the stable side: {all:?}"
    );
}
