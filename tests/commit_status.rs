//! Commit statuses against a local HTTP server that implements each provider's documented
//! endpoint and records every request (GitHub.com, GitLab.com, Bitbucket Cloud and Gitea cannot run here; a
//! real Gitea is issue 9's). Asserts method, path, headers, auth and body, the state
//! sequence of whole rollouts, and how rate limits and server errors are handled.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use linnet::api::{
    CanaryDeployment, CanaryStatefulSet, CanaryStatefulSetStatus, DeploymentPhase, StatefulSetPhase,
};
use linnet::telemetry::Metrics;
use linnet::writeback::StatusPoster;
use linnet::writeback::commit_status::{
    CommitStatusConfig, Poster, Provider, wanted_for_deployment, wanted_for_statefulset,
};
use serde_json::json;
use support::status_host::{Host, host, host_https};
use support::tls::TestCa;

fn config(provider: Provider, api_url: String, dir: &std::path::Path) -> CommitStatusConfig {
    let token = dir.join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    CommitStatusConfig {
        provider,
        api_url,
        repository: "acme/gitops".into(),
        token_file: token,
        cluster: "prod".into(),
        target_url: Some("https://linnet.example/{namespace}/{name}".into()),
        ca_file: None,
        timeout: Duration::from_secs(10),
    }
}

const A: &str = "1111111111111111111111111111111111111111";
const B: &str = "2222222222222222222222222222222222222222";

fn redis(phase: StatefulSetPhase, revision: &str) -> CanaryStatefulSet {
    let mut o: CanaryStatefulSet = serde_json::from_value(json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryStatefulSet",
        "metadata": {"name": "redis", "namespace": "default"},
        "spec": {"replicas": 3, "image": "redis:7.4", "template": {
            "selector": {"matchLabels": {"app": "redis"}},
            "template": {"spec": {"containers": [{"name": "redis"}]}}}}
    }))
    .unwrap();
    let stable = matches!(phase, StatefulSetPhase::Stable);
    o.status = Some(CanaryStatefulSetStatus {
        phase: Some(phase),
        stable_image: Some(if stable { "redis:7.4" } else { "redis:7.2" }.into()),
        canary_image: (!stable).then(|| "redis:7.4".into()),
        ready: Some("3/3".into()),
        source_revision: Some(revision.into()),
        ..Default::default()
    });
    o
}

fn states(host: &Host) -> Vec<(String, String)> {
    host.requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            let sha = r.path.rsplit('/').next().unwrap()[..1].to_string();
            (sha, r.body["state"].as_str().unwrap().to_string())
        })
        .collect()
}

