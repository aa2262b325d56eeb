//! Reading a revision's spec files from the mirror: listing the tree under `--path` within the
//! shape budgets ([`RevisionShape`]), diffing two revisions' trees, and reading a blob.

use std::path::Path;

use git2::Oid;

use super::{BLOCKED, GitError, GitMirror, RevisionShape};

use crate::specs::{FileContent, too_large};

/// How [`GitMirror::list_files`] marks a symbolic link's id.
/// How deep a listing or [`GitMirror::changed_files`] follows trees: each level is a
/// recursion that keeps its path, so a hostile tree nested thousands deep must not reach it.
/// Spec repositories are shallow.
pub(super) const DIFF_MAX_DEPTH: usize = 64;

/// How [`GitMirror::list_files`] marks a symbolic link's id.
const SYMLINK: &str = "symlink:";

/// Subdirectories of one directory that may be blocked one by one; past it the directory
/// itself is blocked, as one error rather than a thousand.
const MAX_BLOCKED_PER_DIRECTORY: usize = 10;

/// Distinct trees one listing counts; past it the subtree being counted is blocked.
const MAX_TREES_COUNTED: usize = 100_000;

/// What is left of a listing's files (`--max-files`), and whether it ran out.
struct Budget {
    left: usize,
    cut: bool,
}

/// Files below a tree, as counted for [`RevisionShape`].
#[derive(Clone, Copy, Debug)]
enum Count {
    /// Files below it; `clean` when no tree below it is [`Count::Over`] (then it may be
    /// listed whole without looking).
    Files { files: usize, clean: bool },
    /// The tree itself has too many entries, or too many trees were counted.
    Over(usize),
}

/// A subdirectory as [`GitMirror::list_within`] weighs it.
struct Subdir {
    /// Files below it (`usize::MAX`: over a limit).
    files: usize,
    clean: bool,
    name: String,
    id: Oid,
}

/// Why a directory too large for what is left of `--max-files` is blocked as one entry.
enum BudgetRefusal {
    /// Its own files alone do not fit.
    Direct(usize),
    /// Its `files` are spread over more subdirectories that do not fit than a directory may
    /// have blocked.
    Spread { files: usize, too_big: usize },
}

impl BudgetRefusal {
    fn why(&self, shape: &RevisionShape) -> String {
        let max = shape.max_files;
        match self {
            BudgetRefusal::Direct(direct) => format!(
                "{direct} files in this directory alone, with the {max} files a revision may \
                 list (--max-files) mostly taken by the rest: the directory is blocked, the rest \
                 of the revision syncs"
            ),
            BudgetRefusal::Spread { files, too_big } => format!(
                "{files} files below it would pass the {max} files a revision may list \
                 (--max-files), spread over {too_big} subdirectories: the directory is blocked, \
                 the rest of the revision syncs; split the repository into several sources, or \
                 raise the limit"
            ),
        }
    }
}

/// Why a tree over a limit is blocked: `entries` in it (0: the trees below it nest too deep
/// or are too many).
fn over_reason(entries: usize, shape: &RevisionShape) -> String {
    if entries == 0 {
        return format!(
            "the trees below it nest deeper than {DIFF_MAX_DEPTH} or number over \
             {MAX_TREES_COUNTED}; no spec repository needs that: the directory is blocked, the \
             rest of the revision syncs"
        );
    }
    format!(
        "{entries} entries in one directory, over the {} a directory may hold \
         (--max-tree-entries): the directory is blocked, the rest of the revision syncs; split \
         it, or raise the limit",
        shape.max_tree_entries
    )
}

impl GitMirror {
    /// An id of what [`GitMirror::list_files`] would list at `commit` under `path`: the tree's
    /// id, or, at the repository's root, an id of its entries but those starting with a dot
    /// (which the listing skips, and where `.linnet/status` lives). Equal ids, equal listings,
    /// found without reading the tree below its top.
    pub fn spec_tree_id(&self, commit: Oid, path: &str) -> Result<Oid, GitError> {
        let tree = self.repo.find_commit(commit)?.tree()?;
        let root = path.trim_matches('/');
        if !(root.is_empty() || root == ".") {
            return Ok(match tree.get_path(Path::new(root)) {
                Ok(entry) => entry.id(),
                Err(_) => Oid::ZERO_SHA1,
            });
        }
        let mut entries = Vec::new();
        for entry in tree.iter() {
            if entry.name_bytes().starts_with(b".") {
                continue;
            }
            entries.extend_from_slice(entry.name_bytes());
            entries.push(0);
            entries.extend_from_slice(&entry.filemode().to_le_bytes());
            entries.extend_from_slice(entry.id().as_bytes());
        }
        Ok(Oid::hash_object(git2::ObjectType::Blob, &entries)?)
    }

