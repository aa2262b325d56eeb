//! Three agents split one source's rollouts (`--shards 3`): every rollout is run by exactly
//! the replica holding its shard's Lease, when one replica is killed its rollouts, and only
//! those, move to the others within the lease duration, and when it comes back they return.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::Api;
use linnet::api::{CanaryStatefulSet, StatefulSetPhase};
use linnet::controller::shards::shard_of;
use support::agent::{Agent, start_agent_with};

const SHARDS: u32 = 3;
const ROLLOUTS: usize = 12;

fn spec(name: &str, ns: &str, image: &str) -> String {
    format!(
        r#"apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryStatefulSet
metadata:
  name: {name}
  namespace: {ns}
  annotations:
    rollouts.linnet.dev/promote: "{image}"
spec:
  replicas: 2
  canaryReplicas: 1
  image: {image}
  template:
    serviceName: {name}
    selector:
      matchLabels:
        app: {name}
    template:
      metadata:
        labels:
          app: {name}
      spec:
        containers:
        - name: app
          image: {image}
"#
    )
}

fn write_specs(dir: &Path, ns: &str, image_of: impl Fn(usize) -> String) {
    for i in 0..ROLLOUTS {
        let name = format!("app-{i}");
        std::fs::write(
            dir.join(format!("{name}.yaml")),
            spec(&name, ns, &image_of(i)),
        )
        .unwrap();
    }
}

fn replica(dir: &Path, specs: &Path, ns: &str, k: u32) -> Agent {
    let own = dir.join(format!("replica-{k}"));
    std::fs::create_dir_all(&own).unwrap();
    start_agent_with(
        &own,
        &[
            format!("--repo-path={}", specs.display()),
            format!("--shards={SHARDS}"),
            format!("--shard-index={k}"),
            format!("--lease-identity=replica-{k}"),
        ],
        ns,
        &support::linnet_kubeconfig(),
    )
}

/// The replicas (by index) whose log shows an action taken for `ns/name`.
fn acted_on(replicas: &[Option<Agent>], ns: &str, name: &str, since: &[usize]) -> BTreeSet<usize> {
    let needle = format!("rollout={ns}/{name} ");
    replicas
        .iter()
        .enumerate()
        .filter(|(k, r)| {
            r.as_ref().is_some_and(|r| {
                r.log_text()[since[*k]..]
                    .lines()
                    .any(|l| l.contains(" acting ") && l.contains(&needle))
            })
        })
        .map(|(k, _)| k)
        .collect()
}

/// The replicas (by index) whose log shows them taking shard `k`'s Lease since `since`.
fn holders(replicas: &[Option<Agent>], ns: &str, k: u32, since: &[usize]) -> BTreeSet<usize> {
    let needle = format!("lease=linnet-{ns}-shard-{k} ");
    replicas
        .iter()
        .enumerate()
        .filter(|(i, r)| {
            r.as_ref().is_some_and(|r| {
                r.log_text()[since[*i]..]
                    .lines()
                    .any(|l| l.contains("holding the shard") && l.contains(&needle))
            })
        })
        .map(|(i, _)| i)
        .collect()
}

/// Checks that `name` was acted on by `expected`, or else only by replicas that held its
/// shard: on a loaded machine a 4 s Lease can lapse and move a shard mid-test, which is the
/// design working, not a second replica acting out of turn.
fn assert_run_by_its_shard(
    replicas: &[Option<Agent>],
    ns: &str,
    name: &str,
    expected: usize,
    since: &[usize],
) {
    let shard = shard_of(ns, name, SHARDS);
    let acted = acted_on(replicas, ns, name, since);
    if acted == BTreeSet::from([expected]) {
        return;
    }
    let mut allowed = holders(replicas, ns, shard, since);
    allowed.insert(expected);
    assert!(
        !acted.is_empty() && acted.is_subset(&allowed),
        "{name} (shard {shard}) acted on by {acted:?}; expected {expected}, or the shard's \
         holders {allowed:?}"
    );
    println!("{name}: shard {shard} moved during the test; acted on by {acted:?}, its holders");
}

async fn all_stable_on(api: &Api<CanaryStatefulSet>, image_of: impl Fn(usize) -> String) -> bool {
    let mut n = 0;
    for i in 0..ROLLOUTS {
        let Ok(r) = api.get(&format!("app-{i}")).await else {
            return false;
        };
        let s = r.status.unwrap_or_default();
        if s.phase == Some(StatefulSetPhase::Stable)
            && s.stable_image.as_deref() == Some(&image_of(i))
        {
            n += 1;
        }
    }
    n == ROLLOUTS
}