#[tokio::test]
async fn each_provider_gets_its_documented_request() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, base) = host().await;
    let cases = [
        (
            Provider::Github,
            "/repos/acme/gitops/statuses/",
            "authorization",
            "Bearer s3cret",
            "context",
        ),
        (
            Provider::Gitlab,
            "/projects/acme%2Fgitops/statuses/",
            "private-token",
            "s3cret",
            "name",
        ),
        (
            Provider::Gitea,
            "/repos/acme/gitops/statuses/",
            "authorization",
            "token s3cret",
            "context",
        ),
    ];
    for (provider, path, header, auth, context_field) in cases {
        let cfg = config(provider, base.clone(), tmp.path());
        let w = wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::CanaryActive, A)).unwrap();
        Poster::new(cfg).unwrap().post(&w).await.unwrap();
        let r = host.requests.lock().unwrap().last().cloned().unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, format!("{path}{A}"), "{provider:?}");
        assert_eq!(r.headers[header], auth, "{provider:?}");
        assert_eq!(r.body["state"], "pending", "{provider:?}");
        assert_eq!(
            r.body[context_field], "linnet/prod/default/redis",
            "{provider:?}"
        );
        assert_eq!(r.body["target_url"], "https://linnet.example/default/redis");
        assert!(
            r.body["description"]
                .as_str()
                .unwrap()
                .contains("waiting for promotion"),
            "{provider:?}: {}",
            r.body
        );
        if provider == Provider::Github {
            assert_eq!(r.headers["accept"], "application/vnd.github+json");
            assert!(
                r.headers["user-agent"]
                    .to_str()
                    .unwrap()
                    .starts_with("linnet/")
            );
        }
    }
    // Bitbucket Cloud: a build status, keyed by the context, with a link it requires.
    let mut cfg = config(Provider::Bitbucket, base.clone(), tmp.path());
    let w = wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::CanaryActive, A)).unwrap();
    Poster::new(cfg.clone()).unwrap().post(&w).await.unwrap();
    let r = host.requests.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        r.path,
        format!("/repositories/acme/gitops/commit/{A}/statuses/build")
    );
    assert_eq!(r.headers["authorization"], "Bearer s3cret");
    assert_eq!(r.body["state"], "INPROGRESS");
    assert_eq!(r.body["key"], "linnet/prod/default/redis");
    assert_eq!(r.body["url"], "https://linnet.example/default/redis");
    cfg.target_url = None;
    let w = wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::Stable, B)).unwrap();
    Poster::new(cfg).unwrap().post(&w).await.unwrap();
    let r = host.requests.lock().unwrap().last().cloned().unwrap();
    assert_eq!(r.body["state"], "SUCCESSFUL");
    assert_eq!(
        r.body["url"],
        format!("{base}/repositories/acme/gitops/commit/{B}")
    );
}

/// A whole rollout: the image push (commit A) is pending while the canary runs, pending while
/// it waits for promotion (the description says so), and the merge that promotes it
/// (commit B) becomes success. Repeated states are not posted again.
#[tokio::test]
async fn a_whole_rollout_posts_pending_pending_success() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, base) = host().await;
    let cfg = config(Provider::Github, base, tmp.path());
    let mut poster = StatusPoster::new(cfg.clone(), Arc::new(Metrics::default())).unwrap();
    for (phase, rev) in [
        (StatefulSetPhase::ScalingDownStable, A),
        (StatefulSetPhase::DeployingCanary, A),
        (StatefulSetPhase::CanaryActive, A),
        (StatefulSetPhase::CanaryActive, A),
        (StatefulSetPhase::Promoting, B),
        (StatefulSetPhase::Stable, B),
        (StatefulSetPhase::Stable, B),
    ] {
        if let Some(w) = wanted_for_statefulset(&cfg, &redis(phase, rev)) {
            poster.offer(w).await;
        }
    }
    assert_eq!(
        states(&host),
        [
            ("1".into(), "pending".into()),
            ("1".into(), "pending".into()),
            ("2".into(), "success".into())
        ]
    );
    let descriptions: Vec<String> = host
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.body["description"].as_str().unwrap().to_string())
        .collect();
    assert!(
        descriptions[1].contains("waiting for promotion"),
        "{descriptions:?}"
    );
}

#[tokio::test]
async fn a_rolled_back_rollout_posts_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, base) = host().await;
    let cfg = config(Provider::Gitea, base, tmp.path());
    let mut poster = StatusPoster::new(cfg.clone(), Arc::new(Metrics::default())).unwrap();
    for phase in [
        StatefulSetPhase::DeployingCanary,
        StatefulSetPhase::RollingBack,
        StatefulSetPhase::RolledBack,
    ] {
        if let Some(w) = wanted_for_statefulset(&cfg, &redis(phase, A)) {
            poster.offer(w).await;
        }
    }
    assert_eq!(
        states(&host),
        [
            ("1".into(), "pending".into()),
            ("1".into(), "failure".into())
        ]
    );
    // A CanaryDeployment that fails at its deadline is a failure too.
    let mut d: CanaryDeployment = serde_json::from_value(json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryDeployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 4, "image": "nginx:broken", "template": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"spec": {"containers": [{"name": "web"}]}}}}
    }))
    .unwrap();
    d.status = Some(linnet::api::CanaryDeploymentStatus {
        phase: Some(DeploymentPhase::Failed),
        source_revision: Some(B.into()),
        message: Some("new pods on nginx:broken were not available".into()),
        ..Default::default()
    });
    let w = wanted_for_deployment(&cfg, &d).unwrap();
    assert_eq!(w.context, "linnet/prod/default/web");
    poster.offer(w).await;
    assert_eq!(
        states(&host).last().unwrap(),
        &("2".to_string(), "failure".to_string())
    );
}

