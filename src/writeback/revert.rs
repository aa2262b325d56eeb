//! Revert commits (issue 50): once a rollout with `onFailure.revert: commit` is rolled back,
//! the image it returned to goes back into its spec file on the followed branch, so Git stops
//! asking for the version that failed and the rollout is Stable again once that commit is
//! synced. Pure: what to revert (from the rollout in the cluster) and the edited file (from
//! the file at the branch's tip). Pushing it is [`super::push`]'s.
//!
//! Idempotent by construction: a revert is made only while the file still asks for the image
//! that failed, so a revert already pushed (before a restart, say) and a person's newer change
//! both make it a no-op.

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::api::{
    CanaryDeployment, CanaryStatefulSet, DeploymentPhase, RevertMode, SOURCE_PATH_ANNOTATION,
    StatefulSetPhase,
};

/// One rolled-back rollout's spec to put back in Git.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revert {
    /// The spec file, from the repository's root.
    pub path: String,
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// The image that failed: what the file asks for now.
    pub failed: String,
    /// The image the rollout returned to.
    pub good: String,
    /// Why it was rolled back, for the commit message.
    pub why: String,
    /// A commit on the followed branch, or a pull request.
    pub mode: RevertMode,
    /// The Git commit that set the failed spec (it names the pull request's branch).
    pub revision: Option<String>,
    /// A fleet with `onFailure: revert` lets it edit a Kustomize base its overlays share.
    pub shared_base: bool,
    /// This cluster, when it has a name (`--cluster`): its pull requests are its own.
    pub cluster: Option<String>,
    /// A fleet's revert (`fleet_revert.rs`): the cluster the image failed in, when
    /// this one, where it completed, puts it back too.
    pub failed_in: Option<String>,
}

/// The branches of revert pull requests start with this; then `<namespace>/<name>/`.
pub const BRANCH_PREFIX: &str = "linnet/revert/";

impl Revert {
    /// The branch of this failure's pull request: one per rollout and failed commit, so a
    /// restart finds it again and a later failure gets its own.
    pub fn branch(&self) -> String {
        let failure = match &self.revision {
            Some(rev) if rev.len() >= 12 => rev[..12].to_string(),
            _ => crate::hash::content_hash(&serde_json::Value::String(self.failed.clone())),
        };
        format!("{}{failure}", self.branch_prefix())
    }

    /// The start of every revert branch of this rollout in this cluster.
    pub fn branch_prefix(&self) -> String {
        if self.failed_in.is_some() {
            let cluster = self.cluster.as_deref().unwrap_or(DEFAULT_CLUSTER);
            let (ns, name) = (&self.namespace, &self.name);
            return format!("{FLEET_BRANCH_PREFIX}@{cluster}/{ns}/{name}/");
        }
        branch_prefix(self.cluster.as_deref(), &self.namespace, &self.name)
    }

    /// The pull request's title.
    pub fn title(&self) -> String {
        let r#in = match &self.cluster {
            Some(c) => format!(" in {c}"),
            None => String::new(),
        };
        format!(
            "Revert {}/{}{in} to {}",
            self.namespace, self.name, self.good
        )
    }

    /// The commit message: a subject that says what, a body that says why, and a trailer
    /// naming the failed image, which the image automation reads so that it never proposes
    /// that image again (a newer tag moves on).
    pub fn message(&self) -> String {
        let trailer = if self.failed.is_empty() || self.failed.contains(char::is_whitespace) {
            String::new()
        } else {
            format!("\n{FAILED_IMAGE_TRAILER}: {}\n", self.failed)
        };
        format!(
            "linnet: revert {}/{} to {}\n\n{}{trailer}",
            self.namespace,
            self.name,
            self.good,
            self.body()
        )
    }

    /// What failed and what merging does: the commit's body and the pull request's.
    pub fn body(&self) -> String {
        if let Some(failed_in) = &self.failed_in {
            return fleet_body(self, failed_in);
        }
        let fleet = if self.shared_base {
            "\n\nIts fleet has `onFailure: revert`: where the image is set in a base the \
             fleet's overlays share, this puts every cluster that took it back.\n"
        } else {
            ""
        };
        let how = match self.mode {
            RevertMode::PullRequest => "`onFailure.revert: pullRequest`. Merging it makes",
            _ => "`onFailure.revert: commit`. Once this commit is synced,",
        };
        format!(
            "{} {} was rolled back from {} to {}: {}\n\nWritten by linnet because the rollout \
             has {how} the rollout Stable again on {}; to try {} again, set it in Git. Its \
             status file: `{}`.\n{fleet}",
            self.kind,
            self.name,
            self.failed,
            self.good,
            self.why,
            self.good,
            self.failed,
            super::status_files::path(
                self.cluster.as_deref().unwrap_or(DEFAULT_CLUSTER),
                &self.namespace,
                &self.name
            )
        )
    }
}

