//! The image automation loop (issue 74, `--image-automation`): at each scan interval it reads
//! the `ImagePolicy` documents at the followed branch's tip, lists each policy's tags in its
//! registry, picks the newest the policy allows, and commits every marked line that is not on
//! its pick in one commit ([`crate::writeback::image_update`]). The commit lands on the
//! followed branch like a human's, so the source loop applies it and the rollouts canary it.
//! Never ends on an error: it says it once and tries again at the next scan.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use crate::plan::image_tags::TagPolicy;
use crate::source::git::GitRemote;
use crate::source::registry::{Registry, Repository};
use crate::writeback::image_markers::Pick;
use crate::writeback::image_update::{FoundPolicy, Policies, Reason};
use crate::writeback::push::{Pushed, StatusWriter, WriteError};

/// Where the automation reads policies and writes commits.
#[derive(Clone, Debug)]
pub struct ImageAutomationConfig {
    /// The followed repository and branch.
    pub remote: GitRemote,
    /// The automation's own clone.
    pub cache_dir: PathBuf,
    pub author_name: String,
    pub author_email: String,
    /// One fetch-and-push, and one registry request (`--git-timeout`).
    pub timeout: Duration,
    /// `--image-scan-interval`.
    pub interval: Duration,
    /// `--ca-file`: more roots for registries over HTTPS.
    pub ca_file: Option<PathBuf>,
}

/// Scans until the agent stops: at each interval, and at once when `webhook` is told (a
/// registry's webhook). A commit wakes the source at once (`source`): it need not wait for
/// the Git host's webhook or the next poll.
pub async fn run(
    config: ImageAutomationConfig,
    webhook: std::sync::Arc<tokio::sync::Notify>,
    source: crate::source::hooks::Waker,
) {
    let heartbeat = crate::liveness::process().register("image-automation");
    let client = match crate::net::http_client_no_redirects(
        config.ca_file.as_deref(),
        config.timeout,
    ) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "image automation is off: cannot build its HTTP client");
            return;
        }
    };
    let registry = Registry::new(client);
    let mut writer: Option<StatusWriter> = None;
    let mut said: Option<String> = None;
    let mut every = tokio::time::interval(config.interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The wait beats too: a scan interval may be longer than --liveness-deadline.
    let mut idle = tokio::time::interval(crate::liveness::IDLE_BEAT);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        heartbeat.beat();
        tokio::select! {
            _ = every.tick() => {}
            () = webhook.notified() => every.reset(),
            _ = idle.tick() => continue,
        }
        let problems = match scan(&config, &registry, &mut writer, &source).await {
            Ok(problems) => problems,
            Err(e) => vec![crate::text::redact_credentials(&e.to_string())],
        };
        let now = problems.join("; ");
        if said.as_deref() != Some(now.as_str()) {
            if problems.is_empty() {
                tracing::info!("image automation: every policy read and scanned");
            } else {
                tracing::warn!(problems = %now, "image automation: some policies were not scanned; trying again at the next scan");
            }
            said = Some(now);
        }
    }
}

/// One scan: read, list, pick, commit. Returns what it could not do for some policies.
async fn scan(
    config: &ImageAutomationConfig,
    registry: &Registry,
    writer: &mut Option<StatusWriter>,
    source: &crate::source::hooks::Waker,
) -> Result<Vec<String>, WriteError> {
    let (w, policies) = blocking(config, writer.take(), |w| w.read_policies()).await?;
    *writer = Some(w);
    let Policies {
        found,
        mut problems,
        failed,
        committed_digests,
    } = policies;
    let history = History {
        failed,
        committed_digests,
    };
    let mut reasons: BTreeMap<String, Reason> = BTreeMap::new();
    let duplicates = duplicate_names(&found);
    for name in &duplicates {
        problems.push(format!(
            "ImagePolicy {name} is in Git more than once; none of them is used"
        ));
    }
    for found in found
        .iter()
        .filter(|f| !duplicates.contains(&f.policy.metadata.name))
    {
        match pick(registry, found, &history, config.timeout).await {
            Ok(Picked::Tag(reason)) => {
                let meta = &found.policy.metadata;
                if let Some(ns) = &meta.namespace {
                    reasons.insert(format!("{ns}:{}", meta.name), reason.clone());
                }
                reasons.insert(meta.name.clone(), reason);
            }
            Ok(Picked::Nothing) => {
                tracing::debug!(policy = %found.policy.metadata.name, "no tag allowed")
            }
            Ok(Picked::Refused(why)) => {
                problems.push(format!("ImagePolicy {}: {why}", found.policy.metadata.name))
            }
            Err(e) => problems.push(format!("ImagePolicy {}: {e}", found.policy.metadata.name)),
        }
    }
    if reasons.is_empty() {
        return Ok(problems);
    }
    let (w, (pushed, changes)) =
        blocking(config, writer.take(), move |w| w.set_images(&reasons)).await?;
    *writer = Some(w);
    if let Pushed::Committed { commit, retries } = pushed {
        source.wake(crate::source::hooks::Wake {
            host: None,
            after: Some(commit.to_string()),
            parent: None,
        });
        for (path, c) in &changes {
            tracing::info!(%commit, retries, policy = %c.policy, file = %path, line = c.line, from = %c.from, to = %c.to, "image automation committed a new image");
        }
    }
    Ok(problems)
}

