//! Reverts and promotions of rollouts that a Kustomize overlay or a Helm release renders
//! (issue 50): the image is not written in the rollout's file but in the overlay's `images:`
//! (`newTag`, `newName`) or in a values file, so that is where it is set. Pure: each edit
//! takes the text and gives the new text; only the image's own characters change.
//!
//! - A kustomization: the `images:` entry for the image's repository (by `newName`, else
//!   `name`) gets the new tag (and name). A promotion into an overlay without an entry for it
//!   adds one; a revert needs the entry that asks for the failed image.
//! - A Helm release (`linnet-helm.yaml`): its inline `values:`, then its values files from the
//!   last (Helm merges them in order, the last wins): the first scalar that is the whole image
//!   (`image: redis:7.4`), or a `tag:` beside a `repository:` of the image's repository.

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::revert::{RevertError, image_offset, plain_safe};

/// The file a rendered rollout's source path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendered {
    Kustomization,
    HelmRelease,
}

/// Whether `path` is a kustomization or a `linnet-helm.yaml`, whose rollouts are rendered.
pub fn rendered(path: &str) -> Option<Rendered> {
    let name = path.rsplit('/').next().unwrap_or(path);
    match name {
        "kustomization.yaml" | "kustomization.yml" | "Kustomization" => {
            Some(Rendered::Kustomization)
        }
        "linnet-helm.yaml" => Some(Rendered::HelmRelease),
        _ => None,
    }
}

/// `repo:tag` (or `repo@digest`) as (repository, tag); a digest counts as no tag.
pub fn split_image(image: &str) -> (&str, Option<&str>) {
    if let Some((repo, _)) = image.split_once('@') {
        return (repo, None);
    }
    // The last `:` after the last `/` is the tag's (a registry may have a port).
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].rfind(':') {
        Some(i) => (&image[..slash + i], Some(&image[slash + i + 1..])),
        None => (image, None),
    }
}

#[derive(Deserialize)]
struct Kustomization {
    #[serde(default)]
    images: Vec<ImageEntry>,
    #[serde(default)]
    resources: Vec<String>,
}

/// The `resources:` of kustomization `text` (empty when it does not parse).
pub fn kustomize_resources(text: &str) -> Vec<String> {
    serde_saphyr::from_str_with_options::<Kustomization>(
        text,
        crate::specs::bounded_parser_options(),
    )
    .map(|k| k.resources)
    .unwrap_or_default()
}