#[tokio::test]
async fn a_429_with_retry_after_is_waited_out() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, base) = host().await;
    host.answers
        .lock()
        .unwrap()
        .push_back((429, vec![("retry-after", "1".into())]));
    let cfg = config(Provider::Github, base, tmp.path());
    let w = wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::Stable, A)).unwrap();
    let poster = Poster::new(cfg).unwrap();
    let started = Instant::now();
    assert_eq!(poster.post(&w).await.unwrap(), 2);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // A 403 with an exhausted rate limit (GitHub's) is waited out until its reset, then retried.
    host.answers.lock().unwrap().push_back((
        403,
        vec![
            ("x-ratelimit-remaining", "0".into()),
            ("x-ratelimit-reset", "0".into()),
        ],
    ));
    assert_eq!(poster.post(&w).await.unwrap(), 2);
    assert_eq!(host.requests.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn server_errors_are_retried_and_a_refusal_says_what_to_check() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, base) = host().await;
    host.answers
        .lock()
        .unwrap()
        .extend([(500, vec![]), (502, vec![])]);
    let cfg = config(Provider::Gitlab, base, tmp.path());
    let w = wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::Stable, A)).unwrap();
    let poster = Poster::new(cfg).unwrap();
    assert_eq!(poster.post(&w).await.unwrap(), 3);
    host.answers.lock().unwrap().push_back((401, vec![]));
    let err = poster.post(&w).await.unwrap_err();
    assert_eq!(err.label(), "refused");
    assert!(err.to_string().contains("check the token"), "{err}");
    assert_eq!(host.requests.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn statuses_go_over_https_to_a_host_whose_ca_is_given_with_ca_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = TestCa::new("status API CA");
    let (host, base) = host_https(ca.server_config()).await;
    let mut cfg = config(Provider::Github, base, tmp.path());
    cfg.ca_file = Some(ca.write(tmp.path(), "ca.pem"));
    let w = wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::Stable, A)).unwrap();
    assert_eq!(Poster::new(cfg).unwrap().post(&w).await.unwrap(), 1);
    let requests = host.requests.lock().unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, format!("/repos/acme/gitops/statuses/{A}"));
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_certificate_error_that_points_at_ca_file() {
    // Issue 21: the cause was lost ("error sending request"), and https was not built in.
    let tmp = tempfile::tempdir().unwrap();
    let ca = TestCa::new("status API CA");
    let other = TestCa::new("some other CA");
    let (host, base) = host_https(ca.server_config()).await;
    for ca_file in [None, Some(other.write(tmp.path(), "other.pem"))] {
        let mut cfg = config(Provider::Github, base.clone(), tmp.path());
        cfg.ca_file = ca_file;
        let err = post_error(cfg).await;
        assert_eq!(err.label(), "certificate", "{err}");
        let text = err.to_string();
        assert!(text.contains("--ca-file"), "{text}");
        assert!(text.contains("UnknownIssuer"), "{text}");
    }
    assert!(host.requests.lock().unwrap().is_empty());
}

/// What one post of redis's Stable status to `cfg`'s host fails with.
async fn post_error(cfg: CommitStatusConfig) -> linnet::writeback::commit_status::PostError {
    let w = wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::Stable, A)).unwrap();
    Poster::new(cfg).unwrap().post(&w).await.unwrap_err()
}

