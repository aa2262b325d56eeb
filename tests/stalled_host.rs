//! A Git host that accepts connections and then says nothing (`support::stall`: the HTTPS end,
//! with a certificate from a test CA given to the agent with `--ca-file`, in front of a real
//! `git http-backend` and a real status API): the agent's fetches, write-back pushes and
//! commit status posts give up at --git-timeout and say so, the agent keeps answering
//! /healthz and webhooks meanwhile, and it catches up as soon as the host answers again. The
//! same proxy in front of the real API server: the Kubernetes client gives up at its read
//! timeout.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use kube::Api;
use linnet::api::{CanaryDeployment, CanaryStatefulSet, StatefulSetPhase};
use support::agent::{Agent, SECRET, start_agent, wait_ready};
use support::stall::{Mode, StallProxy};
use support::{TestNamespace, admin_client, eventually, git, install_linnet, metric};

/// Sends a signed GitHub push webhook for `after`; returns the answer's status and how long
/// it took.
async fn push_webhook(agent: &Agent, after: &str, delivery: &str) -> (u16, Duration) {
    let body = support::push_hook::github_push_body(after);
    let signature = linnet::source::webhook::sign_hex(SECRET.as_bytes(), &body);
    let started = Instant::now();
    let status = support::http()
        .post(format!("{}/hooks/github", agent.hooks))
        .header("x-github-event", "push")
        .header("x-github-delivery", delivery)
        .header("x-hub-signature-256", format!("sha256={signature}"))
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    (status, started.elapsed())
}

/// How long `/healthz` on the webhook port takes to answer 200.
async fn healthz(agent: &Agent) -> Duration {
    let started = Instant::now();
    let r = support::http()
        .get(format!("{}/healthz", agent.hooks))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    started.elapsed()
}

async fn wait_metric_at_least(agent: &Agent, key: &str, at_least: f64) {
    eventually(
        &format!("{key} >= {at_least}"),
        Duration::from_secs(60),
        || async {
            let m = agent.metrics().await;
            (metric(&m, key) >= at_least).then_some(())
        },
    )
    .await
}

/// The status file of `name` on the write-back branch of `bare`, if it is there.
fn status_file(bare: &Path, ns: &str, name: &str) -> Option<String> {
    support::show_on(
        bare,
        "linnet/status",
        &linnet::writeback::status_files::path("test", ns, name),
    )
}

