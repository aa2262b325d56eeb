//! Where a revert or a promotion sets the image, read from a commit's tree: the rollout's own
//! file ([`super::revert::set_image`]), or for a rendered rollout its kustomization's
//! `images:` or its Helm release's values ([`super::rendered_edit`]).

use std::path::Path;

use git2::{ObjectType, Repository, Tree};

use super::rendered_edit::{self, Rendered, ValuesEdit};
use super::revert::{Revert, RevertError, set_image};
use crate::source::git::GitError;

/// Why the edit could not be read or made (the writer's [`super::push::WriteError`] takes it).
#[derive(Debug)]
pub enum EditError {
    Revert(RevertError),
    Git(GitError),
}

impl From<RevertError> for EditError {
    fn from(e: RevertError) -> Self {
        EditError::Revert(e)
    }
}

/// The text of `path` in `tree`, within the size a spec file may have; `None`: no such file.
fn read(repo: &Repository, tree: &Tree<'_>, path: &str) -> Result<Option<String>, EditError> {
    let Some(entry) = tree
        .get_path(Path::new(path))
        .ok()
        .filter(|e| e.kind() == Some(ObjectType::Blob))
    else {
        return Ok(None);
    };
    let blob = repo
        .find_blob(entry.id())
        .map_err(|e| EditError::Git(GitError::from(e)))?;
    let max = crate::specs::ParseBudget::default().max_bytes;
    if blob.size() > max {
        return Err(RevertError::TooLarge {
            path: path.to_string(),
            bytes: blob.size(),
            max,
        }
        .into());
    }
    Ok(std::str::from_utf8(blob.content()).ok().map(str::to_string))
}

/// The files (path, new text) that give `revert`'s rollout `revert.good` in `tree`, or `None`
/// when Git no longer asks for `revert.failed` (or asks for the good image already). An
/// empty `failed` is a promotion into a rendered environment: whatever it runs now.
pub fn image_edits(
    repo: &Repository,
    tree: &Tree<'_>,
    revert: &Revert,
) -> Result<Option<Vec<(String, String)>>, EditError> {
    let no_file = || RevertError::NoFile {
        path: revert.path.clone(),
    };
    let text = read(repo, tree, &revert.path)?.ok_or_else(no_file)?;
    let from = (!revert.failed.is_empty()).then_some(revert.failed.as_str());
    let one = |edited: Option<String>| edited.map(|t| vec![(revert.path.clone(), t)]);
    match rendered_edit::rendered(&revert.path) {
        None => Ok(one(set_image(&text, revert)?)),
        Some(Rendered::Kustomization) => Ok(one(rendered_edit::set_kustomize_image(
            &revert.path,
            &text,
            from,
            &revert.good,
        )?)),
        Some(Rendered::HelmRelease) => {
            for source in rendered_edit::helm_value_sources(&revert.path, &text) {
                let Some(values) = read(repo, tree, &source)? else {
                    continue;
                };
                match rendered_edit::set_values_image(&values, from, &revert.good) {
                    ValuesEdit::Edited(t) => return Ok(Some(vec![(source, t)])),
                    ValuesEdit::Already => return Ok(None),
                    ValuesEdit::NotHere => {}
                }
            }
            match from {
                // The failed image is no longer in the values: Git moved on.
                Some(_) => Ok(None),
                None => Err(RevertError::Rendered {
                    path: revert.path.clone(),
                    reason: format!(
                        "neither it nor its values files set an image of {} (as `image: \
                         {}` or a `tag:` beside its repository)",
                        rendered_edit::split_image(&revert.good).0,
                        revert.good
                    ),
                }
                .into()),
            }
        }
    }
}
