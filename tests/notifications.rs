//! Issue 52, notifications: a real agent on the local control plane tells recording servers
//! about a canary's start, its wait for approval, its promotion, a failed analysis and the
//! rollback, each in the body its service documents (Slack, Microsoft Teams, Discord, a
//! webhook signed with HMAC-SHA256), routed by event and rollout, a failing receiver tried
//! again and a refusing one not, and every outcome counted. Pull request comments are tested
//! against the real Gitea in tests/gitea.rs.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use linnet::api::{CanaryStatefulSet, StatefulSetPhase};
use serde_json::{Value, json};
use support::agent::wait_ready;
use support::eventually;
use support::rollout::{Fixture, small_redis};

const KEY: &str = "notify-test-hmac-key";

/// One request a receiver got.
#[derive(Clone, Debug)]
struct Got {
    receiver: String,
    headers: HeaderMap,
    raw: Bytes,
    body: Value,
}

#[derive(Clone, Default)]
struct Recorder {
    got: Arc<Mutex<Vec<Got>>>,
    /// Requests to /flaky so far: the first two of each three are answered 503.
    flaky: Arc<AtomicUsize>,
}

async fn record(
    State(r): State<Recorder>,
    UrlPath(receiver): UrlPath<String>,
    headers: HeaderMap,
    raw: Bytes,
) -> StatusCode {
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    r.got.lock().unwrap().push(Got {
        receiver: receiver.clone(),
        headers,
        raw,
        body,
    });
    match receiver.as_str() {
        "refusing" => StatusCode::BAD_REQUEST,
        "flaky" if r.flaky.fetch_add(1, Ordering::SeqCst) % 3 < 2 => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::NO_CONTENT,
    }
}

impl Recorder {
    async fn serve(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/{receiver}", axum::routing::post(record))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    fn of(&self, receiver: &str) -> Vec<Got> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.receiver == receiver)
            .cloned()
            .collect()
    }
}

fn redis(ns: &str) -> Value {
    small_redis(
        ns,
        json!({"analysis": {"background": {"templates": [{"templateName": "health"}]}}}),
    )
}

/// The settings file and a URL file per receiver, in `dir`.
fn write_settings(dir: &Path, base: &str, ns: &str) -> std::path::PathBuf {
    let url = |name: &str, path: &str| {
        let file = dir.join(format!("{name}-url"));
        std::fs::write(&file, format!("{base}/{path}\n")).unwrap();
        file.display().to_string()
    };
    let key = dir.join("hook-key");
    std::fs::write(&key, KEY).unwrap();
    let settings = json!({"receivers": [
        {"name": "slack", "type": "slack", "urlFile": url("slack", "slack"),
         "events": ["AwaitingApproval", "RolledBack"], "perMinute": 600},
        {"name": "teams", "type": "teams", "urlFile": url("teams", "teams"),
         "rollouts": [format!("{ns}/*")], "perMinute": 600},
        {"name": "discord", "type": "discord", "urlFile": url("discord", "discord"),
         "template": "{event} {namespace}/{name} {image}", "perMinute": 600},
        {"name": "hook", "type": "webhook", "urlFile": url("hook", "hook"),
         "secretFile": key.display().to_string(), "perMinute": 600},
        {"name": "elsewhere", "type": "slack", "urlFile": url("elsewhere", "elsewhere"),
         "rollouts": ["other/*"], "perMinute": 600},
        {"name": "flaky", "type": "discord", "urlFile": url("flaky", "flaky"),
         "events": ["CanaryStarted"], "perMinute": 600},
        {"name": "refusing", "type": "discord", "urlFile": url("refusing", "refusing"),
         "events": ["Promoted"], "perMinute": 600},
    ]});
    let file = dir.join("notifications.yaml");
    // JSON is YAML.
    std::fs::write(&file, serde_json::to_string_pretty(&settings).unwrap()).unwrap();
    file
}

/// Waits until the canary waits for a human's promotion.
async fn wait_for_approval(f: &Fixture) {
    f.wait_for("waiting for promotion", 90, |r: &CanaryStatefulSet| {
        r.status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .is_some_and(|m| m.contains("waiting for promotion"))
    })
    .await;
}

