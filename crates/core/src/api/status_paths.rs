//! Where the status files live in a repository (issue 73: one directory per cluster), shared
//! by the agent that writes them and the readers of a fleet: paths only, and the schema of a
//! cluster's own file.

use serde::{Deserialize, Serialize};

use super::ClusterIdentity;

/// The directory of status files in the repository.
pub const STATUS_DIR: &str = ".linnet/status";

/// The path of a rollout's status file: under a directory named by the first byte of the
/// SHA-256 of its name (`printf %s NAME | sha256sum | cut -c1-2`), so that no tree object
/// grows with the namespace. Git writes a directory as one object: with every file in one
/// directory, each status commit at 10,000 rollouts wrote and pushed a 10,000-entry tree.
pub fn path(cluster: &str, namespace: &str, name: &str) -> String {
    format!(
        "{STATUS_DIR}/{cluster}/{namespace}/{}/{name}.yaml",
        fan_out(name)
    )
}

/// Where linnet wrote a rollout's status file before the cluster was in the path.
pub fn unclustered_path(namespace: &str, name: &str) -> String {
    format!("{STATUS_DIR}/{namespace}/{}/{name}.yaml", fan_out(name))
}

/// The file in which a cluster says who it is: its name and `--cluster-label`s. Never a
/// rollout's (a Kubernetes name cannot start with `_`).
pub fn cluster_path(cluster: &str) -> String {
    format!("{STATUS_DIR}/{cluster}/_cluster.yaml")
}

/// The schema of [`cluster_path`]'s file.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDocument {
    pub api_version: String,
    pub kind: String,
    #[serde(flatten)]
    pub cluster: ClusterIdentity,
}

/// The kind of [`ClusterDocument`].
pub const CLUSTER_KIND: &str = "Cluster";

/// The two hex digits of [`path`]'s directory for `name`.
pub fn fan_out(name: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("{:02x}", Sha256::digest(name.as_bytes())[0])
}

/// Where linnet wrote a rollout's status file before [`path`] fanned them out.
pub fn flat_path(namespace: &str, name: &str) -> String {
    format!("{STATUS_DIR}/{namespace}/{name}.yaml")
}
