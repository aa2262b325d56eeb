//! What a source may apply: the operator's policy (flags), never the repository's. Pure: the
//! loader checks every object against it, so `linnet validate`, `linnet diff` and the agent
//! give the same located errors; the sync checks what only the cluster knows (a kind's scope,
//! who owns an existing object).

use crate::api::{
    BIND_REQUESTED_ANNOTATION, CHILD_HASH_ANNOTATION, HANDOFF_TO_ANNOTATION, ROLE_LABEL,
    ROLLOUT_LABEL, ROLLOUT_SOURCE_LABEL, VOLUME_NAMESPACE_LABEL,
};

/// Namespaces closed to every source unless `--allow-namespace` names them.
pub const DEFAULT_DENIED_NAMESPACES: &[&str] = &["kube-system", "kube-public", "kube-node-lease"];

/// Kinds never applied from Git, whatever the policy: only the volume handoff changes a
/// volume's `claimRef` or reclaim policy, and only for volumes bound to a rollout's own claims.
const NEVER_FROM_GIT: &[(&str, &str)] = &[("", "PersistentVolume")];

/// Labels and annotations by which linnet's controllers find and steer what they made. An
/// object from Git carrying one could pass for a rollout's claim or volume.
const CONTROLLER_MARKS: &[&str] = &[
    ROLLOUT_LABEL,
    ROLLOUT_SOURCE_LABEL,
    ROLE_LABEL,
    VOLUME_NAMESPACE_LABEL,
    CHILD_HASH_ANNOTATION,
    HANDOFF_TO_ANNOTATION,
    BIND_REQUESTED_ANNOTATION,
    // Put on by a person with rights on the object, never by the repository.
    crate::sync::diff::ADOPT_ANNOTATION,
];

/// The namespaces and cluster-scoped kinds a source may apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Namespaces objects may be in; empty allows any that is not denied.
    pub allowed_namespaces: Vec<String>,
    /// Namespaces objects may not be in, unless `allowed_namespaces` names them.
    pub denied_namespaces: Vec<String>,
    /// Cluster-scoped kinds the source may apply (e.g. `Namespace`); empty allows none.
    pub cluster_kinds: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            allowed_namespaces: Vec::new(),
            denied_namespaces: DEFAULT_DENIED_NAMESPACES
                .iter()
                .map(|n| n.to_string())
                .collect(),
            cluster_kinds: Vec::new(),
        }
    }
}

impl Policy {
    /// Why objects may not be in `namespace`, if they may not.
    pub fn namespace_refusal(&self, namespace: &str) -> Option<String> {
        if self.allowed_namespaces.iter().any(|n| n == namespace) {
            return None;
        }
        if !self.allowed_namespaces.is_empty() {
            return Some(format!(
                "namespace {namespace:?} is not allowed for this agent; allowed: {}",
                self.allowed_namespaces.join(", ")
            ));
        }
        self.denied_namespaces
            .iter()
            .any(|n| n == namespace)
            .then(|| {
                format!(
                    "namespace {namespace:?} is closed to this source (--deny-namespace: {}); \
                     a cluster admin opens it with --allow-namespace {namespace}",
                    self.denied_namespaces.join(", ")
                )
            })
    }

    /// Why a cluster-scoped object of `kind` may not be applied, if it may not.
    pub fn cluster_kind_refusal(&self, kind: &str) -> Option<String> {
        if self.cluster_kinds.iter().any(|k| k == kind) {
            return None;
        }
        Some(format!(
            "{kind} is cluster-scoped, and this source may apply {}; a cluster admin allows it \
             with --allow-cluster-kind {kind}",
            if self.cluster_kinds.is_empty() {
                "no cluster-scoped kinds".to_string()
            } else {
                format!("only {}", self.cluster_kinds.join(", "))
            }
        ))
    }
}

/// Why `kind` (in API `group`) is never applied from Git, if it is not.
pub fn never_from_git(group: &str, kind: &str) -> Option<String> {
    NEVER_FROM_GIT
        .iter()
        .any(|(g, k)| *g == group && *k == kind)
        .then(|| {
            format!(
                "{kind}s are never applied from Git: only linnet's volume handoff changes a \
                 volume, and only for volumes bound to a rollout's own claims; let a \
                 StorageClass provision volumes, or have a cluster admin create them"
            )
        })
}

/// The first label or annotation key in `keys` that linnet's controllers use to recognise
/// their own objects.
pub fn controller_mark<'a>(keys: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    keys.into_iter().find(|k| CONTROLLER_MARKS.contains(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_namespaces_are_closed_by_default() {
        let p = Policy::default();
        for ns in ["kube-system", "kube-public", "kube-node-lease"] {
            assert!(p.namespace_refusal(ns).is_some(), "{ns}");
        }
        assert_eq!(p.namespace_refusal("shop"), None);
    }

    #[test]
    fn an_allowed_namespace_opens_a_denied_one() {
        let p = Policy {
            allowed_namespaces: vec!["kube-system".into()],
            ..Policy::default()
        };
        assert_eq!(p.namespace_refusal("kube-system"), None);
        assert!(
            p.namespace_refusal("shop").is_some(),
            "outside the allow-list"
        );
    }

    #[test]
    fn no_cluster_scoped_kind_by_default() {
        let p = Policy::default();
        let e = p.cluster_kind_refusal("ClusterRoleBinding").unwrap();
        assert!(e.contains("--allow-cluster-kind ClusterRoleBinding"), "{e}");
        let p = Policy {
            cluster_kinds: vec!["Namespace".into()],
            ..Policy::default()
        };
        assert_eq!(p.cluster_kind_refusal("Namespace"), None);
        assert!(p.cluster_kind_refusal("ClusterRole").is_some());
    }

    #[test]
    fn persistent_volumes_never_come_from_git() {
        assert!(never_from_git("", "PersistentVolume").is_some());
        assert_eq!(never_from_git("", "PersistentVolumeClaim"), None);
        assert_eq!(never_from_git("example.com", "PersistentVolume"), None);
    }

    #[test]
    fn controller_marks_are_recognised() {
        assert_eq!(controller_mark(["app", ROLLOUT_LABEL]), Some(ROLLOUT_LABEL));
        assert_eq!(controller_mark(["app", "tier"]), None);
    }
}
