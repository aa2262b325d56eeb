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
    crate::api::ADOPT_ANNOTATION,
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
    /// Claims from Git may name their volume (`spec.volumeName`): off, a repository writer
    /// could bind any Available volume, someone else's data (`--allow-claim-volume-name`).
    pub claim_volume_names: bool,
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
            claim_volume_names: false,
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

impl Policy {
    /// Where `object` (from Git) picks a volume for a claim, with why it may not, if the
    /// policy does not allow it: a claim's `spec.volumeName` or `spec.selector` (which binds
    /// any Available volume carrying the labels, another team's too), a claim template's (a
    /// StatefulSet's `volumeClaimTemplates`, a pod's ephemeral volume), at any depth.
    pub fn claim_volume_name_refusal(
        &self,
        kind: &str,
        object: &serde_json::Value,
    ) -> Option<(Vec<String>, String)> {
        if self.claim_volume_names {
            return None;
        }
        let path = claim_volume_name_path(kind, object)?;
        let picks = match path_value(object, &path) {
            Some(volume) => format!("names volume {volume:?}"),
            None => format!(
                "selects volumes by label ({})",
                crate::text::one_line(&path_json(object, &path), 120)
            ),
        };
        Some((
            path.clone(),
            format!(
                "{} {picks}; a claim from Git may not pick its volume (it could bind another \
                 team's Available volume and its data): let the StorageClass provision one, or \
                 a cluster admin allows it with --allow-claim-volume-name",
                path.join(".")
            ),
        ))
    }
}

fn path_at<'a>(object: &'a serde_json::Value, path: &[String]) -> Option<&'a serde_json::Value> {
    let mut at = object;
    for p in path {
        at = match at {
            serde_json::Value::Array(a) => a.get(p.parse::<usize>().ok()?)?,
            other => other.get(p)?,
        };
    }
    Some(at)
}

fn path_value(object: &serde_json::Value, path: &[String]) -> Option<String> {
    path_at(object, path)?.as_str().map(String::from)
}

fn path_json(object: &serde_json::Value, path: &[String]) -> String {
    path_at(object, path)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

/// The field of a claim spec that picks its volume: a `volumeName`, else a `selector` that
/// selects anything (an empty one selects nothing more than none).
fn picking_field(spec: &serde_json::Value) -> Option<&'static str> {
    use serde_json::Value;
    if spec
        .get("volumeName")
        .is_some_and(|n| n.as_str().is_some_and(|s| !s.is_empty()))
    {
        return Some("volumeName");
    }
    let selects = |k: &str| {
        spec.get("selector")
            .and_then(|s| s.get(k))
            .is_some_and(|v| match v {
                Value::Object(m) => !m.is_empty(),
                Value::Array(a) => !a.is_empty(),
                _ => false,
            })
    };
    (selects("matchLabels") || selects("matchExpressions")).then_some("selector")
}

