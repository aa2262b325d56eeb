//! Whether a new tip descends from the revision synced before: told from the graph, from the
//! tip's own object (one push on the last tip: no second fetch), or by fetching deeper into a
//! shallow mirror.

use git2::Oid;

use super::{GitError, GitMirror, HISTORY_DEPTH, MAX_HISTORY_DEPTH, is_local};

impl GitMirror {
    /// Whether `tip` descends from `previous` (the revision synced before): `Some(true)` for a
    /// fast-forward, `Some(false)` for a rewritten history (a force push), `None` when the
    /// history fetched cannot tell. A full mirror knows; a shallow one fetches deeper, from
    /// [`HISTORY_DEPTH`] up to [`MAX_HISTORY_DEPTH`] commits, until it finds `previous`
    /// (network: call it where a fetch may be made).
    ///
    /// One push on top of `previous` (a commit, or the merge of a pull request) is told from
    /// the new tip's own object, with no second, deeper fetch (issue 77: that fetch doubled
    /// push to update). With `whole_range` (range verification) it fetches deeper all the
    /// same: every commit since the last verified one is checked, so the graph must hold them.
    pub fn descends_from(
        &self,
        tip: Oid,
        previous: Oid,
        whole_range: bool,
    ) -> Result<Option<bool>, GitError> {
        if tip == previous || self.repo.graph_descendant_of(tip, previous)? {
            return Ok(Some(true));
        }
        if !whole_range && self.named_parents(tip)?.contains(&previous) {
            return Ok(Some(true));
        }
        if !self.shallow || is_local(&self.remote.url) {
            // The whole history is here: not among the ancestors is not a descendant (issue
            // 70: 300 commits of an orphan history were "cannot tell", and applied).
            return Ok(Some(false));
        }
        let mut depth = HISTORY_DEPTH;
        loop {
            self.fetch_to_depth(depth)?;
            if self.repo.graph_descendant_of(tip, previous)? {
                return Ok(Some(true));
            }
            if depth >= MAX_HISTORY_DEPTH || !self.is_shallow_now() {
                break;
            }
            depth = (depth * 8).min(MAX_HISTORY_DEPTH);
        }
        // Not found among the ancestors fetched: rewritten if they reach a root, or reach
        // back past the time `previous` was committed (an ancestor is older than its
        // descendants, give or take a clock); else too far back to tell.
        let shallow: std::collections::HashSet<Oid> =
            std::fs::read_to_string(self.repo.path().join("shallow"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| Oid::from_str(l.trim()).ok())
                .collect();
        let previous_time = match self.repo.find_commit(previous) {
            Ok(c) => c.time().seconds(),
            Err(_) => return Ok(None),
        };
        let mut walk = self.repo.revwalk()?;
        walk.push(tip)?;
        let mut oldest = i64::MAX;
        let mut at_boundary = false;
        for (seen, id) in walk.enumerate() {
            let id = id?;
            if seen > MAX_HISTORY_DEPTH as usize * 2 {
                at_boundary = true;
                break;
            }
            oldest = oldest.min(self.repo.find_commit(id)?.time().seconds());
            at_boundary |= shallow.contains(&id);
        }
        Ok((!at_boundary || previous_time >= oldest).then_some(false))
    }

    /// Whether the mirror still has a shallow boundary (a fetch deep enough to reach the
    /// first commit leaves none).
    fn is_shallow_now(&self) -> bool {
        std::fs::read_to_string(self.repo.path().join("shallow"))
            .is_ok_and(|s| !s.trim().is_empty())
    }

    /// The parents commit `id`'s own object names. A shallow fetch makes the new tip a
    /// boundary, whose parents the graph hides; its object still names them.
    fn named_parents(&self, id: Oid) -> Result<Vec<Oid>, GitError> {
        let odb = self.repo.odb()?;
        let object = odb.read(id)?;
        let parents = object
            .data()
            .split(|b| *b == b'\n')
            .take_while(|line| !line.is_empty())
            .filter_map(|line| line.strip_prefix(b"parent "))
            .filter_map(|hex| Oid::from_str(std::str::from_utf8(hex).ok()?).ok())
            .collect();
        Ok(parents)
    }
}
