//! Commits status files on top of a branch and pushes them, never by force. A push that the
//! remote rejects because the branch moved (a human pushed in between) is redone: fetch the
//! new tip, write the status files onto it afresh (they are linnet's own), push again, with
//! backoff and a bounded number of tries. The human's commit is always the new parent, so it
//! is never lost. Every call blocks; the agent runs them on `spawn_blocking`.

use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

use git2::{Index, IndexEntry, IndexTime, Oid, PushOptions, Signature};

use super::status_files::{StatusFile, commit_message};
use crate::source::git::{GitError, GitMirror, GitRemote};

/// How often a rejected push is redone on a new tip before giving up (until the next change).
const MAX_TRIES: u32 = 6;

/// The local ref a commit is pushed from.
const PUSH_REF: &str = "refs/linnet/writeback";

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Every file already had this content on the branch: no commit.
    Unchanged,
    /// A commit was pushed, after `retries` rejected pushes.
    Committed { commit: Oid, retries: u32 },
}

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("the remote rejected the push {tries} times (the branch kept moving); will try again")]
    KeptMoving { tries: u32 },
    #[error(
        "the remote refused the push of {branch}: {reason}; check that the token may push to it and that the branch is not protected"
    )]
    Refused { branch: String, reason: String },
}

impl WriteError {
    /// A stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            WriteError::Git(e) => e.label(),
            WriteError::KeptMoving { .. } => "kept_moving",
            WriteError::Refused { .. } => "refused",
        }
    }
}

/// The one writer of status files to one branch of one repository.
pub struct StatusWriter {
    mirror: GitMirror,
    author: (String, String),
}

enum PushResult {
    Done,
    /// The branch moved under us.
    Stale,
}

impl StatusWriter {
    /// A writer for `remote` (its `branch` is the one written), keeping its clone in `dir`.
    pub fn open(
        dir: &Path,
        remote: GitRemote,
        author_name: &str,
        author_email: &str,
    ) -> Result<StatusWriter, GitError> {
        Ok(StatusWriter {
            mirror: GitMirror::open(dir, remote)?.full_history(),
            author: (author_name.to_string(), author_email.to_string()),
        })
    }

    /// Writes `files` on top of the branch and pushes, if any of them changed.
    pub fn write(&self, files: &[StatusFile]) -> Result<Pushed, WriteError> {
        self.write_with(files, || {})
    }

    /// [`StatusWriter::write`], calling `before_push` just before each push (tests use it to
    /// push a human commit at the worst moment).
    pub fn write_with(
        &self,
        files: &[StatusFile],
        mut before_push: impl FnMut(),
    ) -> Result<Pushed, WriteError> {
        for attempt in 0..MAX_TRIES {
            let tip = match self.mirror.fetch() {
                Ok(tip) => Some(tip),
                Err(GitError::NoSuchBranch { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            let Some(commit) = self.commit_on(tip, files)? else {
                return Ok(Pushed::Unchanged);
            };
            before_push();
            match self.push(commit)? {
                PushResult::Done => {
                    return Ok(Pushed::Committed {
                        commit,
                        retries: attempt,
                    });
                }
                PushResult::Stale => {
                    tracing::info!(
                        attempt = attempt + 1,
                        "the branch moved; writing the status again on its new tip"
                    );
                    std::thread::sleep(Duration::from_millis(50 << attempt.min(5)));
                }
            }
        }
        Err(WriteError::KeptMoving { tries: MAX_TRIES })
    }

    /// A commit of `files` on `tip`, or `None` when they are all there already.
    fn commit_on(&self, tip: Option<Oid>, files: &[StatusFile]) -> Result<Option<Oid>, GitError> {
        let repo = self.mirror.repo();
        let parent = tip.map(|t| repo.find_commit(t)).transpose()?;
        let base = parent.as_ref().map(|c| c.tree()).transpose()?;
        let mut index = Index::new()?;
        if let Some(tree) = &base {
            index.read_tree(tree)?;
        }
        let mut changed = Vec::new();
        for f in files {
            let current = base
                .as_ref()
                .and_then(|t| t.get_path(Path::new(&f.path)).ok())
                .and_then(|e| repo.find_blob(e.id()).ok())
                .map(|b| b.content().to_vec());
            if current.as_deref() == Some(f.content.as_bytes()) {
                continue;
            }
            let blob = repo.blob(f.content.as_bytes())?;
            index.add(&entry(&f.path, f.content.len(), blob))?;
            changed.push(f);
        }
        if changed.is_empty() {
            return Ok(None);
        }
        let tree = repo.find_tree(index.write_tree_to(repo)?)?;
        let signature = Signature::now(&self.author.0, &self.author.1)?;
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        let commit = repo.commit(
            None,
            &signature,
            &signature,
            &commit_message(&changed),
            &tree,
            &parents,
        )?;
        Ok(Some(commit))
    }

    /// Pushes `commit` to the branch as a fast-forward only.
    fn push(&self, commit: Oid) -> Result<PushResult, WriteError> {
        let repo = self.mirror.repo();
        let branch = &self.mirror.remote().branch;
        repo.reference(PUSH_REF, commit, true, "linnet write-back")
            .map_err(GitError::from)?;
        let rejected: RefCell<Option<String>> = RefCell::new(None);
        let mut callbacks = self.mirror.callbacks();
        callbacks.push_update_reference(|_, status| {
            if let Some(reason) = status {
                *rejected.borrow_mut() = Some(reason.to_string());
            }
            Ok(())
        });
        let mut options = PushOptions::new();
        options.remote_callbacks(callbacks);
        // No `+`: the remote accepts only a fast-forward.
        let refspec = format!("{PUSH_REF}:refs/heads/{branch}");
        let mut remote = repo.find_remote("origin").map_err(GitError::from)?;
        let result = remote.push(&[refspec.as_str()], Some(&mut options));
        drop(options);
        let stale = |reason: &str| {
            reason.contains("fast-forward")
                || reason.contains("fetch first")
                || reason.contains("stale")
                || reason.contains("non-fast")
        };
        match result {
            Err(e) if e.code() == git2::ErrorCode::NotFastForward || stale(e.message()) => {
                Ok(PushResult::Stale)
            }
            Err(e) => Err(WriteError::Git(self.mirror.classify(e))),
            Ok(()) => match rejected.into_inner() {
                None => Ok(PushResult::Done),
                Some(reason) if stale(&reason) => Ok(PushResult::Stale),
                Some(reason) => Err(WriteError::Refused {
                    branch: branch.clone(),
                    reason,
                }),
            },
        }
    }
}

fn entry(path: &str, size: usize, id: Oid) -> IndexEntry {
    IndexEntry {
        ctime: IndexTime::new(0, 0),
        mtime: IndexTime::new(0, 0),
        dev: 0,
        ino: 0,
        mode: 0o100_644,
        uid: 0,
        gid: 0,
        file_size: size as u32,
        id,
        flags: (path.len().min(0xfff)) as u16,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}
