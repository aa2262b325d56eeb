//! The looks at the source: ask a remote for its tip and fetch it (within --git-timeout, no
//! lock held while waiting), or list a local directory; then read what changed into the
//! snapshot, parsing only the files whose blobs changed. What a look found is [`Found`].

use crate::source::verify::VerifyCommits;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::config::AgentConfig;
use super::config::SourceConfig;
use crate::source::git::{GitError, GitMirror};
use crate::source::snapshot::SpecSnapshot;
use crate::specs::{LoadOptions, SpecSet};
use crate::telemetry::{Metrics, ReasonLabel};
use crate::{Error, Result};

mod read_ahead;
pub use read_ahead::ReadAhead;

/// Why a look at the source or a sync failed; the cluster keeps the last good state, and the
/// loop tries again. Each has a stable label for `linnet_git_fetch_errors_total`.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error(
        "the previous call to {url} has not returned after --git-timeout ({timeout:?}); waiting \
         for libgit2 to give it up before starting another"
    )]
    Busy { url: String, timeout: Duration },
    #[error("{url} did not answer within {timeout:?} (--git-timeout)")]
    Timeout { url: String, timeout: Duration },
    #[error("Git task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("the source's state is poisoned by an earlier panic")]
    Poisoned,
    #[error("{}: {}", path.display(), crate::error::io_reason(.source))]
    Local {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no specs found in {path:?} at {revision}; nothing is applied or pruned. Check --path, \
         or give --allow-empty to sync an empty directory"
    )]
    NoSpecs { path: String, revision: String },
    #[error("{count} object(s) failed to sync; first: {first}")]
    Sync { count: usize, first: String },
}

impl SourceError {
    /// The labels of [`Self::metric_label`] besides Git's own ([`GitError::LABELS`]).
    pub const LABELS: &'static [&'static str] = &[
        "busy", "timeout", "panic", "git", "local", "no_specs", "sync",
    ];

    /// A stable, low-cardinality label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SourceError::Git(e) => e.label(),
            SourceError::Busy { .. } => "busy",
            SourceError::Timeout { .. } => "timeout",
            SourceError::Task(_) => "panic",
            SourceError::Poisoned => "git",
            SourceError::Local { .. } => "local",
            SourceError::NoSpecs { .. } => "no_specs",
            SourceError::Sync { .. } => "sync",
        }
    }

    /// Whether the source could not be read (retried sooner than a failed sync).
    pub fn is_source(&self) -> bool {
        !matches!(self, SourceError::NoSpecs { .. } | SourceError::Sync { .. })
    }
}

pub(super) struct RemoteState {
    mirror: GitMirror,
    pub(super) snapshot: SpecSnapshot,
    fetched: Option<git2::Oid>,
    /// The spec files' tree at `fetched` ([`GitMirror::spec_tree_id`]): a new tip with the
    /// same one (a status commit) changes no spec, whatever the repository's size.
    spec_tree: Option<git2::Oid>,
    /// The commit whose files the snapshot holds: the next revision is read as a tree diff
    /// from it ([`GitMirror::changed_files`]). `None` after a failed read, so that the next
    /// one lists every file.
    listed: Option<git2::Oid>,
    /// Tips fetched lately: a webhook announcing one of them is not a reason to fetch.
    fetched_tips: std::collections::VecDeque<git2::Oid>,
}

/// How many fetched tips [`RemoteState::fetched_tips`] keeps.
const REMEMBERED_TIPS: usize = 64;

/// What a look at the source found.
pub(super) enum Found {
    /// Nothing new since the last successful sync: no fetch, no parse, no API call.
    Nothing,
    /// A new revision whose specs equal those last synced (e.g. a status-only commit).
    SameSpecs { revision: String },
    /// Specs to sync at a revision.
    Specs {
        revision: String,
        specs: Arc<SpecSet>,
    },
}

/// The remote and its mirror, shared by the looks at the source.
pub struct Remote {
    /// The mirror's local state: the snapshot, and a handle that reads fetched objects. Its
    /// lock is never held across a network call.
    pub(super) state: Mutex<RemoteState>,
    /// Held by the one network call to the remote under way. A call past --git-timeout keeps
    /// it until libgit2 gives up, and no second call is started beside it.
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// What the network half of a look found.
enum RemoteTip {
    /// The remote's tip is the revision synced last.
    Unchanged,
    /// This tip is in the mirror (fetched now, or before), and whether it descends from the
    /// tip fetched before it (`None`: nothing before, or too far back to tell).
    At(git2::Oid, Option<History>),
}

/// How a new tip relates to the one fetched before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum History {
    FastForward,
    /// A force push: the tip does not descend from `previous`.
    Rewritten {
        previous: git2::Oid,
    },
    /// `previous` was not found within the history fetched below the tip: perhaps a long
    /// fast-forward, perhaps a rewrite (refused with `--refuse-history-rewrites`).
    Unknown {
        previous: git2::Oid,
    },
}

