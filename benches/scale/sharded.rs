//! A first sync by `--shards k` replicas (issue 51): `k` agents start together on one
//! repository of `n` rollouts, each running its shards' rollouts, the main Lease's holder
//! syncing Git. Measured: start to every rollout Stable, and each replica's peak resident
//! memory, beside one agent's figures of the same size in the same run.

use super::*;

/// Rows (and `SHARDED` labels) of the sharded first sync.
pub const SHARDED: [&str; 3] = [
    "   13 sharded: start -> every rollout Stable",
    "   6 peak RSS: sharded, the replica that syncs Git",
    "   6 peak RSS: sharded, the largest of the others",
];

/// Rows of the same first sync by one unsharded agent (`LINNET_BENCH_ONLY=sharded`): the
/// baseline in the same harness, the same run.
pub const ONE_AGENT: [&str; 2] = [
    "   13 one agent, as sharded is measured: start -> every rollout Stable",
    "   6 peak RSS: one agent, as sharded is measured",
];

/// The first sync by `shards` replicas (1: one agent without `--shards`).
pub async fn first_sync(
    cfg: &Config,
    admin: &Client,
    n: usize,
    shards: usize,
) -> Result<Vec<Row>, String> {
    let ns = support::TestNamespace::create(admin, &format!("bench-shards-{n}")).await;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = support::ports::free_port();
    let host = git_host(
        cfg,
        tmp.path(),
        &ns.name,
        n,
        &format!("http://127.0.0.1:{port}"),
    );
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let slow = Duration::from_secs(60 + n as u64 / 2);
    let started = Instant::now();
    let agents = start_replicas(cfg, tmp.path(), (&host.url, &ns.name, port), shards, &[])?;
    let stable = count_seen(rollouts.clone(), n, slow * 3, |o| {
        phase(o) == Some(StatefulSetPhase::Stable)
    })
    .await?;
    let all_stable_s = (stable - started).as_secs_f64();
    for agent in &agents {
        settle(agent, Duration::from_secs(3), slow).await;
    }
    let syncing = syncing_replica(&agents).await;
    let peaks: Vec<f64> = agents.iter().map(|a| take_peak(a.pid())).collect();
    let syncer_peak = syncing.map_or(f64::NAN, |k| peaks[k]);
    let others = peaks
        .iter()
        .enumerate()
        .filter(|(k, _)| Some(*k) != syncing)
        .map(|(_, p)| *p)
        .fold(f64::NAN, f64::max);
    log(&format!(
        "size {n}: {shards} shards: every rollout Stable after {all_stable_s:.1} s; peaks {peaks:?} MiB (replica {syncing:?} syncs Git)"
    ));
    for mut agent in agents {
        agent.kill();
    }
    deleted(admin, ns).await;
    if shards == 1 {
        return Ok(vec![
            Row {
                figure: ONE_AGENT[0],
                ..row(n, 13, "s", vec![all_stable_s], "-", None)
            },
            peak_row(n, ONE_AGENT[1], vec![syncer_peak]),
        ]);
    }
    Ok(vec![
        Row {
            figure: SHARDED[0],
            ..row(n, 13, "s", vec![all_stable_s], "-", None)
        },
        peak_row(n, SHARDED[1], vec![syncer_peak]),
        peak_row(n, SHARDED[2], vec![others]),
    ])
}

