//! linnet against a real Git host: a Gitea built from its Go module (`tests/gitea/`), serving
//! HTTPS with a certificate from a CA the test makes (given to the agent with `--ca-file`),
//! its push webhooks, its commit-status API and its pull requests, with the agent and the real
//! control plane. Nothing here stands in for the host.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use kube::Api;
use linnet::api::{CanaryDeployment, CanaryStatefulSet, StatefulSetPhase};
use support::agent::{Agent, SECRET, start_agent, wait_ready};
use support::gitea::{
    ADMIN, Gitea, agent_args, set_redis_images, with_example as gitea_with_example,
};
use support::tls::TestCa;
use support::{
    TestNamespace, admin_client, eventually, first_seen, git, install_linnet, metric, watch_named,
};

const REPO: &str = support::gitea::EXAMPLE_REPO;

/// Commits everything in `work` and pushes it to `main`; returns the commit and the moment
/// `git push` returned.
fn commit_and_push(work: &Path, message: &str) -> (String, Instant) {
    git(work, &["commit", "-qam", message]);
    git(work, &["push", "-q", "origin", "HEAD:main"]);
    let pushed = Instant::now();
    (git(work, &["rev-parse", "HEAD"]), pushed)
}

async fn wait_redis(
    api: &Api<CanaryStatefulSet>,
    what: &str,
    done: impl Fn(&CanaryStatefulSet) -> bool,
) -> CanaryStatefulSet {
    eventually(what, Duration::from_secs(120), || {
        let api = api.clone();
        let done = &done;
        async move {
            api.get_opt("redis")
                .await
                .ok()
                .flatten()
                .filter(|o| done(o))
        }
    })
    .await
}

fn phase(o: &CanaryStatefulSet) -> Option<StatefulSetPhase> {
    o.status.as_ref().and_then(|s| s.phase)
}

/// Waits for a commit status of `sha` with `context` in `state`, read back through Gitea's API.
async fn wait_commit_status(
    gitea: &Gitea,
    sha: &str,
    context: &str,
    state: &str,
) -> serde_json::Value {
    eventually(
        &format!("a {state} commit status {context} on {sha}"),
        Duration::from_secs(60),
        || async {
            gitea
                .statuses(REPO, sha)
                .await
                .into_iter()
                .find(|s| s["context"] == context && s["status"] == state)
        },
    )
    .await
}

async fn metrics(agent: &Agent) -> String {
    agent.metrics().await
}

fn median_and_max(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[v.len() - 1])
}

