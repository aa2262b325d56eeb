//! The flags of `linnet agent`, as clap parses them (with `--help` texts and environment
//! variables).

use super::*;

/// Flags of `linnet agent`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["repo_url", "repo_path"])))]
pub struct AgentArgs {
    /// The repository to follow: https://, ssh://, user@host:path, file:// or a path.
    #[arg(
        help_heading = "Source",
        long,
        env = "LINNET_REPO_URL",
        conflicts_with = "repo_path",
        required_unless_present = "repo_path"
    )]
    pub repo_url: Option<String>,
    /// Follow a plain directory instead (no Git), syncing whenever a file changes.
    #[arg(help_heading = "Source", long, env = "LINNET_REPO_PATH")]
    pub repo_path: Option<PathBuf>,
    /// The branch to follow.
    #[arg(
        help_heading = "Source",
        long,
        default_value = "main",
        env = "LINNET_BRANCH"
    )]
    pub branch: String,
    /// How often to ask the remote for its tip (up to 10% jitter is added).
    #[arg(help_heading = "Source", long, default_value = "60s", value_parser = parse_duration, env = "LINNET_POLL_INTERVAL")]
    pub poll_interval: Duration,
    /// How often every object applied from Git is compared with the cluster, even when Git
    /// did not move: changes made by hand (kubectl edit, patch, scale) are put back with a
    /// DriftReverted event naming the fields. Emergency annotations (promote, abort) are
    /// never drift: Git does not set them.
    #[arg(help_heading = "Source", long, default_value = "3m", value_parser = parse_duration, env = "LINNET_DRIFT_INTERVAL")]
    pub drift_interval: Duration,
    /// How long a call to the Git host may take: a commit status post in all, a fetch or a
    /// write-back push while data arrives (checked as it does); and libgit2's connect and
    /// per-read timeout, so a host that accepts the connection and then stalls is given up
    /// on, and the next look (within 10 s, or at a webhook) tries again.
    #[arg(help_heading = "Source", long, default_value = "60s", value_parser = parse_duration, env = "LINNET_GIT_TIMEOUT")]
    pub git_timeout: Duration,
    /// Apply only revisions whose tip commit is signed by one of these keys: a file, or a
    /// directory of files (a mounted Secret or ConfigMap), of armored OpenPGP public keys
    /// (`gpg --export --armor`) or SSH public key lines (`ssh-ed25519 AAAA…`). Another tip is
    /// refused, located by its commit, and the last good revision stays. Read again for
    /// every new tip, so the keys can rotate.
    #[arg(help_heading = "Verification", long, env = "LINNET_SIGNING_KEYS")]
    pub signing_keys: Option<PathBuf>,
    /// Which commits --signing-keys checks. `tip`: the tip only (as Flux's `verify` and `git
    /// verify-commit`); unsigned commits below a signed tip are applied. `range`: every commit
    /// since the last verified one, merged sides too, at most 1,000 per tip; the first that
    /// fails is named and the whole tip refused. A new cache (a new pod without a volume for
    /// --cache-dir) starts the range at the first tip it verifies.
    #[arg(
        help_heading = "Verification",
        long,
        value_enum,
        default_value = "tip",
        env = "LINNET_VERIFY_COMMITS"
    )]
    pub verify_commits: crate::source::verify::VerifyCommits,
    /// Refuse a tip that does not descend from the revision synced last (a force push that
    /// rewrote the tracked branch's history). Without it a rewrite is applied, with a
    /// HistoryRewritten event and condition.
    #[arg(
        help_heading = "Verification",
        long,
        env = "LINNET_REFUSE_HISTORY_REWRITES"
    )]
    pub refuse_history_rewrites: bool,
    /// A PEM file with the CA (or CAs) that signed the Git host's certificate, for a
    /// self-hosted GitLab, Gitea or GitHub Enterprise with a private CA. Trusted for Git over
    /// HTTPS and for the commit status API, in addition to the system's CAs.
    #[arg(help_heading = "Source", long, env = "LINNET_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Sync a revision whose --path holds no spec at all. Without it such a revision is an
    /// error that changes nothing: a wrong --path, or a commit that moved the specs, would
    /// otherwise prune everything this source applied.
    #[arg(help_heading = "Source", long, env = "LINNET_ALLOW_EMPTY")]
    pub allow_empty: bool,
    /// Where the local mirror of the repository is kept.
    #[arg(
        help_heading = "Source",
        long,
        default_value = "/tmp/linnet/repo",
        env = "LINNET_CACHE_DIR"
    )]
    pub cache_dir: PathBuf,
    #[command(flatten)]
    pub git_auth: GitAuthArgs,
    /// File with the webhook secret; enables /hooks/*. Read on every request.
    #[arg(help_heading = "Webhooks", long, env = "LINNET_WEBHOOK_SECRET_FILE")]
    pub webhook_secret_file: Option<PathBuf>,
    /// Largest webhook body accepted; larger ones get 413 before they are read.
    #[arg(help_heading = "Webhooks", long, default_value_t = 4 * 1024 * 1024, env = "LINNET_WEBHOOK_MAX_BODY_BYTES")]
    pub webhook_max_body_bytes: usize,
    /// Webhook bodies read at once before their signature is checked; more get 503 with
    /// Retry-After. With --webhook-max-body-bytes this bounds what strangers can make the
    /// agent hold.
    #[arg(
        help_heading = "Webhooks",
        long,
        default_value_t = 8,
        env = "LINNET_WEBHOOK_MAX_UNVERIFIED_BODIES"
    )]
    pub webhook_max_unverified_bodies: usize,
    /// How long a webhook body may take to arrive (408 after it).
    #[arg(help_heading = "Webhooks", long, default_value = "10s", value_parser = parse_duration, env = "LINNET_WEBHOOK_BODY_TIMEOUT")]
    pub webhook_body_timeout: std::time::Duration,
    /// Address for webhooks (/hooks/*) and the kubelet's probes (/healthz, /readyz): the
    /// port the Git host reaches.
    #[arg(
        help_heading = "Listeners",
        long,
        default_value = "0.0.0.0:8080",
        env = "LINNET_LISTEN"
    )]
    pub listen: std::net::SocketAddr,
    /// Address for /metrics and /status (and the probes). Localhost by default: reach it with
    /// `kubectl port-forward`, or give 0.0.0.0:9090 to let Prometheus scrape it.
    #[arg(
        help_heading = "Listeners",
        long,
        default_value = "127.0.0.1:9090",
        env = "LINNET_ADMIN_LISTEN"
    )]
    pub admin_listen: std::net::SocketAddr,
    /// An address serving /metrics alone, for Prometheus to scrape from another pod (deploy/
    /// and the chart use 0.0.0.0:8082, and their NetworkPolicy admits only the monitoring
    /// namespace). /status, which names every rollout, stays on --admin-listen.
    #[arg(help_heading = "Listeners", long, env = "LINNET_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Address for the read-only dashboard (docs/dashboard.md): every rollout, live. Off
    /// unless given; 127.0.0.1:8090 for `kubectl port-forward`, or behind your own
    /// authentication proxy. It shows no Secret and no pod template.
    #[arg(help_heading = "Listeners", long, env = "LINNET_DASHBOARD_LISTEN")]
    pub dashboard_listen: Option<std::net::SocketAddr>,
    /// Lets a person signed in to the dashboard with a Kubernetes token (TokenReview)
    /// promote, advance a batch or abort a rollout they may `patch` (SubjectAccessReview).
    /// Each click is a pull request in Git, authored as them, never a change to the cluster.
    /// Needs --repo-url and the Git host's API (--commit-status-provider and the rest), and
    /// linnet's identity must create tokenreviews and subjectaccessreviews (deploy/rbac.yaml).
    #[arg(help_heading = "Listeners", long, env = "LINNET_DASHBOARD_ACTIONS")]
    pub dashboard_actions: bool,
    /// With --dashboard-actions: the agent merges an action's pull request at once when the
    /// person may also `merge` the rollout (a custom RBAC verb on canarystatefulsets or
    /// canarydeployments). Without it, every action waits for a review on the Git host.
    #[arg(help_heading = "Listeners", long, env = "LINNET_DASHBOARD_MERGE")]
    pub dashboard_merge: bool,
    /// With --otlp-endpoint: the link to a trace in your tracing UI, `{traceId}` filled in
    /// (e.g. https://jaeger.example/trace/{traceId}). The dashboard links each rollout's
    /// status `traceId` with it.
    #[arg(help_heading = "Listeners", long, env = "LINNET_TRACE_LINK")]
    pub trace_link: Option<String>,
    /// The link to a commit on your Git host, `{commit}` filled in (e.g.
    /// https://github.com/acme/gitops/commit/{commit}). The dashboard links each rollout's
    /// commit and its timeline's commits with it. Made from an http(s) --repo-url when not
    /// given (without its credentials; GitLab's and Bitbucket's forms by
    /// --commit-status-provider or the host's name).
    #[arg(help_heading = "Listeners", long, env = "LINNET_COMMIT_LINK")]
    pub commit_link: Option<String>,
    /// A name (repeat, or comma-separated) the metrics, status and dashboard listeners
    /// answer to besides IP addresses and localhost, e.g. the dashboard's name behind your
    /// proxy. Any other `Host` gets 403: a page on another site cannot rebind its name to the
    /// agent's address and read it.
    #[arg(
        help_heading = "Listeners",
        long = "allowed-host-name",
        value_delimiter = ',',
        env = "LINNET_ALLOWED_HOST_NAMES"
    )]
    pub allowed_host_names: Vec<String>,
    /// A third address serving only /healthz and /readyz, for the kubelet's probes: a flood
    /// on the webhook port then cannot fail them (deploy/ uses 0.0.0.0:8081). Without it the
    /// probes are answered on both other addresses.
    #[arg(help_heading = "Listeners", long, env = "LINNET_PROBE_LISTEN")]
    pub probe_listen: Option<std::net::SocketAddr>,
    /// Connections each listener keeps open at once; more get 503 with Retry-After.
    #[arg(
        help_heading = "Listeners",
        long,
        default_value_t = 256,
        env = "LINNET_MAX_CONNECTIONS"
    )]
    pub max_connections: usize,
    /// How long a caller may take to send a request's headers, or stay idle between
    /// requests, before its connection is closed.
    #[arg(help_heading = "Listeners", long, default_value = "10s", value_parser = parse_duration, env = "LINNET_HEADER_TIMEOUT")]
    pub header_timeout: std::time::Duration,
    /// Write each rollout's progress to `.linnet/status/<cluster>/<namespace>/<xx>/<name>.yaml` in the
    /// repository (with --repo-url), as commits by --git-author-name; and, for a rollout with
    /// `onFailure.revert: commit` that is rolled back, a commit on --branch that puts its good
    /// image back. Off: linnet never writes to Git.
    #[arg(help_heading = "Write-back", long, default_value_t = true, action = clap::ArgAction::Set, env = "LINNET_WRITEBACK")]
    pub writeback: bool,
    /// The branch status files are committed to. The default keeps linnet's commits off the
    /// branch people work on (and its protection rules); give the tracked branch to keep status
    /// next to the specs.
    #[arg(
        help_heading = "Write-back",
        long,
        default_value = "linnet/status",
        env = "LINNET_WRITEBACK_BRANCH"
    )]
    pub writeback_branch: String,
    /// Status changes within this window go into one commit.
    #[arg(help_heading = "Write-back", long, default_value = "2s", value_parser = parse_duration, env = "LINNET_WRITEBACK_INTERVAL")]
    pub writeback_interval: Duration,
    /// Merge a promotion pull request as soon as it is opened when its rollout's
    /// `promoteTo.autoMerge` is true (with the commit statuses' token, which must be allowed to
    /// merge; branch protection still applies). Off: every promotion waits for a person, and
    /// `autoMerge` is only logged.
    #[arg(help_heading = "Write-back", long, default_value_t = false, action = clap::ArgAction::Set, env = "LINNET_PROMOTION_AUTO_MERGE")]
    pub promotion_auto_merge: bool,
    /// Author and committer name of status commits.
    #[arg(
        help_heading = "Write-back",
        long,
        default_value = "linnet",
        env = "LINNET_GIT_AUTHOR_NAME"
    )]
    pub git_author_name: String,
    /// Author and committer e-mail of status commits.
    #[arg(
        help_heading = "Write-back",
        long,
        default_value = "linnet@localhost",
        env = "LINNET_GIT_AUTHOR_EMAIL"
    )]
    pub git_author_email: String,
    /// Sign every commit the agent writes (write-back, reverts, image automation) with this
    /// OpenSSH private key (unencrypted; ed25519, ECDSA or RSA), as `git commit -S` with
    /// `gpg.format=ssh` does: for a repository that requires signed commits, and for
    /// --signing-keys (list the key's public half there, and the agent applies its own commits).
    #[arg(
        help_heading = "Write-back",
        long,
        value_name = "FILE",
        env = "LINNET_GIT_SIGNING_KEY"
    )]
    pub git_signing_key: Option<PathBuf>,
    /// Post each rollout's state as a commit status on this Git host (off when not given).
    #[arg(help_heading = "Write-back", long, value_enum, env = "LINNET_COMMIT_STATUS_PROVIDER", requires_all = ["commit_status_repo", "commit_status_token_file"])]
    pub commit_status_provider: Option<crate::writeback::commit_status::Provider>,
    /// The host's API base [default: https://api.github.com, https://gitlab.com/api/v4, https://api.bitbucket.org/2.0; Gitea: required].
    #[arg(
        help_heading = "Write-back",
        long,
        env = "LINNET_COMMIT_STATUS_API_URL"
    )]
    pub commit_status_api_url: Option<String>,
    /// The repository: `owner/name` (GitHub, Gitea), the project path or id (GitLab), or
    /// `workspace/repo` (Bitbucket).
    #[arg(help_heading = "Write-back", long, env = "LINNET_COMMIT_STATUS_REPO")]
    pub commit_status_repo: Option<String>,
    /// File with the API token; read on every post.
    #[arg(
        help_heading = "Write-back",
        long,
        env = "LINNET_COMMIT_STATUS_TOKEN_FILE"
    )]
    pub commit_status_token_file: Option<PathBuf>,
    /// A link on each status; {namespace}, {name} and {kind} are filled in.
    #[arg(
        help_heading = "Write-back",
        long,
        env = "LINNET_COMMIT_STATUS_TARGET_URL"
    )]
    pub commit_status_target_url: Option<String>,
    /// Notifications (docs/notifications.md): a YAML file of receivers (Slack, Teams, Discord,
    /// a signed webhook, pull request comments), each routed by event and rollout, its URL
    /// in a file of its own (a mounted Secret). Read at start; a bad file stops the agent.
    #[arg(
        help_heading = "Notifications",
        long,
        env = "LINNET_NOTIFICATIONS_FILE"
    )]
    pub notifications_file: Option<PathBuf>,
    /// This cluster's name (a DNS label): its directory of status files in Git
    /// (`.linnet/status/<cluster>/`), the commit status context
    /// `linnet/<cluster>/<namespace>/<name>`, and what a Fleet's waves name. Every agent
    /// writing to one repository needs its own.
    #[arg(
        help_heading = "Cluster",
        long = "cluster",
        alias = "cluster-name",
        default_value = "default",
        env = "LINNET_CLUSTER_NAME",
        value_parser = parse_cluster_name
    )]
    pub cluster_name: String,
    /// A label of this cluster, `key=value` (repeat it): a Fleet's waves select clusters by
    /// their labels (`matchLabels`). Written to `.linnet/status/<cluster>/_cluster.yaml`.
    #[arg(
        help_heading = "Cluster",
        long = "cluster-label",
        value_name = "KEY=VALUE",
        env = "LINNET_CLUSTER_LABELS",
        value_delimiter = ',',
        value_parser = parse_cluster_label
    )]
    pub cluster_labels: Vec<(String, String)>,
    /// A Fleet file in the repository (from its root, e.g. `fleets/shop.yaml`): this
    /// cluster starts a rollout's new image only when the Fleet's earlier waves have it
    /// Stable and baked, as their status files on --writeback-branch say
    /// ([docs/fleet.md](docs/fleet.md)). Needs --repo-url and write-back.
    #[arg(
        help_heading = "Cluster",
        long,
        value_name = "FILE",
        env = "LINNET_FLEET"
    )]
    pub fleet: Option<String>,
    /// Image automation (docs/image-automation.md): at each --image-scan-interval, read the
    /// `ImagePolicy` documents in the repository, list each policy's tags in its registry,
    /// and commit the newest allowed tag to the followed branch wherever a YAML line carries
    /// the policy's marker (`# {"$imagepolicy": "NAME"}`, as Flux writes it). Needs --repo-url
    /// and a token that may push to --branch.
    #[arg(help_heading = "Image automation", long, default_value_t = false, action = clap::ArgAction::Set, env = "LINNET_IMAGE_AUTOMATION")]
    pub image_automation: bool,
    /// How often the image automation lists the registries' tags.
    #[arg(help_heading = "Image automation", long, default_value = "1m", value_parser = parse_duration, env = "LINNET_IMAGE_SCAN_INTERVAL")]
    pub image_scan_interval: Duration,
    /// Let an `ImagePolicy` with `pullRequest.autoMerge` have its pull request merged by the
    /// agent as soon as it is open (branch protection still applies). Off: every image pull
    /// request waits for a person, and `autoMerge` is only logged.
    #[arg(help_heading = "Image automation", long, default_value_t = false, action = clap::ArgAction::Set, env = "LINNET_IMAGE_AUTOMATION_AUTO_MERGE")]
    pub image_automation_auto_merge: bool,
    /// Credentials for private registries: a Docker config file (`config.json`, or a
    /// `kubernetes.io/dockerconfigjson` Secret mounted as a file), read again at each scan.
    /// Each is sent only to the registry host its `auths` key names, and only over HTTPS.
    #[arg(
        help_heading = "Image automation",
        long,
        value_name = "FILE",
        env = "LINNET_REGISTRY_CREDENTIALS"
    )]
    pub registry_credentials: Option<PathBuf>,
    /// Requests per second to one registry, at most (tag list pages, digests, tokens). A
    /// registry that answers 429, 5xx or not at all is left alone for longer each time (up to
    /// 30 minutes), and at least as long as its `Retry-After`.
    #[arg(help_heading = "Image automation", long, default_value_t = 10.0, value_parser = parse_rate, env = "LINNET_REGISTRY_RATE")]
    pub registry_rate: f64,
    /// Run only while holding a coordination.k8s.io Lease, so that two replicas never both
    /// act; the other waits (not ready) and takes over when the lease expires.
    #[arg(help_heading = "Leader election and sharding", long, default_value_t = true, action = clap::ArgAction::Set, env = "LINNET_LEADER_ELECT")]
    pub leader_elect: bool,
    /// The Lease's name [default: linnet-<source-name>].
    #[arg(
        help_heading = "Leader election and sharding",
        long,
        env = "LINNET_LEASE_NAME"
    )]
    pub lease_name: Option<String>,
    /// The Lease's namespace (the agent's own, from the downward API, in a cluster).
    #[arg(
        help_heading = "Leader election and sharding",
        long,
        default_value = "default",
        env = "POD_NAMESPACE"
    )]
    pub lease_namespace: String,
    /// This replica's name in the Lease [default: the host name and process id].
    #[arg(help_heading = "Leader election and sharding", long, env = "POD_NAME")]
    pub lease_identity: Option<String>,
    /// How long one of the agent's loops (the source loop, each notification receiver's, the
    /// Lease's) may go without coming round before /healthz fails naming it, so that the
    /// kubelet's liveness probe restarts a process that still runs but does nothing.
    #[arg(help_heading = "Leader election and sharding", long, default_value = "5m", value_parser = parse_duration, env = "LINNET_LIVENESS_DEADLINE")]
    pub liveness_deadline: Duration,
    /// How long a Lease holds without renewal; a failover takes at most about this long.
    #[arg(help_heading = "Leader election and sharding", long, default_value = "15s", value_parser = parse_duration, env = "LINNET_LEASE_DURATION")]
    pub lease_duration: Duration,
    /// Split the rollouts across replicas: rollout namespace/name belongs to shard
    /// hash(namespace/name) mod N, and each shard has its own Lease (<lease-name>-shard-<k>).
    /// A replica runs the rollouts of the shards it holds, so one replica's failure moves
    /// only its own shards, to the others, within --lease-duration. Git sync and write-back
    /// stay with the holder of the main Lease. 1 (the default) does not split. See
    /// docs/sharding.md.
    #[arg(help_heading = "Leader election and sharding", long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64), env = "LINNET_SHARDS")]
    pub shards: u32,
    /// The shard this replica holds first; the others it takes only when their holder stops
    /// renewing [default: the number ending --lease-identity, as a StatefulSet pod's name
    /// ends in its ordinal].
    #[arg(
        help_heading = "Leader election and sharding",
        long,
        env = "LINNET_SHARD_INDEX"
    )]
    pub shard_index: Option<u32>,
    /// Watch and apply in this one namespace only: a namespace-scoped install, whose Role
    /// grants nothing elsewhere (examples/namespace-install, docs/namespace-install.md). The source
    /// may then apply only there (--allow-namespace is this namespace, and no cluster-scoped
    /// kind); volumes stay cluster-scoped, so a volume handoff still needs the small
    /// ClusterRole linnet-volumes. Every namespace when not set.
    #[arg(help_heading = "Cluster", long, env = "LINNET_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Reconciles in flight at once, per kind of rollout; 0 means no limit. A start with
    /// 1,000 rollouts reconciles every one of them: a limit bounds the memory that takes, and
    /// too low a limit slows it down.
    #[arg(help_heading = "Cluster", long, default_value_t = crate::controller::MAX_CONCURRENT_RECONCILES, env = "LINNET_MAX_CONCURRENT_RECONCILES")]
    pub max_concurrent_reconciles: u16,
    /// How long a new rollout's first status waits for its StatefulSet or Deployment to be
    /// ready, so that a rollout that starts as Git asks costs one status write (Stable or
    /// Completed), not two (Initializing, then Stable). A move to any other phase, a refused
    /// spec or a failed action is written at once. 0s writes Initializing at once. The wait
    /// is 50 ms longer for each other new rollout waiting at the same time (up to 20 min): a
    /// first sync of 10,000 rollouts readies its sets over minutes.
    #[arg(help_heading = "Cluster", long, default_value = "30s", value_parser = super::args::parse_duration, env = "LINNET_FIRST_STATUS_WAIT")]
    pub first_status_wait: std::time::Duration,
    /// The directory whose files an AnalysisTemplate may name as `bearerTokenFile` or
    /// `caFile` (e.g. a mounted Secret). A template from Git can name no other file: it
    /// could otherwise send the agent's own credentials to a server of its choosing.
    /// Without it, templates may name no file.
    #[arg(help_heading = "Analysis", long, env = "LINNET_ANALYSIS_FILES_DIR")]
    pub analysis_files_dir: Option<std::path::PathBuf>,
    /// URL prefixes analysis may query (Prometheus addresses, web URLs), e.g.
    /// `http://prometheus.monitoring:9090/`: a URL must have a prefix's scheme, host and port
    /// and a path under it. Repeat it, or separate with commas. Without it, any URL (whoever
    /// can push can then make the agent request any address it reaches), and no bearer token.
    #[arg(
        help_heading = "Analysis",
        long,
        env = "LINNET_ANALYSIS_URL_PREFIX",
        value_delimiter = ','
    )]
    pub analysis_url_prefix: Vec<String>,
    #[command(flatten, next_help_heading = "Specs and rendering")]
    pub specs: SpecArgs,
    #[command(flatten, next_help_heading = "Sync")]
    pub sync: SyncArgs,
    /// The cluster (in a pod: its ServiceAccount; from a laptop: the kubeconfig).
    #[command(flatten, next_help_heading = "Cluster")]
    pub cluster: ClusterArgs,
}

