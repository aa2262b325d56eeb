//! `LinnetSource`: the state of one agent's source, for people with only kubectl. The agent
//! writes it (spec and status) in its own namespace, named after its `--source-name`;
//! nobody else edits it. Flux shows a GitRepository's state on the object itself; linnet's
//! source is configured by the agent's flags, so this object reports rather than configures,
//! like OpenShift's ClusterOperator.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// What the source follows, as the agent was started (written by the agent).
// The derive takes one `printcolumn` per column; clippy reads them as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "rollouts.linnet.dev",
    version = "v1alpha1",
    kind = "LinnetSource",
    namespaced,
    derive = "PartialEq",
    status = "LinnetSourceStatus",
    shortname = "lsrc",
    category = "linnet",
    printcolumn(name = "Revision", type_ = "string", json_path = ".status.revision"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Objects", type_ = "integer", json_path = ".status.objects"),
    printcolumn(name = "Last Sync", type_ = "date", json_path = ".status.lastSyncTime"),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message"
    ),
    doc = "The state of a linnet agent's Git source: the revision synced, the last error and when. Written by the agent; read-only for people."
)]
#[serde(rename_all = "camelCase")]
pub struct LinnetSourceSpec {
    /// The repository (credentials removed), or the directory with --repo-path.
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub branch: String,
    /// What of the repository is applied (`--path`): `.` for all of it, else the paths,
    /// comma-separated.
    #[serde(default)]
    pub path: String,
}

/// How the source stands.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LinnetSourceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready: every object of the revision applied (reason Synced). Reason SyncFailed (Git
    /// or the sync failed), SyncErrors, SpecErrors or NotSynced when not, with the first
    /// error in the message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The Git revision last synced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// When the revision, or the errors, last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// The last failure to reach Git or to sync, cleared by the next success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Objects in the revision.
    #[serde(default)]
    pub objects: i64,
    /// Located errors in the specs (`file:line:column: message`), at most ten.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spec_errors: Vec<String>,
    /// Objects of the revision not applied, with why, at most ten.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sync_errors: Vec<String>,
}
