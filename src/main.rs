//! The `linnet` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = linnet::cli::Cli::parse();
    linnet::cli::run(cli)
}
