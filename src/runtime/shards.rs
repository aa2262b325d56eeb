//! The shard Leases (`--shards`): this replica holds its home shard's Lease from the start,
//! and stands by for the others, taking one only when its holder stops renewing it. What it
//! holds goes to the controllers' [`ShardSet`], which wakes every rollout on a change.
//!
//! A shard goes back home: a replica whose home shard another holds (it took it while this
//! one was away) asks for it on the Lease ([`HOME_WAITING_ANNOTATION`]); the holder gives it
//! up, and no other standby takes it while the request is fresh. Without that, a rolling
//! restart left every shard with whichever replica restarted last.
//!
//! Inputs: the Leases. Outputs: the held shards.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Patch;

use super::config::LeaderConfig;
use crate::controller::shards::ShardSet;

/// On a shard's Lease: `<identity> <RFC 3339 time>`, the home replica asking for it back.
pub const HOME_WAITING_ANNOTATION: &str = "rollouts.linnet.dev/home-waiting";

/// How long a home replica's request stays fresh, in lease durations: it is renewed every
/// half duration while it waits.
const HOME_WAITING_FRESH: u32 = 3;

/// The Lease of shard `k`.
pub fn lease_name(leader: &LeaderConfig, k: u32) -> String {
    format!("{}-shard-{k}", leader.name)
}

/// Holds shard Leases until `release` turns true (the agent stops: every shard held is
/// released, so other replicas take it at once); one task per shard, returned for the
/// supervisor to hold. Each keeps a clone of `alive` until it ends: the agent waits for all
/// to be dropped (the held shards released) before it exits.
pub fn hold_shards(
    client: kube::Client,
    leader: &LeaderConfig,
    shards: Arc<ShardSet>,
    release: tokio::sync::watch::Receiver<bool>,
    alive: tokio::sync::mpsc::Sender<()>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..leader.shards)
        .map(|k| {
            let (client, leader, shards) = (client.clone(), leader.clone(), shards.clone());
            let mut release = release.clone();
            let alive = alive.clone();
            tokio::spawn(async move {
                let _alive = alive;
                // Standing by: the home replica of a shard starting with this one gets its
                // Lease first, so shards spread one per replica instead of going to the quickest.
                if k != leader.home_shard {
                    tokio::select! {
                        _ = tokio::time::sleep(leader.duration) => {}
                        _ = released(&mut release) => return,
                    }
                }
                hold_shard(client, &leader, k, &shards, release).await;
            })
        })
        .collect()
}

async fn hold_shard(
    client: kube::Client,
    leader: &LeaderConfig,
    k: u32,
    shards: &ShardSet,
    release: tokio::sync::watch::Receiver<bool>,
) {
    let name = lease_name(leader, k);
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &leader.namespace);
    let home = k == leader.home_shard;
    let ask_every = (leader.duration / 2).max(Duration::from_secs(1));
    // Another replica's home shard: its Lease, watched to see its home replica ask for it.
    let (lease_seen, mut lease) = tokio::sync::watch::channel(None);
    let _watching = (!home).then(|| {
        AbortOnDrop(tokio::spawn(watch_lease(
            leases.clone(),
            name.clone(),
            lease_seen,
        )))
    });
    if !home {
        let _ = tokio::time::timeout(ask_every, lease.changed()).await;
    }
    // Each wait below comes round at least every idle beat.
    let mut idle_beat = tokio::time::interval(crate::liveness::IDLE_BEAT);
    idle_beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut holder = ShardHolder {
        client,
        leader,
        k,
        shards,
        name,
        leases,
        home,
        ask_every,
        lease,
        release,
        heartbeat: crate::liveness::process().register(format!("shard {k} lease")),
        idle_beat,
    };
    loop {
        holder.heartbeat.beat();
        crate::liveness::hang_if_asked("shard lease").await;
        if !holder.stand_by_while_home_asks().await {
            return;
        }
        let Some(manager) = holder.lease_manager().await else {
            continue;
        };
        let (holding, task) = manager.watch().await;
        if !holder.hold(holding, task).await {
            return;
        }
    }
}