    /// Every file below `path` at `commit`, as `(path relative to `path`, file id)`, skipping
    /// hidden directories (`.git`, `.linnet`) and submodules. The id is the blob id, with
    /// `symlink:` in front for a symbolic link, which is never followed.
    pub fn list_files(&self, commit: Oid, path: &str) -> Result<Vec<(String, String)>, GitError> {
        let Some(tree) = self.spec_root(commit, path)? else {
            return Ok(Vec::new());
        };
        let mut files = Vec::new();
        tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            if hidden(entry) {
                return git2::TreeWalkResult::Skip;
            }
            if let Some(id) = file_id(entry) {
                files.push((format!("{dir}{}", entry.name().unwrap_or("")), id));
            }
            git2::TreeWalkResult::Ok
        })?;
        Ok(files)
    }

    /// [`GitMirror::list_files`] within `shape`: a directory with more entries than it allows,
    /// and, while the revision would list more files than it allows, the largest
    /// directories, are listed as one entry each (`dir/`, id [`BLOCKED`] and why), never
    /// walked. Counting is memoized per tree id, so a tree named a thousand times is read once.
    pub fn list_files_within(
        &self,
        commit: Oid,
        path: &str,
        shape: &RevisionShape,
    ) -> Result<Vec<(String, String)>, GitError> {
        let Some(tree) = self.spec_root(commit, path)? else {
            return Ok(Vec::new());
        };
        let mut counts = std::collections::HashMap::new();
        let mut out = Vec::new();
        let mut budget = Budget {
            left: shape.max_files,
            cut: false,
        };
        self.list_within(&tree, "", shape, &mut counts, &mut budget, &mut out)?;
        if budget.cut {
            // Blocked directories count against the files too: past them, one entry says so.
            out.push((
                "./".into(),
                format!(
                    "{BLOCKED}the listing reached the {} files and blocked directories a \
                     revision may hold (--max-files); the directories past it are not read, \
                     the files listed sync",
                    shape.max_files
                ),
            ));
        }
        Ok(out)
    }

    fn count(
        &self,
        tree: &git2::Tree<'_>,
        shape: &RevisionShape,
        counts: &mut std::collections::HashMap<Oid, Count>,
        depth: usize,
    ) -> Result<Count, GitError> {
        if let Some(c) = counts.get(&tree.id()) {
            return Ok(*c);
        }
        let entries = tree.len();
        let count = if entries > shape.max_tree_entries {
            Count::Over(entries)
        } else if counts.len() >= MAX_TREES_COUNTED || depth > DIFF_MAX_DEPTH {
            Count::Over(0)
        } else {
            let (mut files, mut clean) = (0usize, true);
            for e in visible_entries(Some(tree)) {
                if file_id(&e).is_some() {
                    files += 1;
                } else if e.kind() == Some(git2::ObjectType::Tree) {
                    let sub = self.repo.find_tree(e.id())?;
                    match self.count(&sub, shape, counts, depth + 1)? {
                        Count::Files { files: n, clean: c } => {
                            files = files.saturating_add(n);
                            clean &= c;
                        }
                        Count::Over(_) => clean = false,
                    }
                }
            }
            Count::Files { files, clean }
        };
        counts.insert(tree.id(), count);
        Ok(count)
    }

    /// Lists `tree` (at `dir`) into `out`, blocking what does not fit in `budget`; each
    /// blocked entry takes one too, and the budget is marked cut when nothing was left.
    fn list_within(
        &self,
        tree: &git2::Tree<'_>,
        dir: &str,
        shape: &RevisionShape,
        counts: &mut std::collections::HashMap<Oid, Count>,
        budget: &mut Budget,
        out: &mut Vec<(String, String)>,
    ) -> Result<(), GitError> {
        if budget.left == 0 {
            budget.cut = true;
            return Ok(());
        }
        let depth = dir.matches('/').count();
        let blocked = |left: &mut usize, why: String| {
            let at = if dir.is_empty() { "./" } else { dir };
            *left -= 1;
            (at.to_string(), format!("{BLOCKED}{why}"))
        };
        let (files, clean) = match self.count(tree, shape, counts, depth)? {
            Count::Files { files, clean } => (files, clean),
            Count::Over(entries) => {
                out.push(blocked(&mut budget.left, over_reason(entries, shape)));
                return Ok(());
            }
        };
        if clean && files <= budget.left {
            budget.left -= files;
            return self.list_all(tree, dir, out);
        }
        // Too many. The directory's own files first, then its subdirectories from the
        // smallest: those that fit are listed whole, the others are looked into in turn (a
        // mixed directory such as `apps/` keeps its good files), unless more than a few do
        // not fit: then this directory is the bomb, and it is blocked as one entry.
        let entries = visible_entries(Some(tree));
        let direct = entries.iter().filter(|e| file_id(e).is_some()).count();
        if direct > budget.left {
            out.push(blocked(
                &mut budget.left,
                BudgetRefusal::Direct(direct).why(shape),
            ));
            return Ok(());
        }
        let subdirs = self.subdirs_by_size(&entries, shape, counts, depth + 1)?;
        let mut room = budget.left - direct;
        let too_big = subdirs
            .iter()
            .filter(|subdir| {
                let fits = subdir.files <= room;
                room -= if fits { subdir.files } else { 0 };
                !fits
            })
            .count();
        if too_big > MAX_BLOCKED_PER_DIRECTORY {
            let why = BudgetRefusal::Spread { files, too_big }.why(shape);
            out.push(blocked(&mut budget.left, why));
            return Ok(());
        }
        for e in &entries {
            if let Some(id) = file_id(e) {
                budget.left -= 1;
                out.push((format!("{dir}{}", e.name().unwrap_or("")), id));
            } else if is_submodule(e) {
                note_submodule(&format!("{dir}{}", e.name().unwrap_or("")));
            }
        }
        for subdir in subdirs {
            let sub = self.repo.find_tree(subdir.id)?;
            let here = format!("{dir}{}/", subdir.name);
            if subdir.clean && subdir.files <= budget.left {
                budget.left -= subdir.files;
                self.list_all(&sub, &here, out)?;
            } else {
                self.list_within(&sub, &here, shape, counts, budget, out)?;
            }
        }
        Ok(())
    }

    /// The subdirectories among `entries`, counted at `depth`, the smallest first (one over a
    /// limit counts as the largest).
    fn subdirs_by_size(
        &self,
        entries: &[git2::TreeEntry<'_>],
        shape: &RevisionShape,
        counts: &mut std::collections::HashMap<Oid, Count>,
        depth: usize,
    ) -> Result<Vec<Subdir>, GitError> {
        let mut subdirs = Vec::new();
        for e in entries {
            if e.kind() != Some(git2::ObjectType::Tree) {
                continue;
            }
            let sub = self.repo.find_tree(e.id())?;
            let (files, clean) = match self.count(&sub, shape, counts, depth)? {
                Count::Files { files, clean } => (files, clean),
                Count::Over(_) => (usize::MAX, false),
            };
            let name = e.name().unwrap_or("").to_string();
            subdirs.push(Subdir {
                files,
                clean,
                name,
                id: e.id(),
            });
        }
        subdirs.sort_by(|a, b| a.files.cmp(&b.files).then_with(|| a.name.cmp(&b.name)));
        Ok(subdirs)
    }

    /// Every file of `tree` (at `dir`), by the rules of [`GitMirror::list_files`].
    fn list_all(
        &self,
        tree: &git2::Tree<'_>,
        dir: &str,
        out: &mut Vec<(String, String)>,
    ) -> Result<(), GitError> {
        tree.walk(git2::TreeWalkMode::PreOrder, |sub, entry| {
            if hidden(entry) {
                return git2::TreeWalkResult::Skip;
            }
            let path = format!("{dir}{sub}{}", entry.name().unwrap_or(""));
            if let Some(id) = file_id(entry) {
                out.push((path, id));
            } else if is_submodule(entry) {
                note_submodule(&path);
            }
            git2::TreeWalkResult::Ok
        })?;
        Ok(())
    }

    /// The tree [`GitMirror::list_files`] lists at `commit`; `None` when `path` is not there
    /// or is not a directory.
    pub(super) fn spec_root(
        &self,
        commit: Oid,
        path: &str,
    ) -> Result<Option<git2::Tree<'_>>, GitError> {
        let tree = self.repo.find_commit(commit)?.tree()?;
        let root = path.trim_matches('/');
        if root.is_empty() || root == "." {
            return Ok(Some(tree));
        }
        match tree.get_path(Path::new(root)) {
            Ok(entry) if entry.kind() == Some(git2::ObjectType::Tree) => {
                Ok(Some(self.repo.find_tree(entry.id())?))
            }
            _ => Ok(None),
        }
    }

    /// The content of a file listed by [`GitMirror::list_files`]: a blob's bytes only when its
    /// size (from the object header, before anything is inflated) is at most `max`; a link's
    /// target is never read as content.
    pub fn read_spec_file(&self, file_id: &str, max: usize) -> Result<FileContent, GitError> {
        if let Some(why) = file_id.strip_prefix(BLOCKED) {
            return Ok(FileContent::Refused(why.to_string()));
        }
        if file_id.starts_with(SYMLINK) {
            return Ok(FileContent::Refused(
                "is a symbolic link; linnet reads only regular files inside the tree and does \
                 not follow links (commit the file itself)"
                    .into(),
            ));
        }
        let id = Oid::from_str(file_id)?;
        let (size, _) = self.repo.odb()?.read_header(id)?;
        if size > max {
            return Ok(FileContent::Refused(too_large(size as u64, max)));
        }
        Ok(FileContent::Bytes(
            self.repo.find_blob(id)?.content().to_vec(),
        ))
    }
}

