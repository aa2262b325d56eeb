//! Write-back of status files against real repositories: a bare repository over `file://`
//! and over smart HTTP (`git http-backend`, token auth), and a human pushing to the same
//! branch at the worst moment.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};

use linnet::source::git::{GitAuth, GitRemote};
use linnet::writeback::push::{Pushed, StatusWriter};
use linnet::writeback::status_files::StatusFile;
use support::{git, git_http};

struct Repo {
    tmp: tempfile::TempDir,
    bare: PathBuf,
    /// A human's clone.
    work: PathBuf,
}

fn repo() -> Repo {
    let tmp = tempfile::tempdir().unwrap();
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    std::fs::create_dir_all(work.join("apps")).unwrap();
    std::fs::write(work.join("apps/app.yaml"), "kind: ConfigMap\n").unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "first"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    Repo { tmp, bare, work }
}

fn file(name: &str, phase: &str) -> StatusFile {
    StatusFile {
        path: linnet::writeback::status_files::path("default", "default", name),
        replaces: Vec::new(),
        content: format!("phase: {phase}\n"),
        summary: format!("default/{name} {phase}"),
    }
}

fn writer(r: &Repo, url: String, branch: &str, auth: GitAuth) -> StatusWriter {
    StatusWriter::open(
        &r.tmp
            .path()
            .join(format!("cache-{branch}").replace('/', "-")),
        GitRemote {
            url,
            branch: branch.into(),
            auth,
        },
        "linnet",
        "linnet@example.invalid",
    )
    .unwrap()
}

fn show(bare: &Path, what: &str) -> String {
    git(bare, &["show", what])
}

#[test]
fn status_files_go_to_a_status_branch_with_no_empty_commits() {
    let r = repo();
    let mut w = writer(
        &r,
        format!("file://{}", r.bare.display()),
        "linnet/status",
        GitAuth::Anonymous,
    );
    assert!(matches!(
        w.write(&[file("redis", "Stable"), file("web", "Completed")])
            .unwrap(),
        Pushed::Committed { retries: 0, .. }
    ));
    assert_eq!(
        show(
            &r.bare,
            "linnet/status:.linnet/status/default/default/34/redis.yaml"
        ),
        "phase: Stable"
    );
    let log = git(&r.bare, &["log", "--format=%an <%ae> %s", "linnet/status"]);
    assert_eq!(
        log,
        "linnet <linnet@example.invalid> linnet: default/redis Stable; default/web Completed"
    );
    // The same content again: no commit.
    assert_eq!(
        w.write(&[file("redis", "Stable")]).unwrap(),
        Pushed::Unchanged
    );
    // One file changes: one commit, with only that file's summary.
    w.write(&[file("redis", "CanaryActive"), file("web", "Completed")])
        .unwrap();
    let log = git(&r.bare, &["log", "--format=%s", "linnet/status"]);
    assert_eq!(
        log,
        "linnet: default/redis CanaryActive\nlinnet: default/redis Stable; default/web Completed"
    );
    // Every commit changes something.
    for c in git(&r.bare, &["rev-list", "linnet/status"]).lines() {
        let files = git(&r.bare, &["show", "--format=", "--name-only", c]);
        assert!(!files.is_empty(), "commit {c} is empty");
    }
    // The tracked branch is untouched.
    assert_eq!(git(&r.bare, &["log", "--format=%s", "main"]), "first");
}

#[test]
fn status_files_over_smart_http_with_a_token() {
    let r = repo();
    let base = git_http::serve(r.tmp.path().to_path_buf(), Some(("git", "t0ken")));
    let token = r.tmp.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let mut w = writer(
        &r,
        format!("{base}/remote.git"),
        "linnet/status",
        GitAuth::Basic {
            username: "git".into(),
            password_file: token.clone(),
        },
    );
    w.write(&[file("redis", "Stable")]).unwrap();
    assert_eq!(
        show(
            &r.bare,
            "linnet/status:.linnet/status/default/default/34/redis.yaml"
        ),
        "phase: Stable"
    );
    // A token that may not push gets a clear error, and nothing is written.
    std::fs::write(&token, "wrong\n").unwrap();
    let err = w.write(&[file("redis", "Promoting")]).unwrap_err();
    assert_eq!(err.label(), "auth", "{err}");
    assert_eq!(
        show(
            &r.bare,
            "linnet/status:.linnet/status/default/default/34/redis.yaml"
        ),
        "phase: Stable"
    );
}

