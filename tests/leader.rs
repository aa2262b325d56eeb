//! Two agents, one Lease: only the holder acts; the other is not ready and takes over within
//! the lease duration when the holder dies in the middle of a rollout. A leader stopped as
//! Kubernetes stops it releases the Lease, so the next agent acts at once.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ListParams;
use linnet::api::{CanaryStatefulSet, StatefulSetPhase};
use serde_json::json;
use support::agent::wait_ready;
use support::rollout::Fixture;

async fn ready(base: &str) -> bool {
    support::http()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

fn redis(ns: &str) -> serde_json::Value {
    json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryStatefulSet",
        "metadata": {"name": "redis", "namespace": ns,
                     "annotations": {"rollouts.linnet.dev/promote": "redis:7.4"}},
        "spec": {
            "replicas": 3,
            "image": "redis:7.2",
            "template": {
                "serviceName": "redis",
                "selector": {"matchLabels": {"app": "redis"}},
                "template": {
                    "metadata": {"labels": {"app": "redis"}},
                    "spec": {"containers": [{"name": "redis", "image": "redis:7.2"}]}
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
                }]
            }
        }
    })
}

async fn claims(f: &Fixture) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = f
        .api::<PersistentVolumeClaim>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        .map(|c| {
            let k = c
                .metadata
                .name
                .unwrap()
                .rsplit('-')
                .next()
                .unwrap()
                .to_string();
            (k, c.spec.unwrap().volume_name.unwrap())
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn the_standby_takes_over_mid_rollout_and_nothing_is_done_twice() {
    let mut f = Fixture::start("leader", redis).await;
    f.wait_for("Stable", 90, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::Stable)
    })
    .await;
    let before = claims(&f).await;
    assert_eq!(before.len(), 3);

    // A second replica waits for the lease and is not ready, so it gets no webhooks.
    let standby = f.spawn_agent("standby", &["--lease-identity=standby".to_string()]);
    standby
        .wait_for_log(
            "the standby waiting for the lease",
            "waiting to hold the lease",
        )
        .await;
    assert!(!ready(&standby.base).await, "the standby must not be ready");
    assert!(ready(&f.agent.as_ref().unwrap().base).await);

    // Kill the leader in the middle of the canary.
    f.patch_spec(json!({"image": "redis:7.4"}));
    f.wait_for("the canary to be deploying", 90, |r: &CanaryStatefulSet| {
        matches!(
            r.status.as_ref().and_then(|s| s.phase),
            Some(StatefulSetPhase::DeployingCanary | StatefulSetPhase::CanaryActive)
        )
    })
    .await;
    // Regression (CI, 2026-12-03): the leader wrote the new phase, was killed before it
    // published StableScaledDown, and the standby, planning from the new phase, never did.
    // A phase's events are now published before the status that records it.
    let events = f
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for reason in ["CanaryStarted", "StableScaledDown"] {
        assert!(
            events.iter().any(|e| e.reason.as_deref() == Some(reason)),
            "{reason} is not published yet, though its phase is recorded"
        );
    }
    f.kill_agent();
    let killed = Instant::now();
    wait_ready(&standby).await;
    let failover = killed.elapsed();
    println!("failover: {failover:?}");
    assert!(
        failover < Duration::from_secs(4 + 6),
        "failover took {failover:?}"
    );

    // The standby finishes the rollout.
    f.wait_for("promoted by the standby", 120, |r: &CanaryStatefulSet| {
        let s = r.status.clone().unwrap_or_default();
        s.phase == Some(StatefulSetPhase::Stable) && s.stable_image.as_deref() == Some("redis:7.4")
    })
    .await;
    assert_eq!(claims(&f).await, before, "a volume went to another replica");
    // Every phase change happened once: no event was published twice.
    let events = f
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for reason in [
        "CanaryStarted",
        "StableScaledDown",
        "CanaryReady",
        "PromotionStarted",
        "Promoted",
    ] {
        let same: Vec<_> = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect();
        assert_eq!(same.len(), 1, "{reason}: {same:?}");
        assert!(
            same[0].series.is_none(),
            "{reason} was published more than once"
        );
    }
    assert!(standby.log_text().contains("holding the lease"));
}

#[tokio::test]
async fn a_leader_stopped_by_sigterm_releases_its_lease_and_the_next_agent_acts_at_once() {
    // Issue 47: a stopped agent kept its Lease, and the next one waited 13 s for it to expire.
    use k8s_openapi::api::coordination::v1::Lease;
    let mut f = Fixture::start("leader-release", redis).await;
    f.wait_for("Stable", 90, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::Stable)
    })
    .await;
    let lease_name = format!("linnet-{}", f.ns.name);
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    let lease = f.api::<Lease>().get(&lease_name).await.unwrap();
    assert!(holder(lease).is_some(), "the agent holds the lease");

    let mut leader = f.agent.take().unwrap();
    let status = leader.terminate();
    assert!(status.success(), "{status:?}:\n{}", leader.log_text());
    assert!(
        leader.log_text().contains("released the lease"),
        "{}",
        leader.log_text()
    );
    let lease = f.api::<Lease>().get(&lease_name).await.unwrap();
    assert_eq!(
        holder(lease),
        None,
        "the Lease is free once the agent has stopped"
    );

    // The next agent does not wait for the Lease to expire (4 s here, 15 s by default).
    let started = Instant::now();
    let next = f.spawn_agent("next", &["--lease-identity=next".to_string()]);
    wait_ready(&next).await;
    let waited = started.elapsed();
    println!("the next agent was ready after {waited:?}");
    assert!(
        next.log_text().contains("holding the lease"),
        "{}",
        next.log_text()
    );
}
