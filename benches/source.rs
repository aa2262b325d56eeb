//! What an idle poll costs: asking a remote for the branch tip when nothing changed (no fetch,
//! no parse, no API call). Run with `make bench`; prints wall and CPU time per poll.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

#[path = "../tests/support/process.rs"]
mod process;

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

/// User + system CPU time of this process.
fn cpu_seconds() -> f64 {
    process::usage(std::process::id()).map_or(0.0, |(_, cpu)| cpu)
}

fn main() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let bare = tmp.path().join("remote.git");
    std::fs::create_dir_all(&bare).expect("mkdir");
    git(&bare, &["init", "--bare", "-q"]);
    git(
        tmp.path(),
        &["clone", "-q", bare.to_str().unwrap_or(""), "work"],
    );
    let work = tmp.path().join("work");
    // A repository of 1,000 spec files: an idle poll must not cost more because of them.
    std::fs::create_dir_all(work.join("apps")).expect("mkdir");
    for i in 0..1000 {
        std::fs::write(
            work.join(format!("apps/cm-{i}.yaml")),
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\n"),
        )
        .expect("write");
    }
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "seed"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

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
