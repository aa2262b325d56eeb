//! Image automation (issue 74) against a real registry: distribution's, over HTTPS with the
//! test's own CA (`--ca-file`), images pushed by crane. The agent reads an `ImagePolicy` from
//! Git, lists the registry's tags, and commits the newest allowed tag where the rollout's
//! spec carries the policy's marker; the rollout then canaries it. A tag outside the range is
//! ignored, a human pushing all the while loses nothing and nothing is forced, and a restart
//! makes no second commit for a tag already in Git.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

#[path = "image_automation/pull_requests.rs"]
mod pull_requests;
#[path = "image_automation/signatures.rs"]
mod signatures;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::Api;
use linnet::api::CanaryDeployment;
use support::agent::{Agent, SECRET, start_agent, wait_ready};
use support::registry::{
    Registry, marked_web, push_image, registry_tools, semver_policy, tag_image,
};
use support::tls::TestCa;
use support::{TestNamespace, admin_client, git, install_linnet};

/// Image updates during the human's pushes (the issue's race: 100 human pushes, 50 updates).
const UPDATES: usize = 50;

/// A plain Deployment (no rollout) whose container image the same policy sets.
fn worker_yaml(ns: &str, image: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: worker
  namespace: {ns}
spec:
  replicas: 1
  selector:
    matchLabels:
      app: worker
  template:
    metadata:
      labels:
        app: worker
    spec:
      containers:
        - name: worker
          image: "{image}" # {{"$imagepolicy": "web"}}
"#
    )
}

fn start(
    dir: &std::path::Path,
    bare: &std::path::Path,
    ns: &str,
    ca: &std::path::Path,
    scan_every: &str,
) -> Agent {
    start_with(dir, bare, ns, ca, scan_every, &[])
}

/// [`start`] with more flags.
fn start_with(
    dir: &std::path::Path,
    bare: &std::path::Path,
    ns: &str,
    ca: &std::path::Path,
    scan_every: &str,
    more: &[String],
) -> Agent {
    let mut flags = vec![
        format!("--repo-url=file://{}", bare.display()),
        "--poll-interval=1s".into(),
        "--image-automation=true".into(),
        format!("--image-scan-interval={scan_every}"),
        format!("--ca-file={}", ca.display()),
        "--writeback=false".into(),
    ];
    flags.extend_from_slice(more);
    start_agent(dir, &flags, ns)
}

/// `apps/web.yaml` (the rollout on `first`, marked) and `policies/web.yaml` (`policy`) in
/// `work`.
fn write_web_and_policy(work: &std::path::Path, ns: &str, first: &str, policy: &str) {
    std::fs::create_dir_all(work.join("apps")).unwrap();
    std::fs::create_dir_all(work.join("policies")).unwrap();
    std::fs::write(work.join("apps/web.yaml"), marked_web(ns, first)).unwrap();
    std::fs::write(work.join("policies/web.yaml"), policy).unwrap();
}

/// The spec's image on the remote's main.
fn image_in_git(bare: &std::path::Path) -> String {
    let text = git(bare, &["show", "main:apps/web.yaml"]);
    let line = text.lines().find(|l| l.contains("$imagepolicy")).unwrap();
    line.trim()
        .trim_start_matches("image: ")
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn image_commits(bare: &std::path::Path) -> Vec<String> {
    git(bare, &["log", "--format=%s", "main"])
        .lines()
        .filter(|s| s.starts_with("Update images"))
        .map(str::to_string)
        .collect()
}

async fn canary_of(api: &Api<CanaryDeployment>) -> (String, String) {
    let d = api.get_opt("web").await.unwrap();
    let s = d.and_then(|d| d.status).unwrap_or_default();
    (
        s.canary_image.unwrap_or_default(),
        s.stable_image.unwrap_or_default(),
    )
}

/// POSTs to the agent's `/hooks/registry` with `Authorization: Bearer <token>`; the status.
async fn registry_hook(agent: &Agent, token: Option<&str>, body: &str) -> u16 {
    let mut request = support::http()
        .post(format!("{}/hooks/registry", agent.hooks))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        request = request.header("authorization", format!("Bearer {t}"));
    }
    request.send().await.unwrap().status().as_u16()
}

