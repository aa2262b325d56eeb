//! The flags and subcommands, as clap parses them (with `--help` texts and environment
//! variables).

use super::*;

/// linnet follows a Git repository of canary specs and rolls them out to Kubernetes:
/// canary StatefulSets (with their volumes) and batched Deployments. You roll out with
/// `git push`, and promote by merging a pull request.
#[derive(Debug, Parser)]
#[command(name = "linnet", version, propagate_version = true)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "LINNET_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Export traces over OTLP/HTTP to this OpenTelemetry collector (its base URL, e.g.
    /// http://otel-collector.monitoring:4318): a span per webhook, fetch, render, sync,
    /// reconcile, action and write-back, one trace from a push to the pod-level actions it
    /// causes. Off when not set (docs/metrics.md, Traces).
    #[arg(long, global = true, env = "LINNET_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

/// How specs are read (shared by `validate`, `diff` and `agent`).
#[derive(Debug, Clone, clap::Args)]
pub struct SpecArgs {
    /// What of the repository is applied (repeat or comma-separate): the plain files below
    /// each path, and each kustomization or `linnet-helm.yaml` at or below one. The
    /// repository is the boundary, so an overlay may use a base outside the path
    /// (`--path apps/staging` over `apps/base`); a path naming a base renders it on its own.
    #[arg(
        help_heading = "Source",
        long = "path",
        value_delimiter = ',',
        default_value = ".",
        value_parser = parse_repo_path,
        env = "LINNET_PATH"
    )]
    pub paths: Vec<String>,
    /// Namespace for objects that name none.
    #[arg(long, default_value = "default", env = "LINNET_DEFAULT_NAMESPACE")]
    pub default_namespace: String,
    /// Namespaces specs may use (repeat or comma-separate); when not set, any namespace that
    /// --deny-namespace does not close. Naming a closed namespace here opens it.
    #[arg(
        long = "allow-namespace",
        value_delimiter = ',',
        env = "LINNET_ALLOW_NAMESPACES"
    )]
    pub allowed_namespaces: Vec<String>,
    /// Namespaces closed to the source (repeat or comma-separate; `--deny-namespace ''`
    /// closes none). The agent's own namespace (--agent-namespace) is closed too.
    #[arg(
        long = "deny-namespace",
        value_delimiter = ',',
        default_value = "kube-system,kube-public,kube-node-lease",
        env = "LINNET_DENY_NAMESPACES"
    )]
    pub denied_namespaces: Vec<String>,
    /// Cluster-scoped kinds the source may apply, e.g. `Namespace` (repeat or comma-separate);
    /// none when not set. PersistentVolumes are never applied from Git.
    #[arg(
        long = "allow-cluster-kind",
        value_delimiter = ',',
        env = "LINNET_ALLOW_CLUSTER_KINDS"
    )]
    pub cluster_kinds: Vec<String>,
    /// Let claims from Git pick their volume (`spec.volumeName` or a `spec.selector`, also in
    /// claim templates). Off: a repository writer could bind any Available PersistentVolume,
    /// or one labelled for another team, and someone else's data.
    #[arg(long, env = "LINNET_ALLOW_CLAIM_VOLUME_NAME")]
    pub allow_claim_volume_name: bool,
    /// The namespace linnet runs in (in a pod: from the downward API). It is closed to the
    /// source unless --allow-namespace names it, and holds the account that applies
    /// cluster-scoped objects.
    #[arg(long, env = "POD_NAMESPACE")]
    pub agent_namespace: Option<String>,
    /// Largest spec file read, in bytes.
    #[arg(long, default_value_t = 1024 * 1024, env = "LINNET_MAX_FILE_BYTES")]
    pub max_file_bytes: usize,
    /// What all spec files' objects may hold together, as JSON (bounds the agent's memory
    /// whatever the repository holds); past it the largest files are refused first.
    #[arg(long, default_value_t = 64 * 1024 * 1024, env = "LINNET_MAX_TOTAL_BYTES")]
    pub max_total_bytes: usize,
    /// Files one revision of a Git source may list; past it the largest directories are
    /// blocked (each one error, their objects kept), never the rest of the revision.
    #[arg(long, default_value_t = 10_000, env = "LINNET_MAX_FILES")]
    pub max_files: usize,
    /// Entries one directory of a Git source may hold; a larger one is blocked as a whole.
    #[arg(long, default_value_t = 10_000, env = "LINNET_MAX_TREE_ENTRIES")]
    pub max_tree_entries: usize,
    #[command(flatten)]
    pub render: super::RenderArgs,
}

