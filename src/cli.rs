//! The command line: `linnet agent | diff | validate | status | crds`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::telemetry::{self, LogFormat};
use crate::{Error, Result};

/// linnet follows a Git repository of canary specs and rolls them out to Kubernetes:
/// canary StatefulSets (with their volumes) and batched Deployments. You roll out with
/// `git push`, and promote by merging a pull request.
#[derive(Debug, Parser)]
#[command(name = "linnet", version, propagate_version = true)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "LINNET_LOG_FORMAT")]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: follow the repository, keep the cluster in line, drive rollouts.
    Agent,
    /// Show what a sync of DIR would change in the live cluster; exit 1 if anything would.
    Diff {
        /// The directory of specs (a checkout of the GitOps repository).
        dir: PathBuf,
    },
    /// Check the specs in DIR offline, for your own pre-merge CI; exit 1 on any error.
    Validate {
        /// The directory of specs (a checkout of the GitOps repository).
        dir: PathBuf,
    },
    /// Show the source's state and every managed rollout's phase.
    Status,
    /// Print the CustomResourceDefinitions for `kubectl apply -f -`.
    Crds,
}

/// Runs a parsed command line and maps the outcome to an exit code.
pub fn run(cli: Cli) -> ExitCode {
    telemetry::init(cli.log_format, "linnet=info,warn");
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("linnet: {e}");
            ExitCode::from(2)
        }
    }
}

fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::Agent => Err(Error::NotBuiltYet {
            command: "agent",
            planned: "following a Git repository and driving rollouts comes with the Git source",
        }),
        Command::Diff { .. } => Err(Error::NotBuiltYet {
            command: "diff",
            planned: "comes with the desired-state engine",
        }),
        Command::Validate { .. } => Err(Error::NotBuiltYet {
            command: "validate",
            planned: "comes with the spec loader",
        }),
        Command::Status => Err(Error::NotBuiltYet {
            command: "status",
            planned: "comes with the agent",
        }),
        Command::Crds => Err(Error::NotBuiltYet {
            command: "crds",
            planned: "comes with the rollout API types",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_lists_every_planned_subcommand() {
        let help = Cli::command().render_long_help().to_string();
        for sub in ["agent", "diff", "validate", "status", "crds"] {
            assert!(help.contains(sub), "--help does not list `{sub}`:\n{help}");
        }
    }
}