/// POSTs headers that declare a 5 MiB body (over the 4 MiB limit) and returns the answer.
async fn declared_too_large(agent: &Agent) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = agent.hooks.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /hooks/registry HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {SECRET}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        5 << 20
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// What every test here starts from: linnet's CRDs, a namespace, and distribution's registry
/// over HTTPS with the test's own CA (needing Basic credentials `ci`/[`PASSWORD`] when
/// `private`), its repository `127.0.0.1:<port>/team/web`.
struct Setup {
    client: kube::Client,
    ns: TestNamespace,
    tmp: tempfile::TempDir,
    tools: std::path::PathBuf,
    ca: TestCa,
    ca_file: std::path::PathBuf,
    port: u16,
    repository: String,
    _registry: Registry,
}

/// The private registry's password for user `ci`.
const PASSWORD: &str = "s3cret-pw";

async fn setup(ns_prefix: &str, private: bool) -> Setup {
    let client = admin_client().await;
    install_linnet(&client).await;
    let ns = TestNamespace::create(&client, ns_prefix).await;
    let tmp = tempfile::tempdir().unwrap();
    let tools = registry_tools();
    let ca = TestCa::new(&format!("{ns_prefix} registry CA"));
    let ca_file = ca.write(tmp.path(), "ca.pem");
    let port = support::ports::free_port();
    let reg_dir = tmp.path().join("registry");
    std::fs::create_dir_all(&reg_dir).unwrap();
    let htpasswd = reg_dir.join("htpasswd");
    if private {
        let hash = bcrypt::hash(PASSWORD, 4).unwrap();
        std::fs::write(&htpasswd, format!("ci:{hash}\n")).unwrap();
    }
    let registry = Registry::start_private(
        &tools,
        &reg_dir,
        port,
        Some(&ca.server_cert()),
        private.then_some(htpasswd.as_path()),
    );
    Setup {
        client,
        ns,
        tools,
        ca,
        ca_file,
        port,
        repository: format!("127.0.0.1:{port}/team/web"),
        _registry: registry,
        tmp,
    }
}

