//! Tests of the status writer's commits and pushes, on real repositories.

#![allow(clippy::unwrap_used)]
use super::*;
use crate::source::git::GitAuth;

fn commit_on(repo: &git2::Repository, parent: Option<Oid>, file: &str) -> Oid {
    let mut index = Index::new().unwrap();
    if let Some(p) = parent {
        index
            .read_tree(&repo.find_commit(p).unwrap().tree().unwrap())
            .unwrap();
    }
    let blob = repo.blob(file.as_bytes()).unwrap();
    index.add(&entry(file, file.len(), blob)).unwrap();
    let tree = repo.find_tree(index.write_tree_to(repo).unwrap()).unwrap();
    let sig = Signature::now("human", "human@example.invalid").unwrap();
    let parents: Vec<git2::Commit<'_>> = parent
        .map(|p| repo.find_commit(p).unwrap())
        .into_iter()
        .collect();
    let parents: Vec<&git2::Commit<'_>> = parents.iter().collect();
    repo.commit(None, &sig, &sig, file, &tree, &parents)
        .unwrap()
}

/// A writer for branch `main` of the bare repository `remote.git` in `dir`, at `tip`.
fn writer_at(dir: &Path, bare: &git2::Repository, tip: Oid) -> StatusWriter {
    bare.reference("refs/heads/main", tip, true, "seed")
        .unwrap();
    let remote = GitRemote {
        url: format!("file://{}", dir.join("remote.git").display()),
        branch: "main".into(),
        auth: GitAuth::Anonymous,
    };
    StatusWriter::open(&dir.join("clone"), remote, "linnet", "l@x").unwrap()
}

#[test]
fn a_human_push_after_the_tip_was_read_is_never_overwritten_on_a_local_remote() {
    // Issue 26: libgit2's local transport checked fast-forward against the tip it read at
    // connect, so a push landing after that was overwritten.
    let dir = tempfile::tempdir().unwrap();
    let bare = git2::Repository::init_bare(dir.path().join("remote.git")).unwrap();
    let first = commit_on(&bare, None, "specs.yaml");
    let writer = writer_at(dir.path(), &bare, first);
    let tip = writer.mirror.fetch().unwrap();
    assert_eq!(tip, first);
    let file = StatusFile {
        path: ".linnet/status/a.yaml".into(),
        content: "phase: Stable\n".into(),
        summary: "a Stable".into(),
        replaces: Vec::new(),
    };
    let ours = writer.commit_on(Some(tip), &[file]).unwrap().unwrap();
    // The human's push lands after linnet read the tip, before its branch update.
    let human = commit_on(&bare, Some(first), "human.yaml");
    bare.reference("refs/heads/main", human, true, "human push")
        .unwrap();
    assert!(matches!(
        writer.push(ours, Some(tip)).unwrap(),
        PushResult::Stale
    ));
    assert_eq!(bare.refname_to_id("refs/heads/main").unwrap(), human);
    // The retry, built on the human's commit, goes through.
    assert_eq!(writer.mirror.fetch().unwrap(), human);
    let file = StatusFile {
        path: ".linnet/status/a.yaml".into(),
        content: "phase: Stable\n".into(),
        summary: "a Stable".into(),
        replaces: Vec::new(),
    };
    let retried = writer.commit_on(Some(human), &[file]).unwrap().unwrap();
    assert!(matches!(
        writer.push(retried, Some(human)).unwrap(),
        PushResult::Done
    ));
    let now = bare.refname_to_id("refs/heads/main").unwrap();
    assert_eq!(now, retried);
    assert_eq!(bare.find_commit(now).unwrap().parent_id(0).unwrap(), human);
}

#[test]
fn the_pushed_ref_names_only_a_commit_the_remote_accepted() {
    // Regression (CI, stop 64): the dashboard's history read the ref a commit is pushed
    // from, and so showed a commit before (or without) its push.
    let dir = tempfile::tempdir().unwrap();
    let bare = git2::Repository::init_bare(dir.path().join("remote.git")).unwrap();
    let first = commit_on(&bare, None, "specs.yaml");
    let mut writer = writer_at(dir.path(), &bare, first);
    let clone = git2::Repository::open(dir.path().join("clone")).unwrap();
    let file = StatusFile {
        path: ".linnet/status/a.yaml".into(),
        content: "phase: Stable\n".into(),
        summary: "a Stable".into(),
        replaces: Vec::new(),
    };
    let mut pushes = 0;
    let written = writer
        .write_with(&[file], || {
            pushes += 1;
            assert!(clone.refname_to_id(PUSHED_REF).is_err(), "before any push");
            if pushes == 1 {
                // The first push is refused: a human pushed meanwhile.
                let human = commit_on(&bare, Some(first), "human.yaml");
                bare.reference("refs/heads/main", human, true, "human push")
                    .unwrap();
            }
        })
        .unwrap();
    let Pushed::Committed { commit, retries } = written else {
        panic!("{written:?}");
    };
    assert_eq!(retries, 1);
    assert_eq!(bare.refname_to_id("refs/heads/main").unwrap(), commit);
    assert_eq!(clone.refname_to_id(PUSHED_REF).unwrap(), commit);
}

