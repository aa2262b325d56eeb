//! The `linnet` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

// mimalloc returns freed memory to the system; with glibc's malloc the agent kept the peak of
// its start-up (the first list of every rollout and child) as resident memory for good.
// The `system-allocator` feature leaves malloc in place for heaptrack.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    linnet::telemetry::memory::tune_allocator();
    let cli = linnet::cli::Cli::parse_as_invoked();
    linnet::cli::run(cli)
}