/// The path of the first `volumeName` or `selector` a claim (or claim template) in
/// `object` sets.
fn claim_volume_name_path(kind: &str, object: &serde_json::Value) -> Option<Vec<String>> {
    use serde_json::Value;
    let set = |v: &Value| picking_field(v).is_some();
    let field = |v: &Value| picking_field(v).unwrap_or("volumeName").to_string();
    if kind == "PersistentVolumeClaim" && object.get("spec").is_some_and(set) {
        return Some(vec!["spec".into(), field(&object["spec"])]);
    }
    fn walk(
        v: &Value,
        path: &mut Vec<String>,
        set: &dyn Fn(&Value) -> bool,
        field: &dyn Fn(&Value) -> String,
    ) -> bool {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    path.push(k.clone());
                    let claim_spec = match k.as_str() {
                        "volumeClaimTemplates" => child.as_array().and_then(|a| {
                            a.iter()
                                .enumerate()
                                .find_map(|(i, t)| t.get("spec").filter(|s| set(s)).map(|_| i))
                        }),
                        _ => None,
                    };
                    if let Some(i) = claim_spec {
                        let picking = field(&child[i]["spec"]);
                        path.extend([i.to_string(), "spec".into(), picking]);
                        return true;
                    }
                    if k == "volumeClaimTemplate" && child.get("spec").is_some_and(set) {
                        path.extend(["spec".into(), field(&child["spec"])]);
                        return true;
                    }
                    if walk(child, path, set, field) {
                        return true;
                    }
                    path.pop();
                }
                false
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    path.push(i.to_string());
                    if walk(child, path, set, field) {
                        return true;
                    }
                    path.pop();
                }
                false
            }
            _ => false,
        }
    }
    let mut path = Vec::new();
    walk(object, &mut path, &set, &field).then_some(path)
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
    fn a_claim_from_git_may_not_name_its_volume_unless_allowed() {
        // Issue 45: a plain claim could bind any Available volume by volumeName.
        use serde_json::json;
        let p = Policy::default();
        let claim = json!({"spec": {"volumeName": "pv-of-team-b"}});
        let (path, why) = p
            .claim_volume_name_refusal("PersistentVolumeClaim", &claim)
            .unwrap();
        assert_eq!(path, vec!["spec", "volumeName"]);
        assert!(
            why.contains("pv-of-team-b") && why.contains("--allow-claim-volume-name"),
            "{why}"
        );
        // The neighbours: a StatefulSet's claim template, a pod's ephemeral volume.
        let set = json!({"spec": {"volumeClaimTemplates": [
            {"metadata": {"name": "data"}, "spec": {}},
            {"metadata": {"name": "logs"}, "spec": {"volumeName": "pv-x"}}]}});
        assert_eq!(
            p.claim_volume_name_refusal("StatefulSet", &set).unwrap().0,
            vec!["spec", "volumeClaimTemplates", "1", "spec", "volumeName"]
        );
        let deploy = json!({"spec": {"template": {"spec": {"volumes": [{"name": "s",
            "ephemeral": {"volumeClaimTemplate": {"spec": {"volumeName": "pv-y"}}}}]}}}});
        assert_eq!(
            p.claim_volume_name_refusal("Deployment", &deploy)
                .unwrap()
                .0
                .join("."),
            "spec.template.spec.volumes.0.ephemeral.volumeClaimTemplate.spec.volumeName"
        );
        assert!(
            p.claim_volume_name_refusal("PersistentVolumeClaim", &json!({"spec": {}}))
                .is_none()
        );
        // Issue 70: a selector binds another team's Available volume labelled for it.
        let by_label = json!({"spec": {"selector": {"matchLabels": {"team": "victim-reserved"}}}});
        let (path, why) = p
            .claim_volume_name_refusal("PersistentVolumeClaim", &by_label)
            .unwrap();
        assert_eq!(path, vec!["spec", "selector"]);
        assert!(
            why.contains("victim-reserved") && why.contains("selects"),
            "{why}"
        );
        let by_expression = json!({"spec": {"volumeClaimTemplates": [{"spec": {"selector":
            {"matchExpressions": [{"key": "team", "operator": "In", "values": ["b"]}]}}}]}});
        assert_eq!(
            p.claim_volume_name_refusal("StatefulSet", &by_expression)
                .unwrap()
                .0
                .join("."),
            "spec.volumeClaimTemplates.0.spec.selector"
        );
        let ephemeral = json!({"spec": {"volumes": [{"ephemeral": {"volumeClaimTemplate":
            {"spec": {"selector": {"matchLabels": {"a": "b"}}}}}}]}});
        assert!(p.claim_volume_name_refusal("Pod", &ephemeral).is_some());
        // An empty selector picks nothing.
        assert!(
            p.claim_volume_name_refusal(
                "PersistentVolumeClaim",
                &json!({"spec": {"selector": {"matchLabels": {}}}})
            )
            .is_none()
        );
        let allowed = Policy {
            claim_volume_names: true,
            ..Policy::default()
        };
        assert!(
            allowed
                .claim_volume_name_refusal("PersistentVolumeClaim", &claim)
                .is_none()
        );
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