/// The race: a human pushes a spec change to the tracked branch between linnet's fetch and
/// its push, again and again. Both commits always end up on the branch; nothing is forced.
#[test]
fn a_human_push_between_fetch_and_push_is_never_lost() {
    let r = repo();
    let mut w = writer(
        &r,
        format!("file://{}", r.bare.display()),
        "main",
        GitAuth::Anonymous,
    );
    let rounds = 25;
    let mut retries = 0;
    for i in 0..rounds {
        let mut human_pushed = false;
        let pushed = w
            .write_with(&[file("redis", &format!("Step{i}"))], || {
                if !human_pushed {
                    human_pushed = true;
                    git(&r.work, &["pull", "-q", "--rebase", "origin", "main"]);
                    std::fs::write(
                        r.work.join("apps/app.yaml"),
                        format!("kind: ConfigMap\n# {i}\n"),
                    )
                    .unwrap();
                    git(&r.work, &["commit", "-qam", &format!("human {i}")]);
                    git(&r.work, &["push", "-q", "origin", "HEAD:main"]);
                }
            })
            .unwrap();
        let Pushed::Committed { retries: n, .. } = pushed else {
            panic!("round {i}: nothing was written");
        };
        retries += n;
    }
    let log = git(&r.bare, &["log", "--format=%s", "main"]);
    let humans = log.lines().filter(|l| l.starts_with("human ")).count();
    let linnets = log.lines().filter(|l| l.starts_with("linnet: ")).count();
    println!(
        "{rounds} rounds: {humans} human commits kept, {linnets} status commits, {retries} pushes redone"
    );
    assert_eq!(humans, rounds, "a human commit was lost:\n{log}");
    assert_eq!(linnets, rounds);
    assert!(retries >= rounds as u32, "the race never happened");
    // The human's last change and linnet's last status are both at the tip.
    assert_eq!(
        show(&r.bare, "main:apps/app.yaml"),
        format!("kind: ConfigMap\n# {}", rounds - 1)
    );
    assert_eq!(
        show(&r.bare, "main:.linnet/status/default/default/34/redis.yaml"),
        format!("phase: Step{}", rounds - 1)
    );
    // Linear history: every human commit is an ancestor of the tip (no force push).
    let first = git(&r.bare, &["rev-list", "--max-parents=0", "main"]);
    assert_eq!(first.lines().count(), 1);
}

/// A status branch an earlier linnet wrote, with every file of a namespace in one directory:
/// each file moves under its fan-out directory in the commit that next writes it, and a
/// deleted rollout's file stays where it was.
#[test]
fn status_files_in_the_flat_layout_move_to_the_clusters_layout() {
    use linnet::writeback::status_files::flat_path;
    let r = repo();
    git(&r.work, &["checkout", "-q", "-b", "linnet/status"]);
    std::fs::create_dir_all(r.work.join(".linnet/status/default")).unwrap();
    for name in ["redis", "web", "gone"] {
        std::fs::write(r.work.join(flat_path("default", name)), "phase: Old\n").unwrap();
    }
    git(&r.work, &["add", "-A"]);
    git(&r.work, &["commit", "-qm", "an earlier linnet's status"]);
    git(&r.work, &["push", "-q", "origin", "linnet/status"]);
    let mut w = writer(
        &r,
        format!("file://{}", r.bare.display()),
        "linnet/status",
        GitAuth::Anonymous,
    );
    let moved = |name: &str| StatusFile {
        replaces: vec![flat_path("default", name)],
        ..file(name, "Stable")
    };
    assert!(matches!(
        w.write(&[moved("redis"), moved("web")]).unwrap(),
        Pushed::Committed { retries: 0, .. }
    ));
    let files = git(&r.bare, &["ls-tree", "-r", "--name-only", "linnet/status"]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        [
            ".linnet/status/default/default/34/redis.yaml",
            ".linnet/status/default/default/4b/web.yaml",
            ".linnet/status/default/gone.yaml",
            "apps/app.yaml",
        ]
    );
    assert_eq!(
        show(
            &r.bare,
            "linnet/status:.linnet/status/default/default/4b/web.yaml"
        ),
        "phase: Stable"
    );
    // Moved in one commit; written again, nothing to commit.
    assert_eq!(git(&r.bare, &["rev-list", "--count", "linnet/status"]), "3");
    assert_eq!(
        w.write(&[moved("redis"), moved("web")]).unwrap(),
        Pushed::Unchanged
    );
}

const ROLLOUT: &str = "kind: CanaryStatefulSet\nmetadata:\n  name: redis\n  namespace: default\nspec:\n  image: redis:7.4 # new\n";

