//! Issue 73, the fleet against a real Git host: three local control planes, one Gitea
//! repository over HTTPS (its own push webhooks wake every agent), three agents, each
//! following its cluster's Kustomize overlay of one shared base (Flux's layout), so an image
//! set once in the base moves through the waves.
//! - Two pushes in a row: the second image overtakes the first in the first wave, and the
//!   later waves take only the second, each after the wave before it baked it.
//! - A manual gate by pull request: the last wave starts once a pull request that approves
//!   the image in the Fleet is merged.
//! - Git unreachable for one cluster (its agent's connections to Gitea hang): the next wave
//!   holds and names it as not reporting; once Git answers again it catches up.
//! - A wave's analysis (run in the second wave's cluster only) fails: that cluster rolls back
//!   and opens the revert pull request, which edits the shared base (`onFailure: revert`),
//!   and the last wave never starts the image; merging the pull request puts the first wave
//!   back too. A restarted agent of another cluster leaves that pull request open.
//! - Each overlay sets the image itself, and the image fails in the second wave: that cluster
//!   reverts its own overlay, and the first wave's agent, which completed the image, opens a
//!   pull request of its own that puts its overlay back (the Fleet's `onFailure: revert`).
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use linnet::api::{CanaryDeployment, DeploymentPhase};
use serde_json::json;
use support::agent::{Agent, SECRET, start_agent_env, wait_ready};
use support::fleet::{
    Member, completed_on, completed_since, message, push, start_clusters, three_members, web_of,
};
use support::gitea::{ADMIN, Gitea};
use support::stall::{Mode, StallProxy};
use support::tls::TestCa;
use support::{eventually, git, holds_for};

const REPO: &str = "fleet";

fn fleet_yaml(approved: &[&str]) -> String {
    let mut f = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: Fleet
metadata:
  name: shop
spec:
  waves:
  - name: canary
    clusters: [eu-1]
    bakeSeconds: 5
  - name: europe
    clusters: [eu-2]
    bakeSeconds: 5
    analysis:
      templates: [{templateName: wave-health}]
  - name: rest
    matchLabels: {}
    approval: manual
  reportDeadlineSeconds: 8
  onFailure: revert
"
    .to_string();
    if !approved.is_empty() {
        f += "  approvals:\n";
        for image in approved {
            f += &format!("  - {{wave: rest, image: '{image}'}}\n");
        }
    }
    f
}

fn web(ns: &str, image: &str) -> String {
    let spec = support::rollout::batched_web(
        ns,
        json!({"image": image, "pause": "None", "rollbackOnFailure": true,
               "progressDeadlineSeconds": 30, "replicas": 2,
               "onFailure": {"revert": "pullRequest"}}),
    );
    serde_saphyr::to_string(&spec).unwrap()
}

/// The wave's analysis: the test's web endpoint, which answers `ok` as the test sets it.
fn wave_health(ns: &str, port: u16) -> String {
    let t = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": "wave-health", "namespace": ns},
        "spec": {"metrics": [{"name": "health", "successCondition": "result == true",
            "count": 2, "interval": "1s",
            "provider": {"web": {"url": format!("http://127.0.0.1:{port}/health"),
                                 "jsonPath": "$.data.ok"}}}]}
    });
    serde_saphyr::to_string(&t).unwrap()
}

