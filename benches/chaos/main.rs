//! `make chaos`: the chaos soak of `run.rs` on the local control plane, at 200 random kills of
//! the agent plus 20 kube-apiserver restarts, 10 control-plane restarts, 5 etcd freezes and a
//! Git outage. Prints a table and writes it, with
//! the machine, the commit and the seed, into `bench/CHAOS.md`.
//!
//! Settings (environment): `LINNET_CHAOS_SEED` (1), `LINNET_CHAOS_KILLS` (200),
//! `LINNET_CHAOS_APISERVER_RESTARTS` (20), `LINNET_CHAOS_CONTROL_PLANE_RESTARTS` (10),
//! `LINNET_CHAOS_ETCD_FREEZES` (5),
//! `LINNET_CHAOS_ETCD_FREEZE_SECS` (8), `LINNET_CHAOS_GIT_OUTAGE_SECS` (60),
//! `LINNET_CHAOS_RESULTS` (bench/CHAOS.md; `-` for none).
//! The same seed makes the same choices (the moments still depend on the machine's speed).
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../../tests/support/mod.rs"]
mod support;

mod run;

use support::bench::{env_or, sh};

use std::path::PathBuf;
use std::time::Duration;

fn main() {
    // `cargo test --all-targets` runs harness-less benches too; `tests/chaos.rs` runs it short.
    if !std::env::args().any(|a| a == "--bench") {
        println!("chaos: a soak; run it with `make chaos`");
        return;
    }
    let cfg = run::Config {
        seed: env_or("LINNET_CHAOS_SEED", 1),
        kills: env_or("LINNET_CHAOS_KILLS", 200),
        apiserver_restarts: env_or("LINNET_CHAOS_APISERVER_RESTARTS", 20),
        control_plane_restarts: env_or("LINNET_CHAOS_CONTROL_PLANE_RESTARTS", 10),
        etcd_freezes: env_or("LINNET_CHAOS_ETCD_FREEZES", 5),
        etcd_freeze: Duration::from_secs(env_or("LINNET_CHAOS_ETCD_FREEZE_SECS", 8)),
        git_outage: Duration::from_secs(env_or("LINNET_CHAOS_GIT_OUTAGE_SECS", 60)),
        linnet_bin: PathBuf::from(env!("CARGO_BIN_EXE_linnet")),
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let report = match rt.block_on(run::run(&cfg)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("chaos: failed: {e}");
            std::process::exit(1);
        }
    };
    let table = run::table(&report);
    println!("{table}");
    let results = std::env::var("LINNET_CHAOS_RESULTS")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/bench/CHAOS.md").to_string());
    if results != "-" {
        let root = env!("CARGO_MANIFEST_DIR");
        let commit = sh("git", &["-C", root, "rev-parse", "--short", "HEAD"]);
        let text = format!(
            "# Chaos soak\n\nWritten by `make chaos` (`benches/chaos/`): {} random kills of the agent \
             (SIGKILL, at a moment uniform over a rollout's life; half of them hand over to the \
             standby replica), then {} kube-apiserver restarts, {} restarts of the API server, \
             controller-manager and scheduler together, and {} etcd freezes of {} s (each \
             at a random moment of a rollout) and a Git outage of {} s, over a TwoSets and a \
             Partition CanaryStatefulSet (3 replicas, a volume each) and a batched \
             CanaryDeployment. Commit `{commit}`, seed {}, {}, {} cores.\n\n{table}",
            cfg.kills,
            cfg.apiserver_restarts,
            cfg.control_plane_restarts,
            cfg.etcd_freezes,
            cfg.etcd_freeze.as_secs(),
            cfg.git_outage.as_secs(),
            cfg.seed,
            sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        );
        std::fs::write(&results, text).expect("write the results");
        eprintln!("chaos: wrote {results}");
    }
    let ok = report.converged == report.runs
        && report.pvs_moved == 0
        && report.pvs_deleted == 0
        && report.two_pods_on_an_ordinal.is_empty()
        && report.replicas_above_spec.is_empty()
        && report.apiserver_restart_s.len() == cfg.apiserver_restarts
        && report.edit_reverted_s.len() == cfg.apiserver_restarts
        && report.control_plane_restart_s.len() == cfg.control_plane_restarts
        && report.etcd_freeze_s.len() == cfg.etcd_freezes
        && report.fault_stalls.is_empty()
        && report.own_write_lapses == 0
        && (cfg.git_outage.is_zero() || report.git_outage_s.is_some());
    if !ok {
        std::process::exit(1);
    }
}
