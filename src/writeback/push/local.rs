//! Pushes to a repository on this machine (`file://`, a path): libgit2's local transport
//! cannot move a branch only if it is still at the tip read, so the objects go first, to a
//! ref of this push's own, and the branch moves by compare-and-swap.

use std::path::Path;

use git2::Oid;

use super::{PUSH_REF, PushResult, StatusWriter, WriteError};

impl StatusWriter {
    /// To a repository on this machine: the objects first (to a ref of linnet's own), then the
    /// branch moved from `tip` to `commit` only if it still is at `tip`.
    pub(super) fn push_local(
        &self,
        path: &Path,
        branch: &str,
        commit: Oid,
        tip: Option<Oid>,
    ) -> Result<PushResult, WriteError> {
        // A ref of this push's own: the agents of a fleet (and one agent's write-back and
        // reverts) push to one repository at once, and a shared name was taken by another's.
        static PUSHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let incoming = format!("{PUSH_REF}-incoming-{}-{n}", std::process::id());
        if let PushResult::Stale = self.push_refspec(&format!("+{PUSH_REF}:{incoming}"))? {
            return Ok(PushResult::Stale);
        }
        let remote =
            git2::Repository::open(path).map_err(|e| WriteError::Git(self.mirror.classify(e)))?;
        let branch = format!("refs/heads/{branch}");
        let moved = match tip {
            Some(tip) => remote.reference_matching(&branch, commit, true, tip, "linnet write-back"),
            // A new branch: created only if nobody made it meanwhile.
            None => remote.reference(&branch, commit, false, "linnet write-back"),
        };
        if let Ok(mut r) = remote.find_reference(&incoming) {
            let _ = r.delete();
        }
        match moved {
            Ok(_) => Ok(PushResult::Done),
            Err(e)
                if matches!(
                    e.code(),
                    git2::ErrorCode::Modified | git2::ErrorCode::Exists | git2::ErrorCode::Locked
                ) =>
            {
                Ok(PushResult::Stale)
            }
            Err(e) => Err(WriteError::Git(self.mirror.classify(e))),
        }
    }
}
