//! `onFailure`, on both rollout kinds: what linnet does in Git once a rollout is rolled back,
//! so that Git stops asking for the version that failed.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What linnet does in Git when a rollout is rolled back.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OnFailure {
    /// `pullRequest`: linnet opens a pull request (on the host and with the token of commit
    /// statuses) that puts the image the rollout returned to back in its spec file; merging
    /// it makes the rollout Stable again. `commit`: the same change as a commit straight on
    /// the followed branch (never forced). `none` (the default): Git is left as it is, and
    /// the rollout stays rolled back until a person changes the image in Git.
    #[serde(default)]
    pub revert: RevertMode,
}

/// How a rolled-back rollout's spec is put back in Git.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum RevertMode {
    #[default]
    None,
    Commit,
    PullRequest,
}