/// A `--cluster` or `--cluster-label` that cannot be one, and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClusterFlagError(String);

/// `--cluster`: a DNS label, since it names a directory in Git.
fn parse_cluster_name(text: &str) -> Result<String, ClusterFlagError> {
    match crate::api::cluster_name_problem(text) {
        Some(why) => Err(ClusterFlagError(why)),
        None => Ok(text.to_string()),
    }
}

/// `--cluster-label key=value`.
fn parse_cluster_label(text: &str) -> Result<(String, String), ClusterFlagError> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(ClusterFlagError(format!(
            "{text:?} is not key=value (e.g. region=eu)"
        )));
    };
    let fine = |s: &str, max: usize| {
        s.len() <= max
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
    };
    if key.is_empty() || !fine(key, 253) || !fine(value, 63) {
        return Err(ClusterFlagError(format!(
            "{text:?}: a label's key and value are letters, digits, `-`, `_`, `.` and `/` \
             (a value at most 63)"
        )));
    }
    Ok((key.to_string(), value.to_string()))
}

impl AgentArgs {
    /// This agent's cluster in a fleet: `--cluster` and its `--cluster-label`s.
    pub fn cluster_identity(&self) -> crate::api::ClusterIdentity {
        crate::api::ClusterIdentity {
            name: self.cluster_name.clone(),
            labels: self.cluster_labels.iter().cloned().collect(),
        }
    }
}
