//! Which reverts, promotions and pull request closings the revert loop
//! ([`super::revert_loop`]) has to make, which were dealt with, and when to try again. Pure
//! bookkeeping: no Git, no host.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::promotion::Promotion;
use super::revert::Revert;
use super::reverter::{Job, Key};
use crate::api::RevertMode;

/// What a job is about: a rollout's revert, or its promotion to the next environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Lane {
    Revert,
    Promote,
    /// A fleet's revert of an image that failed in another cluster ([`fleet_revert`]).
    FleetRevert,
}

/// The first wait after a failure that may pass; it doubles up to [`MAX_RETRY`].
const RETRY: Duration = Duration::from_secs(2);
const MAX_RETRY: Duration = Duration::from_secs(120);

/// Which reverts and promotions to make and which pull requests to close, and which were
/// dealt with.
pub(super) struct Reverts {
    pending: BTreeMap<(Key, Lane), Job>,
    /// The last job dealt with per rollout and lane (made, not needed, or impossible): the
    /// same one is not tried again.
    settled: BTreeMap<(Key, Lane), Job>,
    /// Rollouts whose revert pull requests were looked for since the start (found, opened or
    /// closed): a rollout seen for the first time is looked for once.
    looked: BTreeSet<Key>,
    pub(super) due: Option<Instant>,
    retries: crate::retry::Retries,
}

impl Default for Reverts {
    fn default() -> Self {
        Reverts {
            pending: BTreeMap::new(),
            settled: BTreeMap::new(),
            looked: BTreeSet::new(),
            due: None,
            retries: crate::retry::Retries::new(RETRY, MAX_RETRY),
        }
    }
}

impl Reverts {
    /// The rollout `key` asks for revert `wanted` now; `pull_requests` when it uses them.
    pub(super) fn offer(
        &mut self,
        key: Key,
        wanted: Option<Revert>,
        pull_requests: bool,
        now: Instant,
    ) {
        let lane = (key.clone(), Lane::Revert);
        let job = match wanted.map(Job::Revert) {
            Some(job) if self.settled.get(&lane) == Some(&job) => None,
            Some(job) => Some(job),
            None => {
                let had_one = self.settled.remove(&lane).is_some_and(
                    |j| matches!(j, Job::Revert(r) if r.mode == RevertMode::PullRequest),
                );
                // After a restart, an open pull request may be left from before: looked for once.
                (pull_requests && (had_one || !self.looked.contains(&key))).then_some(Job::Close)
            }
        };
        match job {
            Some(job) => {
                self.looked.insert(key);
                self.pending.insert(lane, job);
                self.due.get_or_insert(now);
            }
            None => {
                if self
                    .pending
                    .get(&lane)
                    .is_some_and(|j| matches!(j, Job::Revert(_)))
                {
                    self.pending.remove(&lane);
                }
            }
        }
    }

    /// The rollout `key` asks for promotion `wanted` now. A rollout that no longer asks (a new
    /// canary) leaves its pull request open: what it proposes still passed.
    pub(super) fn offer_promotion(&mut self, key: Key, wanted: Option<Promotion>, now: Instant) {
        let lane = (key, Lane::Promote);
        match wanted.map(Job::Promote) {
            Some(job) if self.settled.get(&lane) != Some(&job) => {
                self.pending.insert(lane, job);
                self.due.get_or_insert(now);
            }
            Some(_) => {}
            None => {
                self.pending.remove(&lane);
            }
        }
    }

    /// The rollout `key` asks for fleet revert `wanted` now. Once asked, it is made: the
    /// failure it answers no longer shows once the failed cluster's own revert is merged.
    pub(super) fn offer_fleet_revert(&mut self, key: Key, wanted: Option<Revert>, now: Instant) {
        let lane = (key, Lane::FleetRevert);
        if let Some(job) = wanted.map(Job::Revert)
            && self.settled.get(&lane) != Some(&job)
        {
            self.pending.insert(lane, job);
            self.due.get_or_insert(now);
        }
    }

    /// The rollout `key` is no longer settled on the image a waiting fleet revert puts back
    /// (`settled_on`: what it is settled on now, if anything): Git or a person moved on, or
    /// it was deleted. A fleet revert is not made, nor tried again, for an image it left.
    pub(super) fn withdraw_fleet_revert(&mut self, key: &Key, settled_on: Option<&str>) {
        let lane = (key.clone(), Lane::FleetRevert);
        if let Some(Job::Revert(r)) = self.pending.get(&lane)
            && Some(r.failed.as_str()) != settled_on
        {
            self.pending.remove(&lane);
        }
    }

    /// Whether a revert, a promotion or a pull request's closing waits for `key`.
    pub(super) fn has_job(&self, key: &Key) -> bool {
        let lanes = (key.clone(), Lane::Revert)..=(key.clone(), Lane::FleetRevert);
        self.pending.range(lanes).next().is_some()
    }

    pub(super) fn take(&mut self) -> Vec<((Key, Lane), Job)> {
        self.due = None;
        std::mem::take(&mut self.pending).into_iter().collect()
    }

    pub(super) fn settle(&mut self, lane: (Key, Lane), job: Job) {
        self.retries.reset();
        if !matches!(job, Job::Close) {
            self.settled.insert(lane, job);
        }
    }