/// The sharded first sync at scale, per shard (`LINNET_BENCH_ONLY=shards`, issue 77): `shards`
/// replicas start together on `n` rollouts. Measured: the replica that syncs Git, from start
/// to the source read (the clone and the parse of every file, its first `new revision`
/// line) and to every CR applied; then each shard, from start to every one of its rollouts'
/// stable sets created and every one of its sampled rollouts (those whose pod runs,
/// `Config::pod_sample`) Stable, and its replica's peak resident memory.
pub async fn per_shard(
    cfg: &Config,
    admin: &Client,
    n: usize,
    shards: usize,
) -> Result<Vec<Row>, String> {
    let ns = support::TestNamespace::create(admin, &format!("bench-shards-{n}")).await;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = support::ports::free_port();
    log(&format!("size {n}: writing the repository"));
    let host = git_host(
        cfg,
        tmp.path(),
        &ns.name,
        n,
        &format!("http://127.0.0.1:{port}"),
    );
    let sample = cfg.pod_sample.max(1);
    let shard_of = |i: usize| {
        linnet::controller::shards::shard_of(&ns.name, &rollout_name(i), shards as u32) as usize
    };
    let mut rollouts_in = vec![0usize; shards];
    let mut sampled_in = vec![0usize; shards];
    let mut shard_by_name = HashMap::new();
    for i in 0..n {
        let k = shard_of(i);
        rollouts_in[k] += 1;
        if i % sample == 0 {
            sampled_in[k] += 1;
        }
        shard_by_name.insert(rollout_name(i), k);
    }
    let shard_by_name = std::sync::Arc::new(shard_by_name);
    let rollouts: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let timeout = Duration::from_secs(60 + n as u64 / 2) * 3;
    let apiserver_before = apiserver_cpu();
    let started = Instant::now();
    let started_unix = jiff::Timestamp::now().as_millisecond() as f64 / 1000.0;
    // Past the default 10,000 files and 64 MiB a revision may hold.
    let limits = [
        format!("--max-files={}", n.max(10_000)),
        format!("--max-total-bytes={}", (n * 1024).max(64 << 20)),
    ];
    let mut agents = start_replicas(
        cfg,
        tmp.path(),
        (&host.url, &ns.name, port),
        shards,
        &limits,
    )?;
    log(&format!(
        "size {n}: {shards} replicas started; rollouts per shard {rollouts_in:?}, sampled {sampled_in:?}"
    ));
    let (by_set, by_stable) = (shard_by_name.clone(), shard_by_name.clone());
    let (crs, created, stable) = tokio::join!(
        count_seen(rollouts.clone(), n, timeout, |_| true),
        per_shard_seen(sets, &rollouts_in, timeout, move |o: &StatefulSet| {
            let name = o.metadata.name.as_deref()?.strip_suffix("-stable")?;
            by_set.get(name).copied()
        }),
        per_shard_seen(
            rollouts,
            &sampled_in,
            timeout,
            move |o: &CanaryStatefulSet| {
                if phase(o) != Some(StatefulSetPhase::Stable) {
                    return None;
                }
                by_stable.get(o.metadata.name.as_deref()?).copied()
            }
        ),
    );
    let since = |at: Instant| (at - started).as_secs_f64();
    let (crs_s, created, stable) = (since(crs?), created?, stable?);
    let apiserver_s = apiserver_cpu() - apiserver_before;
    let syncing = syncing_replica(&agents).await;
    let peaks: Vec<f64> = agents.iter().map(|a| take_peak(a.pid())).collect();
    let cpu: Vec<f64> = agents.iter().map(|a| usage(a.pid()).1).collect();
    let read_s = syncing
        .and_then(|k| source_read_at(&tmp.path().join(format!("replica-{k}/agent.log"))))
        .map_or(f64::NAN, |at| at - started_unix);
    log(&format!(
        "size {n}: {shards} shards: replica {syncing:?} syncs Git, read the source after {read_s:.1} s, every CR applied after {crs_s:.1} s; kube-apiserver CPU {apiserver_s:.0} s"
    ));
    let mut rows = vec![
        Row {
            figure: SHARDS[0],
            ..row(n, 13, "s", vec![read_s], "-", None)
        },
        Row {
            figure: SHARDS[1],
            ..row(n, 13, "s", vec![crs_s], "-", None)
        },
    ];
    for k in 0..shards {
        let (created_s, stable_s) = (since(created[k]), since(stable[k]));
        let leader = if Some(k) == syncing {
            ", syncs Git"
        } else {
            ""
        };
        log(&format!(
            "size {n}: shard {k}{leader}: {} rollouts, stable sets created after {created_s:.1} s, {} sampled Stable after {stable_s:.1} s; peak RSS {:.1} MiB, CPU {:.1} s",
            rollouts_in[k], sampled_in[k], peaks[k], cpu[k]
        ));
        let label = |what: &str| -> &'static str {
            Box::leak(
                format!(
                    "   13 shard {k} ({} rollouts, {} sampled{leader}): {what}",
                    rollouts_in[k], sampled_in[k]
                )
                .into_boxed_str(),
            )
        };
        rows.push(Row {
            figure: label("start -> every stable set created"),
            ..row(n, 13, "s", vec![created_s], "-", None)
        });
        rows.push(Row {
            figure: label("start -> every sampled rollout Stable"),
            ..row(n, 13, "s", vec![stable_s], "-", None)
        });
        rows.push(Row {
            figure: Box::leak(
                format!(
                    "   6 peak RSS: shard {k}'s replica{leader}, {} rollouts",
                    rollouts_in[k]
                )
                .into_boxed_str(),
            ),
            ..row(n, 6, "MiB", vec![peaks[k]], "-", None)
        });
    }
    for (k, agent) in agents.iter_mut().enumerate() {
        // A replica that stopped is said, with the end of its log: its shard went to another.
        if let Ok(Some(exit)) = agent.child.try_wait() {
            let log_file = tmp.path().join(format!("replica-{k}/agent.log"));
            let text = std::fs::read_to_string(log_file).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            log(&format!("size {n}: replica {k} stopped ({exit}): {tail:?}"));
        }
    }
    // LINNET_BENCH_KEEP_LOGS=<dir> keeps each replica's log there.
    if let Ok(dir) = std::env::var("LINNET_BENCH_KEEP_LOGS") {
        for k in 0..shards {
            let kept = Path::new(&dir).join(format!("shards-{n}-replica-{k}.log"));
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::copy(tmp.path().join(format!("replica-{k}/agent.log")), kept);
        }
    }
    for mut agent in agents {
        agent.kill();
    }
    deleted(admin, ns).await;
    Ok(rows)
}

