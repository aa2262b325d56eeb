//! The rollout API, `rollouts.linnet.dev/v1alpha1`: the `CanaryStatefulSet` and
//! `CanaryDeployment` custom resources and their shared status types. `linnet crds` prints
//! the CustomResourceDefinitions generated from these types; `deploy/crds/` holds the output.

mod analysis;
mod cloudwatch;
mod config;
mod datadog;
mod deployment;
mod embedded;
mod failure;
pub mod field_managers;
mod fleet;
mod image_policy;
mod influxdb;
mod metric_provider;
mod names;
mod newrelic;
mod next_environment;
pub mod packed_meta;
mod source;
mod statefulset;
pub mod status_paths;
mod traffic;
mod view;

pub use analysis::*;
pub use cloudwatch::*;
pub use config::*;
pub use datadog::*;
pub use deployment::*;
pub use embedded::Embedded;
pub use failure::*;
pub use fleet::*;
pub use image_policy::*;
pub use influxdb::*;
pub use metric_provider::*;
pub use names::WireName;
pub use newrelic::*;
pub use next_environment::*;
pub use packed_meta::{PackedMeta, PacksMeta};
pub use source::*;
pub use statefulset::*;
pub use traffic::*;
pub use view::RolloutView;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResourceExt;

/// The API group of linnet's kinds.
pub const GROUP: &str = "rollouts.linnet.dev";
/// The API version of linnet's kinds.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of linnet's kinds.
pub const API_VERSION: &str = "rollouts.linnet.dev/v1alpha1";

/// Set to `"true"` (by a merged pull request) to promote a canary waiting for a human.
pub const PROMOTE_ANNOTATION: &str = "rollouts.linnet.dev/promote";
/// Set to `"true"` to abort a canary and roll back.
pub const ABORT_ANNOTATION: &str = "rollouts.linnet.dev/abort";

/// Label on every object linnet applies from Git.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "linnet";
/// Label naming the source (a linnet agent's `--source-name`) an object came from; pruning only
/// ever considers objects of its own source.
pub const SOURCE_LABEL: &str = "rollouts.linnet.dev/source";
/// On an object in the cluster: a source may take it over although another source (or no
/// source) applied it.
pub const ADOPT_ANNOTATION: &str = "rollouts.linnet.dev/adopt";
/// Annotation with the object's file in the repository, relative to the spec path.
pub const SOURCE_PATH_ANNOTATION: &str = "rollouts.linnet.dev/source-path";
/// Annotation with the Git revision the object was last applied from.
pub const REVISION_ANNOTATION: &str = "rollouts.linnet.dev/revision";

/// Annotation on a rollout with the hash of its spec as the sync applied it from Git
/// ([`spec_hash`]). A rollout whose spec no longer has that hash was edited in the cluster;
/// its controller does not act on it, and the sync puts Git's spec back.
pub const SPEC_HASH_ANNOTATION: &str = "rollouts.linnet.dev/spec-hash";

/// The hash of a rollout's spec as its Rust type reads it: the API server's defaults and
/// the serde defaults agree, so Git's spec and the same spec read back from the cluster hash
/// alike.
pub fn spec_hash<S: serde::Serialize>(spec: &S) -> String {
    spec_stamp(spec, true)
}

/// What a spec hash taken without `replicas` starts with: Git left the count out, and
/// `/scale` sets it (a HorizontalPodAutoscaler, `kubectl scale`), so it is not Git's to keep.
pub const SCALED_SPEC_PREFIX: &str = "scaled:";

/// The hash of a rollout's spec ([`spec_hash`]), taken without `replicas` (and marked
/// [`SCALED_SPEC_PREFIX`]) when Git leaves the count out (`replicas_from_git` false).
pub fn spec_stamp<S: serde::Serialize>(spec: &S, replicas_from_git: bool) -> String {
    let mut value = serde_json::to_value(spec).unwrap_or_default();
    if replicas_from_git {
        return crate::hash::content_hash(&value);
    }
    if let Some(fields) = value.as_object_mut() {
        fields.remove("replicas");
    }
    format!("{SCALED_SPEC_PREFIX}{}", crate::hash::content_hash(&value))
}