#[tokio::test]
async fn refused_connections_unknown_hosts_and_silent_hosts_each_say_which() {
    let tmp = tempfile::tempdir().unwrap();
    // Nothing listens on the port.
    let port = support::ports::free_port();
    let cfg = config(
        Provider::Github,
        format!("https://127.0.0.1:{port}"),
        tmp.path(),
    );
    let err = post_error(cfg).await;
    assert_eq!(err.label(), "connection_refused", "{err}");
    // A name that does not resolve (.invalid never does).
    let cfg = config(
        Provider::Github,
        "https://status-api.linnet.invalid".into(),
        tmp.path(),
    );
    let err = post_error(cfg).await;
    assert_eq!(err.label(), "dns", "{err}");
    assert!(err.to_string().contains("does not resolve"), "{err}");
    // A host that accepts the connection and says nothing: given up at the timeout, once.
    let (_, base) = host().await;
    let proxy =
        support::stall::StallProxy::start(base.trim_start_matches("http://").parse().unwrap());
    proxy.set(support::stall::Mode::StallAll);
    let mut cfg = config(Provider::Github, proxy.http_base(), tmp.path());
    cfg.timeout = Duration::from_millis(500);
    let started = Instant::now();
    let err = post_error(cfg).await;
    assert_eq!(err.label(), "timeout", "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(proxy.stalled_connections(), 1);
}

#[tokio::test]
async fn a_status_the_host_did_not_take_waits_for_its_retry_instead_of_failing_on_every_change() {
    // Issue 21: while the host was away, every change of a rollout's object cost a post that
    // timed out, so the failures came once per timeout, not once per backoff.
    let tmp = tempfile::tempdir().unwrap();
    let port = support::ports::free_port();
    let cfg = config(
        Provider::Github,
        format!("http://127.0.0.1:{port}"),
        tmp.path(),
    );
    let metrics = Arc::new(Metrics::default());
    let mut poster = StatusPoster::new(cfg.clone(), metrics.clone()).unwrap();
    let refused = || {
        metrics
            .commit_status_posts
            .get_or_create(&linnet::telemetry::ResultLabel {
                result: "connection_refused".into(),
            })
            .get()
    };
    let pending =
        wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::DeployingCanary, A)).unwrap();
    poster.offer(pending.clone()).await;
    assert_eq!(refused(), 1);
    assert!(poster.retry_due().is_some());
    for _ in 0..5 {
        poster.offer(pending.clone()).await;
    }
    assert_eq!(
        refused(),
        1,
        "the same status was posted again before its retry"
    );
    // A newer status, and another rollout's, wait for the retry too: the host is away.
    let stable = wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::Stable, A)).unwrap();
    poster.offer(stable).await;
    let other = wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::Stable, B)).unwrap();
    poster.offer(other).await;
    assert_eq!(refused(), 1);
    // The retry posts the latest status of each; the first to fail again keeps the other
    // for the next retry.
    poster.retry_failed().await;
    assert_eq!(refused(), 2);
    assert!(poster.retry_due().is_some());
}

#[tokio::test]
async fn a_status_the_host_refuses_is_not_retried_and_holds_up_no_other() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, base) = host().await;
    host.answers.lock().unwrap().push_back((422, vec![]));
    let cfg = config(Provider::Github, base, tmp.path());
    let mut poster = StatusPoster::new(cfg.clone(), Arc::new(Metrics::default())).unwrap();
    poster
        .offer(wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::Stable, A)).unwrap())
        .await;
    assert_eq!(poster.retry_due(), None);
    poster
        .offer(wanted_for_statefulset(&cfg, &redis(StatefulSetPhase::Stable, B)).unwrap())
        .await;
    assert_eq!(host.requests.lock().unwrap().len(), 2);
}