/// Starts `shards` replicas (1: one agent without `--shards`) in `dir/replica-k`, each with
/// `more` flags; replica 0 listens on `port`, the one the repository's webhook names.
fn start_replicas(
    cfg: &Config,
    dir: &Path,
    (url, ns, port): (&str, &str, u16),
    shards: usize,
    more: &[String],
) -> Result<Vec<Agent>, String> {
    let mut agents = Vec::new();
    for k in 0..shards {
        let own = dir.join(format!("replica-{k}"));
        std::fs::create_dir_all(&own).map_err(|e| e.to_string())?;
        let mut extra = if shards > 1 {
            vec![
                format!("--shards={shards}"),
                format!("--shard-index={k}"),
                format!("--lease-identity=bench-{k}"),
            ]
        } else {
            Vec::new()
        };
        extra.extend_from_slice(more);
        let port = if k == 0 {
            port
        } else {
            support::ports::free_port()
        };
        agents.push(start_agent_with(
            cfg,
            &own,
            url,
            ns,
            port,
            ("1h", "1h"),
            &extra,
        ));
    }
    Ok(agents)
}

/// The replica that syncs Git: the only ready one (it holds the main Lease).
async fn syncing_replica(agents: &[Agent]) -> Option<usize> {
    let mut syncing = None;
    for (k, agent) in agents.iter().enumerate() {
        let ready = reqwest::get(format!("{}/readyz", agent.base)).await;
        if ready.is_ok_and(|r| r.status() == 200) {
            syncing = Some(k);
        }
    }
    syncing
}

/// Rows of [`per_shard`] before its per-shard rows.
pub const SHARDS: [&str; 2] = [
    "   13 shards: the replica that syncs Git, start -> the source read (clone, parse)",
    "   13 shards: the replica that syncs Git, start -> every CR applied",
];

/// Waits until, for each shard `k`, `want[k]` distinct objects `shard_of` places in `k` were
/// seen; returns when each shard's last arrived (`start` for a shard that wants none).
async fn per_shard_seen<K>(
    api: Api<K>,
    want: &[usize],
    timeout: Duration,
    shard_of: impl Fn(&K) -> Option<usize>,
) -> Result<Vec<Instant>, String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let start = Instant::now();
    let mut seen: Vec<HashSet<String>> = want.iter().map(|_| HashSet::new()).collect();
    let mut done: Vec<Option<Instant>> = want.iter().map(|w| (*w == 0).then_some(start)).collect();
    let watch = async {
        let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            let Ok(Event::Apply(o) | Event::InitApply(o)) = event else {
                continue;
            };
            let Some(k) = shard_of(&o).filter(|k| *k < want.len()) else {
                continue;
            };
            seen[k].insert(o.meta().name.clone().unwrap_or_default());
            if done[k].is_none() && seen[k].len() >= want[k] {
                done[k] = Some(Instant::now());
                if done.iter().all(Option::is_some) {
                    break;
                }
            }
        }
    };
    tokio::time::timeout(timeout, watch)
        .await
        .map_err(|_| format!("timed out after {timeout:?}"))?;
    done.into_iter()
        .map(|d| d.ok_or_else(|| "the watch ended".to_string()))
        .collect()
}

/// When the agent whose log this is first read a revision (Unix seconds): its first `new
/// revision` line, once the clone and the parse of every file are done.
fn source_read_at(agent_log: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(agent_log).ok()?;
    let line = text
        .lines()
        .find(|l| l.contains("new revision revision="))?;
    let stamp = line.split_whitespace().next()?;
    let at = stamp.parse::<jiff::Timestamp>().ok()?;
    Some(at.as_millisecond() as f64 / 1000.0)
}
