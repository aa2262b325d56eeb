//! A receiver's waiting notifications: one lane per rollout, in order within it, each lane
//! backing off on its own, so a notification that keeps failing holds up its own rollout's
//! later ones (order) and nobody else's. Nothing is given up while it may still go through:
//! a failure that may clear is tried again with backoff for as long as the agent runs (and
//! after a restart, [`super::persist`]). Bounded: past `cap` waiting, the oldest of the
//! longest lane is dropped, and counted. Pure: the caller passes `now`.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::events::Notice;

/// A rollout: kind, namespace, name.
pub type Lane = (&'static str, String, String);

/// What became of an offered notification.
#[derive(Debug, PartialEq)]
pub enum Offered {
    Queued,
    /// It said what the rollout's last waiting notification said (same event, same image):
    /// that one now carries the newer message.
    Coalesced,
    /// Queued, and this older one was dropped to make room.
    Dropped(Box<Notice>),
}

/// What became of a failed try of a lane's head.
#[derive(Debug, PartialEq)]
pub enum Failure {
    /// Tried again after `wait`; `tries` failed so far.
    Retry { wait: Duration, tries: u32 },
    /// Given up after `tries`: the receiver took others since it began failing, so it is the
    /// message, not the receiver; the lane goes on.
    GivenUp { tries: u32 },
}

/// Failed tries after which a head the receiver keeps refusing while it takes others is given
/// up.
pub const POISON_TRIES: u32 = 10;

struct Waiting {
    items: VecDeque<Notice>,
    /// When its head may be tried.
    due: Instant,
    backoff: Option<backon::ExponentialBackoff>,
    /// Failed tries of its head, and since when it fails.
    failures: u32,
    failing_since: Option<Instant>,
}

/// A receiver's queue.
pub struct Queue {
    lanes: BTreeMap<Lane, Waiting>,
    len: usize,
    cap: usize,
    /// When the receiver last took a notification.
    last_sent: Option<Instant>,
}

impl Queue {
    pub fn new(cap: usize) -> Queue {
        Queue {
            lanes: BTreeMap::new(),
            len: 0,
            cap: cap.max(1),
            last_sent: None,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `notice` behind its rollout's earlier ones.
    pub fn offer(&mut self, notice: Notice, now: Instant) -> Offered {
        let lane = lane_of(&notice);
        if let Some(last) = self
            .lanes
            .get_mut(&lane)
            .and_then(|w| w.items.back_mut())
            .filter(|last| last.event == notice.event && last.image == notice.image)
        {
            *last = notice;
            return Offered::Coalesced;
        }
        let dropped = (self.len >= self.cap).then(|| self.drop_oldest()).flatten();
        let waiting = self.lanes.entry(lane).or_insert_with(|| Waiting {
            items: VecDeque::new(),
            due: now,
            backoff: None,
            failures: 0,
            failing_since: None,
        });
        waiting.items.push_back(notice);
        self.len += 1;
        match dropped {
            Some(n) => Offered::Dropped(Box::new(n)),
            None => Offered::Queued,
        }
    }

    /// The oldest of the longest lane (the first such lane, by rollout): a rollout that
    /// changes often loses its stale news first. Offers are taken between tries, so no head
    /// is on its way.
    fn drop_oldest(&mut self) -> Option<Notice> {
        let longest = self.lanes.values().map(|w| w.items.len()).max()?;
        let lane = self
            .lanes
            .iter()
            .find(|(_, w)| w.items.len() == longest)
            .map(|(l, _)| l.clone())?;
        let waiting = self.lanes.get_mut(&lane)?;
        let dropped = waiting.items.pop_front();
        if dropped.is_some() {
            self.len -= 1;
        }
        if waiting.items.is_empty() {
            self.lanes.remove(&lane);
        }
        dropped
    }

    /// When the next notification may be tried.
    pub fn next_due(&self) -> Option<Instant> {
        self.lanes.values().map(|w| w.due).min()
    }

    /// The notification to try now, if one is due: the head of the lane due first.
    pub fn due(&self, now: Instant) -> Option<(Lane, Notice)> {
        self.lanes
            .iter()
            .filter(|(_, w)| w.due <= now)
            .min_by_key(|(_, w)| w.due)
            .and_then(|(lane, w)| Some((lane.clone(), w.items.front()?.clone())))
    }

    /// The head of `lane` was refused for good (or given up): the next one may go at once.
    pub fn done(&mut self, lane: &Lane, now: Instant) {
        if let Some(waiting) = self.lanes.get_mut(lane) {
            if waiting.items.pop_front().is_some() {
                self.len -= 1;
            }
            waiting.backoff = None;
            waiting.failures = 0;
            waiting.failing_since = None;
            waiting.due = now;
            if waiting.items.is_empty() {
                self.lanes.remove(lane);
            }
        }
    }

    /// The head of `lane` was sent; the tries that failed before it went.
    pub fn sent(&mut self, lane: &Lane, now: Instant) -> u32 {
        let failed = self.lanes.get(lane).map_or(0, |w| w.failures);
        self.done(lane, now);
        self.last_sent = Some(now);
        failed
    }

    /// The head of `lane` failed in a way that may clear: tried again after the lane's next
    /// backoff, or after `at_least` (a `Retry-After`) if longer; or given up after
    /// [`POISON_TRIES`] if the receiver took others meanwhile.
    pub fn failed(&mut self, lane: &Lane, now: Instant, at_least: Duration) -> Failure {
        let Some(waiting) = self.lanes.get_mut(lane) else {
            return Failure::Retry {
                wait: Duration::ZERO,
                tries: 0,
            };
        };
        waiting.failures += 1;
        let since = *waiting.failing_since.get_or_insert(now);
        let tries = waiting.failures;
        if tries >= POISON_TRIES && self.last_sent.is_some_and(|t| t > since) {
            self.done(lane, now);
            return Failure::GivenUp { tries };
        }
        let wait = waiting
            .backoff
            .get_or_insert_with(|| backon::BackoffBuilder::build(crate::retry::notify_builder()))
            .next()
            .unwrap_or(crate::retry::NOTIFY_BACKOFF_MAX)
            .max(at_least);
        waiting.due = now + wait;
        Failure::Retry { wait, tries }
    }

    /// Every waiting notification, lane by lane in order: what a restart must not lose.
    pub fn waiting(&self) -> impl Iterator<Item = &Notice> {
        self.lanes.values().flat_map(|w| w.items.iter())
    }
}

pub fn lane_of(notice: &Notice) -> Lane {
    (notice.kind, notice.namespace.clone(), notice.name.clone())
}

#[cfg(test)]
mod tests;