fn commit_and_push(work: &Path, message: &str) -> String {
    git(work, &["commit", "-qam", message]);
    git(work, &["push", "-q", "origin", "HEAD:main"]);
    git(work, &["rev-parse", "HEAD"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_stalls_fetches_pushes_and_status_posts_times_out_and_is_caught_up_with() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "stall").await;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("srv");
    let bare = root.join("acme/gitops.git");
    std::fs::create_dir_all(&bare).unwrap();
    git(&bare, &["init", "--bare", "-q"]);
    git(tmp.path(), &["clone", "-q", bare.to_str().unwrap(), "work"]);
    let work = tmp.path().join("work");
    support::commit_example(&work, &ns.name);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

    // The real servers, each behind an HTTPS proxy that can hang (as a load balancer
    // terminating TLS in front of a Git host does).
    let ca = support::tls::TestCa::new("stalled host CA");
    let ca_file = ca.write(tmp.path(), "ca.pem");
    let git_server = support::git_http::serve(root.clone(), Some(("git", "t0ken")));
    let git_proxy = StallProxy::start_tls(
        git_server.trim_start_matches("http://").parse().unwrap(),
        ca.server_config(),
    );
    let (status_host, status_base) = support::status_host::host().await;
    let status_proxy = StallProxy::start_tls(
        status_base.trim_start_matches("http://").parse().unwrap(),
        ca.server_config(),
    );
    let token = tmp.path().join("token");
    std::fs::write(&token, "status-token").unwrap();
    let password = tmp.path().join("git-password");
    std::fs::write(&password, "t0ken").unwrap();
    let agent = start_agent(
        tmp.path(),
        &[
            format!("--repo-url={}/acme/gitops.git", git_proxy.https_base()),
            format!("--ca-file={}", ca_file.display()),
            "--git-username=git".into(),
            format!("--git-password-file={}", password.display()),
            "--git-timeout=2s".into(),
            "--writeback-interval=200ms".into(),
            "--commit-status-provider=gitea".into(),
            format!(
                "--commit-status-api-url=https://{}/api/v1",
                status_proxy.addr
            ),
            "--commit-status-repo=acme/gitops".into(),
            format!("--commit-status-token-file={}", token.display()),
            "--cluster-name=test".into(),
        ],
        &ns.name,
    );
    wait_ready(&agent).await;
    let redis: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let web: Api<CanaryDeployment> = Api::namespaced(admin.clone(), &ns.name);
    eventually("redis Stable", Duration::from_secs(120), || async {
        redis
            .get_opt("redis")
            .await
            .ok()
            .flatten()
            .filter(|o| o.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::Stable))
    })
    .await;
    eventually(
        "redis's status file on linnet/status",
        Duration::from_secs(60),
        || async { status_file(&bare, &ns.name, "redis").filter(|t| t.contains("phase: Stable")) },
    )
    .await;
    eventually("a first commit status", Duration::from_secs(60), || async {
        (!status_host.requests.lock().unwrap().is_empty()).then_some(())
    })
    .await;

    // 1. Pushes and status posts hang; fetches go through. A new image starts a canary,
    //    whose progress cannot be written or posted.
    git_proxy.set(Mode::StallMatching("git-receive-pack".into()));
    status_proxy.set(Mode::StallAll);
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "  image: redis:7.2",
        "  image: redis:7.4",
    );
    let canary_commit = commit_and_push(&work, "redis 7.4");
    let (status, _) = push_webhook(&agent, &canary_commit, "canary").await;
    assert_eq!(status, 202);
    eventually("redis CanaryActive", Duration::from_secs(120), || async {
        redis.get_opt("redis").await.ok().flatten().filter(|o| {
            o.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::CanaryActive)
        })
    })
    .await;
    wait_metric_at_least(
        &agent,
        r#"linnet_writeback_errors_total{reason="timeout"}"#,
        1.0,
    )
    .await;
    wait_metric_at_least(
        &agent,
        r#"linnet_commit_status_posts_total{result="timeout"}"#,
        1.0,
    )
    .await;

    // 2. Fetches hang too. A push is announced; the fetch gives up; the agent answers its
    //    probes and webhooks all along.
    git_proxy.set(Mode::StallAll);
    let web_commit = {
        let file = work.join("apps/web/web.yaml");
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(
            &file,
            text.replacen(
                "  name: web\n",
                "  name: web\n  annotations:\n    linnet.test/after-the-stall: \"yes\"\n",
                1,
            ),
        )
        .unwrap();
        commit_and_push(&work, "web annotation, pushed while the host hangs")
    };
    let stalled_before = git_proxy.stalled_connections();
    let (status, took) = push_webhook(&agent, &web_commit, "during-the-stall").await;
    assert_eq!(status, 202);
    assert!(
        took < Duration::from_secs(1),
        "webhook answered in {took:?}"
    );
    let mut slowest_probe = Duration::ZERO;
    let probe_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < probe_until {
        slowest_probe = slowest_probe.max(healthz(&agent).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, took) = push_webhook(&agent, &web_commit, "during-the-stall-again").await;
    assert_eq!(status, 202);
    assert!(
        took < Duration::from_secs(1),
        "webhook answered in {took:?}"
    );
    wait_metric_at_least(
        &agent,
        r#"linnet_git_fetch_errors_total{reason="timeout"}"#,
        1.0,
    )
    .await;
    assert!(git_proxy.stalled_connections() > stalled_before);
    assert!(
        slowest_probe < Duration::from_secs(1),
        "/healthz took {slowest_probe:?} while Git hung"
    );
    let log = agent.log_text();
    for what in [
        "source not synced",
        "could not write status",
        "could not post",
    ] {
        if let Some(line) = log.lines().find(|l| l.contains(what)) {
            println!("{line}");
        }
    }
    assert!(
        log.contains("no answer within --git-timeout") || log.contains("did not answer within"),
        "the log does not say that Git timed out"
    );
    assert!(
        !web.get("web")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("linnet.test/after-the-stall")
    );

    // 3. The host answers again: the agent syncs the tip it could not fetch, writes the
    //    canary's status and posts it, without another push or webhook.
    git_proxy.set(Mode::Forward);
    status_proxy.set(Mode::Forward);
    let answered = Instant::now();
    eventually(
        "web synced from the tip fetched after the stall",
        Duration::from_secs(60),
        || async {
            web.get("web")
                .await
                .ok()
                .and_then(|o| o.metadata.annotations)
                .filter(|a| a.contains_key("linnet.test/after-the-stall"))
        },
    )
    .await;
    let synced_after = answered.elapsed();
    // Within the source's longest retry wait (10 s) and the look itself.
    assert!(
        synced_after < Duration::from_secs(15),
        "synced {synced_after:?} after the host answered again"
    );
    let status_now = agent.status().await;
    assert_eq!(status_now["revision"], web_commit.as_str(), "{status_now}");
    eventually(
        "the canary's status file",
        Duration::from_secs(60),
        || async {
            status_file(&bare, &ns.name, "redis").filter(|t| {
                t.contains("phase: CanaryActive")
                    && t.contains(&format!("sourceRevision: {canary_commit}"))
            })
        },
    )
    .await;
    let written_after = answered.elapsed();
    eventually(
        "the canary's commit status",
        Duration::from_secs(60),
        || async {
            status_host
                .requests
                .lock()
                .unwrap()
                .iter()
                .any(|r| r.path.ends_with(&format!("/statuses/{canary_commit}")))
                .then_some(())
        },
    )
    .await;
    let posted_after = answered.elapsed();
    println!(
        "host answering again -> synced {synced_after:?}, status file {written_after:?}, commit status {posted_after:?}; slowest /healthz while hung {slowest_probe:?}"
    );
}

/// kube's read timeout holds on the HTTP/2 client too: when the real API server behind a
/// proxy stops answering (a wedged load balancer), the request fails at `read_timeout`
/// instead of holding the reconcile that sent it for ever (the stack once dropped kube's
/// timeouts).
#[tokio::test]
async fn an_api_server_that_stops_answering_times_out() {
    install_linnet(&admin_client().await).await;
    let kubeconfig =
        kube::config::Kubeconfig::read_from(support::linnet_kubeconfig()).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("a config from linnet's kubeconfig");
    let api_server: std::net::SocketAddr = format!(
        "{}:{}",
        config.cluster_url.host().expect("host"),
        config.cluster_url.port_u16().expect("port")
    )
    .parse()
    .expect("the API server's address");
    let proxy = StallProxy::start(api_server);
    config.cluster_url = format!("https://{}", proxy.addr).parse().expect("url");
    config.read_timeout = Some(std::time::Duration::from_secs(2));
    let client = linnet::kube_client::from_config(config).expect("build the client");
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client, "default");
    services
        .get("kubernetes")
        .await
        .expect("read Service default/kubernetes through the proxy");

    proxy.set(Mode::StallAll);
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        services.get("kubernetes"),
    )
    .await
    .expect("the request ends on its own, at the read timeout");
    assert!(answer.is_err(), "nothing was answered: {answer:?}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
}
