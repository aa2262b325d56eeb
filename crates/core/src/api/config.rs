//! `versionedConfig`, on both rollout kinds: the ConfigMaps and Secrets a pod template refers
//! to are copied per version (`<name>-<hash>`), and each version's pods mount their own copy,
//! so a commit that changes an image and its config gives the new config to the canary pods
//! only. The status records which copies each image's pods mount.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which kind of object a pod template refers to for its config.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub enum ConfigKind {
    ConfigMap,
    Secret,
}

impl ConfigKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKind::ConfigMap => "ConfigMap",
            ConfigKind::Secret => "Secret",
        }
    }
}

/// A ConfigMap or Secret the pod template names, and the copy a version's pods mount instead.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct ConfigCopy {
    pub kind: ConfigKind,
    /// The name the pod template (and Git) uses.
    pub name: String,
    /// The copy: `<name>-<10 hex digits of its content and the rollout>`.
    pub copy: String,
}

/// The copies one image's pods mount.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VersionConfig {
    pub image: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<ConfigCopy>,
}

/// The label on every copy (value `"true"`), besides the rollout's: what garbage collection
/// lists. Never the source's label, so that prune leaves copies to their rollout.
pub const CONFIG_COPY_LABEL: &str = "rollouts.linnet.dev/config-copy";
/// The annotation on every copy: the name of the ConfigMap or Secret it copies.
pub const CONFIG_COPY_OF_ANNOTATION: &str = "rollouts.linnet.dev/config-copy-of";
