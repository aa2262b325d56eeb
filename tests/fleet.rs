//! Issue 73: a fleet of three clusters coordinated only through Git. Three local control
//! planes (the test cluster and two more, each with its own etcd, API server,
//! controller-manager, scheduler and kwok, on ports of their own), one repository (a bare
//! one on this machine), three agents, each with the kubeconfig of its own cluster alone.
//! A new image moves wave by wave: the first wave at once, the second (a manual wave) only
//! once the first has baked and a person approved the image in the Fleet, the third once the
//! second has baked. An agent killed (SIGKILL) mid-wave decides the same after its restart.
//! An image that fails in the first wave never starts in the others. The European clusters
//! follow one spec file; us-1 renders `web` from a Helm chart with its own values file, which
//! each image change sets too (a per-cluster Helm layout).
//!
//! Webhooks stand in for the Git host's: each push (to the followed branch or the status
//! branch) is answered by a webhook to every agent, as a host with a hook on the repository
//! does; the agents poll only every hour.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use linnet::api::DeploymentPhase;
use serde_json::json;
use support::agent::{Agent, start_agent_env, wait_ready};
use support::fleet::{
    Hooks, Member, completed_on, in_phase_for, message, push, relay_webhooks, start_clusters,
    three_members, web_of,
};
use support::{eventually, git, holds_for};

const FLEET: &str = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: Fleet
metadata:
  name: shop
spec:
  waves:
  - name: canary
    clusters: [eu-1]
    bakeSeconds: 8
  - name: europe
    matchLabels: {region: eu}
    bakeSeconds: 8
    approval: manual
  - name: rest
    matchLabels: {}
";

fn web(ns: &str, image: &str) -> String {
    let spec = support::rollout::batched_web(
        ns,
        json!({"image": image, "pause": "None", "rollbackOnFailure": true,
               "progressDeadlineSeconds": 12, "replicas": 2}),
    );
    serde_saphyr::to_string(&spec).unwrap()
}

/// us-1's Helm release of the chart `charts/web`, with its own values file.
const US_RELEASE: &str = "releases/us-1";

/// The chart that renders `web` from its values' `image`, and us-1's release of it.
fn chart(ns: &str) -> Vec<(String, String)> {
    vec![
        (
            "charts/web/Chart.yaml".into(),
            "apiVersion: v2\nname: web\nversion: 0.1.0\n".into(),
        ),
        (
            "charts/web/templates/web.yaml".into(),
            web(ns, "IMAGE").replace("IMAGE", "{{ .Values.image }}"),
        ),
        (
            format!("{US_RELEASE}/linnet-helm.yaml"),
            "chart: ../../charts/web\nvaluesFiles: [values.yaml]\n".into(),
        ),
    ]
}

/// The files that ask every cluster for `image`: the European spec file and us-1's values.
fn image_everywhere(ns: &str, image: &str) -> Vec<(String, String)> {
    vec![
        ("apps/web.yaml".into(), web(ns, image)),
        (
            format!("{US_RELEASE}/values.yaml"),
            format!("image: {image}\n"),
        ),
    ]
}

fn push_files(work: &Path, files: &[(String, String)], message: &str) {
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    push(work, &files, message);
}

fn start(m: &Member, bare: &Path, ns: &str) -> Agent {
    std::fs::create_dir_all(&m.dir).unwrap();
    let helm = m.name == "us-1";
    let path = if helm { US_RELEASE } else { "apps" };
    let mut args = vec![
        format!("--repo-url=file://{}", bare.display()),
        format!("--path={path}"),
        "--fleet=fleet.yaml".into(),
        format!("--cluster={}", m.name),
        "--writeback-interval=300ms".into(),
    ];
    if !m.labels.is_empty() {
        args.push(format!("--cluster-label={}", m.labels));
    }
    if m.name == "us-1" {
        args.push(format!("--dashboard-listen=127.0.0.1:{}", us_dashboard()));
    }
    let render = support::render_env();
    let env: Vec<(&str, &str)> = match helm {
        true => render
            .iter()
            .map(|(k, v)| (*k, v.to_str().unwrap()))
            .collect(),
        false => Vec::new(),
    };
    start_agent_env(&m.dir, &args, ns, &m.kubeconfig, &env)
}