#[tokio::test]
async fn gitea_webhooks_commit_statuses_and_a_merged_pull_request_drive_a_rollout() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "gitea").await;
    let tmp = tempfile::tempdir().unwrap();
    // 1. A repository created through the API, and the example repository pushed over HTTPS.
    let (gitea, ca_file, work) = gitea_with_example(tmp.path(), &ns.name).await;

    // 3. The agent follows the repository over HTTPS with the token and the test's CA, a
    //    one-hour poll, and Gitea commit statuses (over HTTPS too).
    let mut args = agent_args(tmp.path(), &gitea, &ca_file);
    args.extend([
        "--writeback-interval=500ms".into(),
        "--cluster-name=test".into(),
    ]);
    let agent = start_agent(tmp.path(), &args, &ns.name);
    wait_ready(&agent).await;
    let redis: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let web: Api<CanaryDeployment> = Api::namespaced(admin.clone(), &ns.name);
    wait_redis(&redis, "redis Stable on redis:7.2", |o| {
        phase(o) == Some(StatefulSetPhase::Stable) && o.spec.image == "redis:7.2"
    })
    .await;

    // 2. A Gitea push webhook with a secret, aimed at the agent.
    let hook_url = format!("{}/hooks/gitea", agent.hooks);
    let hook = gitea.add_push_hook(REPO, &hook_url, SECRET).await;

    let context = format!("linnet/test/{}/redis", ns.name);
    let mut latencies = Vec::new();

    // 4. A push that changes redis's image starts the canary, woken by Gitea's webhook.
    let changed = first_seen(
        redis.clone(),
        watch_named("redis"),
        |o: &CanaryStatefulSet| o.spec.image == "redis:7.4",
    )
    .await;
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "  image: redis:7.2",
        "  image: redis:7.4",
    );
    let (canary_commit, pushed) = commit_and_push(&work, "redis 7.4");
    latencies.push(changed.await.unwrap() - pushed);
    wait_redis(&redis, "redis CanaryActive", |o| {
        phase(o) == Some(StatefulSetPhase::CanaryActive)
    })
    .await;
    let pending = wait_commit_status(&gitea, &canary_commit, &context, "pending").await;
    assert!(
        pending["description"]
            .as_str()
            .unwrap()
            .contains("redis:7.4"),
        "{pending}"
    );
    let m = metrics(&agent).await;
    assert!(
        metric(
            &m,
            r#"linnet_webhook_requests_total{host="gitea",result="202"}"#
        ) >= 1.0,
        "{m}"
    );

    // 5. A pull request that adds the promote annotation, merged through the API.
    git(&work, &["checkout", "-q", "-b", "promote-redis"]);
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "  name: redis\n",
        "  name: redis\n  annotations:\n    rollouts.linnet.dev/promote: \"true\"\n",
    );
    git(&work, &["commit", "-qam", "Promote redis 7.4"]);
    git(&work, &["push", "-q", "origin", "promote-redis"]);
    // A branch push alone changes nothing in the cluster.
    support::holds_for("redis in CanaryActive", Duration::from_secs(1), || async {
        match phase(&redis.get("redis").await.unwrap()) {
            Some(StatefulSetPhase::CanaryActive) => Ok(()),
            other => Err(format!("phase {other:?}")),
        }
    })
    .await;
    let changed = first_seen(
        redis.clone(),
        watch_named("redis"),
        |o: &CanaryStatefulSet| {
            o.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("rollouts.linnet.dev/promote"))
        },
    )
    .await;
    let merged_at = Instant::now();
    let merge_commit = gitea
        .merge_pull_request(REPO, "promote-redis", "main", "Promote redis 7.4")
        .await;
    println!(
        "merge through the API to cluster change: {:?}",
        changed.await.unwrap() - merged_at
    );
    wait_redis(&redis, "redis promoted to redis:7.4", |o| {
        phase(o) == Some(StatefulSetPhase::Stable)
            && o.status.as_ref().and_then(|s| s.stable_image.as_deref()) == Some("redis:7.4")
    })
    .await;
    let success = wait_commit_status(&gitea, &merge_commit, &context, "success").await;
    assert!(
        success["description"]
            .as_str()
            .unwrap()
            .contains("redis:7.4"),
        "{success}"
    );
    // The progress commit on linnet/status, read back through Gitea.
    let status_path = linnet::writeback::status_files::path("test", &ns.name, "redis");
    let progress = eventually(
        "the status file to say Stable on redis:7.4",
        Duration::from_secs(30),
        || async {
            gitea
                .raw_file(REPO, "linnet/status", &status_path)
                .await
                .filter(|t| t.contains("phase: Stable") && t.contains("stable: redis:7.4"))
        },
    )
    .await;
    assert!(
        progress.contains(&format!("sourceRevision: {merge_commit}")),
        "{progress}"
    );
    git(&work, &["checkout", "-q", "main"]);
    git(&work, &["pull", "-q", "--ff-only", "origin", "main"]);
    assert_eq!(git(&work, &["rev-parse", "HEAD"]), merge_commit);

    // 6. A broken image: its pod is never Ready, so linnet rolls back at the deadline.
    let changed = first_seen(
        redis.clone(),
        watch_named("redis"),
        |o: &CanaryStatefulSet| o.spec.image == "redis:broken",
    )
    .await;
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "  image: redis:7.4",
        "  image: redis:broken\n  progressDeadlineSeconds: 10",
    );
    let (broken_commit, pushed) = commit_and_push(&work, "redis broken");
    latencies.push(changed.await.unwrap() - pushed);
    wait_redis(&redis, "redis rolled back to redis:7.4", |o| {
        phase(o) == Some(StatefulSetPhase::RolledBack)
            && o.status.as_ref().and_then(|s| s.stable_image.as_deref()) == Some("redis:7.4")
    })
    .await;
    let failure = wait_commit_status(&gitea, &broken_commit, &context, "failure").await;
    assert!(
        failure["description"]
            .as_str()
            .unwrap()
            .contains("redis:broken"),
        "{failure}"
    );

    // Push to first cluster change, over more pushes: each sets an annotation on web.
    for i in 0..10 {
        let value = format!("push-{i}");
        let want = value.clone();
        let changed = first_seen(
            web.clone(),
            watch_named("web"),
            move |o: &CanaryDeployment| {
                o.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("linnet.test/push"))
                    == Some(&want)
            },
        )
        .await;
        let file = work.join("apps/web/web.yaml");
        let text = std::fs::read_to_string(&file).unwrap();
        let text = match text.find("  annotations:\n    linnet.test/push: ") {
            Some(_) => {
                let old = text
                    .lines()
                    .find(|l| l.starts_with("    linnet.test/push: "))
                    .unwrap()
                    .to_string();
                text.replacen(&old, &format!("    linnet.test/push: {value}"), 1)
            }
            None => text.replacen(
                "  name: web\n",
                &format!("  name: web\n  annotations:\n    linnet.test/push: {value}\n"),
                1,
            ),
        };
        std::fs::write(&file, text).unwrap();
        let (_, pushed) = commit_and_push(&work, &format!("web annotation {i}"));
        latencies.push(changed.await.unwrap() - pushed);
    }
    let (median, max) = median_and_max(latencies.clone());
    println!(
        "gitea: git push returned -> first cluster change, {} pushes: median {median:?}, max {max:?}; all {latencies:?}",
        latencies.len()
    );

    // 7. A webhook signed with the wrong secret is refused, and nothing changes.
    gitea
        .replace_hook_secret(REPO, hook, &hook_url, "not-the-agents-secret")
        .await;
    let before = metrics(&agent).await;
    let refused_before = metric(
        &before,
        r#"linnet_webhook_requests_total{host="gitea",result="401"}"#,
    );
    let revision_before: serde_json::Value = agent.status().await;
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "  image: redis:broken",
        "  image: redis:7.6",
    );
    let (ignored_commit, _) = commit_and_push(&work, "redis 7.6, behind a wrong secret");
    eventually(
        "the agent to refuse Gitea's webhook with 401",
        Duration::from_secs(30),
        || async {
            let m = metrics(&agent).await;
            (metric(
                &m,
                r#"linnet_webhook_requests_total{host="gitea",result="401"}"#,
            ) > refused_before)
                .then_some(())
        },
    )
    .await;
    support::holds_for(
        "redis:broken, RolledBack, after a refused webhook",
        Duration::from_secs(3),
        || async {
            let now = redis.get("redis").await.unwrap();
            match (now.spec.image.as_str(), phase(&now)) {
                ("redis:broken", Some(StatefulSetPhase::RolledBack)) => Ok(()),
                (image, phase) => Err(format!(
                    "a refused webhook changed the cluster: {image}, {phase:?}"
                )),
            }
        },
    )
    .await;
    let revision_after: serde_json::Value = agent.status().await;
    assert_eq!(revision_after["revision"], revision_before["revision"]);
    assert_ne!(revision_after["revision"], ignored_commit.as_str());
    assert!(
        agent.log_text().contains("webhook refused"),
        "the agent's log does not say why it refused the webhook"
    );
}

