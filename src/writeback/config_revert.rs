//! The config a revert puts back with the image (issue 50): the commit that brought the failed
//! image into the rollout's file is found on the branch's first-parent history, and if every
//! other file it changed holds only ConfigMaps or Secrets and lies beside the rollout's file
//! (in its directory or below), each of those files goes back to what it was before that
//! commit, unless a later commit changed it again (a person's newer change wins). A commit
//! that also changed anything else is not the rollout's change alone: then only the image
//! goes back.

use std::path::Path;

use git2::{Commit, ObjectType, Oid, Repository};

use super::revert::{Revert, holds_only_config, rollout_image};

/// How far back the history is read for the commit that brought the failed image in.
const MAX_COMMITS: usize = 500;
/// A change with more files than this is not one rollout's config.
const MAX_FILES: usize = 50;
/// The versions of the rollout's file read while looking for that commit, at most.
const MAX_PARSED_BYTES: usize = 64 << 20;
/// A config file larger than this is not read (nor put back).
const MAX_FILE_BYTES: usize = 1 << 20;

/// Config files to put back: each path with the blob it had before the failed image came in
/// (`None`: that commit added it), and the commit that brought it in.
#[derive(Debug, Default, PartialEq)]
pub struct ConfigBack {
    pub files: Vec<(String, Option<Oid>)>,
    pub change: Option<Oid>,
}

/// The config that came in with `revert.failed` and is still as that commit left it on `tip`.
pub fn config_with_the_change(
    repo: &Repository,
    tip: &Commit<'_>,
    revert: &Revert,
) -> Result<ConfigBack, git2::Error> {
    let Some(change) = change_that_brought(repo, tip, revert)? else {
        return Ok(ConfigBack::default());
    };
    let before = change.parent(0)?;
    let diff = repo.diff_tree_to_tree(Some(&before.tree()?), Some(&change.tree()?), None)?;
    if diff.deltas().len() > MAX_FILES {
        return Ok(ConfigBack::default());
    }
    let dir = Path::new(&revert.path).parent().unwrap_or(Path::new(""));
    let (tip_tree, change_tree, before_tree) = (tip.tree()?, change.tree()?, before.tree()?);
    let blob_at = |tree: &git2::Tree<'_>, path: &Path| {
        tree.get_path(path)
            .ok()
            .filter(|e| e.kind() == Some(ObjectType::Blob))
            .map(|e| e.id())
    };
    let mut files = Vec::new();
    for delta in diff.deltas() {
        let Some(path) = delta.new_file().path().or(delta.old_file().path()) else {
            return Ok(ConfigBack::default());
        };
        let path_text = path.to_string_lossy().into_owned();
        if path_text == revert.path {
            continue;
        }
        let (after, earlier) = (blob_at(&change_tree, path), blob_at(&before_tree, path));
        let is_config = |id: Option<Oid>| -> Result<bool, git2::Error> {
            let Some(id) = id else { return Ok(true) };
            let blob = repo.find_blob(id)?;
            Ok(blob.size() <= MAX_FILE_BYTES
                && std::str::from_utf8(blob.content()).is_ok_and(holds_only_config))
        };
        // A deleted file counts by what it held; both sides must be config.
        if !path.starts_with(dir) || !is_config(after)? || !is_config(earlier)? {
            return Ok(ConfigBack::default());
        }
        if blob_at(&tip_tree, path) == after {
            files.push((path_text, earlier));
        } else {
            tracing::info!(file = %path_text, "not putting back config changed again since the failed image came in");
        }
    }
    Ok(ConfigBack {
        files,
        change: Some(change.id()),
    })
}

/// The newest commit on `tip`'s first-parent history whose rollout asks for the failed image
/// while its parent's did not.
pub(super) fn change_that_brought<'r>(
    repo: &'r Repository,
    tip: &Commit<'r>,
    revert: &Revert,
) -> Result<Option<Commit<'r>>, git2::Error> {
    let blob_of = |commit: &Commit<'_>| -> Result<Option<Oid>, git2::Error> {
        Ok(commit
            .tree()?
            .get_path(Path::new(&revert.path))
            .ok()
            .filter(|e| e.kind() == Some(ObjectType::Blob))
            .map(|e| e.id()))
    };
    // Only a version of the file not read yet is parsed, within a budget of bytes: the
    // history is the repository's, which anyone who can push writes.
    let mut parsed = 0usize;
    // `None`: past the budget, so not known (and no config is put back).
    let mut asks_for_failed = |blob: Option<Oid>| -> Result<Option<bool>, git2::Error> {
        let Some(id) = blob else {
            return Ok(Some(false));
        };
        let blob = repo.find_blob(id)?;
        parsed += blob.size();
        if blob.size() > crate::specs::ParseBudget::default().max_bytes || parsed > MAX_PARSED_BYTES
        {
            return Ok(None);
        }
        let text = std::str::from_utf8(blob.content()).unwrap_or_default();
        Ok(Some(
            rollout_image(text, revert.kind, &revert.name)
                .is_some_and(|(_, image)| image == revert.failed),
        ))
    };
    let mut commit = tip.clone();
    let mut blob = blob_of(&commit)?;
    if asks_for_failed(blob)? != Some(true) {
        return Ok(None);
    }
    for _ in 0..MAX_COMMITS {
        let Ok(parent) = commit.parent(0) else {
            return Ok(None);
        };
        let parent_blob = blob_of(&parent)?;
        if parent_blob != blob {
            match asks_for_failed(parent_blob)? {
                Some(true) => {}
                Some(false) => return Ok(Some(commit)),
                None => return Ok(None),
            }
        }
        (commit, blob) = (parent, parent_blob);
    }
    Ok(None)
}
