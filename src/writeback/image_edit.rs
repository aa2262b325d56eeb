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
pub(super) fn read(
    repo: &Repository,
    tree: &Tree<'_>,
    path: &str,
) -> Result<Option<String>, EditError> {
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
        Some(Rendered::Kustomization) => {
            // A fleet's revert edits only an image this cluster's own overlay sets: one set
            // in a base the overlays share is the failed cluster's revert's to put back.
            let (failed_repo, _) = rendered_edit::split_image(&revert.failed);
            if revert.failed_in.is_some()
                && rendered_edit::kustomize_image(&text, failed_repo).is_none()
            {
                return Ok(None);
            }
            match rendered_edit::set_kustomize_image(&revert.path, &text, from, &revert.good) {
                Err(e @ RevertError::Rendered { .. }) if revert.shared_base && from.is_some() => {
                    let mut seen = std::collections::BTreeSet::new();
                    base_edit(repo, tree, &revert.path, &text, revert, &mut seen)?.ok_or(e.into())
                }
                edited => Ok(one(edited?)),
            }
        }
        Some(Rendered::HelmRelease) => {
            for source in rendered_edit::helm_value_sources(&revert.path, &text) {
                let Some(values) = read(repo, tree, &source)? else {
                    continue;
                };
                // A fleet's revert edits only values beside its own release: values the
                // releases share are the failed cluster's revert's to put back.
                let own = revert.failed_in.is_none()
                    || crate::render::dir_of(&source) == crate::render::dir_of(&revert.path);
                match rendered_edit::set_values_image(&values, from, &revert.good) {
                    ValuesEdit::Edited(t) if own => return Ok(Some(vec![(source, t)])),
                    ValuesEdit::Edited(_) | ValuesEdit::Already => return Ok(None),
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

/// The files to write (path, new text), or `None` when Git no longer asks for the failed image.
type Edits = Option<Vec<(String, String)>>;

/// The most resources (directories and files) a revert follows below an overlay.
const MAX_BASE_PATHS: usize = 64;

/// The kustomization files a base directory may have.
const KUSTOMIZATION_NAMES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// Where the failed image is set below kustomization `path` (its text `text`) when its own
/// `images:` does not set it: its `resources:`, depth first, each base's `images:` before its
/// own resources, and each file whose rollout asks for the image. Only for a fleet with
/// `onFailure: revert` ([`Revert::shared_base`]), since other overlays share the base.
/// `None`: not found below (each path once, at most [`MAX_BASE_PATHS`]); `Some(None)`: found,
/// but Git moved on.
fn base_edit(
    repo: &Repository,
    tree: &Tree<'_>,
    path: &str,
    text: &str,
    revert: &Revert,
    seen: &mut std::collections::BTreeSet<String>,
) -> Result<Option<Edits>, EditError> {
    let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
    for resource in rendered_edit::kustomize_resources(text) {
        let Some(joined) = rendered_edit::resource_path(dir, &resource) else {
            continue;
        };
        // The repository is the pusher's: a base that lists itself, or a wide tree of bases,
        // is read once and only up to a budget.
        if seen.len() >= MAX_BASE_PATHS || !seen.insert(joined.clone()) {
            continue;
        }
        let mut base = None;
        for name in KUSTOMIZATION_NAMES {
            let k = format!("{joined}/{name}");
            if let Some(t) = read(repo, tree, &k)? {
                base = Some((k, t));
                break;
            }
        }
        if let Some((k, t)) = base {
            let from = Some(revert.failed.as_str());
            match rendered_edit::set_kustomize_image(&k, &t, from, &revert.good) {
                Ok(edited) => return Ok(Some(edited.map(|e| vec![(k, e)]))),
                Err(RevertError::Rendered { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if let Some(found) = base_edit(repo, tree, &k, &t, revert, seen)? {
                return Ok(Some(found));
            }
            continue;
        }
        let Some(file_text) = read(repo, tree, &joined)? else {
            continue;
        };
        let in_file = Revert {
            path: joined.clone(),
            ..revert.clone()
        };
        match set_image(&file_text, &in_file) {
            Ok(edited) => return Ok(Some(edited.map(|e| vec![(joined, e)]))),
            Err(RevertError::NotInFile { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RevertMode;

    /// A repository whose tree has `files`.
    fn tree_of(dir: &Path, files: &[(&str, &str)]) -> (Repository, git2::Oid) {
        let repo = Repository::init(dir).unwrap();
        for (path, text) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let mut index = repo.index().unwrap();
        index
            .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
            .unwrap();
        let id = index.write_tree().unwrap();
        (repo, id)
    }

    fn web_revert(path: &str, shared_base: bool) -> Revert {
        Revert {
            path: path.into(),
            kind: "CanaryDeployment",
            namespace: "shop".into(),
            name: "web".into(),
            failed: "web:5".into(),
            good: "web:4".into(),
            why: "analysis after-2 failed".into(),
            mode: RevertMode::PullRequest,
            revision: None,
            shared_base,
            cluster: None,
            failed_in: None,
        }
    }

    const WEB: &str = "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryDeployment\nmetadata:\n  name: web\nspec:\n  image: web:5 # the canary\n";

    #[test]
    fn a_fleets_revert_finds_the_image_in_the_shared_base_and_no_other_revert_does() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, id) = tree_of(
            dir.path(),
            &[
                (
                    "base/kustomization.yaml",
                    "resources: [web.yaml, other.yaml]\n",
                ),
                ("base/other.yaml", "kind: ConfigMap\nmetadata: {name: x}\n"),
                ("base/web.yaml", WEB),
                (
                    "clusters/eu-2/kustomization.yaml",
                    "resources: [../../base, https://example.invalid/x]\n",
                ),
            ],
        );
        let tree = repo.find_tree(id).unwrap();
        let overlay = "clusters/eu-2/kustomization.yaml";
        // Without the fleet's word, the shared base is not edited.
        let refused = image_edits(&repo, &tree, &web_revert(overlay, false)).unwrap_err();
        assert!(matches!(
            refused,
            EditError::Revert(RevertError::Rendered { .. })
        ));
        let edits = image_edits(&repo, &tree, &web_revert(overlay, true))
            .unwrap()
            .unwrap();
        assert_eq!(
            edits,
            [("base/web.yaml".to_string(), WEB.replace("web:5", "web:4"))]
        );
    }

    #[test]
    fn a_fleets_revert_in_another_cluster_edits_only_what_that_cluster_sets_itself() {
        let dir = tempfile::tempdir().unwrap();
        let own = "resources: [../../base]\nimages:\n- name: web\n  newTag: \"5\"\n";
        let (repo, id) = tree_of(
            dir.path(),
            &[
                ("base/kustomization.yaml", "resources: [web.yaml]\n"),
                ("base/web.yaml", WEB),
                ("clusters/eu-1/kustomization.yaml", own),
                (
                    "clusters/eu-3/kustomization.yaml",
                    "resources: [../../base]\n",
                ),
                (
                    "releases/us-1/linnet-helm.yaml",
                    "chart: ../../charts/web\nvaluesFiles: [../shared.yaml, values.yaml]\n",
                ),
                ("releases/us-1/values.yaml", "image: web:5\n"),
                (
                    "releases/us-2/linnet-helm.yaml",
                    "chart: ../../charts/web\nvaluesFiles: [../shared.yaml]\n",
                ),
                ("releases/shared.yaml", "image: web:5\n"),
            ],
        );
        let tree = repo.find_tree(id).unwrap();
        let fleet = |path: &str| Revert {
            failed_in: Some("eu-2".into()),
            cluster: Some("eu-1".into()),
            ..web_revert(path, false)
        };
        let edits = |path: &str| image_edits(&repo, &tree, &fleet(path)).unwrap();
        let eu1 = edits("clusters/eu-1/kustomization.yaml").unwrap();
        assert_eq!(eu1[0].0, "clusters/eu-1/kustomization.yaml");
        assert!(eu1[0].1.contains("newTag: \"4\""), "{}", eu1[0].1);
        let us1 = edits("releases/us-1/linnet-helm.yaml").unwrap();
        assert_eq!(
            us1,
            [(
                "releases/us-1/values.yaml".to_string(),
                "image: web:4\n".to_string()
            )]
        );
        // Set in what the clusters share: nothing of their own, and no error either.
        assert_eq!(edits("clusters/eu-3/kustomization.yaml"), None);
        assert_eq!(edits("releases/us-2/linnet-helm.yaml"), None);
    }

    #[test]
    fn a_bases_images_entry_is_edited_before_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, id) = tree_of(
            dir.path(),
            &[
                (
                    "base/kustomization.yaml",
                    "resources: [web.yaml]\nimages:\n- name: web\n  newTag: \"5\"\n",
                ),
                ("base/web.yaml", &WEB.replace("web:5", "web:1")),
                (
                    "clusters/us-1/kustomization.yaml",
                    "resources:\n- ../../base\n",
                ),
            ],
        );
        let tree = repo.find_tree(id).unwrap();
        let edits = image_edits(
            &repo,
            &tree,
            &web_revert("clusters/us-1/kustomization.yaml", true),
        )
        .unwrap()
        .unwrap();
        assert_eq!(edits[0].0, "base/kustomization.yaml");
        assert!(edits[0].1.contains("newTag: \"4\""), "{}", edits[0].1);
    }

    #[test]
    fn bases_that_list_each_other_are_read_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, id) = tree_of(
            dir.path(),
            &[
                ("a/kustomization.yaml", "resources: [../b, ../a, ../b]\n"),
                ("b/kustomization.yaml", "resources: [../a, ../b]\n"),
                ("clusters/x/kustomization.yaml", "resources: [../../a]\n"),
            ],
        );
        let tree = repo.find_tree(id).unwrap();
        let refused = image_edits(
            &repo,
            &tree,
            &web_revert("clusters/x/kustomization.yaml", true),
        )
        .unwrap_err();
        assert!(matches!(
            refused,
            EditError::Revert(RevertError::Rendered { .. })
        ));
    }

    #[test]
    fn a_resource_path_stays_in_the_repository() {
        use rendered_edit::resource_path;
        assert_eq!(
            resource_path("clusters/eu-2", "../../base").as_deref(),
            Some("base")
        );
        assert_eq!(
            resource_path("apps", "./web.yaml").as_deref(),
            Some("apps/web.yaml")
        );
        assert_eq!(resource_path("apps", "../../etc"), None);
        assert_eq!(resource_path("apps", "https://example.invalid/x"), None);
        assert_eq!(resource_path("apps", "/etc/passwd"), None);
    }
}