/// Whether a spec stamp ([`spec_stamp`]) counts `replicas` as Git's.
pub fn stamp_counts_replicas(stamp: Option<&str>) -> bool {
    !stamp.is_some_and(|s| s.starts_with(SCALED_SPEC_PREFIX))
}

/// Label on every object a rollout creates (sets, claims, Jobs, and the volumes it hands
/// over), naming the rollout; StatefulSets put it on their claims too.
pub const ROLLOUT_LABEL: &str = "rollouts.linnet.dev/rollout";
/// Label that tells the two versions of a batched rollout apart.
pub const VERSION_LABEL: &str = "rollouts.linnet.dev/version";
/// The label selector of every pod of rollout `name` (stable and canary), as the `/scale`
/// subresource gives it to a HorizontalPodAutoscaler.
pub fn pods_selector(name: &str) -> String {
    format!("{ROLLOUT_LABEL}={name}")
}
/// Label on the objects a rollout controller creates, naming the source of their rollout, so
/// that an agent watches only its own children. It is deliberately not [`SOURCE_LABEL`]: that
/// label marks what was applied from Git, the only objects prune may delete.
pub const ROLLOUT_SOURCE_LABEL: &str = "rollouts.linnet.dev/rollout-source";
/// Label on volumes linnet has handed over: the namespace of the rollout that owns the data
/// (for people and `kubectl get pv -l`; linnet finds volumes through their claims).
pub const VOLUME_NAMESPACE_LABEL: &str = "rollouts.linnet.dev/namespace";
/// Label on a rollout's StatefulSets and their pods: `stable`, `canary` or `single`.
pub const ROLE_LABEL: &str = "rollouts.linnet.dev/role";
/// Annotation with the hash of what linnet last applied to a child object; equal hashes mean
/// nothing to write.
pub const CHILD_HASH_ANNOTATION: &str = "rollouts.linnet.dev/child-hash";
/// Annotation on a PersistentVolume during a handoff: the claim it is being handed to.
pub const HANDOFF_TO_ANNOTATION: &str = "rollouts.linnet.dev/handoff-to";
/// Annotation on a claim a handoff has pointed a volume at: the volume's name. Writing it
/// is an update of the claim, which makes the PV controller bind the two at once instead of
/// at its next resync (about 15 s).
pub const BIND_REQUESTED_ANNOTATION: &str = "rollouts.linnet.dev/bind-volume";
/// The finalizer that scales a rollout's sets down before they are deleted.
pub const FINALIZER: &str = "rollouts.linnet.dev/cleanup";

/// The condition types on both kinds, per the kstatus conventions that Flux health checks,
/// kpt and `kubectl wait --for=condition=Ready` read.
pub mod condition {
    /// True only when the rollout has settled with every replica ready on the intended image.
    pub const READY: &str = "Ready";
    /// True while the rollout works towards what Git asks for (a canary, a batch, a rollback,
    /// pods starting).
    pub const RECONCILING: &str = "Reconciling";
    /// True when the rollout cannot go on without a change in Git (rolled back, failed, or an
    /// action the API server refuses).
    pub const STALLED: &str = "Stalled";
    /// True while a replica's claim is on another volume than the one recorded for it while
    /// Stable: its pod started on a new, empty volume (the claim was deleted with its pod).
    pub const VOLUME_REPLACED: &str = "VolumeReplaced";
}

/// The CustomResourceDefinitions of every linnet kind.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        CanaryStatefulSet::crd(),
        CanaryDeployment::crd(),
        LinnetSource::crd(),
        AnalysisTemplate::crd(),
    ]
}

/// The CRDs as one multi-document YAML stream, as checked in under `deploy/crds/`.
pub fn crds_yaml() -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::from("# Generated by `linnet crds`. Do not edit; run `make crds`.\n");
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

/// Schema for an embedded Kubernetes object (a pod template, a workload spec) that linnet
/// checks itself when it loads a spec, instead of repeating the whole upstream schema in the
/// CRD. This keeps the CRDs small enough for client-side `kubectl apply`.
pub(crate) fn embedded_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Finds a condition by type.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}
