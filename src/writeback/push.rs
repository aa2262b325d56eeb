//! Commits status files on top of a branch and pushes them, never by force. A push that the
//! remote rejects because the branch moved (a human pushed in between) is redone: fetch the
//! new tip, write the status files onto it afresh (they are linnet's own), push again, with
//! backoff and a bounded number of tries. The human's commit is always the new parent, so it
//! is never lost. Revert commits ([`super::revert`]) go the same way: the file is read and
//! edited again on each new tip. Every call blocks; the agent runs them on `spawn_blocking`.
//!
//! To a path or `file://` remote, libgit2's local transport writes the branch itself, checking
//! fast-forward only against the tip it read when it connected: a human push landing in
//! between would be overwritten. There the commit's objects go to a ref of linnet's own, and
//! the branch is moved by a compare-and-swap under Git's ref lock, from the very tip the
//! commit was built on.

use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

#[cfg(test)]
use git2::{Index, IndexEntry, IndexTime};
use git2::{ObjectType, Oid, PushOptions, Signature};

use super::revert::{Revert, RevertError};
use super::status_files::{StatusFile, commit_message};
use crate::source::git::{GitError, GitMirror, GitRemote, local_path};

/// How often a rejected push is redone on a new tip before giving up (until the next change).
const MAX_TRIES: u32 = 6;

/// The local ref a commit is pushed from.
pub const PUSH_REF: &str = "refs/linnet/writeback";

/// The local ref of the writer's last commit that the remote accepted: [`PUSH_REF`] also
/// holds a commit while its push is in flight, or after it was refused.
pub const PUSHED_REF: &str = "refs/linnet/pushed";

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Every file already had this content on the branch: no commit.
    Unchanged,
    /// A commit was pushed, after `retries` rejected pushes.
    Committed { commit: Oid, retries: u32 },
}

/// What pushing a revert pull request's branch did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BranchPushed {
    /// The file no longer asks for the failed image: no branch, no pull request.
    NotNeeded,
    Pushed(Oid),
    /// The branch was there already (pushed before a restart).
    Exists,
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
    #[error(transparent)]
    Revert(#[from] RevertError),
    #[error("the write stopped on a panic ({0}); it is tried again with the next change")]
    Panicked(String),
    #[error(transparent)]
    Action(#[from] super::action_edit::ActionEditError),
}

impl From<super::image_edit::EditError> for WriteError {
    fn from(e: super::image_edit::EditError) -> Self {
        match e {
            super::image_edit::EditError::Revert(e) => WriteError::Revert(e),
            super::image_edit::EditError::Git(e) => WriteError::Git(e),
        }
    }
}

impl WriteError {
    /// Every label [`WriteError::label`] gives, besides those of [`GitError`].
    pub const LABELS: &'static [&'static str] =
        &["kept_moving", "refused", "revert", "panic", "action_edit"];

    /// A stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            WriteError::Git(e) => e.label(),
            WriteError::KeptMoving { .. } => "kept_moving",
            WriteError::Refused { .. } => "refused",
            WriteError::Revert(_) => "revert",
            WriteError::Panicked(_) => "panic",
            WriteError::Action(_) => "action_edit",
        }
    }
}

/// The one writer of status files to one branch of one repository.
pub struct StatusWriter {
    pub(super) mirror: GitMirror,
    pub(super) author: (String, String),
    /// How long one fetch-and-push may take (--git-timeout).
    pub(super) timeout: Option<Duration>,
    /// Signs every commit (`--git-signing-key`).
    pub(super) signer: Option<std::sync::Arc<super::signing::CommitSigner>>,
}