/// One shard's holder: its Lease and the home replica's requests on it, the agent's release,
/// and its heartbeat.
struct ShardHolder<'a> {
    client: kube::Client,
    leader: &'a LeaderConfig,
    k: u32,
    shards: &'a ShardSet,
    name: String,
    leases: kube::Api<Lease>,
    /// Whether this is this replica's home shard.
    home: bool,
    ask_every: Duration,
    /// Another replica's home shard: its Lease as last seen.
    lease: tokio::sync::watch::Receiver<Option<Lease>>,
    release: tokio::sync::watch::Receiver<bool>,
    heartbeat: Arc<crate::liveness::Beat>,
    idle_beat: tokio::time::Interval,
}

/// How holding the shard through one lease manager ended.
enum HoldEnded {
    /// The agent stops: the Lease was released.
    Released,
    /// Stood back for the shard's home replica; `held` if this replica held it.
    StoodBack { held: bool },
    /// The lease manager stopped on its own.
    ManagerStopped,
}

impl ShardHolder<'_> {
    /// Waits while the shard's home replica asks for it (not taken meanwhile); `false` when
    /// the agent stops.
    async fn stand_by_while_home_asks(&mut self) -> bool {
        loop {
            self.heartbeat.beat();
            let Some(fresh_for) = home_request(&self.lease.borrow_and_update(), self.leader) else {
                return true;
            };
            tokio::select! {
                // A closed channel (the watch ended) disables this branch: no busy loop.
                Ok(()) = self.lease.changed() => {}
                _ = tokio::time::sleep(fresh_for) => {}
                _ = self.idle_beat.tick() => {}
                _ = released(&mut self.release) => return false,
            }
        }
    }

    /// A lease manager for the shard's Lease, or `None` after a pause if it cannot be made.
    async fn lease_manager(&self) -> Option<kube_lease_manager::LeaseManager> {
        let duration = self.leader.duration.as_secs().max(2);
        let built = kube_lease_manager::LeaseManagerBuilder::new(self.client.clone(), &self.name)
            .with_namespace(&self.leader.namespace)
            .with_identity(&self.leader.identity)
            .with_duration(duration)
            .with_grace((duration / 3).clamp(1, 5))
            .build()
            .await;
        match built {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "cannot use the shard's Lease; trying again in 5 s");
                tokio::time::sleep(Duration::from_secs(5)).await;
                None
            }
        }
    }

    /// Holds the shard while the lease manager does, then gives it back or starts again;
    /// `false` when the agent stops.
    async fn hold(
        &mut self,
        mut holding: tokio::sync::watch::Receiver<bool>,
        task: tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    ) -> bool {
        let (name, k) = (self.name.clone(), self.k);
        let stood_back = match self.follow(&mut holding).await {
            HoldEnded::Released => {
                // Closing the channel makes the lease manager release the Lease and end.
                self.shards.set_held(k, false);
                drop(holding);
                if let Ok(Ok(_)) = task.await {
                    tracing::info!(lease = %name, shard = k, "released the shard");
                }
                return false;
            }
            HoldEnded::StoodBack { held } => Some(held),
            HoldEnded::ManagerStopped => None,
        };
        self.shards.set_held(k, false);
        if stood_back == Some(true) {
            // The reconciles under way end before the home replica may start its own; the
            // Lease is renewed meanwhile. Each has a bound on its every call.
            let drained = tokio::time::timeout(DRAIN_AT_MOST, self.shards.drained(k));
            if beating(&self.heartbeat, drained).await.is_err() {
                tracing::warn!(lease = %name, shard = k, "reconciles of the shard still under way after {DRAIN_AT_MOST:?}; giving it back anyway");
            }
        }
        // Closing the channel makes the lease manager release the Lease and end.
        drop(holding);
        if let Some(held) = stood_back {
            let _ = beating(&self.heartbeat, task).await;
            if held {
                tracing::info!(lease = %name, shard = k, "gave the shard back to its home replica");
            }
            return true;
        }
        let stopped = match beating(&self.heartbeat, task).await {
            Ok(Ok(_)) => "stopped".to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(lease = %name, why = %stopped, "the shard's lease manager stopped; starting it again");
        tokio::time::sleep(Duration::from_secs(1)).await;
        true
    }

    /// Follows what the lease manager says into the shard set, and a home replica's asking,
    /// until the hold ends.
    async fn follow(&mut self, holding: &mut tokio::sync::watch::Receiver<bool>) -> HoldEnded {
        let (name, k, leader) = (self.name.clone(), self.k, self.leader);
        // Whether this (home) replica asked for the shard back, and when it asks next (a
        // deadline, not a sleep made again on each turn: the idle beat turns every second).
        let mut asked = false;
        let mut ask_at = tokio::time::Instant::now() + self.ask_every;
        loop {
            self.heartbeat.beat();
            let held = *holding.borrow_and_update();
            let was = self.shards.held().contains(&k);
            if held && !was {
                tracing::info!(lease = %name, shard = k, "holding the shard; running its rollouts");
            }
            if held && asked {
                // Back home: standbys need not wait for the request to go stale.
                ask_for_home_shard(&self.leases, &name, leader, false).await;
                asked = false;
            }
            if was && !held {
                tracing::warn!(lease = %name, shard = k, "lost the shard; its rollouts are another replica's now");
            }
            self.shards.set_held(k, held);
            let home = self.home;
            tokio::select! {
                changed = holding.changed() => if changed.is_err() {
                    return HoldEnded::ManagerStopped;
                },
                // Another's home shard, held or stood by for: given back, or no longer
                // contended for, once its home replica asks.
                Ok(()) = self.lease.changed(), if !home => {
                    if home_request(&self.lease.borrow_and_update(), leader).is_some() {
                        return HoldEnded::StoodBack { held };
                    }
                }
                // Home but not held: asking for it, the request renewed while it waits.
                _ = tokio::time::sleep_until(ask_at), if home && !held => {
                    ask_at = tokio::time::Instant::now() + self.ask_every;
                    if !asked {
                        tracing::info!(lease = %name, shard = k, "another replica holds this replica's home shard; asking for it back");
                    }
                    ask_for_home_shard(&self.leases, &name, leader, true).await;
                    asked = true;
                }
                _ = self.idle_beat.tick() => {}
                _ = released(&mut self.release) => return HoldEnded::Released,
            }
        }
    }
}