#[tokio::test]
async fn a_gitea_certificate_from_another_ca_is_refused_clearly_and_changes_nothing() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "gitea-ca").await;
    let tmp = tempfile::tempdir().unwrap();
    let (gitea, _, _) = gitea_with_example(tmp.path(), &ns.name).await;

    // The agent trusts another CA (and the system's, which do not know the test's).
    let wrong_ca = TestCa::new("some other CA").write(tmp.path(), "wrong-ca.pem");
    let agent = start_agent(
        tmp.path(),
        &agent_args(tmp.path(), &gitea, &wrong_ca),
        &ns.name,
    );
    wait_ready(&agent).await;
    let error = eventually(
        "the agent to report the certificate",
        Duration::from_secs(30),
        || async {
            agent.status().await["lastError"]
                .as_str()
                .map(str::to_string)
        },
    )
    .await;
    println!("the agent reports: {error}");
    assert!(error.contains("certificate"), "{error}");
    assert!(error.contains("--ca-file"), "{error}");
    let m = metrics(&agent).await;
    assert!(
        metric(&m, r#"linnet_git_fetch_errors_total{reason="certificate"}"#) >= 1.0,
        "{m}"
    );
    // Nothing was applied, and nothing was written to the repository.
    let redis: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    support::holds_for("nothing applied", Duration::from_secs(2), || async {
        let applied = redis.get_opt("redis").await.unwrap().is_some();
        let revision = agent.status().await["revision"].clone();
        match (applied, revision) {
            (false, serde_json::Value::Null) => Ok(()),
            (applied, revision) => Err(format!("applied: {applied}, revision {revision}")),
        }
    })
    .await;
    let (status, _) = gitea
        .call(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/branches/linnet%2Fstatus"),
            None,
        )
        .await;
    assert_eq!(status, 404, "a status branch was written");
    assert!(agent.log_text().contains("certificate"));
}

/// Linnet's open pull requests on Gitea whose branch starts with `prefix`: (number, branch).
async fn pull_requests_from(gitea: &Gitea, prefix: &str) -> Vec<(i64, String)> {
    gitea
        .open_pull_requests(REPO)
        .await
        .iter()
        .filter_map(|pr| {
            let branch = pr.pointer("/head/ref")?.as_str()?;
            branch
                .starts_with(prefix)
                .then(|| (pr["number"].as_i64().unwrap_or(0), branch.to_string()))
        })
        .collect()
}

/// The revert pull requests linnet has open on Gitea.
async fn revert_pull_requests(gitea: &Gitea) -> Vec<(i64, String)> {
    pull_requests_from(gitea, "linnet/revert/").await
}

