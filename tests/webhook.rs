//! The webhook listener over real HTTP, with payloads and signatures made the way each Git
//! host documents them.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::time::Duration;

use linnet::serve::{ServeLimits, serve};
use linnet::source::hooks::{HookSettings, WakeReceiver, router, wake_channel};
use linnet::source::webhook::{GitHost, sign_hex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "s3cret-from-a-file";

struct Listener {
    base: String,
    addr: std::net::SocketAddr,
    wake: WakeReceiver,
    dir: tempfile::TempDir,
}

async fn start() -> Listener {
    start_with(|_| {}, ServeLimits::default()).await
}

async fn start_with(tweak: impl FnOnce(&mut HookSettings), limits: ServeLimits) -> Listener {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let (waker, wake) = wake_channel();
    let mut settings = HookSettings::new(secret_file, "main".into());
    settings.max_body_bytes = 64 * 1024;
    settings.repository_url = Some("https://github.com/acme/gitops.git".into());
    tweak(&mut settings);
    let waker_for_refusals = waker.clone();
    let app = router(
        settings,
        waker,
        std::sync::Arc::new(linnet::telemetry::Metrics::default()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let refused: linnet::serve::OnRefused =
        std::sync::Arc::new(move || waker_for_refusals.missed());
    tokio::spawn(serve(listener, app, limits, Some(refused)));
    Listener {
        base: format!("http://{addr}"),
        addr,
        wake,
        dir,
    }
}

async fn post(l: &Listener, host: &str, headers: &[(&str, String)], body: &[u8]) -> u16 {
    let mut req = http()
        .post(format!("{}/hooks/{host}", l.base))
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    req.send().await.unwrap().status().as_u16()
}

/// reqwest is built without a crypto provider; linnet installs ring.
fn http() -> reqwest::Client {
    linnet::net::install_crypto_provider();
    reqwest::Client::new()
}

fn github_push(branch: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "ref": format!("refs/heads/{branch}"),
        "before": "0000000000000000000000000000000000000000",
        "after": "1111111111111111111111111111111111111111",
        "repository": {"full_name": "acme/gitops"},
    }))
    .unwrap()
}

fn github_headers(event: &str, body: &[u8]) -> Vec<(&'static str, String)> {
    vec![
        ("x-github-event", event.to_string()),
        (
            "x-github-delivery",
            "72d3162e-cc78-11e3-81ab-4c9367dc0958".into(),
        ),
        (
            "x-hub-signature-256",
            format!("sha256={}", sign_hex(SECRET.as_bytes(), body)),
        ),
    ]
}

fn assert_no_wake(l: &mut Listener) {
    assert!(
        l.wake.try_next().is_none(),
        "a request that must change nothing queued a fetch"
    );
}

#[tokio::test]
async fn a_signed_github_push_to_the_branch_queues_a_fetch() {
    let mut l = start().await;
    let body = github_push("main");
    assert_eq!(
        post(&l, "github", &github_headers("push", &body), &body).await,
        202
    );
    let wake = l.wake.try_next().unwrap();
    assert_eq!(wake.host, Some(GitHost::GitHub));
    assert_eq!(
        wake.after.as_deref(),
        Some("1111111111111111111111111111111111111111")
    );
}