#[tokio::test]
async fn a_pushed_image_in_the_policy_is_committed_and_canaried_and_nothing_is_lost() {
    let Setup {
        client,
        ns,
        tmp,
        tools,
        ca_file,
        repository,
        ..
    } = &setup("images", false).await;
    let first = format!("{repository}:1.0.0");
    push_image(tools, tmp.path(), &first, "1.0.0");

    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    write_web_and_policy(&work, &ns.name, &first, &semver_policy(repository));
    std::fs::write(work.join("apps/worker.yaml"), worker_yaml(&ns.name, &first)).unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "web and its image policy"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

    // The policy is read from Git and never applied; validate says so.
    let (code, out, _) = support::validate_offline(&work, &[]);
    assert_eq!(code, 0, "{out}");

    let agent_dir = tmp.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let mut agent = start(&agent_dir, &bare, &ns.name, ca_file, "1s");
    wait_ready(&agent).await;
    let api: Api<CanaryDeployment> = Api::namespaced(client.clone(), &ns.name);
    support::eventually("web stable on 1.0.0", Duration::from_secs(90), || {
        let api = api.clone();
        let first = first.clone();
        async move { (canary_of(&api).await.1 == first).then_some(()) }
    })
    .await;

    // A tag outside the range, and a pre-release, are never written.
    tag_image(tools, &first, "2.0.0");
    tag_image(tools, &first, "1.1.0-rc.1");
    support::let_time_pass("three scans", Duration::from_secs(4)).await;
    assert_eq!(image_in_git(&bare), first);
    assert!(
        image_commits(&bare).is_empty(),
        "{:?}",
        image_commits(&bare)
    );

    // A new tag in the range is in Git within a scan or two, and the rollout canaries it.
    let second = format!("{repository}:1.1.0");
    let digest = push_image(tools, tmp.path(), &second, "1.1.0");
    support::eventually("1.1.0 in Git", Duration::from_secs(30), || {
        let bare = bare.clone();
        let second = second.clone();
        async move { (image_in_git(&bare) == second).then_some(()) }
    })
    .await;
    let message = git(&bare, &["log", "-1", "--format=%B", "main"]);
    assert!(
        message.starts_with(&format!("Update images: {second}")),
        "{message}"
    );
    assert!(
        message.contains(&digest),
        "the commit names the digest: {message}"
    );
    assert!(
        message.contains("ImagePolicy web (policies/web.yaml)"),
        "{message}"
    );
    assert!(message.contains("apps/web.yaml:8: "), "{message}");
    // The plain Deployment's quoted line in the same commit, its quotes kept.
    assert!(message.contains("apps/worker.yaml:18: "), "{message}");
    let worker = git(&bare, &["show", "main:apps/worker.yaml"]);
    assert!(
        worker.contains(&format!("image: \"{second}\" # {{")),
        "{worker}"
    );
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), &ns.name);
    support::eventually(
        "the worker Deployment on 1.1.0",
        Duration::from_secs(30),
        || {
            let deployments = deployments.clone();
            let second = second.clone();
            async move {
                let d = deployments.get_opt("worker").await.ok().flatten()?;
                let image = d.spec?.template.spec?.containers.first()?.image.clone()?;
                (image == second).then_some(())
            }
        },
    )
    .await;
    support::eventually("web canaries 1.1.0", Duration::from_secs(60), || {
        let api = api.clone();
        let second = second.clone();
        async move {
            let (canary, stable) = canary_of(&api).await;
            (canary == second || stable == second).then_some(())
        }
    })
    .await;
    // The rollout links back to the image, its digest, the policy and the commit.
    let image_commit = git(&bare, &["log", "-1", "--format=%H", "main"]);
    let linked = format!(
        "{second} ({digest}) from ImagePolicy web, commit {}",
        &image_commit.trim()[..12]
    );
    support::eventually(
        "web's status names its image's source",
        Duration::from_secs(30),
        || {
            let (api, linked) = (api.clone(), linked.clone());
            async move {
                let status = api.get("web").await.ok()?.status?;
                (status.image_source? == linked).then_some(())
            }
        },
    )
    .await;

    // A human pushes to another file every 150 ms while 50 tags land one after another:
    // every human commit stays in the history, and main only ever moves forward. Each tag
    // waits for two more human pushes, so that at least 100 land during the 50 updates
    // however slow the machine (the full suite's load once let only 88 through).
    let stop = Arc::new(AtomicBool::new(false));
    let human_pushes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let human = {
        let (work, stop, count) = (work.clone(), stop.clone(), human_pushes.clone());
        std::thread::spawn(move || {
            let mut pushed = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                git(&work, &["pull", "-q", "--rebase", "origin", "main"]);
                std::fs::write(work.join("notes.txt"), format!("note {n}\n")).unwrap();
                git(&work, &["add", "notes.txt"]);
                git(&work, &["commit", "-qm", &format!("human note {n}")]);
                let out = std::process::Command::new("git")
                    .current_dir(&work)
                    .args(["push", "-q", "origin", "HEAD:main"])
                    .output()
                    .unwrap();
                if out.status.success() {
                    pushed.push(git(&work, &["rev-parse", "HEAD"]));
                    count.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(150));
            }
            pushed
        })
    };
    let mut tips = vec![git(&bare, &["rev-parse", "main"])];
    let mut took = Vec::new();
    for minor in 2..(2 + UPDATES) {
        let wanted = 2 * (minor - 1);
        support::eventually(
            &format!("{wanted} human pushes"),
            Duration::from_secs(60),
            || {
                let done = human_pushes.load(Ordering::SeqCst) >= wanted;
                async move { done.then_some(()) }
            },
        )
        .await;
        let next = format!("{repository}:1.{minor}.0");
        push_image(tools, tmp.path(), &next, &next);
        let pushed = std::time::Instant::now();
        support::eventually(
            &format!("1.{minor}.0 in Git"),
            Duration::from_secs(30),
            || {
                let bare = bare.clone();
                let next = next.clone();
                async move { (image_in_git(&bare) == next).then_some(()) }
            },
        )
        .await;
        took.push(pushed.elapsed());
        tips.push(git(&bare, &["rev-parse", "main"]));
    }
    stop.store(true, Ordering::SeqCst);
    let human_commits = human.join().unwrap();
    let tip = git(&bare, &["rev-parse", "main"]);
    assert!(
        human_commits.len() >= 100,
        "{} human pushes",
        human_commits.len()
    );
    for c in human_commits.iter().chain(&tips) {
        let ancestor = std::process::Command::new("git")
            .current_dir(&bare)
            .args(["merge-base", "--is-ancestor", c, &tip])
            .status()
            .unwrap();
        assert!(ancestor.success(), "{c} is no longer in main's history");
    }
    let commits = image_commits(&bare);
    assert_eq!(
        commits.len(),
        1 + UPDATES,
        "one commit per new tag: {commits:?}"
    );
    took.sort();
    eprintln!(
        "image automation: {} human pushes during {UPDATES} image commits, none lost; registry \
         push to Git at a 1 s scan: median {:?}, max {:?}",
        human_commits.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );

    // kill -9 and a restart: the tag in Git is the newest, so no second commit. From here
    // on the agent scans once at its start and then only when a registry's webhook says so.
    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
    agent = start(&agent_dir, &bare, &ns.name, ca_file, "1h");
    wait_ready(&agent).await;
    support::let_time_pass("three scans after the restart", Duration::from_secs(4)).await;
    assert_eq!(
        image_commits(&bare).len(),
        1 + UPDATES,
        "{:?}",
        image_commits(&bare)
    );
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(
        log.contains("image automation: every policy read and scanned"),
        "the agent says the scan works"
    );

    // A revert as linnet writes it (its trailer names the failed tag): the automation does not
    // propose 1.51.0 again, and moves on once a newer tag is pushed.
    let failed = format!("{repository}:1.{}.0", 1 + UPDATES);
    let good = format!("{repository}:1.{}.0", UPDATES);
    git(&work, &["pull", "-q", "--rebase", "origin", "main"]);
    support::edit_file(&work, "apps/web.yaml", &failed, &good);
    git(
        &work,
        &[
            "commit",
            "-qam",
            &format!("linnet: revert web\n\nLinnet-Failed-Image: {failed}"),
        ],
    );
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    assert_eq!(registry_hook(&agent, Some(SECRET), "{}").await, 202);
    support::let_time_pass("a scan after the revert", Duration::from_secs(3)).await;
    assert_eq!(
        image_in_git(&bare),
        good,
        "the failed tag was proposed again"
    );

    // A registry's webhook: a caller without the token gets 401 and wakes nothing; a body
    // over the limit 413; distribution's notification makes the scan at once.
    let newer = format!("{repository}:1.{}.0", 2 + UPDATES);
    push_image(tools, tmp.path(), &newer, "newer");
    assert_eq!(registry_hook(&agent, None, "{}").await, 401);
    assert_eq!(
        registry_hook(&agent, Some("wrong-secret-wrong"), "{}").await,
        401
    );
    // Declared, not sent: the agent answers before reading (a client still writing 5 MiB
    // would meet a closed connection instead of the answer).
    assert!(declared_too_large(&agent).await.starts_with("HTTP/1.1 413"));
    support::let_time_pass("no scan without a webhook", Duration::from_secs(2)).await;
    assert_eq!(
        image_in_git(&bare),
        good,
        "scanned without a verified webhook"
    );
    let notification = serde_json::json!({"events": [{"action": "push",
        "target": {"repository": "team/web", "tag": newer.rsplit(':').next()}}]});
    let hooked = std::time::Instant::now();
    assert_eq!(
        registry_hook(&agent, Some(SECRET), &notification.to_string()).await,
        202
    );
    support::eventually(
        "a newer tag after the revert",
        Duration::from_secs(30),
        || {
            let bare = bare.clone();
            let newer = newer.clone();
            async move { (image_in_git(&bare) == newer).then_some(()) }
        },
    )
    .await;
    eprintln!(
        "image automation: registry webhook to the tag in Git: {:?}",
        hooked.elapsed()
    );

    // The same tag pushed again with other content (a moved tag): flagged, Git left alone.
    let commits = image_commits(&bare).len();
    push_image(tools, tmp.path(), &newer, "moved under the same tag");
    assert_eq!(registry_hook(&agent, Some(SECRET), "{}").await, 202);
    support::eventually("the moved tag flagged", Duration::from_secs(15), || {
        let log = agent.log.clone();
        async move {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("moved from sha256:").then_some(())
        }
    })
    .await;
    assert_eq!(
        image_commits(&bare).len(),
        commits,
        "a moved tag was committed"
    );
    assert_eq!(image_in_git(&bare), newer);
    let before = std::fs::read_to_string(agent_dir.join("agent.log")).unwrap();
    assert!(
        before.contains("image automation committed a new image"),
        "the agent logs each commit"
    );
    let _ = agent.child.kill();
}

