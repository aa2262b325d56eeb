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
        // kube's own client (used through a proxy) logs a failed request at ERROR before
        // linnet says what failed and where; linnet's line is the one to read.
        "linnet=info,kube_client::client::builder=off,warn",
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
    use crate::inspect::Lever;
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
            cluster,
        } => runtime()?.block_on(diff(
            &dir,
            allow_empty,
            unknown_fields,
            (&specs, &sync),
            &cluster,
        )),
        Command::Validate {
            dir,
            output,
            allow_empty,
            unknown_fields,
            check_namespaces,
            crds,
            cluster,
            specs,
        } => validate(
            &dir,
            (output, allow_empty, unknown_fields),
            (check_namespaces, &cluster, crds.as_deref()),
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
        } => runtime()?.block_on(pull(&name, namespace, &cluster, Lever::Promote)),
        Command::Abort {
            name,
            namespace,
            cluster,
        } => runtime()?.block_on(pull(&name, namespace, &cluster, Lever::Abort)),
        Command::Completion { shell } => Ok(print_completion(shell)),
        Command::Crds => print_crds(),
        Command::Fleet { command } => fleet::run(&command),
        Command::Doctor(args) => {
            crate::net::configure_git(args.timeout, args.ca_file.as_deref())
                .map_err(|e| Error::Usage(e.to_string()))?;
            doctor::doctor(&args)
        }
    }
}

/// `linnet completion SHELL`: the script, written from the same clap definition.
fn print_completion(shell: clap_complete::Shell) -> ExitCode {
    use clap::CommandFactory;
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "linnet", &mut std::io::stdout());
    ExitCode::SUCCESS
}

