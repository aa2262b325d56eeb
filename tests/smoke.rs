//! Smoke tests of the local control plane itself: the parts of Kubernetes that linnet relies
//! on really behave like Kubernetes (ordered StatefulSet pods, bound volumes that outlive
//! scale-down, kwok's never-Ready `broken` image, RBAC enforced).
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use support::{TestNamespace, admin_client, eventually, from_json, linnet_client};

const WAIT: Duration = Duration::from_secs(60);

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn stateful_set(name: &str, replicas: i32) -> StatefulSet {
    from_json(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}
            },
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            }]
        }
    }))
}

async fn wait_sts_ready(api: &Api<StatefulSet>, name: &str, replicas: i32) {
    let ready = move |s: Option<&StatefulSet>| {
        s.and_then(|s| s.status.as_ref())
            .is_some_and(|st| st.ready_replicas.unwrap_or(0) == replicas && st.replicas == replicas)
    };
    tokio::time::timeout(WAIT, await_condition(api.clone(), name, ready))
        .await
        .unwrap_or_else(|_| panic!("statefulset {name} never reached {replicas} ready replicas"))
        .unwrap();
}

async fn wait_claims_bound(client: &Client, ns: &str, expected: &[&str]) {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    eventually("claims to be Bound", WAIT, || {
        let pvcs = pvcs.clone();
        let expected = expected.clone();
        async move {
            let list = pvcs.list(&ListParams::default()).await.ok()?;
            let bound: BTreeSet<String> = list
                .items
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .filter_map(|c| c.metadata.name.clone())
                .collect();
            (bound == expected).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn statefulset_pods_come_up_one_ordinal_at_a_time_with_bound_claims() {
    let client = admin_client().await;
    let ns = TestNamespace::create(&client, "sts-order").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    // Record pod events in the order the API server saw them, from before the set exists.
    let (listed, is_listed) = tokio::sync::oneshot::channel::<()>();
    let mut listed = Some(listed);
    let events = watcher(pods.clone(), watcher::Config::default().labels("app=db"))
        .inspect_ok(move |e| {
            if matches!(e, watcher::Event::InitDone)
                && let Some(listed) = listed.take()
            {
                let _ = listed.send(());
            }
        })
        .applied_objects();
    let recorder = tokio::spawn(async move {
        let mut seen: Vec<(String, bool)> = Vec::new();
        let mut events = Box::pin(events);
        while let Ok(Some(pod)) = events.try_next().await {
            let name = pod.metadata.name.clone().unwrap_or_default();
            seen.push((name, pod_ready(&pod)));
            let ready: BTreeSet<&str> = seen.iter().filter(|e| e.1).map(|e| e.0.as_str()).collect();
            if ready.len() == 3 {
                break;
            }
        }
        seen
    });
    // The watch has its first list before the set is created.
    tokio::time::timeout(WAIT, is_listed)
        .await
        .unwrap()
        .unwrap();

    sets.create(&PostParams::default(), &stateful_set("db", 3))
        .await
        .unwrap();
    wait_sts_ready(&sets, "db", 3).await;
    let seen = tokio::time::timeout(WAIT, recorder).await.unwrap().unwrap();

    // OrderedReady: pod k appears only after pod k-1 is Ready.
    for k in 1..3 {
        let first_seen = seen
            .iter()
            .position(|(n, _)| n == &format!("db-{k}"))
            .unwrap_or_else(|| panic!("db-{k} never seen: {seen:?}"));
        let prev_ready = seen
            .iter()
            .position(|(n, r)| n == &format!("db-{}", k - 1) && *r)
            .unwrap_or_else(|| panic!("db-{} never Ready: {seen:?}", k - 1));
        assert!(
            prev_ready < first_seen,
            "db-{k} appeared before db-{} was Ready: {seen:?}",
            k - 1
        );
    }
    wait_claims_bound(&client, &ns.name, &["data-db-0", "data-db-1", "data-db-2"]).await;
}

#[tokio::test]
async fn scaled_down_statefulset_keeps_the_claim_of_the_removed_pod() {
    let client = admin_client().await;
    let ns = TestNamespace::create(&client, "sts-scale").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    sets.create(&PostParams::default(), &stateful_set("db", 3))
        .await
        .unwrap();
    wait_sts_ready(&sets, "db", 3).await;
    wait_claims_bound(&client, &ns.name, &["data-db-0", "data-db-1", "data-db-2"]).await;
    let claim_before = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .get("data-db-2")
        .await
        .unwrap();
    let pod2_uid = pods.get("db-2").await.unwrap().metadata.uid.unwrap();

    sets.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 2}})),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        WAIT,
        await_condition(pods.clone(), "db-2", conditions::is_deleted(&pod2_uid)),
    )
    .await
    .expect("pod db-2 was not removed after scaling to 2")
    .unwrap();
    wait_sts_ready(&sets, "db", 2).await;

    // The claim of the removed replica is untouched: same object, still Bound to the same PV.
    wait_claims_bound(&client, &ns.name, &["data-db-0", "data-db-1", "data-db-2"]).await;
    let claim_after = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .get("data-db-2")
        .await
        .unwrap();
    assert_eq!(claim_before.metadata.uid, claim_after.metadata.uid);
    let volume = |c: &PersistentVolumeClaim| c.spec.as_ref().and_then(|s| s.volume_name.clone());
    assert!(volume(&claim_after).is_some());
    assert_eq!(volume(&claim_before), volume(&claim_after));
}