/// A hostile policy's registry, over HTTPS: it asks for a token at its own realm and then
/// answers every tag list 429 with `Retry-After: 30`. It records each request's path and
/// `Authorization`.
async fn hostile_registry(ca: &TestCa) -> (u16, Arc<std::sync::Mutex<Vec<(String, String)>>>) {
    use axum::http::{HeaderMap, StatusCode, Uri};
    let seen: Arc<std::sync::Mutex<Vec<(String, String)>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let recorded = seen.clone();
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let recorded = recorded.clone();
        async move {
            let auth = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            recorded
                .lock()
                .unwrap()
                .push((uri.path().to_string(), auth.clone()));
            if uri.path() == "/token" {
                return (
                    StatusCode::OK,
                    HeaderMap::new(),
                    r#"{"token":"t"}"#.to_string(),
                );
            }
            let mut answer = HeaderMap::new();
            if auth.is_empty() {
                let challenge =
                    format!("Bearer realm=\"https://127.0.0.1:{port}/token\",service=\"hostile\"");
                answer.insert("www-authenticate", challenge.parse().unwrap());
                return (StatusCode::UNAUTHORIZED, answer, String::new());
            }
            answer.insert("retry-after", "30".parse().unwrap());
            (StatusCode::TOO_MANY_REQUESTS, answer, String::new())
        }
    });
    tokio::spawn(support::tls::serve_https(listener, app, ca.server_config()));
    (port, seen)
}