/// The trailer of a revert commit that names the image that failed.
pub const FAILED_IMAGE_TRAILER: &str = "Linnet-Failed-Image";

/// The branches of a fleet's revert pull requests start with this; then
/// `@<cluster>/<namespace>/<name>/`. Apart from a rollout's own reverts: a cluster closes
/// those once Git moved on, but this one stays open until merged or closed by a person, even
/// after the failed cluster's own revert is merged and its failure no longer shows.
pub const FLEET_BRANCH_PREFIX: &str = "linnet/fleet-revert/";

/// A fleet revert's commit and pull request body.
fn fleet_body(r: &Revert, failed_in: &str) -> String {
    format!(
        "{} {} completed {} in cluster {}, but {}. Its Fleet has `onFailure: revert`: every \
         cluster that took the image puts it back, each by a pull request of its own. Merging \
         this one rolls {} here back to {}, as in {failed_in}; to keep {} here, close it.\n\n\
         Written by linnet in cluster {}. Its status file: `{}`.\n",
        r.kind,
        r.name,
        r.failed,
        r.cluster.as_deref().unwrap_or_default(),
        r.why,
        r.name,
        r.good,
        r.failed,
        r.cluster.as_deref().unwrap_or_default(),
        super::status_files::path(
            r.cluster.as_deref().unwrap_or(DEFAULT_CLUSTER),
            &r.namespace,
            &r.name
        ),
    )
}

/// The cluster name of an agent started without `--cluster`.
pub const DEFAULT_CLUSTER: &str = "default";

/// The start of every revert branch of rollout `namespace/name` in `cluster` (`None`: an
/// agent without `--cluster`). Agents of several clusters open pull requests in one
/// repository, and each closes those of its own rollouts once Git moved on: a cluster in the
/// branch keeps one from closing another's. No namespace starts with `@`.
pub fn branch_prefix(cluster: Option<&str>, namespace: &str, name: &str) -> String {
    match cluster {
        Some(c) => format!("{BRANCH_PREFIX}@{c}/{namespace}/{name}/"),
        None => format!("{BRANCH_PREFIX}{namespace}/{name}/"),
    }
}

/// Why a revert cannot be made; it is not tried again until the rollout or the file changes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RevertError {
    #[error("{path} has no {kind} {name} with a `spec.image` on the branch: set the image in Git")]
    NotInFile {
        path: String,
        kind: &'static str,
        name: String,
    },
    #[error("{path} is not in the branch (moved or deleted since the rollout was synced)")]
    NoFile { path: String },
    #[error("cannot set the image in {path}: {reason}")]
    Rendered { path: String, reason: String },
    #[error("{path} is {bytes} bytes, over the {max} a spec file may have; it is not edited")]
    TooLarge {
        path: String,
        bytes: usize,
        max: usize,
    },
}

/// `dir` (the followed directory, `--path`) joined with `file` (relative to it).
/// The revert a CanaryStatefulSet asks for now, if any.
pub fn for_statefulset(r: &CanaryStatefulSet) -> Option<Revert> {
    let spec = &r.spec;
    let mode = spec.on_failure.as_ref().map(|f| f.revert)?;
    if mode == RevertMode::None {
        return None;
    }
    let st = r.status.as_ref()?;
    if st.phase != Some(StatefulSetPhase::RolledBack)
        || st.canary_image.as_deref() != Some(spec.image.as_str())
    {
        return None;
    }
    let good = st.stable_image.clone().filter(|s| *s != spec.image)?;
    let failure = Failure {
        failed: &spec.image,
        good,
        why: why(&st.analysis, st.message.as_deref()),
        mode,
        revision: st.source_revision.clone(),
    };
    let meta = crate::api::packed_meta::metadata(r);
    revert("CanaryStatefulSet", &meta, failure)
}

