//! The Git source against real repositories: a bare repository served over `file://`, pushed
//! to with the `git` command line as a user would.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};

use linnet::source::git::{GitAuth, GitError, GitMirror, GitRemote};
use linnet::source::snapshot::SpecSnapshot;
use linnet::specs::LoadOptions;
use support::{git, git_http};

/// A bare "remote" and a working clone of it, seeded with the example repository.
struct Fixture {
    _tmp: tempfile::TempDir,
    bare: PathBuf,
    work: PathBuf,
    cache: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let bare = tmp.path().join("remote.git");
        let work = tmp.path().join("work");
        std::fs::create_dir_all(&bare).unwrap();
        git(&bare, &["init", "--bare", "-q"]);
        git(tmp.path(), &["clone", "-q", bare.to_str().unwrap(), "work"]);
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gitops-repo");
        // The plain YAML of the example: rendering has its own tests (tests/render.rs).
        copy_dir(&example.join("apps"), &work.join("apps"));
        std::fs::copy(example.join("README.md"), work.join("README.md")).unwrap();
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "-qm", "seed"]);
        git(&work, &["push", "-q", "origin", "HEAD:main"]);
        Fixture {
            cache: tmp.path().join("cache"),
            _tmp: tmp,
            bare,
            work,
        }
    }

    fn remote(&self) -> GitRemote {
        GitRemote {
            url: format!("file://{}", self.bare.display()),
            branch: "main".into(),
            auth: GitAuth::Anonymous,
        }
    }

    fn commit(&self, path: &str, content: &str, message: &str) -> String {
        let file = self.work.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, content).unwrap();
        git(&self.work, &["add", "-A"]);
        git(&self.work, &["commit", "-qm", message]);
        git(&self.work, &["push", "-q", "origin", "HEAD:main"]);
        git(&self.work, &["rev-parse", "HEAD"])
    }
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

fn snapshot_update(
    mirror: &GitMirror,
    snap: &mut SpecSnapshot,
    tip: git2::Oid,
) -> linnet::source::snapshot::SnapshotUpdate {
    let listing = mirror.list_files(tip, "").unwrap();
    snap.update(
        &listing,
        |_, id| mirror.read_spec_file(id, 1024 * 1024),
        &LoadOptions::default(),
    )
    .unwrap()
}

#[test]
fn remote_tip_is_read_without_fetching_and_a_fetch_brings_the_specs() {
    let f = Fixture::new();
    let head = git(&f.work, &["rev-parse", "HEAD"]);
    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    assert_eq!(mirror.remote_tip().unwrap().to_string(), head);
    assert_eq!(
        mirror.local_tip(),
        None,
        "asking for the tip must not fetch"
    );

    let tip = mirror.fetch().unwrap();
    assert_eq!(tip.to_string(), head);
    let mut snap = SpecSnapshot::default();
    let update = snapshot_update(&mirror, &mut snap, tip);
    assert_eq!(update.parsed, 3);
    assert_eq!(snap.spec_set().objects.len(), 4);
}

#[test]
fn a_status_only_commit_changes_no_spec() {
    let f = Fixture::new();
    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    let mut snap = SpecSnapshot::default();
    snapshot_update(&mirror, &mut snap, mirror.fetch().unwrap());

    f.commit(
        ".linnet/status/demo/redis.yaml",
        "phase: Stable\n",
        "linnet: status",
    );
    let tip = mirror.fetch().unwrap();
    let update = snapshot_update(&mirror, &mut snap, tip);
    assert!(
        !update.changed,
        "a status-only commit must not start a sync"
    );
    assert_eq!(update.parsed, 0);

    f.commit(
        "apps/extra.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n",
        "add extra",
    );
    let update = snapshot_update(&mirror, &mut snap, mirror.fetch().unwrap());
    assert!(update.changed);
    assert_eq!(update.parsed, 1, "only the new file is parsed");
}

