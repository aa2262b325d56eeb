//! Traces (issue 71): one push, followed end to end through a real OpenTelemetry Collector
//! (built from its Go modules, `tests/otel/`). The webhook's span is the root; the sync it
//! wakes, the fetch, the read and the apply are its descendants; the apply writes the trace
//! context on the rollout, and the rollout's reconcile and the action it takes join the same
//! trace; the rollout's status names the trace.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::Api;
use linnet::api::CanaryStatefulSet;
use support::agent::{start_agent_env, wait_ready};
use support::otel::{Collector, Span};
use support::{TestNamespace, admin_client, eventually, git, install_linnet};

/// The chain of span names from `span` up to its trace's root.
fn ancestry(span: &Span, by_id: &BTreeMap<String, Span>) -> Vec<String> {
    let mut names = vec![span.name.clone()];
    let mut at = span;
    while let Some(parent) = by_id.get(&at.parent_span_id) {
        names.push(parent.name.clone());
        at = parent;
        if names.len() > 32 {
            break;
        }
    }
    names
}

#[tokio::test]
async fn one_push_is_one_trace_from_the_webhook_to_the_rollouts_action() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "traces").await;
    let collector = Collector::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    support::commit_example(&work, &ns.name);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let agent = start_agent_env(
        tmp.path(),
        &[
            format!("--repo-url=file://{}", bare.display()),
            "--path=apps".into(),
            format!("--otlp-endpoint={}", collector.endpoint),
        ],
        &ns.name,
        &support::linnet_kubeconfig(),
        // The SDK's batch is sent every 200 ms, not every 5 s.
        &[("OTEL_BSP_SCHEDULE_DELAY", "200")],
    );
    wait_ready(&agent).await;
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    eventually("redis applied", Duration::from_secs(30), || async {
        rollouts.get_opt("redis").await.unwrap().map(|_| ())
    })
    .await;

    // The push: a new image for redis, announced by a webhook.
    let file = work.join("apps/redis/redis.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("image: redis:7.2", "image: redis:7.4")).unwrap();
    git(&work, &["commit", "-qam", "redis 7.4"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    assert_eq!(agent.push_webhook().await, 202);

    // The webhook's trace, once it reaches an action of the rollout's reconcile.
    let (trace, spans) = eventually(
        "one trace from the webhook to an action",
        Duration::from_secs(60),
        || {
            let spans = collector.spans();
            async move {
                // Spans are exported as they end: an action's may come before the apply and
                // the sync it descends from, which end later. Wait until its chain is whole.
                let by_id: BTreeMap<String, Span> = spans
                    .iter()
                    .map(|s| (s.span_id.clone(), s.clone()))
                    .collect();
                let action = spans.iter().find(|a| {
                    a.name == "action"
                        && ancestry(a, &by_id).last().map(String::as_str) == Some("webhook")
                })?;
                let trace: Vec<Span> = spans
                    .iter()
                    .filter(|s| s.trace_id == action.trace_id)
                    .cloned()
                    .collect();
                Some((action.trace_id.clone(), trace))
            }
        },
    )
    .await;
    let by_id: BTreeMap<String, Span> = spans
        .iter()
        .map(|s| (s.span_id.clone(), s.clone()))
        .collect();
    let chain_of = |name: &str| {
        let span = spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span in the trace: {spans:#?}"));
        ancestry(span, &by_id)
    };
    assert_eq!(chain_of("fetch"), ["fetch", "sync", "webhook"]);
    assert_eq!(chain_of("apply"), ["apply", "sync", "webhook"]);
    let action = ancestry(
        spans
            .iter()
            .find(|a| {
                a.name == "action"
                    && ancestry(a, &by_id).last().map(String::as_str) == Some("webhook")
            })
            .unwrap(),
        &by_id,
    );
    assert_eq!(
        action,
        ["action", "reconcile", "apply", "sync", "webhook"],
        "{spans:#?}"
    );
    let reconcile = spans.iter().find(|s| s.name == "reconcile").unwrap();
    assert!(
        reconcile
            .attributes
            .iter()
            .any(|(k, v)| k == "rollout" && v == &format!("CanaryStatefulSet/{}/redis", ns.name)),
        "{reconcile:?}"
    );
    // The rollout's status names the trace.
    eventually(
        "the trace id in the status",
        Duration::from_secs(30),
        || async {
            let redis = rollouts.get("redis").await.unwrap();
            (redis.status?.trace_id.as_deref() == Some(trace.as_str())).then_some(())
        },
    )
    .await;
    drop(agent);
}
