//! One YAML document of a spec file: its kind checked, its fields checked against the schema
//! (unknown fields located), and the object made from it.

use super::place::{Loaded, Place};
use super::*;

/// The annotation that makes an object an Argo CD hook, run by Argo CD's sync phases.
const ARGO_CD_HOOK: &str = "argocd.argoproj.io/hook";

pub(super) fn load_document(
    file: &str,
    doc: &Document,
    opts: &LoadOptions,
    allowance: &Allowance,
) -> std::result::Result<Loaded, Vec<SpecError>> {
    let place = Place { file, doc };
    let value: Value = allowance.parse(&doc.text).map_err(|e| {
        let mut located = yaml_error(file, doc, &e, "invalid YAML: ");
        if let Some(refusal) = budget_refusal(&e, &opts.budget) {
            located.message = refusal;
        }
        vec![located]
    })?;
    let map = match &value {
        Value::Null => return Ok(Loaded::Nothing),
        Value::Object(map) => map,
        _ => {
            return Err(vec![place.start(
                "a document must be a mapping with `apiVersion`, `kind` and `metadata`".into(),
            )]);
        }
    };
    if let Some(left_out) = left_out(&place, map) {
        return left_out;
    }
    let id = Identity::of(&place, map, opts).map_err(|e| vec![e])?;
    refuse_by_policy(&place, &id, &value, opts).map_err(|e| vec![e])?;
    // A kind 1.36 does not serve, as validate and diff judge it (the agent leaves it to the
    // API server, which may be newer).
    if opts.unknown_fields_are_errors
        && let Some((field, message)) = crate::specs::kinds::kind_problem(id.api_version, id.kind)
    {
        return Err(vec![place.key(&[field], message)]);
    }
    // Unknown fields first: a typo in a template (`containerz:`) also fails the rules below
    // ("containers is empty"), which would hide the cause.
    if opts.unknown_fields_are_errors {
        let unknown =
            unknown_field_errors(id.api_version, id.kind, &value, &|p, m| place.key(p, m));
        if !unknown.is_empty() {
            return Err(unknown);
        }
    }
    let spec = if id.group() == crate::api::GROUP {
        linnet_spec(&place, &id, map, &value, opts)?
    } else {
        let mut object: DynamicObject = serde_json::from_value(value.clone())
            .map_err(|e| vec![place.start(format!("{} {}: {e}", id.kind, id.name))])?;
        if !id.namespace.is_empty() {
            object.metadata.namespace = Some(id.namespace.clone());
        }
        Spec::new(&object)
    };
    if spec.json_len() > MAX_OBJECT_BYTES {
        return Err(vec![place.start(format!(
            "{} {} is {} bytes as JSON, over the {MAX_OBJECT_BYTES} the API server stores in \
             one object",
            id.kind,
            id.name,
            spec.json_len()
        ))]);
    }
    Ok(Loaded::Object(LoadedObject {
        key: ObjectKey::new(
            id.api_version.to_string(),
            id.kind.to_string(),
            id.namespace,
            id.name.to_string(),
        ),
        spec,
        location: Location {
            file: file.into(),
            line: doc.first_line,
            column: 1,
        },
    }))
}

/// Why a document is left out: an Argo CD hook (Argo CD runs it in a phase of its sync,
/// often under a `generateName` that makes a new object each time; linnet applies objects by
/// name and has no such phases), or a Helm hook that only has a `generateName`.
fn hook_left_out(map: &serde_json::Map<String, Value>) -> Option<String> {
    let metadata = map.get("metadata").and_then(Value::as_object);
    let annotation = |key: &str| {
        metadata
            .and_then(|m| m.get("annotations"))
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
    };
    let field = |key: &str| metadata.and_then(|m| m.get(key)).and_then(Value::as_str);
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or("object");
    let named = field("name")
        .or(field("generateName").map(|g| g.trim_end_matches('-')))
        .unwrap_or("without a name");
    if let Some(phase) = annotation(ARGO_CD_HOOK) {
        return Some(format!(
            "{kind} {named} is an Argo CD hook ({ARGO_CD_HOOK}: {phase}), left out: Argo CD runs \
             hooks in the phases of its sync, and linnet, which applies objects by name, has \
             none. Run it as a CanaryStatefulSet's migration, or as a named Job in Git"
        ));
    }
    if field("name").is_none()
        && field("generateName").is_some()
        && annotation("helm.sh/hook").is_some()
    {
        return Some(format!(
            "{kind} {named} is a Helm hook with only a generateName, left out: linnet applies \
             objects by name"
        ));
    }
    None
}

/// A document left out on purpose: a hook, or a kind the agent reads from Git and never
/// applies ([`super::read_from_git`]).
fn left_out(
    place: &Place<'_>,
    map: &serde_json::Map<String, Value>,
) -> Option<std::result::Result<Loaded, Vec<SpecError>>> {
    if let Some(why) = hook_left_out(map) {
        return Some(Ok(Loaded::LeftOut(place.start(why))));
    }
    super::read_from_git::left_out(place, map)
}