#[tokio::test]
async fn each_rollout_is_run_by_one_shard_and_a_killed_shards_rollouts_move_to_the_others() {
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let ns = support::TestNamespace::create(&admin, "shards").await;
    let dir = tempfile::tempdir().unwrap();
    let specs = dir.path().join("specs");
    std::fs::create_dir_all(&specs).unwrap();
    write_specs(&specs, &ns.name, |_| "app:1".into());

    let mut replicas: Vec<Option<Agent>> = (0..SHARDS)
        .map(|k| Some(replica(dir.path(), &specs, &ns.name, k)))
        .collect();
    let api: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    support::eventually("every rollout Stable", Duration::from_secs(120), || {
        let api = api.clone();
        async move { all_stable_on(&api, |_| "app:1".into()).await.then_some(()) }
    })
    .await;

    // Each rollout was acted on by the replica whose home shard it hashes to (or, if the shard
    // moved, only by its holders).
    let start = vec![0; SHARDS as usize];
    for i in 0..ROLLOUTS {
        let name = format!("app-{i}");
        let home = shard_of(&ns.name, &name, SHARDS) as usize;
        assert_run_by_its_shard(&replicas, &ns.name, &name, home, &start);
    }

    // Kill a replica that does not sync Git (the main Lease's holder is the ready one), in the
    // middle of nothing: its shard's Lease is left to expire.
    let mut syncing = None;
    for (k, r) in replicas.iter().enumerate() {
        let base = &r.as_ref().unwrap().base;
        if let Ok(resp) = support::http().get(format!("{base}/readyz")).send().await
            && resp.status() == 200
        {
            syncing = Some(k);
        }
    }
    let syncing = syncing.expect("one replica holds the main Lease");
    // Of the others, the one with the most rollouts.
    let victim = (0..SHARDS as usize)
        .filter(|k| *k != syncing)
        .max_by_key(|k| {
            (0..ROLLOUTS)
                .filter(|i| shard_of(&ns.name, &format!("app-{i}"), SHARDS) as usize == *k)
                .count()
        })
        .unwrap();
    let offsets: Vec<usize> = replicas
        .iter()
        .map(|r| r.as_ref().map_or(0, |r| r.log_text().len()))
        .collect();
    replicas[victim].as_mut().unwrap().kill();
    let killed = Instant::now();
    let lease = format!("linnet-{}-shard-{victim}", ns.name);
    let taker = support::eventually(
        "another replica to take the killed replica's shard",
        Duration::from_secs(30),
        || {
            let found = replicas.iter().enumerate().find(|(k, r)| {
                *k != victim
                    && r.as_ref().is_some_and(|r| {
                        r.log_text()[offsets[*k]..].lines().any(|l| {
                            l.contains("holding the shard") && l.contains(&format!("lease={lease}"))
                        })
                    })
            });
            let found = found.map(|(k, _)| k);
            async move { found }
        },
    )
    .await;
    let moved = killed.elapsed();
    println!("shard {victim} moved to replica {taker} in {moved:?}");
    // The Lease lasts 4 s (tests/support/agent.rs); a standby finds it expired at its next
    // look, within the grace period after that.
    assert!(moved < Duration::from_secs(4 + 6), "took {moved:?}");

    // A new image for every rollout: the killed shard's are run by the replica that took it,
    // the others' by their own replicas, none by two.
    write_specs(&specs, &ns.name, |_| "app:2".into());
    support::eventually(
        "every rollout Stable on the new image",
        Duration::from_secs(180),
        || {
            let api = api.clone();
            async move { all_stable_on(&api, |_| "app:2".into()).await.then_some(()) }
        },
    )
    .await;
    replicas[victim] = None;
    for i in 0..ROLLOUTS {
        let name = format!("app-{i}");
        let home = shard_of(&ns.name, &name, SHARDS) as usize;
        let expected = if home == victim { taker } else { home };
        assert_run_by_its_shard(&replicas, &ns.name, &name, expected, &offsets);
    }

    // The killed replica comes back (a rolling restart, a rescheduled pod): its shard goes
    // back to it, instead of staying with the replica that took it.
    let lens: Vec<usize> = replicas
        .iter()
        .map(|r| r.as_ref().map_or(0, |r| r.log_text().len()))
        .collect();
    let own_log = std::fs::read_to_string(dir.path().join(format!("replica-{victim}/agent.log")))
        .map_or(0, |l| l.len());
    replicas[victim] = Some(replica(dir.path(), &specs, &ns.name, victim as u32));
    let mut back = lens.clone();
    back[victim] = own_log;
    support::eventually(
        "the shard back with its home replica",
        Duration::from_secs(30),
        || {
            let home = holders(&replicas, &ns.name, victim as u32, &back).contains(&victim);
            let given = replicas[taker].as_ref().is_some_and(|r| {
                r.log_text()[lens[taker]..].lines().any(|l| {
                    l.contains("gave the shard back") && l.contains(&format!("lease={lease} "))
                })
            });
            async move { (home && given).then_some(()) }
        },
    )
    .await;
    // Every rollout on its home replica again, the returned one's included.
    let offsets: Vec<usize> = replicas
        .iter()
        .map(|r| r.as_ref().map_or(0, |r| r.log_text().len()))
        .collect();
    write_specs(&specs, &ns.name, |_| "app:3".into());
    support::eventually(
        "every rollout Stable on app:3",
        Duration::from_secs(180),
        || {
            let api = api.clone();
            async move { all_stable_on(&api, |_| "app:3".into()).await.then_some(()) }
        },
    )
    .await;
    for i in 0..ROLLOUTS {
        let name = format!("app-{i}");
        let home = shard_of(&ns.name, &name, SHARDS) as usize;
        assert_run_by_its_shard(&replicas, &ns.name, &name, home, &offsets);
    }

    // Issue 47: a replica stopped as Kubernetes stops it (SIGTERM) releases every Lease it
    // holds, shards and the main one alike, instead of leaving them to expire.
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns.name);
    let holder_of = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    let stopping = replicas[syncing].as_mut().unwrap();
    let identity = format!("replica-{syncing}");
    let mut held = Vec::new();
    for lease in leases.list(&Default::default()).await.unwrap().items {
        if holder_of(lease.clone()).as_deref() == Some(identity.as_str()) {
            held.push(lease.metadata.name.clone().unwrap());
        }
    }
    assert!(
        held.len() >= 2,
        "replica-{syncing} holds its shard and the main Lease: {held:?}"
    );
    let status = stopping.terminate();
    assert!(status.success(), "{status:?}");
    for name in &held {
        let lease = leases.get(name).await.unwrap();
        assert_eq!(holder_of(lease), None, "{name} is still held after SIGTERM");
    }
}