fn redis_revert() -> linnet::writeback::revert::Revert {
    linnet::writeback::revert::Revert {
        path: "apps/redis.yaml".into(),
        kind: "CanaryStatefulSet",
        namespace: "default".into(),
        name: "redis".into(),
        failed: "redis:7.4".into(),
        good: "redis:7.2".into(),
        why: "aborted".into(),
        mode: linnet::api::RevertMode::Commit,
        revision: None,
        shared_base: false,
        cluster: None,
        failed_in: None,
    }
}

/// A repository whose `main` asks for the failed `redis:7.4`, and a writer to `main`.
fn repo_with_failed_rollout() -> (Repo, StatusWriter) {
    let r = repo();
    human_commit(&r, "apps/redis.yaml", ROLLOUT, "redis 7.4");
    let w = writer(
        &r,
        format!("file://{}", r.bare.display()),
        "main",
        GitAuth::Anonymous,
    );
    (r, w)
}

fn human_commit(r: &Repo, path: &str, text: &str, message: &str) {
    git(&r.work, &["pull", "-q", "--rebase", "origin", "main"]);
    std::fs::write(r.work.join(path), text).unwrap();
    git(&r.work, &["add", "-A"]);
    git(&r.work, &["commit", "-qm", message]);
    git(&r.work, &["push", "-q", "origin", "HEAD:main"]);
}

/// Issue 50: a revert commit pushed while a person pushes to the same branch keeps their
/// commit (it is made again on the new tip), and never repeats itself.
#[test]
fn a_revert_commit_lands_on_top_of_a_human_push_and_only_once() {
    let (r, mut w) = repo_with_failed_rollout();
    let mut human_pushed = false;
    let pushed = w
        .revert_with(&redis_revert(), || {
            if !human_pushed {
                human_pushed = true;
                human_commit(&r, "apps/app.yaml", "kind: ConfigMap\n# edited\n", "human");
            }
        })
        .unwrap();
    assert!(
        matches!(pushed, Pushed::Committed { retries: 1, .. }),
        "{pushed:?}"
    );
    assert_eq!(
        show(&r.bare, "main:apps/redis.yaml"),
        ROLLOUT.replace("redis:7.4", "redis:7.2").trim_end()
    );
    assert_eq!(
        show(&r.bare, "main:apps/app.yaml"),
        "kind: ConfigMap\n# edited"
    );
    let log = git(&r.bare, &["log", "--format=%s", "main"]);
    assert_eq!(
        log.lines().take(2).collect::<Vec<_>>(),
        ["linnet: revert default/redis to redis:7.2", "human"]
    );
    // Again (a restart, another change of the rolled-back rollout): nothing to write.
    assert_eq!(w.revert(&redis_revert()).unwrap(), Pushed::Unchanged);
}

/// Issue 50: a person who changed the image between linnet's fetch and its push wins: on the
/// new tip the file no longer asks for the failed image, so no revert is written.
#[test]
fn a_revert_raced_by_a_new_image_is_dropped() {
    let (r, mut w) = repo_with_failed_rollout();
    let mut human_pushed = false;
    let pushed = w
        .revert_with(&redis_revert(), || {
            if !human_pushed {
                human_pushed = true;
                human_commit(
                    &r,
                    "apps/redis.yaml",
                    &ROLLOUT.replace("redis:7.4", "redis:7.6"),
                    "redis 7.6",
                );
            }
        })
        .unwrap();
    assert_eq!(pushed, Pushed::Unchanged);
    assert!(show(&r.bare, "main:apps/redis.yaml").contains("image: redis:7.6 # new"));
    // A file that is gone is an error that names it, not a retry.
    human_commit(
        &r,
        "apps/redis.yaml",
        "kind: ConfigMap\n",
        "not a rollout any more",
    );
    let e = w.revert(&redis_revert()).unwrap_err();
    assert!(
        e.to_string()
            .contains("apps/redis.yaml has no CanaryStatefulSet redis"),
        "{e}"
    );
}

fn human_commit_files(r: &Repo, files: &[(&str, Option<&str>)], message: &str) {
    git(&r.work, &["pull", "-q", "--rebase", "origin", "main"]);
    for (path, text) in files {
        let at = r.work.join(path);
        match text {
            Some(text) => {
                std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                std::fs::write(at, text).unwrap();
            }
            None => std::fs::remove_file(at).unwrap(),
        }
    }
    git(&r.work, &["add", "-A"]);
    git(&r.work, &["commit", "-qm", message]);
    git(&r.work, &["push", "-q", "origin", "HEAD:main"]);
}