/// A look at the remote: what it found, and how the new tip relates to the last one (the
/// source loop records a rewrite, refused or not).
pub(super) struct Looked {
    pub found: Result<Found, SourceError>,
    /// The new tip and its history, when there is a new tip.
    pub history: Option<(git2::Oid, History)>,
}

#[tracing::instrument(name = "fetch", skip_all, fields(announced = announced.as_deref()))]
pub(super) async fn look_at_remote(
    remote: Arc<Remote>,
    config: &AgentConfig,
    metrics: &Metrics,
    synced: Option<String>,
    announced: Option<String>,
) -> Looked {
    let started = Instant::now();
    let result = ask_remote(&remote, config, synced.clone(), announced).await;
    metrics
        .fetch_duration
        .observe(started.elapsed().as_secs_f64());
    let mut seen = None;
    let found = match result {
        Ok(RemoteTip::Unchanged) => Ok(Found::Nothing),
        Ok(RemoteTip::At(tip, history)) => {
            seen = history.map(|h| (tip, h));
            let refused = match history {
                Some(History::Rewritten { previous }) if config.refuse_history_rewrites => {
                    Some(SourceError::Git(GitError::Rewritten {
                        previous: previous.to_string(),
                        tip: tip.to_string(),
                    }))
                }
                // Fails closed: a history it cannot check is not taken (issue 70).
                Some(History::Unknown { previous }) if config.refuse_history_rewrites => {
                    Some(SourceError::Git(GitError::HistoryUnknown {
                        previous: previous.to_string(),
                        tip: tip.to_string(),
                        depth: crate::source::git::MAX_HISTORY_DEPTH,
                    }))
                }
                _ => None,
            };
            match refused {
                Some(e) => Err(e),
                None => {
                    let span = tracing::info_span!("read", revision = %tip);
                    read_tip(&remote, config, tip, synced, span).await
                }
            }
        }
        Err(e) => Err(e),
    };
    let found = found.inspect_err(|e| {
        metrics
            .fetch_errors
            .get_or_create(&ReasonLabel {
                reason: e.metric_label().to_string(),
            })
            .inc();
    });
    Looked {
        found,
        history: seen,
    }
}

/// Reads the specs at `tip` (in the mirror already) into the snapshot. Local work: only a
/// chart from a host --render-allow-host names is fetched here, within --render-timeout plus
/// --git-timeout; only the source loop (or the read ahead, before it starts) takes the
/// state's lock, so nothing waits on it meanwhile.
async fn read_tip(
    remote: &Arc<Remote>,
    config: &AgentConfig,
    tip: git2::Oid,
    synced: Option<String>,
    span: tracing::Span,
) -> Result<Found, SourceError> {
    let load = config.load.clone();
    let keys = config.signing_keys.clone();
    let verify_commits = config.verify_commits;
    let remote = remote.clone();
    tokio::task::spawn_blocking(move || {
        let _in = span.enter();
        let read = read_revision(&remote, tip, &load, keys.as_deref(), verify_commits, synced);
        crate::telemetry::memory::collect_freed();
        read
    })
    .await
    .map_err(SourceError::Task)
    .and_then(|r| r.map_err(SourceError::Git))
}