/// Issue 74: a private registry (distribution with htpasswd) is read with the credentials of
/// `--registry-credentials`, a Docker config file the agent reads again at each scan (a
/// rotated Secret is used without a restart; refused credentials are said). A policy naming
/// another host never gets them, and a registry that answers 429 is left alone as long as it
/// asks.
#[tokio::test]
async fn a_private_registry_is_read_with_credentials_only_its_host_gets_and_a_429_backs_off() {
    use base64::Engine as _;
    let Setup {
        ns,
        tmp,
        tools,
        ca,
        ca_file,
        port,
        repository,
        ..
    } = &setup("images-private", true).await;
    let docker_config = |password: &str| {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("ci:{password}"));
        format!(r#"{{"auths": {{"127.0.0.1:{port}": {{"auth": "{auth}"}}}}}}"#)
    };
    // crane pushes with the right credentials; the agent starts with a wrong password.
    let crane_config = tmp.path().join("docker");
    std::fs::create_dir_all(&crane_config).unwrap();
    std::fs::write(crane_config.join("config.json"), docker_config(PASSWORD)).unwrap();
    let credentials = tmp.path().join("registry-credentials.json");
    std::fs::write(&credentials, docker_config("wrong")).unwrap();
    let first = format!("{repository}:1.0.0");
    support::registry::push_image_as(tools, tmp.path(), &first, "1.0.0", Some(&crane_config));
    let second = format!("{repository}:1.1.0");
    support::registry::push_image_as(tools, tmp.path(), &second, "1.1.0", Some(&crane_config));

    let (hostile_port, seen) = hostile_registry(ca).await;
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    write_web_and_policy(&work, &ns.name, &first, &semver_policy(repository));
    let hostile = semver_policy(&format!("127.0.0.1:{hostile_port}/team/web"))
        .replace("name: web", "name: mirror");
    std::fs::write(work.join("policies/mirror.yaml"), hostile).unwrap();
    git(&work, &["add", "-A"]);
    git(
        &work,
        &[
            "commit",
            "-qm",
            "web, its policy, and a policy on another registry",
        ],
    );
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

    let agent_dir = tmp.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let agent = start_with(
        &agent_dir,
        &bare,
        &ns.name,
        ca_file,
        "1s",
        &[format!("--registry-credentials={}", credentials.display())],
    );
    wait_ready(&agent).await;
    support::eventually(
        "the refused credentials said",
        Duration::from_secs(30),
        || {
            let text = agent.log_text();
            async move {
                text.contains("in --registry-credentials were refused")
                    .then_some(())
            }
        },
    )
    .await;
    assert_eq!(image_in_git(&bare), first);

    // The Secret is rotated: the next scan uses it, and 1.1.0 is committed.
    std::fs::write(&credentials, docker_config(PASSWORD)).unwrap();
    support::eventually("1.1.0 in Git", Duration::from_secs(30), || {
        let (bare, second) = (bare.clone(), second.clone());
        async move { (image_in_git(&bare) == second).then_some(()) }
    })
    .await;

    // The other host: asked for a token anonymously, never given a credential, and its 429
    // (Retry-After: 30) kept for 30 s although scans run every second.
    support::let_time_pass(
        "five scans beside the limited registry",
        Duration::from_secs(5),
    )
    .await;
    let seen = seen.lock().unwrap().clone();
    let secret = base64::engine::general_purpose::STANDARD.encode(format!("ci:{PASSWORD}"));
    assert!(
        seen.iter()
            .all(|(_, auth)| !auth.starts_with("Basic") && !auth.contains(&secret)),
        "a credential reached another host: {seen:?}"
    );
    let limited = seen
        .iter()
        .filter(|(path, auth)| path.ends_with("/tags/list") && auth == "Bearer t")
        .count();
    assert_eq!(
        limited, 1,
        "the limited registry was asked again within its Retry-After: {seen:?}"
    );
    assert!(
        agent.log_text().contains("backing off"),
        "the backoff is logged"
    );
}

