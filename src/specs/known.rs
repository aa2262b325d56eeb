//! Fields the API server does not know: a typo (`portz:` in a Service, `containerz:` in a pod
//! template) that a Kubernetes type would silently drop on parse, and that the API server
//! refuses at apply time with no file or line. linnet parses each object it has a type for
//! (its own kinds with their embedded templates, and the common built-in kinds) with
//! `serde_ignored`, which reports every field the type skipped, by path.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// One field the kind's type does not have: its key path in the document (list indices as
/// numbers), the last segment being the unknown key.
pub type UnknownField = Vec<String>;

/// The unknown fields of `value`, an object of `api_version`/`kind`; empty for kinds linnet
/// has no type for (those are checked by the API server alone).
pub fn unknown_fields(api_version: &str, kind: &str, value: &Value) -> Vec<UnknownField> {
    use k8s_openapi::api::{apps, autoscaling, batch, core, networking, policy, rbac};
    macro_rules! typed {
        ($($version:literal, $kind:literal => $ty:ty;)*) => {
            match (api_version, kind) {
                $(($version, $kind) => ignored::<$ty>(value),)*
                _ => Vec::new(),
            }
        };
    }
    if api_version.starts_with(crate::api::GROUP) {
        // The loader names a linnet kind's unknown top-level field itself, with what is
        // expected there; inside `spec` its parse does (deny_unknown_fields): the templates
        // are what is left.
        let mut found = typed_linnet(api_version, kind, value);
        found.retain(|p| p.len() > 1);
        return found;
    }
    typed! {
        "v1", "Service" => core::v1::Service;
        "v1", "ConfigMap" => core::v1::ConfigMap;
        "v1", "Secret" => core::v1::Secret;
        "v1", "ServiceAccount" => core::v1::ServiceAccount;
        "v1", "PersistentVolumeClaim" => core::v1::PersistentVolumeClaim;
        "v1", "Namespace" => core::v1::Namespace;
        "v1", "Pod" => core::v1::Pod;
        "apps/v1", "Deployment" => apps::v1::Deployment;
        "apps/v1", "StatefulSet" => apps::v1::StatefulSet;
        "apps/v1", "DaemonSet" => apps::v1::DaemonSet;
        "batch/v1", "Job" => batch::v1::Job;
        "batch/v1", "CronJob" => batch::v1::CronJob;
        "networking.k8s.io/v1", "Ingress" => networking::v1::Ingress;
        "networking.k8s.io/v1", "NetworkPolicy" => networking::v1::NetworkPolicy;
        "rbac.authorization.k8s.io/v1", "Role" => rbac::v1::Role;
        "rbac.authorization.k8s.io/v1", "RoleBinding" => rbac::v1::RoleBinding;
        "rbac.authorization.k8s.io/v1", "ClusterRole" => rbac::v1::ClusterRole;
        "rbac.authorization.k8s.io/v1", "ClusterRoleBinding" => rbac::v1::ClusterRoleBinding;
        "policy/v1", "PodDisruptionBudget" => policy::v1::PodDisruptionBudget;
        "autoscaling/v2", "HorizontalPodAutoscaler" => autoscaling::v2::HorizontalPodAutoscaler;
    }
}

fn typed_linnet(api_version: &str, kind: &str, value: &Value) -> Vec<UnknownField> {
    match (api_version, kind) {
        (crate::api::API_VERSION, "CanaryStatefulSet") => {
            ignored::<crate::api::CanaryStatefulSet>(value)
        }
        (crate::api::API_VERSION, "CanaryDeployment") => {
            ignored::<crate::api::CanaryDeployment>(value)
        }
        (crate::api::API_VERSION, "AnalysisTemplate") => {
            ignored::<crate::api::AnalysisTemplate>(value)
        }
        _ => Vec::new(),
    }
}

/// Unknown fields reported per document: a file of thousands of them (a hostile repository
/// in a pull request's CI) must not cost a path copy each.
const MOST_REPORTED: usize = 20;

fn ignored<T: DeserializeOwned>(value: &Value) -> Vec<UnknownField> {
    let mut found = Vec::new();
    // A value the type cannot take at all is for the other checks (and the API server) to
    // report; only the skipped fields matter here.
    let _ = serde_ignored::deserialize::<_, _, T>(value, |path| {
        if found.len() < MOST_REPORTED {
            found.push(segments(&path));
        }
    });
    // `status` is the cluster's, never applied from Git; a custom resource's type reads
    // `apiVersion` and `kind` past its fields.
    found.retain(|p| match p.first().map(String::as_str) {
        Some("status") => false,
        Some("apiVersion" | "kind") => p.len() > 1,
        _ => true,
    });
    found
}

