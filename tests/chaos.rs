//! The chaos soak of `make chaos`, short: 20 kills of the agent at random moments of
//! rollouts of both kinds (seeded, so a failure replays with the same choices), which must
//! all converge within the lease plus 10 s, moving no volume and never running two pods on
//! one ordinal.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

#[path = "../benches/chaos/run.rs"]
mod run;

use std::path::PathBuf;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_random_kills_all_converge_and_lose_nothing() {
    let seed = std::env::var("LINNET_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let cfg = run::Config {
        seed,
        kills: 20,
        apiserver_restarts: 0,
        control_plane_restarts: 0,
        etcd_freezes: 0,
        etcd_freeze: Duration::ZERO,
        git_outage: Duration::ZERO,
        linnet_bin: PathBuf::from(env!("CARGO_BIN_EXE_linnet")),
    };
    let report = run::run(&cfg).await.expect("the soak runs");
    let table = run::table(&report);
    println!("{table}");
    assert_eq!(report.converged, report.runs, "seed {seed}:\n{table}");
    assert_eq!(report.runs, 20, "{table}");
    assert_eq!(report.pvs_moved, 0, "{table}");
    assert_eq!(report.pvs_deleted, 0, "{table}");
    assert!(report.two_pods_on_an_ordinal.is_empty(), "{table}");
    assert!(report.replicas_above_spec.is_empty(), "{table}");
    assert_eq!(report.own_write_lapses, 0, "{table}");
}
