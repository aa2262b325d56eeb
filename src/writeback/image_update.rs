//! The image automation's Git side (issue 74): the `ImagePolicy` documents at the followed
//! branch's tip, and one commit that sets every marked line to its policy's pick, pushed as
//! the write-back pushes (rebuilt on the new tip when a human pushed in between, never
//! forced). Every call blocks; the loop runs them on `spawn_blocking`.
//!
//! Whoever can push may be hostile: files past [`MAX_FILE_BYTES`] are not read, and the walk
//! stops after [`MAX_FILES`] YAML files or [`MAX_BYTES`] read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use git2::{ObjectType, Oid, Repository, Tree, TreeWalkMode, TreeWalkResult};
use serde_json::Value;

use super::image_markers::{Change, MARKER, Pick, set_marked_images};
use super::push::{Pushed, StatusWriter, WriteError, tree_with};
use crate::api::{API_VERSION, IMAGE_POLICY_KIND, ImagePolicy};
use crate::source::git::GitError;

/// The largest YAML file read for markers or policies.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;
/// YAML files read at one look.
pub const MAX_FILES: usize = 20_000;
/// Bytes read at one look.
pub const MAX_BYTES: usize = 256 * 1024 * 1024;

/// A policy and the file it is in.
#[derive(Clone, Debug)]
pub struct FoundPolicy {
    pub path: String,
    pub policy: ImagePolicy,
}

/// The policies at the tip, what could not be read (`path: why`), and the images a rollout
/// failed on (named by linnet's revert commits in the branch's recent history).
#[derive(Clone, Debug, Default)]
pub struct Policies {
    pub found: Vec<FoundPolicy>,
    pub problems: Vec<String>,
    pub failed: BTreeSet<String>,
    /// The digest each image (`image:tag`) had when the automation last committed it, from
    /// the newest `Linnet-Image:` trailer naming it.
    pub committed_digests: BTreeMap<String, String>,
    /// Where each image the automation committed came from (policy, digest, commit).
    pub origins: crate::plan::image_tags::ImageOrigins,
}

/// Commits of the branch's history read for revert trailers.
pub const MAX_HISTORY: usize = 2000;

/// The lines one commit changes, by file.
pub type Changes = Vec<(String, Change)>;

/// Why a policy picked what it picked: for the commit message.
#[derive(Clone, Debug)]
pub struct Reason {
    pub pick: Pick,
    /// `sha256:…` when the registry said.
    pub digest: Option<String>,
    /// `ImagePolicy web (policies/web.yaml)`.
    pub policy: String,
    /// The policy proposes its pick in a pull request (`spec.pullRequest`).
    pub pull_request: Option<crate::api::ImagePullRequest>,
}

impl StatusWriter {
    /// The branch's tip (fetched now) and the `ImagePolicy` documents there; `None` for the
    /// documents when the tip is still `known`, whose read the caller kept.
    pub fn read_policies(
        &mut self,
        known: Option<Oid>,
    ) -> Result<(Option<Oid>, Option<Policies>), WriteError> {
        self.mirror.set_deadline(self.timeout);
        let tip = match self.mirror.fetch() {
            Ok(tip) if Some(tip) == known => return Ok((known, None)),
            Ok(tip) => tip,
            Err(GitError::NoSuchBranch { .. }) => return Ok((None, Some(Policies::default()))),
            Err(e) => return Err(e.into()),
        };
        let repo = self.mirror.repo();
        let tree = repo
            .find_commit(tip)
            .and_then(|c| c.tree())
            .map_err(GitError::from)?;
        let (failed, committed_digests, origins) = from_history(repo, tip);
        let mut out = Policies {
            failed,
            committed_digests,
            origins,
            ..Default::default()
        };
        for (path, text) in yaml_files(repo, &tree, IMAGE_POLICY_KIND) {
            for (_, doc) in super::revert::documents(&text) {
                if doc.contains(IMAGE_POLICY_KIND) {
                    match policy_of(doc) {
                        Ok(Some(policy)) => out.found.push(FoundPolicy {
                            path: path.clone(),
                            policy,
                        }),
                        Ok(None) => {}
                        Err(why) => out.problems.push(format!("{path}: {why}")),
                    }
                }
            }
        }
        Ok((Some(tip), Some(out)))
    }

    /// Sets every marked line of the branch's tip to its pick in `reasons` (keyed by the
    /// marker's policy name) in one commit, and pushes it; redone on a new tip when the push is
    /// rejected. Returns the changes of the commit that landed, by file.
    pub fn set_images(
        &mut self,
        reasons: &BTreeMap<String, Reason>,
    ) -> Result<(Pushed, Changes), WriteError> {
        let picks: BTreeMap<String, Pick> = reasons
            .iter()
            .map(|(k, r)| (k.clone(), r.pick.clone()))
            .collect();
        let mut landed = Vec::new();
        let pushed = self.push_on_tip(
            |w, tip| {
                let Some(tip) = tip else { return Ok(None) };
                let (commit, changes) = w.image_commit(tip, &picks, reasons)?;
                landed = changes;
                Ok(commit)
            },
            || {},
        )?;
        if pushed == Pushed::Unchanged {
            landed.clear();
        }
        Ok((pushed, landed))
    }