/// Asks the remote for its tip and fetches it when it is new, within --git-timeout, holding
/// no lock while it waits.
async fn ask_remote(
    remote: &Arc<Remote>,
    config: &AgentConfig,
    synced: Option<String>,
    announced: Option<String>,
) -> Result<RemoteTip, SourceError> {
    let timeout = config.git_timeout;
    let whole_range =
        config.signing_keys.is_some() && config.verify_commits == VerifyCommits::Range;
    let (dir, git_remote, previous, announced_is_new) = {
        let s = remote.state.lock().map_err(|_| SourceError::Poisoned)?;
        let announced = announced.and_then(|a| git2::Oid::from_str(&a).ok());
        // A webhook for a tip fetched before (a replay, a redelivery, an old push) only asks
        // the remote for its tip; wake-ups coalesce, so a newer push behind it is found then.
        (
            s.mirror.dir().to_path_buf(),
            s.mirror.remote().clone(),
            s.fetched,
            announced.is_some_and(|a| !s.fetched_tips.contains(&a)),
        )
    };
    let url = crate::text::redact_credentials(&git_remote.url);
    let Ok(permit) = remote.in_flight.clone().try_acquire_owned() else {
        return Err(SourceError::Busy { url, timeout });
    };
    let job = tokio::task::spawn_blocking(move || -> Result<RemoteTip, GitError> {
        let _permit = permit;
        let mut mirror = GitMirror::open_existing(&dir, git_remote)?;
        mirror.set_deadline(Some(timeout));
        let tip = if announced_is_new {
            mirror.fetch_new_tip(whole_range)?
        } else {
            let tip = mirror.remote_tip()?;
            if Some(tip) == previous && synced.as_deref() == Some(&tip.to_string()) {
                return Ok(RemoteTip::Unchanged);
            }
            if Some(tip) == previous {
                return Ok(RemoteTip::At(tip, None));
            }
            mirror.fetch_new_tip(whole_range)?
        };
        let history = match previous.filter(|p| *p != tip) {
            Some(previous) => match mirror.descends_from(tip, previous, whole_range) {
                Ok(Some(true)) => Some(History::FastForward),
                Ok(Some(false)) => Some(History::Rewritten { previous }),
                Ok(None) => Some(History::Unknown { previous }),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot look at the history between the tips");
                    None
                }
            },
            None => None,
        };
        Ok(RemoteTip::At(tip, history))
    });
    // libgit2 ends the call at its socket timeout or the deadline above; this is the backstop
    // for a server that keeps it busy otherwise, and then the call goes on alone, holding only
    // `in_flight`.
    match tokio::time::timeout(timeout + Duration::from_secs(1), job).await {
        Ok(Ok(Ok(tip))) => Ok(tip),
        Ok(Ok(Err(e))) => Err(SourceError::Git(e)),
        Ok(Err(e)) => Err(SourceError::Task(e)),
        Err(_) => Err(SourceError::Timeout { url, timeout }),
    }
}

/// Refuses `tip` unless a trusted key signed it (and, with `range`, every commit since the
/// last verified one).
fn check_signed(
    mirror: &crate::source::git::GitMirror,
    tip: git2::Oid,
    keys: &std::path::Path,
    verify_commits: VerifyCommits,
) -> Result<(), GitError> {
    let unverified = |why: crate::source::verify::VerifyError| GitError::Unverified {
        commit: tip.to_string(),
        why: why.to_string(),
    };
    let keys = crate::source::verify::TrustedKeys::load(keys).map_err(unverified)?;
    let signer = verify_revision(mirror, tip, &keys, verify_commits).map_err(unverified)?;
    tracing::info!(revision = %tip, signer, "signed by a trusted key");
    Ok(())
}

/// Reads the specs at `tip`, which is in the mirror, into the snapshot.
/// Where a revision is listed from: the whole repository, the boundary of every reference;
/// `--path` picks what is applied ([`crate::specs::PathSelection`]).
const REPOSITORY_ROOT: &str = "";

fn read_revision(
    remote: &Remote,
    tip: git2::Oid,
    load: &LoadOptions,
    signing_keys: Option<&std::path::Path>,
    verify_commits: VerifyCommits,
    synced: Option<String>,
) -> Result<Found, GitError> {
    let mut guard = remote
        .state
        .lock()
        .map_err(|_| GitError::Git(git2::Error::from_str("source state poisoned")))?;
    let s = &mut *guard;
    // Before anything of it is read: a tip not signed by a trusted key is refused whole.
    if let Some(keys) = signing_keys {
        check_signed(&s.mirror, tip, keys, verify_commits)?;
    }
    let previous = s.fetched;
    if !s.fetched_tips.contains(&tip) {
        if s.fetched_tips.len() >= REMEMBERED_TIPS {
            s.fetched_tips.pop_front();
        }
        s.fetched_tips.push_back(tip);
    }
    // Only when the last sync succeeded for the snapshot as it was; a failed sync is retried.
    let last_sync_covers_snapshot = synced.is_some() && synced == previous.map(|p| p.to_string());
    let spec_tree = s.mirror.spec_tree_id(tip, REPOSITORY_ROOT)?;
    if last_sync_covers_snapshot && s.spec_tree == Some(spec_tree) {
        s.fetched = Some(tip);
        accept(&s.mirror, tip);
        tracing::info!(revision = %tip, "new revision changes no spec file (e.g. status only); nothing to sync");
        return Ok(Found::SameSpecs {
            revision: tip.to_string(),
        });
    }
    let mirror = &s.mirror;
    let read = |_: &str, id: &str| mirror.read_spec_file(id, load.max_file_bytes);
    // Set again only once the snapshot holds `tip`'s files.
    let listed = s.listed.take();
    s.spec_tree = None;
    let changed = match listed {
        Some(from) => match mirror.changed_files(from, tip, REPOSITORY_ROOT, &load.shape) {
            Ok(Some(changes)) => s.snapshot.update_changed(&changes, read, load)?,
            Ok(None) => None,
            // E.g. `from` is gone from a mirror cloned again: the whole listing says it all.
            Err(e) => {
                tracing::debug!(error = %e, "no tree diff from the last revision; listing every file");
                None
            }
        },
        None => None,
    };
    let update = match changed {
        Some(update) => update,
        None => s.snapshot.update(
            &mirror.list_files_within(tip, REPOSITORY_ROOT, &load.shape)?,
            read,
            load,
        )?,
    };
    s.listed = Some(tip);
    s.spec_tree = Some(spec_tree);
    s.fetched = Some(tip);
    accept(&s.mirror, tip);
    if !update.changed && last_sync_covers_snapshot {
        tracing::info!(revision = %tip, "new revision changes no spec (e.g. status only); nothing to sync");
        return Ok(Found::SameSpecs {
            revision: tip.to_string(),
        });
    }
    tracing::info!(revision = %tip, parsed = update.parsed, "new revision");
    Ok(Found::Specs {
        revision: tip.to_string(),
        specs: s.snapshot.spec_set(),
    })
}