/// Issue 74: with `digestPinning` the tag is written with its digest, and the rollout runs
/// exactly that image (its status names it). A `kill -9` at any moment of a scan (before the
/// registry is read, during the commit, or after the push) makes no second commit for a tag:
/// the restarted agent finds the line on its pick, or writes it once.
#[tokio::test]
async fn a_pinned_digest_is_written_and_a_kill_9_mid_scan_makes_no_second_commit() {
    let Setup {
        client,
        ns,
        tmp,
        tools,
        ca_file,
        repository,
        ..
    } = &setup("images-pinned", false).await;
    let first = format!("{repository}:1.0.0");
    push_image(tools, tmp.path(), &first, "1.0.0");

    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    let pinned = format!("{}  digestPinning: true\n", semver_policy(repository));
    write_web_and_policy(&work, &ns.name, &first, &pinned);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "web and its pinned policy"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

    let agent_dir = tmp.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let mut agent = start(&agent_dir, &bare, &ns.name, ca_file, "1s");
    wait_ready(&agent).await;
    // The tag in Git is the newest, but not pinned yet: the first scan pins it.
    let first_digest = stdout_digest(tools, &first);
    let first_pinned = format!("{first}@{first_digest}");
    support::eventually("1.0.0 pinned in Git", Duration::from_secs(30), || {
        let (bare, want) = (bare.clone(), first_pinned.clone());
        async move { (image_in_git(&bare) == want).then_some(()) }
    })
    .await;

    // Five tags; after each push the agent is killed at a different moment of its scans
    // (0 to 1.6 s later) and started again.
    let mut last = first_pinned.clone();
    for (i, minor) in (1..=5).enumerate() {
        let reference = format!("{repository}:1.{minor}.0");
        let digest = push_image(tools, tmp.path(), &reference, &format!("1.{minor}.0"));
        tokio::time::sleep(Duration::from_millis(400 * i as u64)).await;
        agent.kill();
        agent = start(&agent_dir, &bare, &ns.name, ca_file, "1s");
        let want = format!("{reference}@{digest}");
        support::eventually(&format!("{want} in Git"), Duration::from_secs(45), || {
            let (bare, want) = (bare.clone(), want.clone());
            async move { (image_in_git(&bare) == want).then_some(()) }
        })
        .await;
        last = want;
    }
    support::let_time_pass("three more scans", Duration::from_secs(3)).await;
    let commits = image_commits(&bare);
    assert_eq!(
        commits.len(),
        6,
        "one commit per tag (1.0.0 pinned, then five): {commits:?}"
    );
    assert_eq!(image_in_git(&bare), last);

    // The rollout runs the pinned reference, and says where it came from.
    let api: Api<CanaryDeployment> = Api::namespaced(client.clone(), &ns.name);
    support::eventually("web on the pinned 1.5.0", Duration::from_secs(90), || {
        let (api, last) = (api.clone(), last.clone());
        async move {
            let status = api.get("web").await.ok()?.status?;
            let on_it = status.stable_image.as_deref() == Some(last.as_str())
                || status.canary_image.as_deref() == Some(last.as_str());
            let source = status.image_source.unwrap_or_default();
            (on_it && source.contains("from ImagePolicy web, commit ")).then_some(())
        }
    })
    .await;
}

