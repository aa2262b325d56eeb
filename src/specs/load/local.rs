//! Spec files in a local directory (`--repo-path`, `linnet validate`): walked within the
//! shape budgets without following links, and read only when regular and within the size
//! limit.

use std::path::{Path, PathBuf};

use super::*;

/// A spec file found in a directory tree, described without following links.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalSpecFile {
    /// Path relative to the root, with `/` separators.
    pub rel: String,
    pub path: PathBuf,
    pub kind: LocalFileKind,
}

/// What a directory entry is, from `lstat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalFileKind {
    /// A regular file of this many bytes, last changed at this many nanoseconds.
    Regular { len: u64, modified: u128 },
    /// A symbolic link (to a file or a directory); never followed.
    Symlink,
    /// A FIFO, socket or device; never opened.
    Special,
    /// A directory not walked (its path ends in `/`), by [`crate::specs::RevisionShape`].
    Blocked(BlockedWhy),
}

/// Why a directory of a `--repo-path` tree was not walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockedWhy {
    /// More entries than `--max-tree-entries` (`max`).
    Entries { max: usize },
    /// Nested deeper than `max`.
    Depth { max: usize },
    /// The listing reached `--max-files` (`max`) before it.
    Cut { max: usize },
}

impl std::fmt::Display for BlockedWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockedWhy::Entries { max } => write!(
                f,
                "more than {max} entries in one directory (--max-tree-entries): the directory \
                 is blocked, the rest syncs; split it, or raise the limit"
            ),
            BlockedWhy::Depth { max } => write!(
                f,
                "nested deeper than {max} directories: the directory is blocked, the rest syncs"
            ),
            BlockedWhy::Cut { max } => write!(
                f,
                "the listing reached the {max} files a source may list (--max-files); the \
                 directories past it are not read, the files listed sync"
            ),
        }
    }
}

/// Directories a `--repo-path` walk enters below its root, at most.
const MAX_LOCAL_DEPTH: usize = 64;

impl LocalSpecFile {
    /// An id that changes when the file does.
    pub fn change_id(&self) -> String {
        match self.kind {
            LocalFileKind::Regular { len, modified } => format!("{len}-{modified}"),
            LocalFileKind::Symlink => "symlink".into(),
            LocalFileKind::Special => "special".into(),
            LocalFileKind::Blocked(why) => format!("{}{why}", crate::specs::BLOCKED),
        }
    }
}

/// Every entry below `root`, sorted: regular files, and links (never followed: a link to a
/// directory is not entered) and special files with a spec file's name. Hidden entries are
/// skipped. Nothing is followed and nothing is opened. Within `shape` (issue 45): a
/// directory with too many entries, or nested too deep, is one [`LocalFileKind::Blocked`]
/// entry, and past `max_files` entries the walk stops with one more.
pub fn list_local_spec_files(
    root: &Path,
    shape: &crate::specs::RevisionShape,
) -> std::io::Result<Vec<LocalSpecFile>> {
    let mut out = Vec::new();
    let mut left = shape.max_files;
    if !walk_local(root, root, 0, shape, &mut left, &mut out)? {
        out.push(LocalSpecFile {
            rel: "./".into(),
            path: root.to_path_buf(),
            kind: LocalFileKind::Blocked(BlockedWhy::Cut {
                max: shape.max_files,
            }),
        });
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// `path` below `root`, with `/` between its parts.
fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// What a non-directory entry named `name` is to the listing; `None`: not listed.
fn file_kind(name: &str, meta: &std::fs::Metadata) -> Option<LocalFileKind> {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        // Never followed; reported when it has a spec file's name, as in Git mode.
        return is_spec_file(name).then_some(LocalFileKind::Symlink);
    }
    if file_type.is_file() {
        // Every regular file, as a Git listing has: a kustomization or chart reads more than
        // YAML (generator inputs, `_helpers.tpl`).
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        return Some(LocalFileKind::Regular {
            len: meta.len(),
            modified,
        });
    }
    is_spec_file(name).then_some(LocalFileKind::Special)
}

/// Walks `dir` into `out`; false when `left` ran out.
fn walk_local(
    root: &Path,
    dir: &Path,
    depth: usize,
    shape: &crate::specs::RevisionShape,
    left: &mut usize,
    out: &mut Vec<LocalSpecFile>,
) -> std::io::Result<bool> {
    let rel_dir = || {
        let rel = relative(root, dir);
        if rel.is_empty() {
            "./".to_string()
        } else {
            format!("{rel}/")
        }
    };
    let blocked = |why| LocalSpecFile {
        rel: rel_dir(),
        path: dir.to_path_buf(),
        kind: LocalFileKind::Blocked(why),
    };
    if depth > MAX_LOCAL_DEPTH {
        out.push(blocked(BlockedWhy::Depth {
            max: MAX_LOCAL_DEPTH,
        }));
        return Ok(true);
    }
    // At most one entry past the limit is read to know it is passed.
    let entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)?
        .flatten()
        .take(shape.max_tree_entries + 1)
        .collect();
    if entries.len() > shape.max_tree_entries {
        out.push(blocked(BlockedWhy::Entries {
            max: shape.max_tree_entries,
        }));
        return Ok(true);
    }
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if !walk_local(root, &path, depth + 1, shape, left, out)? {
                return Ok(false);
            }
            continue;
        }
        let Some(kind) = file_kind(&name, &meta) else {
            continue;
        };
        let rel = relative(root, &path);
        if *left == 0 {
            return Ok(false);
        }
        *left -= 1;
        out.push(LocalSpecFile { rel, path, kind });
    }
    Ok(true)
}

/// Reads a local spec file: only a regular file, opened without following a link and without
/// blocking, and at most `max` bytes of it (the size is checked before and while reading).
pub fn read_local_spec_file(entry: &LocalSpecFile, max: usize) -> FileContent {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    match entry.kind {
        LocalFileKind::Symlink => {
            return FileContent::Refused(
                "is a symbolic link; linnet reads only regular files inside the tree and does \
                 not follow links (commit the file itself)"
                    .into(),
            );
        }
        LocalFileKind::Special => {
            return FileContent::Refused(
                "is not a regular file (a FIFO, socket or device); linnet does not read it".into(),
            );
        }
        LocalFileKind::Blocked(why) => return FileContent::Refused(why.to_string()),
        LocalFileKind::Regular { len, .. } if len > max as u64 => {
            return FileContent::Refused(too_large(len, max));
        }
        LocalFileKind::Regular { .. } => {}
    }
    let refused = |e: std::io::Error| FileContent::Refused(format!("cannot read the file: {e}"));
    // The entry may have been swapped for a link or a FIFO since it was listed.
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&entry.path)
    {
        Ok(f) => f,
        Err(e) => return refused(e),
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return FileContent::Refused("is no longer a regular file; not read".into());
        }
        Err(e) => return refused(e),
    }
    let mut bytes = Vec::new();
    match file.take(max as u64 + 1).read_to_end(&mut bytes) {
        // It grew since it was listed; its real size is not worth reading.
        Ok(n) if n > max => FileContent::Refused(format!(
            "file is over the limit of {max} bytes; split it into smaller files"
        )),
        Ok(_) => FileContent::Bytes(bytes),
        Err(e) => refused(e),
    }
}