#[test]
fn a_status_write_rebuilds_only_the_trees_on_its_paths() {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(dir.path()).unwrap();
    let a = repo.blob(b"a").unwrap();
    let b = repo.blob(b"b").unwrap();
    let first = tree_with(
        &repo,
        None,
        &[
            ("apps/a.yaml", Some(a)),
            (".linnet/status/ns/a.yaml", Some(a)),
            ("README", Some(b)),
        ],
    )
    .unwrap();
    let first = repo.find_tree(first.0).unwrap();
    let second = tree_with(
        &repo,
        Some(&first),
        &[(".linnet/status/ns/b.yaml", Some(b))],
    )
    .unwrap();
    let second = repo.find_tree(second.0).unwrap();
    let id = |t: &git2::Tree<'_>, p: &str| t.get_path(Path::new(p)).unwrap().id();
    // Untouched subtrees are the very same objects; the new file sits beside the old.
    assert_eq!(id(&first, "apps"), id(&second, "apps"));
    assert_eq!(id(&second, ".linnet/status/ns/a.yaml"), a);
    assert_eq!(id(&second, ".linnet/status/ns/b.yaml"), b);
    assert_eq!(id(&second, "README"), b);
    assert_ne!(id(&first, ".linnet"), id(&second, ".linnet"));
}

#[test]
fn a_removed_file_takes_its_emptied_trees_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(dir.path()).unwrap();
    let a = repo.blob(b"a").unwrap();
    let first = tree_with(
        &repo,
        None,
        &[
            (".linnet/status/ns/a.yaml", Some(a)),
            (".linnet/status/other/b.yaml", Some(a)),
            ("README", Some(a)),
        ],
    )
    .unwrap();
    let first = repo.find_tree(first.0).unwrap();
    let (second, entries) = tree_with(
        &repo,
        Some(&first),
        &[
            (".linnet/status/ns/a.yaml", None),
            (".linnet/status/ns/34/a.yaml", Some(a)),
            (".linnet/status/other/b.yaml", None),
            ("missing/c.yaml", None),
        ],
    )
    .unwrap();
    let second = repo.find_tree(second).unwrap();
    assert_eq!(entries, 2, ".linnet and README");
    let at = |p: &str| second.get_path(Path::new(p)).ok().map(|e| e.id());
    assert_eq!(at(".linnet/status/ns/34/a.yaml"), Some(a));
    assert_eq!(at(".linnet/status/ns/a.yaml"), None);
    assert_eq!(
        at(".linnet/status/other"),
        None,
        "an emptied tree is dropped"
    );
    assert_eq!(
        at("missing"),
        None,
        "removing what is not there adds nothing"
    );
    assert_eq!(at("README"), Some(a));
}

#[test]
fn a_status_file_in_an_old_layout_moves_in_the_commit_that_writes_it() {
    use super::super::status_files::{flat_path, path, unclustered_path};
    let dir = tempfile::tempdir().unwrap();
    let bare = git2::Repository::init_bare(dir.path().join("remote.git")).unwrap();
    let specs = commit_on(&bare, None, "specs.yaml");
    let old = flat_path("default", "redis");
    let flat = commit_on(&bare, Some(specs), &old);
    let before = commit_on(&bare, Some(flat), &unclustered_path("default", "redis"));
    let mut writer = writer_at(dir.path(), &bare, before);
    let file = StatusFile {
        path: path("eu-1", "default", "redis"),
        replaces: vec![unclustered_path("default", "redis"), old.clone()],
        content: "phase: Stable\n".into(),
        summary: "default/redis Stable".into(),
    };
    assert!(matches!(
        writer.write(std::slice::from_ref(&file)).unwrap(),
        Pushed::Committed { .. }
    ));
    let tip = bare.refname_to_id("refs/heads/main").unwrap();
    let tree = bare.find_commit(tip).unwrap().tree().unwrap();
    let at = |p: &str| tree.get_path(Path::new(p)).is_ok();
    assert!(at(".linnet/status/eu-1/default/34/redis.yaml"));
    assert!(!at(&old), "the flat file is gone");
    assert!(
        !at(".linnet/status/default/34/redis.yaml"),
        "the unclustered file is gone"
    );
    assert!(at("specs.yaml"));
    // Moved once: the same file again is no commit.
    assert_eq!(
        writer.write(std::slice::from_ref(&file)).unwrap(),
        Pushed::Unchanged
    );
    // A directory where the old file was is not the old file: kept, and no commit.
    let human = commit_on(&bare, Some(tip), &format!("{old}/keep"));
    bare.reference("refs/heads/main", human, true, "human push")
        .unwrap();
    assert_eq!(writer.write(&[file]).unwrap(), Pushed::Unchanged);
    assert_eq!(bare.refname_to_id("refs/heads/main").unwrap(), human);
}

#[test]
fn a_removal_takes_only_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(dir.path()).unwrap();
    let a = repo.blob(b"a").unwrap();
    let (base, _) = tree_with(&repo, None, &[("x", Some(a)), ("d.yaml/inner", Some(a))]).unwrap();
    let base = repo.find_tree(base).unwrap();
    // `x/y.yaml` below a file, and `d.yaml`, a directory: neither is a file to remove.
    let (after, entries) =
        tree_with(&repo, Some(&base), &[("x/y.yaml", None), ("d.yaml", None)]).unwrap();
    assert_eq!(after, base.id());
    assert_eq!(entries, 2);
}
