//! The image automation loop (issue 74, `--image-automation`): at each scan interval it reads
//! the `ImagePolicy` documents at the followed branch's tip, lists each policy's tags in its
//! registry, picks the newest the policy allows, and commits every marked line that is not on
//! its pick in one commit ([`crate::writeback::image_update`]). The commit lands on the
//! followed branch like a human's, so the source loop applies it and the rollouts canary it.
//! Never ends on an error: it says it once and tries again at the next scan.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::source::git::GitRemote;
use crate::source::registry::{Registry, Repository};
use crate::writeback::image_markers::Pick;
use crate::writeback::image_pull_request::{ProposeError, Proposed, propose};
use crate::writeback::image_update::{FoundPolicy, Policies, Reason};
use crate::writeback::pull_request::PullRequests;
use crate::writeback::push::{Pushed, StatusWriter, WriteError};

use super::writer_slot::{WriterSettings, WriterSlot};

mod pick;
use pick::{History, Picked, pick};

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
    /// The Git host's API for policies with `pullRequest` (that of commit statuses).
    pub host: Option<crate::writeback::commit_status::CommitStatusConfig>,
    /// `--image-automation-auto-merge`: a policy's `pullRequest.autoMerge` is honoured.
    pub auto_merge: bool,
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
    let host = match config.host.clone().map(PullRequests::new).transpose() {
        Ok(host) => host,
        Err(e) => {
            tracing::error!(error = %e, "image automation's pull requests are off");
            None
        }
    };
    let remotes = Remotes {
        registry: Registry::new(client, config.registry_spacing),
        host,
    };
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
            &remotes,
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

/// The registries, and the Git host's pull requests when configured.
struct Remotes {
    registry: Registry,
    host: Option<PullRequests>,
}

/// One scan: read, list, pick, commit (or propose). Returns what it could not do for some
/// policies.
async fn scan(
    config: &ImageAutomationConfig,
    remotes: &Remotes,
    clone: &mut GitClone,
    backoff: &mut super::registry_backoff::RegistryBackoff,
    (origins, source): (
        &crate::controller::SharedImageOrigins,
        &crate::source::hooks::Waker,
    ),
) -> Result<Vec<String>, WriteError> {
    let registry = &remotes.registry;
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
    let picked = pick_each(config, registry, backoff, &found, &history, &mut problems).await;
    let (proposed, reasons): (BTreeMap<_, _>, BTreeMap<_, _>) = picked
        .into_iter()
        .partition(|(_, r)| r.pull_request.is_some());
    if !proposed.is_empty()
        && let Err(why) = propose_each(config, remotes, clone, (tip, source), proposed).await
    {
        problems.push(crate::text::redact_credentials(&why.to_string()));
    }
    if !reasons.is_empty() {
        commit_each(config, clone, tip, reasons, (origins, source)).await?;
    }
    Ok(problems)
}

/// The one commit of the policies that commit to the followed branch; the images' origins
/// are known at once, and the source is woken to apply it.
async fn commit_each(
    config: &ImageAutomationConfig,
    clone: &mut GitClone,
    tip: Option<git2::Oid>,
    reasons: BTreeMap<String, Reason>,
    (origins, source): (
        &crate::controller::SharedImageOrigins,
        &crate::source::hooks::Waker,
    ),
) -> Result<(), WriteError> {
    // Nothing to write when neither the tip nor any pick moved since the last write.
    let picks: BTreeMap<String, Pick> = reasons
        .iter()
        .map(|(k, r)| (k.clone(), r.pick.clone()))
        .collect();
    let this_write = tip.map(|t| (t, picks));
    if this_write.is_some() && clone.written == this_write {
        return Ok(());
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
    Ok(())
}

/// The pull request of the policies with `pullRequest`: their changes on a branch of their
/// own, proposed to the followed branch, and merged when they all ask for it and the agent
/// allows it. Not looked at again while neither the tip nor the picks moved.
async fn propose_each(
    config: &ImageAutomationConfig,
    remotes: &Remotes,
    clone: &mut GitClone,
    (tip, source): (Option<git2::Oid>, &crate::source::hooks::Waker),
    reasons: BTreeMap<String, Reason>,
) -> Result<(), ProposeError> {
    let Some(host) = &remotes.host else {
        return Err(ProposeError::NoHost {
            policies: reasons
                .values()
                .map(|r| r.policy.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let picks: BTreeMap<String, Pick> = reasons
        .iter()
        .map(|(k, r)| (k.clone(), r.pick.clone()))
        .collect();
    let this_proposal = tip.map(|t| (t, picks));
    if this_proposal.is_some() && clone.proposed == this_proposal {
        return Ok(());
    }
    let asks_merge = reasons
        .values()
        .all(|r| r.pull_request.as_ref().is_some_and(|p| p.auto_merge));
    // The tip this scan read the policies at: the branch starts there, with no second fetch.
    let Some(at) = tip else {
        return Ok(());
    };
    let branch = blocking(config, clone, move |w| w.push_image_branch(at, &reasons)).await?;
    let Some(branch) = branch else {
        clone.proposed = this_proposal;
        return Ok(());
    };
    if asks_merge && !config.auto_merge {
        tracing::warn!(branch = %branch.branch, "pullRequest.autoMerge is set, but this agent runs without --image-automation-auto-merge: the pull request waits for a person");
    }
    let outcome = propose(host, &branch, asks_merge && config.auto_merge).await?;
    clone.proposed = this_proposal;
    match outcome {
        Proposed::Opened { url, .. } => {
            for (path, c) in &branch.changes {
                tracing::info!(%url, policy = %c.policy, file = %path, line = c.line, from = %c.from, to = %c.to, "image automation opened a pull request");
            }
        }
        Proposed::Found { url, .. } => {
            tracing::debug!(%url, "image automation's pull request is still open");
        }
        Proposed::Merged { url } => {
            tracing::info!(%url, branch = %branch.branch, "image automation merged its pull request (autoMerge)");
            source.wake(crate::source::hooks::Wake {
                host: None,
                after: None,
                parent: None,
            });
        }
        Proposed::Declined => {
            tracing::info!(branch = %branch.branch, "a person closed image automation's pull request: not opened again until a newer tag");
        }
    }
    Ok(())
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

/// The automation's Git clone ([`WriterSlot`]), what was last read from it and last found
/// written.
#[derive(Default)]
struct GitClone {
    slot: WriterSlot,
    /// The tip the policies were read at, and what was read.
    read: Option<(git2::Oid, Policies)>,
    /// The tip and picks of the last write that found every line on its pick.
    written: Option<(git2::Oid, BTreeMap<String, Pick>)>,
    /// The tip and picks of the last pull request proposed (or found not needed).
    proposed: Option<(git2::Oid, BTreeMap<String, Pick>)>,
}

/// Runs `work` on the clone's writer, as [`WriterSlot::run`] does.
async fn blocking<T: Send + 'static>(
    config: &ImageAutomationConfig,
    clone: &mut GitClone,
    work: impl FnOnce(&mut StatusWriter) -> Result<T, WriteError> + Send + 'static,
) -> Result<T, WriteError> {
    let settings = WriterSettings {
        remote: config.remote.clone(),
        cache_dir: config.cache_dir.clone(),
        author_name: config.author_name.clone(),
        author_email: config.author_email.clone(),
        signer: config.signer.clone(),
        timeout: config.timeout,
    };
    clone.slot.run(&settings, work).await
}