/// Keeps `tip` as the revision a restarted agent judges the next one against.
/// Checks `tip` (and in range mode every commit since the last verified one) against `keys`;
/// who signed the tip. The range is walked only in the history already fetched (the look at
/// the remote fetched it to judge the new tip's history), never under the state's lock.
fn verify_revision(
    mirror: &GitMirror,
    tip: git2::Oid,
    keys: &crate::source::verify::TrustedKeys,
    mode: VerifyCommits,
) -> Result<String, crate::source::verify::VerifyError> {
    use crate::source::verify::{MAX_VERIFIED_RANGE, VerifyError, check_commit, check_range};
    let signer = match (mode, mirror.verified()) {
        (VerifyCommits::Tip, _) => return check_commit(mirror.repo(), tip, keys),
        (VerifyCommits::Range, None) => {
            tracing::info!(revision = %tip, "no commit verified before in this cache: range verification starts at this tip");
            check_commit(mirror.repo(), tip, keys)?
        }
        (VerifyCommits::Range, Some(since)) if mirror.has_below(tip, since) => {
            check_range(mirror.repo(), tip, since, keys, MAX_VERIFIED_RANGE)?
        }
        (VerifyCommits::Range, Some(since)) => {
            return Err(VerifyError::NotAbove {
                since: since.to_string(),
            });
        }
    };
    if let Err(e) = mirror.set_verified(tip) {
        tracing::warn!(error = %e, "cannot record the verified revision in the mirror; the next range starts further down");
    }
    Ok(signer)
}

fn accept(mirror: &GitMirror, tip: git2::Oid) {
    if let Err(e) = mirror.set_accepted(tip) {
        tracing::debug!(error = %e, "cannot record the accepted revision in the mirror");
    }
}

#[tracing::instrument(name = "read", skip_all)]
pub(super) fn look_at_local(
    snapshot: &mut SpecSnapshot,
    config: &AgentConfig,
    last_sync_ok: bool,
) -> Result<Found, SourceError> {
    let SourceConfig::Local { dir } = &config.source else {
        return Ok(Found::Nothing);
    };
    let root = dir.clone();
    let update = crate::source::snapshot::update_from_dir(snapshot, &root, &config.load).map_err(
        |source| SourceError::Local {
            path: root.clone(),
            source,
        },
    )?;
    if !update.changed && last_sync_ok {
        return Ok(Found::Nothing);
    }
    Ok(Found::Specs {
        revision: "working-tree".into(),
        specs: snapshot.spec_set(),
    })
}

/// Opens the mirror of a remote source (cloning it the first time).
pub async fn open_remote(
    remote: crate::source::git::GitRemote,
    cache_dir: std::path::PathBuf,
    render: crate::render::RenderOptions,
) -> Result<Arc<Remote>> {
    let mirror = tokio::task::spawn_blocking(move || GitMirror::open(&cache_dir, remote))
        .await
        .map_err(|e| Error::Runtime(std::io::Error::other(e)))?
        .map_err(|e| Error::Source(crate::text::redact_credentials(&e.to_string())))?;
    // After a restart, the next tip is judged (signature, history) against the revision the
    // agent before accepted.
    let fetched = mirror.accepted();
    Ok(Arc::new(Remote {
        state: Mutex::new(RemoteState {
            mirror,
            snapshot: SpecSnapshot::with_render(render),
            fetched,
            spec_tree: None,
            listed: None,
            fetched_tips: Default::default(),
        }),
        in_flight: Arc::new(tokio::sync::Semaphore::new(1)),
    }))
}