/// The digest crane reads for `reference`.
fn stdout_digest(tools: &std::path::Path, reference: &str) -> String {
    support::registry::stdout(&support::registry::run(
        &tools.join("crane"),
        &["digest", "--insecure", reference],
    ))
    .trim()
    .to_string()
}

/// Issue 74: `newestBuild` picks the tag whose image was built last (its config's `created`),
/// among the tags `filterTags` allows, whatever their names say.
#[tokio::test]
async fn newest_build_picks_the_image_built_last() {
    use support::registry::set_created;
    let Setup {
        ns,
        tmp,
        tools,
        ca_file,
        repository,
        ..
    } = &setup("images-built", false).await;
    let push = |tag: &str, created: &str| {
        let reference = format!("{repository}:{tag}");
        push_image(tools, tmp.path(), &reference, tag);
        set_created(tools, &reference, created);
        reference
    };
    let first = push("main-aaa", "2026-12-04T10:00:00Z");
    push("main-zzz", "2026-12-04T09:00:00Z");
    let built_last = push("main-mmm", "2026-12-04T11:00:00Z");
    // Newer, but not a tag the filter allows.
    push("pr-1", "2026-12-04T12:00:00Z");

    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    std::fs::create_dir_all(work.join("apps")).unwrap();
    std::fs::write(work.join("apps/web.yaml"), marked_web(&ns.name, &first)).unwrap();
    let policy = format!(
        "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: ImagePolicy\nmetadata:\n  name: web\n\
         spec:\n  image: {repository}\n  policy:\n    newestBuild: {{}}\n  filterTags:\n    \
         pattern: \"^main-\"\n"
    );
    std::fs::write(work.join("apps/policy.yaml"), policy).unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "web and its newestBuild policy"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let (code, out, _) = support::validate_offline(&work, &[]);
    assert_eq!(code, 0, "{out}");

    let agent_dir = tmp.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let agent = start(&agent_dir, &bare, &ns.name, ca_file, "1s");
    wait_ready(&agent).await;
    support::eventually("main-mmm in Git", Duration::from_secs(30), || {
        let (bare, want) = (bare.clone(), built_last.clone());
        async move { (image_in_git(&bare) == want).then_some(()) }
    })
    .await;
    // A tag built later still.
    let newer = push("main-bbb", "2026-12-04T13:00:00Z");
    support::eventually("main-bbb in Git", Duration::from_secs(30), || {
        let (bare, want) = (bare.clone(), newer.clone());
        async move { (image_in_git(&bare) == want).then_some(()) }
    })
    .await;
    assert_eq!(image_commits(&bare).len(), 2, "{:?}", image_commits(&bare));
}