    /// A commit on `tip` with every marked line set, or `None` when every line has its pick.
    pub(super) fn image_commit(
        &self,
        tip: Oid,
        picks: &BTreeMap<String, Pick>,
        reasons: &BTreeMap<String, Reason>,
    ) -> Result<(Option<Oid>, Changes), WriteError> {
        let repo = self.mirror.repo();
        let parent = repo.find_commit(tip).map_err(GitError::from)?;
        let base = parent.tree().map_err(GitError::from)?;
        let mut blobs = Vec::new();
        let mut changes = Vec::new();
        for (path, text) in yaml_files(repo, &base, MARKER) {
            if let Some((edited, changed)) = set_marked_images(&text, picks) {
                blobs.push((
                    path.clone(),
                    repo.blob(edited.as_bytes()).map_err(GitError::from)?,
                ));
                changes.extend(changed.into_iter().map(|c| (path.clone(), c)));
            }
        }
        if blobs.is_empty() {
            return Ok((None, Vec::new()));
        }
        let edits: Vec<(&str, Option<Oid>)> = blobs
            .iter()
            .map(|(p, id)| (p.as_str(), Some(*id)))
            .collect();
        let (tree, _) = tree_with(repo, Some(&base), &edits).map_err(GitError::from)?;
        let tree = repo.find_tree(tree).map_err(GitError::from)?;
        let message = commit_message(&changes, reasons);
        let commit = self
            .new_commit(&message, &tree, &[&parent])
            .map_err(GitError::from)?;
        Ok((Some(commit), changes))
    }
}

/// The commit's message: a subject naming each new image, then per policy its image, digest
/// and rule, and each line changed. Trailers let a rollout's status link back to the policy.
pub fn commit_message(changes: &[(String, Change)], reasons: &BTreeMap<String, Reason>) -> String {
    let mut moved: Vec<String> = Vec::new();
    for (_, c) in changes {
        if let Some(r) = reasons.get(&c.policy) {
            let image = format!("{}:{}", r.pick.image, r.pick.tag);
            if !moved.contains(&image) {
                moved.push(image);
            }
        }
    }
    let mut subject = format!("Update images: {}", moved.join(", "));
    if subject.len() > 100 {
        subject = format!("Update {} images", moved.len());
    }
    let mut body = Vec::new();
    let mut trailers = Vec::new();
    for (name, r) in reasons {
        let lines: Vec<String> = changes
            .iter()
            .filter(|(_, c)| &c.policy == name)
            .map(|(path, c)| format!("  {path}:{}: {} -> {}", c.line, c.from, c.to))
            .collect();
        if lines.is_empty() {
            continue;
        }
        let digest = r.digest.as_deref().unwrap_or("digest unknown");
        body.push(format!(
            "{}:{} ({digest}), picked by {}:\n{}",
            r.pick.image,
            r.pick.tag,
            r.policy,
            lines.join("\n")
        ));
        trailers.push(format!("{POLICY_TRAILER}{name}"));
        match &r.digest {
            Some(d) => trailers.push(format!(
                "{IMAGE_TRAILER}{}:{}@{d}",
                r.pick.image, r.pick.tag
            )),
            None => trailers.push(format!("{IMAGE_TRAILER}{}:{}", r.pick.image, r.pick.tag)),
        }
    }
    format!(
        "{subject}\n\n{}\n\n{}\n",
        body.join("\n\n"),
        trailers.join("\n")
    )
}