#[tokio::test]
async fn bad_missing_wrong_branch_ping_and_oversized_change_nothing() {
    let mut l = start().await;
    let body = github_push("main");

    let mut bad = github_headers("push", &body);
    bad[2].1 = format!("sha256={}", sign_hex(b"another secret", &body));
    assert_eq!(post(&l, "github", &bad, &body).await, 401);
    assert_no_wake(&mut l);

    let missing = github_headers("push", &body)[..2].to_vec();
    assert_eq!(post(&l, "github", &missing, &body).await, 401);
    assert_no_wake(&mut l);

    let other = github_push("feature");
    assert_eq!(
        post(&l, "github", &github_headers("push", &other), &other).await,
        202
    );
    assert_no_wake(&mut l);

    let tag =
        serde_json::to_vec(&serde_json::json!({"ref": "refs/tags/main", "after": "1"})).unwrap();
    assert_eq!(
        post(&l, "github", &github_headers("push", &tag), &tag).await,
        202
    );
    assert_no_wake(&mut l);

    let ping = br#"{"zen":"Design for failure.","hook_id":1}"#;
    assert_eq!(
        post(&l, "github", &github_headers("ping", ping), ping).await,
        202
    );
    assert_no_wake(&mut l);

    let huge = vec![b' '; 65 * 1024];
    assert_eq!(
        post(&l, "github", &github_headers("push", &huge), &huge).await,
        413
    );
    assert_no_wake(&mut l);

    let not_json = b"ref=refs/heads/main";
    assert_eq!(
        post(&l, "github", &github_headers("push", not_json), not_json).await,
        400
    );
    assert_no_wake(&mut l);
}

#[tokio::test]
async fn every_host_is_verified_as_it_documents() {
    let mut l = start().await;
    let sig = |b: &[u8]| sign_hex(SECRET.as_bytes(), b);

    let gitlab = br#"{"object_kind":"push","ref":"refs/heads/main","after":"2222"}"#;
    let h = vec![
        ("x-gitlab-event", "Push Hook".to_string()),
        ("x-gitlab-token", SECRET.to_string()),
    ];
    assert_eq!(post(&l, "gitlab", &h, gitlab).await, 202);
    let h = vec![
        ("x-gitlab-event", "Push Hook".to_string()),
        ("x-gitlab-token", "nope".to_string()),
    ];
    assert_eq!(post(&l, "gitlab", &h, gitlab).await, 401);

    let gitea = br#"{"ref":"refs/heads/main","after":"3333"}"#;
    let h = vec![
        ("x-gitea-event", "push".to_string()),
        ("x-gitea-signature", sig(gitea)),
    ];
    assert_eq!(post(&l, "gitea", &h, gitea).await, 202);

    let cloud = br#"{"push":{"changes":[{"new":{"type":"branch","name":"main","target":{"hash":"4444"}}}]}}"#;
    let h = vec![
        ("x-event-key", "repo:push".to_string()),
        ("x-hub-signature", format!("sha256={}", sig(cloud))),
    ];
    assert_eq!(post(&l, "bitbucket", &h, cloud).await, 202);

    let server = br#"{"eventKey":"repo:refs_changed","changes":[{"ref":{"id":"refs/heads/main","displayId":"main","type":"BRANCH"},"fromHash":"0","toHash":"5555","type":"UPDATE"}]}"#;
    let h = vec![
        ("x-event-key", "repo:refs_changed".to_string()),
        ("x-hub-signature", format!("sha256={}", sig(server))),
    ];
    assert_eq!(post(&l, "bitbucket", &h, server).await, 202);

    let generic = br#"{"ref":"refs/heads/main","after":"6666"}"#;
    let h = vec![("x-linnet-signature", format!("sha256={}", sig(generic)))];
    assert_eq!(post(&l, "generic", &h, generic).await, 202);

    // Wake-ups coalesce: the source looks once, at the newest.
    let woken = l.wake.next().await.unwrap();
    assert_eq!(woken.after.as_deref(), Some("6666"));
    assert_no_wake(&mut l);
}