const CONFIG_V1: &str =
    "kind: ConfigMap\nmetadata:\n  name: redis-config\ndata:\n  maxmemory: 1gb\n";
const CONFIG_V2: &str = "kind: ConfigMap\nmetadata:\n  name: redis-config\ndata:\n  maxmemory: 0\n";
const SECRET: &str = "kind: Secret\nmetadata:\n  name: redis-auth\nstringData:\n  password: new\n";

/// A repository where one commit changed redis's image and its config beside it (and `also`),
/// then a person annotated the rollout; and a writer to `main`.
fn repo_with_image_and_config_in_one_commit(also: &[(&str, Option<&str>)]) -> (Repo, StatusWriter) {
    let r = repo();
    let good = ROLLOUT.replace("redis:7.4", "redis:7.2");
    human_commit_files(
        &r,
        &[
            ("apps/redis.yaml", Some(&good)),
            ("apps/redis-config.yaml", Some(CONFIG_V1)),
            ("apps/web/web.yaml", Some("kind: Deployment\n")),
        ],
        "redis 7.2",
    );
    let mut change = vec![
        ("apps/redis.yaml", Some(ROLLOUT)),
        ("apps/redis-config.yaml", Some(CONFIG_V2)),
        ("apps/redis-auth.yaml", Some(SECRET)),
    ];
    change.extend_from_slice(also);
    human_commit_files(&r, &change, "redis 7.4 with maxmemory 0");
    let annotated = ROLLOUT.replace("  name: redis\n", "  name: redis\n  annotations: {a: b}\n");
    human_commit_files(&r, &[("apps/redis.yaml", Some(&annotated))], "annotate");
    let w = writer(
        &r,
        format!("file://{}", r.bare.display()),
        "main",
        GitAuth::Anonymous,
    );
    (r, w)
}

/// Issue 50: the config that came in with the failed image in one commit goes back with it:
/// a changed ConfigMap to what it was, an added Secret away; the person's later annotation
/// stays.
#[test]
fn a_revert_puts_back_the_config_that_came_in_with_the_image() {
    let (r, mut w) = repo_with_image_and_config_in_one_commit(&[]);
    let pushed = w.revert(&redis_revert()).unwrap();
    assert!(matches!(pushed, Pushed::Committed { .. }), "{pushed:?}");
    let rollout = show(&r.bare, "main:apps/redis.yaml");
    assert!(rollout.contains("image: redis:7.2 # new"), "{rollout}");
    assert!(rollout.contains("annotations: {a: b}"), "{rollout}");
    assert_eq!(
        show(&r.bare, "main:apps/redis-config.yaml"),
        CONFIG_V1.trim_end()
    );
    let files = git(&r.bare, &["ls-tree", "-r", "--name-only", "main"]);
    assert!(!files.contains("apps/redis-auth.yaml"), "{files}");
    let body = git(&r.bare, &["log", "-1", "--format=%b", "main"]);
    assert!(body.contains("goes back to before"), "{body}");
    assert!(
        body.contains(": apps/redis-auth.yaml, apps/redis-config.yaml"),
        "{body}"
    );
    assert_eq!(w.revert(&redis_revert()).unwrap(), Pushed::Unchanged);
}

/// Issue 50, neighbours: a commit that also changed something that is not config (or not
/// beside the rollout) is not the rollout's change alone, so only the image goes back; and a
/// config file a person changed again since is theirs.
#[test]
fn a_revert_puts_back_only_the_image_when_the_commit_was_more_than_its_config() {
    for also in [
        ("apps/web/web.yaml", Some("kind: Deployment\n# changed\n")),
        ("elsewhere/config.yaml", Some(CONFIG_V2)),
    ] {
        let (r, mut w) = repo_with_image_and_config_in_one_commit(&[also]);
        w.revert(&redis_revert()).unwrap();
        assert!(show(&r.bare, "main:apps/redis.yaml").contains("redis:7.2"));
        assert_eq!(
            show(&r.bare, "main:apps/redis-config.yaml"),
            CONFIG_V2.trim_end(),
            "{also:?}"
        );
        assert_eq!(
            show(&r.bare, "main:apps/redis-auth.yaml"),
            SECRET.trim_end(),
            "{also:?}"
        );
    }
    let (r, mut w) = repo_with_image_and_config_in_one_commit(&[]);
    let edited = CONFIG_V2.replace("maxmemory: 0", "maxmemory: 2gb");
    human_commit_files(&r, &[("apps/redis-config.yaml", Some(&edited))], "tune");
    w.revert(&redis_revert()).unwrap();
    assert_eq!(
        show(&r.bare, "main:apps/redis-config.yaml"),
        edited.trim_end()
    );
    let files = git(&r.bare, &["ls-tree", "-r", "--name-only", "main"]);
    assert!(
        !files.contains("apps/redis-auth.yaml"),
        "unchanged since: it goes"
    );
}