/// `m`'s agent, following the repository at `url` (Gitea, or a proxy in front of it).
fn start(m: &Member, url: &str, gitea: &Gitea, ca_file: &Path, ns: &str) -> Agent {
    std::fs::create_dir_all(&m.dir).unwrap();
    let token_file = m.dir.join("gitea-token");
    std::fs::write(&token_file, &gitea.token).unwrap();
    let args = vec![
        format!("--repo-url={url}/{ADMIN}/{REPO}.git"),
        format!("--git-username={ADMIN}"),
        format!("--git-password-file={}", token_file.display()),
        "--commit-status-provider=gitea".into(),
        format!("--commit-status-api-url={}/api/v1", gitea.base),
        format!("--commit-status-repo={ADMIN}/{REPO}"),
        format!("--commit-status-token-file={}", token_file.display()),
        format!("--ca-file={}", ca_file.display()),
        // Its own overlay of the shared base, as in Flux's layout.
        format!("--path=clusters/{}", m.name),
        "--fleet=fleet.yaml".into(),
        format!("--cluster={}", m.name),
        format!("--cluster-label={}", m.labels),
        "--writeback-interval=300ms".into(),
        // A cluster cut off from Git tries again soon after Git answers.
        "--poll-interval=3s".into(),
        "--git-timeout=3s".into(),
    ];
    let render = support::render_env();
    let env: Vec<(&str, &str)> = render
        .iter()
        .map(|(k, v)| (*k, v.to_str().unwrap()))
        .collect();
    start_agent_env(&m.dir, &args, ns, &m.kubeconfig, &env)
}

