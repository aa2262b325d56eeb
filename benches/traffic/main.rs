//! `make bench`, traffic (issue 49): how long a step takes to reach the route, and the route
//! to reach the gateway, at 100 rollouts with routes through one real Traefik (see `run.rs`).
//! Prints a table and writes it, with the machine and the commit, into `bench/TRAFFIC.md`
//! between its markers, keeping the notes around them.
//!
//! Settings (environment): `LINNET_BENCH_TRAFFIC_ROLLOUTS` (100),
//! `LINNET_BENCH_TRAFFIC_REQUESTS` (100 per route after each step),
//! `LINNET_BENCH_TRAFFIC_RESULTS` (bench/TRAFFIC.md; `-` for none).
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../../tests/support/mod.rs"]
mod support;

mod run;

use support::bench::{env_or, sh};

fn main() {
    // `cargo test --all-targets` runs harness-less benches too, without `--bench`.
    if !std::env::args().any(|a| a == "--bench") {
        println!("traffic: a benchmark; run it with `make bench`");
        return;
    }
    let cfg = run::Config {
        rollouts: env_or("LINNET_BENCH_TRAFFIC_ROLLOUTS", 100),
        requests_per_route: env_or("LINNET_BENCH_TRAFFIC_REQUESTS", 100),
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let (rows, touches) = match rt.block_on(run::run(&cfg)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench: failed: {e}");
            std::process::exit(1);
        }
    };
    let table = run::table(&rows, touches);
    println!("{table}");
    let results = std::env::var("LINNET_BENCH_TRAFFIC_RESULTS")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/bench/TRAFFIC.md").to_string());
    if results == "-" {
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let commit = sh("git", &["-C", root, "rev-parse", "--short", "HEAD"]);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let section = format!(
        "<!-- bench:begin (written by `make bench`; edit outside the markers) -->\n\
         Machine: {cores} cores. Commit `{commit}`. Run {}. {} rollouts with routes, {} requests per route after each step.\n\n{table}<!-- bench:end -->",
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        cfg.rollouts,
        cfg.requests_per_route,
    );
    support::bench::write_section(&results, "Traffic benchmark results", &section);
}
