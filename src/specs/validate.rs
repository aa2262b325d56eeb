//! Checks on linnet objects beyond their types: the CRDs' own CEL rules, evaluated offline
//! exactly as the API server would, and rules that need more than one object's fields
//! (a named container exists, the selector matches the template).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResourceExt;
use kube::core::cel::{CompiledSchema, Validator, compile_schema};
use serde_json::Value;

use crate::api::{CanaryDeployment, CanaryStatefulSet};

/// A linnet kind's CRD schema, as the API server has it, and its CEL rules compiled once:
/// compiling them for every file was a fifth of the agent's CPU in a 1,000-rollout first
/// sync (issue 77).
struct KindSchema {
    schema: Value,
    rules: CompiledSchema,
}

fn crd_schema<K: CustomResourceExt>(cell: &'static OnceLock<KindSchema>) -> &'static KindSchema {
    cell.get_or_init(|| {
        let schema = K::crd()
            .spec
            .versions
            .first()
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or(Value::Null);
        let rules = compile_schema(&schema);
        KindSchema { schema, rules }
    })
}

/// The schema of a linnet kind's CRD.
fn schema_of(kind: &str) -> Option<&'static KindSchema> {
    static STS: OnceLock<KindSchema> = OnceLock::new();
    static DEPLOY: OnceLock<KindSchema> = OnceLock::new();
    static TEMPLATE: OnceLock<KindSchema> = OnceLock::new();
    match kind {
        "AnalysisTemplate" => Some(crd_schema::<crate::api::AnalysisTemplate>(&TEMPLATE)),
        "CanaryStatefulSet" => Some(crd_schema::<CanaryStatefulSet>(&STS)),
        "CanaryDeployment" => Some(crd_schema::<CanaryDeployment>(&DEPLOY)),
        _ => None,
    }
}

/// Checks `object` against its kind's CRD as the API server does, in its order: the
/// structural schema (types, bounds, enums, required fields), then, if that passed, the CEL
/// rules. Returns `(field path, message)`.
pub fn crd_errors(kind: &str, object: &Value) -> Vec<(String, String)> {
    let Some(KindSchema { schema, rules }) = schema_of(kind) else {
        return Vec::new();
    };
    let structural: Vec<(String, String)> = super::schema::schema_errors(schema, object)
        .into_iter()
        .map(|(path, message)| (path.clone(), format!("{path}: {message}")))
        .collect();
    if !structural.is_empty() {
        return structural;
    }
    cel_errors(rules, object)
}

/// The CEL functions Kubernetes registers, made once.
static VALIDATOR: OnceLock<Validator> = OnceLock::new();

/// Evaluates the CRD's CEL validation rules against `object`.
fn cel_errors(rules: &CompiledSchema, object: &Value) -> Vec<(String, String)> {
    match VALIDATOR
        .get_or_init(Validator::new)
        .validate_compiled(rules, object, None)
    {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .into_vec()
            .into_iter()
            // Type errors are reported, better located, by the typed parse.
            .filter(|e| !e.rule.is_empty())
            .map(|e| (e.field_path, e.message))
            .collect(),
    }
}

