//! One YAML document of a spec file: its kind checked, its fields checked against the schema
//! (unknown fields located), and the object made from it.

use super::*;

pub(super) fn load_document(
    file: &str,
    doc: &Document,
    opts: &LoadOptions,
    allowance: &Allowance,
) -> std::result::Result<Option<LoadedObject>, Vec<SpecError>> {
    let at_start = |message: String| error_at(file, doc.first_line, 1, message);
    let at_key = |path: &[&str], message: String| match find_key(&doc.text, path) {
        Some((line, column)) => error_at(file, doc.first_line + line - 1, column, message),
        None => at_start(message),
    };

    let value: Value = allowance.parse(&doc.text).map_err(|e| {
        let mut located = yaml_error(file, doc, &e, "invalid YAML: ");
        if let Some(refusal) = budget_refusal(&e, &opts.budget) {
            located.message = refusal;
        }
        vec![located]
    })?;
    let map = match &value {
        Value::Null => return Ok(None),
        Value::Object(map) => map,
        _ => {
            return Err(vec![at_start(
                "a document must be a mapping with `apiVersion`, `kind` and `metadata`".into(),
            )]);
        }
    };
    let string_field = |name: &str| {
        map.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let Some(kind) = string_field("kind") else {
        return Err(vec![at_start(
            "document has no `kind`; every document needs `apiVersion` and `kind` \
             (e.g. `kind: CanaryStatefulSet`)"
                .into(),
        )]);
    };
    let Some(api_version) = string_field("apiVersion") else {
        return Err(vec![at_start(format!(
            "{kind} has no `apiVersion`; expected e.g. `apiVersion: {}`",
            if kind.starts_with("Canary") {
                API_VERSION
            } else {
                "v1"
            }
        ))]);
    };
    let metadata = map.get("metadata").and_then(Value::as_object);
    let Some(name) = metadata
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    else {
        return Err(vec![at_start(format!(
            "{kind} has no `metadata.name`; every object needs a name"
        ))]);
    };
    let explicit_namespace = metadata
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let namespace = if is_cluster_scoped(kind) {
        String::new()
    } else {
        explicit_namespace
            .unwrap_or(&opts.default_namespace)
            .to_string()
    };
    let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    if let Some(message) = never_from_git(group, kind) {
        return Err(vec![at_key(&["kind"], message)]);
    }
    if namespace.is_empty() {
        if let Some(message) = opts.policy.cluster_kind_refusal(kind) {
            return Err(vec![at_key(&["kind"], message)]);
        }
        // A Namespace object is its namespace: a closed one stays closed.
        if kind == "Namespace"
            && let Some(message) = opts.policy.namespace_refusal(name)
        {
            return Err(vec![at_key(&["metadata", "name"], message)]);
        }
    } else if let Some(message) = opts.policy.namespace_refusal(&namespace) {
        return Err(vec![if explicit_namespace.is_some() {
            at_key(&["metadata", "namespace"], message)
        } else {
            at_start(format!("{message} (the default namespace applies here)"))
        }]);
    }
    // Nested metadata too (pod templates, claim templates): a pod or claim made from them
    // would pass for a rollout's own.
    if let Some((path, mark)) = nested_controller_mark(&value) {
        let top = path.split('.').next().unwrap_or_default().to_string();
        return Err(vec![at_key(
            &[top.as_str()],
            format!(
                "{path} has {mark}, which only linnet's controllers set, on what they make \
                 (a rollout's sets, pods, claims and volumes); an object from Git may not carry it"
            ),
        )]);
    }
    for map_name in ["labels", "annotations"] {
        let keys = metadata
            .and_then(|m| m.get(map_name))
            .and_then(Value::as_object)
            .map(|m| m.keys().map(String::as_str).collect::<Vec<_>>())
            .unwrap_or_default();
        if let Some(mark) = controller_mark(keys) {
            return Err(vec![at_key(
                &["metadata", map_name, mark],
                format!(
                    "{mark} is set only by linnet's controllers, on what they make (a rollout's \
                     sets, claims and volumes); an object from Git may not carry it"
                ),
            )]);
        }
    }
    if let Some((path, message)) = opts.policy.claim_volume_name_refusal(kind, &value) {
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        return Err(vec![at_key(&path, message)]);
    }

    let key = ObjectKey::new(
        api_version.to_string(),
        kind.to_string(),
        namespace.clone(),
        name.to_string(),
    );
    let location = Location {
        file: file.into(),
        line: doc.first_line,
        column: 1,
    };

    // Unknown fields first: a typo in a template (`containerz:`) also fails the rules below
    // ("containers is empty"), which would hide the cause.
    if opts.unknown_fields_are_errors {
        let unknown = unknown_field_errors(api_version, kind, &value, &at_key);
        if !unknown.is_empty() {
            return Err(unknown);
        }
    }
    let spec = if group == crate::api::GROUP {
        if api_version != API_VERSION {
            return Err(vec![at_key(
                &["apiVersion"],
                format!("unsupported apiVersion {api_version:?}; expected {API_VERSION:?}"),
            )]);
        }
        for field in map.keys() {
            if !["apiVersion", "kind", "metadata", "spec", "status"].contains(&field.as_str()) {
                return Err(vec![at_key(
                    &[field],
                    format!(
                        "unknown field `{field}` in {kind}; expected `apiVersion`, `kind`, \
                         `metadata` or `spec`"
                    ),
                )]);
            }
        }
        let mut errors = crd_errors(kind, &value)
            .into_iter()
            .map(|(path, message)| {
                let segments: Vec<&str> = path.split('.').filter(|s| !s.is_empty()).collect();
                at_key(&segments, message)
            })
            .collect::<Vec<_>>();
        // The document is known to fit the budget; the typed parse gets the same limits.
        let typed_options = || Allowance::new(opts.budget).parser_options();
        let spec = match kind {
            "CanaryStatefulSet" => match serde_saphyr::from_str_with_options::<CanaryStatefulSet>(
                &doc.text,
                typed_options(),
            ) {
                Ok(mut o) => {
                    o.metadata.namespace = Some(namespace);
                    o.status = None;
                    for (path, message) in check_canary_statefulset(&o) {
                        errors.push(at_key(&path, message));
                    }
                    Spec::new(&o)
                }
                Err(e) => return Err(vec![yaml_error(file, doc, &e, &format!("{kind}: "))]),
            },
            "CanaryDeployment" => match serde_saphyr::from_str_with_options::<CanaryDeployment>(
                &doc.text,
                typed_options(),
            ) {
                Ok(mut o) => {
                    o.metadata.namespace = Some(namespace);
                    o.status = None;
                    for (path, message) in check_canary_deployment(&o) {
                        errors.push(at_key(&path, message));
                    }
                    Spec::new(&o)
                }
                Err(e) => return Err(vec![yaml_error(file, doc, &e, &format!("{kind}: "))]),
            },
            "AnalysisTemplate" => match serde_saphyr::from_str_with_options::<AnalysisTemplate>(
                &doc.text,
                typed_options(),
            ) {
                Ok(mut o) => {
                    o.metadata.namespace = Some(namespace);
                    for (i, m) in o.spec.metrics.iter().enumerate() {
                        let index = i.to_string();
                        for (field, message) in crate::plan::analysis::metric_problems(m) {
                            let mut path = vec!["spec", "metrics", index.as_str()];
                            path.extend(field.split('.'));
                            errors.push(at_key(&path, format!("metric {}: {message}", m.name)));
                        }
                        if o.spec.metrics[..i].iter().any(|x| x.name == m.name) {
                            errors.push(at_key(
                                &["spec", "metrics", index.as_str(), "name"],
                                format!("metric {} is named twice; names must differ", m.name),
                            ));
                        }
                    }
                    Spec::new(&o)
                }
                Err(e) => return Err(vec![yaml_error(file, doc, &e, &format!("{kind}: "))]),
            },
            other => {
                return Err(vec![at_key(
                    &["kind"],
                    format!(
                        "unknown kind {other:?} in {}; expected CanaryStatefulSet, CanaryDeployment or AnalysisTemplate",
                        crate::api::GROUP
                    ),
                )]);
            }
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        spec
    } else {
        let mut object: DynamicObject = serde_json::from_value(value.clone())
            .map_err(|e| vec![at_start(format!("{kind} {name}: {e}"))])?;
        if !namespace.is_empty() {
            object.metadata.namespace = Some(namespace);
        }
        Spec::new(&object)
    };
    if spec.json_len() > MAX_OBJECT_BYTES {
        return Err(vec![at_start(format!(
            "{kind} {name} is {} bytes as JSON, over the {MAX_OBJECT_BYTES} the API server \
             stores in one object",
            spec.json_len()
        ))]);
    }
    Ok(Some(LoadedObject {
        key,
        spec,
        location,
    }))
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
