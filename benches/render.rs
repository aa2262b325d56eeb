//! What rendering costs a push, without a cluster (issue 48). Run with `make bench`.
//!
//! A repository of N apps, each one rollout: written as plain YAML (`apps/app-<i>.yaml`), or
//! as Kustomize (a base and a staging overlay per app, the overlay setting the image with
//! `images:`). A push changes one app's image; the figure is the wall time from the push to
//! the new spec set, as the agent makes it (fetch over smart HTTP, the tree diff or the
//! listing, the snapshot's update with its renders, the combined set), at 100 and 1,000 apps.
//! The rest of a push's way to the cluster (the apply of the one changed rollout) is the same
//! for both layouts.
//!
//! With the local control plane (`make bench` runs it), the same pushes through the agent: from
//! `git push` (a post-receive hook sends the webhook, as a Git host does) to the rollout's new
//! image written in the cluster, at 100 and 1,000 rollouts. Writes `bench/RENDER.md`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../tests/support/mod.rs"]
mod support;

use support::git_http;

use linnet::render::RenderOptions;
use linnet::source::git::{GitAuth, GitMirror, GitRemote};
use linnet::source::snapshot::SpecSnapshot;
use linnet::specs::{FileContent, LoadOptions};

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@example.invalid"])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "git {args:?} failed");
}

fn rollout(i: usize, image: &str) -> String {
    format!(
        "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryStatefulSet\nmetadata:\n  \
         name: app-{i:04}\n  namespace: bench\nspec:\n  replicas: 1\n  image: {image}\n  \
         template:\n    serviceName: app-{i:04}\n    selector:\n      matchLabels: {{app: \
         app-{i:04}}}\n    template:\n      metadata:\n        labels: {{app: app-{i:04}}}\n      \
         spec:\n        containers:\n        - name: app\n          image: {image}\n"
    )
}

/// The files of app `i` at image tag `tag`, in either layout.
fn app_files(i: usize, tag: u32, overlays: bool) -> Vec<(String, String)> {
    if !overlays {
        return vec![(
            format!("apps/app-{i:04}.yaml"),
            rollout(i, &format!("bench:{tag}")),
        )];
    }
    vec![
        (
            format!("apps/app-{i:04}/base/kustomization.yaml"),
            "resources: [rollout.yaml]\n".into(),
        ),
        (
            format!("apps/app-{i:04}/base/rollout.yaml"),
            rollout(i, "bench:1"),
        ),
        (
            format!("apps/app-{i:04}/staging/kustomization.yaml"),
            format!("resources: [../base]\nimages:\n- name: bench\n  newTag: \"{tag}\"\n"),
        ),
    ]
}

fn write(work: &Path, files: &[(String, String)]) {
    for (path, text) in files {
        let to = work.join(path);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, text).unwrap();
    }
}

/// The median and the largest wall time from a push to the new spec set, in ms.
fn push_to_specs(
    apps: usize,
    overlays: bool,
    pushes: usize,
    render: &RenderOptions,
) -> (f64, f64, Duration) {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    let bare = repos.join("gitops.git");
    std::fs::create_dir_all(&bare).unwrap();
    git(&bare, &["init", "--bare", "-q"]);
    git(tmp.path(), &["clone", "-q", bare.to_str().unwrap(), "work"]);
    let work = tmp.path().join("work");
    for i in 0..apps {
        write(&work, &app_files(i, 1, overlays));
    }
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "seed"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let server = git_http::serve(repos, None);
    let mirror = GitMirror::open(
        &tmp.path().join("cache"),
        GitRemote {
            url: format!("{server}/gitops.git"),
            branch: "main".into(),
            auth: GitAuth::Anonymous,
        },
    )
    .unwrap();
    let opts = LoadOptions::default();
    let mut snapshot = SpecSnapshot::with_render(render.clone());
    let read = |_: &str, id: &str| -> Result<FileContent, linnet::source::git::GitError> {
        mirror.read_spec_file(id, opts.max_file_bytes)
    };
    let first = Instant::now();
    let mut tip = mirror.fetch().unwrap();
    snapshot
        .update(
            &mirror.list_files_within(tip, "", &opts.shape).unwrap(),
            read,
            &opts,
        )
        .unwrap();
    let set = snapshot.spec_set();
    assert_eq!(set.objects.len(), apps, "{:?}", set.errors.first());
    let first_sync = first.elapsed();
    let mut times = Vec::new();
    for n in 0..pushes {
        let i = (n * 7919) % apps;
        write(&work, &app_files(i, n as u32 + 2, overlays));
        git(&work, &["commit", "-qam", "one image"]);
        git(&work, &["push", "-q", "origin", "HEAD:main"]);
        let started = Instant::now();
        let new = mirror.fetch().unwrap();
        let changes = mirror
            .changed_files(tip, new, "", &opts.shape)
            .unwrap()
            .unwrap();
        let update = match snapshot.update_changed(&changes, read, &opts).unwrap() {
            Some(u) => u,
            None => snapshot
                .update(
                    &mirror.list_files_within(new, "", &opts.shape).unwrap(),
                    read,
                    &opts,
                )
                .unwrap(),
        };
        let set = snapshot.spec_set();
        times.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(update.parsed, 1, "one unit or file parsed");
        assert!(set.errors.is_empty(), "{:?}", set.errors.first());
        tip = new;
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[times.len() - 1], first_sync)
}