/// Issue 50: a failed canary opens one revert pull request on Gitea, found again after a
/// `kill -9` (no second one); a person who moves Git on to another image that fails too gets
/// a new pull request and the old one closed; merging it returns the rollout to Stable with no
/// person touching the cluster.
#[tokio::test]
async fn a_failed_canary_opens_one_revert_pull_request_and_merging_it_makes_it_stable() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "gitea-revert").await;
    let tmp = tempfile::tempdir().unwrap();
    let (gitea, ca_file, work) = gitea_with_example(tmp.path(), &ns.name).await;
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "  canaryReplicas: 1\n",
        "  canaryReplicas: 1\n  progressDeadlineSeconds: 10\n  onFailure:\n    revert: pullRequest\n",
    );
    commit_and_push(&work, "redis: revert pull requests on failure");
    let mut args = agent_args(tmp.path(), &gitea, &ca_file);
    args.push("--writeback-interval=500ms".into());
    let start = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("gitea-token"), &gitea.token).unwrap();
        start_agent(&dir, &args, &ns.name)
    };
    let mut first = start("agent-1");
    wait_ready(&first).await;
    gitea
        .add_push_hook(REPO, &format!("{}/hooks/gitea", first.hooks), SECRET)
        .await;
    let redis: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    wait_redis(&redis, "redis Stable on redis:7.2", |o| {
        phase(o) == Some(StatefulSetPhase::Stable) && o.spec.image == "redis:7.2"
    })
    .await;

    // A broken image: never Ready, rolled back at the deadline, and a pull request.
    set_redis_images(&work, "redis:7.2", "redis:broken");
    let (broken, _) = commit_and_push(&work, "redis broken");
    wait_redis(&redis, "redis rolled back", |o| {
        phase(o) == Some(StatefulSetPhase::RolledBack)
    })
    .await;
    let prs = eventually("a revert pull request", Duration::from_secs(60), || async {
        let prs = revert_pull_requests(&gitea).await;
        (!prs.is_empty()).then_some(prs)
    })
    .await;
    assert_eq!(prs.len(), 1, "{prs:?}");
    let (number, branch) = prs[0].clone();
    assert_eq!(
        branch,
        format!("linnet/revert/{}/redis/{}", ns.name, &broken[..12])
    );
    let pr = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/pulls/{number}"),
            None,
        )
        .await;
    assert_eq!(
        pr["title"],
        format!("Revert {}/redis to redis:7.2", ns.name)
    );
    assert_eq!(pr["base"]["ref"], "main");
    let body = pr["body"].as_str().unwrap();
    assert!(
        body.contains("rolled back from redis:broken to redis:7.2"),
        "{body}"
    );
    let proposed = gitea
        .raw_file(REPO, &branch, "apps/redis/redis.yaml")
        .await
        .unwrap();
    assert_eq!(
        proposed.matches("image: redis:7.2").count(),
        2,
        "{proposed}"
    );

    // kill -9, and an agent with an empty cache: the same pull request, no second one.
    first.kill();
    let mut second = start("agent-2");
    wait_ready(&second).await;
    gitea
        .add_push_hook(REPO, &format!("{}/hooks/gitea", second.hooks), SECRET)
        .await;
    // No second pull request, however long the new agent runs.
    support::holds_for(
        "one revert pull request",
        Duration::from_secs(3),
        || async {
            let now = revert_pull_requests(&gitea).await;
            match now == prs {
                true => Ok(()),
                false => Err(format!("{now:?}, was {prs:?}")),
            }
        },
    )
    .await;
    let m = metrics(&second).await;
    assert!(
        metric(
            &m,
            r#"linnet_revert_commits_total{result="pull_request_found"}"#
        ) >= 1.0,
        "{m}"
    );

    // A person moves on to another image, which fails too: its own pull request, and the
    // first one closed (Git no longer asks for redis:broken).
    set_redis_images(&work, "redis:broken", "valkey:broken");
    let (broken_2, _) = commit_and_push(&work, "valkey broken");
    let prs = eventually(
        "the first pull request closed and a second one open",
        Duration::from_secs(90),
        || async {
            let prs = revert_pull_requests(&gitea).await;
            (prs.len() == 1 && prs[0].1.ends_with(&broken_2[..12])).then_some(prs)
        },
    )
    .await;
    let closed = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/pulls/{number}"),
            None,
        )
        .await;
    assert_eq!(closed["state"], "closed", "{closed}");
    assert_eq!(closed["merged"], false, "{closed}");

    // Merged: Git asks for redis:7.2 again and the rollout is Stable, nobody touched the cluster.
    let merge = gitea
        .merge_open_pull_request(REPO, prs[0].0, "Revert redis")
        .await;
    wait_redis(&redis, "redis Stable on redis:7.2 after the merge", |o| {
        phase(o) == Some(StatefulSetPhase::Stable)
            && o.spec.image == "redis:7.2"
            && o.status.as_ref().and_then(|s| s.source_revision.as_deref()) == Some(merge.as_str())
    })
    .await;
    support::eventually(
        "the revert pull request closed",
        Duration::from_secs(30),
        || async { revert_pull_requests(&gitea).await.is_empty().then_some(()) },
    )
    .await;
    second.kill();
}

/// Linnet's open promotion pull requests on Gitea.
async fn promotion_pull_requests(gitea: &Gitea) -> Vec<(i64, String)> {
    pull_requests_from(gitea, "linnet/promote/").await
}

/// Staging's `redis` as production's `redis-prod`.
fn as_production(staging: &str) -> String {
    staging
        .replace("  name: redis\n", "  name: redis-prod\n")
        .replace("serviceName: redis\n", "serviceName: redis-prod\n")
        .replace("app: redis\n", "app: redis-prod\n")
}

/// Waits for staging's canary (`redis`), then pushes its promote annotation.
async fn promote_staging_once_its_canary_runs(api: &Api<CanaryStatefulSet>, work: &Path) {
    eventually("staging's canary", Duration::from_secs(60), || async {
        api.get_opt("redis")
            .await
            .unwrap()
            .filter(|o| phase(o) == Some(StatefulSetPhase::CanaryActive))
    })
    .await;
    support::edit_file(
        work,
        "apps/redis/redis.yaml",
        "  name: redis\n",
        "  name: redis\n  annotations:\n    rollouts.linnet.dev/promote: \"true\"\n",
    );
    commit_and_push(work, "promote staging's redis 7.4");
}

/// Waits for linnet's promotion pull request, and checks there is one.
async fn one_promotion_pull_request(gitea: &Gitea) -> Vec<(i64, String)> {
    let prs = eventually(
        "a promotion pull request",
        Duration::from_secs(60),
        || async {
            let prs = promotion_pull_requests(gitea).await;
            (!prs.is_empty()).then_some(prs)
        },
    )
    .await;
    assert_eq!(prs.len(), 1, "{prs:?}");
    prs
}

/// A web endpoint that answers `{"errors": 0.01}`: the error ratio staging's analysis reads.
async fn error_ratio_endpoint() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = axum::Router::new().route(
        "/errors",
        axum::routing::get(|| async { axum::Json(serde_json::json!({"errors": 0.01})) }),
    );
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

