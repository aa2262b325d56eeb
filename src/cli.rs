//! The command line: `linnet agent | diff | validate | status | crds`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::specs::{LoadOptions, load_dir};
use crate::telemetry::{self, LogFormat};
use crate::{Error, Result};

/// Writes a line to stdout; a closed pipe (`linnet diff | head`) is not an error.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Like [`say!`] without the newline.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// Runs a parsed command line and maps the outcome to an exit code.
pub fn run(cli: Cli) -> ExitCode {
    telemetry::init(cli.log_format, "linnet=info,warn");
    crate::net::install_crypto_provider();
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            // A log collector reading JSON gets the reason as JSON too.
            match cli.log_format {
                telemetry::LogFormat::Json => {
                    tracing::error!(error = %e, error_kind = e.metric_label(), "linnet stopped")
                }
                telemetry::LogFormat::Text => eprintln!("linnet: {e}"),
            }
            ExitCode::from(2)
        }
    }
}

fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::Agent(args) => {
            // libgit2's timeouts and CA are process-wide: set before the runtime's threads.
            crate::net::configure_git(args.git_timeout, args.ca_file.as_deref())
                .map_err(|e| Error::Usage(e.to_string()))?;
            runtime()?.block_on(agent(*args))
        }
        Command::Diff {
            dir,
            allow_empty,
            unknown_fields,
            specs,
            sync,
        } => runtime()?.block_on(diff(&dir, allow_empty, unknown_fields, &specs, &sync)),
        Command::Validate {
            dir,
            output,
            allow_empty,
            unknown_fields,
            specs,
        } => validate(&dir, output, allow_empty, unknown_fields, &specs),
        Command::Status { agent_url } => runtime()?.block_on(status(&agent_url)),
        Command::Get {
            name,
            namespace,
            watch,
        } => runtime()?.block_on(get(&name, namespace, watch)),
        Command::Promote { name, namespace } => {
            runtime()?.block_on(pull(&name, namespace, crate::inspect::Lever::Promote))
        }
        Command::Abort { name, namespace } => {
            runtime()?.block_on(pull(&name, namespace, crate::inspect::Lever::Abort))
        }
        Command::Crds => {
            let yaml = crate::api::crds_yaml().map_err(|e| Error::Serialize(e.to_string()))?;
            say_raw!("{yaml}");
            Ok(ExitCode::SUCCESS)
        }
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

    /// The in-cluster Deployment configures the agent by environment, so every flag needs a
    /// variable.
    #[test]
    fn every_agent_flag_has_an_environment_variable() {
        let cli = Cli::command();
        let agent = cli.find_subcommand("agent").expect("agent subcommand");
        let missing: Vec<String> = agent
            .get_arguments()
            .filter(|a| {
                a.get_long().is_some() && !matches!(a.get_id().as_str(), "help" | "version")
            })
            .filter(|a| a.get_env().is_none())
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(missing.is_empty(), "flags without an env var: {missing:?}");
    }

    #[test]
    fn help_lists_every_planned_subcommand() {
        let help = Cli::command().render_long_help().to_string();
        for sub in ["agent", "diff", "validate", "status", "crds"] {
            assert!(help.contains(sub), "--help does not list `{sub}`:\n{help}");
        }
    }
}

mod commands;
use commands::*;

mod agent_command;
use agent_command::*;

mod agent_args;
pub use agent_args::AgentArgs;

mod args;
pub use args::*;