#[tokio::test]
async fn a_burst_of_pushes_is_one_wake_up_with_the_newest_tip() {
    let mut l = start().await;
    for (i, after) in ["aaaa", "bbbb", "cccc"].iter().enumerate() {
        let body = serde_json::to_vec(&serde_json::json!({
            "ref": "refs/heads/main", "after": after,
            "repository": {"full_name": "acme/gitops"},
        }))
        .unwrap();
        let mut h = github_headers("push", &body);
        h[1].1 = format!("delivery-{i}");
        assert_eq!(post(&l, "github", &h, &body).await, 202);
    }
    let woken = tokio::time::timeout(Duration::from_secs(1), l.wake.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(woken.after.as_deref(), Some("cccc"));
    assert_no_wake(&mut l);
}

#[tokio::test]
async fn a_replayed_delivery_wakes_nothing() {
    // Issue 20: one signed push replayed 2,000 times caused 924 fetches.
    let mut l = start().await;
    let body = github_push("main");
    let h = github_headers("push", &body);
    assert_eq!(post(&l, "github", &h, &body).await, 202);
    assert!(l.wake.try_next().is_some());
    for _ in 0..50 {
        assert_eq!(post(&l, "github", &h, &body).await, 202);
    }
    assert_no_wake(&mut l);
}

#[tokio::test]
async fn a_push_to_another_repository_with_the_same_secret_wakes_nothing() {
    let mut l = start().await;
    let body = serde_json::to_vec(&serde_json::json!({
        "ref": "refs/heads/main", "after": "1111",
        "repository": {"full_name": "acme/other"},
    }))
    .unwrap();
    let mut req = http()
        .post(format!("{}/hooks/github", l.base))
        .body(body.clone());
    for (k, v) in github_headers("push", &body) {
        req = req.header(k, v);
    }
    let response = req.send().await.unwrap();
    assert_eq!(response.status(), 202);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("another repository")
    );
    assert_no_wake(&mut l);
}

#[tokio::test]
async fn an_empty_or_placeholder_secret_lets_nothing_through() {
    let mut l = start().await;
    let secret_file = l.dir.path().join("secret");
    for unusable in ["", "  \n", "REPLACE-WITH-A-LONG-RANDOM-SECRET"] {
        std::fs::write(&secret_file, unusable).unwrap();
        let body = br#"{"object_kind":"push","ref":"refs/heads/main","after":"2222"}"#;
        let h = vec![
            ("x-gitlab-event", "Push Hook".to_string()),
            ("x-gitlab-token", unusable.trim().to_string()),
        ];
        assert_eq!(post(&l, "gitlab", &h, body).await, 503, "{unusable:?}");
        let sig = format!("sha256={}", sign_hex(unusable.trim().as_bytes(), body));
        assert_eq!(
            post(&l, "generic", &[("x-linnet-signature", sig)], body).await,
            503
        );
    }
    assert_no_wake(&mut l);
}

