//! A rollout's history from the status branch in Git (`--writeback`): the commits of the
//! write-back clone that changed its status file, newest first, with the phase each wrote.
//! Read from the local clone (no network): the branch as last fetched and the writer's last
//! commit on it; bounded in commits walked.

use std::path::Path;

use serde_json::{Value, json};

/// The most commits walked back from the branch's tip.
const MAX_WALKED: usize = 2000;
/// The most changes of one file returned.
pub const MAX_SHOWN: usize = 20;

/// The changes of `file` on `branch` of the clone in `dir`: commit, time, phase and summary.
pub fn of_file(dir: &Path, branch: &str, file: &str) -> Result<Vec<Value>, git2::Error> {
    let repo = git2::Repository::open(dir)?;
    // The branch as last fetched, or the writer's own last pushed commit on top of it: a fetch
    // comes only before the next write, so the last status written is in the writer's ref
    // alone. A commit whose push is in flight or was refused is not shown.
    let fetched = repo
        .refname_to_id(&format!("refs/remotes/origin/{branch}"))
        .ok();
    let written = repo.refname_to_id(crate::writeback::push::PUSHED_REF).ok();
    let tip = match (fetched, written) {
        (Some(f), Some(w)) if w == f || repo.graph_descendant_of(w, f)? => w,
        (Some(f), _) => f,
        (None, Some(w)) => w,
        // Nothing written yet.
        (None, None) => return Ok(Vec::new()),
    };
    let mut walk = repo.revwalk()?;
    walk.push(tip)?;
    walk.set_sorting(git2::Sort::TIME)?;
    let path = Path::new(file);
    let blob_at = |commit: &git2::Commit| {
        commit
            .tree()
            .ok()
            .and_then(|t| t.get_path(path).ok())
            .map(|e| e.id())
    };
    let mut changes = Vec::new();
    for oid in walk.take(MAX_WALKED) {
        let commit = repo.find_commit(oid?)?;
        let Some(blob) = blob_at(&commit) else {
            continue;
        };
        let before = commit.parent(0).ok().and_then(|p| blob_at(&p));
        if before == Some(blob) {
            continue;
        }
        let content = repo.find_blob(blob)?;
        let phase = String::from_utf8_lossy(content.content())
            .lines()
            .find_map(|l| l.strip_prefix("phase: ").map(|p| p.trim().to_string()));
        let when = jiff::Timestamp::from_second(commit.time().seconds())
            .map(|t| t.to_string())
            .unwrap_or_default();
        changes.push(json!({
            "commit": oid_short(commit.id()),
            "time": when,
            "phase": phase,
            "summary": commit.summary().unwrap_or_default(),
        }));
        if changes.len() == MAX_SHOWN {
            break;
        }
    }
    Ok(changes)
}

fn oid_short(oid: git2::Oid) -> String {
    oid.to_string().chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits `files` (path, content) on top of `parent` and points the status branch's
    /// tracking ref at it.
    fn commit(
        repo: &git2::Repository,
        parent: Option<git2::Oid>,
        files: &[(&str, &str)],
        message: &str,
        at: i64,
    ) -> git2::Oid {
        let mut index = git2::Index::new().unwrap();
        if let Some(p) = parent {
            index
                .read_tree(&repo.find_commit(p).unwrap().tree().unwrap())
                .unwrap();
        }
        for (path, content) in files {
            let blob = repo.blob(content.as_bytes()).unwrap();
            let mut entry = git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: 0o100644,
                uid: 0,
                gid: 0,
                file_size: content.len() as u32,
                id: blob,
                flags: 0,
                flags_extended: 0,
                path: path.as_bytes().to_vec(),
            };
            entry.flags = entry.path.len().min(0xfff) as u16;
            index.add(&entry).unwrap();
        }
        let tree = repo.find_tree(index.write_tree_to(repo).unwrap()).unwrap();
        let sig = git2::Signature::new("linnet", "l@x", &git2::Time::new(at, 0)).unwrap();
        let parents: Vec<git2::Commit> = parent
            .map(|p| repo.find_commit(p).unwrap())
            .into_iter()
            .collect();
        let parents: Vec<&git2::Commit> = parents.iter().collect();
        let oid = repo
            .commit(None, &sig, &sig, message, &tree, &parents)
            .unwrap();
        repo.reference(TRACKING, oid, true, "test").unwrap();
        oid
    }

    const TRACKING: &str = "refs/remotes/origin/linnet/status";

    #[test]
    fn only_the_commits_that_changed_the_file_are_its_history_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_bare(dir.path()).unwrap();
        assert!(
            of_file(dir.path(), "linnet/status", "a.yaml")
                .unwrap()
                .is_empty()
        );
        let file = ".linnet/status/shop/4b/redis.yaml";
        let c1 = commit(
            &repo,
            None,
            &[(file, "phase: Stable\n")],
            "redis Stable",
            100,
        );
        let c2 = commit(&repo, Some(c1), &[("other.yaml", "x")], "web Stable", 200);
        let c3 = commit(
            &repo,
            Some(c2),
            &[(file, "phase: CanaryActive\nmessage: m\n")],
            "redis CanaryActive",
            300,
        );
        let c4 = commit(
            &repo,
            Some(c3),
            &[("other.yaml", "y")],
            "web Progressing",
            400,
        );
        let _ = c4;
        let history = of_file(dir.path(), "linnet/status", file).unwrap();
        let phases: Vec<&str> = history
            .iter()
            .map(|h| h["phase"].as_str().unwrap())
            .collect();
        assert_eq!(phases, ["CanaryActive", "Stable"]);
        assert_eq!(history[0]["summary"], "redis CanaryActive");
        assert_eq!(history[0]["commit"], c3.to_string()[..12]);
        assert_eq!(history[1]["time"], "1970-01-01T00:01:40Z");
        // The writer's last commit, on top of the branch as fetched: shown before a fetch.
        let c5 = commit(
            &repo,
            Some(c4),
            &[(file, "phase: Stable\n")],
            "redis Stable",
            500,
        );
        repo.reference(crate::writeback::push::PUSHED_REF, c5, true, "w")
            .unwrap();
        repo.reference(TRACKING, c4, true, "fetched before the write")
            .unwrap();
        let history = of_file(dir.path(), "linnet/status", file).unwrap();
        assert_eq!(history[0]["commit"], c5.to_string()[..12]);
        // Regression (CI, stop 64): a commit whose push is still in flight is not shown, so
        // the dashboard never names a commit the remote may not carry.
        let in_flight = commit(
            &repo,
            Some(c5),
            &[(file, "phase: CanaryActive\n")],
            "redis CanaryActive",
            550,
        );
        repo.reference(crate::writeback::push::PUSH_REF, in_flight, true, "w")
            .unwrap();
        repo.reference(TRACKING, c4, true, "unchanged").unwrap();
        let history = of_file(dir.path(), "linnet/status", file).unwrap();
        assert_eq!(history[0]["commit"], c5.to_string()[..12]);
        // A written commit that the branch does not carry (a push refused, then a fetch) is not.
        let other = commit(&repo, Some(c3), &[("x", "y")], "someone else", 600);
        repo.reference(TRACKING, other, true, "fetched").unwrap();
        let history = of_file(dir.path(), "linnet/status", file).unwrap();
        assert_eq!(history[0]["commit"], c3.to_string()[..12]);
    }
}
