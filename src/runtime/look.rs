//! The looks at the source: ask a remote for its tip and fetch it (within --git-timeout, no
//! lock held while waiting), or list a local directory; then read what changed into the
//! snapshot, parsing only the files whose blobs changed. What a look found is [`Found`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::config::SourceConfig;
use super::source_loop::SourceLoop;
use crate::source::git::{GitError, GitMirror};
use crate::source::snapshot::SpecSnapshot;
use crate::specs::{LoadOptions, SpecSet};
use crate::telemetry::ReasonLabel;
use crate::{Error, Result};

pub(super) struct RemoteState {
    mirror: GitMirror,
    pub(super) snapshot: SpecSnapshot,
    fetched: Option<git2::Oid>,
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
    Specs { revision: String, specs: SpecSet },
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
    /// This tip is in the mirror (fetched now, or before).
    At(git2::Oid),
}

pub(super) async fn look_at_remote(
    remote: Arc<Remote>,
    source_loop: &SourceLoop,
    synced: Option<String>,
    announced: Option<String>,
) -> Result<Found, String> {
    let started = Instant::now();
    let result = ask_remote(&remote, source_loop, synced.clone(), announced).await;
    source_loop
        .metrics
        .fetch_duration
        .observe(started.elapsed().as_secs_f64());
    let found = match result {
        Ok(RemoteTip::Unchanged) => Ok(Found::Nothing),
        Ok(RemoteTip::At(tip)) => {
            let path = source_loop.config.path.clone();
            let load = source_loop.config.load.clone();
            let remote = remote.clone();
            // Local work only: the objects are in the mirror already.
            tokio::task::spawn_blocking(move || read_revision(&remote, tip, &path, &load, synced))
                .await
                .map_err(|e| ("panic", format!("Git task failed: {e}")))
                .and_then(|r| r.map_err(|e| (e.label(), e.to_string())))
        }
        Err(e) => Err(e),
    };
    found.map_err(|(label, message)| {
        source_loop
            .metrics
            .fetch_errors
            .get_or_create(&ReasonLabel {
                reason: label.to_string(),
            })
            .inc();
        message
    })
}

/// Asks the remote for its tip and fetches it when it is new, within --git-timeout, holding
/// no lock while it waits.
async fn ask_remote(
    remote: &Arc<Remote>,
    source_loop: &SourceLoop,
    synced: Option<String>,
    announced: Option<String>,
) -> Result<RemoteTip, (&'static str, String)> {
    let timeout = source_loop.config.git_timeout;
    let (dir, git_remote, previous, announced_is_new) = {
        let s = remote
            .state
            .lock()
            .map_err(|_| ("git", "source state poisoned".to_string()))?;
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
        return Err((
            "busy",
            format!(
                "the previous call to {url} has not returned after --git-timeout ({timeout:?}); \
                 waiting for libgit2 to give it up before starting another"
            ),
        ));
    };
    let job = tokio::task::spawn_blocking(move || -> Result<RemoteTip, GitError> {
        let _permit = permit;
        let mut mirror = GitMirror::open_existing(&dir, git_remote)?;
        mirror.set_deadline(Some(timeout));
        if announced_is_new {
            return Ok(RemoteTip::At(mirror.fetch()?));
        }
        let tip = mirror.remote_tip()?;
        if Some(tip) == previous && synced.as_deref() == Some(&tip.to_string()) {
            return Ok(RemoteTip::Unchanged);
        }
        if Some(tip) == previous {
            return Ok(RemoteTip::At(tip));
        }
        Ok(RemoteTip::At(mirror.fetch()?))
    });
    // libgit2 ends the call at its socket timeout or the deadline above; this is the backstop
    // for a server that keeps it busy otherwise, and then the call goes on alone, holding only
    // `in_flight`.
    match tokio::time::timeout(timeout + Duration::from_secs(1), job).await {
        Ok(Ok(Ok(tip))) => Ok(tip),
        Ok(Ok(Err(e))) => Err((e.label(), e.to_string())),
        Ok(Err(e)) => Err(("panic", format!("Git task failed: {e}"))),
        Err(_) => Err((
            "timeout",
            format!("{url} did not answer within {timeout:?} (--git-timeout)"),
        )),
    }
}

/// Reads the specs at `tip`, which is in the mirror, into the snapshot.
fn read_revision(
    remote: &Remote,
    tip: git2::Oid,
    path: &str,
    load: &LoadOptions,
    synced: Option<String>,
) -> Result<Found, GitError> {
    let mut guard = remote
        .state
        .lock()
        .map_err(|_| GitError::Git(git2::Error::from_str("source state poisoned")))?;
    let s = &mut *guard;
    let previous = s.fetched;
    if !s.fetched_tips.contains(&tip) {
        if s.fetched_tips.len() >= REMEMBERED_TIPS {
            s.fetched_tips.pop_front();
        }
        s.fetched_tips.push_back(tip);
    }
    let listing = s.mirror.list_files(tip, path)?;
    let mirror = &s.mirror;
    let update = s.snapshot.update(
        &listing,
        |_, id| mirror.read_spec_file(id, load.max_file_bytes),
        load,
    )?;
    s.fetched = Some(tip);
    // Only when the last sync succeeded for the snapshot as it was; a failed sync is retried.
    let last_sync_covers_snapshot = synced.is_some() && synced == previous.map(|p| p.to_string());
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

pub(super) fn look_at_local(
    snapshot: &mut SpecSnapshot,
    source_loop: &SourceLoop,
    last_sync_ok: bool,
) -> Result<Found, String> {
    let SourceConfig::Local { dir } = &source_loop.config.source else {
        return Ok(Found::Nothing);
    };
    let root = dir.join(&source_loop.config.path);
    let files = crate::specs::list_local_spec_files(&root)
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let listing: Vec<(String, String)> = files
        .iter()
        .map(|f| (f.rel.clone(), f.change_id()))
        .collect();
    let by_path: std::collections::HashMap<&str, &crate::specs::LocalSpecFile> =
        files.iter().map(|f| (f.rel.as_str(), f)).collect();
    let max = source_loop.config.load.max_file_bytes;
    let update = snapshot
        .update(
            &listing,
            |p, _| -> std::result::Result<_, std::convert::Infallible> {
                Ok(match by_path.get(p) {
                    Some(file) => crate::specs::read_local_spec_file(file, max),
                    None => crate::specs::FileContent::Refused("vanished while read".into()),
                })
            },
            &source_loop.config.load,
        )
        .map_err(|e| format!("{}: {e}", root.display()))?;
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
) -> Result<Arc<Remote>> {
    let mirror = tokio::task::spawn_blocking(move || GitMirror::open(&cache_dir, remote))
        .await
        .map_err(|e| Error::Runtime(std::io::Error::other(e)))?
        .map_err(|e| {
            Error::Runtime(std::io::Error::other(crate::text::redact_credentials(
                &e.to_string(),
            )))
        })?;
    Ok(Arc::new(Remote {
        state: Mutex::new(RemoteState {
            mirror,
            snapshot: SpecSnapshot::default(),
            fetched: None,
            fetched_tips: Default::default(),
        }),
        in_flight: Arc::new(tokio::sync::Semaphore::new(1)),
    }))
}
