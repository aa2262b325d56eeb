//! `make bench` must stay runnable: this runs its scenario once, at 10 rollouts, with short
//! windows, and checks only that it completes and reports every figure. The figures
//! themselves are measured by `make bench`, not asserted here (timings in tests are flaky).
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

#[path = "../benches/scale/run.rs"]
mod run;

use std::path::PathBuf;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scale_benchmark_runs_at_ten_rollouts_and_reports_every_figure() {
    let cfg = run::Config {
        sizes: vec![10],
        pushes: 3,
        idle: Duration::from_secs(10),
        churn: Duration::from_secs(3),
        repeats: 1,
        analysis_window: Duration::from_secs(12),
        linnet_bin: PathBuf::from(env!("CARGO_BIN_EXE_linnet")),
        // Spread over directories, so that this layout keeps working too.
        files_per_dir: 4,
        floor_max: 10,
        // Issue 51: three replicas splitting the rollouts, beside the one agent.
        shards: 3,
        // Issue 77: two (linnet, floor) sittings, with two pushes each.
        sittings: 2,
        sitting_pushes: 2,
        pod_sample: 1,
    };
    let rows = run::run(&cfg).await.expect("the benchmark completes");
    let table = run::table(&rows);
    println!("{table}");
    for figure in run::FIGURES {
        let row = rows
            .iter()
            .find(|r| r.figure == figure)
            .unwrap_or_else(|| panic!("no row for {figure}:\n{table}"));
        // Figure 8 runs one rollout with volumes, beside the sizes.
        if !figure.starts_with('8') {
            assert_eq!(row.size, 10);
        }
        assert!(row.samples > 0, "{figure} has no samples:\n{table}");
        assert!(!row.median.is_nan(), "{figure} was not measured:\n{table}");
        assert!(table.contains(figure), "{table}");
    }
    for floor in run::FLOOR {
        assert!(
            rows.iter()
                .any(|r| r.figure == floor && r.samples == 1 && !r.median.is_nan()),
            "{floor} was not measured:\n{table}"
        );
    }
    // kube-apiserver's CPU, the agent's peaks and a drift check (issue 51).
    for context in &run::CONTEXT[9..] {
        assert!(
            rows.iter()
                .any(|r| r.figure == *context && r.samples == 1 && r.median > 0.0),
            "{context} was not measured:\n{table}"
        );
    }
    for sharded in run::sharded::SHARDED {
        assert!(
            rows.iter()
                .any(|r| r.figure == sharded && r.samples == 1 && r.median > 0.0),
            "{sharded} was not measured:\n{table}"
        );
    }
    // Issue 77: webhook -> revision read beside git fetch, in the pushes of figure 1 and of
    // the sittings; the sittings' first sync over the floor.
    for figure in run::fetch::FETCH
        .iter()
        .chain(&run::sittings::SITTINGS)
        .chain(&run::sittings::MILESTONES)
    {
        let measured = rows
            .iter()
            .filter(|r| r.figure == *figure && r.samples > 0 && !r.median.is_nan())
            .count();
        assert!(measured >= 1, "{figure} was not measured:\n{table}");
    }
    assert!(
        rows.iter()
            .any(|r| r.figure == run::fetch::FETCH[0] && r.samples == 3),
        "every push of figure 1 has its webhook -> revision read:\n{table}"
    );
    // A new set's status is written at least once by the StatefulSet controller: a count of 0
    // means the API server's request counts were not matched.
    let status_writes = rows.iter().find(|r| r.figure == run::FLOOR[1]);
    assert!(
        status_writes.is_some_and(|r| r.median >= 1.0),
        "the StatefulSet controller's status writes were not counted:\n{table}"
    );
}

/// `make bench-shards` at 24 rollouts over 3 shards, one pod in 4 run: every shard's rows
/// are measured, and the rollouts whose pods never run do not hold it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_shard_first_sync_runs_with_sampled_pods() {
    let cfg = run::Config {
        sizes: vec![24],
        pushes: 0,
        idle: Duration::ZERO,
        churn: Duration::ZERO,
        repeats: 1,
        analysis_window: Duration::ZERO,
        linnet_bin: PathBuf::from(env!("CARGO_BIN_EXE_linnet")),
        files_per_dir: 8,
        floor_max: 0,
        shards: 3,
        sittings: 0,
        sitting_pushes: 0,
        pod_sample: 4,
    };
    let admin = support::admin_client().await;
    support::install_linnet(&admin).await;
    let rows = run::sharded::per_shard(&cfg, &admin, 24, 3)
        .await
        .expect("the per-shard first sync completes");
    let table = run::table(&rows);
    println!("{table}");
    for figure in run::sharded::SHARDS {
        assert!(
            rows.iter().any(|r| r.figure == figure && r.median > 0.0),
            "{figure} was not measured:\n{table}"
        );
    }
    for k in 0..3 {
        let shard = format!("shard {k}");
        let measured = rows
            .iter()
            .filter(|r| r.figure.contains(&shard) && !r.median.is_nan())
            .count();
        assert_eq!(measured, 3, "shard {k}'s rows:\n{table}");
    }
}

#[path = "../benches/traffic/run.rs"]
mod traffic_run;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_traffic_benchmark_runs_at_three_rollouts_and_reports_every_figure() {
    let cfg = traffic_run::Config {
        rollouts: 3,
        requests_per_route: 40,
    };
    let (rows, touches) = traffic_run::run(&cfg)
        .await
        .expect("the benchmark completes");
    let table = traffic_run::table(&rows, touches);
    println!("{table}");
    for figure in traffic_run::FIGURES {
        let row = rows
            .iter()
            .find(|r| r.figure == figure)
            .unwrap_or_else(|| panic!("no row for {figure}:\n{table}"));
        assert!(row.samples > 0, "{figure} has no samples:\n{table}");
        assert!(!row.median.is_nan(), "{figure} was not measured:\n{table}");
    }
    // Every request of batch 2 goes to the new version; batch 1's split is the tests' to check.
    let batch2 = rows.iter().find(|r| r.figure == traffic_run::FIGURES[4]);
    assert!(batch2.is_some_and(|r| r.median == 100.0), "{table}");
}