    /// A failure that may pass: tried again after a backoff, unless the rollout asked for
    /// something else meanwhile.
    pub(super) fn retry(&mut self, lane: (Key, Lane), job: Job, now: Instant) {
        let wait = self.retries.wait();
        self.pending.entry(lane).or_insert(job);
        self.due = Some(self.due.map_or(now + wait, |d| d.max(now + wait)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revert(failed: &str) -> Revert {
        Revert {
            path: "apps/redis.yaml".into(),
            kind: "CanaryStatefulSet",
            namespace: "demo".into(),
            name: "redis".into(),
            failed: failed.into(),
            good: "redis:7.2".into(),
            why: "rolled back".into(),
            mode: crate::api::RevertMode::Commit,
            revision: None,
            shared_base: false,
            cluster: None,
            failed_in: None,
        }
    }

    fn redis() -> Key {
        ("CanaryStatefulSet", "demo".into(), "redis".into())
    }

    #[test]
    fn only_a_rollout_with_a_job_has_one() {
        let mut r = Reverts::default();
        let now = Instant::now();
        let other: Key = ("CanaryStatefulSet", "default".into(), "web".into());
        assert!(!r.has_job(&redis()));
        r.offer(redis(), Some(revert("redis:7.4")), false, now);
        assert!(r.has_job(&redis()));
        assert!(!r.has_job(&other));
        r.offer(redis(), None, false, now);
        assert!(!r.has_job(&redis()), "the revert is no longer asked for");
    }

    #[test]
    fn a_revert_dealt_with_is_not_made_again_but_a_new_failure_is() {
        let t0 = Instant::now();
        let mut r = Reverts::default();
        r.offer(redis(), Some(revert("redis:7.4")), false, t0);
        assert_eq!(r.due, Some(t0));
        let batch = r.take();
        assert_eq!(batch.len(), 1);
        r.settle((redis(), Lane::Revert), Job::Revert(revert("redis:7.4")));
        // Every later change of the same rolled-back rollout: nothing to do.
        r.offer(redis(), Some(revert("redis:7.4")), false, t0);
        assert!(r.take().is_empty());
        // The next image fails too: a new revert.
        r.offer(redis(), Some(revert("redis:7.6")), false, t0);
        assert_eq!(r.take().len(), 1);
    }

    /// Review: a fleet revert that failed in a way that passes was tried again for good,
    /// even after the rollout left the image (or was deleted).
    #[test]
    fn a_fleet_revert_stays_once_asked_but_goes_when_the_rollout_leaves_the_image() {
        let t0 = Instant::now();
        let mut r = Reverts::default();
        let fleet = || Revert {
            failed_in: Some("eu-2".into()),
            ..revert("redis:7.4")
        };
        r.offer_fleet_revert(redis(), Some(fleet()), t0);
        // The failure no longer shows (the failed cluster's own revert merged): still made.
        r.offer_fleet_revert(redis(), None, t0);
        r.withdraw_fleet_revert(&redis(), Some("redis:7.4"));
        let (lane, job) = r.take().remove(0);
        assert_eq!(lane.1, Lane::FleetRevert);
        r.retry(lane, job, t0);
        // A person put another image in Git: not tried again.
        r.withdraw_fleet_revert(&redis(), Some("redis:7.6"));
        assert!(r.take().is_empty());
        r.offer_fleet_revert(redis(), Some(fleet()), t0);
        r.withdraw_fleet_revert(&redis(), None);
        assert!(r.take().is_empty(), "deleted, or no longer settled");
    }

    #[test]
    fn a_failed_push_is_retried_after_a_backoff_unless_the_rollout_moved_on() {
        let t0 = Instant::now();
        let mut r = Reverts::default();
        r.offer(redis(), Some(revert("redis:7.4")), false, t0);
        let (key, job) = r.take().remove(0);
        r.retry(key, job, t0);
        let due = r.due.map(|d| d - t0);
        assert!(due >= Some(RETRY) && due <= Some(RETRY * 2), "{due:?}");
        // The rollout is no longer rolled back (a person changed the image): dropped.
        r.offer(redis(), None, false, t0);
        assert!(r.take().is_empty());
    }

    #[test]
    fn pull_requests_are_looked_for_once_after_a_start_and_closed_when_git_moves_on() {
        let t0 = Instant::now();
        let mut r = Reverts::default();
        // A Stable rollout that uses pull requests, seen first after a start: one look, in
        // case a pull request was left open while the agent was away.
        r.offer(redis(), None, true, t0);
        assert_eq!(r.take(), vec![((redis(), Lane::Revert), Job::Close)]);
        r.offer(redis(), None, true, t0);
        assert!(r.take().is_empty());
        // It fails: a pull request; later it is no longer rolled back: closed.
        let mut pr = revert("redis:7.4");
        pr.mode = RevertMode::PullRequest;
        r.offer(redis(), Some(pr.clone()), true, t0);
        let (key, job) = r.take().remove(0);
        r.settle(key, job);
        r.offer(redis(), Some(pr), true, t0);
        assert!(r.take().is_empty());
        r.offer(redis(), None, true, t0);
        assert_eq!(r.take(), vec![((redis(), Lane::Revert), Job::Close)]);
        // Commit mode never closes anything.
        r.offer(redis(), None, false, t0);
        assert!(r.take().is_empty());
    }
}
