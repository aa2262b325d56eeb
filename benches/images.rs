//! `make bench`, image automation (issue 74): from a push of a new tag to a real registry
//! (distribution over HTTPS, crane) to the canary's first Ready pod on the local control plane,
//! and to the tag's commit in Git on the way. Two ways of learning of the push: the registry's
//! webhook (`/hooks/registry`, the agent's scan interval an hour), and polling at a 10 s scan
//! interval. The Git source polls hourly; the automation's own commit wakes it.
//!
//! Writes bench/IMAGES.md between its markers. `LINNET_BENCH_IMAGES_ROUNDS` (5) tags per way.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use support::agent::{Agent, SECRET, start_agent, wait_ready};
use support::bench::{env_or, sh};
use support::registry::{Registry, marked_web, push_image, registry_tools, semver_policy};
use support::tls::TestCa;
use support::{TestNamespace, admin_client, git, install_linnet};

/// Polling's scan interval.
const SCAN: &str = "10s";

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("images: a benchmark; run it with `make bench`");
        return;
    }
    let rounds: usize = env_or("LINNET_BENCH_IMAGES_ROUNDS", 5);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let table = rt.block_on(run(rounds));
    println!("{table}");
    let root = env!("CARGO_MANIFEST_DIR");
    let commit = sh("git", &["-C", root, "rev-parse", "--short", "HEAD"]);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let section = format!(
        "<!-- bench:begin (written by `make bench`; edit outside the markers) -->\n\
         Machine: {cores} cores. Commit `{commit}`. Run {}. {rounds} tags per way, pushed to \
         distribution over HTTPS; a CanaryDeployment of 2 replicas in 2 batches on kwok; the \
         Git source polls hourly (the automation's commit wakes it); Git and the pods read every \
         50 ms.\n\n{table}<!-- bench:end -->",
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
    );
    support::bench::write_section(
        &format!("{root}/bench/IMAGES.md"),
        "Image automation benchmark results",
        &section,
    );
}

struct Setup {
    tools: std::path::PathBuf,
    scratch: std::path::PathBuf,
    repository: String,
    bare: std::path::PathBuf,
    ca_file: std::path::PathBuf,
}

async fn run(rounds: usize) -> String {
    let client = admin_client().await;
    install_linnet(&client).await;
    let tmp = tempfile::tempdir().unwrap();
    let ca = TestCa::new("registry CA");
    let ca_file = ca.write(tmp.path(), "ca.pem");
    let port = support::ports::free_port();
    let reg_dir = tmp.path().join("registry");
    std::fs::create_dir_all(&reg_dir).unwrap();
    let tools = registry_tools();
    let _registry = Registry::start_with(&tools, &reg_dir, port, Some(&ca.server_cert()));
    let mut rows = Vec::new();
    for (way, scan, hook) in [("registry webhook", "1h", true), ("polling", SCAN, false)] {
        let ns = TestNamespace::create(&client, "bench-images").await;
        let dir = tmp.path().join(way.replace(' ', "-"));
        std::fs::create_dir_all(&dir).unwrap();
        let repository = format!("127.0.0.1:{port}/{}/web", ns.name);
        push_image(&tools, &dir, &format!("{repository}:1.0.0"), "1.0.0");
        let (bare, work) = support::bare_remote_and_clone(&dir);
        std::fs::write(
            work.join("web.yaml"),
            marked_web(&ns.name, &format!("{repository}:1.0.0")),
        )
        .unwrap();
        std::fs::write(work.join("policy.yaml"), semver_policy(&repository)).unwrap();
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "-qm", "web"]);
        git(&work, &["push", "-q", "origin", "HEAD:main"]);
        let setup = Setup {
            tools: tools.clone(),
            scratch: dir.clone(),
            repository,
            bare,
            ca_file: ca_file.clone(),
        };
        let agent = start(&setup, &ns.name, scan);
        wait_ready(&agent).await;
        let (mut to_git, mut to_pod) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let (git_at, pod_at) = one_tag(&client, &setup, &agent, &ns.name, round, hook).await;
            to_git.push(git_at);
            to_pod.push(pod_at);
        }
        rows.push(format!(
            "| {way} (scan every {scan}) | {} | {} |",
            figures(&mut to_git),
            figures(&mut to_pod)
        ));
    }
    format!(
        "| learnt by | push -> tag in Git | push -> first canary pod Ready |\n|---|---|---|\n{}\n",
        rows.join("\n")
    )
}

fn start(s: &Setup, ns: &str, scan: &str) -> Agent {
    let dir = s.scratch.join("agent");
    std::fs::create_dir_all(&dir).unwrap();
    start_agent(
        &dir,
        &[
            format!("--repo-url=file://{}", s.bare.display()),
            "--image-automation=true".into(),
            format!("--image-scan-interval={scan}"),
            format!("--ca-file={}", s.ca_file.display()),
            "--writeback=false".into(),
        ],
        ns,
    )
}

/// Pushes `1.<round>.0` (its wait for the previous rollout's end not timed) and returns the
/// time to the tag in Git and to the first Ready pod of it.
async fn one_tag(
    client: &kube::Client,
    s: &Setup,
    agent: &Agent,
    ns: &str,
    round: usize,
    hook: bool,
) -> (Duration, Duration) {
    let image = format!("{}:1.{round}.0", s.repository);
    push_image(&s.tools, &s.scratch, &image, &image);
    let pushed = Instant::now();
    if hook {
        let status = support::http()
            .post(format!("{}/hooks/registry", agent.hooks))
            .header("authorization", format!("Bearer {SECRET}"))
            .body(r#"{"events":[{"action":"push"}]}"#)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 202);
    }
    let bare = s.bare.clone();
    let in_git = {
        let image = image.clone();
        move || in_git(&bare, &image)
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (mut git_at, mut pod_at) = (None, None);
    while pod_at.is_none() {
        assert!(
            pushed.elapsed() < Duration::from_secs(120),
            "{image} never ran"
        );
        if git_at.is_none() && in_git() {
            git_at = Some(pushed.elapsed());
        }
        let list = pods.list(&Default::default()).await.unwrap();
        if list.items.iter().any(|p| ready_on(p, &image)) {
            pod_at = Some(pushed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pod_at = pod_at.unwrap_or_default();
    (git_at.unwrap_or(pod_at), pod_at)
}

fn in_git(bare: &Path, image: &str) -> bool {
    git(bare, &["show", "main:web.yaml"]).contains(image)
}

fn ready_on(p: &Pod, image: &str) -> bool {
    let runs = p.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .any(|c| c.image.as_deref() == Some(image))
    });
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    runs && ready
}

fn figures(samples: &mut [Duration]) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_millis();
    format!(
        "median {} ms, max {} ms",
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1])
    )
}