/// What names a document's object: its kind, apiVersion, name and namespace.
struct Identity<'v> {
    kind: &'v str,
    api_version: &'v str,
    name: &'v str,
    /// Empty for a cluster-scoped kind; the default namespace when the document names none.
    namespace: String,
    /// Whether the document names its namespace itself.
    explicit_namespace: bool,
    metadata: Option<&'v serde_json::Map<String, Value>>,
}

impl<'v> Identity<'v> {
    fn of(
        place: &Place<'_>,
        map: &'v serde_json::Map<String, Value>,
        opts: &LoadOptions,
    ) -> Result<Identity<'v>, SpecError> {
        let string_field = |name: &str| {
            map.get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let Some(kind) = string_field("kind") else {
            return Err(place.start(
                "document has no `kind`; every document needs `apiVersion` and `kind` \
                 (e.g. `kind: CanaryStatefulSet`)"
                    .into(),
            ));
        };
        let Some(api_version) = string_field("apiVersion") else {
            let example = if kind.starts_with("Canary") {
                API_VERSION
            } else {
                "v1"
            };
            return Err(place.start(format!(
                "{kind} has no `apiVersion`; expected e.g. `apiVersion: {example}`"
            )));
        };
        let metadata = map.get("metadata").and_then(Value::as_object);
        let text = |key: &str| {
            metadata
                .and_then(|m| m.get(key))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let Some(name) = text("name") else {
            return Err(place.start(format!(
                "{kind} has no `metadata.name`; every object needs a name"
            )));
        };
        let explicit_namespace = text("namespace");
        let namespace = if is_cluster_scoped(kind) {
            String::new()
        } else {
            explicit_namespace
                .unwrap_or(&opts.default_namespace)
                .to_string()
        };
        Ok(Identity {
            kind,
            api_version,
            name,
            namespace,
            explicit_namespace: explicit_namespace.is_some(),
            metadata,
        })
    }

    fn group(&self) -> &'v str {
        self.api_version
            .rsplit_once('/')
            .map(|(g, _)| g)
            .unwrap_or("")
    }
}

/// What the source's policy, and linnet's own marks, refuse before the object is read.
fn refuse_by_policy(
    place: &Place<'_>,
    id: &Identity<'_>,
    value: &Value,
    opts: &LoadOptions,
) -> Result<(), SpecError> {
    let kind = id.kind;
    if let Some(message) = never_from_git(id.group(), kind) {
        return Err(place.key(&["kind"], message));
    }
    if id.namespace.is_empty() {
        if let Some(message) = opts.policy.cluster_kind_refusal(kind) {
            return Err(place.key(&["kind"], message));
        }
        // A Namespace object is its namespace: a closed one stays closed.
        if kind == "Namespace"
            && let Some(message) = opts.policy.namespace_refusal(id.name)
        {
            return Err(place.key(&["metadata", "name"], message));
        }
    } else if let Some(message) = opts.policy.namespace_refusal(&id.namespace) {
        return Err(if id.explicit_namespace {
            place.key(&["metadata", "namespace"], message)
        } else {
            place.start(format!("{message} (the default namespace applies here)"))
        });
    }
    // Nested metadata too (pod templates, claim templates): a pod or claim made from them
    // would pass for a rollout's own.
    if let Some((path, mark)) = nested_controller_mark(value) {
        let top = path.split('.').next().unwrap_or_default().to_string();
        return Err(place.key(
            &[top.as_str()],
            format!(
                "{path} has {mark}, which only linnet's controllers set, on what they make \
                 (a rollout's sets, pods, claims and volumes); an object from Git may not carry it"
            ),
        ));
    }
    for map_name in ["labels", "annotations"] {
        let keys = id
            .metadata
            .and_then(|m| m.get(map_name))
            .and_then(Value::as_object)
            .map(|m| m.keys().map(String::as_str).collect::<Vec<_>>())
            .unwrap_or_default();
        if let Some(mark) = controller_mark(keys) {
            return Err(place.key(
                &["metadata", map_name, mark],
                format!(
                    "{mark} is set only by linnet's controllers, on what they make (a rollout's \
                     sets, claims and volumes); an object from Git may not carry it"
                ),
            ));
        }
    }
    if let Some((path, message)) = opts.policy.claim_volume_name_refusal(kind, value) {
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        return Err(place.key(&path, message));
    }
    Ok(())
}

/// A rollout as its type reads it, less the `replicas` its type defaults when Git (`git`, the
/// document) leaves them out: then `/scale` (an autoscaler, `kubectl scale`) sets the count,
/// and linnet must neither apply nor own one.
fn rollout_spec(rollout: &impl serde::Serialize, git: &Value) -> Spec {
    if git.pointer("/spec/replicas").is_some() {
        return Spec::new(rollout);
    }
    let mut object = serde_json::to_value(rollout).unwrap_or_default();
    if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("replicas");
    }
    Spec::new(&object)
}