/// The tree diff a Git source reads each revision with says exactly what the two whole
/// listings differ in, for every kind of change, at the root and below a path.
#[test]
fn the_tree_diff_equals_the_difference_of_two_listings() {
    use std::collections::BTreeMap;
    let f = Fixture::new();
    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    let mut revisions = vec![mirror.fetch().unwrap()];
    let mut step = |change: &dyn Fn(&Path), message: &str| {
        change(&f.work);
        git(&f.work, &["add", "-A"]);
        git(&f.work, &["commit", "-qm", message, "--allow-empty"]);
        git(&f.work, &["push", "-q", "origin", "HEAD:main"]);
        revisions.push(mirror.fetch().unwrap());
    };
    let write = |rel: &'static str, text: &'static str| {
        move |work: &Path| {
            let file = work.join(rel);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
    };
    step(&write("apps/web/web.yaml", "changed: 1\n"), "change a file");
    let shape = linnet::specs::RevisionShape::default();
    step(&write("apps/new/deep/a.yaml", "a: 1\n"), "add a directory");
    step(
        &write(".linnet/status/demo/web.yaml", "phase: Stable\n"),
        "status only",
    );
    step(
        &write("apps/.hidden/x.yaml", "x: 1\n"),
        "a hidden directory",
    );
    step(
        &|work: &Path| std::fs::remove_dir_all(work.join("apps/new")).unwrap(),
        "remove a directory",
    );
    step(
        &|work: &Path| {
            std::os::unix::fs::symlink("web/web.yaml", work.join("apps/link.yaml")).unwrap()
        },
        "add a link",
    );
    step(
        &|work: &Path| {
            std::fs::remove_dir_all(work.join("apps/redis")).unwrap();
            std::fs::write(work.join("apps/redis"), "now a file\n").unwrap();
        },
        "a directory becomes a file",
    );
    step(
        &|work: &Path| std::fs::remove_dir_all(work.join("apps")).unwrap(),
        "remove the spec path",
    );
    step(&write("apps/back.yaml", "b: 1\n"), "the spec path is back");
    let mut changes = 0;
    for path in ["", "apps", "apps/web"] {
        for pair in revisions
            .windows(2)
            .chain([[revisions[0], revisions[revisions.len() - 1]].as_slice()])
        {
            let (from, to) = (pair[0], pair[1]);
            let old: BTreeMap<_, _> = mirror.list_files(from, path).unwrap().into_iter().collect();
            let new: BTreeMap<_, _> = mirror.list_files(to, path).unwrap().into_iter().collect();
            let mut want: Vec<(String, Option<String>)> = old
                .keys()
                .filter(|p| !new.contains_key(*p))
                .map(|p| (p.clone(), None))
                .chain(
                    new.iter()
                        .filter(|(p, id)| old.get(*p) != Some(id))
                        .map(|(p, id)| (p.clone(), Some(id.clone()))),
                )
                .collect();
            let mut got = mirror
                .changed_files(from, to, path, &shape)
                .unwrap()
                .unwrap();
            want.sort();
            got.sort();
            assert_eq!(got, want, "path {path:?}, {from} -> {to}");
            changes += got.len();
        }
    }
    assert!(changes > 20, "the revisions change files: {changes}");
}

/// A tree nested deeper than any spec repository is left to the whole listing, which still
/// finds its file: the diff recurses per level, and a hostile push must not exhaust it.
#[test]
fn a_tree_nested_too_deep_for_the_diff_is_listed_whole() {
    let shape = linnet::specs::RevisionShape::default();
    let f = Fixture::new();
    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    let seed = mirror.fetch().unwrap();
    let deep = format!("apps/{}deep.yaml", "d/".repeat(100));
    f.commit(&deep, "kind: ConfigMap\n", "nest a file 100 trees deep");
    let tip = mirror.fetch().unwrap();
    assert_eq!(mirror.changed_files(seed, tip, "", &shape).unwrap(), None);
    assert!(
        mirror
            .list_files(tip, "")
            .unwrap()
            .iter()
            .any(|(path, _)| *path == deep)
    );
    let shallow = mirror.changed_files(seed, tip, &format!("apps/{}", "d/".repeat(50)), &shape);
    assert_eq!(
        shallow.unwrap().unwrap().len(),
        1,
        "50 trees below the path is in reach"
    );
}

/// A `--path` that names a file lists no specs (the sync then says "no specs found" and names
/// the path), and the diff agrees.
#[test]
fn a_spec_path_that_names_a_file_lists_nothing() {
    let shape = linnet::specs::RevisionShape::default();
    let f = Fixture::new();
    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    let tip = mirror.fetch().unwrap();
    let file = "apps/web/web.yaml";
    assert_eq!(mirror.list_files(tip, file).unwrap(), Vec::new());
    assert_eq!(
        mirror.changed_files(tip, tip, file, &shape).unwrap(),
        Some(Vec::new())
    );
}

#[test]
fn a_force_push_is_just_a_new_tip() {
    let f = Fixture::new();
    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    let first = f.commit(
        "apps/a.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n",
        "a",
    );
    assert_eq!(mirror.fetch().unwrap().to_string(), first);

    // Rewrite history: drop the commit and push something else in its place.
    git(&f.work, &["reset", "-q", "--hard", "HEAD~1"]);
    std::fs::write(
        f.work.join("apps/b.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n",
    )
    .unwrap();
    git(&f.work, &["add", "-A"]);
    git(&f.work, &["commit", "-qm", "b instead"]);
    git(&f.work, &["push", "-q", "--force", "origin", "HEAD:main"]);
    let rewritten = git(&f.work, &["rev-parse", "HEAD"]);

    assert_eq!(mirror.remote_tip().unwrap().to_string(), rewritten);
    let tip = mirror.fetch().unwrap();
    assert_eq!(tip.to_string(), rewritten);
    let files: Vec<String> = mirror
        .list_files(tip, "apps")
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert!(files.contains(&"b.yaml".to_string()), "{files:?}");
    assert!(!files.contains(&"a.yaml".to_string()), "{files:?}");
}

#[test]
fn a_remote_that_goes_away_is_an_error_and_recovers_when_it_returns() {
    let f = Fixture::new();
    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    let tip = mirror.fetch().unwrap();

    let hidden = f.bare.with_extension("away");
    std::fs::rename(&f.bare, &hidden).unwrap();
    let err = mirror.remote_tip().unwrap_err();
    // The path holds no repository any more: not found, not unreachable (issue 47).
    assert!(matches!(err, GitError::NotFound { .. }), "{err:?}");
    assert!(mirror.fetch().is_err());
    // The last good state is still there.
    assert_eq!(mirror.local_tip(), Some(tip));

    std::fs::rename(&hidden, &f.bare).unwrap();
    assert_eq!(mirror.remote_tip().unwrap(), tip);
}

#[test]
fn a_corrupted_cache_is_cloned_again() {
    let f = Fixture::new();
    {
        let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
        mirror.fetch().unwrap();
    }
    // Trash the cache: no HEAD, garbage config.
    std::fs::remove_file(f.cache.join("HEAD")).unwrap();
    std::fs::write(f.cache.join("config"), "this is not a git config [[[").unwrap();

    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    let tip = mirror.fetch().unwrap();
    assert_eq!(tip.to_string(), git(&f.work, &["rev-parse", "HEAD"]));
}

#[test]
fn a_missing_branch_is_named() {
    let f = Fixture::new();
    let mut remote = f.remote();
    remote.branch = "release".into();
    let mirror = GitMirror::open(&f.cache, remote).unwrap();
    let err = mirror.remote_tip().unwrap_err();
    assert!(
        err.to_string()
            .contains("branch \"release\" does not exist"),
        "{err}"
    );
}

#[test]
fn https_style_auth_with_a_token_file_over_smart_http() {
    let f = Fixture::new();
    let root = f.bare.parent().unwrap().to_path_buf();
    let base = git_http::serve(root, Some(("git", "t0ken")));
    let token_file = f._tmp.path().join("token");
    std::fs::write(&token_file, "wrong\n").unwrap();
    let remote = GitRemote {
        url: format!("{base}/remote.git"),
        branch: "main".into(),
        auth: GitAuth::Basic {
            username: "git".into(),
            password_file: token_file.clone(),
        },
    };
    let mirror = GitMirror::open(&f.cache, remote).unwrap();
    let err = mirror.remote_tip().unwrap_err();
    assert!(matches!(err, GitError::Auth { .. }), "{err:?}");
    assert!(mirror.fetch().is_err());

    // The token file is read on every connection, so a rotated Secret takes effect at once.
    std::fs::write(&token_file, "t0ken\n").unwrap();
    let head = git(&f.work, &["rev-parse", "HEAD"]);
    assert_eq!(mirror.remote_tip().unwrap().to_string(), head);
    let tip = mirror.fetch().unwrap();
    assert_eq!(tip.to_string(), head);
    assert!(!mirror.list_files(tip, "apps").unwrap().is_empty());

    // A force push over the same transport.
    let rewritten = f.commit(
        "apps/c.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n",
        "c",
    );
    assert_eq!(mirror.fetch().unwrap().to_string(), rewritten);
}

#[test]
fn an_unresolvable_host_and_a_refused_connection_say_which() {
    let dir = tempfile::tempdir().unwrap();
    let port = support::ports::free_port();
    for (url, label, words) in [
        (
            "https://git.linnet.invalid/acme/gitops.git".to_string(),
            "dns",
            "does not resolve",
        ),
        (
            format!("https://127.0.0.1:{port}/acme/gitops.git"),
            "connection_refused",
            "refused",
        ),
    ] {
        let remote = GitRemote {
            url,
            branch: "main".into(),
            auth: GitAuth::Anonymous,
        };
        let mirror = GitMirror::open(&dir.path().join(label), remote).unwrap();
        let err = mirror.remote_tip().unwrap_err();
        assert_eq!(err.label(), label, "{err}");
        assert!(err.to_string().contains(words), "{err}");
    }
}

/// Issue 47: a URL the host answers with 404 was reported as "cannot reach"; the host was
/// reached, and said there is no such repository. So is a path with no repository.
#[test]
fn a_repository_that_is_not_there_is_not_found_not_unreachable() {
    let f = Fixture::new();
    let server = git_http::serve(f._tmp.path().to_path_buf(), None);
    let missing_path = f._tmp.path().join("no-such-repository");
    for url in [
        format!("{server}/no-such-repository.git"),
        missing_path.display().to_string(),
    ] {
        let remote = GitRemote {
            url: url.clone(),
            branch: "main".into(),
            auth: GitAuth::Anonymous,
        };
        let dir = tempfile::tempdir().unwrap();
        let err = GitMirror::open(&dir.path().join("mirror"), remote)
            .and_then(|mirror| mirror.remote_tip())
            .unwrap_err();
        assert_eq!(err.label(), "not_found", "{url}: {err}");
        assert!(
            err.to_string()
                .starts_with(&format!("there is no Git repository at {url}")),
            "{err}"
        );
    }
}

/// A damaged object in the mirror is an error, never content. libgit2 hashes each object it
/// reads again; that stays on: zlib's own checksum covers only an object's compressed bytes,
/// and a damaged pack index could hand back another, well-formed object.
#[test]
fn a_damaged_object_in_the_mirror_is_an_error_not_content() {
    let f = Fixture::new();
    let mut spec = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n");
    for i in 0..200 {
        spec.push_str(&format!(
            "  key{i}: \"value {i} of a file large enough to damage\"\n"
        ));
    }
    let tip = f.commit("apps/big.yaml", &spec, "big");
    let blob = git(&f.work, &["rev-parse", &format!("{tip}:apps/big.yaml")]);
    // Over smart HTTP, so that the mirror holds the objects (a repository on this machine is
    // read in place).
    let server = git_http::serve(f._tmp.path().to_path_buf(), None);
    let remote = GitRemote {
        url: format!("{server}/remote.git"),
        ..f.remote()
    };
    let mirror = GitMirror::open(&f.cache, remote.clone()).unwrap();
    mirror.fetch().unwrap();
    let read = |m: &GitMirror| m.read_spec_file(&blob, 1 << 20);
    assert!(matches!(
        read(&mirror),
        Ok(linnet::specs::FileContent::Bytes(b)) if b == spec.as_bytes()
    ));
    drop(mirror);

    // Flip one byte in the middle of the blob's compressed data, where `git verify-pack` puts it.
    let packs = f.cache.join("objects/pack");
    let pack = std::fs::read_dir(&packs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "pack"))
        .expect("a pack in the mirror");
    let listing = git(&packs, &["verify-pack", "-v", pack.to_str().unwrap()]);
    let entry: Vec<&str> = listing
        .lines()
        .find(|l| l.starts_with(&blob))
        .expect("the blob in the pack")
        .split_whitespace()
        .collect();
    let (size_in_pack, offset): (u64, u64) = (entry[3].parse().unwrap(), entry[4].parse().unwrap());
    assert!(size_in_pack > 64, "compressed data to damage: {entry:?}");
    let mut bytes = std::fs::read(&pack).unwrap();
    let at = usize::try_from(offset + size_in_pack / 2).unwrap();
    bytes[at] ^= 0x55;
    // libgit2 writes packs read-only.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pack, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&pack, bytes).unwrap();

    let mirror = GitMirror::open_existing(&f.cache, remote).unwrap();
    match read(&mirror) {
        Err(_) => {}
        Ok(other) => panic!("a damaged object was read as {other:?}"),
    }
}

/// Writes a commit on `main` of the bare `repo` whose root holds the example's `apps/` tree
/// and `extra` (name, tree id) entries; returns its id.
fn commit_with_trees(repo: &git2::Repository, extra: &[(&str, git2::Oid)]) -> git2::Oid {
    let head = repo.refname_to_id("refs/heads/main").unwrap();
    let parent = repo.find_commit(head).unwrap();
    let mut root = repo.treebuilder(Some(&parent.tree().unwrap())).unwrap();
    for (name, id) in extra {
        root.insert(name, *id, 0o040000).unwrap();
    }
    let tree = repo.find_tree(root.write().unwrap()).unwrap();
    let sig = git2::Signature::now("t", "t@example.invalid").unwrap();
    repo.commit(
        Some("refs/heads/main"),
        &sig,
        &sig,
        "shape",
        &tree,
        &[&parent],
    )
    .unwrap()
}

/// A tree of `n` entries `f0.yaml`... each naming `id` with `mode`.
fn wide_tree(repo: &git2::Repository, n: usize, id: git2::Oid, mode: i32) -> git2::Oid {
    let mut b = repo.treebuilder(None).unwrap();
    for i in 0..n {
        b.insert(format!("f{i}.yaml"), id, mode).unwrap();
    }
    b.write().unwrap()
}

/// `make bench` found a one-file push to 10,000 spec files in one directory (the entry limit
/// of a directory) no longer diffed: the diff's bound (20,000) counted both trees, 20,002
/// entries, and left every such push to a whole listing. The bound follows
/// `--max-tree-entries`, so a raised limit is diffed too; a push past it is listed whole.
#[test]
fn a_one_file_push_to_a_directory_at_the_entry_limit_is_diffed() {
    use linnet::specs::RevisionShape;
    let f = Fixture::new();
    let repo = git2::Repository::open_bare(&f.bare).unwrap();
    let blob = repo.blob(b"kind: ConfigMap\n").unwrap();
    let changed = repo.blob(b"kind: ConfigMap\nchanged: true\n").unwrap();
    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    let raised = RevisionShape {
        max_tree_entries: 15_000,
        ..RevisionShape::default()
    };
    for shape in [RevisionShape::default(), raised] {
        let full = wide_tree(&repo, shape.max_tree_entries, blob, 0o100644);
        let before = commit_with_trees(&repo, &[("many", full)]);
        let mut b = repo
            .treebuilder(Some(&repo.find_tree(full).unwrap()))
            .unwrap();
        b.insert("f7.yaml", changed, 0o100644).unwrap();
        let after = commit_with_trees(&repo, &[("many", b.write().unwrap())]);
        assert_eq!(mirror.fetch().unwrap(), after);
        assert_eq!(
            mirror.changed_files(before, after, "", &shape).unwrap(),
            Some(vec![(
                "many/f7.yaml".to_string(),
                Some(changed.to_string())
            )]),
            "a one-file push at {} entries is diffed, not listed whole",
            shape.max_tree_entries
        );
        // Past the bound the diff gives up (the listing then blocks the directory).
        let small = RevisionShape {
            max_tree_entries: shape.max_tree_entries / 4 - 1,
            ..shape
        };
        assert_eq!(
            mirror.changed_files(before, after, "", &small).unwrap(),
            None
        );
    }
}

/// Issue 45: a tree bomb (two trees of 1,000 entries, ~100 KB pushed) listed a million
/// files: 102 s, 2.2 GB and a million spec errors. A listing is bounded by the revision's
/// shape, charged per directory: the bomb is one blocked entry, its neighbours are listed.
#[test]
fn a_tree_bomb_is_one_blocked_directory_and_its_neighbours_are_listed() {
    let f = Fixture::new();
    let repo = git2::Repository::open_bare(&f.bare).unwrap();
    let blob = repo
        .blob(b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
        .unwrap();
    let inner = wide_tree(&repo, 1000, blob, 0o100644);
    let bomb = wide_tree(&repo, 1000, inner, 0o040000);
    let flat = wide_tree(&repo, 20_000, blob, 0o100644);
    let tip = commit_with_trees(&repo, &[("bomb", bomb), ("flat", flat)]);
    let mirror = GitMirror::open(&f.cache, f.remote()).unwrap();
    assert_eq!(mirror.fetch().unwrap(), tip);
    let started = std::time::Instant::now();
    let listing = mirror
        .list_files_within(tip, "", &linnet::specs::RevisionShape::default())
        .unwrap();
    println!("listed in {:?}", started.elapsed());
    let blocked: Vec<&(String, String)> = listing
        .iter()
        .filter(|(_, id)| id.starts_with(linnet::source::git::BLOCKED))
        .collect();
    assert_eq!(
        blocked.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(),
        ["bomb/", "flat/"],
        "{blocked:?}"
    );
    assert!(
        blocked[0].1.contains("1000000 files below it")
            && blocked[0].1.contains("991 subdirectories"),
        "{}",
        blocked[0].1
    );
    assert!(
        blocked[1].1.contains("20000 entries in one directory"),
        "{}",
        blocked[1].1
    );
    // Every file of the example is still listed.
    let example = mirror.list_files(tip, "apps").unwrap().len();
    assert!(example > 0);
    assert_eq!(
        listing
            .iter()
            .filter(|(p, _)| p.starts_with("apps/"))
            .count(),
        example
    );
    // Three directories of 600 files and a limit of 1,000 files: from the smallest, what fits
    // is listed (by name on a tie); the rest is blocked, never the small ones.
    let mid = wide_tree(&repo, 600, blob, 0o100644);
    let small = wide_tree(&repo, 10, blob, 0o100644);
    let tip = commit_with_trees(&repo, &[("a", mid), ("b", mid), ("c", mid), ("z", small)]);
    assert_eq!(mirror.fetch().unwrap(), tip);
    let shape = linnet::specs::RevisionShape {
        max_files: 1000,
        max_tree_entries: 10_000,
    };
    let listing = mirror.list_files_within(tip, "", &shape).unwrap();
    let mut blocked: Vec<&str> = listing
        .iter()
        .filter(|(_, id)| id.starts_with(linnet::source::git::BLOCKED))
        .map(|(p, _)| p.as_str())
        .collect();
    blocked.sort();
    // (The bomb and the flat directory of the commit before are still there.)
    assert_eq!(blocked, ["b/", "bomb/", "c/", "flat/"]);
    let under = |dir: &str| listing.iter().filter(|(p, _)| p.starts_with(dir)).count();
    assert_eq!((under("z/"), under("a/")), (10, 600));
    assert!(listing.len() <= 1000 + blocked.len());
}

/// The commits a shallow mirror holds as boundaries (their parents not fetched).
fn shallow_boundary(cache: &Path) -> Vec<String> {
    std::fs::read_to_string(cache.join("shallow"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `git-upload-pack` requests the server at `root` has had: a fetch's rounds of negotiation.
fn upload_pack_posts(root: &Path) -> usize {
    std::fs::read_to_string(root.join("requests.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("POST ") && l.ends_with("/git-upload-pack"))
        .count()
}

/// Issue 77: libgit2 negotiates a shallow fetch in a round of its own, so each push cost two
/// upload-pack requests (each a process on the host, and a delayed ACK) where `git fetch`
/// needs one. A push on the last tip is now fetched without depth, with the mirror's ref tips
/// as its only `have`s: one request, also after more commits than the 20 `have`s of a round.
/// A rewritten history too large for one round is stopped at the pack's header and fetched
/// shallow; range verification keeps the shallow fetch.
#[test]
fn a_push_on_the_last_tip_is_fetched_in_one_round() {
    let f = Fixture::new();
    let root = f._tmp.path().to_path_buf();
    let server = git_http::serve(root.clone(), None);
    let remote = GitRemote {
        url: format!("{server}/remote.git"),
        ..f.remote()
    };
    let mirror = GitMirror::open(&f.cache, remote).unwrap();
    // The first fetch is shallow: nothing to build on.
    let before = upload_pack_posts(&root);
    let mut previous = mirror.fetch_new_tip(false).unwrap();
    assert_eq!(
        upload_pack_posts(&root) - before,
        2,
        "the first fetch is shallow"
    );
    let mut one_round = |mirror: &GitMirror, expected: &str, what: &str| {
        let before = upload_pack_posts(&root);
        let tip = mirror.fetch_new_tip(false).unwrap();
        assert_eq!(tip.to_string(), expected, "{what}");
        assert_eq!(upload_pack_posts(&root) - before, 1, "{what}: one round");
        assert_eq!(
            mirror.descends_from(tip, previous, false).unwrap(),
            Some(true),
            "{what}"
        );
        previous = tip;
    };
    for i in 0..25 {
        let commit = f.commit(&format!("apps/n{i}.txt"), "x", &format!("n{i}"));
        one_round(&mirror, &commit, &format!("push {i}"));
    }
    git(&f.work, &["checkout", "-qb", "feature"]);
    std::fs::write(f.work.join("apps/feature.txt"), "f").unwrap();
    git(&f.work, &["add", "-A"]);
    git(&f.work, &["commit", "-qm", "on a branch"]);
    git(&f.work, &["checkout", "-q", "-"]);
    f.commit("apps/main.txt", "m", "on main meanwhile");
    one_round(&mirror, &git(&f.work, &["rev-parse", "HEAD"]), "main");
    git(
        &f.work,
        &["merge", "-q", "--no-ff", "-m", "Merge", "feature"],
    );
    git(&f.work, &["push", "-q", "origin", "HEAD:main"]);
    one_round(&mirror, &git(&f.work, &["rev-parse", "HEAD"]), "a merge");

    // Another history of 1,100 files: more than one round takes.
    git(&f.work, &["checkout", "-q", "--orphan", "other"]);
    for i in 0..1100 {
        std::fs::write(f.work.join(format!("apps/big-{i}.txt")), i.to_string()).unwrap();
    }
    git(&f.work, &["add", "-A"]);
    git(&f.work, &["commit", "-qm", "another history"]);
    git(&f.work, &["push", "-qf", "origin", "HEAD:main"]);
    let rewritten = git(&f.work, &["rev-parse", "HEAD"]);
    let before = upload_pack_posts(&root);
    let tip = mirror.fetch_new_tip(false).unwrap();
    assert_eq!(tip.to_string(), rewritten);
    assert_eq!(
        upload_pack_posts(&root) - before,
        3,
        "stopped after one round, then fetched shallow (two)"
    );
    assert!(shallow_boundary(&f.cache).contains(&rewritten));
    assert_eq!(
        mirror.descends_from(tip, previous, false).unwrap(),
        Some(false)
    );

    // Range verification: shallow, as before (descends_from then fetches deeper).
    let next = f.commit("apps/after.txt", "a", "after");
    let before = upload_pack_posts(&root);
    assert_eq!(mirror.fetch_new_tip(true).unwrap().to_string(), next);
    assert_eq!(upload_pack_posts(&root) - before, 2);
}

/// Issue 77: push to update doubled because every push was fetched twice over HTTP: the tip at
/// depth 1, then 64 commits deeper to tell a fast-forward from a rewrite, since the shallow
/// tip's parents are hidden from the graph. One commit, or a pull request's merge, on top of
/// the last tip is now told from the tip's own object; the mirror fetches once. Two commits,
/// and any push with range verification, still fetch deeper; a rewrite is still a rewrite.
#[test]
fn a_commit_or_a_merge_on_the_last_tip_is_read_with_one_fetch() {
    let f = Fixture::new();
    for i in 0..20 {
        f.commit(&format!("notes/{i}.txt"), "x", &format!("note {i}"));
    }
    let server = git_http::serve(f._tmp.path().to_path_buf(), None);
    let remote = GitRemote {
        url: format!("{server}/remote.git"),
        ..f.remote()
    };
    let mirror = GitMirror::open(&f.cache, remote).unwrap();
    let mut previous = mirror.fetch().unwrap();
    let mut fast_forward = |mirror: &GitMirror, whole_range: bool| {
        let started = std::time::Instant::now();
        let tip = mirror.fetch().unwrap();
        let fetched = started.elapsed();
        let told = mirror.descends_from(tip, previous, whole_range).unwrap();
        println!(
            "fetch {fetched:?}, then told in {:?}",
            started.elapsed() - fetched
        );
        assert_eq!(told, Some(true));
        previous = tip;
        tip.to_string()
    };

    let one = f.commit("apps/one.txt", "1", "one");
    assert_eq!(fast_forward(&mirror, false), one);
    assert!(shallow_boundary(&f.cache).contains(&one), "fetched deeper");

    git(&f.work, &["checkout", "-qb", "feature"]);
    std::fs::write(f.work.join("apps/two.txt"), "2").unwrap();
    git(&f.work, &["add", "-A"]);
    git(&f.work, &["commit", "-qm", "two on a branch"]);
    git(&f.work, &["checkout", "-q", "-"]);
    git(
        &f.work,
        &["merge", "-q", "--no-ff", "-m", "Merge feature", "feature"],
    );
    git(&f.work, &["push", "-q", "origin", "HEAD:main"]);
    let merge = git(&f.work, &["rev-parse", "HEAD"]);
    assert_eq!(fast_forward(&mirror, false), merge);
    assert!(
        shallow_boundary(&f.cache).contains(&merge),
        "fetched deeper"
    );

    // Range verification reads every new commit: the graph must hold them.
    let three = f.commit("apps/three.txt", "3", "three");
    assert_eq!(fast_forward(&mirror, true), three);
    assert!(
        !shallow_boundary(&f.cache).contains(&three),
        "not fetched deeper"
    );
    f.commit("apps/four.txt", "4", "four");
    let five = f.commit("apps/five.txt", "5", "five");
    assert_eq!(fast_forward(&mirror, false), five);
    assert!(
        !shallow_boundary(&f.cache).contains(&five),
        "not fetched deeper"
    );

    // A force push on top of an older commit is no fast-forward.
    git(&f.work, &["reset", "-q", "--hard", &one]);
    std::fs::write(f.work.join("apps/other.txt"), "o").unwrap();
    git(&f.work, &["add", "-A"]);
    git(&f.work, &["commit", "-qm", "another history"]);
    git(&f.work, &["push", "-qf", "origin", "HEAD:main"]);
    let rewritten = git(&f.work, &["rev-parse", "HEAD"]);
    let tip = mirror.fetch().unwrap();
    assert_eq!(tip.to_string(), rewritten);
    assert_eq!(
        mirror.descends_from(tip, previous, false).unwrap(),
        Some(false)
    );
}