/// The median and largest wall time from `git push` to the CanaryStatefulSet's new image in the
/// cluster, through the agent, in ms; and the first sync (agent start to every rollout there).
async fn push_to_cr_write(
    apps: usize,
    overlays: bool,
    pushes: usize,
    kustomize: &Path,
) -> (f64, f64, Duration) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    use linnet::api::CanaryStatefulSet;
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "bench-render").await;
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    for i in 0..apps {
        let files: Vec<(String, String)> = app_files(i, 1, overlays)
            .into_iter()
            .map(|(p, t)| {
                (
                    p,
                    t.replace("namespace: bench", &format!("namespace: {}", ns.name)),
                )
            })
            .collect();
        write(&work, &files);
    }
    support::git(&work, &["add", "-A"]);
    support::git(&work, &["commit", "-qm", "seed"]);
    support::git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let started = Instant::now();
    let agent = support::agent::start_agent(
        tmp.path(),
        &[
            format!("--repo-url=file://{}", bare.display()),
            "--drift-interval=1h".into(),
            format!("--kustomize={}", kustomize.display()),
        ],
        &ns.name,
    );
    support::push_hook::install_github_push_hook(
        &bare,
        support::agent::SECRET,
        &format!("{}/hooks/github", agent.hooks),
    )
    .unwrap();
    let rollouts: kube::Api<CanaryStatefulSet> = kube::Api::namespaced(admin.clone(), &ns.name);
    // The first sync: every rollout in the cluster. Then every one Stable (its set and pod
    // made), so that the pushes are measured on a settled cluster.
    let mut seen = std::collections::HashSet::new();
    let mut stable = std::collections::HashSet::new();
    let mut first_sync = None;
    let mut stream = watcher(rollouts.clone(), watcher::Config::default()).boxed();
    while stable.len() < apps {
        match tokio::time::timeout(Duration::from_secs(600), stream.next()).await {
            Ok(Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)))) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                let phase = o.status.as_ref().and_then(|st| st.phase.as_ref());
                if phase.is_some_and(|p| format!("{p:?}") == "Stable") {
                    stable.insert(name.clone());
                }
                seen.insert(name);
                if seen.len() == apps && first_sync.is_none() {
                    first_sync = Some(started.elapsed());
                }
            }
            Ok(Some(_)) => {}
            _ => panic!(
                "{} of {apps} rollouts, {} Stable, after 600 s:\n{}",
                seen.len(),
                stable.len(),
                agent.log_text()
            ),
        }
    }
    let first_sync = first_sync.unwrap_or_else(|| started.elapsed());
    let mut times = Vec::new();
    for n in 0..pushes {
        let i = (n * 7919) % apps;
        let name = format!("app-{i:04}");
        let want = format!("bench:{}", n + 2);
        let written = {
            let want = want.clone();
            support::first_seen(rollouts.clone(), support::watch_named(&name), move |o| {
                o.spec.image == want
            })
            .await
        };
        let files: Vec<(String, String)> = app_files(i, n as u32 + 2, overlays)
            .into_iter()
            .filter(|(p, _)| !p.contains("/base/"))
            .map(|(p, t)| {
                (
                    p,
                    t.replace("namespace: bench", &format!("namespace: {}", ns.name)),
                )
            })
            .collect();
        write(&work, &files);
        support::git(&work, &["commit", "-qam", "one image"]);
        support::git(&work, &["push", "-q", "origin", "HEAD:main"]);
        let pushed = Instant::now();
        let at = tokio::time::timeout(Duration::from_secs(60), written)
            .await
            .unwrap_or_else(|_| panic!("{name} never got {want}:\n{}", agent.log_text()))
            .unwrap();
        times.push(at.saturating_duration_since(pushed).as_secs_f64() * 1e3);
    }
    drop(agent);
    // Gone before the next run starts, so that its deletion does not load that run.
    let name = ns.name.clone();
    drop(ns);
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(admin.clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    while namespaces.get_opt(&name).await.ok().flatten().is_some() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[times.len() - 1], first_sync)
}