pub(super) enum PushResult {
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
            timeout: None,
            signer: None,
        })
    }

    /// Signs every commit with `signer`, when given.
    pub fn with_signer(
        mut self,
        signer: Option<std::sync::Arc<super::signing::CommitSigner>>,
    ) -> Self {
        self.signer = signer;
        self
    }

    /// A commit of `tree` on `parents` by the writer's author, signed when it has a key.
    pub(super) fn new_commit(
        &self,
        message: &str,
        tree: &git2::Tree<'_>,
        parents: &[&git2::Commit<'_>],
    ) -> Result<Oid, git2::Error> {
        let who = Signature::now(&self.author.0, &self.author.1)?;
        super::signing::create_commit(
            self.mirror.repo(),
            self.signer.as_deref(),
            &who,
            message,
            tree,
            parents,
        )
    }

    /// Each try (a fetch and a push) gives up after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Writes `files` on top of the branch and pushes, if any of them changed.
    pub fn write(&mut self, files: &[StatusFile]) -> Result<Pushed, WriteError> {
        self.write_with(files, || {})
    }

    /// [`StatusWriter::write`], calling `before_push` just before each push (tests use it to
    /// push a human commit at the worst moment).
    pub fn write_with(
        &mut self,
        files: &[StatusFile],
        before_push: impl FnMut(),
    ) -> Result<Pushed, WriteError> {
        self.push_on_tip(|w, tip| Ok(w.commit_on(tip, files)?), before_push)
    }

    /// Commits `revert` on the branch's tip and pushes it, redone on a new tip when the push
    /// is rejected: [`Pushed::Unchanged`] when the file no longer asks for the failed image.
    pub fn revert(&mut self, revert: &Revert) -> Result<Pushed, WriteError> {
        self.revert_with(revert, || {})
    }

    /// [`StatusWriter::revert`] with a hook before each push, as [`StatusWriter::write_with`].
    pub fn revert_with(
        &mut self,
        revert: &Revert,
        before_push: impl FnMut(),
    ) -> Result<Pushed, WriteError> {
        self.push_on_tip(
            |w, tip| w.edit_on(tip, revert, &revert.message(), true, &[]),
            before_push,
        )
    }

    /// Fetches the tip, builds a commit on it with `build` (`None`: nothing to write), and
    /// pushes it as a fast-forward; a rejected push starts again on the new tip.
    pub(super) fn push_on_tip(
        &mut self,
        mut build: impl FnMut(&Self, Option<Oid>) -> Result<Option<Oid>, WriteError>,
        mut before_push: impl FnMut(),
    ) -> Result<Pushed, WriteError> {
        let mut retries =
            crate::retry::Retries::new(Duration::from_millis(50), Duration::from_secs(2));
        for attempt in 0..MAX_TRIES {
            self.mirror.set_deadline(self.timeout);
            let tip = match self.mirror.fetch() {
                Ok(tip) => Some(tip),
                Err(GitError::NoSuchBranch { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            let Some(commit) = build(self, tip)? else {
                return Ok(Pushed::Unchanged);
            };
            before_push();
            match self.push(commit, tip)? {
                PushResult::Done => {
                    // Only the dashboard's history reads it, so a failure costs no write.
                    let repo = self.mirror.repo();
                    if let Err(e) = repo.reference(PUSHED_REF, commit, true, "linnet pushed") {
                        tracing::warn!(error = %e.message(), "cannot record the pushed commit");
                    }
                    return Ok(Pushed::Committed {
                        commit,
                        retries: attempt,
                    });
                }
                PushResult::Stale => {
                    tracing::info!(
                        attempt = attempt + 1,
                        "the branch moved; writing again on its new tip"
                    );
                    std::thread::sleep(retries.wait());
                }
            }
        }
        Err(WriteError::KeptMoving { tries: MAX_TRIES })
    }

    /// A commit on `tip`, with `message`, that sets the image in `revert`'s file, or `None`
    /// when the file no longer asks for the image it replaces. `with_config`: the ConfigMaps
    /// and Secrets that came in with the failed image go back too
    /// ([`super::config_revert`]). `extra`: more files (path, text) written in the same commit.
    pub(super) fn edit_on(
        &self,
        tip: Option<Oid>,
        revert: &Revert,
        message: &str,
        with_config: bool,
        extra: &[(String, String)],
    ) -> Result<Option<Oid>, WriteError> {
        let no_file = || RevertError::NoFile {
            path: revert.path.clone(),
        };
        let repo = self.mirror.repo();
        let parent = repo
            .find_commit(tip.ok_or_else(no_file)?)
            .map_err(GitError::from)?;
        let base = parent.tree().map_err(GitError::from)?;
        let Some(edited) = super::image_edit::image_edits(repo, &base, revert)? else {
            return Ok(None);
        };
        // A file in `extra` is written as it is there (the edit is made in it already).
        let mut edits = Vec::new();
        for (path, text) in edited
            .iter()
            .filter(|(p, _)| !extra.iter().any(|(e, _)| e == p))
        {
            edits.push((
                path.as_str(),
                Some(repo.blob(text.as_bytes()).map_err(GitError::from)?),
            ));
        }
        for (path, text) in extra {
            edits.push((
                path.as_str(),
                Some(repo.blob(text.as_bytes()).map_err(GitError::from)?),
            ));
        }
        let mut message = message.to_string();
        let back = if with_config {
            super::config_revert::config_with_the_change(repo, &parent, revert)
                .map_err(GitError::from)?
        } else {
            Default::default()
        };
        if let (false, Some(change)) = (back.files.is_empty(), back.change) {
            let short: String = change.to_string().chars().take(12).collect();
            let names: Vec<&str> = back.files.iter().map(|(p, _)| p.as_str()).collect();
            message.push_str(&format!(
                "\n\nThe config that came in with it goes back to before {short}: {}",
                names.join(", ")
            ));
            edits.extend(back.files.iter().map(|(p, id)| (p.as_str(), *id)));
        }
        let (tree, _) = tree_with(repo, Some(&base), &edits).map_err(GitError::from)?;
        let tree = repo.find_tree(tree).map_err(GitError::from)?;
        let commit = self
            .new_commit(&message, &tree, &[&parent])
            .map_err(GitError::from)?;
        Ok(Some(commit))
    }

    /// A commit of `files` on `tip`, or `None` when they are all there already. Only the
    /// trees on the changed files' paths are read and written again, and a file is compared
    /// by its blob id, so the cost follows the files written, not the repository's size.
    fn commit_on(&self, tip: Option<Oid>, files: &[StatusFile]) -> Result<Option<Oid>, GitError> {
        let repo = self.mirror.repo();
        let parent = tip.map(|t| repo.find_commit(t)).transpose()?;
        let base = parent.as_ref().map(|c| c.tree()).transpose()?;
        let mut changed = Vec::new();
        let mut edits: Vec<(&str, Option<Oid>)> = Vec::new();
        let at = |path: &str| {
            base.as_ref()
                .and_then(|t| t.get_path(Path::new(path)).ok())
                .filter(|e| e.kind() == Some(ObjectType::Blob))
                .map(|e| e.id())
        };
        for f in files {
            let id = Oid::hash_object(ObjectType::Blob, f.content.as_bytes())?;
            let stale: Vec<&str> = f
                .replaces
                .iter()
                .map(String::as_str)
                .filter(|old| at(old).is_some())
                .collect();
            let current = at(&f.path) == Some(id);
            if current && stale.is_empty() {
                continue;
            }
            if !current {
                edits.push((f.path.as_str(), Some(repo.blob(f.content.as_bytes())?)));
            }
            // The file moves out of the old layouts in the commit that writes it.
            for old in stale {
                edits.push((old, None));
            }
            changed.push(f);
        }
        if changed.is_empty() {
            return Ok(None);
        }
        let tree = repo.find_tree(tree_with(repo, base.as_ref(), &edits)?.0)?;
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        let commit = self.new_commit(&commit_message(&changed), &tree, &parents)?;
        Ok(Some(commit))
    }

    /// Commits `revert` on the followed branch's tip and pushes it to a new branch `branch`
    /// (for a pull request). A branch that exists already is left as it is: its name is the
    /// failure's, so it holds this very revert.
    pub fn push_revert_branch(
        &mut self,
        revert: &Revert,
        branch: &str,
    ) -> Result<BranchPushed, WriteError> {
        self.mirror.set_deadline(self.timeout);
        let tip = match self.mirror.fetch() {
            Ok(tip) => Some(tip),
            Err(GitError::NoSuchBranch { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        let Some(commit) = self.edit_on(tip, revert, &revert.message(), true, &[])? else {
            return Ok(BranchPushed::NotNeeded);
        };
        Ok(match self.push_to(branch, commit, None)? {
            PushResult::Done => BranchPushed::Pushed(commit),
            PushResult::Stale => BranchPushed::Exists,
        })
    }

    /// The branch this writer follows (a revert pull request's base).
    pub fn branch(&self) -> &str {
        &self.mirror.remote().branch
    }

    /// Pushes `commit`, built on `tip`, to the branch as a fast-forward only.
    fn push(&self, commit: Oid, tip: Option<Oid>) -> Result<PushResult, WriteError> {
        let branch = self.mirror.remote().branch.clone();
        self.push_to(&branch, commit, tip)
    }

    /// Pushes `commit` to `branch`, moving it from `tip` (`None`: creating it) only.
    pub(super) fn push_to(
        &self,
        branch: &str,
        commit: Oid,
        tip: Option<Oid>,
    ) -> Result<PushResult, WriteError> {
        let repo = self.mirror.repo();
        repo.reference(PUSH_REF, commit, true, "linnet write-back")
            .map_err(GitError::from)?;
        match local_path(&self.mirror.remote().url) {
            Some(path) => self.push_local(&path, branch, commit, tip),
            None => self.push_refspec(&format!("{PUSH_REF}:refs/heads/{branch}")),
        }
    }

    /// Pushes one refspec; a non-fast-forward is [`PushResult::Stale`].
    fn push_refspec(&self, refspec: &str) -> Result<PushResult, WriteError> {
        let repo = self.mirror.repo();
        let branch = refspec
            .rsplit("refs/heads/")
            .next()
            .unwrap_or(refspec)
            .to_string();
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
        // No `+` on the branch: the remote accepts only a fast-forward.
        let mut remote = repo.find_remote("origin").map_err(GitError::from)?;
        let result = remote.push(&[refspec], Some(&mut options));
        drop(options);
        // Another pusher got in first: before the pack was sent (non-fast-forward), or while
        // the host was updating the ref (git's receive-pack: "failed to update ref", "cannot
        // lock ref", "incorrect old value provided").
        let stale = |reason: &str| {
            reason.contains("fast-forward")
                || reason.contains("fetch first")
                || reason.contains("stale")
                || reason.contains("non-fast")
                || reason.contains("failed to update ref")
                || reason.contains("failed to lock")
                || reason.contains("cannot lock ref")
                || reason.contains("incorrect old value")
        };
        match result {
            Err(e) if e.code() == git2::ErrorCode::NotFastForward || stale(e.message()) => {
                Ok(PushResult::Stale)
            }
            Err(e) => Err(WriteError::Git(self.mirror.classify(e))),
            Ok(()) => match rejected.into_inner() {
                None => Ok(PushResult::Done),
                Some(reason) if stale(&reason) => Ok(PushResult::Stale),
                Some(reason) => Err(WriteError::Refused { branch, reason }),
            },
        }
    }
}

/// `base` (or an empty tree) with each `(path, Some(blob))` of `edits` written and each
/// `(path, None)` removed: only the trees on those paths are built again; every other subtree
/// is kept by its id, and a tree left empty is dropped. A removal takes only a file at that
/// path, never a directory or a file where the path wants a directory. Returns the tree and
/// its entry count.
pub(super) fn tree_with(
    repo: &git2::Repository,
    base: Option<&git2::Tree<'_>>,
    edits: &[(&str, Option<Oid>)],
) -> Result<(Oid, usize), git2::Error> {
    let mut builder = repo.treebuilder(base)?;
    let mut subdirs: std::collections::BTreeMap<&str, Vec<(&str, Option<Oid>)>> =
        Default::default();
    for (path, blob) in edits {
        match (path.split_once('/'), blob) {
            (Some((dir, rest)), _) => subdirs.entry(dir).or_default().push((rest, *blob)),
            (None, Some(blob)) => {
                builder.insert(path, *blob, 0o100_644)?;
            }
            (None, None) => {
                if builder
                    .get(path)?
                    .is_some_and(|e| e.kind() == Some(ObjectType::Blob))
                {
                    builder.remove(path)?;
                }
            }
        }
    }
    for (dir, below) in subdirs {
        let subtree = base
            .and_then(|t| t.get_name(dir))
            .filter(|e| e.kind() == Some(ObjectType::Tree))
            .map(|e| repo.find_tree(e.id()))
            .transpose()?;
        match (tree_with(repo, subtree.as_ref(), &below)?, &subtree) {
            ((_, 0), Some(_)) => {
                builder.remove(dir)?;
            }
            // Only removals below a path that is no directory: nothing to do there.
            ((_, 0), None) => {}
            ((id, _), _) => {
                builder.insert(dir, id, 0o040_000)?;
            }
        }
    }
    Ok((builder.write()?, builder.len()))
}

#[cfg(test)]
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

mod local;
#[cfg(test)]
mod tests;