/// What the branch's history says about images.
struct History {
    /// Images a revert named as failed.
    failed: BTreeSet<String>,
    /// Each image's digest when the automation last committed it.
    committed_digests: BTreeMap<String, String>,
}

/// What a policy picks.
enum Picked {
    Tag(Reason),
    /// No tag is allowed.
    Nothing,
    /// The newest tag is not written, and why (a moved tag, no digest to pin).
    Refused(String),
}

/// The policy's newest tag and its digest. A tag a rollout failed on (a revert named it) is
/// never picked again: a newer one moves on. A tag whose digest is not the one committed
/// before (pushed again: a moved tag) is refused unless the policy allows moved tags.
async fn pick(
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
    let tried = |t: &&str| !history.failed.contains(&format!("{}:{t}", spec.image));
    let Some(tag) = order.newest(tags.iter().map(String::as_str).filter(tried)) else {
        return Ok(Picked::Nothing);
    };
    let digest = registry.digest(&repo, tag).await.ok();
    let reference = format!("{}:{tag}", spec.image);
    if let (Some(before), Some(now)) = (history.committed_digests.get(&reference), &digest)
        && before != now
        && !spec.allow_moved_tags
    {
        return Ok(Picked::Refused(format!(
            "tag {reference} moved from {before} to {now} since it was committed; left as Git \
             has it (tags are meant to be immutable: push a new tag, or set allowMovedTags)"
        )));
    }
    if spec.digest_pinning && digest.is_none() {
        return Ok(Picked::Refused(format!(
            "the registry gave no digest for {reference}, which digestPinning needs"
        )));
    }
    Ok(Picked::Tag(Reason {
        pick: Pick {
            image: spec.image.clone(),
            tag: tag.to_string(),
            pinned: digest.clone().filter(|_| spec.digest_pinning),
        },
        digest,
        policy: format!(
            "ImagePolicy {} ({})",
            found.policy.metadata.name, found.path
        ),
    }))
}

fn duplicate_names(found: &[FoundPolicy]) -> Vec<String> {
    let mut seen = BTreeMap::<&str, usize>::new();
    for f in found {
        *seen.entry(f.policy.metadata.name.as_str()).or_default() += 1;
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Runs `work` on the writer (opened on first use) off the async threads, within three
/// timeouts (a fetch, a push and the reads).
async fn blocking<T: Send + 'static>(
    config: &ImageAutomationConfig,
    writer: Option<StatusWriter>,
    work: impl FnOnce(&mut StatusWriter) -> Result<T, WriteError> + Send + 'static,
) -> Result<(StatusWriter, T), WriteError> {
    let c = config.clone();
    let task = tokio::task::spawn_blocking(move || {
        let mut w = match writer {
            Some(w) => w,
            None => StatusWriter::open(
                &c.cache_dir,
                c.remote.clone(),
                &c.author_name,
                &c.author_email,
            )?
            .with_timeout(c.timeout),
        };
        let out = work(&mut w)?;
        Ok((w, out))
    });
    match tokio::time::timeout(config.timeout * 3, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(WriteError::Panicked(e.to_string())),
        Err(_) => Err(WriteError::Git(crate::source::git::GitError::Timeout {
            url: crate::text::redact_credentials(&config.remote.url),
            after: config.timeout * 3,
        })),
    }
}