/// Sends `head` on a raw connection and returns what comes back within `wait`.
async fn raw_exchange(addr: std::net::SocketAddr, head: &str, wait: Duration) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(wait, stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_wrong_gitlab_token_is_refused_before_the_body_is_read() {
    let l = start().await;
    // Declares a body it never sends: only the header can have been checked.
    let answer = raw_exchange(
        l.addr,
        "POST /hooks/gitlab HTTP/1.1\r\nHost: x\r\nX-Gitlab-Token: wrong\r\n\
         X-Gitlab-Event: Push Hook\r\nContent-Length: 60000\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

#[tokio::test]
async fn a_declared_oversized_body_is_refused_before_it_is_read() {
    let l = start().await;
    let answer = raw_exchange(
        l.addr,
        "POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

#[tokio::test]
async fn a_trickled_body_is_cut_off_at_the_body_timeout() {
    let l = start_with(
        |s| s.body_timeout = Duration::from_millis(500),
        ServeLimits::default(),
    )
    .await;
    let mut stream = TcpStream::connect(l.addr).await.unwrap();
    stream
        .write_all(b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        // One byte every 100 ms: never idle long, never done.
        let _ = stream.write_all(b" ").await;
        match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
            Ok(Err(_)) => break,
            Err(_) => assert!(started.elapsed() < Duration::from_secs(10), "never cut off"),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test]
async fn idle_and_slow_header_connections_are_closed() {
    let l = start_with(
        |_| {},
        ServeLimits {
            max_connections: 256,
            header_timeout: Duration::from_millis(500),
            ..ServeLimits::default()
        },
    )
    .await;
    // An idle connection, and one that sends half a request line.
    for head in ["", "POST /hooks/github HTTP/1.1\r\nHost:"] {
        let mut stream = TcpStream::connect(l.addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
            .await
            .is_ok();
        assert!(closed, "connection with {head:?} still open");
    }
}

#[tokio::test]
async fn past_the_connection_limit_callers_get_503_with_retry_after() {
    let l = start_with(
        |_| {},
        ServeLimits {
            max_connections: 4,
            header_timeout: Duration::from_secs(30),
            ..ServeLimits::default()
        },
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(l.addr).await.unwrap());
    }
    // Once the server has taken the four, the next caller is turned away.
    let answer = support::eventually(
        "a caller past the slots turned away",
        Duration::from_secs(10),
        || async {
            let answer = raw_exchange(
                l.addr,
                "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                Duration::from_secs(3),
            )
            .await;
            answer.starts_with("HTTP/1.1 503").then_some(answer)
        },
    )
    .await;
    assert!(answer.contains("Retry-After: 1"), "{answer}");
    drop(held);
    let body = github_push("main");
    support::eventually(
        "a push taken once the slots are free",
        Duration::from_secs(10),
        || async {
            let code = post(&l, "github", &github_headers("push", &body), &body).await;
            (code == 202).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn past_the_unverified_body_limit_callers_get_503_with_retry_after() {
    let l = start_with(|s| s.max_unverified_bodies = 2, ServeLimits::default()).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(l.addr).await.unwrap();
        stream
            .write_all(b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            .await
            .unwrap();
        held.push(stream);
    }
    // Once the server reads both bodies, a third caller is turned away.
    let body = github_push("main");
    let response = support::eventually(
        "a third unverified body turned away",
        Duration::from_secs(10),
        || async {
            let mut req = http()
                .post(format!("{}/hooks/github", l.base))
                .body(body.clone());
            for (k, v) in github_headers("push", &body) {
                req = req.header(k, v);
            }
            let response = req.send().await.unwrap();
            (response.status() == 503).then_some(response)
        },
    )
    .await;
    assert_eq!(response.headers()["retry-after"], "1");
    drop(held);
}

#[tokio::test]
async fn a_connection_that_never_reads_its_answers_is_closed_at_its_age() {
    // Review of issue 20: hyper's header timeout runs only while it reads a request, so a
    // caller pipelining requests without reading the answers held its slot for good.
    let l = start_with(
        |_| {},
        ServeLimits {
            max_connections: 256,
            header_timeout: Duration::from_secs(30),
            max_connection_age: Duration::from_secs(1),
        },
    )
    .await;
    let mut stream = TcpStream::connect(l.addr).await.unwrap();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        if stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .is_err()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut answers = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answers))
        .await
        .is_ok();
    assert!(closed, "the connection is still open");
}

/// Issue 45: with 1,000 idle connections open, a legitimate webhook got a TCP reset instead of
/// the documented 503 with Retry-After: the idle connections past the limit held every
/// refusal slot while they waited to send a request head, and a caller past those was
/// dropped unanswered. Refusals are cheap now, so a caller gets an answer; and a look at the
/// remote is scheduled either way.
#[tokio::test]
async fn with_a_thousand_idle_connections_a_webhook_is_answered_not_reset() {
    let mut l = start_with(|_| {}, ServeLimits::default()).await;
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(TcpStream::connect(l.addr).await.unwrap());
    }
    let body = github_push("main");
    let mut req = http()
        .post(format!("{}/hooks/github", l.base))
        .header("content-type", "application/json")
        .body(body.clone());
    for (k, v) in github_headers("push", &body) {
        req = req.header(k, v);
    }
    let answer = req.send().await;
    let response = answer.unwrap_or_else(|e| panic!("no answer: {e:?}"));
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    // The push is not lost: the refusal scheduled a look at the remote.
    tokio::time::timeout(Duration::from_secs(5), l.wake.next())
        .await
        .expect("no look at the remote was scheduled")
        .unwrap();
    drop(idle);
}