/// Whether [`GitMirror::list_files`] skips an entry, and all below it: its name starts with
/// a dot (`.git`, `.linnet`).
pub(super) fn hidden(entry: &git2::TreeEntry<'_>) -> bool {
    entry.name_bytes().starts_with(b".")
}

/// A file's id as [`GitMirror::list_files`] gives it; `None` for a tree or a submodule.
pub(super) fn file_id(entry: &git2::TreeEntry<'_>) -> Option<String> {
    if entry.kind() != Some(git2::ObjectType::Blob) {
        return None;
    }
    Some(if entry.filemode() == i32::from(git2::FileMode::Link) {
        format!("{SYMLINK}{}", entry.id())
    } else {
        entry.id().to_string()
    })
}

/// Whether `entry` is a submodule (a commit of another repository).
pub(super) fn is_submodule(entry: &git2::TreeEntry<'_>) -> bool {
    entry.kind() == Some(git2::ObjectType::Commit)
}

/// A submodule is never followed, so its URL is never contacted (a repository writer could
/// point it anywhere); said once per listing that meets it, rather than skipped silently.
pub(super) fn note_submodule(path: &str) {
    tracing::info!(
        path,
        "a submodule: linnet does not follow submodules (its URL is never contacted), so no \
         spec below it is read; commit the files themselves"
    );
}

