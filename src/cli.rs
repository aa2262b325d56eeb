//! The command line: `linnet agent | diff | validate | status | crds`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

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

/// How specs are read (shared by `validate`, `diff` and `agent`).
#[derive(Debug, Clone, clap::Args)]
pub struct SpecArgs {
    /// Namespace for objects that name none.
    #[arg(long, default_value = "default", env = "LINNET_DEFAULT_NAMESPACE")]
    pub default_namespace: String,
    /// Namespaces specs may use (repeat or comma-separate); any namespace when not set.
    #[arg(
        long = "allow-namespace",
        value_delimiter = ',',
        env = "LINNET_ALLOW_NAMESPACES"
    )]
    pub allowed_namespaces: Vec<String>,
    /// Largest spec file read, in bytes.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub max_file_bytes: usize,
}

impl SpecArgs {
    /// The loader options these flags describe.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            default_namespace: self.default_namespace.clone(),
            allowed_namespaces: self.allowed_namespaces.clone(),
            max_file_bytes: self.max_file_bytes,
        }
    }
}

/// How the cluster is synced (shared by `diff` and `agent`).
#[derive(Debug, Clone, clap::Args)]
pub struct SyncArgs {
    /// Name of this source; linnet labels what it applies with it, and prunes only its own.
    #[arg(long, default_value = "default", env = "LINNET_SOURCE_NAME")]
    pub source_name: String,
    /// Delete objects that linnet applied earlier and that are no longer in Git. Never deletes
    /// PersistentVolumeClaims or PersistentVolumes.
    #[arg(long, env = "LINNET_PRUNE")]
    pub prune: bool,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: follow the repository, keep the cluster in line, drive rollouts.
    Agent,
    /// Show what a sync of DIR would change in the live cluster; exit 1 if anything would.
    ///
    /// Prints each object that would be created, updated or pruned, with a YAML diff of the
    /// fields Git sets. Uses the current kubeconfig context (or `KUBECONFIG`).
    Diff {
        /// The directory of specs (a checkout of the GitOps repository).
        dir: PathBuf,
        #[command(flatten)]
        specs: SpecArgs,
        #[command(flatten)]
        sync: SyncArgs,
    },
    /// Check the specs in DIR offline, for your own pre-merge CI; exit 1 on any error.
    ///
    /// Checks YAML syntax, types and unknown fields of linnet kinds, the CRDs' validation rules
    /// (evaluated locally), duplicate objects and the namespace allow-list. Errors are printed
    /// as `file:line:column: message`.
    Validate {
        /// The directory of specs (a checkout of the GitOps repository).
        dir: PathBuf,
        #[command(flatten)]
        specs: SpecArgs,
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
        Command::Diff { dir, specs, sync } => runtime()?.block_on(diff(&dir, &specs, &sync)),
        Command::Validate { dir, specs } => validate(&dir, &specs),
        Command::Status => Err(Error::NotBuiltYet {
            command: "status",
            planned: "comes with the agent",
        }),
        Command::Crds => {
            let yaml = crate::api::crds_yaml().map_err(|e| Error::Serialize(e.to_string()))?;
            say_raw!("{yaml}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)
}

async fn diff(dir: &Path, args: &SpecArgs, sync: &SyncArgs) -> Result<ExitCode> {
    use crate::sync::{Change, Syncer, diff::render_diff};
    let set = load_dir(dir, &args.load_options())?;
    for e in &set.errors {
        eprintln!("{e}");
    }
    let client = kube::Client::try_default()
        .await
        .map_err(|e| Error::KubeConfig(Box::new(e)))?;
    let syncer = Syncer::new(client, &sync.source_name, args.allowed_namespaces.clone());
    let (plan, read_errors) = syncer.plan(&set, "working-tree", sync.prune).await;
    let mut changed = 0;
    for change in &plan {
        let verb = match change.change {
            Change::Unchanged => continue,
            Change::Create => "create",
            Change::Update => "update",
            Change::Prune => "prune",
            Change::KeepVolume => {
                say!(
                    "= keep {} (no longer in Git, but linnet never deletes volumes)",
                    change.key
                );
                continue;
            }
        };
        changed += 1;
        let from = change
            .desired
            .as_ref()
            .map(|d| format!(" ({})", d.source_path))
            .unwrap_or_default();
        say!("~ {verb} {}{from}", change.key);
        say_raw!("{}", render_diff(change));
    }
    for (key, e) in &read_errors {
        eprintln!("error: {key}: {e}");
    }
    let unchanged = plan
        .iter()
        .filter(|c| c.change == Change::Unchanged)
        .count();
    say!("{changed} to change, {unchanged} unchanged");
    Ok(
        if changed == 0 && set.errors.is_empty() && read_errors.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}

fn validate(dir: &Path, args: &SpecArgs) -> Result<ExitCode> {
    let set = load_dir(dir, &args.load_options())?;
    for e in &set.errors {
        say!("{e}");
    }
    let files = set
        .objects
        .values()
        .map(|o| o.location.file.as_str())
        .collect::<std::collections::BTreeSet<_>>();
    if set.errors.is_empty() {
        say!(
            "{}: {} objects in {} files, no errors",
            dir.display(),
            set.objects.len(),
            files.len()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        say!(
            "{}: {} error(s); {} file(s) blocked: {}",
            dir.display(),
            set.errors.len(),
            set.blocked_files.len(),
            set.blocked_files.join(", ")
        );
        Ok(ExitCode::from(1))
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