fn print_crds() -> Result<ExitCode> {
    let yaml = crate::api::crds_yaml()?;
    say_raw!("{yaml}");
    Ok(ExitCode::SUCCESS)
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

mod validate;
use validate::*;

mod agent_command;
use agent_command::*;

mod dashboard_config;

mod agent_args;
pub use agent_args::AgentArgs;

mod args;
pub use args::*;

mod namespaces;

mod git_auth_args;
pub use git_auth_args::GitAuthArgs;

mod doctor;
mod fleet;

mod render_args;
pub use namespaces::NamespaceCheck;
pub use render_args::RenderArgs;

#[cfg(test)]
mod docs_tests {
    use super::*;
    use clap::CommandFactory;
    use std::collections::BTreeSet;

    /// Every long flag of every subcommand.
    fn linnet_flags() -> BTreeSet<String> {
        fn walk(c: &clap::Command, into: &mut BTreeSet<String>) {
            for a in c.get_arguments() {
                into.extend(a.get_long().map(|l| format!("--{l}")));
            }
            for s in c.get_subcommands() {
                walk(s, into);
            }
        }
        let mut flags = BTreeSet::new();
        walk(&Cli::command(), &mut flags);
        flags
    }

    /// The pages a user reads: the README, docs/ and the chart's NOTES.
    fn pages() -> Vec<(String, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut paths = vec![root.join("README.md")];
        if let Ok(dir) = std::fs::read_dir(root.join("docs")) {
            paths.extend(
                dir.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "md")),
            );
        }
        paths.sort();
        paths
            .into_iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                (
                    p.strip_prefix(root).unwrap_or(&p).display().to_string(),
                    text,
                )
            })
            .collect()
    }

    /// Flags of the other tools the pages show commands of.
    const OTHER_TOOLS_FLAGS: &[&str] = &[
        // cargo, rustup and docker
        "--all",
        "--all-targets",
        "--build-arg",
        "--check",
        "--features",
        "--lib",
        "--locked",
        "--release",
        "--target",
        "--test",
        "--help",
        // kubectl
        "--all-namespaces",
        "--as",
        "--certificate-authority",
        "--cluster",
        "--clusterrole",
        "--dry-run",
        "--duration",
        "--embed-certs",
        "--flatten",
        "--for",
        "--force-conflicts",
        "--from-file",
        "--from-literal",
        "--minify",
        "--raw",
        "--replicas",
        "--server",
        "--server-side",
        "--serviceaccount",
        "--token",
        "--user",
        // helm, kustomize, flux, argo cd, traefik, git, gpg and the control plane
        "--create-namespace",
        "--set",
        "--include-crds",
        "--enable-alpha-plugins",
        "--enable-exec",
        "--enable-helm",
        "--load-restrictor",
        "--no-remote-bases",
        "--gpg-mode",
        "--metrics",
        "--name-only",
        "--armor",
        "--export",
        "--authorization-mode",
        // Argo Rollouts' controller
        "--namespaced",
        // cosign (docs/image-automation.md)
        "--key",
        "--new-bundle-format",
        // perf, profiling a bench's agent (docs/development.md)
        "--call-graph",
    ];

    /// Regression (issue 72): docs/promotion.md told users to pass `--git-token-file`, which
    /// no command has.
    #[test]
    fn every_flag_the_docs_name_exists() {
        let flags = linnet_flags();
        let mut unknown = BTreeSet::new();
        for (page, text) in pages() {
            let bytes = text.as_bytes();
            for (i, _) in text.match_indices("--") {
                let word: String = text[i + 2..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                let starts_word = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
                if word.is_empty() || !word.as_bytes()[0].is_ascii_lowercase() || !starts_word {
                    continue;
                }
                // `--commit-status-*` names a family of flags.
                let family = text[i + 2 + word.len()..].starts_with('*');
                let flag = format!("--{}", word.trim_end_matches('-'));
                let known = if family {
                    flags.iter().any(|f| f.starts_with(&format!("{flag}-")))
                } else {
                    flags.contains(&flag)
                };
                if !known && !OTHER_TOOLS_FLAGS.contains(&flag.as_str()) {
                    unknown.insert(format!("{flag} ({page})"));
                }
            }
        }
        assert!(unknown.is_empty(), "flags no command has: {unknown:#?}");
    }

    /// Regression (issue 72): the README's package list missed gnupg and iproute2, which
    /// tests/deps.sh installs.
    #[test]
    fn the_readme_names_every_package_tests_deps_installs() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let deps = std::fs::read_to_string(root.join("tests/deps.sh")).unwrap_or_default();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap_or_default();
        let mut packages = BTreeSet::new();
        let is_name = |p: &&str| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || "-0123456789".contains(c))
        };
        for line in deps.lines() {
            // `need+=(containerd)`, and the `package:command` pairs of the first loop.
            for (i, _) in line.match_indices("need+=(") {
                packages.extend(line[i + 7..].split(')').next().filter(is_name));
            }
            for word in line.split_whitespace() {
                let pair = word.split_once(':').filter(|(_, cmd)| is_name(cmd));
                packages.extend(pair.map(|(pkg, _)| pkg).filter(is_name));
            }
        }
        assert!(
            packages.len() > 10,
            "read no packages from tests/deps.sh: {packages:?}"
        );
        let missing: Vec<&str> = packages
            .iter()
            .copied()
            .filter(|p| !readme.contains(&format!("`{p}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "the README's quick start does not name {missing:?}"
        );
    }

    /// `agent --help` ends with examples (issue 72: 500 lines with no headings or
    /// examples); each parses as the command line it shows.
    #[test]
    fn the_agents_help_has_headings_and_examples_that_parse() {
        let mut cli = Cli::command();
        let agent = cli.find_subcommand_mut("agent").expect("agent subcommand");
        let help = agent.render_long_help().to_string();
        for heading in [
            "Source:",
            "Write-back:",
            "Webhooks:",
            "Cluster:",
            "Examples:",
        ] {
            assert!(help.contains(heading), "no {heading} in:\n{help}");
        }
        let examples = help.split("Examples:").nth(1).unwrap_or_default();
        let commands: Vec<String> = examples
            .replace("\\\n", " ")
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("linnet "))
            .map(str::to_string)
            .collect();
        assert_eq!(commands.len(), 3, "{examples}");
        for command in commands {
            let parsed = Cli::try_parse_from(command.split_whitespace());
            assert!(parsed.is_ok(), "{command}: {:?}", parsed.err());
        }
    }

    /// docs/compatibility.md names the versions the tests are pinned to (issue 72: there was
    /// no page saying which Kubernetes linnet supports).
    #[test]
    fn the_compatibility_page_names_the_pinned_versions() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
        let page = read("docs/compatibility.md");
        let pinned = |file: &str, module: &str| -> String {
            read(file)
                .lines()
                .find_map(|l| {
                    let mut words = l.trim().trim_start_matches("require ").split_whitespace();
                    (words.next() == Some(module)).then(|| words.next().unwrap_or("").to_string())
                })
                .unwrap_or_else(|| panic!("{module} is not in {file}"))
        };
        let kubernetes = pinned("tests/cluster/go.mod", "k8s.io/kubernetes");
        let versions = [
            kubernetes.trim_start_matches('v').to_string(),
            pinned("tests/gateway/go.mod", "github.com/traefik/traefik/v3"),
            pinned("tests/gateway/go.mod", "sigs.k8s.io/gateway-api"),
            pinned("deploy/render-tools/go.mod", "helm.sh/helm/v4"),
            pinned(
                "deploy/render-tools/go.mod",
                "sigs.k8s.io/kustomize/kustomize/v5",
            ),
            pinned(
                "tests/prometheus/go.mod",
                "github.com/prometheus/prometheus",
            ),
        ];
        for v in versions {
            assert!(page.contains(&v), "docs/compatibility.md does not name {v}");
        }
        let feature = kubernetes
            .trim_start_matches('v')
            .rsplit_once('.')
            .map(|(m, _)| m);
        let feature = format!("v{}", feature.unwrap_or("").replace('.', "_"));
        assert!(
            read("Cargo.toml").contains(&format!("\"{feature}\"")),
            "k8s-openapi {feature}"
        );
        assert!(
            page.contains(&format!("`{feature}`")),
            "the page names {feature}"
        );
    }
}