/// An AnalysisTemplate `errors` in `ns`: two measurements of the endpoint's ratio, a second
/// apart, passing below 0.05.
fn errors_template(ns: &str, port: u16) -> String {
    format!(
        "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: AnalysisTemplate\nmetadata:\n  name: errors\n  \
         namespace: {ns}\nspec:\n  metrics:\n  - name: errors\n    interval: 1s\n    count: 2\n    \
         successCondition: result < 0.05\n    provider:\n      web:\n        url: \
         http://127.0.0.1:{port}/errors\n        jsonPath: $.errors\n"
    )
}

/// Issue 50: staging passes, and production gets exactly that image by pull request (one,
/// found again after a `kill -9`); merging it starts production's own canary. Issue 75: the
/// pull request shows staging's analysis, each metric's values, condition and query.
#[tokio::test]
async fn a_staging_rollout_that_passes_opens_a_production_pull_request_and_merging_it_starts_its_canary()
 {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "gitea-promote").await;
    let tmp = tempfile::tempdir().unwrap();
    let (gitea, ca_file, work) = gitea_with_example(tmp.path(), &ns.name).await;
    let port = error_ratio_endpoint().await;
    std::fs::write(
        work.join("apps/redis/analysis.yaml"),
        errors_template(&ns.name, port),
    )
    .unwrap();
    // Production: the same CanaryStatefulSet as `redis-prod` in `production/`.
    let staging = std::fs::read_to_string(work.join("apps/redis/redis.yaml")).unwrap();
    let production = as_production(&staging);
    std::fs::create_dir_all(work.join("production")).unwrap();
    std::fs::write(work.join("production/redis.yaml"), &production).unwrap();
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "  canaryReplicas: 1\n",
        // autoMerge without --promotion-auto-merge: the pull request waits for a person.
        "  canaryReplicas: 1\n  promoteTo:\n    path: production\n    name: redis-prod\n    autoMerge: true\n  \
         analysis:\n    background:\n      templates: [{templateName: errors}]\n",
    );
    git(&work, &["add", "-A"]);
    commit_and_push(&work, "production, promoted to from staging");
    let mut args = agent_args(tmp.path(), &gitea, &ca_file);
    args.push("--writeback-interval=500ms".into());
    let start = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        start_agent(&dir, &args, &ns.name)
    };
    let mut first = start("agent-1");
    wait_ready(&first).await;
    gitea
        .add_push_hook(REPO, &format!("{}/hooks/gitea", first.hooks), SECRET)
        .await;
    let api: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let wait =
        |name: &'static str, what: &'static str, image: &'static str, want: StatefulSetPhase| {
            let api = api.clone();
            async move {
                eventually(what, Duration::from_secs(120), || async {
                    api.get_opt(name).await.unwrap().filter(|o| {
                        phase(o) == Some(want)
                            && o.status.as_ref().and_then(|s| s.stable_image.as_deref())
                                == Some(image)
                    })
                })
                .await
            }
        };
    wait(
        "redis",
        "staging Stable on 7.2",
        "redis:7.2",
        StatefulSetPhase::Stable,
    )
    .await;
    wait(
        "redis-prod",
        "production Stable on 7.2",
        "redis:7.2",
        StatefulSetPhase::Stable,
    )
    .await;
    // Both on 7.2: nothing to promote.
    support::holds_for(
        "no promotion pull request",
        Duration::from_secs(2),
        || async {
            let open = promotion_pull_requests(&gitea).await;
            match open.is_empty() {
                true => Ok(()),
                false => Err(format!("{open:?}")),
            }
        },
    )
    .await;

    // Staging canaries 7.4, its analysis passes, and it is promoted.
    set_redis_images(&work, "redis:7.2", "redis:7.4");
    commit_and_push(&work, "staging: redis 7.4");
    eventually(
        "staging's analysis Successful",
        Duration::from_secs(60),
        || async {
            let o = api.get_opt("redis").await.ok()??;
            let runs = o.status?.analysis;
            runs.iter()
                .any(|r| {
                    r.name == "background" && r.phase == linnet::api::AnalysisPhase::Successful
                })
                .then_some(())
        },
    )
    .await;
    promote_staging_once_its_canary_runs(&api, &work).await;
    wait(
        "redis",
        "staging Stable on 7.4",
        "redis:7.4",
        StatefulSetPhase::Stable,
    )
    .await;

    let prs = one_promotion_pull_request(&gitea).await;
    let (number, branch) = prs[0].clone();
    assert!(
        branch.starts_with(&format!("linnet/promote/{}/redis/", ns.name)),
        "{branch}"
    );
    let pr = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/pulls/{number}"),
            None,
        )
        .await;
    assert_eq!(pr["title"], "Promote redis:7.4 to redis-prod (production)");
    let body = pr["body"].as_str().unwrap();
    assert!(
        body.contains("is Stable on redis:7.4 with no failed analysis"),
        "{body}"
    );
    assert!(body.contains("(it runs redis:7.2 now)"), "{body}");
    // The evidence: the run, the metric's values, its condition and its query.
    for said in [
        "errors: Successful, 2 measurements (2 successful, 0 failed, 0 inconclusive), last 0.01, 0.01",
        "success when result < 0.05",
        &format!("GET http://127.0.0.1:{port}/errors"),
    ] {
        assert!(body.contains(said), "{said:?} in:\n{body}");
    }
    let proposed = gitea
        .raw_file(REPO, &branch, "production/redis.yaml")
        .await
        .unwrap();
    assert_eq!(proposed, production.replace("redis:7.2", "redis:7.4"));
    support::wait_event(&admin, &ns.name, "PromotionPullRequestOpened", 30).await;
    // Production is untouched until the merge.
    let prod = api.get("redis-prod").await.unwrap();
    assert_eq!(prod.spec.image, "redis:7.2");

    // kill -9, and an agent with an empty cache: the same pull request, no second one.
    first.kill();
    let mut second = start("agent-2");
    wait_ready(&second).await;
    gitea
        .add_push_hook(REPO, &format!("{}/hooks/gitea", second.hooks), SECRET)
        .await;
    // No second pull request, however long the new agent runs.
    support::holds_for(
        "one promotion pull request",
        Duration::from_secs(3),
        || async {
            let now = promotion_pull_requests(&gitea).await;
            match now == prs {
                true => Ok(()),
                false => Err(format!("{now:?}, was {prs:?}")),
            }
        },
    )
    .await;

    // A person closes it: another restart does not open it again.
    let pull = format!("/repos/{ADMIN}/{REPO}/pulls/{number}");
    let state = |s: &str| Some(serde_json::json!({"state": s}));
    gitea
        .ok(reqwest::Method::PATCH, &pull, state("closed"))
        .await;
    second.kill();
    let mut third = start("agent-3");
    wait_ready(&third).await;
    gitea
        .add_push_hook(REPO, &format!("{}/hooks/gitea", third.hooks), SECRET)
        .await;
    eventually(
        "the closed pull request declined",
        Duration::from_secs(30),
        || async {
            let m = metrics(&third).await;
            (metric(
                &m,
                r#"linnet_revert_commits_total{result="promotion_pull_request_declined"}"#,
            ) >= 1.0)
                .then_some(())
        },
    )
    .await;
    assert!(promotion_pull_requests(&gitea).await.is_empty());
    gitea.ok(reqwest::Method::PATCH, &pull, state("open")).await;

    // Reopened and merged: production runs its own canary of redis:7.4.
    gitea
        .merge_open_pull_request(REPO, number, "Promote redis 7.4 to production")
        .await;
    eventually(
        "production's canary of 7.4",
        Duration::from_secs(60),
        || async {
            api.get_opt("redis-prod").await.unwrap().filter(|o| {
                phase(o) == Some(StatefulSetPhase::CanaryActive) && o.spec.image == "redis:7.4"
            })
        },
    )
    .await;
    assert!(promotion_pull_requests(&gitea).await.is_empty());
    assert!(
        first
            .log_text()
            .contains("this agent runs without --promotion-auto-merge"),
        "autoMerge without the flag is said"
    );

    // With --promotion-auto-merge, autoMerge merges the next promotion: production's canary
    // of 7.6 starts with no person merging.
    git(&work, &["pull", "-q", "--rebase", "origin", "main"]);
    support::edit_file(
        &work,
        "production/redis.yaml",
        "  name: redis-prod\n",
        "  name: redis-prod\n  annotations:\n    rollouts.linnet.dev/promote: \"true\"\n",
    );
    commit_and_push(&work, "promote production's redis 7.4");
    wait(
        "redis-prod",
        "production Stable on 7.4",
        "redis:7.4",
        StatefulSetPhase::Stable,
    )
    .await;
    third.kill();
    args.push("--promotion-auto-merge=true".into());
    let dir = tmp.path().join("agent-4");
    std::fs::create_dir_all(&dir).unwrap();
    let fourth = start_agent(&dir, &args, &ns.name);
    wait_ready(&fourth).await;
    gitea
        .add_push_hook(REPO, &format!("{}/hooks/gitea", fourth.hooks), SECRET)
        .await;
    set_redis_images(&work, "redis:7.4", "redis:7.6");
    commit_and_push(&work, "staging: redis 7.6");
    eventually(
        "staging's canary of 7.6",
        Duration::from_secs(60),
        || async {
            api.get_opt("redis").await.unwrap().filter(|o| {
                phase(o) == Some(StatefulSetPhase::CanaryActive) && o.spec.image == "redis:7.6"
            })
        },
    )
    .await;
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "rollouts.linnet.dev/promote: \"true\"",
        "rollouts.linnet.dev/promote: redis:7.6",
    );
    commit_and_push(&work, "promote staging's redis 7.6");
    eventually(
        "production's canary of 7.6, merged by linnet",
        Duration::from_secs(90),
        || async {
            api.get_opt("redis-prod").await.unwrap().filter(|o| {
                phase(o) == Some(StatefulSetPhase::CanaryActive) && o.spec.image == "redis:7.6"
            })
        },
    )
    .await;
    let merged = support::wait_event(&admin, &ns.name, "PromotionPullRequestMerged", 30).await;
    assert!(
        merged
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("redis-prod gets redis:7.6"),
        "{:?}",
        merged.note
    );
    assert!(promotion_pull_requests(&gitea).await.is_empty());
    let m = metrics(&fourth).await;
    assert_eq!(
        metric(
            &m,
            r#"linnet_revert_commits_total{result="promotion_pull_request_merged"}"#
        ),
        1.0,
        "{m}"
    );
}