/// Why a document that is an `ImagePolicy` is not used.
#[derive(Debug, thiserror::Error)]
enum PolicyReadError {
    #[error("unsupported apiVersion; expected {API_VERSION:?}")]
    ApiVersion,
    #[error("ImagePolicy: {0}")]
    Yaml(#[from] serde_saphyr::Error),
    #[error(transparent)]
    Policy(#[from] crate::plan::image_tags::PolicyError),
}

/// A document's `ImagePolicy`, `None` when it is another kind.
fn policy_of(doc: &str) -> Result<Option<ImagePolicy>, PolicyReadError> {
    let options = crate::specs::bounded_parser_options();
    let value: Value = match serde_saphyr::from_str_with_options(doc, options.clone()) {
        Ok(v) => v,
        Err(_) => return Ok(None),
    };
    let field = |k: &str| value.get(k).and_then(Value::as_str).unwrap_or_default();
    if field("kind") != IMAGE_POLICY_KIND || !field("apiVersion").starts_with(crate::api::GROUP) {
        return Ok(None);
    }
    if field("apiVersion") != API_VERSION {
        return Err(PolicyReadError::ApiVersion);
    }
    let policy: ImagePolicy = serde_saphyr::from_str_with_options(doc, options)?;
    crate::plan::image_tags::TagPolicy::new(&policy.spec)?;
    Ok(Some(policy))
}

/// What the branch's recent history says of images: the images linnet's reverts name as
/// failed, the digest each image had when the automation committed it, and where it came from.
type FromHistory = (
    BTreeSet<String>,
    BTreeMap<String, String>,
    crate::plan::image_tags::ImageOrigins,
);

/// From the last [`MAX_HISTORY`] commits: the images linnet's reverts name as failed, and the
/// digest and policy each image had when the automation committed it (the newest such
/// commit's).
fn from_history(repo: &Repository, tip: Oid) -> FromHistory {
    let failed_trailer = format!("{}: ", super::revert::FAILED_IMAGE_TRAILER);
    let (mut failed, mut digests) = (BTreeSet::new(), BTreeMap::new());
    let mut origins = crate::plan::image_tags::ImageOrigins::default();
    let Ok(mut walk) = repo.revwalk() else {
        return (failed, digests, origins);
    };
    if walk.push(tip).is_err() {
        return (failed, digests, origins);
    }
    for id in walk.take(MAX_HISTORY).flatten() {
        let Ok(commit) = repo.find_commit(id) else {
            continue;
        };
        let message = String::from_utf8_lossy(commit.message_bytes());
        // Trailers are the last paragraph only: a line in a body may quote anything.
        let trimmed = message.trim_end();
        let trailers = trimmed
            .rsplit_once("\n\n")
            .map_or(trimmed, |(_, last)| last);
        // Each image trailer follows the trailer of the policy that picked it.
        let mut policy = "";
        for line in trailers.lines() {
            if let Some(name) = line.strip_prefix(POLICY_TRAILER) {
                policy = name.trim();
                continue;
            }
            if let Some(reference) = line.strip_prefix(IMAGE_TRAILER) {
                let reference = reference.trim();
                let (image, digest) = reference
                    .split_once('@')
                    .map_or((reference, None), |(i, d)| (i, Some(d)));
                origins.record(image, digest, policy, &id.to_string(), false);
            }
            if let Some(image) = line.strip_prefix(failed_trailer.as_str()) {
                // A pinned image failed as its tag: the digest is no part of the name.
                let image = image.trim();
                failed.insert(image.split_once('@').map_or(image, |(i, _)| i).to_string());
            } else if let Some(pinned) = line.strip_prefix(IMAGE_TRAILER)
                && let Some((image, digest)) = pinned.trim().split_once('@')
            {
                // The walk goes from the newest: the first seen is the last committed.
                digests
                    .entry(image.to_string())
                    .or_insert_with(|| digest.to_string());
            }
        }
    }
    (failed, digests, origins)
}

/// The trailer naming each image an automation commit wrote, with its digest.
const IMAGE_TRAILER: &str = "Linnet-Image: ";
/// The trailer naming the policy that picked the image of the next [`IMAGE_TRAILER`].
const POLICY_TRAILER: &str = "Linnet-Image-Policy: ";

/// Every `.yaml`/`.yml` file of `tree` that contains `needle`, within the bounds above.
fn yaml_files(repo: &Repository, tree: &Tree<'_>, needle: &str) -> Vec<(String, String)> {
    let (mut files, mut bytes, mut out) = (0usize, 0usize, Vec::new());
    let Ok(odb) = repo.odb() else {
        return out;
    };
    let _ = tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        let Ok(name) = entry.name() else {
            return TreeWalkResult::Skip;
        };
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if entry.kind() != Some(ObjectType::Blob) || !yaml {
            return TreeWalkResult::Ok;
        }
        files += 1;
        if files > MAX_FILES || bytes > MAX_BYTES {
            return TreeWalkResult::Abort;
        }
        // The size from the object's header: a blob past the bound is never inflated.
        match odb.read_header(entry.id()) {
            Ok((size, _)) if size <= MAX_FILE_BYTES => bytes += size,
            _ => return TreeWalkResult::Ok,
        }
        let Ok(blob) = repo.find_blob(entry.id()) else {
            return TreeWalkResult::Ok;
        };
        // A path with a control character (a line break) would forge lines in the commit
        // message that names it.
        let odd = |s: &str| s.chars().any(char::is_control);
        if let Ok(text) = std::str::from_utf8(blob.content())
            && text.contains(needle)
            && !odd(dir)
            && !odd(name)
        {
            let path = Path::new(dir).join(name);
            out.push((path.to_string_lossy().into_owned(), text.to_string()));
        }
        TreeWalkResult::Ok
    });
    out
}
