//! The field manager each of linnet's writers names. The API server records in `managedFields`
//! who set each field; one name per writer is how the sync tells a field a controller of
//! linnet's owns (never drift) from one Git owns (put back when changed by hand).

/// The sync: every object applied from Git.
pub const SYNC: &str = "linnet";
/// The rollouts' controllers, applying their own children and status. The same name as the
/// sync's: the sync never applies those objects, and a new name would leave the fields the old
/// name applied owned by it, so a field the controller drops later would never be removed.
pub const ROLLOUT: &str = SYNC;
/// Traffic routing: a rollout's weights and header rule on an HTTPRoute or GRPCRoute applied
/// from Git.
pub const TRAFFIC: &str = "linnet-traffic";
/// The per-version copies of ConfigMaps and Secrets (`versionedConfig`).
pub const CONFIG_COPIES: &str = "linnet-config";
/// The Jobs of `job` analysis metrics.
pub const ANALYSIS: &str = "linnet-analysis";
/// A replica asking for its home shard back on a shard Lease.
pub const SHARDS: &str = "linnet-shards";
/// The notifications waiting for their receivers, kept for a restart.
pub const NOTIFICATIONS: &str = "linnet-notifications";
/// The CLI's emergency annotations (`linnet promote`, `linnet abort`).
pub const CLI: &str = "linnet-cli";

/// The writers whose fields on an object applied from Git the sync's drift check leaves alone:
/// a controller's write there is its own, not a change made outside Git.
pub const ON_GIT_OBJECTS: &[&str] = &[TRAFFIC];
