//! `promoteTo`, on both rollout kinds: where a rollout's change goes next once it passed here
//! (staging to production), as a pull request in the same repository
//! (on the followed branch, or another one).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The next environment's rollout, which gets this rollout's image by pull request once this
/// one is Stable on it with no failed analysis.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PromoteTo {
    /// A directory (or file) of the same repository, from the repository's root (e.g.
    /// `environments/production`), that holds the next environment's rollout.
    #[schemars(length(min = 1, max = 512))]
    pub path: String,
    /// The next environment's rollout's name, of the same kind; this rollout's when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,
    /// The branch the next environment's rollout is on, when it is not the followed branch
    /// (e.g. `production`): its files are read there and the pull request goes into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub branch: Option<String>,
    /// Merge the pull request once opened, with the agent's merge rights, so the next
    /// environment's canary starts with no person: honoured only when the agent runs with
    /// `--promotion-auto-merge` (else the pull request waits for a person, and the log says
    /// why). Branch protection on the host still applies.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_merge: bool,
}
