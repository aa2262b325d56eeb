//! Which rollouts this replica runs when rollouts are split across replicas (`--shards`):
//! rollout `namespace/name` belongs to shard [`shard_of`]`(namespace, name, count)`, and a
//! replica runs the rollouts of the shards whose Lease it holds ([`crate::runtime::shards`]
//! holds them). Unsharded, it runs them all.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures::Stream;

pub use crate::hash::shard_of;

/// The shards this replica holds, and a signal when that changes.
#[derive(Debug)]
pub struct ShardSet {
    held: Vec<AtomicBool>,
    /// Reconciles under way, by shard: a shard let go is released once they end.
    running: Vec<AtomicUsize>,
    ended: tokio::sync::Notify,
    changed: tokio::sync::watch::Sender<u64>,
}

impl ShardSet {
    /// One shard, always held: the replica runs every rollout.
    pub fn unsharded() -> ShardSet {
        let set = ShardSet::new(1);
        set.held[0].store(true, Ordering::SeqCst);
        set
    }

    /// `count` shards, none held yet.
    pub fn new(count: u32) -> ShardSet {
        ShardSet {
            held: (0..count.max(1)).map(|_| AtomicBool::new(false)).collect(),
            running: (0..count.max(1)).map(|_| AtomicUsize::new(0)).collect(),
            ended: tokio::sync::Notify::new(),
            changed: tokio::sync::watch::channel(0).0,
        }
    }

    pub fn count(&self) -> u32 {
        self.held.len() as u32
    }

    /// Starts running rollout `namespace/name` if this replica runs it now: the shard is not
    /// released until the returned guard is dropped ([`Self::drained`]). `None` if another
    /// replica runs it.
    pub fn run(&self, namespace: &str, name: &str) -> Option<Running<'_>> {
        let shard = shard_of(namespace, name, self.count()) as usize;
        let (held, running) = (self.held.get(shard)?, self.running.get(shard)?);
        // Counted before the check, and `set_held` clears before `drained` counts (both
        // SeqCst): either this sees the shard let go, or the drain sees this reconcile.
        running.fetch_add(1, Ordering::SeqCst);
        let started = Running { set: self, shard };
        held.load(Ordering::SeqCst).then_some(started)
    }

    /// Resolves once no reconcile of `shard` started by [`Self::run`] is under way.
    pub async fn drained(&self, shard: u32) {
        let Some(running) = self.running.get(shard as usize) else {
            return;
        };
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if running.load(Ordering::SeqCst) == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Records whether `shard`'s Lease is held; a change is signalled to [`Self::changes`].
    pub fn set_held(&self, shard: u32, held: bool) {
        let Some(flag) = self.held.get(shard as usize) else {
            return;
        };
        if flag.swap(held, Ordering::SeqCst) != held {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// The shards held now.
    pub fn held(&self) -> Vec<u32> {
        (0..self.count())
            .filter(|k| self.held[*k as usize].load(Ordering::SeqCst))
            .collect()
    }

    /// One item each time the held shards change: every rollout is then looked at again, so
    /// a shard taken over is run at once and one given up stops showing as this replica's.
    pub fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.changed.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

/// A reconcile of a held shard under way (see [`ShardSet::run`]).
#[derive(Debug)]
pub struct Running<'a> {
    set: &'a ShardSet,
    shard: usize,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.set.running[self.shard].fetch_sub(1, Ordering::SeqCst) == 1 {
            self.set.ended.notify_waiters();
        }
    }
}

/// The number ending `identity` (`linnet-2` is 2), as a StatefulSet's pod names end in
/// their ordinal.
pub fn ordinal(identity: &str) -> Option<u32> {
    let digits = identity.len()
        - identity
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .len();
    identity[identity.len() - digits..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statefulset_pods_name_ends_in_its_ordinal() {
        assert_eq!(ordinal("linnet-2"), Some(2));
        assert_eq!(ordinal("linnet-12"), Some(12));
        assert_eq!(ordinal("linnet-abc"), None);
        assert_eq!(ordinal(""), None);
    }

    #[test]
    fn unsharded_owns_every_rollout() {
        let s = ShardSet::unsharded();
        assert!(s.run("a", "b").is_some());
        assert_eq!(s.held(), vec![0]);
    }

    #[test]
    fn a_replica_owns_only_the_rollouts_of_its_held_shards() {
        let s = ShardSet::new(3);
        let names: Vec<String> = (0..30).map(|i| format!("app-{i}")).collect();
        assert!(names.iter().all(|n| s.run("prod", n).is_none()));
        s.set_held(1, true);
        for n in &names {
            let runs = s.run("prod", n).is_some();
            assert_eq!(runs, shard_of("prod", n, 3) == 1, "{n}");
        }
        s.set_held(7, true); // no such shard: ignored
        assert_eq!(s.held(), vec![1]);
    }

    #[tokio::test]
    async fn a_shard_let_go_drains_only_once_its_reconciles_under_way_end() {
        let s = ShardSet::new(1);
        s.set_held(0, true);
        let first = s.run("prod", "a");
        let second = s.run("prod", "b");
        assert!(first.is_some() && second.is_some());
        s.set_held(0, false);
        assert!(
            s.run("prod", "c").is_none(),
            "a shard let go starts nothing"
        );
        let drained = std::time::Duration::from_millis(50);
        assert!(tokio::time::timeout(drained, s.drained(0)).await.is_err());
        drop(first);
        assert!(tokio::time::timeout(drained, s.drained(0)).await.is_err());
        drop(second);
        assert!(tokio::time::timeout(drained, s.drained(0)).await.is_ok());
    }

    #[tokio::test]
    async fn a_change_of_held_shards_is_signalled_once() {
        use futures::StreamExt;
        let s = ShardSet::new(2);
        let mut changes = Box::pin(s.changes());
        s.set_held(0, true);
        s.set_held(0, true);
        assert_eq!(changes.next().await, Some(()));
        let again =
            tokio::time::timeout(std::time::Duration::from_millis(50), changes.next()).await;
        assert!(again.is_err(), "no change, no signal");
    }
}