/// `resource` of the kustomization in directory `dir`, as a path from the repository's root;
/// `None` for a URL or a path that leaves the repository.
pub fn resource_path(dir: &str, resource: &str) -> Option<String> {
    if resource.contains("://") || resource.starts_with('/') || resource.contains('?') {
        return None;
    }
    let mut parts: Vec<&str> = dir
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    for part in resource.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

#[derive(Deserialize)]
struct ImageEntry {
    name: Option<Spanned<String>>,
    #[serde(rename = "newName")]
    new_name: Option<Spanned<String>>,
    #[serde(rename = "newTag")]
    new_tag: Option<Spanned<String>>,
}

/// What the overlay gives now for an image: `Some(image)` from its `images:` entry, `None`
/// when it has no entry for the repository (the base's image is rendered).
pub fn kustomize_image(text: &str, repo: &str) -> Option<String> {
    let k: Kustomization =
        serde_saphyr::from_str_with_options(text, crate::specs::bounded_parser_options()).ok()?;
    k.images.iter().find_map(|e| {
        let name = e.new_name.as_ref().or(e.name.as_ref())?;
        let matches = name.value == repo || e.name.as_ref().is_some_and(|n| n.value == repo);
        matches.then(|| match &e.new_tag {
            Some(tag) => format!("{}:{}", name.value, tag.value),
            None => name.value.clone(),
        })
    })
}

/// `text` (a kustomization at `path`) with its `images:` entry for `to`'s repository set to
/// `to`. `from`: the image the entry must give now (a revert), or `None` (a promotion: an
/// entry is added when there is none). `Ok(None)`: it gives `to` already, or no longer
/// gives `from`.
pub fn set_kustomize_image(
    path: &str,
    text: &str,
    from: Option<&str>,
    to: &str,
) -> Result<Option<String>, RevertError> {
    let (repo, tag) = split_image(to);
    let tag = tag.ok_or_else(|| RevertError::Rendered {
        path: path.to_string(),
        reason: format!("{to} has no tag to write in newTag"),
    })?;
    let k: Kustomization =
        serde_saphyr::from_str_with_options(text, crate::specs::bounded_parser_options()).map_err(
            |e| RevertError::Rendered {
                path: path.to_string(),
                reason: format!("it does not parse: {e}"),
            },
        )?;
    let from_repo = from.map(|f| split_image(f).0).unwrap_or(repo);
    let entry = k.images.iter().find(|e| {
        let effective = e.new_name.as_ref().or(e.name.as_ref());
        [effective, e.name.as_ref()]
            .into_iter()
            .flatten()
            .any(|n| n.value == from_repo || n.value == repo)
    });
    let Some(entry) = entry else {
        if from.is_some() {
            return Err(RevertError::Rendered {
                path: path.to_string(),
                reason: format!(
                    "its images: has no entry for {from_repo}; the failed image comes from its \
                     base, which other overlays share, so it is not edited"
                ),
            });
        }
        return add_kustomize_entry(path, text, repo, tag).map(Some);
    };
    let current = kustomize_image(text, from_repo).or_else(|| kustomize_image(text, repo));
    if current.as_deref() == Some(to) {
        return Ok(None);
    }
    if let Some(f) = from
        && current.as_deref() != Some(f)
    {
        return Ok(None);
    }
    let mut out = text.to_string();
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let Some(new_tag) = &entry.new_tag else {
        return Err(RevertError::Rendered {
            path: path.to_string(),
            reason: format!("its images: entry for {repo} has no newTag to set"),
        });
    };
    edits.push(scalar_edit(text, new_tag, tag).ok_or_else(|| not_found(path, &new_tag.value))?);
    let effective = entry.new_name.as_ref().or(entry.name.as_ref());
    if let Some(name) = effective.filter(|n| n.value != repo) {
        match &entry.new_name {
            Some(new_name) => edits.push(
                scalar_edit(text, new_name, repo).ok_or_else(|| not_found(path, &name.value))?,
            ),
            None => {
                return Err(RevertError::Rendered {
                    path: path.to_string(),
                    reason: format!("{to} is not {}; set newName there", name.value),
                });
            }
        }
    }
    edits.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (at, len, with) in edits {
        out.replace_range(at..at + len, &with);
    }
    Ok(Some(out))
}

fn not_found(path: &str, value: &str) -> RevertError {
    RevertError::Rendered {
        path: path.to_string(),
        reason: format!("cannot find {value} where the parser put it"),
    }
}

/// The byte range of `scalar`'s value in `text` and what replaces it (quoted as it was, or
/// double-quoted when a plain scalar would read back as something else).
fn scalar_edit(text: &str, scalar: &Spanned<String>, with: &str) -> Option<(usize, usize, String)> {
    let at = image_offset(text, scalar, &scalar.value)?;
    Some((at, scalar.value.len(), quoted_as_needed(&text[..at], with)))
}

/// `with` as it may follow `before`: as it is inside quotes or where a plain scalar reads back
/// the same, else double-quoted (JSON's string syntax is YAML's).
fn quoted_as_needed(before: &str, with: &str) -> String {
    if before.ends_with(['"', '\'']) || plain_safe(with) {
        with.to_string()
    } else {
        serde_json::Value::String(with.to_string()).to_string()
    }
}

/// `text` with an `images:` entry for `repo` at `tag`: under its `images:` (a block list),
/// or as a new `images:` at the end.
fn add_kustomize_entry(
    path: &str,
    text: &str,
    repo: &str,
    tag: &str,
) -> Result<String, RevertError> {
    let entry = |indent: &str| {
        format!(
            "{indent}- name: {}\n{indent}  newTag: {}\n",
            serde_json::Value::String(repo.to_string()),
            serde_json::Value::String(tag.to_string())
        )
    };
    let mut offset = 0;
    let mut lines = text.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        offset += line.len();
        let bare = line.trim_end();
        if bare == "images:" {
            let indent: String = lines
                .peek()
                .map(|next| next.chars().take_while(|c| *c == ' ').collect())
                .unwrap_or_default();
            let mut out = text.to_string();
            out.insert_str(offset, &entry(&indent));
            return Ok(out);
        }
        if bare.starts_with("images:") {
            return Err(RevertError::Rendered {
                path: path.to_string(),
                reason: "its images: is not a block list; add an entry for the image there".into(),
            });
        }
    }
    let mut out = text.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("images:\n");
    out.push_str(&entry(""));
    Ok(out)
}