/// Every image `web` ran as stable or canary in `m`'s cluster, sampled until the test ends.
fn record_images(m: &Member, ns: &str, seen: Arc<Mutex<BTreeSet<String>>>) {
    let (client, ns) = (m.client.clone(), ns.to_string());
    tokio::spawn(async move {
        let api = kube::Api::<CanaryDeployment>::namespaced(client, &ns);
        loop {
            if let Ok(Some(d)) = api.get_opt("web").await
                && let Some(s) = d.status
            {
                let mut seen = seen.lock().unwrap();
                seen.extend(s.stable_image);
                seen.extend(s.canary_image);
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
}

async fn open_pull_requests(gitea: &Gitea) -> Vec<(i64, String)> {
    let prs = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/pulls?state=open"),
            None,
        )
        .await;
    prs.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["number"].as_i64().unwrap(),
                p["head"]["ref"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_gitea_takes_two_pushes_a_pull_request_gate_a_cut_off_cluster_and_a_failed_wave_analysis()
 {
    let extra = start_clusters(&["gb", "gc"], 23880);
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "fleet-git").await;
    let tmp = tempfile::tempdir().unwrap();
    let fleet = three_members(&extra, &ns.name, tmp.path()).await;
    let health_ok = Arc::new(AtomicBool::new(true));
    let health_port = support::web_gate(health_ok.clone()).await;

    std::fs::create_dir_all(tmp.path().join("gitea")).unwrap();
    let ca = TestCa::new("linnet fleet CA");
    let ca_file = ca.write(tmp.path(), "ca.pem");
    let gitea = Gitea::start(&tmp.path().join("gitea"), &ca).await;
    gitea.create_repo(REPO).await;
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    git(
        &work,
        &["config", "http.sslCAInfo", ca_file.to_str().unwrap()],
    );
    git(
        &work,
        &["remote", "add", "origin", &gitea.authed_clone_url(REPO)],
    );
    push_first(&work, &ns.name, health_port);

    // eu-2 reaches Gitea through a proxy the test can make hang.
    let gitea_addr = gitea.base.trim_start_matches("https://").parse().unwrap();
    let proxy = StallProxy::start(gitea_addr);
    let eu2_url = format!("https://{}", proxy.addr);
    let urls = [gitea.base.clone(), eu2_url, gitea.base.clone()];
    let mut agents: Vec<Agent> = fleet
        .iter()
        .zip(&urls)
        .map(|(m, url)| start(m, url, &gitea, &ca_file, &ns.name))
        .collect();
    for a in &agents {
        wait_ready(a).await;
        gitea
            .add_push_hook(REPO, &format!("{}/hooks/gitea", a.hooks), SECRET)
            .await;
    }
    for m in &fleet {
        completed_since(m, &ns.name, "web:1", 120).await;
    }
    // Each cluster renders its own overlay.
    let replicas = web_of(&fleet[2], &ns.name).await.unwrap().spec.replicas;
    assert_eq!(replicas, 3, "us-1's overlay sets 3 replicas");
    let seen: Vec<Arc<Mutex<BTreeSet<String>>>> = fleet
        .iter()
        .map(|m| {
            let s = Arc::new(Mutex::new(BTreeSet::new()));
            record_images(m, &ns.name, s.clone());
            s
        })
        .collect();

    // 1. Two pushes in a row: web:3 follows web:2 while eu-1 bakes web:2.
    push(
        &work,
        &[("base/web.yaml", &web(&ns.name, "web:2"))],
        "web:2",
    );
    completed_since(&fleet[0], &ns.name, "web:2", 60).await;
    push(
        &work,
        &[("base/web.yaml", &web(&ns.name, "web:3"))],
        "web:3",
    );
    let eu1_done = completed_since(&fleet[0], &ns.name, "web:3", 60).await;
    let eu2_done = completed_since(&fleet[1], &ns.name, "web:3", 60).await;
    let after = eu2_done.duration_since(eu1_done);
    assert!(
        after >= jiff::SignedDuration::from_secs(5),
        "eu-2 finished web:3 {after:?} after eu-1: it skipped eu-1's bake"
    );
    // eu-2 ran its wave's analysis on web:3, and it passed.
    let runs = web_of(&fleet[1], &ns.name)
        .await
        .unwrap()
        .status
        .unwrap()
        .analysis;
    assert!(
        runs.iter()
            .any(|r| r.name == "after-2" && r.phase == linnet::api::AnalysisPhase::Successful),
        "eu-2's wave analysis: {runs:?}"
    );

    // 2. The last wave is manual: it waits for a merged pull request approving web:3.
    eventually(
        "us-1 awaiting its approval",
        Duration::from_secs(30),
        || async {
            message(&fleet[2], &ns.name)
                .await
                .contains("waits for an approval of web:3")
                .then_some(())
        },
    )
    .await;
    git(&work, &["checkout", "-q", "-b", "approve-web-3"]);
    std::fs::write(work.join("fleet.yaml"), fleet_yaml(&["web:3"])).unwrap();
    git(&work, &["commit", "-qam", "Approve web:3 for the rest"]);
    git(&work, &["push", "-q", "origin", "approve-web-3"]);
    git(&work, &["checkout", "-q", "main"]);
    gitea
        .merge_pull_request(REPO, "approve-web-3", "main", "Approve web:3 for the rest")
        .await;
    git(&work, &["pull", "-q", "origin", "main"]);
    completed_since(&fleet[2], &ns.name, "web:3", 60).await;
    for (m, s) in fleet.iter().zip(&seen).skip(1) {
        let s = s.lock().unwrap();
        assert!(
            !s.contains("web:2"),
            "{} ran web:2, which web:3 overtook: {s:?}",
            m.name
        );
    }

    // 3. eu-2 cannot reach Git: its wave is named as not reporting, and the next waits.
    proxy.set(Mode::StallAll);
    push(
        &work,
        &[
            ("base/web.yaml", &web(&ns.name, "web:4")),
            ("fleet.yaml", &fleet_yaml(&["web:3", "web:4", "web:5"])),
        ],
        "web:4",
    );
    completed_since(&fleet[0], &ns.name, "web:4", 60).await;
    eventually(
        "us-1 naming eu-2 as not reporting",
        Duration::from_secs(40),
        || async {
            let said = message(&fleet[2], &ns.name).await;
            said.contains("eu-2 (europe: last Completed on web:3): not reported within 8s")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        completed_on(&fleet[1], &ns.name).await.as_deref(),
        Some("web:3")
    );
    assert_eq!(
        completed_on(&fleet[2], &ns.name).await.as_deref(),
        Some("web:3")
    );
    // Git answers again: eu-2 catches up at its next poll, then us-1 after eu-2's bake.
    proxy.set(Mode::Forward);
    let eu2_done = completed_since(&fleet[1], &ns.name, "web:4", 60).await;
    let us1_done = completed_since(&fleet[2], &ns.name, "web:4", 60).await;
    assert!(us1_done.duration_since(eu2_done) >= jiff::SignedDuration::from_secs(5));

    // 4. web:5 passes eu-1 (no wave analysis there) and fails eu-2's: eu-2 rolls back and
    //    opens the revert pull request; us-1 never starts web:5 (approved ahead).
    health_ok.store(false, Ordering::Relaxed);
    push(
        &work,
        &[("base/web.yaml", &web(&ns.name, "web:5"))],
        "web:5",
    );
    completed_since(&fleet[0], &ns.name, "web:5", 60).await;
    let runs = eventually("eu-2 rolled back", Duration::from_secs(60), || async {
        let s = web_of(&fleet[1], &ns.name).await?.status?;
        (s.phase == Some(DeploymentPhase::RolledBack)).then_some(s.analysis)
    })
    .await;
    assert!(
        runs.iter()
            .any(|r| r.name == "after-2" && r.phase == linnet::api::AnalysisPhase::Failed),
        "eu-2 rolled back by its wave's analysis: {runs:?}"
    );
    let revert = eventually(
        "the revert pull request",
        Duration::from_secs(60),
        || async {
            open_pull_requests(&gitea)
                .await
                .into_iter()
                .find(|(_, head)| head.starts_with("linnet/revert/"))
        },
    )
    .await;
    holds_for(
        "web:5 started nowhere after eu-2",
        Duration::from_secs(8),
        || async {
            match completed_on(&fleet[2], &ns.name).await.as_deref() {
                Some("web:4") => Ok(()),
                other => Err(format!("us-1 Completed on {other:?}")),
            }
        },
    )
    .await;
    let said = message(&fleet[2], &ns.name).await;
    assert!(
        said.contains("web:5 failed in cluster eu-2"),
        "us-1: {said}"
    );
    assert!(!seen[2].lock().unwrap().contains("web:5"));
    // The image is set in the base every overlay shares (onFailure: revert lets the revert
    // edit it): one pull request puts every wave back on web:4.
    let files = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/pulls/{}/files", revert.0),
            None,
        )
        .await;
    assert_eq!(files[0]["filename"], "base/web.yaml", "{files}");
    assert!(revert.1.starts_with("linnet/revert/@eu-2/"), "{}", revert.1);
    // Regression: a restarted agent looks once for its rollout's revert pull requests that Git
    // no longer needs, and closed eu-2's too (one branch prefix for every cluster).
    agents[0].kill();
    agents[0] = start(&fleet[0], &urls[0], &gitea, &ca_file, &ns.name);
    eventually(
        "eu-1's look for its own revert pull requests",
        Duration::from_secs(60),
        || {
            let looked = agents[0]
                .log_text()
                .contains("looked for revert pull requests Git no longer needs");
            async move { looked.then_some(()) }
        },
    )
    .await;
    let open = open_pull_requests(&gitea).await;
    assert!(
        open.iter().any(|(n, _)| *n == revert.0),
        "eu-2's closed: {open:?}"
    );
    gitea
        .merge_open_pull_request(REPO, revert.0, "Revert web:5")
        .await;
    completed_since(&fleet[0], &ns.name, "web:4", 60).await;

    // 5. Each overlay sets the image itself: web:6 passes eu-1 and fails eu-2's analysis.
    //    eu-2 reverts its own overlay, and eu-1, which completed web:6, opens a pull request
    //    of its own that puts web:4 back in its overlay (the Fleet's onFailure: revert).
    let overlay_at = |tag: &str| format!("{OVERLAY}images:\n- name: web\n  newTag: \"{tag}\"\n");
    let us1_overlay = format!("{}{US_REPLICAS}", overlay_at("6"));
    push(
        &work,
        &[
            ("clusters/eu-1/kustomization.yaml", &overlay_at("6")),
            ("clusters/eu-2/kustomization.yaml", &overlay_at("6")),
            ("clusters/us-1/kustomization.yaml", &us1_overlay),
        ],
        "web:6 in every overlay",
    );
    completed_since(&fleet[0], &ns.name, "web:6", 60).await;
    eventually(
        "eu-2 rolled back from web:6",
        Duration::from_secs(60),
        || async {
            let s = web_of(&fleet[1], &ns.name).await?.status?;
            let from = s.rollback.map(|r| r.from_image);
            (s.phase == Some(DeploymentPhase::RolledBack) && from.as_deref() == Some("web:6"))
                .then_some(())
        },
    )
    .await;
    let (own, theirs) = eventually(
        "eu-2's revert and eu-1's fleet revert",
        Duration::from_secs(60),
        || async {
            let open = open_pull_requests(&gitea).await;
            let with = |prefix: &str| open.iter().find(|(_, h)| h.starts_with(prefix)).cloned();
            Some((
                with("linnet/revert/@eu-2/")?,
                with("linnet/fleet-revert/@eu-1/")?,
            ))
        },
    )
    .await;
    for (number, file) in [
        (own.0, "clusters/eu-2/kustomization.yaml"),
        (theirs.0, "clusters/eu-1/kustomization.yaml"),
    ] {
        let files = gitea
            .ok(
                reqwest::Method::GET,
                &format!("/repos/{ADMIN}/{REPO}/pulls/{number}/files"),
                None,
            )
            .await;
        assert_eq!(files.as_array().map(Vec::len), Some(1), "{files}");
        assert_eq!(files[0]["filename"], file, "{files}");
    }
    // eu-1's rollout says so in an event (its reference kept for a job a fleet read made).
    eventually(
        "eu-1's event for its pull request",
        Duration::from_secs(20),
        || async {
            let events = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(
                fleet[0].client.clone(),
                &ns.name,
            )
            .list(&Default::default())
            .await
            .ok()?;
            events
                .items
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some("RevertPullRequestOpened")
                        && e.note.as_deref().is_some_and(|n| n.contains("web:4"))
                })
                .map(|_| ())
        },
    )
    .await;
    let open = open_pull_requests(&gitea).await;
    assert!(
        !open.iter().any(|(_, h)| h.contains("/@us-1/")),
        "us-1 never took web:6: {open:?}"
    );
    assert_eq!(
        completed_on(&fleet[2], &ns.name).await.as_deref(),
        Some("web:4")
    );
    gitea
        .merge_open_pull_request(REPO, theirs.0, "Revert web:6 in eu-1")
        .await;
    completed_since(&fleet[0], &ns.name, "web:4", 60).await;
    let metrics = agents[2].metrics().await;
    assert!(
        metrics.contains(r#"linnet_cluster_info{cluster="us-1",cluster_labels="region=us"} 1"#),
        "{metrics}"
    );
    let started = Instant::now();
    drop(agents);
    drop(extra);
    eprintln!("stopped in {:?}", started.elapsed());
}

/// Each cluster's overlay of the shared base (us-1's runs 3 replicas).
const OVERLAY: &str = "resources: [../../base]\n";
const US_REPLICAS: &str = "patches:\n- target: {kind: CanaryDeployment, name: web}\n  patch: |-\n    - op: replace\n      path: /spec/replicas\n      value: 3\n";

/// The first commit: the Fleet (web:1 needs no approval: a rollout's first image is never
/// held), and a Kustomize base with `web` on web:1 and the wave's AnalysisTemplate, which
/// each cluster's overlay renders: one image change in the base moves through the waves.
fn push_first(work: &Path, ns: &str, health_port: u16) {
    for (path, text) in [
        ("fleet.yaml", fleet_yaml(&[])),
        ("base/web.yaml", web(ns, "web:1")),
        ("base/wave-health.yaml", wave_health(ns, health_port)),
        (
            "base/kustomization.yaml",
            "resources: [web.yaml, wave-health.yaml]\n".into(),
        ),
        ("clusters/eu-1/kustomization.yaml", OVERLAY.into()),
        ("clusters/eu-2/kustomization.yaml", OVERLAY.into()),
        (
            "clusters/us-1/kustomization.yaml",
            format!("{OVERLAY}{US_REPLICAS}"),
        ),
    ] {
        std::fs::create_dir_all(work.join(path).parent().unwrap()).unwrap();
        std::fs::write(work.join(path), text).unwrap();
    }
    git(work, &["add", "-A"]);
    git(work, &["commit", "-qm", "web:1 and the fleet"]);
    git(work, &["push", "-q", "origin", "HEAD:main"]);
}
