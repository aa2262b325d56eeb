//! What `linnet doctor` makes of what it saw: pure judgements, each a [`Finding`] that says
//! what to do, tested without a cluster.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One check's result: one line, with what to do when it is not ok.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub check: &'static str,
    pub verdict: Verdict,
    pub says: String,
}

impl Finding {
    pub fn ok(check: &'static str, says: impl Into<String>) -> Finding {
        Finding {
            check,
            verdict: Verdict::Ok,
            says: says.into(),
        }
    }

    pub fn warn(check: &'static str, says: impl Into<String>) -> Finding {
        Finding {
            check,
            verdict: Verdict::Warn,
            says: says.into(),
        }
    }

    pub fn fail(check: &'static str, says: impl Into<String>) -> Finding {
        Finding {
            check,
            verdict: Verdict::Fail,
            says: says.into(),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = match self.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{mark} {}: {}", self.check, self.says)
    }
}

/// Where linnet's CRDs come from, for advice.
const APPLY_CRDS: &str = "kubectl apply --server-side -f deploy/crds/crds.yaml of this release (the \
     Helm chart installs them too; `helm upgrade` does not update CRDs)";

/// Past this, Leases (15 s) and analysis windows go wrong.
const CLOCK_WARN_SECS: i64 = 5;
const CLOCK_FAIL_SECS: i64 = 30;

/// The clock of this machine against the API server's (`skew`: theirs minus ours).
pub fn judge_clock(skew: jiff::SignedDuration) -> Finding {
    let secs = skew.as_secs().abs();
    let says = format!(
        "this machine's clock is {}s {} the API server's",
        secs,
        if skew.is_negative() {
            "ahead of"
        } else {
            "behind"
        }
    );
    let fix = "; set up NTP on the nodes (a Lease is 15 s, and an analysis window counts \
               on agreeing clocks)";
    match secs {
        s if s >= CLOCK_FAIL_SECS => Finding::fail("clock", format!("{says}{fix}")),
        s if s >= CLOCK_WARN_SECS => Finding::warn("clock", format!("{says}{fix}")),
        _ => Finding::ok("clock", "within 5 s of the API server's"),
    }
}

/// The time an HTTP `Date` header says (`Thu, 03 Dec 2026 09:13:16 GMT`).
pub fn http_date(value: &str) -> Option<jiff::Timestamp> {
    jiff::fmt::rfc2822::parse(value).ok().map(|z| z.timestamp())
}

/// Every field path a schema declares (`spec.replicas`, `spec.steps[].weight`).
pub fn field_paths(schema: &JSONSchemaProps) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    add_paths("", schema, 0, &mut out);
    out
}

/// Deeper than any of linnet's schemas; a bound on a schema read from the cluster.
const MAX_SCHEMA_DEPTH: usize = 32;

fn add_paths(prefix: &str, schema: &JSONSchemaProps, depth: usize, out: &mut BTreeSet<String>) {
    if depth > MAX_SCHEMA_DEPTH {
        return;
    }
    for (name, child) in schema.properties.iter().flatten() {
        let path = match prefix {
            "" => name.clone(),
            _ => format!("{prefix}.{name}"),
        };
        out.insert(path.clone());
        add_paths(&path, child, depth + 1, out);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
        add_paths(&format!("{prefix}[]"), items, depth + 1, out);
    }
}

fn schema_of(crd: &CustomResourceDefinition, version: &str) -> Option<JSONSchemaProps> {
    crd.spec
        .versions
        .iter()
        .find(|v| v.name == version && v.served)
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.clone())
}

/// A few of `paths`, for a message.
fn some_of(paths: &BTreeSet<&String>) -> String {
    let shown: Vec<&str> = paths.iter().take(3).map(|p| p.as_str()).collect();
    let more = paths.len().saturating_sub(shown.len());
    match more {
        0 => shown.join(", "),
        n => format!("{} and {n} more", shown.join(", ")),
    }
}

/// The CRD installed as `name` against this binary's (`wanted`): missing, not serving its
/// version, older (fields this linnet writes are dropped by the API server), or newer.
pub fn judge_crd(
    installed: Option<&CustomResourceDefinition>,
    wanted: &CustomResourceDefinition,
) -> Finding {
    let name = wanted.metadata.name.clone().unwrap_or_default();
    let Some(installed) = installed else {
        return Finding::fail("crd", format!("{name} is not installed: {APPLY_CRDS}"));
    };
    for version in wanted.spec.versions.iter().filter(|v| v.served) {
        let Some(theirs) = schema_of(installed, &version.name) else {
            return Finding::fail(
                "crd",
                format!("{name} does not serve {}: {APPLY_CRDS}", version.name),
            );
        };
        let ours = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .map(field_paths)
            .unwrap_or_default();
        let theirs = field_paths(&theirs);
        let missing: BTreeSet<&String> = ours.difference(&theirs).collect();
        if !missing.is_empty() {
            return Finding::fail(
                "crd",
                format!(
                    "{name} is older than this linnet: it lacks {} field(s) ({}), which the API \
                     server drops from every object written; {APPLY_CRDS}",
                    missing.len(),
                    some_of(&missing)
                ),
            );
        }
        let unknown: BTreeSet<&String> = theirs.difference(&ours).collect();
        if !unknown.is_empty() {
            return Finding::warn(
                "crd",
                format!(
                    "{name} is newer than this linnet ({} field(s) it does not know: {}): run the \
                     linnet of the release that installed it",
                    unknown.len(),
                    some_of(&unknown)
                ),
            );
        }
    }
    Finding::ok("crd", format!("{name} as this linnet's"))
}