impl SpecArgs {
    /// The loader options these flags describe.
    pub fn load_options(&self) -> LoadOptions {
        let named = |list: &[String]| -> Vec<String> {
            list.iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect()
        };
        let mut denied_namespaces = named(&self.denied_namespaces);
        denied_namespaces.extend(self.agent_namespace.clone());
        LoadOptions {
            default_namespace: self.default_namespace.clone(),
            policy: crate::specs::Policy {
                allowed_namespaces: named(&self.allowed_namespaces),
                denied_namespaces,
                cluster_kinds: named(&self.cluster_kinds),
                claim_volume_names: self.allow_claim_volume_name,
            },
            max_file_bytes: self.max_file_bytes,
            budget: crate::specs::ParseBudget::default(),
            max_total_bytes: self.max_total_bytes,
            shape: crate::specs::RevisionShape {
                max_files: self.max_files,
                max_tree_entries: self.max_tree_entries,
            },
            unknown_fields_are_errors: false,
            // Each path was checked by `parse_repo_path`: none leaves the repository.
            selection: crate::specs::PathSelection::new(&self.paths).unwrap_or_default(),
        }
    }

    /// [`Self::load_options`] for `validate` and `diff`, which also report fields the
    /// Kubernetes types do not have unless told not to (the agent leaves those to the API
    /// server).
    pub fn checking_options(&self, unknown_fields: UnknownFields) -> LoadOptions {
        LoadOptions {
            unknown_fields_are_errors: unknown_fields == UnknownFields::Error,
            ..self.load_options()
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
    /// The ServiceAccount whose rights Git's objects are applied and pruned with: NAME, the
    /// account of that name in each object's namespace (cluster-scoped objects: in
    /// --agent-namespace), or NAMESPACE/NAME, one account for everything. Default:
    /// `linnet-<source-name>`. A cluster admin grants it what the source may do.
    #[arg(long, env = "LINNET_APPLY_AS")]
    pub apply_as: Option<String>,
    /// Take over objects that exist in the cluster but that linnet did not apply (or that
    /// another source applied). Without it, only objects annotated
    /// `rollouts.linnet.dev/adopt=true` are taken over; the others are located errors.
    #[arg(long, env = "LINNET_ADOPT")]
    pub adopt: bool,
}

impl SyncArgs {
    /// Whose rights the sync applies with.
    pub fn apply_as(&self, agent_namespace: Option<&str>) -> crate::sync::ApplyAs {
        let account = self
            .apply_as
            .clone()
            .unwrap_or_else(|| format!("linnet-{}", self.source_name));
        match account.split_once('/') {
            Some((namespace, name)) => crate::sync::ApplyAs::Account {
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            None => crate::sync::ApplyAs::AccountPerNamespace {
                name: account,
                home: agent_namespace.unwrap_or("default").to_string(),
            },
        }
    }
}

/// A flag's duration that does not parse (clap shows it with the flag's name).
#[derive(Debug, thiserror::Error)]
pub enum FlagDurationError {
    #[error("{0:?} is not a duration like 30s, 5m or 1h")]
    NotANumber(String),
    #[error("unknown unit in {0:?}; use ms, s, m or h")]
    UnknownUnit(String),
}

pub(super) fn parse_duration(text: &str) -> std::result::Result<Duration, FlagDurationError> {
    let text = text.trim();
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(text.len()),
    );
    let n: f64 = number
        .parse()
        .map_err(|_| FlagDurationError::NotANumber(text.to_string()))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(FlagDurationError::UnknownUnit(text.to_string())),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// A flag's rate that is not a positive number of requests per second.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a rate like 10 or 0.5 (requests per second, more than 0, at most 1000)")]
pub struct FlagRateError(String);

pub(super) fn parse_rate(text: &str) -> std::result::Result<f64, FlagRateError> {
    match text.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= 1000.0 => Ok(r),
        _ => Err(FlagRateError(text.to_string())),
    }
}

/// How `linnet validate` prints what it found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ValidateOutput {
    Text,
    Json,
    Github,
}

/// What `validate` and `diff` make of a field the Kubernetes types do not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UnknownFields {
    /// An error at its file:line:column (a typo the API server would refuse).
    Error,
    /// Not checked: for fields of a Kubernetes release newer than linnet's types (1.36).
    Ignore,
}