/// The revert a CanaryDeployment asks for now, if any.
pub fn for_deployment(r: &CanaryDeployment) -> Option<Revert> {
    let spec = &r.spec;
    let mode = spec.on_failure.as_ref().map(|f| f.revert)?;
    if mode == RevertMode::None {
        return None;
    }
    let st = r.status.as_ref()?;
    let rollback = st.rollback.as_ref()?;
    if st.phase != Some(DeploymentPhase::RolledBack) || rollback.from_image != spec.image {
        return None;
    }
    let good = Some(rollback.to_image.clone()).filter(|s| *s != spec.image)?;
    let failure = Failure {
        failed: &spec.image,
        good,
        why: why(&st.analysis, st.message.as_deref()),
        mode,
        revision: st.source_revision.clone(),
    };
    let meta = crate::api::packed_meta::metadata(r);
    revert("CanaryDeployment", &meta, failure)
}

/// Why a rollout was rolled back: its failed analysis, else its status message; then the
/// analysis runs with each metric's values, condition and query (issue 75: the evidence).
fn why(runs: &[crate::api::AnalysisRunStatus], message: Option<&str>) -> String {
    let why = crate::plan::analysis::failure(runs)
        .or_else(|| message.map(str::to_string))
        .unwrap_or_else(|| "rolled back".into());
    if runs.is_empty() {
        return why;
    }
    let evidence = crate::plan::analysis::report::runs_text(runs, super::EVIDENCE_BYTES);
    format!("{why}\n\nThe analysis:\n\n{evidence}")
}

/// What failed, from a rollout's spec and status.
struct Failure<'a> {
    failed: &'a str,
    good: String,
    why: String,
    mode: RevertMode,
    revision: Option<String>,
}

fn revert(kind: &'static str, meta: &kube::api::ObjectMeta, f: Failure<'_>) -> Option<Revert> {
    let file = meta.annotations.as_ref()?.get(SOURCE_PATH_ANNOTATION)?;
    Some(Revert {
        path: file.to_string(),
        kind,
        namespace: meta.namespace.clone()?,
        name: meta.name.clone()?,
        failed: f.failed.to_string(),
        good: f.good,
        why: f.why,
        mode: f.mode,
        revision: f.revision,
        shared_base: false,
        cluster: None,
        failed_in: None,
    })
}

/// The fields of a document that find a rollout and its image.
#[derive(Deserialize)]
struct Head {
    kind: Option<String>,
    metadata: Option<HeadMeta>,
    spec: Option<HeadSpec>,
}

