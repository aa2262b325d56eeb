//! What one policy picks (issue 74): the newest tag its rule allows, never one a rollout
//! failed on, with its digest judged against the one committed before (a moved tag).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::plan::image_tags::{Choice, DigestVerdict, TagPolicy, judge_digest};
use crate::source::registry::{Registry, Repository};
use crate::writeback::image_markers::Pick;
use crate::writeback::image_update::{FoundPolicy, Reason};

/// What the branch's history says about images.
pub(super) struct History {
    /// Images a revert named as failed.
    pub(super) failed: BTreeSet<String>,
    /// Each image's digest when the automation last committed it.
    pub(super) committed_digests: BTreeMap<String, String>,
}

/// What a policy picks.
pub(super) enum Picked {
    Tag(Reason),
    /// No tag is allowed.
    Nothing,
    /// The newest tag is not written, and why (a moved tag, no digest to pin).
    Refused(String),
}

/// The policy's newest tag and its digest. A tag a rollout failed on (a revert named it) is
/// never picked again: a newer one moves on. A tag whose digest is not the one committed
/// before (pushed again: a moved tag) is refused unless the policy allows moved tags.
pub(super) async fn pick(
    registry: &Registry,
    found: &FoundPolicy,
    history: &History,
    timeout: Duration,
) -> Result<Picked, crate::source::registry::RegistryError> {
    let spec = &found.policy.spec;
    let repo = Repository::parse(&spec.image, spec.insecure)?;
    // Checked when read from Git.
    let Ok(order) = TagPolicy::new(spec) else {
        return Ok(Picked::Nothing);
    };
    let (tags, cut) = registry.tags(&repo, timeout * 4).await?;
    if cut {
        tracing::warn!(image = %spec.image, kept = tags.len(), "the repository has more tags than are read; the rest are not considered");
    }
    let failed = |t: &str| history.failed.contains(&format!("{}:{t}", spec.image));
    let choice = if order.needs_build_times() {
        choose_built(registry, &repo, &order, &tags, failed).await?
    } else {
        order.choose(tags.iter().map(String::as_str), failed)
    };
    let tag = match choice {
        Choice::Tag(tag) => tag,
        Choice::Nothing | Choice::HoldFailed(_) => return Ok(Picked::Nothing),
    };
    let digest = registry.digest(&repo, tag).await.ok();
    let reference = format!("{}:{tag}", spec.image);
    let committed = history
        .committed_digests
        .get(&reference)
        .map(String::as_str);
    let pinned = match judge_digest(spec, committed, digest.as_deref()) {
        DigestVerdict::Write { pinned } => pinned,
        DigestVerdict::Moved { before, now } => {
            return Ok(Picked::Refused(format!(
                "tag {reference} moved from {before} to {now} since it was committed; left as \
                 Git has it (tags are meant to be immutable: push a new tag, or set \
                 allowMovedTags)"
            )));
        }
        DigestVerdict::NoDigestToPin => {
            return Ok(Picked::Refused(format!(
                "the registry gave no digest for {reference}, which digestPinning needs"
            )));
        }
    };
    if let Some(why) = unsigned(registry, &repo, spec, &reference, digest.as_deref()).await? {
        return Ok(Picked::Refused(why));
    }
    Ok(Picked::Tag(Reason {
        pick: Pick {
            image: spec.image.clone(),
            tag: tag.to_string(),
            pinned,
        },
        digest,
        policy: format!(
            "ImagePolicy {} ({})",
            found.policy.metadata.name, found.path
        ),
        pull_request: spec.pull_request.clone(),
    }))
}

/// `newestBuild`: the build time of each candidate tag (at most
/// [`crate::source::registry::MAX_BUILD_TIME_TAGS`], the greatest kept), and the tag built last.
async fn choose_built<'a>(
    registry: &Registry,
    repo: &Repository,
    order: &TagPolicy,
    tags: &'a [String],
    failed: impl Fn(&str) -> bool,
) -> Result<Choice<'a>, crate::source::registry::RegistryError> {
    use crate::source::registry::MAX_BUILD_TIME_TAGS;
    let mut candidates = order.candidates(tags.iter().map(String::as_str));
    if candidates.len() > MAX_BUILD_TIME_TAGS {
        tracing::warn!(repository = %repo.path, candidates = candidates.len(), kept = MAX_BUILD_TIME_TAGS, "newestBuild reads the build time of the greatest tags only; narrow the tags with filterTags");
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.truncate(MAX_BUILD_TIME_TAGS);
    }
    let mut built = Vec::with_capacity(candidates.len());
    for tag in candidates {
        built.push((tag, registry.build_time(repo, tag).await?));
    }
    Ok(order.choose_built(built, failed))
}

/// Why the picked image may not be written when the policy requires a signature
/// (`verify.cosign`); `None` when it is signed or none is required.
async fn unsigned(
    registry: &Registry,
    repo: &Repository,
    spec: &crate::api::ImagePolicySpec,
    reference: &str,
    digest: Option<&str>,
) -> Result<Option<String>, crate::source::registry::RegistryError> {
    use crate::source::registry::{CosignKeys, Signed};
    let Some(verify) = &spec.verify else {
        return Ok(None);
    };
    let keys = match CosignKeys::parse(&verify.cosign.public_keys) {
        Ok(keys) => keys,
        Err(e) => return Ok(Some(e.to_string())),
    };
    let Some(digest) = digest else {
        return Ok(Some(format!(
            "the registry gave no digest for {reference}, whose signature the policy requires"
        )));
    };
    Ok(match registry.cosign_signed(repo, digest, &keys).await? {
        Signed::Yes => None,
        Signed::NoSignature => Some(format!(
            "{reference} ({digest}) has no cosign signature; not written (the policy's \
             verify.cosign requires one: cosign sign --key)"
        )),
        Signed::NotByTheseKeys(why) => Some(format!(
            "{reference} ({digest}) is not signed by a key of the policy ({why}); not written"
        )),
    })
}
