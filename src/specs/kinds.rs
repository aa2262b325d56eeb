//! The kinds a Kubernetes 1.36 API server serves, and linnet's own: an `apiVersion` of a
//! built-in group that 1.36 does not serve (`apps/v1beta1`, removed in 1.16), a kind it does
//! not have (`kind: Servic`), or linnet's group misspelt (`rollouts.linnet.io`) is refused at
//! its line, as the API server would refuse it at apply time with no file or line. Groups of
//! other projects (CRDs) are not judged here.

use crate::api::{API_VERSION, GROUP};

/// Every (apiVersion, kind) a default Kubernetes 1.36 API server serves, from its discovery
/// (`tests/sync.rs` compares the two on the test control plane).
pub const BUILT_IN_KINDS: &[(&str, &str)] = &[
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy"),
    (
        "admissionregistration.k8s.io/v1",
        "MutatingAdmissionPolicyBinding",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
    ),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("apiregistration.k8s.io/v1", "APIService"),
    ("apps/v1", "ControllerRevision"),
    ("apps/v1", "DaemonSet"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "StatefulSet"),
    ("authentication.k8s.io/v1", "SelfSubjectReview"),
    ("authentication.k8s.io/v1", "TokenReview"),
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"),
    ("authorization.k8s.io/v1", "SubjectAccessReview"),
    ("autoscaling/v1", "HorizontalPodAutoscaler"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("batch/v1", "CronJob"),
    ("batch/v1", "Job"),
    ("certificates.k8s.io/v1", "CertificateSigningRequest"),
    ("coordination.k8s.io/v1", "Lease"),
    ("discovery.k8s.io/v1", "EndpointSlice"),
    ("events.k8s.io/v1", "Event"),
    ("flowcontrol.apiserver.k8s.io/v1", "FlowSchema"),
    (
        "flowcontrol.apiserver.k8s.io/v1",
        "PriorityLevelConfiguration",
    ),
    ("networking.k8s.io/v1", "IPAddress"),
    ("networking.k8s.io/v1", "Ingress"),
    ("networking.k8s.io/v1", "IngressClass"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("networking.k8s.io/v1", "ServiceCIDR"),
    ("node.k8s.io/v1", "RuntimeClass"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("resource.k8s.io/v1", "DeviceClass"),
    ("resource.k8s.io/v1", "ResourceClaim"),
    ("resource.k8s.io/v1", "ResourceClaimTemplate"),
    ("resource.k8s.io/v1", "ResourceSlice"),
    ("scheduling.k8s.io/v1", "PriorityClass"),
    ("storage.k8s.io/v1", "CSIDriver"),
    ("storage.k8s.io/v1", "CSINode"),
    ("storage.k8s.io/v1", "CSIStorageCapacity"),
    ("storage.k8s.io/v1", "StorageClass"),
    ("storage.k8s.io/v1", "VolumeAttachment"),
    ("storage.k8s.io/v1", "VolumeAttributesClass"),
    ("v1", "Binding"),
    ("v1", "ComponentStatus"),
    ("v1", "ConfigMap"),
    ("v1", "Endpoints"),
    ("v1", "Event"),
    ("v1", "LimitRange"),
    ("v1", "Namespace"),
    ("v1", "Node"),
    ("v1", "PersistentVolume"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Pod"),
    ("v1", "PodTemplate"),
    ("v1", "ReplicationController"),
    ("v1", "ResourceQuota"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
];

/// linnet's kinds, all of `rollouts.linnet.dev/v1alpha1`.
pub const LINNET_KINDS: &[&str] = &[
    "CanaryStatefulSet",
    "CanaryDeployment",
    "AnalysisTemplate",
    "LinnetSource",
];

/// Which field is wrong, and why; `None` when the kind is served, or belongs to a group this
/// check does not know.
pub fn kind_problem(api_version: &str, kind: &str) -> Option<(&'static str, String)> {
    let group = group_of(api_version);
    if group == GROUP || near(group, GROUP) {
        return linnet_kind_problem(api_version, kind);
    }
    let of_group = BUILT_IN_KINDS
        .iter()
        .copied()
        .filter(|(gv, _)| group_of(gv) == group);
    judge(api_version, kind, of_group, "Kubernetes 1.36")
}

/// The group of an `apiVersion` (`""` for the core group's `v1`).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// Why `server`, which serves `of_group` (the apiVersion and kind pairs of `api_version`'s
/// group), refuses `kind` in `api_version`; `None` when it serves it, or knows the group not.
fn judge<'a>(
    api_version: &str,
    kind: &str,
    of_group: impl Iterator<Item = (&'a str, &'a str)>,
    server: &str,
) -> Option<(&'static str, String)> {
    let of_group: Vec<(&str, &str)> = of_group.collect();
    if of_group.is_empty() || of_group.contains(&(api_version, kind)) {
        return None;
    }
    let served: Vec<&str> = of_group
        .iter()
        .filter(|(_, k)| *k == kind)
        .map(|(gv, _)| *gv)
        .collect();
    if !served.is_empty() {
        let served = served.join(" or ");
        let why = format!("{api_version} is not served by {server}; {kind} is {served}");
        return Some(("apiVersion", why));
    }
    let versions: std::collections::BTreeSet<&str> = of_group.iter().map(|(gv, _)| *gv).collect();
    if !versions.contains(api_version) {
        let versions: Vec<&str> = versions.into_iter().collect();
        let why = format!(
            "{api_version} is not served by {server} (its versions of this group: {})",
            versions.join(", ")
        );
        return Some(("apiVersion", why));
    }
    let kinds = of_group
        .iter()
        .filter(|(gv, _)| *gv == api_version)
        .map(|(_, k)| *k);
    Some(("kind", unknown_kind(api_version, kind, kinds)))
}

fn linnet_kind_problem(api_version: &str, kind: &str) -> Option<(&'static str, String)> {
    if api_version != API_VERSION {
        return Some((
            "apiVersion",
            format!("{api_version} is not linnet's API; it is {API_VERSION}"),
        ));
    }
    if LINNET_KINDS.contains(&kind) {
        return None;
    }
    Some((
        "kind",
        unknown_kind(api_version, kind, LINNET_KINDS.iter().copied()),
    ))
}

fn unknown_kind<'a>(api_version: &str, kind: &str, kinds: impl Iterator<Item = &'a str>) -> String {
    let closest = kinds
        .map(|k| (distance(&k.to_lowercase(), &kind.to_lowercase()), k))
        .min();
    match closest {
        Some((d, k)) if d <= 3 => format!("{api_version} has no kind {kind}; did you mean {k}?"),
        _ => format!("{api_version} has no kind {kind}"),
    }
}

/// Whether `group` looks like a misspelling of `of` (the same first label, a close rest).
fn near(group: &str, of: &str) -> bool {
    group != of && group.split('.').next() == of.split('.').next() && distance(group, of) <= 4
}

/// The Levenshtein distance between two short strings.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (previous + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(here + 1);
            previous = here;
        }
    }
    row[b.len()]
}

