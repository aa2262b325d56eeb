//! The command line: `linnet agent | diff | validate | status | crds`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::specs::LoadOptions;
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

impl Cli {
    /// Parses the command line; run as `kubectl-linnet` (`kubectl linnet ...`), usage and
    /// errors name the command as the user typed it.
    pub fn parse_as_invoked() -> Cli {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let invoked = std::env::args_os().next().unwrap_or_default();
        let mut command = Cli::command();
        if is_kubectl_plugin(Path::new(&invoked)) {
            command = command.bin_name("kubectl linnet");
        }
        let matches = command.get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// Whether the binary was run as kubectl runs a plugin: a file named `kubectl-linnet`.
fn is_kubectl_plugin(invoked: &Path) -> bool {
    invoked
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("kubectl-linnet"))
}

/// Runs a parsed command line and maps the outcome to an exit code.
pub fn run(cli: Cli) -> ExitCode {
    crate::net::install_crypto_provider();
    // Dropped after the command: the last spans are flushed to the collector.
    let _exporter = match telemetry::init(
        cli.log_format,
        "linnet=info,warn",
        cli.otlp_endpoint.as_deref(),
    ) {
        Ok(exporter) => exporter,
        Err(e) => {
            eprintln!("linnet: {e}");
            return ExitCode::from(2);
        }
    };
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
            check_namespaces,
            cluster,
            specs,
        } => validate(
            &dir,
            output,
            allow_empty,
            unknown_fields,
            (check_namespaces, &cluster),
            &specs,
        ),
        Command::Status { agent_url } => runtime()?.block_on(status(&agent_url)),
        Command::Get {
            name,
            namespace,
            all_namespaces,
            output,
            watch,
            cluster,
        } => runtime()?.block_on(get(
            name.as_deref(),
            GetScope {
                namespace,
                all_namespaces,
                output,
                watch,
            },
            &cluster,
        )),
        Command::Promote {
            name,
            namespace,
            cluster,
        } => runtime()?.block_on(pull(
            &name,
            namespace,
            &cluster,
            crate::inspect::Lever::Promote,
        )),
        Command::Abort {
            name,
            namespace,
            cluster,
        } => runtime()?.block_on(pull(
            &name,
            namespace,
            &cluster,
            crate::inspect::Lever::Abort,
        )),
        Command::Crds => {
            let yaml = crate::api::crds_yaml()?;
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
    fn run_as_kubectl_linnet_it_is_a_kubectl_plugin() {
        assert!(is_kubectl_plugin(Path::new(
            "/usr/local/bin/kubectl-linnet"
        )));
        assert!(is_kubectl_plugin(Path::new("kubectl-linnet.exe")));
        assert!(!is_kubectl_plugin(Path::new("/usr/bin/linnet")));
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

mod namespaces;

mod render_args;
pub use namespaces::NamespaceCheck;
pub use render_args::RenderArgs;
