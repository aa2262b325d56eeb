//! The webhook listener over real HTTP, with payloads and signatures made the way each Git
//! host documents them.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::Duration;

use linnet::source::hooks::{HookSettings, Wake, next_coalesced, router};
use linnet::source::webhook::{GitHost, sign_hex};
use tokio::sync::mpsc;

const SECRET: &str = "s3cret-from-a-file";

struct Listener {
    base: String,
    wake: mpsc::Receiver<Wake>,
    _dir: tempfile::TempDir,
}

async fn start(queue: usize) -> Listener {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let (tx, rx) = mpsc::channel(queue);
    let app = router(
        HookSettings {
            secret_file,
            branch: "main".into(),
            max_body_bytes: 64 * 1024,
        },
        tx,
        std::sync::Arc::new(linnet::telemetry::Metrics::default()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Listener {
        base: format!("http://{addr}"),
        wake: rx,
        _dir: dir,
    }
}

async fn post(l: &Listener, host: &str, headers: &[(&str, String)], body: &[u8]) -> u16 {
    let mut req = reqwest::Client::new()
        .post(format!("{}/hooks/{host}", l.base))
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    req.send().await.unwrap().status().as_u16()
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
        l.wake.try_recv().is_err(),
        "a request that must change nothing queued a fetch"
    );
}

#[tokio::test]
async fn a_signed_github_push_to_the_branch_queues_a_fetch() {
    let mut l = start(8).await;
    let body = github_push("main");
    assert_eq!(
        post(&l, "github", &github_headers("push", &body), &body).await,
        202
    );
    let wake = l.wake.try_recv().unwrap();
    assert_eq!(wake.host, GitHost::GitHub);
    assert_eq!(
        wake.after.as_deref(),
        Some("1111111111111111111111111111111111111111")
    );
}

#[tokio::test]
async fn bad_missing_wrong_branch_ping_and_oversized_change_nothing() {
    let mut l = start(8).await;
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
    let mut l = start(8).await;
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

    let woken = next_coalesced(&mut l.wake).await.unwrap();
    let afters: Vec<String> = woken.into_iter().filter_map(|w| w.after).collect();
    assert_eq!(afters, vec!["2222", "3333", "4444", "5555", "6666"]);
}

#[tokio::test]
async fn a_full_queue_answers_503_and_a_burst_is_one_fetch() {
    let mut l = start(2).await;
    let body = github_push("main");
    let h = github_headers("push", &body);
    assert_eq!(post(&l, "github", &h, &body).await, 202);
    assert_eq!(post(&l, "github", &h, &body).await, 202);
    assert_eq!(post(&l, "github", &h, &body).await, 503);
    let burst = tokio::time::timeout(Duration::from_secs(1), next_coalesced(&mut l.wake))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(burst.len(), 2, "queued wake-ups are taken together");
    assert_no_wake(&mut l);
}
