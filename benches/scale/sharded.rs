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
    let mut agents = Vec::new();
    for k in 0..shards {
        let dir = tmp.path().join(format!("replica-{k}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let extra = if shards > 1 {
            vec![
                format!("--shards={shards}"),
                format!("--shard-index={k}"),
                format!("--lease-identity=bench-{k}"),
            ]
        } else {
            Vec::new()
        };
        // Replica 0 gets the port the repository's webhook names.
        let port = if k == 0 {
            port
        } else {
            support::ports::free_port()
        };
        agents.push(start_agent_with(
            cfg,
            &dir,
            &host.url,
            &ns.name,
            port,
            ("1h", "1h"),
            &extra,
        ));
    }
    let stable = count_seen(rollouts.clone(), n, slow * 3, |o| {
        phase(o) == Some(StatefulSetPhase::Stable)
    })
    .await?;
    let all_stable_s = (stable - started).as_secs_f64();
    for agent in &agents {
        settle(agent, Duration::from_secs(3), slow).await;
    }
    // The replica that syncs Git is the only ready one (it holds the main Lease).
    let mut syncing = None;
    for (k, agent) in agents.iter().enumerate() {
        let ready = reqwest::get(format!("{}/readyz", agent.base)).await;
        if ready.is_ok_and(|r| r.status() == 200) {
            syncing = Some(k);
        }
    }
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
