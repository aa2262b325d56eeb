//! Revert commits (issue 50, `onFailure.revert: commit`) end to end: a real bare repository,
//! the agent binary and the real control plane. A canary that is rolled back gets one commit
//! on the followed branch that puts the good image back, the rollout is Stable again once it
//! is synced with no person touching the cluster, and an agent killed and started again makes
//! no second commit.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use linnet::api::{CanaryStatefulSet, StatefulSetPhase};
use support::agent::{start_writing_agent, wait_ready};
use support::{TestNamespace, admin_client, git, install_linnet};

fn redis_file(work: &Path) -> std::path::PathBuf {
    work.join("apps/redis/redis.yaml")
}

fn edit(work: &Path, message: &str, change: impl FnOnce(String) -> String) {
    let file = redis_file(work);
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, change(text)).unwrap();
    git(work, &["commit", "-qam", message]);
    git(work, &["push", "-q", "origin", "HEAD:main"]);
}

async fn wait_redis(
    admin: &kube::Client,
    ns: &str,
    what: &str,
    done: impl Fn(&CanaryStatefulSet) -> bool,
) -> CanaryStatefulSet {
    let api = kube::Api::<CanaryStatefulSet>::namespaced(admin.clone(), ns);
    support::eventually(what, Duration::from_secs(120), || async {
        api.get_opt("redis").await.unwrap().filter(|r| done(r))
    })
    .await
}

fn phase(r: &CanaryStatefulSet) -> Option<StatefulSetPhase> {
    r.status.as_ref().and_then(|s| s.phase)
}

/// Linnet's commits on `main`, newest first: (subject, body).
fn linnet_commits(bare: &Path) -> Vec<String> {
    git(bare, &["log", "--format=%an|%s", "main"])
        .lines()
        .filter_map(|l| l.strip_prefix("linnet|").map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_rolled_back_canary_gets_one_revert_commit_and_is_stable_again_across_a_kill_9() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "revert").await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    support::commit_example(&work, &ns.name);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    edit(&work, "redis: revert on failure", |t| {
        t.replacen(
            "  canaryReplicas: 1\n",
            "  canaryReplicas: 1\n  onFailure:\n    revert: commit\n",
            1,
        )
    });
    let mut first = start_writing_agent(&tmp.path().join("agent-1"), &bare, &ns.name);
    wait_ready(&first).await;
    wait_redis(&admin, &ns.name, "redis Stable on 7.2", |r| {
        phase(r) == Some(StatefulSetPhase::Stable)
    })
    .await;

    // The image (in spec.image and the template's container) moves to 7.4: a canary.
    edit(&work, "redis 7.4", |t| t.replace("redis:7.2", "redis:7.4"));
    assert_eq!(first.push_webhook().await, 202);
    wait_redis(&admin, &ns.name, "redis CanaryActive on 7.4", |r| {
        phase(r) == Some(StatefulSetPhase::CanaryActive)
    })
    .await;

    // Aborted from Git: rolled back, and Git gets the revert.
    edit(&work, "abort redis 7.4", |t| {
        t.replacen(
            "  name: redis\n",
            "  name: redis\n  annotations:\n    rollouts.linnet.dev/abort: \"true\"\n",
            1,
        )
    });
    assert_eq!(first.push_webhook().await, 202);
    wait_redis(&admin, &ns.name, "redis RolledBack", |r| {
        phase(r) == Some(StatefulSetPhase::RolledBack)
    })
    .await;
    let subject = support::eventually("a revert commit on main", Duration::from_secs(60), || {
        let commits = linnet_commits(&bare);
        async move { commits.into_iter().next() }
    })
    .await;
    assert_eq!(
        subject,
        format!("linnet: revert {}/redis to redis:7.2", ns.name)
    );
    let reverted = support::show_on(&bare, "main", "apps/redis/redis.yaml").unwrap();
    assert_eq!(
        reverted.matches("image: redis:7.2").count(),
        2,
        "{reverted}"
    );
    assert!(!reverted.contains("redis:7.4"), "{reverted}");
    // Only the images changed: the person's annotation and every other line stay.
    let before = git(&bare, &["show", "main~1:apps/redis/redis.yaml"]);
    assert_eq!(
        reverted.trim_end(),
        before.replace("redis:7.4", "redis:7.2").trim_end()
    );
    let body = git(&bare, &["log", "-1", "--format=%b", "main"]);
    assert!(body.contains("rolled back from redis:7.4"), "{body}");
    // `kubectl describe` says so too.
    let event = support::wait_event(&admin, &ns.name, "RevertCommitted", 30).await;
    assert_eq!(
        event.regarding.and_then(|r| r.name).as_deref(),
        Some("redis")
    );
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("committed redis:7.2 back to apps/redis/redis.yaml"),
        "{:?}",
        event.note
    );

    // The Git host's webhook for linnet's own push: synced, Stable, no person involved.
    assert_eq!(first.push_webhook().await, 202);
    wait_redis(&admin, &ns.name, "redis Stable on 7.2 again", |r| {
        phase(r) == Some(StatefulSetPhase::Stable)
            && r.status.as_ref().and_then(|s| s.stable_image.as_deref()) == Some("redis:7.2")
    })
    .await;

    // kill -9 and a new agent with an empty cache: the revert is not made again.
    first.kill();
    let second = start_writing_agent(&tmp.path().join("agent-2"), &bare, &ns.name);
    wait_ready(&second).await;
    support::holds_for("one revert commit", Duration::from_secs(3), || {
        let commits = linnet_commits(&bare);
        async move {
            match commits.len() {
                1 => Ok(()),
                _ => Err(format!("{commits:?}")),
            }
        }
    })
    .await;
    let metrics = second.metrics().await;
    assert!(
        !metrics.contains(r#"linnet_revert_commits_total{result="committed"}"#),
        "{metrics}"
    );
}
