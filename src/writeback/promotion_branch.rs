//! The branch of a promotion pull request (issue 50): the next environment's rollout is found
//! under `promoteTo.path` at the tip of its branch (`promoteTo.branch`, or the followed
//! one), given the promoted image and the config keys that changed with it
//! ([`super::config_carry`]), committed, and pushed to a branch of its own, never by force.

use std::path::Path;

use git2::{ObjectType, Oid};

use super::config_carry::{self, Carried};
use super::promotion::{Promotion, next_edit};
use super::push::{BranchPushed, PushResult, StatusWriter, WriteError};
use super::revert::Revert;
use crate::source::git::{GitError, GitMirror, GitRemote};

/// What pushing a promotion's branch did.
pub struct PromotionPushed {
    pub pushed: BranchPushed,
    /// The next environment's edit (`None`: it runs the image already).
    pub edit: Option<Revert>,
    /// The branch the pull request goes into.
    pub base: String,
    pub carried: Carried,
}

impl StatusWriter {
    /// Finds the next environment's rollout under `p.path` at its branch's tip, commits it the
    /// promoted image and the carried config, and pushes that to a new branch `branch`, as
    /// [`StatusWriter::push_revert_branch`] does.
    pub fn push_promotion_branch(
        &mut self,
        p: &Promotion,
        branch: &str,
    ) -> Result<PromotionPushed, WriteError> {
        self.mirror.set_deadline(self.timeout);
        let source_tip = self.mirror.fetch()?;
        let base = p
            .branch
            .clone()
            .unwrap_or_else(|| self.branch().to_string());
        let tip = if base == self.branch() {
            source_tip
        } else {
            // The same clone: the next environment's branch is fetched beside the followed one.
            let remote = GitRemote {
                branch: base.clone(),
                ..self.mirror.remote().clone()
            };
            let mut other = GitMirror::open_existing(self.mirror.dir(), remote)?.full_history();
            other.set_deadline(self.timeout);
            other.fetch()?
        };
        let not_needed = |base: String| PromotionPushed {
            pushed: BranchPushed::NotNeeded,
            edit: None,
            base,
            carried: Carried::default(),
        };
        let (edit, carried) = {
            let repo = self.mirror.repo();
            let tree = repo
                .find_commit(tip)
                .and_then(|c| c.tree())
                .map_err(GitError::from)?;
            let files = yaml_files_under(repo, &tree, &p.path);
            let Some(edit) = next_edit(
                p,
                files
                    .iter()
                    .map(|(path, text)| (path.clone(), text.as_str())),
            )?
            else {
                return Ok(not_needed(base));
            };
            let carried =
                carry_config(repo, source_tip, p, &edit, &files).map_err(GitError::from)?;
            (edit, carried)
        };
        let message = p.message(&edit, &carried);
        let Some(commit) = self.edit_on(Some(tip), &edit, &message, false, &carried.files)? else {
            return Ok(not_needed(base));
        };
        let pushed = match self.push_to(branch, commit, None)? {
            PushResult::Done => BranchPushed::Pushed(commit),
            PushResult::Stale => BranchPushed::Exists,
        };
        Ok(PromotionPushed {
            pushed,
            edit: Some(edit),
            base,
            carried,
        })
    }
}

/// The config keys that changed with the promoted image on the followed branch, carried into
/// the next environment's `files`. The rollout's own file is edited for its image too, so a
/// config document in it is carried on top of that edit.
fn carry_config(
    repo: &git2::Repository,
    source_tip: Oid,
    p: &Promotion,
    edit: &Revert,
    files: &[(String, String)],
) -> Result<Carried, git2::Error> {
    let mut carried = Carried::default();
    let Some(source_path) = &p.source_path else {
        return Ok(carried);
    };
    let tip = repo.find_commit(source_tip)?;
    let changes = config_carry::changes_with_the_image(
        repo,
        &tip,
        source_path,
        (p.kind, &p.name, &p.image),
        &p.config,
    )?;
    if changes.is_empty() {
        return Ok(carried);
    }
    let mut found = Vec::new();
    for (path, text) in files {
        let text = if *path == edit.path {
            match super::revert::set_image(text, edit) {
                Ok(Some(edited)) => edited,
                _ => text.clone(),
            }
        } else {
            text.clone()
        };
        if let Some(out) = config_carry::carry_into(&text, &changes, &mut carried, &mut found) {
            carried.files.push((path.clone(), out));
        }
    }
    for c in &changes {
        if !found.iter().any(|(k, n)| *k == c.kind && *n == c.name) {
            carried.kept.push(format!(
                "{} {} (not carried: {} has no {} of that name)",
                c.kind.as_str(),
                c.name,
                p.place(),
                c.kind.as_str()
            ));
        }
    }
    Ok(carried)
}

/// The most YAML files, the largest, and the most bytes in all, read under a promotion's
/// path (whoever can push controls them).
const MAX_PROMOTION_FILES: usize = 2000;
const MAX_PROMOTION_FILE_BYTES: usize = 1024 * 1024;
const MAX_PROMOTION_BYTES: usize = 16 * 1024 * 1024;

/// The YAML files (path from the root, text) at `path` in `tree`: the file itself, or every
/// `.yaml` and `.yml` file below the directory, within the bounds above.
fn yaml_files_under(
    repo: &git2::Repository,
    tree: &git2::Tree<'_>,
    path: &str,
) -> Vec<(String, String)> {
    let text = |id: Oid| {
        repo.find_blob(id)
            .ok()
            .filter(|b| b.size() <= MAX_PROMOTION_FILE_BYTES)
            .and_then(|b| String::from_utf8(b.content().to_vec()).ok())
    };
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return Vec::new();
    };
    match entry.kind() {
        Some(ObjectType::Blob) => text(entry.id())
            .map(|t| vec![(path.to_string(), t)])
            .unwrap_or_default(),
        Some(ObjectType::Tree) => {
            let Ok(dir) = repo.find_tree(entry.id()) else {
                return Vec::new();
            };
            let mut files = Vec::new();
            let mut bytes = 0;
            let _ = dir.walk(git2::TreeWalkMode::PreOrder, |parent, e| {
                let name = e.name().unwrap_or_default();
                let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
                if e.kind() == Some(ObjectType::Blob)
                    && yaml
                    && let Some(t) = text(e.id())
                {
                    bytes += t.len();
                    files.push((format!("{path}/{parent}{name}"), t));
                }
                if files.len() >= MAX_PROMOTION_FILES || bytes >= MAX_PROMOTION_BYTES {
                    git2::TreeWalkResult::Abort
                } else {
                    git2::TreeWalkResult::Ok
                }
            });
            files
        }
        _ => Vec::new(),
    }
}
