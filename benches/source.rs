//! What the Git source costs, without a cluster. Run with `make bench`.
//! - An idle poll: asking a remote for the branch tip when nothing changed (no fetch, no
//!   parse, no API call); wall and CPU time per poll.
//! - A one-file push: fetching the pushed commit over smart HTTP and finding the changed file,
//!   at 100 and 10,000 spec files, all in one directory and spread over 100; the fetching
//!   thread's CPU time per push (`git http-backend` runs in its own processes, as a Git host).
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

#[path = "../tests/support/process.rs"]
mod process;

#[path = "../tests/support/git_http.rs"]
mod git_http;

#[path = "../tests/support/bench.rs"]
#[allow(dead_code)]
mod bench;

use linnet::source::git::{GitAuth, GitMirror, GitRemote};

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .args([
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@example.invalid",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "git {args:?} failed");
}

/// A bare repository at `bare` and its clone in `dir/work`, which is returned.
fn bare_and_clone(dir: &Path, bare: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(bare).expect("mkdir");
    git(bare, &["init", "--bare", "-q"]);
    git(dir, &["clone", "-q", bare.to_str().unwrap_or(""), "work"]);
    dir.join("work")
}

/// Commits everything in `work` and pushes it to `main`.
fn commit_all_and_push(work: &Path) {
    git(work, &["add", "-A"]);
    git(work, &["commit", "-qm", "seed"]);
    git(work, &["push", "-q", "origin", "HEAD:main"]);
}

/// User + system CPU time of this process.
fn cpu_seconds() -> f64 {
    process::usage(std::process::id()).map_or(0.0, |(_, cpu)| cpu)
}

fn main() {
    // libgit2 set as the agent sets it.
    linnet::net::configure_git(std::time::Duration::from_secs(30), None).expect("git settings");
    idle_poll();
    // `cargo test --all-targets` runs harness-less benches too, without `--bench`: there, a
    // small run keeps this code working; the sizes take minutes to set up.
    // (spec files, files per directory; 0: all in one).
    let (sizes, pushes): (&[(usize, usize)], u32) = if std::env::args().any(|a| a == "--bench") {
        (&[(100, 0), (10_000, 0), (10_000, 100)], 40)
    } else {
        (&[(100, 0), (100, 10)], 3)
    };
    for &(files, per_dir) in sizes {
        one_file_push(files, per_dir, pushes);
    }
}

/// CPU time of the calling thread, in seconds.
#[allow(unsafe_code)]
fn thread_cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(read, 0, "the thread's CPU clock");
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// The fetching side of a push that changes one spec file: fetch, the spec tree's id, the
/// changed files and their content, as the agent does for each push.
fn one_file_push(files: usize, per_dir: usize, pushes: u32) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let repos = tmp.path().join("repos");
    let work = bare_and_clone(tmp.path(), &repos.join("gitops.git"));
    let body = |i: usize, image: &str| {
        format!(
            "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryStatefulSet\nmetadata:\n  \
             name: r-{i:04}\nspec:\n  replicas: 1\n  image: {image}\n"
        )
    };
    for i in 0..files {
        let path = work.join(bench::spec_file(i, per_dir));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, body(i, "bench:1")).expect("write");
    }
    commit_all_and_push(&work);
    let server = git_http::serve(repos, None);
    let mirror = GitMirror::open(
        &tmp.path().join("cache"),
        GitRemote {
            url: format!("{server}/gitops.git"),
            branch: "main".into(),
            auth: GitAuth::Anonymous,
        },
    )
    .expect("mirror");
    let mut tip = mirror.fetch().expect("fetch");
    let reader = tmp.path().join("reader");
    git(
        tmp.path(),
        &["clone", "-q", &format!("{server}/gitops.git"), "reader"],
    );
    let (mut cpu, mut fetch_wall, mut read_wall, mut git_wall) = (0.0, 0.0, 0.0, 0.0);
    for n in 0..pushes as usize {
        let i = (n * 7919) % files;
        std::fs::write(
            work.join(bench::spec_file(i, per_dir)),
            body(i, &format!("bench:{}", n + 2)),
        )
        .expect("write");
        git(&work, &["commit", "-qam", "one image"]);
        git(&work, &["push", "-q", "origin", "HEAD:main"]);
        let started = thread_cpu_seconds();
        let wall = Instant::now();
        let new = mirror.fetch_new_tip(false).expect("fetch");
        fetch_wall += wall.elapsed().as_secs_f64();
        let wall = Instant::now();
        mirror.spec_tree_id(new, "").expect("spec tree id");
        let changed = mirror
            .changed_files(tip, new, "", &linnet::specs::RevisionShape::default())
            .expect("diff")
            .expect("trees in order");
        assert_eq!(changed.len(), 1, "{changed:?}");
        for (_, id) in &changed {
            mirror
                .read_spec_file(id.as_deref().expect("changed"), 1 << 20)
                .expect("read");
        }
        cpu += thread_cpu_seconds() - started;
        read_wall += wall.elapsed().as_secs_f64();
        let wall = Instant::now();
        git(&reader, &["fetch", "-q", "origin", "main"]);
        git_wall += wall.elapsed().as_secs_f64();
        tip = new;
    }
    let layout = match per_dir {
        0 => "in one directory".to_string(),
        k => format!("{k} per directory"),
    };
    let per_push = |s: f64| s * 1e3 / f64::from(pushes);
    println!(
        "one-file push (HTTP, {files} spec files {layout}): {:.2} ms CPU per push; wall: \
         fetch {:.1} ms, the changed files read {:.1} ms, `git fetch` of the same push {:.1} ms \
         ({pushes} pushes)",
        per_push(cpu),
        per_push(fetch_wall),
        per_push(read_wall),
        per_push(git_wall),
    );
}

/// An idle poll: the remote's branch tip, unchanged, at 1,000 spec files.
fn idle_poll() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let bare = tmp.path().join("remote.git");
    let work = bare_and_clone(tmp.path(), &bare);
    // A repository of 1,000 spec files: an idle poll must not cost more because of them.
    std::fs::create_dir_all(work.join("apps")).expect("mkdir");
    for i in 0..1000 {
        std::fs::write(
            work.join(format!("apps/cm-{i}.yaml")),
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\n"),
        )
        .expect("write");
    }
    commit_all_and_push(&work);

    let mirror = GitMirror::open(
        &tmp.path().join("cache"),
        GitRemote {
            url: format!("file://{}", bare.display()),
            branch: "main".into(),
            auth: GitAuth::Anonymous,
        },
    )
    .expect("mirror");
    let fetched = mirror.fetch().expect("fetch");

    let polls = 500;
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    for _ in 0..polls {
        assert_eq!(mirror.remote_tip().expect("tip"), fetched);
    }
    let wall = wall.elapsed().as_secs_f64() / f64::from(polls);
    let cpu = (cpu_seconds() - cpu) / f64::from(polls);
    println!(
        "idle poll (file://, 1,000 spec files): {:.3} ms wall, {:.3} ms CPU per poll ({polls} polls)",
        wall * 1e3,
        cpu * 1e3
    );
}
