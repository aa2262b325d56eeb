//! The branch of a dashboard action's pull request (issue 76): the rollout's file at the
//! followed branch's tip with the action's change ([`super::action_edit`]), committed as the
//! signed-in person (the agent is the committer) and pushed to a branch of its own, never by
//! force.
//!
//! Restart-safe by naming: the branch is `linnet/action/<namespace>/<name>/<action>-<hash>`,
//! the hash of the change and the file, so a second click (or the same click after a
//! `kill -9`) finds the branch and its pull request instead of opening another.

use git2::Signature;
use serde_json::Value;

use super::action_edit::{self, Target};
use super::push::{BranchPushed, PushResult, StatusWriter, WriteError};
use crate::source::git::GitError;

/// Every action branch starts with this.
pub const BRANCH_PREFIX: &str = "linnet/action/";

/// One action to commit.
#[derive(Clone, Debug)]
pub struct ActionCommit {
    pub path: String,
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// `promote`, `advance`, `abort`.
    pub action: &'static str,
    /// The merge patch of the rollout's document.
    pub change: Value,
    pub message: String,
    /// The person: name and email of the commit's author.
    pub author: (String, String),
}

impl ActionCommit {
    /// The start of every branch of this rollout's `action` (older ones are closed when a
    /// newer change is proposed).
    pub fn prefix(&self) -> String {
        format!(
            "{BRANCH_PREFIX}{}/{}/{}-",
            self.namespace, self.name, self.action
        )
    }

    /// The branch of this very change.
    pub fn branch(&self) -> String {
        let hash = crate::hash::content_hash(&serde_json::json!([self.path, self.change]));
        format!("{}{hash}", self.prefix())
    }
}

impl StatusWriter {
    /// Commits `a` on the followed branch's tip and pushes it to `a.branch()`. A branch that
    /// exists is left as it is (it holds this very change); [`BranchPushed::NotNeeded`] when
    /// the file says so already.
    pub fn push_action_branch(&mut self, a: &ActionCommit) -> Result<BranchPushed, WriteError> {
        self.mirror.set_deadline(self.timeout);
        let tip = self.mirror.fetch()?;
        let commit = {
            let repo = self.mirror.repo();
            let parent = repo.find_commit(tip).map_err(GitError::from)?;
            let tree = parent.tree().map_err(GitError::from)?;
            let text = super::image_edit::read(repo, &tree, &a.path)?.ok_or_else(|| {
                action_edit::ActionEditError::NotInFile {
                    path: a.path.clone(),
                    kind: a.kind.to_string(),
                    name: a.name.clone(),
                }
            })?;
            let target = Target {
                path: &a.path,
                kind: a.kind,
                name: &a.name,
                namespace: &a.namespace,
            };
            let Some(edited) = action_edit::apply(&text, &target, &a.change)? else {
                return Ok(BranchPushed::NotNeeded);
            };
            let blob = repo.blob(edited.as_bytes()).map_err(GitError::from)?;
            let (tree, _) = super::push::tree_with(repo, Some(&tree), &[(&a.path, Some(blob))])
                .map_err(GitError::from)?;
            let tree = repo.find_tree(tree).map_err(GitError::from)?;
            let author = Signature::now(&a.author.0, &a.author.1).map_err(GitError::from)?;
            let committer =
                Signature::now(&self.author.0, &self.author.1).map_err(GitError::from)?;
            super::signing::create_commit_for(
                repo,
                self.signer.as_deref(),
                (&author, &committer),
                &a.message,
                &tree,
                &[&parent],
            )
            .map_err(GitError::from)?
        };
        Ok(match self.push_to(&a.branch(), commit, None)? {
            PushResult::Done => BranchPushed::Pushed(commit),
            PushResult::Stale => BranchPushed::Exists,
        })
    }
}
