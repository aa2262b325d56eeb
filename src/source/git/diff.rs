//! What changed between two revisions' spec trees, without listing either whole: trees with
//! the same id are skipped, so a one-file push reads a few trees. Bounded in depth and entries
//! ([`DIFF_MAX_DEPTH`], [`RevisionShape::max_diff_entries`]); past either the revision is
//! listed whole.

use git2::Oid;

use super::tree::{
    file_id, git_order, in_git_order, is_submodule, note_submodule, visible_entries,
};
use super::{GitError, GitMirror, RevisionShape};

/// A file added or changed (with its new id) or removed (`None`), by its path.
pub type FileChange = (String, Option<String>);

use super::tree::DIFF_MAX_DEPTH;

impl GitMirror {
    /// The files below `path` that differ between commits `from` and `to`, by the rules of
    /// [`GitMirror::list_files`]: `(path, Some(id))` for a file added or changed, `(path,
    /// None)` for one removed. Subtrees with equal ids are not read, so a one-file push costs
    /// the trees on that file's path (and a directory's entries), not the repository. `None`
    /// when a tree's entries are not in Git's order or repeat a name (no Git writes such a
    /// tree; a hostile one could), when the trees that differ nest deeper than
    /// [`DIFF_MAX_DEPTH`], or when they hold more entries than `shape` lets a diff look at
    /// ([`RevisionShape::max_diff_entries`]): then only a whole listing, bounded by the same
    /// shape, says what is there.
    pub fn changed_files(
        &self,
        from: Oid,
        to: Oid,
        path: &str,
        shape: &RevisionShape,
    ) -> Result<Option<Vec<FileChange>>, GitError> {
        let (old, new) = (self.spec_root(from, path)?, self.spec_root(to, path)?);
        let mut changes = Vec::new();
        let mut left = shape.max_diff_entries();
        let in_order =
            self.diff_trees(old.as_ref(), new.as_ref(), "", 0, &mut left, &mut changes)?;
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
        left: &mut usize,
        changes: &mut Vec<FileChange>,
    ) -> Result<bool, GitError> {
        if depth > DIFF_MAX_DEPTH {
            return Ok(false);
        }
        // Sizes first: a tree of a million entries is not read into a list here.
        let entries = old.map_or(0, |t| t.len()) + new.map_or(0, |t| t.len());
        *left = match left.checked_sub(entries) {
            Some(rest) => rest,
            None => return Ok(false),
        };
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
                    left,
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
