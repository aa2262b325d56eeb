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

    #[command(subcommand)]
    pub command: Command,
}

/// How specs are read (shared by `validate`, `diff` and `agent`).
#[derive(Debug, Clone, clap::Args)]
pub struct SpecArgs {
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
    /// Let claims from Git name their volume (`spec.volumeName`, also in claim templates).
    /// Off: a repository writer could bind any Available PersistentVolume, someone else's data.
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

/// Flags of `linnet agent`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["repo_url", "repo_path"])))]
pub struct AgentArgs {
    /// The repository to follow: https://, ssh://, user@host:path, file:// or a path.
    #[arg(
        long,
        env = "LINNET_REPO_URL",
        conflicts_with = "repo_path",
        required_unless_present = "repo_path"
    )]
    pub repo_url: Option<String>,
    /// Follow a plain directory instead (no Git), syncing whenever a file changes.
    #[arg(long, env = "LINNET_REPO_PATH")]
    pub repo_path: Option<PathBuf>,
    /// The branch to follow.
    #[arg(long, default_value = "main", env = "LINNET_BRANCH")]
    pub branch: String,
    /// Directory inside the repository that holds the specs.
    #[arg(long, default_value = ".", env = "LINNET_PATH")]
    pub path: String,
    /// How often to ask the remote for its tip (up to 10% jitter is added).
    #[arg(long, default_value = "60s", value_parser = parse_duration, env = "LINNET_POLL_INTERVAL")]
    pub poll_interval: Duration,
    /// How often every object applied from Git is compared with the cluster, even when Git
    /// did not move: changes made by hand (kubectl edit, patch, scale) are put back with a
    /// DriftReverted event naming the fields. Emergency annotations (promote, abort) are
    /// never drift: Git does not set them.
    #[arg(long, default_value = "3m", value_parser = parse_duration, env = "LINNET_DRIFT_INTERVAL")]
    pub drift_interval: Duration,
    /// How long a call to the Git host may take: a commit status post in all, a fetch or a
    /// write-back push while data arrives (checked as it does); and libgit2's connect and
    /// per-read timeout, so a host that accepts the connection and then stalls is given up
    /// on, and the next look (within 10 s, or at a webhook) tries again.
    #[arg(long, default_value = "60s", value_parser = parse_duration, env = "LINNET_GIT_TIMEOUT")]
    pub git_timeout: Duration,
    /// Apply only revisions whose tip commit is signed by one of these keys: a file, or a
    /// directory of files (a mounted Secret or ConfigMap), of armored OpenPGP public keys
    /// (`gpg --export --armor`) or SSH public key lines (`ssh-ed25519 AAAA…`). Another tip is
    /// refused, located by its commit, and the last good revision stays. Read again for
    /// every new tip, so the keys can rotate.
    #[arg(long, env = "LINNET_SIGNING_KEYS")]
    pub signing_keys: Option<PathBuf>,
    /// Refuse a tip that does not descend from the revision synced last (a force push that
    /// rewrote the tracked branch's history). Without it a rewrite is applied, with a
    /// HistoryRewritten event and condition.
    #[arg(long, env = "LINNET_REFUSE_HISTORY_REWRITES")]
    pub refuse_history_rewrites: bool,
    /// A PEM file with the CA (or CAs) that signed the Git host's certificate, for a
    /// self-hosted GitLab, Gitea or GitHub Enterprise with a private CA. Trusted for Git over
    /// HTTPS and for the commit status API, in addition to the system's CAs.
    #[arg(long, env = "LINNET_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Sync a revision whose --path holds no spec at all. Without it such a revision is an
    /// error that changes nothing: a wrong --path, or a commit that moved the specs, would
    /// otherwise prune everything this source applied.
    #[arg(long, env = "LINNET_ALLOW_EMPTY")]
    pub allow_empty: bool,
    /// Where the local mirror of the repository is kept.
    #[arg(long, default_value = "/tmp/linnet/repo", env = "LINNET_CACHE_DIR")]
    pub cache_dir: PathBuf,
    /// HTTPS user name (with --git-password-file).
    #[arg(long, default_value = "git", env = "LINNET_GIT_USERNAME")]
    pub git_username: String,
    /// File with the HTTPS password or token; read on every connection.
    #[arg(long, env = "LINNET_GIT_PASSWORD_FILE")]
    pub git_password_file: Option<PathBuf>,
    /// SSH private key (deploy key) for ssh:// and scp-style URLs.
    #[arg(long, env = "LINNET_SSH_KEY_FILE", requires = "ssh_known_hosts")]
    pub ssh_key_file: Option<PathBuf>,
    /// known_hosts file that must list the SSH server's key.
    #[arg(long, env = "LINNET_SSH_KNOWN_HOSTS")]
    pub ssh_known_hosts: Option<PathBuf>,
    /// File with the webhook secret; enables /hooks/*. Read on every request.
    #[arg(long, env = "LINNET_WEBHOOK_SECRET_FILE")]
    pub webhook_secret_file: Option<PathBuf>,
    /// Largest webhook body accepted; larger ones get 413 before they are read.
    #[arg(long, default_value_t = 4 * 1024 * 1024, env = "LINNET_WEBHOOK_MAX_BODY_BYTES")]
    pub webhook_max_body_bytes: usize,
    /// Webhook bodies read at once before their signature is checked; more get 503 with
    /// Retry-After. With --webhook-max-body-bytes this bounds what strangers can make the
    /// agent hold.
    #[arg(
        long,
        default_value_t = 8,
        env = "LINNET_WEBHOOK_MAX_UNVERIFIED_BODIES"
    )]
    pub webhook_max_unverified_bodies: usize,
    /// How long a webhook body may take to arrive (408 after it).
    #[arg(long, default_value = "10s", value_parser = parse_duration, env = "LINNET_WEBHOOK_BODY_TIMEOUT")]
    pub webhook_body_timeout: std::time::Duration,
    /// Address for webhooks (/hooks/*) and the kubelet's probes (/healthz, /readyz): the
    /// port the Git host reaches.
    #[arg(long, default_value = "0.0.0.0:8080", env = "LINNET_LISTEN")]
    pub listen: std::net::SocketAddr,
    /// Address for /metrics and /status (and the probes). Localhost by default: reach it with
    /// `kubectl port-forward`, or give 0.0.0.0:9090 to let Prometheus scrape it.
    #[arg(long, default_value = "127.0.0.1:9090", env = "LINNET_ADMIN_LISTEN")]
    pub admin_listen: std::net::SocketAddr,
    /// A third address serving only /healthz and /readyz, for the kubelet's probes: a flood
    /// on the webhook port then cannot fail them (deploy/ uses 0.0.0.0:8081). Without it the
    /// probes are answered on both other addresses.
    #[arg(long, env = "LINNET_PROBE_LISTEN")]
    pub probe_listen: Option<std::net::SocketAddr>,
    /// Connections each listener keeps open at once; more get 503 with Retry-After.
    #[arg(long, default_value_t = 256, env = "LINNET_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// How long a caller may take to send a request's headers, or stay idle between
    /// requests, before its connection is closed.
    #[arg(long, default_value = "10s", value_parser = parse_duration, env = "LINNET_HEADER_TIMEOUT")]
    pub header_timeout: std::time::Duration,
    /// Write each rollout's progress to `.linnet/status/<namespace>/<xx>/<name>.yaml` in the
    /// repository (with --repo-url), as commits by --git-author-name.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LINNET_WRITEBACK")]
    pub writeback: bool,
    /// The branch status files are committed to. The default keeps linnet's commits off the
    /// branch people work on (and its protection rules); give the tracked branch to keep status
    /// next to the specs.
    #[arg(long, default_value = "linnet/status", env = "LINNET_WRITEBACK_BRANCH")]
    pub writeback_branch: String,
    /// Status changes within this window go into one commit.
    #[arg(long, default_value = "2s", value_parser = parse_duration, env = "LINNET_WRITEBACK_INTERVAL")]
    pub writeback_interval: Duration,
    /// Author and committer name of status commits.
    #[arg(long, default_value = "linnet", env = "LINNET_GIT_AUTHOR_NAME")]
    pub git_author_name: String,
    /// Author and committer e-mail of status commits.
    #[arg(
        long,
        default_value = "linnet@localhost",
        env = "LINNET_GIT_AUTHOR_EMAIL"
    )]
    pub git_author_email: String,
    /// Post each rollout's state as a commit status on this Git host (off when not given).
    #[arg(long, value_enum, env = "LINNET_COMMIT_STATUS_PROVIDER", requires_all = ["commit_status_repo", "commit_status_token_file"])]
    pub commit_status_provider: Option<crate::writeback::commit_status::Provider>,
    /// The host's API base [default: https://api.github.com, https://gitlab.com/api/v4; Gitea: required].
    #[arg(long, env = "LINNET_COMMIT_STATUS_API_URL")]
    pub commit_status_api_url: Option<String>,
    /// The repository: `owner/name` (GitHub, Gitea) or the project path or id (GitLab).
    #[arg(long, env = "LINNET_COMMIT_STATUS_REPO")]
    pub commit_status_repo: Option<String>,
    /// File with the API token; read on every post.
    #[arg(long, env = "LINNET_COMMIT_STATUS_TOKEN_FILE")]
    pub commit_status_token_file: Option<PathBuf>,
    /// A link on each status; {namespace}, {name} and {kind} are filled in.
    #[arg(long, env = "LINNET_COMMIT_STATUS_TARGET_URL")]
    pub commit_status_target_url: Option<String>,
    /// This cluster's name, in the commit status context `linnet/<cluster>/<namespace>/<name>`.
    #[arg(long, default_value = "default", env = "LINNET_CLUSTER_NAME")]
    pub cluster_name: String,
    /// Run only while holding a coordination.k8s.io Lease, so that two replicas never both
    /// act; the other waits (not ready) and takes over when the lease expires.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LINNET_LEADER_ELECT")]
    pub leader_elect: bool,
    /// The Lease's name [default: linnet-<source-name>].
    #[arg(long, env = "LINNET_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// The Lease's namespace (the agent's own, from the downward API, in a cluster).
    #[arg(long, default_value = "default", env = "POD_NAMESPACE")]
    pub lease_namespace: String,
    /// This replica's name in the Lease [default: the host name and process id].
    #[arg(long, env = "POD_NAME")]
    pub lease_identity: Option<String>,
    /// How long a Lease holds without renewal; a failover takes at most about this long.
    #[arg(long, default_value = "15s", value_parser = parse_duration, env = "LINNET_LEASE_DURATION")]
    pub lease_duration: Duration,
    /// Split the rollouts across replicas: rollout namespace/name belongs to shard
    /// hash(namespace/name) mod N, and each shard has its own Lease (<lease-name>-shard-<k>).
    /// A replica runs the rollouts of the shards it holds, so one replica's failure moves
    /// only its own shards, to the others, within --lease-duration. Git sync and write-back
    /// stay with the holder of the main Lease. 1 (the default) does not split. See
    /// docs/sharding.md.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64), env = "LINNET_SHARDS")]
    pub shards: u32,
    /// The shard this replica holds first; the others it takes only when their holder stops
    /// renewing [default: the number ending --lease-identity, as a StatefulSet pod's name
    /// ends in its ordinal].
    #[arg(long, env = "LINNET_SHARD_INDEX")]
    pub shard_index: Option<u32>,
    /// Reconciles in flight at once, per kind of rollout; 0 means no limit. A start with
    /// 1,000 rollouts reconciles every one of them: a limit bounds the memory that takes, and
    /// too low a limit slows it down.
    #[arg(long, default_value_t = crate::controller::MAX_CONCURRENT_RECONCILES, env = "LINNET_MAX_CONCURRENT_RECONCILES")]
    pub max_concurrent_reconciles: u16,
    /// The directory whose files an AnalysisTemplate may name as `bearerTokenFile` or
    /// `caFile` (e.g. a mounted Secret). A template from Git can name no other file: it
    /// could otherwise send the agent's own credentials to a server of its choosing.
    /// Without it, templates may name no file.
    #[arg(long, env = "LINNET_ANALYSIS_FILES_DIR")]
    pub analysis_files_dir: Option<std::path::PathBuf>,
    /// URL prefixes analysis may query (Prometheus addresses, web URLs), e.g.
    /// `http://prometheus.monitoring:9090/`: a URL must have a prefix's scheme, host and port
    /// and a path under it. Repeat it, or separate with commas. Without it, any URL (whoever
    /// can push can then make the agent request any address it reaches), and no bearer token.
    #[arg(long, env = "LINNET_ANALYSIS_URL_PREFIX", value_delimiter = ',')]
    pub analysis_url_prefix: Vec<String>,
    #[command(flatten)]
    pub specs: SpecArgs,
    #[command(flatten)]
    pub sync: SyncArgs,
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
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: follow the repository and keep the cluster in line with it.
    ///
    /// It looks at the remote every --poll-interval (asking only for the branch tip; a fetch
    /// and a sync happen only when it moved), at once when a verified webhook arrives, or, with
    /// --repo-path, when a file in the directory changes. It serves /healthz, /readyz,
    /// /metrics, /status and /hooks/{github,gitlab,gitea,bitbucket,generic}.
    Agent(Box<AgentArgs>),
    /// Show what a sync of DIR would change in the live cluster: exit 0 when nothing would,
    /// 1 when something would, 2 on an error (a spec error, or the cluster cannot be read).
    ///
    /// Prints each object that would be created, updated or pruned, with a YAML diff of the
    /// fields Git sets. Uses the current kubeconfig context (or `KUBECONFIG`).
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
    },
    /// Check the specs in DIR offline, for your own pre-merge CI; exit 1 on any error.
    ///
    /// Checks YAML syntax, types and unknown fields of linnet kinds, the CRDs' validation rules
    /// (evaluated locally), duplicate objects, and the source's policy (--allow-namespace,
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
    /// and volume, its step or batch, conditions and last events.
    ///
    /// With -w, draw it again whenever any of it changes (the cluster's watches, not
    /// polling), until stopped. Uses the current kubeconfig context.
    Get {
        /// The CanaryStatefulSet or CanaryDeployment.
        name: String,
        /// Its namespace (default: the kubeconfig context's).
        #[arg(short, long)]
        namespace: Option<String>,
        /// Keep watching, and draw again on every change.
        #[arg(short, long)]
        watch: bool,
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
    },
    /// Emergency: abort the running canary or batches and roll back to the stable image.
    ///
    /// Sets the annotation rollouts.linnet.dev/abort so that the running canary acts on it (as
    /// promote does). The rollout stays rolled back until Git changes the image; put the old
    /// image back in Git to match.
    Abort {
        /// The CanaryStatefulSet or CanaryDeployment.
        name: String,
        /// Its namespace (default: the kubeconfig context's).
        #[arg(short, long)]
        namespace: Option<String>,
    },
    /// Print the CustomResourceDefinitions for `kubectl apply -f -`.
    Crds,
}
