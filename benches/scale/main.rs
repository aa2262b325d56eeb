//! `make bench`: linnet at 10, 100 and 1,000 CanaryStatefulSets on the local control plane
//! (see `run.rs` for what is measured and how). Prints a table and writes it, with the
//! machine and the commit, into `bench/RESULTS.md` between its markers, keeping the notes
//! around them.
//!
//! Settings (environment): `LINNET_BENCH_SIZES` (10,100,1000), `LINNET_BENCH_PUSHES` (20),
//! `LINNET_BENCH_IDLE_SECS` (300), `LINNET_BENCH_CHURN_SECS` (60), `LINNET_BENCH_REPEATS` (1),
//! `LINNET_BENCH_RESULTS` (bench/RESULTS.md; `-` for none), `LINNET_BENCH_ANALYSIS` (`0`: no
//! analysis load, figures 9 and 10). To compare settings or profile:
//! `LINNET_BENCH_IDLE_POLL` (1s), `LINNET_BENCH_AGENT_ARGS` (extra agent flags) and
//! `LINNET_BENCH_AGENT_WRAPPER` (see `start_agent`), and `LINNET_BENCH_FILES_PER_DIR` (0:
//! every spec file in `apps/`; `k`: `k` files per directory below it), and
//! `LINNET_BENCH_FLOOR_MAX` (1000: the largest size at which figures 12 and 13 are measured
//! without linnet too, its stable sets created straight through the API), and
//! `LINNET_BENCH_SHARDS` (0; `k` > 1: a first sync by `k` replicas with `--shards k` too),
//! and `LINNET_BENCH_ONLY` (`analysis`: figures 9 and 10 alone; `sharded`: the sharded first
//! sync alone; `sittings`: the alternating first-sync sittings alone; `shards`: the sharded
//! first sync alone, per shard, with `LINNET_BENCH_POD_SAMPLE` (1: every rollout's pod runs;
//! `k`: one in `k`, the others' pods created but never scheduled)), and
//! `LINNET_BENCH_SITTINGS` (3: linnet, floor, linnet, floor, ... pairs at the largest size up
//! to the floor's, 0 for none) with `LINNET_BENCH_SITTING_PUSHES` (10 per linnet sitting).
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../../tests/support/mod.rs"]
mod support;

mod run;

use support::bench::{env_or, sh};

use std::path::PathBuf;
use std::time::Duration;

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kib: f64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_string();
    format!(
        "{cores} cores ({cpu}), {:.1} GiB memory",
        mem_kib / 1024.0 / 1024.0
    )
}

fn main() {
    // `cargo test --all-targets` runs harness-less benches too, without `--bench`; the
    // scenario takes half an hour, and `tests/bench.rs` already runs it small.
    if !std::env::args().any(|a| a == "--bench") {
        println!("scale: a benchmark; run it with `make bench`");
        return;
    }
    let sizes: Vec<usize> = std::env::var("LINNET_BENCH_SIZES")
        .unwrap_or_else(|_| "10,100,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let cfg = run::Config {
        sizes,
        pushes: env_or("LINNET_BENCH_PUSHES", 20),
        idle: Duration::from_secs(env_or("LINNET_BENCH_IDLE_SECS", 300)),
        churn: Duration::from_secs(env_or("LINNET_BENCH_CHURN_SECS", 60)),
        repeats: env_or("LINNET_BENCH_REPEATS", 1),
        analysis_window: Duration::from_secs(env_or("LINNET_BENCH_ANALYSIS_SECS", 60)),
        // LINNET_BENCH_LINNET_BIN runs another build of the agent (e.g. an earlier commit's)
        // under the same bench, to compare the two.
        linnet_bin: std::env::var("LINNET_BENCH_LINNET_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_linnet"))),
        files_per_dir: env_or("LINNET_BENCH_FILES_PER_DIR", 0),
        floor_max: env_or("LINNET_BENCH_FLOOR_MAX", 1000),
        shards: env_or("LINNET_BENCH_SHARDS", 0),
        sittings: env_or("LINNET_BENCH_SITTINGS", 3),
        sitting_pushes: env_or("LINNET_BENCH_SITTING_PUSHES", 10),
        pod_sample: env_or("LINNET_BENCH_POD_SAMPLE", 1),
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let rows = match rt.block_on(run::run(&cfg)) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("bench: failed: {e}");
            std::process::exit(1);
        }
    };
    let table = run::table(&rows);
    println!("{table}");

    let results = std::env::var("LINNET_BENCH_RESULTS")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/bench/RESULTS.md").to_string());
    if results == "-" {
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let commit = sh("git", &["-C", root, "rev-parse", "--short", "HEAD"]);
    let dirty = if sh(
        "git",
        &["-C", root, "status", "--porcelain", "--untracked-files=no"],
    )
    .is_empty()
    {
        ""
    } else {
        " (with local changes)"
    };
    if std::env::var("LINNET_BENCH_ONLY").as_deref() == Ok("sittings") {
        let section = format!(
            "<!-- bench:sittings:begin (written by `make bench-sittings`; edit outside the markers) -->\n\
             Machine: {}. Commit `{commit}`{dirty}. Run {}. Size {}, {} sittings (linnet, then the floor), {} pushes per linnet sitting.\n\n{table}<!-- bench:sittings:end -->",
            machine(),
            sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            cfg.sizes
                .iter()
                .filter(|n| **n <= cfg.floor_max)
                .max()
                .unwrap_or(&0),
            cfg.sittings,
            cfg.sitting_pushes,
        );
        support::bench::write_marked(&results, "Benchmark results", "bench:sittings", &section);
        return;
    }
    if std::env::var("LINNET_BENCH_ONLY").as_deref() == Ok("shards") {
        let section = format!(
            "<!-- bench:shards:begin (written by `make bench-shards`; edit outside the markers) -->\n\
             Machine: {}. Commit `{commit}`{dirty}. Run {}. Sizes {:?} over {} shards (one replica each, started together); one rollout in {} runs its pod, the others' pods are created but never scheduled.\n\n{table}<!-- bench:shards:end -->",
            machine(),
            sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            cfg.sizes,
            cfg.shards.max(2),
            cfg.pod_sample.max(1),
        );
        support::bench::write_marked(&results, "Benchmark results", "bench:shards", &section);
        return;
    }
    let section = format!(
        "<!-- bench:begin (written by `make bench`; edit outside the markers) -->\n\
         Machine: {}. Commit `{commit}`{dirty}. Run {}. Sizes {:?}, {}, {} pushes per size, idle window {} s, churn {} s, {} repeat(s).\n\n{table}<!-- bench:end -->",
        machine(),
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        cfg.sizes,
        match cfg.files_per_dir {
            0 => "spec files all in `apps/`".to_string(),
            k => format!("{k} spec files per directory below `apps/`"),
        },
        cfg.pushes,
        cfg.idle.as_secs(),
        cfg.churn.as_secs(),
        cfg.repeats,
    );
    support::bench::write_section(&results, "Benchmark results", &section);
}