/// What to do.
/// What `linnet agent --help` ends with: the three ways people start it.
const AGENT_EXAMPLES: &str = "\
Examples:
  # In the cluster (deploy/ or the Helm chart set these as LINNET_* variables):
  linnet agent --repo-url https://github.com/acme/gitops.git --path apps \\
    --git-password-file /etc/linnet/git/token --webhook-secret-file /etc/linnet/webhook/secret

  # From a laptop, on a working tree, against a chosen cluster (no Git host needed):
  linnet agent --repo-path ~/src/gitops --path apps --context kind-dev --leader-elect=false

  # Status back to Git, and commit statuses on GitHub:
  linnet agent --repo-url git@github.com:acme/gitops.git --ssh-key-file ~/.ssh/linnet \\
    --ssh-known-hosts ~/.ssh/known_hosts --commit-status-provider github \\
    --commit-status-repo acme/gitops --commit-status-token-file ~/.config/linnet/token

Every flag can also be set as its LINNET_* environment variable, shown beside it.
More: docs/getting-started.md, docs/git-hosts.md, docs/cli.md.";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: follow the repository and keep the cluster in line with it.
    ///
    /// It looks at the remote every --poll-interval (asking only for the branch tip; a fetch
    /// and a sync happen only when it moved), at once when a verified webhook arrives, or, with
    /// --repo-path, when a file in the directory changes. It serves /healthz, /readyz,
    /// /metrics, /status and /hooks/{github,gitlab,gitea,bitbucket,generic}.
    #[command(after_long_help = AGENT_EXAMPLES)]
    Agent(Box<AgentArgs>),
    /// Show what a sync of DIR would change in the live cluster: exit 0 when nothing would,
    /// 1 when something would, 2 on an error (a spec error, or the cluster cannot be read).
    ///
    /// Prints each object that would be created, updated or pruned, with a YAML diff of the
    /// fields Git sets. Uses the current kubeconfig context (or `KUBECONFIG`), or the one
    /// --kubeconfig and --context name.
    Diff {
        /// The directory of specs (a checkout of the GitOps repository).
        dir: PathBuf,
        /// Accept a directory without any spec (with --prune, that would prune everything
        /// this source applied).
        #[arg(long)]
        allow_empty: bool,
        /// Fields the Kubernetes 1.36 types do not have: `error`, or `ignore` for fields of
        /// a newer release.
        #[arg(long, value_enum, default_value_t = UnknownFields::Error)]
        unknown_fields: UnknownFields,
        #[command(flatten)]
        specs: SpecArgs,
        #[command(flatten)]
        sync: SyncArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Check the specs in DIR offline, for your own pre-merge CI; exit 1 on any error.
    ///
    /// Checks YAML syntax, types and unknown fields of linnet kinds, the CRDs' validation rules
    /// (evaluated locally), kinds and apiVersions Kubernetes 1.36 does not serve, duplicate
    /// objects, and the source's policy (--allow-namespace,
    /// --deny-namespace, --allow-cluster-kind; PersistentVolumes never). Errors are printed
    /// as `file:line:column: message`, as JSON, or as GitHub Actions annotations. A directory
    /// without any spec is an error too (a wrong path), unless --allow-empty.
    Validate {
        /// The directory of specs (a checkout of the GitOps repository).
        dir: PathBuf,
        /// `text` (file:line:column: message), `json` (one object: errors with file, line,
        /// column and message), or `github` (`::error file=…,line=…,col=…::message`
        /// annotations on the pull request's diff).
        #[arg(long, value_enum, default_value_t = ValidateOutput::Text)]
        output: ValidateOutput,
        /// Accept a directory without any spec.
        #[arg(long)]
        allow_empty: bool,
        /// Fields the Kubernetes 1.36 types do not have: `error`, or `ignore` for fields of
        /// a newer release.
        #[arg(long, value_enum, default_value_t = UnknownFields::Error)]
        unknown_fields: UnknownFields,
        /// Whether the namespaces the specs deploy to exist (or are created by the specs):
        /// `auto` asks the cluster of the kubeconfig when it answers within 3 s, `always`
        /// fails when it cannot ask, `never` stays offline.
        #[arg(long, value_enum, default_value_t = NamespaceCheck::Auto)]
        check_namespaces: NamespaceCheck,
        /// CustomResourceDefinitions (a file, or a directory of YAML files) whose kinds the
        /// specs may use, beside those in DIR itself: an object of a group they declare must
        /// be a kind and version they serve. Kinds of groups no CRD declares are not judged.
        #[arg(long, value_name = "PATH")]
        crds: Option<PathBuf>,
        #[command(flatten)]
        cluster: ClusterArgs,
        #[command(flatten)]
        specs: SpecArgs,
    },
    /// Show the agent's source state (revision, last error, last sync) and every rollout's phase.
    Status {
        /// The agent's metrics and status address (its --admin-listen; in a cluster, after
        /// `kubectl -n linnet-system port-forward deploy/linnet 9090`).
        #[arg(
            long,
            default_value = "http://127.0.0.1:9090",
            env = "LINNET_AGENT_URL"
        )]
        agent_url: String,
    },
    /// Show one rollout as a tree: its sets or Deployments, their pods with image, readiness
    /// and volume, its step or batch, conditions and last events. Without a name, list the
    /// rollouts of the namespace (-A: of every namespace).
    ///
    /// With -w, draw it again whenever any of it changes (the cluster's watches, not
    /// polling), until stopped. Uses the current kubeconfig context unless --context or
    /// --kubeconfig say otherwise. As a kubectl plugin: `kubectl linnet get`.
    Get {
        /// The CanaryStatefulSet or CanaryDeployment: NAME, or KIND/NAME when both kinds have
        /// one of that name (KIND: csts or cdeploy, or the kind's full name).
        name: Option<String>,
        /// Its namespace (default: the kubeconfig context's).
        #[arg(short, long)]
        namespace: Option<String>,
        /// List the rollouts of every namespace.
        #[arg(short = 'A', long, conflicts_with_all = ["name", "namespace"])]
        all_namespaces: bool,
        /// Output format: the tree or list (default), wide (a list with step, source and
        /// message), yaml or json (the objects as the API server has them).
        #[arg(short, long, value_enum)]
        output: Option<GetOutput>,
        /// Keep watching, and draw again on every change (one rollout's tree).
        #[arg(short, long, requires = "name", conflicts_with = "output")]
        watch: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Emergency: promote the running canary of a CanaryStatefulSet now.
    ///
    /// Sets the annotation rollouts.linnet.dev/promote so that the running canary acts on it
    /// ("true", or the canary's image when a "true" was there at its start). Git stays the
    /// source of truth: the usual way is to merge a pull request that adds the annotation.
    /// A CanaryDeployment is promoted by raising spec.currentBatch in Git.
    Promote {
        /// The CanaryStatefulSet.
        name: String,
        /// Its namespace (default: the kubeconfig context's).
        #[arg(short, long)]
        namespace: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Emergency: abort the running canary or batches and roll back to the stable image.
    ///
    /// Sets the annotation rollouts.linnet.dev/abort so that the running canary acts on it (as
    /// promote does). The rollout stays rolled back until Git changes the image; put the old
    /// image back in Git to match.
    Abort {
        /// The CanaryStatefulSet or CanaryDeployment (NAME or KIND/NAME).
        name: String,
        /// Its namespace (default: the kubeconfig context's).
        #[arg(short, long)]
        namespace: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Look for the traps a new install falls into, against the cluster of the kubeconfig
    /// and, given DIR, the repository; exit 1 when a check fails.
    ///
    /// Checks the API server and this machine's clock against it; linnet's CRDs against this
    /// binary's (older CRDs drop new fields); the agent's Deployment, readiness and image;
    /// rollout pods that cannot pull their image; with DIR, its spec errors, the render
    /// tools its units need, the namespaces its objects use, and whether the source's
    /// account may read and apply each kind there and the agent may act as it; with
    /// --repo-url, whether the Git host answers and has --branch. Run in the agent's pod
    /// (`kubectl -n linnet-system exec deploy/linnet -- linnet doctor`) it takes the agent's
    /// settings from its environment.
    Doctor(Box<super::doctor::DoctorArgs>),
    /// A fleet of clusters, read from Git alone (no cluster access needed).
    Fleet {
        #[command(subcommand)]
        command: super::fleet::FleetCommand,
    },
    /// Print the CustomResourceDefinitions for `kubectl apply -f -`.
    Crds,
    /// Print a shell completion script: `source <(linnet completion bash)`, or write it where
    /// your shell reads completions (e.g. `linnet completion zsh > ~/.zfunc/_linnet`).
    Completion {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// What `linnet get` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GetOutput {
    Wide,
    Yaml,
    Json,
}

/// Which cluster a command talks to, as kubectl's flags of the same names say.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// The kubeconfig file (default: KUBECONFIG, else ~/.kube/config, else the pod's
    /// ServiceAccount).
    #[arg(long, value_name = "FILE", env = "LINNET_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current-context).
    #[arg(long, env = "LINNET_CONTEXT")]
    pub context: Option<String>,
}

impl ClusterArgs {
    /// The cluster these flags name.
    pub fn target(&self) -> crate::kube_client::Target {
        crate::kube_client::Target {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
    }
}

/// A `--path`: inside the repository (`..` that climbs out of it is refused).
fn parse_repo_path(
    value: &str,
) -> std::result::Result<String, crate::specs::PathOutsideRepository> {
    crate::specs::PathSelection::new(&[value]).map(|_| value.to_string())
}