#[derive(Deserialize)]
struct HeadMeta {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct HeadSpec {
    image: Option<Spanned<String>>,
    /// The StatefulSet's or the Deployment's spec; its pod template's containers.
    template: Option<Workload>,
}

#[derive(Deserialize)]
struct Workload {
    template: Option<PodTemplate>,
}

#[derive(Deserialize)]
struct PodTemplate {
    spec: Option<PodSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    #[serde(default)]
    containers: Vec<Container>,
    #[serde(default)]
    init_containers: Vec<Container>,
}

#[derive(Deserialize)]
struct Container {
    image: Option<Spanned<String>>,
}

/// `text` (the spec file at the branch's tip) with the rollout's `spec.image`, and each
/// container of its template that runs the failed image, set back to the good image.
/// `Ok(None)` when `spec.image` no longer is the failed image (reverted already, or a person
/// changed it since), so nothing is written. Only the images' own characters change:
/// comments, quoting and every other line stay as they are.
pub fn set_image(text: &str, r: &Revert) -> Result<Option<String>, RevertError> {
    let not_in_file = || RevertError::NotInFile {
        path: r.path.clone(),
        kind: r.kind,
        name: r.name.clone(),
    };
    for (start, doc) in documents(text) {
        // A document that does not parse is not the rollout (the sync applied it).
        let Ok(head) = serde_saphyr::from_str_with_options::<Head>(
            doc,
            crate::specs::bounded_parser_options(),
        ) else {
            continue;
        };
        let meta = head.metadata.as_ref();
        let this = head.kind.as_deref() == Some(r.kind)
            && meta.and_then(|m| m.name.as_deref()) == Some(r.name.as_str())
            && meta
                .and_then(|m| m.namespace.as_deref())
                .is_none_or(|ns| ns == r.namespace);
        if !this {
            continue;
        }
        let spec = head.spec.ok_or_else(not_in_file)?;
        let image = spec.image.as_ref().ok_or_else(not_in_file)?;
        if image.value != r.failed {
            return Ok(None);
        }
        let pod = spec.template.and_then(|w| w.template).and_then(|t| t.spec);
        let containers = pod
            .iter()
            .flat_map(|p| p.containers.iter().chain(&p.init_containers))
            .filter_map(|c| c.image.as_ref())
            .filter(|i| i.value == r.failed);
        let mut offsets = Vec::new();
        for found in std::iter::once(image).chain(containers) {
            offsets.push(start + image_offset(doc, found, &r.failed).ok_or_else(not_in_file)?);
        }
        offsets.sort_unstable();
        offsets.dedup();
        let mut out = text.to_string();
        for at in offsets.into_iter().rev() {
            let quoted = text[..at].ends_with(['"', '\'']);
            let good = if quoted || plain_safe(&r.good) {
                r.good.clone()
            } else {
                // Double-quoted: JSON's string syntax is YAML's.
                serde_json::Value::String(r.good.clone()).to_string()
            };
            out.replace_range(at..at + r.failed.len(), &good);
        }
        return Ok(Some(out));
    }
    Err(not_in_file())
}

/// The namespace (if the file gives one) and `spec.image` of the rollout of `kind` named
/// `name` in `text`, if it is there.
pub fn rollout_image(text: &str, kind: &str, name: &str) -> Option<(Option<String>, String)> {
    documents(text).into_iter().find_map(|(_, doc)| {
        let head = serde_saphyr::from_str_with_options::<Head>(
            doc,
            crate::specs::bounded_parser_options(),
        )
        .ok()?;
        let meta = head.metadata?;
        (head.kind.as_deref() == Some(kind) && meta.name.as_deref() == Some(name)).then_some(())?;
        Some((meta.namespace, head.spec?.image?.value))
    })
}

/// Whether every document of `text` is a ConfigMap or a Secret (and there is one): a file of
/// config that may be put back with the image it came in with.
pub fn holds_only_config(text: &str) -> bool {
    #[derive(Deserialize)]
    struct Kind {
        kind: Option<String>,
    }
    let mut kinds = documents(text).into_iter().filter_map(|(_, doc)| {
        let parsed = serde_saphyr::from_str_with_options::<Option<Kind>>(
            doc,
            crate::specs::bounded_parser_options(),
        );
        match parsed {
            Ok(None) => None,
            Ok(Some(k)) => Some(k.kind),
            Err(_) => Some(None),
        }
    });
    let mut any = false;
    let all = kinds.all(|k| {
        any = true;
        matches!(k.as_deref(), Some("ConfigMap" | "Secret"))
    });
    any && all
}

/// Whether `s` reads back as the same string when written as a plain YAML scalar (not a
/// number or a boolean, no indicator).
pub(super) fn plain_safe(s: &str) -> bool {
    !s.is_empty()
        && s.parse::<f64>().is_err()
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "~"
        )
        && !s.starts_with(|c: char| "-?:,[]{}#&*!|>'\"%@`".contains(c) || c.is_whitespace())
        && !s.ends_with(char::is_whitespace)
        && !s.contains(": ")
        && !s.contains(" #")
        && !s.contains(['\n', '\r', '\t'])
}

/// The byte offset in `doc` of the failed image's characters in the scalar at `image`'s
/// location (the line it is defined on, from its column on).
pub(super) fn image_offset(doc: &str, image: &Spanned<String>, failed: &str) -> Option<usize> {
    let line = usize::try_from(image.defined.line()).ok()?.checked_sub(1)?;
    let column = usize::try_from(image.defined.column())
        .ok()?
        .saturating_sub(1);
    let line_start: usize = doc.split_inclusive('\n').take(line).map(str::len).sum();
    let line_text = doc[line_start..].lines().next()?;
    let from = line_text
        .char_indices()
        .nth(column)
        .map_or(line_text.len(), |(i, _)| i);
    let found = line_text[from..].find(failed)?;
    Some(line_start + from + found)
}

/// The documents of a YAML stream with their byte offsets, split at `---` lines as the spec
/// loader splits them (a document keeps its marker line, which may carry content).
pub(super) fn documents(text: &str) -> Vec<(usize, &str)> {
    let mut starts = vec![0];
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if offset > 0 && (bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t")) {
            starts.push(offset);
        }
        offset += line.len();
    }
    starts.push(text.len());
    starts
        .windows(2)
        .map(|w| (w[0], &text[w[0]..w[1]]))
        .collect()
}

#[cfg(test)]
mod tests;