/// One of linnet's own kinds, read into its type and checked by its rules.
fn linnet_spec(
    place: &Place<'_>,
    id: &Identity<'_>,
    map: &serde_json::Map<String, Value>,
    value: &Value,
    opts: &LoadOptions,
) -> std::result::Result<Spec, Vec<SpecError>> {
    let kind = id.kind;
    check_top_level(place, id, map).map_err(|e| vec![e])?;
    let mut errors = crd_errors(kind, value)
        .into_iter()
        .map(|(path, message)| {
            let segments: Vec<&str> = path.split('.').filter(|s| !s.is_empty()).collect();
            place.key(&segments, message)
        })
        .collect::<Vec<_>>();
    // The document is known to fit the budget; the typed parse gets the same limits.
    let typed =
        |e: serde_saphyr::Error| vec![yaml_error(place.file, place.doc, &e, &format!("{kind}: "))];
    let text = &place.doc.text;
    let options = || Allowance::new(opts.budget).parser_options();
    let namespace = Some(id.namespace.clone());
    let mut found = Vec::new();
    let spec = match kind {
        "CanaryStatefulSet" => {
            let mut o: CanaryStatefulSet =
                serde_saphyr::from_str_with_options(text, options()).map_err(typed)?;
            o.metadata.namespace = namespace;
            o.status = None;
            found.extend(check_canary_statefulset(&o));
            rollout_spec(&o, value)
        }
        "CanaryDeployment" => {
            let mut o: CanaryDeployment =
                serde_saphyr::from_str_with_options(text, options()).map_err(typed)?;
            o.metadata.namespace = namespace;
            o.status = None;
            found.extend(check_canary_deployment(&o));
            rollout_spec(&o, value)
        }
        "AnalysisTemplate" => {
            let mut o: AnalysisTemplate =
                serde_saphyr::from_str_with_options(text, options()).map_err(typed)?;
            o.metadata.namespace = namespace;
            errors.extend(metric_errors(place, &o));
            Spec::new(&o)
        }
        other => {
            return Err(vec![place.key(
                &["kind"],
                format!(
                    "unknown kind {other:?} in {}; expected CanaryStatefulSet, CanaryDeployment \
                     or AnalysisTemplate",
                    crate::api::GROUP
                ),
            )]);
        }
    };
    errors.extend(
        found
            .into_iter()
            .map(|(path, message)| place.key(&path, message)),
    );
    if errors.is_empty() {
        Ok(spec)
    } else {
        Err(errors)
    }
}

/// One of linnet's kinds at its one apiVersion, with no top-level field but the usual ones.
fn check_top_level(
    place: &Place<'_>,
    id: &Identity<'_>,
    map: &serde_json::Map<String, Value>,
) -> Result<(), SpecError> {
    let (kind, api_version) = (id.kind, id.api_version);
    if api_version != API_VERSION {
        return Err(place.key(
            &["apiVersion"],
            format!("unsupported apiVersion {api_version:?}; expected {API_VERSION:?}"),
        ));
    }
    if let Some(field) = map
        .keys()
        .find(|f| !["apiVersion", "kind", "metadata", "spec", "status"].contains(&f.as_str()))
    {
        return Err(place.key(
            &[field],
            format!(
                "unknown field `{field}` in {kind}; expected `apiVersion`, `kind`, `metadata` \
                 or `spec`"
            ),
        ));
    }
    Ok(())
}

/// An AnalysisTemplate's metrics: each one's problems, and a name used twice.
fn metric_errors(place: &Place<'_>, template: &AnalysisTemplate) -> Vec<SpecError> {
    let metrics = &template.spec.metrics;
    let mut errors = Vec::new();
    for (i, m) in metrics.iter().enumerate() {
        let index = i.to_string();
        for (field, message) in crate::plan::analysis::metric_problems(m) {
            let mut path = vec!["spec", "metrics", index.as_str()];
            path.extend(field.split('.'));
            errors.push(place.key(&path, format!("metric {}: {message}", m.name)));
        }
        if metrics[..i].iter().any(|x| x.name == m.name) {
            errors.push(place.key(
                &["spec", "metrics", index.as_str(), "name"],
                format!("metric {} is named twice; names must differ", m.name),
            ));
        }
    }
    errors
}

/// A located error for each field `kind`'s type does not have.
pub(super) fn unknown_field_errors(
    api_version: &str,
    kind: &str,
    value: &Value,
    at_key: &dyn Fn(&[&str], String) -> SpecError,
) -> Vec<SpecError> {
    crate::specs::known::unknown_fields(api_version, kind, value)
        .iter()
        .map(|path| {
            let segments: Vec<&str> = path.iter().map(String::as_str).collect();
            at_key(&segments, crate::specs::known::message(kind, path))
        })
        .collect()
}