fn main() {
    linnet::net::configure_git(Duration::from_secs(30), None).expect("git settings");
    // `make bench` names it; under `cargo test` the script gives its cached build.
    let kustomize = std::env::var_os("LINNET_KUSTOMIZE")
        .map(Into::into)
        .unwrap_or_else(|| {
            let out = Command::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/deploy/render-tools/build.sh"
            ))
            .output()
            .expect("deploy/render-tools/build.sh runs (it needs Go)");
            let bin = String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .to_string();
            std::path::PathBuf::from(bin).join("kustomize")
        });
    let render = RenderOptions {
        kustomize,
        ..RenderOptions::default()
    };
    // `cargo test --all-targets` runs harness-less benches too: there, a small run.
    let (sizes, pushes): (&[usize], usize) = if std::env::args().any(|a| a == "--bench") {
        (&[100, 1_000], 20)
    } else {
        (&[10], 3)
    };
    let mut rows = Vec::new();
    for &apps in sizes {
        let (plain, plain_max, plain_first) = push_to_specs(apps, false, pushes, &render);
        let (over, over_max, over_first) = push_to_specs(apps, true, pushes, &render);
        let line = format!(
            "| {apps} | {plain:.1} (max {plain_max:.1}) | {over:.1} (max {over_max:.1}) | {:.2}x | {:.1} s | {:.1} s |",
            over / plain,
            plain_first.as_secs_f64(),
            over_first.as_secs_f64()
        );
        println!("{line}");
        rows.push(line);
    }
    // Through the agent, when the local control plane is up (`make bench` starts it).
    let mut cluster_rows = Vec::new();
    if std::env::args().any(|a| a == "--bench") && std::env::var_os("LINNET_CLUSTER_DIR").is_some()
    {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        for &apps in sizes {
            let (plain, plain_max, plain_first) =
                runtime.block_on(push_to_cr_write(apps, false, pushes, &render.kustomize));
            let (over, over_max, over_first) =
                runtime.block_on(push_to_cr_write(apps, true, pushes, &render.kustomize));
            let line = format!(
                "| {apps} | {plain:.1} (max {plain_max:.1}) | {over:.1} (max {over_max:.1}) | {:.2}x | {:.1} s | {:.1} s |",
                over / plain,
                plain_first.as_secs_f64(),
                over_first.as_secs_f64()
            );
            println!("through the agent: {line}");
            cluster_rows.push(line);
        }
    }
    if std::env::args().any(|a| a == "--bench") {
        let cluster = if cluster_rows.is_empty() {
            "Not measured: the local control plane was not up (`make bench` starts it).".to_string()
        } else {
            format!(
                "| rollouts | plain YAML, ms (median) | overlays, ms (median) | overlays / plain | first sync, plain | first sync, overlays |\n\
                 |---|---|---|---|---|---|\n{}",
                cluster_rows.join("\n")
            )
        };
        let commit = Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let text = format!(
            "# Rendering: a push to the new spec set, plain YAML against Kustomize overlays\n\n\
             Written by `make bench` (`benches/render.rs`). N apps of one CanaryStatefulSet each; a \
             push changes one app's image (plain: its file; Kustomize: `images:` in its staging \
             overlay, over a base). Wall time from the push to the new spec set as the agent makes \
             it: fetch over smart HTTP, the tree diff, then one file parsed (plain) or the one \
             overlay that reads the changed file rendered by kustomize, in place (Kustomize), \
             and the combined set. {pushes} pushes each; the first sync is the whole repository \
             read (and rendered, one kustomize per core) once. Commit {commit}, {cores} cores.\n\n\
             | apps | plain YAML, ms (median) | overlays, ms (median) | overlays / plain | first sync, plain | first sync, overlays |\n\
             |---|---|---|---|---|---|\n{}\n\n\
             ## Through the agent: `git push` to the rollout's new image in the cluster\n\n\
             The agent on the local control plane, woken by the push's webhook (a post-receive \
             hook, as a Git host sends it); the time from `git push` returning to the \
             CanaryStatefulSet's new `spec.image` seen by a watch. First sync: the agent's \
             start to every rollout in the cluster.\n\n{cluster}\n",
            rows.join("\n")
        );
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/bench/RENDER.md"),
            text,
        )
        .unwrap();
    }
}