#[test]
fn a_rollback_by_analysis_names_the_metric_in_the_commit_status() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(Provider::Github, "http://127.0.0.1:1".into(), tmp.path());
    let mut o = redis(StatefulSetPhase::RolledBack, A);
    o.status.as_mut().unwrap().analysis = serde_json::from_value(json!([{
        "name": "background", "phase": "Failed", "startedAt": "2026-01-01T00:00:00Z",
        "message": "error-rate 0.31 failed result < 0.05 (2 failed, failureLimit 1)"
    }]))
    .unwrap();
    let w = wanted_for_statefulset(&cfg, &o).unwrap();
    assert_eq!(
        w.description,
        "rolled back: analysis background failed: error-rate 0.31 failed result < 0.05 (2 failed, failureLimit 1)"
    );
}

/// Issue 50: revert and promotion pull requests on the same hosts. Each provider gets its
/// documented list and create requests with its auth; the lists are read once per batch of
/// jobs (a start looks at every rollout that uses pull requests), and a rate-limited host is
/// asked again later while a refusal is not.
#[tokio::test]
async fn pull_requests_use_each_providers_endpoints_and_are_listed_once_per_batch() {
    use linnet::writeback::pull_request::PullRequests;
    let dir = tempfile::tempdir().unwrap();
    for (provider, path, auth) in [
        (
            Provider::Github,
            "/repos/acme/gitops/pulls",
            ("authorization", "Bearer s3cret"),
        ),
        (
            Provider::Gitea,
            "/repos/acme/gitops/pulls",
            ("authorization", "token s3cret"),
        ),
        (
            Provider::Gitlab,
            "/projects/acme%2Fgitops/merge_requests",
            ("private-token", "s3cret"),
        ),
    ] {
        let (h, api) = host().await;
        let prs = PullRequests::new(config(provider, api, dir.path())).unwrap();
        // Two rollouts' lookups and one closed-list check: one GET of each list.
        prs.open_with_prefix("linnet/revert/demo/redis/")
            .await
            .unwrap();
        prs.open_with_prefix("linnet/promote/demo/web/")
            .await
            .unwrap();
        assert!(
            !prs.closed_from("linnet/revert/demo/redis/0123")
                .await
                .unwrap()
        );
        assert!(
            !prs.closed_from("linnet/revert/demo/web/0123")
                .await
                .unwrap()
        );
        let gets = |h: &Host| {
            h.requests
                .lock()
                .unwrap()
                .iter()
                .filter(|r| r.method == "GET")
                .map(|r| r.path.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            gets(&h),
            vec![path.to_string(), path.to_string()],
            "{provider:?}"
        );
        // The next batch lists again.
        prs.forget_lists();
        prs.open_with_prefix("linnet/revert/demo/redis/")
            .await
            .unwrap();
        assert_eq!(gets(&h).len(), 3, "{provider:?}");

        // Opening one: a POST to the same path, authenticated as the provider documents.
        let _ = prs
            .open("linnet/revert/demo/redis/0123", "main", "Revert", "why")
            .await;
        let post = h.requests.lock().unwrap().last().cloned().unwrap();
        assert_eq!((post.method.as_str(), post.path.as_str()), ("POST", path));
        assert_eq!(post.headers[auth.0], auth.1);
        let (head, base) = match provider {
            Provider::Gitlab => ("source_branch", "target_branch"),
            _ => ("head", "base"),
        };
        assert_eq!(post.body[head], "linnet/revert/demo/redis/0123");
        assert_eq!(post.body[base], "main");

        // Rate-limited: asked again later; refused: not.
        h.answers
            .lock()
            .unwrap()
            .push_back((429, vec![("retry-after", "1".into())]));
        prs.forget_lists();
        let e = prs.open_with_prefix("x/").await.unwrap_err();
        assert!(e.retryable(), "{e}");
        h.answers.lock().unwrap().push_back((403, vec![]));
        let e = prs.close(7).await.unwrap_err();
        assert!(!e.retryable(), "{e}");
        assert!(e.to_string().contains("check the token's scope"), "{e}");
    }
}