#[derive(Deserialize)]
struct HelmFile {
    #[serde(default, rename = "valuesFiles")]
    values_files: Vec<String>,
}

/// The values files of a `linnet-helm.yaml` at `path` (from the repository's root), the last
/// first, after the file itself (its inline `values:` are merged last).
pub fn helm_value_sources(path: &str, text: &str) -> Vec<String> {
    let dir = crate::render::dir_of(path);
    let files: Vec<String> = serde_saphyr::from_str_with_options::<HelmFile>(
        text,
        crate::specs::bounded_parser_options(),
    )
    .map(|h| h.values_files)
    .unwrap_or_default();
    let mut out = vec![path.to_string()];
    // A values file outside the repository is not the release's (the renderer refuses it).
    out.extend(
        files
            .iter()
            .rev()
            .filter_map(|f| crate::render::join_relative(dir, f)),
    );
    out
}

/// What a values file does with the image.
#[derive(Debug, PartialEq, Eq)]
pub enum ValuesEdit {
    /// It sets the image: the new text.
    Edited(String),
    /// It sets the image to `to` already.
    Already,
    /// It does not set it.
    NotHere,
}

/// `text` (a values file) with the image set to `to`: the first scalar that is the whole
/// image (`from`, or for a promotion any image of `to`'s repository), else a `tag:` (`from`'s
/// tag) in a file that names the repository.
pub fn set_values_image(text: &str, from: Option<&str>, to: &str) -> ValuesEdit {
    let (repo, tag) = split_image(to);
    let from_repo = from.map_or(repo, |f| split_image(f).0);
    let from_tag = from.and_then(|f| split_image(f).1);
    let value_of = |line: &str| -> Option<(usize, String)> {
        let (key, rest) = line.split_once(':')?;
        let key = key.trim().trim_start_matches("- ");
        if key.is_empty() || key.contains(' ') {
            return None;
        }
        let rest_start = line.len() - rest.len();
        let value = rest.split(" #").next().unwrap_or("").trim();
        let unquoted = value.trim_matches(|c| c == '"' || c == '\'');
        let at = rest_start + rest.find(unquoted)?;
        (!unquoted.is_empty()).then(|| (at, unquoted.to_string()))
    };
    let names_repo = text
        .lines()
        .filter_map(value_of)
        .any(|(_, v)| v == from_repo || v == repo);
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let Some((at, value)) = value_of(line.trim_end_matches(['\n', '\r'])) else {
            continue;
        };
        let whole = match from {
            Some(f) => value == f,
            None => split_image(&value).0 == repo && split_image(&value).1.is_some(),
        } || (from.is_some() && value == to);
        let key = line.trim_start().trim_start_matches("- ");
        let is_tag = key.starts_with("tag:")
            && names_repo
            && from_tag.is_none_or(|t| value == t)
            && tag.is_some();
        let with = if whole {
            to
        } else if is_tag {
            tag.unwrap_or_default()
        } else {
            continue;
        };
        if value == with {
            return ValuesEdit::Already;
        }
        let mut out = text.to_string();
        let with = quoted_as_needed(&line[..at], with);
        out.replace_range(start + at..start + at + value.len(), &with);
        return ValuesEdit::Edited(out);
    }
    ValuesEdit::NotHere
}

#[cfg(test)]
mod tests;