type Problem = (Vec<&'static str>, String);

/// Checks that the template's pods have the container to roll out.
fn check_pod_template(
    template: &PodTemplateSpec,
    container: Option<&str>,
    selector: Option<&LabelSelector>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let containers = template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    if containers.is_empty() {
        problems.push((
            vec!["spec", "template", "template"],
            "template.template.spec.containers is empty; the pods need a container".into(),
        ));
    } else if let Some(name) = container
        && !containers.iter().any(|c| c.name == name)
    {
        let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
        problems.push((
            vec!["spec", "container"],
            format!(
                "container {name:?} is not in the template; its containers are: {}",
                names.join(", ")
            ),
        ));
    }
    if let Some(match_labels) = selector.and_then(|s| s.match_labels.as_ref()) {
        let empty = BTreeMap::new();
        let labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .unwrap_or(&empty);
        for (k, v) in match_labels {
            if labels.get(k) != Some(v) {
                problems.push((
                    vec!["spec", "template", "selector"],
                    format!(
                        "selector label {k}={v} is not on the pod template's labels; \
                         the workload would never find its pods"
                    ),
                ));
            }
        }
    }
    problems
}

/// Cross-field checks of a CanaryStatefulSet.
pub fn check_canary_statefulset(o: &CanaryStatefulSet) -> Vec<Problem> {
    let template = o.spec.template.get();
    let mut problems = check_pod_template(
        &template.template,
        o.spec.container.as_deref(),
        Some(&template.selector),
    );
    problems.extend(check_image(&o.spec.image));
    let two_sets = o.spec.strategy.type_ == crate::api::StatefulSetStrategyType::TwoSets;
    let (longest, why) = if two_sets {
        (
            MAX_SET_NAME - "-canary".len(),
            "its StatefulSets are NAME-stable and NAME-canary",
        )
    } else {
        (MAX_SET_NAME, "its StatefulSet is NAME")
    };
    problems.extend(check_name(
        o.metadata.name.as_deref(),
        longest,
        &format!(
            "{why}, and Kubernetes labels each of its pods with the set's name and 11 more \
             characters, at most 63"
        ),
    ));
    // A template naming a volume would hand every replica that one volume, perhaps another
    // namespace's; the handoff decides which volume a replica's claim binds.
    for t in template.volume_claim_templates.iter().flatten() {
        let picks = t.spec.as_ref().and_then(|s| {
            if s.volume_name.is_some() {
                Some("volumeName")
            } else {
                s.selector.is_some().then_some("selector")
            }
        });
        if let Some(field) = picks {
            problems.push((
                vec!["spec", "template", "volumeClaimTemplates"],
                format!(
                    "claim template {:?} sets {field}; remove it: claims get their volumes \
                     from the StorageClass, and linnet's handoff moves them between sets",
                    t.metadata.name.as_deref().unwrap_or_default()
                ),
            ));
        }
    }
    problems
}

/// Cross-field checks of a CanaryDeployment.
pub fn check_canary_deployment(o: &CanaryDeployment) -> Vec<Problem> {
    let template = o.spec.template.get();
    let mut problems = check_pod_template(
        &template.template,
        o.spec.container.as_deref(),
        Some(&template.selector),
    );
    problems.extend(check_image(&o.spec.image));
    // Batched, each version's pods are labelled with what follows NAME- in its Deployment's
    // name, which keeps only that many characters of NAME: past them, no version label, and
    // the analysis selectors match no pod (an analysis of no pod passes).
    let batched = o.spec.strategy.type_.versioned();
    let (longest, why) = if o.spec.traffic_routing.is_some() || batched {
        (
            crate::plan::deployment::VERSION_PREFIX_CHARS,
            "a batched rollout's pods are told apart by the version Deployment's name past \
             NAME-, and a version Deployment keeps only that many characters of NAME",
        )
    } else {
        (MAX_LABEL_CHARS, "NAME is the value of a label on its pods")
    };
    problems.extend(check_name(o.metadata.name.as_deref(), longest, why));
    problems
}

/// The longest label value Kubernetes takes.
const MAX_LABEL_CHARS: usize = 63;

/// The longest StatefulSet name whose pods can be made: the StatefulSet controller labels
/// them `controller-revision-hash: NAME-HASH`, 11 characters more.
const MAX_SET_NAME: usize = MAX_LABEL_CHARS - 11;

/// A rollout name longer than the objects it makes can carry: refused here, by the file,
/// rather than by the API server (or worse, by a Service that selects no pod) later.
fn check_name(name: Option<&str>, longest: usize, why: &str) -> Option<Problem> {
    let length = name?.chars().count();
    (length > longest).then(|| {
        (
            vec!["metadata", "name"],
            format!(
                "metadata.name is {length} characters long; this rollout's name can be at most \
                 {longest}: {why}"
            ),
        )
    })
}

/// The longest image reference linnet takes (registries allow about 255 for the name plus a
/// tag of 128 and a digest of 71).
const MAX_IMAGE_CHARS: usize = 512;

/// An image reference is one short printable word: it is shown in commit messages, commit
/// statuses and events.
fn check_image(image: &str) -> Option<Problem> {
    let bad = image
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || crate::text::is_invisible(*c));
    let message = if let Some(c) = bad {
        format!(
            "spec.image contains {:?}; an image reference has no spaces, line breaks or \
             control characters",
            c
        )
    } else if image.chars().count() > MAX_IMAGE_CHARS {
        format!(
            "spec.image is {} characters long, over {MAX_IMAGE_CHARS}; an image reference is \
             shorter",
            image.chars().count()
        )
    } else {
        return None;
    };
    Some((vec!["spec", "image"], message))
}

#[cfg(test)]
mod approval;
