//! The image automation loop (issue 74, `--image-automation`): at each scan interval it reads
//! the `ImagePolicy` documents at the followed branch's tip, lists each policy's tags in its
//! registry, picks the newest the policy allows, and commits every marked line that is not on
//! its pick in one commit ([`crate::writeback::image_update`]). The commit lands on the
//! followed branch like a human's, so the source loop applies it and the rollouts canary it.
//! Never ends on an error: it says it once and tries again at the next scan.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use crate::plan::image_tags::{Choice, DigestVerdict, TagPolicy, judge_digest};
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
    /// `--git-signing-key`: the commits are signed with it.
    pub signer: Option<std::sync::Arc<crate::writeback::signing::CommitSigner>>,
    /// One fetch-and-push, and one registry request (`--git-timeout`).
    pub timeout: Duration,
    /// `--image-scan-interval`.
    pub interval: Duration,
    /// `--ca-file`: more roots for registries over HTTPS.
    pub ca_file: Option<PathBuf>,
    /// `--registry-credentials`: a Docker config file, read at each scan.
    pub credentials_file: Option<PathBuf>,
    /// The least time between two requests to one registry (`--registry-rate`).
    pub registry_spacing: Duration,
}

/// Scans until the agent stops: at each interval, and at once when `webhook` is told (a
/// registry's webhook). A commit wakes the source at once (`source`): it need not wait for
/// the Git host's webhook or the next poll.
pub async fn run(
    config: ImageAutomationConfig,
    webhook: std::sync::Arc<tokio::sync::Notify>,
    origins: crate::controller::SharedImageOrigins,
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
    let registry = Registry::new(client, config.registry_spacing);
    let mut clone = GitClone::default();
    let mut backoff = super::registry_backoff::RegistryBackoff::default();
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
        // Beating while it runs: every call in a scan has its own timeout, but several slow
        // registries in a row may take longer than --liveness-deadline.
        let scanning = scan(
            &config,
            &registry,
            &mut clone,
            &mut backoff,
            (&origins, &source),
        );
        tokio::pin!(scanning);
        let outcome = loop {
            tokio::select! {
                outcome = &mut scanning => break outcome,
                _ = idle.tick() => heartbeat.beat(),
            }
        };
        let problems = match outcome {
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
    clone: &mut GitClone,
    backoff: &mut super::registry_backoff::RegistryBackoff,
    (origins, source): (
        &crate::controller::SharedImageOrigins,
        &crate::source::hooks::Waker,
    ),
) -> Result<Vec<String>, WriteError> {
    let credentials_problem = refresh_credentials(config, registry);
    let (tip, policies) = read(config, clone).await?;
    let Policies {
        found,
        mut problems,
        failed,
        committed_digests,
        origins: from_history,
    } = policies;
    // The history at the tip (read again whenever the tip moved, so with this agent's own
    // commits): the origins as Git says them, after a restart too.
    if let Ok(mut o) = origins.write() {
        *o = from_history;
    }
    problems.extend(credentials_problem);
    let history = History {
        failed,
        committed_digests,
    };
    let reasons = pick_each(config, registry, backoff, &found, &history, &mut problems).await;
    if reasons.is_empty() {
        return Ok(problems);
    }
    // Nothing to write when neither the tip nor any pick moved since the last write.
    let picks: BTreeMap<String, Pick> = reasons
        .iter()
        .map(|(k, r)| (k.clone(), r.pick.clone()))
        .collect();
    let this_write = tip.map(|t| (t, picks));
    if this_write.is_some() && clone.written == this_write {
        return Ok(problems);
    }
    let reasons_by_policy = reasons.clone();
    let (pushed, changes) = blocking(config, clone, move |w| w.set_images(&reasons)).await?;
    clone.written = match pushed {
        Pushed::Unchanged => this_write,
        Pushed::Committed { .. } => None,
    };
    if let Pushed::Committed { commit, retries } = pushed {
        // Known before the source applies the commit: the rollout's first status names it.
        if let Ok(mut o) = origins.write() {
            for (_, c) in &changes {
                if let Some(r) = reasons_by_policy.get(&c.policy) {
                    let image = format!("{}:{}", r.pick.image, r.pick.tag);
                    o.record(
                        &image,
                        r.digest.as_deref(),
                        &c.policy,
                        &commit.to_string(),
                        true,
                    );
                }
            }
        }
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

/// Reads `--registry-credentials` again (a rotated Secret is used without a restart); a file
/// that cannot be read leaves the last credentials in use, and is said.
fn refresh_credentials(config: &ImageAutomationConfig, registry: &Registry) -> Option<String> {
    let path = config.credentials_file.as_ref()?;
    match crate::source::registry_auth::RegistryCredentials::read(path) {
        Ok(c) => {
            registry.set_credentials(c);
            None
        }
        Err(e) => Some(format!("--registry-credentials: {e}")),
    }
}

/// Each policy's pick, by the names its markers may use; what could not be picked goes to
/// `problems`. A registry that is backed off is not asked.
async fn pick_each(
    config: &ImageAutomationConfig,
    registry: &Registry,
    backoff: &mut super::registry_backoff::RegistryBackoff,
    found: &[FoundPolicy],
    history: &History,
    problems: &mut Vec<String>,
) -> BTreeMap<String, Reason> {
    let mut reasons: BTreeMap<String, Reason> = BTreeMap::new();
    let duplicates = duplicate_names(found);
    for name in &duplicates {
        problems.push(format!(
            "ImagePolicy {name} is in Git more than once; none of them is used"
        ));
    }
    let mut by_name = BTreeMap::<&str, usize>::new();
    for f in found {
        *by_name.entry(f.policy.metadata.name.as_str()).or_default() += 1;
    }
    for policy in found.iter().filter(|f| !duplicates.contains(&qualified(f))) {
        let name = qualified(policy);
        let host = Repository::parse(&policy.policy.spec.image, policy.policy.spec.insecure)
            .map(|r| r.host())
            .unwrap_or_default();
        if let Some(why) = backoff.waiting(&host) {
            problems.push(format!("ImagePolicy {name}: {why}"));
            continue;
        }
        let picked = pick(registry, policy, history, config.timeout).await;
        backoff.record(&host, picked.as_ref().err());
        match picked {
            Ok(Picked::Tag(reason)) => {
                let meta = &policy.policy.metadata;
                // A marker names `namespace:name`, or the bare name when one policy has it.
                if by_name.get(meta.name.as_str()) == Some(&1) {
                    reasons.insert(meta.name.clone(), reason.clone());
                }
                reasons.insert(name, reason);
            }
            Ok(Picked::Nothing) => tracing::debug!(policy = %name, "no tag allowed"),
            Ok(Picked::Refused(why)) => problems.push(format!("ImagePolicy {name}: {why}")),
            Err(e) => problems.push(format!("ImagePolicy {name}: {e}")),
        }
    }
    reasons
}

/// The tip and its policies: read again only when the tip moved since the last read.
async fn read(
    config: &ImageAutomationConfig,
    clone: &mut GitClone,
) -> Result<(Option<git2::Oid>, Policies), WriteError> {
    let known = clone.read.as_ref().map(|(tip, _)| *tip);
    let (tip, read) = blocking(config, clone, move |w| w.read_policies(known)).await?;
    let policies = match (tip, read) {
        (Some(tip), Some(policies)) => {
            clone.read = Some((tip, policies.clone()));
            policies
        }
        (None, Some(policies)) => policies,
        // The tip has not moved: the policies and history are as last read.
        (_, None) => clone
            .read
            .as_ref()
            .map(|(_, p)| p.clone())
            .unwrap_or_default(),
    };
    Ok((tip, policies))
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

/// `namespace:name`, or the name of a policy with no namespace.
fn qualified(f: &FoundPolicy) -> String {
    let meta = &f.policy.metadata;
    match &meta.namespace {
        Some(ns) => format!("{ns}:{}", meta.name),
        None => meta.name.clone(),
    }
}

/// Policies that are in Git more than once under one `namespace:name`.
fn duplicate_names(found: &[FoundPolicy]) -> Vec<String> {
    let mut seen = BTreeMap::<String, usize>::new();
    for f in found {
        *seen.entry(qualified(f)).or_default() += 1;
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(name, _)| name)
        .collect()
}

/// The automation's Git clone (opened on first use), what was last read from it and last
/// found written. A Git job that outlived its timeout hands the clone back when it ends; the
/// next job waits for it rather than open the clone a second time (no lock is held across
/// the network: the clone moves into the job and back).
#[derive(Default)]
struct GitClone {
    writer: Option<StatusWriter>,
    returning: Option<tokio::sync::oneshot::Receiver<Option<StatusWriter>>>,
    /// The tip the policies were read at, and what was read.
    read: Option<(git2::Oid, Policies)>,
    /// The tip and picks of the last write that found every line on its pick.
    written: Option<(git2::Oid, BTreeMap<String, Pick>)>,
}

/// Runs `work` on the clone's writer (opened on first use) off the async threads, within
/// three timeouts (a fetch, a push and the reads).
async fn blocking<T: Send + 'static>(
    config: &ImageAutomationConfig,
    clone: &mut GitClone,
    work: impl FnOnce(&mut StatusWriter) -> Result<T, WriteError> + Send + 'static,
) -> Result<T, WriteError> {
    if let Some(back) = clone.returning.take() {
        clone.writer = back.await.ok().flatten();
    }
    let (c, writer) = (config.clone(), clone.writer.take());
    let mut task = tokio::task::spawn_blocking(move || {
        let mut writer = match writer {
            Some(w) => w,
            None => match StatusWriter::open(
                &c.cache_dir,
                c.remote.clone(),
                &c.author_name,
                &c.author_email,
            ) {
                Ok(w) => w.with_timeout(c.timeout).with_signer(c.signer.clone()),
                Err(e) => return (None, Err(e.into())),
            },
        };
        let out = work(&mut writer);
        (Some(writer), out)
    });
    match tokio::time::timeout(config.timeout * 3, &mut task).await {
        Ok(Ok((writer, out))) => {
            clone.writer = writer;
            out
        }
        Ok(Err(e)) => Err(WriteError::Panicked(e.to_string())),
        Err(_) => {
            let (back, returning) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let _ = back.send(task.await.ok().and_then(|(w, _)| w));
            });
            clone.returning = Some(returning);
            Err(WriteError::Git(crate::source::git::GitError::Timeout {
                url: crate::text::redact_credentials(&config.remote.url),
                after: config.timeout * 3,
            }))
        }
    }
}
