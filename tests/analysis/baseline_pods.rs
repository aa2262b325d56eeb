//! Issue 75: baseline pods (`strategy.baseline`) on the control plane. A batched
//! CanaryDeployment runs `web-baseline` on the stable image beside the batch's new pods, as
//! many; its gate measures the baseline through `{{ rollout.baselineSelector }}` and the
//! canary through `{{ rollout.canarySelector }}`; once the rollout completes the baseline is
//! gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use linnet::api::{AnalysisPhase, CanaryDeployment};
use serde_json::json;

use super::support::rollout::Fixture;
use super::{completed_on, first_gate_metric_once_completed, support, template, web};

/// Serves `/errors?selector=S`: 0.5 % errors (±10 %) for the baseline's pods, 0.55 % for any
/// other selector; keeps every selector asked about.
async fn errors_by_selector(asked: Arc<Mutex<Vec<String>>>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let answer = move |uri: axum::http::Uri| {
        let (asked, served) = (asked.clone(), served.clone());
        async move {
            let query: HashMap<String, String> = reqwest::Url::parse(&format!("http://x{uri}"))
                .map(|u| u.query_pairs().into_owned().collect())
                .unwrap_or_default();
            let selector = query.get("selector").cloned().unwrap_or_default();
            let baseline = selector.ends_with("rollouts.linnet.dev/version=baseline");
            // Each side its own count, so both see the same wobble.
            let n = served[usize::from(baseline)].fetch_add(1, Ordering::Relaxed);
            let wobble = 1.0 + ((n * 37) % 21) as f64 / 100.0 - 0.1;
            let center = if baseline { 0.005 } else { 0.0055 };
            asked.lock().unwrap().push(selector);
            axum::Json(json!(center * wobble))
        }
    };
    let router = axum::Router::new().route("/errors", axum::routing::get(answer));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

fn image_of(d: &Deployment) -> Option<String> {
    d.spec.as_ref()?.template.spec.as_ref()?.containers[0]
        .image
        .clone()
}

#[tokio::test]
async fn baseline_pods_start_with_the_canary_and_the_gate_judges_against_them() {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let port = errors_by_selector(asked.clone()).await;
    let patch = json!({"pause": "None", "strategy": {"type": "Batches", "baseline": true},
        "analysis": {"gates": [{"after": 1, "templates": [{"templateName": "judged"}]}]}});
    let mut f = Fixture::start("an-baseline", |ns| web(ns, patch)).await;
    let ns = f.ns.name.clone();
    let url = |selector: &str| {
        format!("http://127.0.0.1:{port}/errors?selector={{{{ rollout.{selector} }}}}")
    };
    let judged = template(
        &ns,
        "judged",
        json!({"name": "error-rate", "interval": "1s", "count": 10,
            "provider": {"web": {"url": url("canarySelector")}},
            "baseline": {"provider": {"web": {"url": url("baselineSelector")}},
                "worse": "Higher", "tolerancePercent": 25, "minSamples": 10}}),
    );
    f.write_file("templates.yaml", &[judged]);
    f.wait_for("Completed on nginx:1.27", 120, |d: &CanaryDeployment| {
        completed_on(d, "nginx:1.27")
    })
    .await;
    let deployments = f.api::<Deployment>();
    assert!(
        deployments.get_opt("web-baseline").await.unwrap().is_none(),
        "a baseline at rest"
    );

    f.patch_spec(json!({"image": "nginx:1.28"}));
    // Batch 1: the baseline on the stable image, as many replicas as the new version.
    let (baseline, canary) = support::eventually(
        "web-baseline beside batch 1's new version",
        Duration::from_secs(60),
        || {
            let deployments = deployments.clone();
            async move {
                let all = deployments.list(&Default::default()).await.ok()?;
                let baseline = all
                    .items
                    .iter()
                    .find(|d| d.metadata.name.as_deref() == Some("web-baseline"))?
                    .clone();
                let canary = all
                    .items
                    .into_iter()
                    .find(|d| image_of(d).as_deref() == Some("nginx:1.28"))?;
                Some((baseline, canary))
            }
        },
    )
    .await;
    assert_eq!(image_of(&baseline).as_deref(), Some("nginx:1.27"));
    let replicas = |d: &Deployment| d.spec.as_ref().and_then(|s| s.replicas);
    assert_eq!(replicas(&baseline), replicas(&canary));
    let pod_labels = baseline
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert_eq!(
        pod_labels
            .get("rollouts.linnet.dev/version")
            .map(String::as_str),
        Some("baseline")
    );
    assert_eq!(pod_labels.get("app").map(String::as_str), Some("web"));

    let metric = first_gate_metric_once_completed(&f, "nginx:1.28").await;
    assert_eq!(metric.phase, AnalysisPhase::Successful, "{metric:#?}");
    let asked = asked.lock().unwrap().clone();
    assert!(
        asked
            .iter()
            .any(|s| s == "rollouts.linnet.dev/rollout=web,rollouts.linnet.dev/version=baseline"),
        "{asked:?}"
    );
    let canary_version = canary
        .metadata
        .name
        .as_deref()
        .unwrap()
        .trim_start_matches("web-")
        .to_string();
    assert!(
        asked.iter().any(|s| s.ends_with(&canary_version)),
        "{canary_version} {asked:?}"
    );
    support::eventually("web-baseline deleted", Duration::from_secs(30), || {
        let deployments = deployments.clone();
        async move {
            deployments
                .get_opt("web-baseline")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
}
