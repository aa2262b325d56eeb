//! `ImagePolicy` (issue 74): which tags of an image repository a rollout may move to. Like a
//! `Fleet`, it is read from Git by the agent (given `--image-automation`) and never applied:
//! the agent lists the repository's tags, picks the newest the policy allows, and commits it
//! wherever a YAML line carries the policy's marker comment, as Flux's image automation does:
//!
//! ```yaml
//! image: registry.example/web:1.4.2 # {"$imagepolicy": "web"}
//! newTag: 1.4.2 # {"$imagepolicy": "web:tag"}
//! ```
//!
//! The shape follows Flux's `ImageRepository` and `ImagePolicy` in one kind, so that a team
//! coming from Flux recognises every field.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kind's name in Git.
pub const IMAGE_POLICY_KIND: &str = "ImagePolicy";

/// An image policy.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePolicy {
    pub api_version: String,
    pub kind: String,
    pub metadata: ImagePolicyMeta,
    pub spec: ImagePolicySpec,
}

/// A policy's name (and, as in Flux's markers `namespace:name`, an optional namespace).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePolicyMeta {
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePolicySpec {
    /// The image repository, without a tag: `registry.example:5000/team/web`. A name with no
    /// registry host is Docker Hub's.
    #[schemars(length(min = 1, max = 255))]
    pub image: String,
    /// How the newest allowed tag is chosen.
    pub policy: TagOrder,
    /// Only tags matching `pattern` are considered; `extract` (e.g. `$ts`) is what is ordered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_tags: Option<TagFilter>,
    /// The registry speaks plain HTTP (a registry on a private network or a test's); HTTPS
    /// otherwise, checked against the system's roots and `--ca-file`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// Write the digest with the tag (`image:tag@sha256:…`) on whole-reference markers, so
    /// that what runs is what was picked even if the tag is pushed again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub digest_pinning: bool,
    /// A tag pushed again with another digest (a moved tag) is flagged and left out unless
    /// this is set: tags are meant to be immutable, and a moved one may be an attack.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_moved_tags: bool,
    /// Propose the new tag in a pull request on the Git host (the host, API and token of
    /// commit statuses) instead of committing it to the followed branch. One pull request
    /// carries every such policy's change of a scan; a newer pick replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<ImagePullRequest>,
    /// Write a tag only when its image is signed: the agent checks the signature itself
    /// before anything reaches Git.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<ImageVerification>,
}

/// How a picked image's signature is checked.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageVerification {
    pub cosign: CosignVerification,
}

/// cosign's key-based signatures: the `sha256-<digest>.sig` tag beside the image, whose
/// payload names the image's digest and is signed by one of these keys.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CosignVerification {
    /// PEM public keys (`cosign.pub`: ECDSA P-256, or Ed25519); one valid signature by any
    /// of them is enough.
    #[schemars(length(min = 1, max = 16))]
    pub public_keys: Vec<String>,
}

/// `pullRequest: {}` or `pullRequest: {autoMerge: true}`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullRequest {
    /// Merge the pull request as soon as it is open, when the agent allows it
    /// (`--image-automation-auto-merge`; branch protection still applies). Otherwise it waits
    /// for a person.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_merge: bool,
}

/// One ordering of tags (exactly one field set).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TagOrder {
    /// The highest version in a semver range (`>=1.0.0, <2.0.0`; `1.x`); tags that are not
    /// versions are left out, and a pre-release only when the range names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semver: Option<SemverOrder>,
    /// The last (or first) tag in byte order: timestamps such as `2026-12-04T1030`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alphabetical: Option<Ordered>,
    /// The largest (or smallest) tag read as a number: build numbers, Unix times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numerical: Option<Ordered>,
    /// The tag whose image was built last (its config's `created`), as Argo CD Image
    /// Updater's `newest-build`: for tags that say nothing of their order (`main-3f2a1c`).
    /// Costs a request per tag and scan (and two per image not seen before): narrow the tags
    /// with `filterTags`; at most 200 are read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_build: Option<NewestBuild>,
}

/// `newestBuild: {}` (no fields yet).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewestBuild {}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SemverOrder {
    #[schemars(length(min = 1, max = 256))]
    pub range: String,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ordered {
    /// `asc` (the default) picks the last tag in order, `desc` the first.
    #[serde(default)]
    pub order: Direction,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    #[default]
    Asc,
    Desc,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TagFilter {
    /// A regular expression (Rust's `regex` syntax: no backreferences, linear time).
    #[schemars(length(min = 1, max = 1024))]
    pub pattern: String,
    /// What of a matching tag is ordered: `$name` or `${name}` of a capture group; the whole
    /// tag when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub extract: String,
}

impl ImagePolicy {
    /// How a marker names this policy: `name`, or `namespace:name` too when it has one.
    pub fn answers_to(&self, marker_name: &str) -> bool {
        match (marker_name.split_once(':'), &self.metadata.namespace) {
            (None, _) => marker_name == self.metadata.name,
            (Some((ns, name)), Some(own)) => ns == own && name == self.metadata.name,
            (Some(_), None) => false,
        }
    }
}