fn events_of(got: &[Got]) -> Vec<String> {
    got.iter()
        .map(|g| {
            g.headers
                .get("x-linnet-event")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn counts(events: &[String]) -> BTreeMap<String, usize> {
    let mut c = BTreeMap::new();
    for e in events {
        *c.entry(e.clone()).or_default() += 1;
    }
    c
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

#[tokio::test]
async fn a_canarys_life_is_told_to_each_service_in_its_own_shape() {
    let recorder = Recorder::default();
    let base = recorder.serve().await;
    let ok = Arc::new(AtomicBool::new(true));
    let port = support::web_gate(ok.clone()).await;
    let mut f = Fixture::prepare("notify", redis).await;
    let ns = f.ns.name.clone();
    f.write_file(
        "templates.yaml",
        &[support::web_gate_template(&ns, port, json!({}))],
    );
    let settings = write_settings(f.dir.path(), &base, &ns);
    let agent = f.spawn_agent(
        "agent",
        &[format!("--notifications-file={}", settings.display())],
    );
    wait_ready(&agent).await;
    f.agent = Some(agent);
    let phase = |r: &CanaryStatefulSet| r.status.as_ref().and_then(|s| s.phase);
    f.wait_for("Stable on redis:7.2", 90, |r: &CanaryStatefulSet| {
        phase(r) == Some(StatefulSetPhase::Stable)
    })
    .await;
    // A new rollout's first Stable is nobody's news.
    support::holds_for("nothing told", Duration::from_secs(1), || {
        let told = recorder.got.lock().unwrap().len();
        async move {
            match told {
                0 => Ok(()),
                n => Err(format!("{n} notifications")),
            }
        }
    })
    .await;

    // 1. A canary that waits for approval, then is promoted.
    f.patch_spec(json!({"image": "redis:7.4"}));
    wait_for_approval(&f).await;
    f.annotate("rollouts.linnet.dev/promote", "true");
    f.wait_for("Stable on redis:7.4", 90, |r: &CanaryStatefulSet| {
        phase(r) == Some(StatefulSetPhase::Stable)
            && r.status.as_ref().and_then(|s| s.stable_image.as_deref()) == Some("redis:7.4")
    })
    .await;
    eventually("Promoted told", Duration::from_secs(20), || {
        let r = recorder.clone();
        async move {
            events_of(&r.of("hook"))
                .contains(&"Promoted".to_string())
                .then_some(())
        }
    })
    .await;
    assert_eq!(
        events_of(&recorder.of("hook")),
        ["CanaryStarted", "AwaitingApproval", "Promoted"]
    );

    // 2. A canary whose analysis fails: rolled back.
    ok.store(false, Ordering::Relaxed);
    f.annotate("rollouts.linnet.dev/promote", "false");
    f.patch_spec(json!({"image": "redis:7.6"}));
    f.wait_for("RolledBack", 120, |r: &CanaryStatefulSet| {
        phase(r) == Some(StatefulSetPhase::RolledBack)
    })
    .await;
    eventually("RolledBack told", Duration::from_secs(20), || {
        let r = recorder.clone();
        async move {
            events_of(&r.of("hook"))
                .contains(&"RolledBack".to_string())
                .then_some(())
        }
    })
    .await;
    // No late or repeated send: no event told more often than it happened.
    support::holds_for(
        "each event told once per canary",
        Duration::from_secs(2),
        || {
            let told = counts(&events_of(&recorder.of("hook")));
            async move {
                let most = [("CanaryStarted", 2), ("Promoted", 1), ("AnalysisFailed", 1)];
                match most
                    .iter()
                    .chain(&[("RolledBack", 1), ("AwaitingApproval", 2)])
                    .all(|(event, most)| told.get(*event).is_none_or(|n| n <= most))
                {
                    true => Ok(()),
                    false => Err(format!("{told:?}")),
                }
            }
        },
    )
    .await;

    // The signed webhook: every event once per canary, each body signed and complete.
    let hook = recorder.of("hook");
    let told = counts(&events_of(&hook));
    assert_eq!(told.get("CanaryStarted"), Some(&2), "{told:?}");
    assert_eq!(told.get("Promoted"), Some(&1), "{told:?}");
    assert_eq!(told.get("AnalysisFailed"), Some(&1), "{told:?}");
    assert_eq!(told.get("RolledBack"), Some(&1), "{told:?}");
    // The failing canary may reach its wait for approval before its analysis fails.
    assert!(
        matches!(told.get("AwaitingApproval"), Some(1 | 2)),
        "{told:?}"
    );
    for g in &hook {
        let signature = g.headers["x-linnet-signature-256"].to_str().unwrap();
        let want = format!(
            "sha256={}",
            linnet::source::webhook::sign_hex(KEY.as_bytes(), &g.raw)
        );
        assert_eq!(signature, want, "a webhook body not signed with the key");
        assert_eq!(g.headers["content-type"], "application/json");
        assert_eq!(g.body["namespace"], ns.as_str());
        assert_eq!(g.body["name"], "redis");
        assert_eq!(g.body["kind"], "CanaryStatefulSet");
        assert_eq!(
            g.body["event"],
            g.headers["x-linnet-event"].to_str().unwrap()
        );
        assert!(g.body["revision"].is_null() || g.body["revision"].is_string());
    }
    let failed = hook
        .iter()
        .find(|g| g.body["event"] == "AnalysisFailed")
        .unwrap();
    assert!(
        failed.body["message"]
            .as_str()
            .unwrap()
            .starts_with("analysis background:"),
        "{}",
        failed.body
    );
    // Issue 75: the evidence comes with it: the metric, its values, condition and request.
    let evidence = failed.body["evidence"].as_str().unwrap_or_default();
    for part in [
        "- analysis background: Failed",
        "  - health: Failed, ",
        "last false",
        "success when result == true; failureLimit ",
        "; query GET http://127.0.0.1:",
    ] {
        assert!(evidence.contains(part), "{part:?} not in: {evidence}");
    }
    let back = hook
        .iter()
        .find(|g| g.body["event"] == "RolledBack")
        .unwrap();
    assert_eq!(
        back.body["image"], "redis:7.4",
        "rolled back to the stable image"
    );

    // Slack: routed by event; its documented `text` and `blocks`.
    let slack = recorder.of("slack");
    let slack_events = counts(&events_of(&slack));
    assert_eq!(
        slack_events.keys().collect::<Vec<_>>(),
        ["AwaitingApproval", "RolledBack"],
        "{slack_events:?}"
    );
    for g in &slack {
        let text = g.body["text"].as_str().unwrap();
        assert!(text.starts_with(&format!("{ns}/redis: ")), "{text}");
        assert_eq!(g.body["blocks"][0]["type"], "section");
        assert_eq!(g.body["blocks"][0]["text"]["type"], "mrkdwn");
        assert_eq!(g.body["blocks"][0]["text"]["text"], text);
    }

    // Teams: an Adaptive Card in a message, as a workflow webhook takes it.
    let teams = recorder.of("teams");
    assert_eq!(teams.len(), hook.len(), "teams hears everything of {ns}/*");
    for g in &teams {
        assert_eq!(g.body["type"], "message");
        let card = &g.body["attachments"][0];
        assert_eq!(
            card["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(card["content"]["type"], "AdaptiveCard");
        assert_eq!(card["content"]["version"], "1.4");
        assert!(
            card["content"]["body"][1]["text"]
                .as_str()
                .unwrap()
                .contains("redis")
        );
    }

    // Discord: the template filled in; no mention pings anyone.
    let discord = recorder.of("discord");
    assert_eq!(discord.len(), hook.len());
    let first = discord[0].body["content"].as_str().unwrap();
    assert_eq!(first, format!("CanaryStarted {ns}/redis redis:7.4"));
    for g in &discord {
        assert!(g.body["content"].as_str().unwrap().chars().count() <= 2000);
        assert_eq!(g.body["allowed_mentions"]["parse"], json!([]));
    }

    // Routed by rollout: nothing of this namespace went to a receiver of other/*.
    assert!(recorder.of("elsewhere").is_empty());

    // A 503 is tried again with backoff (each CanaryStarted took three tries); a 400 is not.
    eventually(
        "two canaries, three tries each",
        Duration::from_secs(20),
        || {
            let r = recorder.clone();
            async move { (r.of("flaky").len() == 6).then_some(()) }
        },
    )
    .await;
    support::holds_for(
        "no fourth try once sent",
        Duration::from_millis(500),
        || {
            let tries = recorder.of("flaky").len();
            async move {
                match tries {
                    6 => Ok(()),
                    n => Err(format!("{n} tries")),
                }
            }
        },
    )
    .await;
    assert_eq!(recorder.of("refusing").len(), 1, "one Promoted, one try");
    let text = f.agent.as_ref().unwrap().metrics().await;
    for (series, want) in [
        (
            r#"linnet_notifications_total{receiver="flaky",result="sent"}"#,
            2.0,
        ),
        (
            r#"linnet_notifications_total{receiver="refusing",result="refused"}"#,
            1.0,
        ),
        (
            r#"linnet_notifications_total{receiver="refusing",result="sent"}"#,
            0.0,
        ),
        (
            r#"linnet_notifications_total{receiver="elsewhere",result="sent"}"#,
            0.0,
        ),
        (
            r#"linnet_notifications_total{receiver="hook",result="dropped"}"#,
            0.0,
        ),
    ] {
        assert_eq!(metric(&text, series), want, "{series} in:\n{text}");
    }
    assert_eq!(
        metric(
            &text,
            r#"linnet_notifications_total{receiver="hook",result="sent"}"#
        ),
        hook.len() as f64
    );
}

/// A settings file that cannot work stops the agent before it starts, naming the receiver
/// and what to set; it never runs with notifications silently off.
#[test]
fn a_bad_notifications_file_stops_the_agent_with_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    for (text, says) in [
        (
            "receivers:\n- name: oncall\n  type: slack\n",
            "receiver oncall: urlFile is required",
        ),
        (
            "receivers:\n- name: audit\n  type: webhook\n  urlFile: /u\n",
            "receiver audit: secretFile is required",
        ),
        (
            "receivers:\n- name: pr\n  type: pullRequest\n",
            "receiver pr: a pullRequest receiver comments through the Git host's API",
        ),
        ("receivers: [", "notifications.yaml"),
    ] {
        let file = dir.path().join("notifications.yaml");
        std::fs::write(&file, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_linnet"))
            .args([
                "agent",
                "--repo-path",
                dir.path().to_str().unwrap(),
                "--notifications-file",
                file.to_str().unwrap(),
            ])
            .env("KUBECONFIG", dir.path().join("none"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(says) && err.contains("--notifications-file"),
            "{says:?} not in: {err}"
        );
    }
}

/// A receiver whose answers a switch decides: 503 while `down`, else 204. Records each
/// request's event and whether it was taken.
#[derive(Clone, Default)]
struct Outage {
    down: Arc<AtomicBool>,
    tries: Arc<Mutex<Vec<(String, bool)>>>,
}

async fn outage(State(o): State<Outage>, headers: HeaderMap) -> StatusCode {
    let event = headers
        .get("x-linnet-event")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let down = o.down.load(Ordering::SeqCst);
    o.tries.lock().unwrap().push((event, !down));
    if down {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::NO_CONTENT
    }
}

/// Regression (issue 69): with a receiver answering 503, each notification was tried 5 times
/// over 26 s while the next waited behind it, then given up, and never sent when the receiver
/// recovered. Now a rollout's notifications wait in order and are tried with backoff for as
/// long as it takes, kept in a ConfigMap across a `kill -9`, and each is taken once when the
/// receiver is back, in the order they happened.
#[tokio::test]
async fn a_receiver_down_across_a_restart_gets_every_notification_once_in_order() {
    let o = Outage::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/token-s3cr3t/hook", axum::routing::post(outage))
        .with_state(o.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut f = Fixture::prepare("notify-outage", |ns| small_redis(ns, json!({}))).await;
    let url = f.dir.path().join("hook-url");
    // A URL whose file writes it in a non-canonical form (issue 70: its parsed form was
    // logged at WARN with every failure, the docs saying URLs are never logged).
    std::fs::write(&url, format!("{base}/token-s3cr3t/x/../hook\n")).unwrap();
    let settings = f.dir.path().join("notifications.yaml");
    std::fs::write(
        &settings,
        serde_json::to_string(&json!({"receivers": [{"name": "down", "type": "discord",
            "urlFile": url.display().to_string(), "perMinute": 600}]}))
        .unwrap(),
    )
    .unwrap();
    let args = [format!("--notifications-file={}", settings.display())];
    f.start_agent_with(&args).await;
    let phase = |r: &CanaryStatefulSet| r.status.as_ref().and_then(|s| s.phase);
    f.wait_for("Stable on redis:7.2", 90, |r: &CanaryStatefulSet| {
        phase(r) == Some(StatefulSetPhase::Stable)
    })
    .await;

    o.down.store(true, Ordering::SeqCst);
    f.patch_spec(json!({"image": "redis:7.4"}));
    wait_for_approval(&f).await;
    f.annotate(linnet::api::ABORT_ANNOTATION, "true");
    f.wait_for("RolledBack", 90, |r: &CanaryStatefulSet| {
        phase(r) == Some(StatefulSetPhase::RolledBack)
    })
    .await;
    // All three wait, kept for a restart; only the first was tried (the others wait behind
    // it), and more than once.
    let configmaps = f.api::<k8s_openapi::api::core::v1::ConfigMap>();
    let kept = format!("linnet-notifications-{}", f.ns.name);
    eventually("three notifications kept", Duration::from_secs(30), || {
        let configmaps = configmaps.clone();
        let kept = kept.clone();
        async move {
            let cm = configmaps.get_opt(&kept).await.ok()??;
            let text = cm.data?.remove("waiting")?;
            (text.lines().count() == 3 && text.contains("RolledBack")).then_some(())
        }
    })
    .await;
    eventually("a second try", Duration::from_secs(30), || {
        let o = o.clone();
        async move { (o.tries.lock().unwrap().len() >= 2).then_some(()) }
    })
    .await;
    let tried: Vec<String> = o
        .tries
        .lock()
        .unwrap()
        .iter()
        .map(|(e, _)| e.clone())
        .collect();
    assert!(
        tried.iter().all(|e| e == "CanaryStarted"),
        "only the rollout's first notification is tried while it fails: {tried:?}"
    );
    let log = f.agent.as_ref().unwrap().log_text();
    assert!(
        log.contains("notification not sent yet") && !log.contains("token-s3cr3t"),
        "the receiver's URL was logged, or its failure was not:\n{log}"
    );

    f.kill_agent();
    let agent = f.spawn_agent("agent-again", &args);
    wait_ready(&agent).await;
    f.agent = Some(agent);
    o.down.store(false, Ordering::SeqCst);
    eventually("all three taken", Duration::from_secs(90), || {
        let o = o.clone();
        async move {
            let taken = o.tries.lock().unwrap().iter().filter(|(_, ok)| *ok).count();
            (taken >= 3).then_some(())
        }
    })
    .await;
    support::holds_for("three sends taken", Duration::from_secs(3), || {
        let taken = o.tries.lock().unwrap().iter().filter(|(_, ok)| *ok).count();
        async move {
            match taken {
                3 => Ok(()),
                n => Err(format!("{n} taken")),
            }
        }
    })
    .await;
    let taken: Vec<String> = o
        .tries
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, ok)| *ok)
        .map(|(e, _)| e.clone())
        .collect();
    assert_eq!(taken, ["CanaryStarted", "AwaitingApproval", "RolledBack"]);
    eventually("nothing kept once sent", Duration::from_secs(10), || {
        let configmaps = configmaps.clone();
        let kept = kept.clone();
        async move {
            let cm = configmaps.get_opt(&kept).await.ok()??;
            cm.data
                .unwrap_or_default()
                .get("waiting")
                .is_none_or(|t| t.is_empty())
                .then_some(())
        }
    })
    .await;
}
