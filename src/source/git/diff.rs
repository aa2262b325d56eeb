//! What changed between two revisions' spec trees, without listing either whole: trees with
//! the same id are skipped, so a one-file push reads a few trees. Bounded in depth and entries
//! ([`DIFF_MAX_DEPTH`], [`DIFF_MAX_ENTRIES`]); past either the revision is listed whole.

use git2::Oid;

use super::tree::{
    file_id, git_order, in_git_order, is_submodule, note_submodule, visible_entries,
};
use super::{GitError, GitMirror};

/// A file added or changed (with its new id) or removed (`None`), by its path.
pub type FileChange = (String, Option<String>);

use super::tree::DIFF_MAX_DEPTH;

/// Tree entries [`GitMirror::changed_files`] looks at before it leaves the revision to a
/// whole listing, which is bounded by [`super::RevisionShape`]: a pushed bomb must not be
/// diffed. A push to a directory at `--max-tree-entries` (10,000) compares two trees of that
/// size, besides the trees on the path: 20,000 was one entry short of a one-file push to the
/// bench's 10,000 spec files in one directory, which was listed whole on every push.
const DIFF_MAX_ENTRIES: usize = 50_000;

impl GitMirror {
    /// The files below `path` that differ between commits `from` and `to`, by the rules of
    /// [`GitMirror::list_files`]: `(path, Some(id))` for a file added or changed, `(path,
    /// None)` for one removed. Subtrees with equal ids are not read, so a one-file push costs
    /// the trees on that file's path (and a directory's entries), not the repository. `None`
    /// when a tree's entries are not in Git's order or repeat a name (no Git writes such a
    /// tree; a hostile one could), or when the trees that differ nest deeper than
    /// [`DIFF_MAX_DEPTH`]: then only a whole listing says what is there.
    pub fn changed_files(
        &self,
        from: Oid,
        to: Oid,
        path: &str,
    ) -> Result<Option<Vec<FileChange>>, GitError> {
        let (old, new) = (self.spec_root(from, path)?, self.spec_root(to, path)?);
        let mut changes = Vec::new();
        let mut looked = 0;
        let in_order =
            self.diff_trees(old.as_ref(), new.as_ref(), "", 0, &mut looked, &mut changes)?;
        Ok(in_order.then_some(changes))
    }

    /// Adds to `changes` the files that differ between `old` and `new` (either may be absent),
    /// below `dir`, `depth` trees down; false when a tree is out of order or too deep.
    fn diff_trees(
        &self,
        old: Option<&git2::Tree<'_>>,
        new: Option<&git2::Tree<'_>>,
        dir: &str,
        depth: usize,
        looked: &mut usize,
        changes: &mut Vec<FileChange>,
    ) -> Result<bool, GitError> {
        if depth > DIFF_MAX_DEPTH {
            return Ok(false);
        }
        // Sizes first: a tree of a million entries is not read into a list here.
        *looked += old.map_or(0, |t| t.len()) + new.map_or(0, |t| t.len());
        if *looked > DIFF_MAX_ENTRIES {
            return Ok(false);
        }
        let (old, new) = (visible_entries(old), visible_entries(new));
        if !in_git_order(&old) || !in_git_order(&new) {
            return Ok(false);
        }
        let (mut i, mut j) = (0, 0);
        while i < old.len() || j < new.len() {
            let order = match (old.get(i), new.get(j)) {
                (Some(o), Some(n)) => git_order(o, n),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            let (o, n) = match order {
                std::cmp::Ordering::Less => (old.get(i), None),
                std::cmp::Ordering::Greater => (None, new.get(j)),
                std::cmp::Ordering::Equal => (old.get(i), new.get(j)),
            };
            i += usize::from(o.is_some());
            j += usize::from(n.is_some());
            if let (Some(o), Some(n)) = (o, n)
                && o.id() == n.id()
                && o.filemode() == n.filemode()
            {
                continue;
            }
            let name = o.or(n).and_then(|e| e.name().ok()).unwrap_or("");
            let here = format!("{dir}{name}");
            let subtree = |e: Option<&git2::TreeEntry<'_>>| -> Result<_, GitError> {
                match e {
                    Some(e) if e.kind() == Some(git2::ObjectType::Tree) => {
                        Ok(Some(self.repo.find_tree(e.id())?))
                    }
                    _ => Ok(None),
                }
            };
            let (old_tree, new_tree) = (subtree(o)?, subtree(n)?);
            if (old_tree.is_some() || new_tree.is_some())
                && !self.diff_trees(
                    old_tree.as_ref(),
                    new_tree.as_ref(),
                    &format!("{here}/"),
                    depth + 1,
                    looked,
                    changes,
                )?
            {
                return Ok(false);
            }
            if n.is_some_and(is_submodule) {
                note_submodule(&here);
            }
            let old_file = o.and_then(file_id);
            let new_file = n.and_then(file_id);
            match (old_file, new_file) {
                (_, Some(id)) => changes.push((here, Some(id))),
                (Some(_), None) => changes.push((here, None)),
                (None, None) => {}
            }
        }
        Ok(true)
    }
}