/// `wait` (bounded: a timeout, or a lease manager's end, whose calls have timeouts) with the
/// heartbeat beating meanwhile.
async fn beating<T>(
    heartbeat: &crate::liveness::Beat,
    wait: impl std::future::Future<Output = T>,
) -> T {
    let mut wait = std::pin::pin!(wait);
    let mut idle_beat = tokio::time::interval(crate::liveness::IDLE_BEAT);
    loop {
        tokio::select! {
            done = &mut wait => return done,
            _ = idle_beat.tick() => heartbeat.beat(),
        }
    }
}

/// The longest a shard given back waits for its reconciles under way.
const DRAIN_AT_MOST: Duration = Duration::from_secs(60);

/// Aborts a task when dropped: a shard's Lease watch ends with its holder.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends shard Lease `name` as its watch shows it (one object, by field selector).
async fn watch_lease(
    leases: kube::Api<Lease>,
    name: String,
    seen: tokio::sync::watch::Sender<Option<Lease>>,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(leases, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => {
                seen.send_replace(Some(l));
            }
            Ok(watcher::Event::Delete(_)) => {
                seen.send_replace(None);
            }
            // Listed: a standby waiting for this knows there is no request to respect.
            Ok(watcher::Event::InitDone) => seen.send_modify(|_| {}),
            Ok(watcher::Event::Init) => {}
            Err(e) => {
                tracing::debug!(lease = %name, error = %e, "watching the shard's Lease failed; watching again");
            }
        }
    }
}