/// Issue 73: the agents of a fleet push their clusters' status files to one branch at once.
/// Three writers, one per cluster, push 100 times in all over smart HTTP, every file new
/// each time: every push lands (its commit is on the branch), none is forced, and each
/// cluster's files end as its last push left them. Before the fix, a push that lost the
/// host's ref lock to another (receive-pack's "failed to update ref") was refused, not
/// written again on the new tip.
#[test]
fn three_clusters_pushing_one_branch_at_once_lose_no_push() {
    let r = repo();
    let base = git_http::serve(r.tmp.path().to_path_buf(), Some(("git", "t0ken")));
    let url = format!("{base}/remote.git");
    let token = r.tmp.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let clusters = ["eu-1", "eu-2", "us-1"];
    let writers: Vec<_> = clusters
        .iter()
        .enumerate()
        .map(|(i, cluster)| {
            let mut w = StatusWriter::open(
                &r.tmp.path().join(format!("cache-{cluster}")),
                GitRemote {
                    url: url.clone(),
                    branch: "linnet/status".into(),
                    auth: GitAuth::Basic {
                        username: "git".into(),
                        password_file: token.clone(),
                    },
                },
                "linnet",
                "linnet@example.invalid",
            )
            .unwrap();
            let (cluster, pushes) = (cluster.to_string(), if i == 0 { 34 } else { 33 });
            std::thread::spawn(move || {
                let (mut commits, mut retries) = (Vec::new(), 0);
                for round in 0..pushes {
                    let files: Vec<StatusFile> = ["web", "redis"]
                        .iter()
                        .map(|name| StatusFile {
                            path: linnet::writeback::status_files::path(&cluster, "shop", name),
                            replaces: Vec::new(),
                            content: format!("cluster: {cluster}\nround: {round}\n"),
                            summary: format!("{cluster} shop/{name} round {round}"),
                        })
                        .collect();
                    // As the agent's write-back loop does: a write that lost every race of
                    // its round is written again at the next interval.
                    let mut rounds_lost = 0;
                    loop {
                        match w.write(&files) {
                            Ok(Pushed::Committed { commit, retries: n }) => {
                                commits.push(commit.to_string());
                                retries += n;
                                break;
                            }
                            Ok(Pushed::Unchanged) => {
                                panic!("{cluster} round {round}: nothing pushed")
                            }
                            Err(linnet::writeback::push::WriteError::KeptMoving { tries }) => {
                                retries += tries;
                                rounds_lost += 1;
                                eprintln!("{cluster} round {round}: every try of the round lost");
                                assert!(rounds_lost < 5, "{cluster} round {round}: lost 5 rounds");
                            }
                            Err(e) => panic!("{cluster} round {round}: {e}"),
                        }
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                    // The write-back interval (the tests' agents use 300 ms).
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                (commits, retries)
            })
        })
        .collect();
    let (mut pushed, mut retries) = (Vec::new(), 0);
    for w in writers {
        let (commits, n) = w.join().unwrap();
        pushed.extend(commits);
        retries += n;
    }
    assert_eq!(pushed.len(), 100);
    // Each push's commit is on the branch: nothing was overwritten or forced away.
    let on_branch: std::collections::BTreeSet<String> =
        git(&r.bare, &["rev-list", "linnet/status"])
            .lines()
            .map(str::to_string)
            .collect();
    for c in &pushed {
        assert!(on_branch.contains(c), "commit {c} is not on the branch");
    }
    assert_eq!(on_branch.len(), 100, "one commit per push, no more");
    for (i, cluster) in clusters.iter().enumerate() {
        let last = if i == 0 { 33 } else { 32 };
        for name in ["web", "redis"] {
            let path = linnet::writeback::status_files::path(cluster, "shop", name);
            assert_eq!(
                show(&r.bare, &format!("linnet/status:{path}")),
                format!("cluster: {cluster}\nround: {last}")
            );
        }
    }
    // They raced: some pushes were redone on a new tip.
    eprintln!("100 pushes, {retries} redone on a new tip");
    assert!(retries > 0, "the three writers never raced");
}