/// Issue 74: with `--git-signing-key` the automation's commits are SSH-signed, so an agent
/// that applies only signed commits (`--signing-keys`, listing a person's key and its own)
/// applies them and canaries the new tag; real `git verify-commit` (an allowed-signers file)
/// accepts the signature too.
#[tokio::test]
async fn signed_automation_commits_pass_the_agents_own_signature_check() {
    let Setup {
        client,
        ns,
        tmp,
        tools,
        ca_file,
        repository,
        ..
    } = &setup("images-signed", false).await;
    let first = format!("{repository}:1.0.0");
    push_image(tools, tmp.path(), &first, "1.0.0");

    // A person's key and the agent's, both trusted.
    let keys = tmp.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let (person, agent_key) = (tmp.path().join("person"), tmp.path().join("agent_key"));
    for (key, comment) in [(&person, "dev"), (&agent_key, "linnet")] {
        let out = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
            .arg(key)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    std::fs::copy(person.with_extension("pub"), keys.join("dev.pub")).unwrap();
    std::fs::copy(agent_key.with_extension("pub"), keys.join("linnet.pub")).unwrap();

    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    std::fs::create_dir_all(work.join("apps")).unwrap();
    std::fs::write(work.join("apps/web.yaml"), marked_web(&ns.name, &first)).unwrap();
    std::fs::write(work.join("apps/policy.yaml"), semver_policy(repository)).unwrap();
    git(&work, &["add", "-A"]);
    let person_key = format!("user.signingkey={}", person.display());
    git(
        &work,
        &[
            "-c",
            "gpg.format=ssh",
            "-c",
            &person_key,
            "commit",
            "-S",
            "-qm",
            "web, signed",
        ],
    );
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

    let agent_dir = tmp.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let agent = start_with(
        &agent_dir,
        &bare,
        &ns.name,
        ca_file,
        "1s",
        &[
            format!("--signing-keys={}", keys.display()),
            format!("--git-signing-key={}", agent_key.display()),
        ],
    );
    wait_ready(&agent).await;
    let api: Api<CanaryDeployment> = Api::namespaced(client.clone(), &ns.name);
    support::eventually("web stable on 1.0.0", Duration::from_secs(90), || {
        let (api, first) = (api.clone(), first.clone());
        async move { (canary_of(&api).await.1 == first).then_some(()) }
    })
    .await;

    let second = format!("{repository}:1.1.0");
    push_image(tools, tmp.path(), &second, "1.1.0");
    support::eventually("1.1.0 in Git", Duration::from_secs(30), || {
        let (bare, second) = (bare.clone(), second.clone());
        async move { (image_in_git(&bare) == second).then_some(()) }
    })
    .await;
    // Applied by the agent that checks signatures: the rollout canaries it.
    support::eventually("web canaries 1.1.0", Duration::from_secs(60), || {
        let (api, second) = (api.clone(), second.clone());
        async move {
            let (canary, stable) = canary_of(&api).await;
            (canary == second || stable == second).then_some(())
        }
    })
    .await;
    // And real Git verifies the signature with the agent's key.
    let allowed = tmp.path().join("allowed_signers");
    let public = std::fs::read_to_string(agent_key.with_extension("pub")).unwrap();
    std::fs::write(&allowed, format!("linnet@localhost {public}")).unwrap();
    let allowed_file = format!("gpg.ssh.allowedSignersFile={}", allowed.display());
    let out = std::process::Command::new("git")
        .current_dir(&bare)
        .args(["-c", &allowed_file, "verify-commit", "main"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git verify-commit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Good \"git\" signature"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