/// Issue 50: the next environment on a branch of its own (`promoteTo.branch`), with config
/// that changed with the image. The pull request goes into that branch and carries the
/// changed keys of the ConfigMap the rollout reads, key by key: a key production set to its
/// own value is kept and named. Merging it gives production's agent (following that branch)
/// its canary of the new image.
#[tokio::test]
async fn a_promotion_to_another_branch_carries_the_config_keys_that_changed_with_the_image() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "gitea-promote-branch").await;
    let prod_ns = TestNamespace::create(&admin, "gitea-promote-prod").await;
    let tmp = tempfile::tempdir().unwrap();
    let (gitea, ca_file, work) = gitea_with_example(tmp.path(), &ns.name).await;
    let config = |name_ns: &str, memory: &str, level: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: redis-config\n  namespace: {name_ns}\ndata:\n  maxmemory: {memory}\n  loglevel: {level}\n"
        )
    };
    let reads_config = |text: &str| {
        text.replace(
            "          ports:\n",
            "          envFrom:\n          - configMapRef:\n              name: redis-config\n          ports:\n",
        )
    };
    // main: staging, which reads redis-config and promotes to production's branch.
    let staging =
        reads_config(&std::fs::read_to_string(work.join("apps/redis/redis.yaml")).unwrap());
    std::fs::write(work.join("apps/redis/redis.yaml"), &staging).unwrap();
    std::fs::write(
        work.join("apps/redis/config.yaml"),
        config(&ns.name, "100mb", "notice"),
    )
    .unwrap();
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "  canaryReplicas: 1\n",
        "  canaryReplicas: 1\n  promoteTo:\n    path: production\n    name: redis-prod\n    branch: production\n",
    );
    git(&work, &["add", "-A"]);
    commit_and_push(&work, "staging reads redis-config");
    // The production branch: only production/, with its own memory size.
    git(&work, &["checkout", "-q", "--orphan", "production"]);
    git(&work, &["rm", "-rqf", "."]);
    std::fs::create_dir_all(work.join("production")).unwrap();
    let production = as_production(&staging)
        .replace(
            &format!("namespace: {}\n", ns.name),
            &format!("namespace: {}\n", prod_ns.name),
        )
        .replace(
            "  promoteTo:\n    path: production\n    name: redis-prod\n    branch: production\n",
            "",
        );
    std::fs::write(work.join("production/redis.yaml"), &production).unwrap();
    let prod_config = config(&prod_ns.name, "4gb", "notice");
    std::fs::write(work.join("production/config.yaml"), &prod_config).unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "production"]);
    git(&work, &["push", "-q", "origin", "HEAD:production"]);
    git(&work, &["checkout", "-q", "main"]);

    let mut args = agent_args(tmp.path(), &gitea, &ca_file);
    args.push("--writeback-interval=500ms".into());
    let dir = tmp.path().join("staging-agent");
    std::fs::create_dir_all(&dir).unwrap();
    let staging_agent = start_agent(&dir, &args, &ns.name);
    wait_ready(&staging_agent).await;
    gitea
        .add_push_hook(
            REPO,
            &format!("{}/hooks/gitea", staging_agent.hooks),
            SECRET,
        )
        .await;
    let api: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let stable_on = |image: &'static str| {
        let api = api.clone();
        async move {
            eventually("staging Stable", Duration::from_secs(120), || async {
                api.get_opt("redis").await.unwrap().filter(|o| {
                    phase(o) == Some(StatefulSetPhase::Stable)
                        && o.status.as_ref().and_then(|s| s.stable_image.as_deref()) == Some(image)
                })
            })
            .await
        }
    };
    stable_on("redis:7.2").await;

    // One commit: the image and the config it reads (a new log level, a bigger memory).
    set_redis_images(&work, "redis:7.2", "redis:7.4");
    std::fs::write(
        work.join("apps/redis/config.yaml"),
        config(&ns.name, "200mb", "verbose"),
    )
    .unwrap();
    git(&work, &["add", "-A"]);
    commit_and_push(&work, "staging: redis 7.4, verbose logs, 200mb");
    promote_staging_once_its_canary_runs(&api, &work).await;
    stable_on("redis:7.4").await;

    let prs = one_promotion_pull_request(&gitea).await;
    let (number, branch) = prs[0].clone();
    let pr = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/pulls/{number}"),
            None,
        )
        .await;
    assert_eq!(pr["base"]["ref"], "production", "{pr}");
    let body = pr["body"].as_str().unwrap();
    assert!(
        body.contains("- ConfigMap redis-config: loglevel\n"),
        "{body}"
    );
    assert!(
        body.contains("- ConfigMap redis-config: maxmemory (kept"),
        "{body}"
    );
    let proposed = gitea
        .raw_file(REPO, &branch, "production/config.yaml")
        .await
        .unwrap();
    assert!(proposed.contains("loglevel: verbose"), "{proposed}");
    assert!(proposed.contains("maxmemory: 4gb"), "{proposed}");
    let proposed = gitea
        .raw_file(REPO, &branch, "production/redis.yaml")
        .await
        .unwrap();
    assert_eq!(proposed, production.replace("redis:7.2", "redis:7.4"));
    // Staging's own branch is untouched by it.
    assert!(
        gitea
            .raw_file(REPO, "main", "production/redis.yaml")
            .await
            .is_none()
    );

    // Production's agent follows its branch: on 7.2, then its canary of 7.4 once merged.
    let mut prod_args = args.clone();
    prod_args.extend([
        "--branch=production".to_string(),
        "--path=production".to_string(),
    ]);
    let dir = tmp.path().join("production-agent");
    std::fs::create_dir_all(&dir).unwrap();
    let production_agent = start_agent(&dir, &prod_args, &prod_ns.name);
    wait_ready(&production_agent).await;
    gitea
        .add_push_hook(
            REPO,
            &format!("{}/hooks/gitea", production_agent.hooks),
            SECRET,
        )
        .await;
    let prod_api: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &prod_ns.name);
    eventually(
        "production Stable on 7.2",
        Duration::from_secs(120),
        || async {
            prod_api.get_opt("redis-prod").await.unwrap().filter(|o| {
                phase(o) == Some(StatefulSetPhase::Stable)
                    && o.status.as_ref().and_then(|s| s.stable_image.as_deref())
                        == Some("redis:7.2")
            })
        },
    )
    .await;
    gitea
        .merge_open_pull_request(REPO, number, "Promote redis 7.4 to production")
        .await;
    eventually(
        "production's canary of 7.4",
        Duration::from_secs(60),
        || async {
            prod_api.get_opt("redis-prod").await.unwrap().filter(|o| {
                phase(o) == Some(StatefulSetPhase::CanaryActive) && o.spec.image == "redis:7.4"
            })
        },
    )
    .await;
    assert!(promotion_pull_requests(&gitea).await.is_empty());
}