#[tokio::test]
async fn pod_with_broken_image_tag_runs_but_never_becomes_ready() {
    let client = admin_client().await;
    let ns = TestNamespace::create(&client, "broken").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod = |name: &str, image: &str| -> Pod {
        from_json(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": image}]}
        }))
    };
    pods.create(
        &PostParams::default(),
        &pod("good", "registry.example/app:1"),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &pod("bad", "registry.example/app:broken"),
    )
    .await
    .unwrap();

    // The same node makes an ordinary pod Ready, so the difference is the image tag alone.
    tokio::time::timeout(
        WAIT,
        await_condition(pods.clone(), "good", |p: Option<&Pod>| {
            p.is_some_and(pod_ready)
        }),
    )
    .await
    .expect("a pod with an ordinary image did not become Ready")
    .unwrap();
    let running = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Running")
    };
    tokio::time::timeout(WAIT, await_condition(pods.clone(), "bad", running))
        .await
        .expect("the broken pod was never started")
        .unwrap();

    // Watch it for a while: it must never turn Ready.
    let became_ready = tokio::time::timeout(
        Duration::from_secs(5),
        await_condition(pods.clone(), "bad", |p: Option<&Pod>| {
            p.is_some_and(pod_ready)
        }),
    )
    .await;
    assert!(
        became_ready.is_err(),
        "a pod with image tag `broken` became Ready"
    );
    let bad = pods.get("bad").await.unwrap();
    assert!(!pod_ready(&bad));
}

#[tokio::test]
async fn rbac_is_enforced_for_the_non_admin_identity() {
    let admin = admin_client().await;
    let linnet = linnet_client().await;

    // The admin may read secrets in kube-system...
    Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .list(&ListParams::default())
        .await
        .expect("admin can list secrets");
    // ...and linnet, with no RBAC granted, may not.
    match Api::<Secret>::namespaced(linnet, "kube-system")
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "expected Forbidden, got {status:?}")
        }
        other => panic!("expected 403 Forbidden for user linnet, got {other:?}"),
    }
}

#[tokio::test]
async fn api_server_reports_the_real_kubernetes_release() {
    let client = admin_client().await;
    let info = client.apiserver_version().await.unwrap();
    assert_eq!(info.major, "1");
    // Keep in step with K8S_VERSION in tests/cluster/env.sh and k8s-openapi's v1_36 feature.
    assert_eq!(info.minor, "36");
    assert!(
        info.git_version.starts_with("v1.36."),
        "unexpected version {info:?}"
    );
}