/// us-1's dashboard port, with the fleet's view.
fn us_dashboard() -> u16 {
    static PORT: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    *PORT.get_or_init(support::ports::free_port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_moves_wave_by_wave_through_three_clusters_and_a_failure_stops_it() {
    let extra = start_clusters(&["b", "c"], 23850);
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "fleet").await;
    let tmp = tempfile::tempdir().unwrap();
    let fleet = three_members(&extra, &ns.name, tmp.path()).await;
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    let mut first = vec![("fleet.yaml".to_string(), FLEET.to_string())];
    first.extend(chart(&ns.name));
    first.extend(image_everywhere(&ns.name, "web:1"));
    push_files(&work, &first, "web:1, its chart and the fleet");
    let mut agents: Vec<Agent> = fleet.iter().map(|m| start(m, &bare, &ns.name)).collect();
    for a in &agents {
        wait_ready(a).await;
    }
    let hooks: Hooks = std::sync::Arc::new(std::sync::Mutex::new(
        agents.iter().map(|a| a.hooks.clone()).collect(),
    ));
    let relay = relay_webhooks(hooks.clone());
    for m in &fleet {
        eventually(
            &format!("{} Completed on web:1", m.name),
            Duration::from_secs(90),
            || async {
                (completed_on(m, &ns.name).await.as_deref() == Some("web:1")).then_some(())
            },
        )
        .await;
    }
    let us1 = web_of(&fleet[2], &ns.name).await.unwrap();
    let rendered_from = us1.metadata.annotations.unwrap_or_default();
    assert_eq!(
        rendered_from
            .get(linnet::api::SOURCE_PATH_ANNOTATION)
            .map(String::as_str),
        Some("releases/us-1/linnet-helm.yaml"),
        "us-1 renders its Helm release"
    );

    // web:2: the first wave at once; the others held, and saying why.
    push_files(&work, &image_everywhere(&ns.name, "web:2"), "web:2");
    let pushed = Instant::now();
    eventually(
        "eu-1 Completed on web:2",
        Duration::from_secs(60),
        || async {
            (completed_on(&fleet[0], &ns.name).await.as_deref() == Some("web:2")).then_some(())
        },
    )
    .await;
    let held = message(&fleet[1], &ns.name).await;
    assert!(held.contains("held on web:1"), "eu-2: {held}");
    // Killed mid-wave and started again: it decides from Git and its cluster as before.
    agents[1].kill();
    agents[1] = start(&fleet[1], &bare, &ns.name);
    wait_ready(&agents[1]).await;
    hooks.lock().unwrap()[1] = agents[1].hooks.clone();
    holds_for(
        "eu-2 and us-1 held while eu-1 bakes",
        Duration::from_secs(6),
        || async {
            let on = (
                completed_on(&fleet[1], &ns.name).await,
                completed_on(&fleet[2], &ns.name).await,
            );
            match on {
                (Some(a), Some(b)) if a == "web:1" && b == "web:1" => Ok(()),
                other => Err(format!("eu-2 and us-1 Completed on {other:?}")),
            }
        },
    )
    .await;
    // Baked; the manual wave waits for its approval in Git.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let said = message(&fleet[1], &ns.name).await;
        if said.contains("waits for an approval of web:2") {
            break;
        }
        if Instant::now() >= deadline {
            let files = git(&bare, &["ls-tree", "-r", "--name-only", "linnet/status"]);
            let mut shown = String::new();
            for f in files.lines() {
                shown += &format!(
                    "== {f}\n{}\n",
                    git(&bare, &["show", &format!("linnet/status:{f}")])
                );
            }
            panic!("eu-2 not awaiting approval after 30 s: {said}\n{shown}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The bake counts from the phase's start, as its status (and status file) say.
    let baked = in_phase_for(&fleet[0], &ns.name).await;
    assert!(
        baked >= Duration::from_secs(8),
        "the bake is 8 s: {baked:?}"
    );
    let approved = format!("{FLEET}  approvals:\n  - {{wave: europe, image: 'web:2'}}\n");
    push(
        &work,
        &[("fleet.yaml", &approved)],
        "approve web:2 for europe",
    );
    eventually(
        "eu-2 Completed on web:2",
        Duration::from_secs(60),
        || async {
            (completed_on(&fleet[1], &ns.name).await.as_deref() == Some("web:2")).then_some(())
        },
    )
    .await;
    let held = message(&fleet[2], &ns.name).await;
    assert!(held.contains("held on web:1"), "us-1: {held}");
    eventually(
        "us-1 Completed on web:2",
        Duration::from_secs(60),
        || async {
            (completed_on(&fleet[2], &ns.name).await.as_deref() == Some("web:2")).then_some(())
        },
    )
    .await;
    let baked = in_phase_for(&fleet[1], &ns.name).await;
    assert!(
        baked >= Duration::from_secs(8),
        "the second wave's bake is 8 s: {baked:?}"
    );
    eprintln!("web:2 through three waves in {:?}", pushed.elapsed());

    // web:broken fails in the first wave (its pods never become Ready): rolled back there,
    // and never started in the others.
    push_files(
        &work,
        &image_everywhere(&ns.name, "web:broken"),
        "web:broken",
    );
    eventually("eu-1 rolled back", Duration::from_secs(90), || async {
        let d = web_of(&fleet[0], &ns.name).await?;
        (d.status?.phase == Some(DeploymentPhase::RolledBack)).then_some(())
    })
    .await;
    holds_for(
        "web:broken started nowhere else",
        Duration::from_secs(8),
        || async {
            let on = (
                completed_on(&fleet[1], &ns.name).await,
                completed_on(&fleet[2], &ns.name).await,
            );
            match on {
                (Some(a), Some(b)) if a == "web:2" && b == "web:2" => Ok(()),
                other => Err(format!("eu-2 and us-1 Completed on {other:?}")),
            }
        },
    )
    .await;
    let held = message(&fleet[2], &ns.name).await;
    assert!(
        held.contains("web:broken failed in cluster eu-1"),
        "us-1: {held}"
    );
    let metrics = agents[2].metrics().await;
    assert!(
        metrics.contains(&format!(
            r#"linnet_fleet_held_rollouts{{kind="CanaryDeployment",namespace="{}",name="web",wave="rest",reason="FailedInFleet"}} 1"#,
            ns.name
        )),
        "{metrics}"
    );

    // The fleet as `linnet fleet status` shows it, from a clone alone.
    git(
        &work,
        &["fetch", "-q", "origin", "linnet/status:linnet/status"],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["fleet", "status", "--fleet", "fleet.yaml", "--repo"])
        .arg(&work)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    for line in [
        "canary  eu-1",
        "europe  eu-2",
        "rest    us-1",
        "failed (RolledBack)",
    ] {
        assert!(table.contains(line), "no {line:?} in\n{table}");
    }
    // us-1's dashboard shows the same, from its own read of Git, and live in the page.
    let dashboard = format!("http://127.0.0.1:{}", us_dashboard());
    let view: serde_json::Value = support::http()
        .get(format!("{dashboard}/api/fleet"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["fleet"], "shop");
    let states: Vec<&str> = view["rollouts"][0]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(states[0], "failed (RolledBack)", "{view}");
    assert!(
        states[2].contains("web:broken failed in cluster eu-1"),
        "{view}"
    );
    let mut browser = support::browser::Browser::start().await;
    browser.open(&format!("{dashboard}/#/fleet")).await;
    browser
        .wait_text(
            &[
                "Fleet shop",
                "canary",
                "eu-1",
                "failed (RolledBack)",
                "held",
            ],
            20,
        )
        .await;
    browser.open(&format!("{dashboard}/")).await;
    browser
        .wait_text(
            &["Fleet shop: 3 cluster(s) reporting", "Waves and clusters"],
            20,
        )
        .await;
    // Each agent says which cluster it is.
    let status = agents[0].status().await;
    assert_eq!(
        status["cluster"],
        json!({"name": "eu-1", "labels": {"region": "eu"}})
    );
    relay.abort();
    drop(agents);
    drop(extra);
}
