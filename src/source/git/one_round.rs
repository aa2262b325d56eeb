//! A new tip fetched in one round of negotiation (issue 77). libgit2 negotiates a shallow
//! fetch (`--depth`) in a round of its own before the round that asks for the pack: two
//! requests to the host after the ref listing, where a fetch without depth, from a mirror
//! whose only `have`s are its ref tips, takes one. That halved a one-file push's fetch on a
//! smart HTTP host (benches/source.rs).
//!
//! Without depth the host sends everything below the new tip that the mirror does not have:
//! for a push on the last tip, only its own objects; for a rewritten history, or a merge of a
//! branch that forked below the mirror's shallow tips, all of that history. So the transfer is
//! bounded: past [`ONE_ROUND_MAX_OBJECTS`] or [`ONE_ROUND_MAX_BYTES`] it is stopped, and the
//! tip is fetched shallow instead, as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use git2::{FetchOptions, Oid};

use super::{GitError, GitMirror, is_local};

/// The most objects a one-round fetch takes (a one-file push is a commit, a few trees and a
/// blob); a larger one is fetched shallow.
const ONE_ROUND_MAX_OBJECTS: usize = 1_000;
/// The most bytes a one-round fetch takes.
const ONE_ROUND_MAX_BYTES: usize = 4 << 20;

impl GitMirror {
    /// Fetches the branch's tip, in one round of negotiation where the mirror already has a
    /// tip of it (see the module's doc); else, or when that would bring too much, as
    /// [`GitMirror::fetch`]. With `whole_range` (range verification, which walks down to the
    /// last verified commit) the history below the tips is kept, and the fetch is shallow.
    pub fn fetch_new_tip(&self, whole_range: bool) -> Result<Oid, GitError> {
        if whole_range || !self.shallow || is_local(&self.remote.url) || self.local_tip().is_none()
        {
            return self.fetch();
        }
        self.hide_history_below_ref_tips()?;
        match self.fetch_one_round() {
            Ok(Some(tip)) => Ok(tip),
            Ok(None) => {
                tracing::debug!(
                    "the new tip brings more than one round may take; fetching it shallow"
                );
                self.fetch()
            }
            Err(e) => Err(e),
        }
    }

    /// Makes every ref's commit a shallow boundary, so that the negotiation's `have`s are the
    /// ref tips alone (libgit2 walks below every ref, 20 `have`s a round). The objects stay;
    /// only the history that the fetch would offer is cut.
    fn hide_history_below_ref_tips(&self) -> Result<(), GitError> {
        let mut tips: Vec<String> = self
            .repo
            .references()?
            .filter_map(|r| r.ok()?.peel_to_commit().ok().map(|c| c.id().to_string()))
            .collect();
        tips.sort();
        tips.dedup();
        let path = self.repo.path().join("shallow");
        let text = tips.iter().map(|t| format!("{t}\n")).collect::<String>();
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        // Whole or not at all: a `kill -9` mid-write must not leave a boundary libgit2 cannot
        // read (every later fetch would fail on it).
        let io = |path: &std::path::Path| {
            let path = path.to_path_buf();
            move |source| GitError::Io { path, source }
        };
        let written = self.repo.path().join("shallow.linnet-new");
        std::fs::write(&written, text).map_err(io(&written))?;
        std::fs::rename(&written, &path).map_err(io(&path))
    }

    /// The fetch without depth; `None` when it was stopped at the bound.
    fn fetch_one_round(&self) -> Result<Option<Oid>, GitError> {
        let too_much = Arc::new(AtomicBool::new(false));
        let mut callbacks = self.callbacks();
        let deadline = self.deadline.map(|(at, _)| at);
        let stopped = too_much.clone();
        // Replaces the deadline's check in `callbacks` and keeps it.
        callbacks.transfer_progress(move |p| {
            if p.total_objects() > ONE_ROUND_MAX_OBJECTS || p.received_bytes() > ONE_ROUND_MAX_BYTES
            {
                stopped.store(true, Ordering::Relaxed);
                return false;
            }
            deadline.is_none_or(|at| Instant::now() < at)
        });
        let mut options = FetchOptions::new();
        options.remote_callbacks(callbacks);
        match self.fetch_branch(options) {
            Ok(tip) => Ok(Some(tip)),
            Err(_) if too_much.load(Ordering::Relaxed) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