/// The kinds CustomResourceDefinitions serve: those in the repository and in `--crds DIR`,
/// for `validate` to judge other projects' groups by.
#[derive(Clone, Debug, Default)]
pub struct CrdKinds {
    groups: std::collections::BTreeSet<String>,
    served: std::collections::BTreeSet<(String, String)>,
}

impl CrdKinds {
    /// Adds what the CRD `crd` (as JSON) serves: each served version of its kind.
    pub fn add(&mut self, crd: &serde_json::Value) {
        let spec = &crd["spec"];
        let (Some(group), Some(kind)) = (spec["group"].as_str(), spec["names"]["kind"].as_str())
        else {
            return;
        };
        self.groups.insert(group.to_string());
        for version in spec["versions"].as_array().into_iter().flatten() {
            if version["served"].as_bool() == Some(false) {
                continue;
            }
            if let Some(name) = version["name"].as_str() {
                self.served
                    .insert((format!("{group}/{name}"), kind.to_string()));
            }
        }
    }

    /// The CRDs among `set`'s objects.
    pub fn of(set: &super::SpecSet) -> CrdKinds {
        let mut kinds = CrdKinds::default();
        for o in set.objects.values() {
            if o.key.kind == "CustomResourceDefinition" {
                kinds.add(&o.spec.to_json());
            }
        }
        kinds
    }

    /// Why a CRD group's kind is not served (`None` when it is, or when no CRD here declares
    /// the group).
    pub fn problem(&self, api_version: &str, kind: &str) -> Option<(&'static str, String)> {
        if !self.knows_group_of(api_version) {
            return None;
        }
        let group = group_of(api_version);
        let mut of_group = self
            .served
            .iter()
            .filter(|(gv, _)| group_of(gv) == group)
            .map(|(gv, k)| (gv.as_str(), k.as_str()))
            .peekable();
        if of_group.peek().is_none() {
            let why = format!("{api_version}: the CRDs of {group} here serve no version");
            return Some(("apiVersion", why));
        }
        judge(api_version, kind, of_group, "its CRD")
    }

    /// Whether a CRD here declares `api_version`'s group.
    pub fn knows_group_of(&self, api_version: &str) -> bool {
        api_version.contains('/') && self.groups.contains(group_of(api_version))
    }
}