/// The agent's Deployment: a replica Ready, and on which image. With leader election only the
/// Lease holder is Ready (the standby gets no webhooks), so one Ready replica is the healthy
/// state, not one short.
pub fn judge_agent(d: &Deployment) -> Finding {
    let namespace = d.metadata.namespace.as_deref().unwrap_or_default();
    let name = d.metadata.name.as_deref().unwrap_or_default();
    let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = d
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let image = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    if ready > 0 {
        return Finding::ok(
            "agent",
            format!(
                "{namespace}/{name}: {ready} of {wanted} replica(s) Ready, image {image} (only \
                 the Lease holder is Ready; the others stand by)"
            ),
        );
    }
    Finding::warn(
        "agent",
        format!(
            "{namespace}/{name}: none of {wanted} replica(s) Ready (image {image}): `kubectl \
             -n {namespace} describe deploy/{name}` and its pods' events say why"
        ),
    )
}

/// Why a container cannot start for its image, as the kubelet says.
const IMAGE_PULL_REASONS: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// Each container of `pods` that waits for an image the node cannot pull: `(pod, image,
/// the kubelet's message)`.
pub fn image_pull_failures(pods: &[Pod]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for pod in pods {
        let name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        let status = pod.status.as_ref();
        let containers = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .chain(status.and_then(|s| s.init_container_statuses.as_ref()))
            .flatten();
        for c in containers {
            let Some(waiting) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
                continue;
            };
            if IMAGE_PULL_REASONS.contains(&waiting.reason.as_deref().unwrap_or_default()) {
                let message = waiting
                    .message
                    .clone()
                    .or_else(|| waiting.reason.clone())
                    .unwrap_or_default();
                out.push((name.clone(), c.image.clone(), message));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_is_judged_by_how_far_it_is_off_either_way() {
        let secs = jiff::SignedDuration::from_secs;
        assert_eq!(judge_clock(secs(2)).verdict, Verdict::Ok);
        let behind = judge_clock(secs(7));
        assert_eq!(behind.verdict, Verdict::Warn);
        assert!(behind.says.contains("7s behind"), "{}", behind.says);
        let ahead = judge_clock(secs(-45));
        assert_eq!(ahead.verdict, Verdict::Fail);
        assert!(ahead.says.contains("45s ahead of"), "{}", ahead.says);
    }

    #[test]
    fn an_http_date_is_read_as_the_api_server_sends_it() {
        let t = http_date("Thu, 03 Dec 2026 09:13:16 GMT").unwrap();
        assert_eq!(t.to_string(), "2026-12-03T09:13:16Z");
        assert_eq!(http_date("yesterday"), None);
    }

    fn crd_with(fields: serde_json::Value) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "things.rollouts.linnet.dev"},
            "spec": {
                "group": "rollouts.linnet.dev", "scope": "Namespaced",
                "names": {"plural": "things", "kind": "Thing"},
                "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": fields}}}}}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_crd_is_older_newer_missing_or_as_this_linnets() {
        let ours = crd_with(serde_json::json!({
            "replicas": {"type": "integer"},
            "steps": {"type": "array", "items": {"type": "object", "properties": {
                "weight": {"type": "integer"}}}}
        }));
        assert_eq!(judge_crd(Some(&ours), &ours).verdict, Verdict::Ok);
        let older = crd_with(serde_json::json!({"replicas": {"type": "integer"}}));
        let f = judge_crd(Some(&older), &ours);
        assert_eq!(f.verdict, Verdict::Fail);
        assert!(f.says.contains("older than this linnet"), "{}", f.says);
        assert!(f.says.contains("spec.steps[].weight"), "{}", f.says);
        let f = judge_crd(Some(&ours), &older);
        assert_eq!(f.verdict, Verdict::Warn);
        assert!(f.says.contains("newer than this linnet"), "{}", f.says);
        let f = judge_crd(None, &ours);
        assert_eq!(f.verdict, Verdict::Fail);
        assert!(f.says.contains("is not installed"), "{}", f.says);
    }

    #[test]
    fn a_container_waiting_for_an_image_it_cannot_pull_is_named() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "linnet-1", "namespace": "linnet-system"},
            "status": {"containerStatuses": [
                {"name": "linnet", "image": "ghcr.io/x/linnet:nope", "imageID": "", "ready": false,
                 "restartCount": 0,
                 "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}},
                {"name": "ok", "image": "busybox", "imageID": "", "ready": true,
                 "restartCount": 0, "state": {"running": {}}}
            ]}
        }))
        .unwrap();
        assert_eq!(
            image_pull_failures(&[pod]),
            [(
                "linnet-system/linnet-1".to_string(),
                "ghcr.io/x/linnet:nope".to_string(),
                "not found".to_string()
            )]
        );
    }
}