/// Gitea's comments on pull request `index`: each one's body.
async fn pull_request_comments(gitea: &Gitea, index: u64) -> Vec<String> {
    let comments = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/issues/{index}/comments"),
            None,
        )
        .await;
    comments
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c["body"].as_str().map(str::to_string))
        .collect()
}

/// Issue 52: a `pullRequest` receiver tells the pull request whose merge started a canary
/// how it goes, through Gitea's API (the commit's pull request, then a comment on it), over
/// HTTPS with the host's token.
#[tokio::test]
async fn the_pull_request_that_started_a_canary_hears_how_it_goes() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "gitea-notify").await;
    let tmp = tempfile::tempdir().unwrap();
    let (gitea, ca_file, work) = gitea_with_example(tmp.path(), &ns.name).await;
    let settings = tmp.path().join("notifications.yaml");
    std::fs::write(
        &settings,
        "receivers:\n- name: pull-request\n  type: pullRequest\n  perMinute: 600\n",
    )
    .unwrap();
    let mut args = agent_args(tmp.path(), &gitea, &ca_file);
    args.push(format!("--notifications-file={}", settings.display()));
    let agent = start_agent(tmp.path(), &args, &ns.name);
    wait_ready(&agent).await;
    let redis: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    wait_redis(&redis, "redis Stable on redis:7.2", |o| {
        phase(o) == Some(StatefulSetPhase::Stable) && o.spec.image == "redis:7.2"
    })
    .await;
    gitea
        .add_push_hook(REPO, &format!("{}/hooks/gitea", agent.hooks), SECRET)
        .await;

    // A pull request moves redis to 7.4; merging it starts the canary.
    git(&work, &["checkout", "-q", "-b", "redis-7.4"]);
    support::edit_file(
        &work,
        "apps/redis/redis.yaml",
        "  image: redis:7.2",
        "  image: redis:7.4",
    );
    git(&work, &["commit", "-qam", "redis 7.4"]);
    git(&work, &["push", "-q", "origin", "redis-7.4"]);
    let merge = gitea
        .merge_pull_request(REPO, "redis-7.4", "main", "redis 7.4")
        .await;
    let pr = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/commits/{merge}/pull"),
            None,
        )
        .await;
    let index = pr["number"].as_u64().unwrap();
    wait_redis(&redis, "redis CanaryActive", |o| {
        phase(o) == Some(StatefulSetPhase::CanaryActive)
    })
    .await;
    let comments = eventually(
        "the canary's start and its wait for approval on the pull request",
        Duration::from_secs(60),
        || {
            let gitea = &gitea;
            async move {
                let c = pull_request_comments(gitea, index).await;
                (c.iter().any(|b| b.contains("linnet: CanaryStarted"))
                    && c.iter().any(|b| b.contains("linnet: AwaitingApproval")))
                .then_some(c)
            }
        },
    )
    .await;
    let started = comments
        .iter()
        .find(|b| b.contains("CanaryStarted"))
        .unwrap();
    assert!(
        started.contains("canary of redis:7.4 started")
            && started.contains(&format!("`CanaryStatefulSet {}/redis`", ns.name)),
        "{started}"
    );
    let waiting = comments
        .iter()
        .find(|b| b.contains("AwaitingApproval"))
        .unwrap();
    assert!(
        waiting.contains("rollouts.linnet.dev/promote"),
        "the comment says what to do: {waiting}"
    );
    assert_eq!(comments.len(), 2, "one comment per event: {comments:?}");
    // Counted once Gitea's answer is back: a moment after the comment shows.
    eventually(
        "both comments counted as sent",
        Duration::from_secs(10),
        || {
            let agent = &agent;
            async move {
                let m = metrics(agent).await;
                let sent = metric(
                    &m,
                    r#"linnet_notifications_total{receiver="pull-request",result="sent"}"#,
                );
                (sent == 2.0).then_some(())
            }
        },
    )
    .await;
}
