//! What the agent is told by its flags: where specs come from, what it serves, whom it acts
//! as, and which of its tasks run.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::serve::ServeLimits;
use crate::source::git::GitRemote;
use crate::source::hooks::HookSettings;
use crate::specs::LoadOptions;

/// Where specs come from.
#[derive(Clone, Debug)]
pub enum SourceConfig {
    /// A remote repository, mirrored into `cache_dir`.
    Remote {
        remote: GitRemote,
        cache_dir: PathBuf,
    },
    /// A plain directory on disk, watched for changes.
    Local { dir: PathBuf },
}

/// Everything the agent needs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub source: SourceConfig,
    /// Every namespace, or the one a namespace-scoped install watches.
    pub watch_scope: crate::watch::WatchScope,
    /// Sync a revision whose path holds no spec (otherwise an error that changes nothing).
    pub allow_empty: bool,
    pub poll_interval: Duration,
    /// How old the last full comparison with the cluster may be before drift is looked for
    /// again, whether or not Git moved.
    pub drift_interval: Duration,
    /// Longest a single Git operation may take.
    pub git_timeout: Duration,
    /// Only tips signed by a key in this file or directory are applied.
    pub signing_keys: Option<PathBuf>,
    /// Which commits the signing keys check: the tip, or every new commit.
    pub verify_commits: crate::source::verify::VerifyCommits,
    /// A tip that does not descend from the one synced last is refused.
    pub refuse_history_rewrites: bool,
    /// Webhooks and probes; faces the Git host.
    pub listen: SocketAddr,
    /// Metrics, status and probes; for the cluster's own tools.
    pub admin_listen: SocketAddr,
    /// Only the probes, for the kubelet, apart from the webhook port's callers.
    pub probe_listen: Option<SocketAddr>,
    /// How long a loop may go without a heartbeat before `/healthz` fails.
    pub liveness_deadline: std::time::Duration,
    /// `/metrics` alone, for a scraper in another pod.
    pub metrics_listen: Option<SocketAddr>,
    /// The dashboard: where it listens, its links and its actions.
    pub dashboard: super::dashboard::DashboardConfig,
    /// The `Host` names the metrics, status and dashboard listeners answer to besides IP
    /// addresses and localhost.
    pub allowed_host_names: crate::serve::host_names::HostNames,
    /// What each listener lets its callers hold.
    pub serve_limits: ServeLimits,
    pub webhook: Option<HookSettings>,
    pub load: LoadOptions,
    /// How Kustomize overlays and Helm charts are rendered.
    pub render: crate::render::RenderOptions,
    pub source_name: String,
    pub prune: bool,
    /// Whose rights Git's objects are applied with.
    pub apply_as: crate::sync::ApplyAs,
    /// Take over existing objects linnet did not apply.
    pub adopt: bool,
    /// Leader election; `None` runs without it (a single replica).
    pub leader: Option<LeaderConfig>,
    /// Status files written to Git; `None` writes none.
    pub writeback: Option<crate::writeback::WritebackConfig>,
    /// Revert commits for rollouts with `onFailure.revert: commit`; `None` makes none.
    pub reverts: Option<crate::writeback::revert_loop::RevertConfig>,
    /// Commit statuses posted to the Git host; `None` posts none.
    pub commit_status: Option<crate::writeback::commit_status::CommitStatusConfig>,
    /// Notifications (`--notifications-file`), checked at start.
    pub notifications: Option<crate::notify::NotifyConfig>,
    /// Reconciles in flight at once per controller; 0 means no limit.
    pub max_concurrent_reconciles: u16,
    /// How long a new rollout's first status waits for its children to be ready.
    pub first_status_wait: std::time::Duration,
    /// What analysis from Git may reach: files and URLs.
    pub analysis: crate::controller::analysis::Policy,
    /// Where the agent keeps its LinnetSource: its own namespace.
    pub state_namespace: String,
    /// Who holds the source's claim ([`super::claim`]): the installation, in
    /// `state_namespace`.
    pub installation: super::holder::Installation,
    /// How long the claim holds without renewal (`--lease-duration`).
    pub claim_duration: Duration,
    /// This cluster in a fleet (`--cluster`, `--cluster-label`).
    pub cluster: crate::api::ClusterIdentity,
    /// The fleet this cluster's rollouts move in (`--fleet`).
    pub fleet: Option<crate::source::fleet::FleetConfig>,
    /// Tags from registries committed to Git (`--image-automation`).
    pub image_automation: Option<crate::runtime::image_automation::ImageAutomationConfig>,
}

/// The Lease that decides which replica acts.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub duration: Duration,
    /// Shards the rollouts are split into (1: not split), each with its own Lease.
    pub shards: u32,
    /// The shard this replica holds first.
    pub home_shard: u32,
}

/// The directory beside `cache_dir` named `<its name>-<suffix>`: a writer's own clone.
pub fn sibling_dir(cache_dir: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let name = cache_dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "repo".into());
    cache_dir.with_file_name(format!("{name}-{suffix}"))
}