/// How much longer the request on `lease` from its home replica (another) stays fresh;
/// `None` without one.
fn home_request(lease: &Option<Lease>, leader: &LeaderConfig) -> Option<Duration> {
    let request = lease
        .as_ref()?
        .metadata
        .annotations
        .as_ref()?
        .get(HOME_WAITING_ANNOTATION)?;
    fresh_request(
        request,
        &leader.identity,
        leader.duration * HOME_WAITING_FRESH,
        jiff::Timestamp::now(),
    )
}

/// How much longer `request` ([`HOME_WAITING_ANNOTATION`]) stays fresh if it is another
/// replica's, made within `fresh_for` of `now` (either way: clocks differ).
fn fresh_request(
    request: &str,
    own: &str,
    fresh_for: Duration,
    now: jiff::Timestamp,
) -> Option<Duration> {
    let (who, at) = request.rsplit_once(' ')?;
    let at = at.parse::<jiff::Timestamp>().ok()?;
    let apart = now.duration_since(at).unsigned_abs();
    (who != own && apart < fresh_for).then(|| (fresh_for - apart).max(Duration::from_millis(500)))
}

/// Asks for this replica's home shard back on its Lease (`asking`), or withdraws the request.
async fn ask_for_home_shard(
    leases: &kube::Api<Lease>,
    name: &str,
    leader: &LeaderConfig,
    asking: bool,
) {
    let request = asking.then(|| format!("{} {}", leader.identity, jiff::Timestamp::now()));
    let patch = serde_json::json!({
        "metadata": {"annotations": {HOME_WAITING_ANNOTATION: request}}
    });
    if let Err(e) = leases
        .patch(
            name,
            &crate::kube_client::patch_as(crate::api::field_managers::SHARDS),
            &Patch::Merge(&patch),
        )
        .await
    {
        tracing::debug!(lease = %name, error = %e, "could not ask for the home shard back");
    }
}

/// Resolves once the agent asks for the shards back (or the sender is gone).
async fn released(release: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = release.wait_for(|r| *r).await.map(|_| ());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_request_is_fresh_only_from_another_replica_and_for_a_while() {
        let now: jiff::Timestamp = "2026-11-27T12:00:00Z".parse().unwrap_or_default();
        let fresh = Duration::from_secs(45);
        let asked =
            |who: &str, at: &str| fresh_request(&format!("{who} {at}"), "linnet-0", fresh, now);
        assert_eq!(
            asked("linnet-1", "2026-11-27T11:59:30Z"),
            Some(Duration::from_secs(15))
        );
        // Its own request never makes a replica stand back.
        assert_eq!(asked("linnet-0", "2026-11-27T11:59:30Z"), None);
        // Stale: the home replica stopped asking (it died again).
        assert_eq!(asked("linnet-1", "2026-11-27T11:58:00Z"), None);
        // A clock ahead by less than the window still counts.
        assert_eq!(
            asked("linnet-1", "2026-11-27T12:00:20Z"),
            Some(Duration::from_secs(25))
        );
        // Nearly stale: looked at again in a moment, not in a busy loop.
        assert_eq!(
            asked("linnet-1", "2026-11-27T11:59:15.1Z"),
            Some(Duration::from_millis(500))
        );
        for junk in ["", "linnet-1", "linnet-1 yesterday"] {
            assert_eq!(fresh_request(junk, "linnet-0", fresh, now), None, "{junk}");
        }
    }

    #[test]
    fn a_lease_without_a_request_from_its_home_replica_is_taken() {
        let leader = LeaderConfig {
            name: "linnet".into(),
            namespace: "linnet-system".into(),
            identity: "linnet-0".into(),
            duration: Duration::from_secs(15),
            shards: 3,
            home_shard: 0,
        };
        assert_eq!(home_request(&None, &leader), None);
        assert_eq!(home_request(&Some(Lease::default()), &leader), None);
    }
}