impl super::SpecSet {
    /// Blocks the files of objects whose kind a CRD of `crds` declares the group of but does
    /// not serve, as the API server would refuse them. Returns the objects of groups that
    /// neither Kubernetes, linnet nor any CRD here declares: not judged.
    pub fn block_kinds_crds_do_not_serve(&mut self, crds: &CrdKinds) -> Vec<String> {
        let mut broken = Vec::new();
        let mut unjudged = Vec::new();
        for o in self.objects.values() {
            let (version, kind) = (o.key.api_version.as_str(), o.key.kind.as_str());
            if let Some((_, message)) = crds.problem(version, kind) {
                broken.push(super::SpecError {
                    location: o.location.clone(),
                    message,
                });
            } else if !crds.knows_group_of(version) && !is_known_group(version) {
                unjudged.push(format!("{version} {kind}"));
            }
        }
        self.block_files(broken);
        self.errors.sort();
        unjudged.sort();
        unjudged.dedup();
        unjudged
    }
}

/// Whether `api_version`'s group is Kubernetes' own or linnet's.
fn is_known_group(api_version: &str) -> bool {
    let group = group_of(api_version);
    group == GROUP || BUILT_IN_KINDS.iter().any(|(gv, _)| group_of(gv) == group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_1_36_api_server_would_refuse_is_named() {
        let (field, m) = kind_problem("apps/v1beta1", "Deployment").unwrap();
        assert_eq!(field, "apiVersion");
        assert!(m.contains("Deployment is apps/v1"), "{m}");
        let (field, m) = kind_problem("v1", "Servic").unwrap();
        assert_eq!(field, "kind");
        assert!(m.contains("did you mean Service?"), "{m}");
        let (field, m) = kind_problem("rollouts.linnet.io/v1alpha1", "CanaryDeployment").unwrap();
        assert_eq!(field, "apiVersion");
        assert!(m.contains("rollouts.linnet.dev/v1alpha1"), "{m}");
        let (_, m) = kind_problem("rollouts.linnet.dev/v1alpha1", "CanaryStatefulset").unwrap();
        assert!(m.contains("did you mean CanaryStatefulSet?"), "{m}");
        assert!(kind_problem("rollouts.linnet.dev/v1", "CanaryDeployment").is_some());
        assert!(kind_problem("v2", "ConfigMap").is_some());
        assert!(kind_problem("apps/v1", "Frobnicator").is_some());
    }

    #[test]
    fn served_kinds_and_other_projects_groups_pass() {
        for (v, k) in [
            ("v1", "Service"),
            ("apps/v1", "Deployment"),
            ("autoscaling/v1", "HorizontalPodAutoscaler"),
            ("autoscaling/v2", "HorizontalPodAutoscaler"),
            ("rollouts.linnet.dev/v1alpha1", "AnalysisTemplate"),
            ("cert-manager.io/v1", "Certificate"),
            ("gateway.networking.k8s.io/v1", "HTTPRoute"),
            ("gateway.networking.k8s.io/v1", "GRPCRoute"),
            ("argoproj.io/v1alpha1", "Rollout"),
        ] {
            assert_eq!(kind_problem(v, k), None, "{v} {k}");
        }
    }

    #[test]
    fn a_crds_kinds_and_versions_are_judged_by_the_crd() {
        let mut crds = CrdKinds::default();
        crds.add(&serde_json::json!({"spec": {
            "group": "cert-manager.io",
            "names": {"kind": "Certificate"},
            "versions": [{"name": "v1", "served": true}, {"name": "v1alpha2", "served": false}],
        }}));
        assert_eq!(crds.problem("cert-manager.io/v1", "Certificate"), None);
        let (field, m) = crds
            .problem("cert-manager.io/v1alpha2", "Certificate")
            .unwrap();
        assert_eq!(field, "apiVersion");
        assert!(m.contains("Certificate is cert-manager.io/v1"), "{m}");
        let (_, m) = crds.problem("cert-manager.io/v1", "Certificat").unwrap();
        assert!(m.contains("did you mean Certificate?"), "{m}");
        assert_eq!(crds.problem("acme.example/v1", "Thing"), None);
        crds.add(&serde_json::json!({"spec": {
            "group": "old.example",
            "names": {"kind": "Gone"},
            "versions": [{"name": "v1", "served": false}],
        }}));
        let (field, m) = crds.problem("old.example/v1", "Gone").unwrap();
        assert_eq!(field, "apiVersion");
        assert!(m.contains("serve no version"), "{m}");
        assert!(!crds.knows_group_of("acme.example/v1"));
    }
}