fn segments(path: &serde_ignored::Path<'_>) -> Vec<String> {
    use serde_ignored::Path;
    let mut out = match path {
        Path::Root => return Vec::new(),
        Path::Seq { parent, .. }
        | Path::Map { parent, .. }
        | Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => segments(parent),
    };
    match path {
        Path::Seq { index, .. } => out.push(index.to_string()),
        Path::Map { key, .. } => out.push(key.clone()),
        _ => {}
    }
    out
}

/// The message for an unknown field at `path`.
pub fn message(kind: &str, path: &[String]) -> String {
    let (field, parent) = path
        .split_last()
        .map_or(("", &[][..]), |(f, p)| (f.as_str(), p));
    let parent = if parent.is_empty() {
        "the top level".to_string()
    } else {
        parent.join(".")
    };
    format!(
        "unknown field `{field}` in {parent} of {kind}: the API server refuses it (a typo? \
         `kubectl explain {}` lists the fields)",
        explain_path(kind, parent.as_str())
    )
}

/// What to `kubectl explain` for the fields of `parent`: linnet's templates are the
/// built-in kinds' specs (the CRDs do not repeat their schema).
fn explain_path(kind: &str, parent: &str) -> String {
    let segments: Vec<&str> = parent
        .split('.')
        .filter(|s| s.parse::<usize>().is_err() && *s != "the top level")
        .collect();
    let (root, rest) = match (kind, segments.as_slice()) {
        ("CanaryDeployment", ["spec", "template", rest @ ..]) => ("deployment.spec", rest),
        ("CanaryStatefulSet", ["spec", "template", rest @ ..]) => ("statefulset.spec", rest),
        (_, ["spec", "migration", "template", rest @ ..]) => ("job", rest),
        ("AnalysisTemplate", ["spec", "metrics", "provider", "job", "spec", rest @ ..]) => {
            ("job.spec", rest)
        }
        _ => (kind, segments.as_slice()),
    };
    let mut path = root.to_ascii_lowercase();
    for segment in rest {
        path.push('.');
        path.push_str(segment);
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_in_a_service_is_found_with_its_path() {
        let service = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "labelz": {}},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "portz": 81}]},
        });
        let found = unknown_fields("v1", "Service", &service);
        assert_eq!(
            found,
            vec![
                vec!["metadata".to_string(), "labelz".into()],
                vec![
                    "spec".to_string(),
                    "ports".into(),
                    "0".into(),
                    "portz".into()
                ],
            ]
        );
        assert_eq!(
            message("Service", &found[1]),
            "unknown field `portz` in spec.ports.0 of Service: the API server refuses it (a typo? `kubectl explain service.spec.ports` lists the fields)"
        );
    }

    #[test]
    fn a_typo_in_a_rollouts_pod_template_is_found() {
        let rollout = serde_json::json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryDeployment",
            "metadata": {"name": "web"},
            "spec": {"replicas": 2, "image": "nginx", "template": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containerz": [{"name": "web", "image": "nginx"}]}}}},
        });
        let found = unknown_fields("rollouts.linnet.dev/v1alpha1", "CanaryDeployment", &rollout);
        assert_eq!(
            found,
            vec![
                ["spec", "template", "template", "spec", "containerz"]
                    .map(String::from)
                    .to_vec()
            ]
        );
    }

    #[test]
    fn a_document_of_many_unknown_fields_reports_a_bounded_number() {
        let ports: Vec<_> = (0..10_000)
            .map(|i| serde_json::json!({"port": i, "portz": i}))
            .collect();
        let service = serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web"}, "spec": {"ports": ports}});
        assert_eq!(
            unknown_fields("v1", "Service", &service).len(),
            MOST_REPORTED
        );
    }

    #[test]
    fn kinds_without_a_type_and_clean_objects_have_none() {
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "labels": {"x": "y"}}, "data": {"k": "v"}});
        assert!(unknown_fields("v1", "ConfigMap", &cm).is_empty());
        let other =
            serde_json::json!({"apiVersion": "example.com/v1", "kind": "Widget", "anything": 1});
        assert!(unknown_fields("example.com/v1", "Widget", &other).is_empty());
    }
}