/// A tree's entries but those [`GitMirror::list_files`] skips (names starting with a dot).
pub(super) fn visible_entries<'t>(tree: Option<&'t git2::Tree<'_>>) -> Vec<git2::TreeEntry<'t>> {
    tree.map(|t| t.iter().filter(|e| !hidden(e)).collect())
        .unwrap_or_default()
}

/// Git's order of tree entries: by name, a directory's name read with a `/` after it. (A name
/// holding a `/`, which only a hand-made tree has, is ordered by the same reading, which can
/// differ from Git's own comparison there.)
pub(super) fn git_order(a: &git2::TreeEntry<'_>, b: &git2::TreeEntry<'_>) -> std::cmp::Ordering {
    let dir = |e: &git2::TreeEntry<'_>| e.filemode() == i32::from(git2::FileMode::Tree);
    name_order(a.name_bytes(), dir(a), b.name_bytes(), dir(b))
}

/// Git's order of two names, each read with a `/` after it when it names a directory. The
/// names are compared as slices: a directory of 10,000 entries is compared twice per push.
pub(super) fn name_order(a: &[u8], a_dir: bool, b: &[u8], b_dir: bool) -> std::cmp::Ordering {
    let common = a.len().min(b.len());
    match a[..common].cmp(&b[..common]) {
        // One is a prefix of the other: the rest, with its `/`, decides in a byte or two.
        std::cmp::Ordering::Equal => {
            fn rest(name: &[u8], from: usize, dir: bool) -> impl Iterator<Item = u8> + '_ {
                name[from..].iter().copied().chain(dir.then_some(b'/'))
            }
            rest(a, common, a_dir).cmp(rest(b, common, b_dir))
        }
        unequal => unequal,
    }
}

/// Whether entries are strictly in Git's order (and so name no path twice).
pub(super) fn in_git_order(entries: &[git2::TreeEntry<'_>]) -> bool {
    entries
        .windows(2)
        .all(|w| git_order(&w[0], &w[1]) == std::cmp::Ordering::Less)
}
