//! The OpenAPI v3 checks of a CRD's structural schema that the API server applies before any
//! CEL rule: types, `minimum`/`maximum`, lengths, item counts, `enum` and `required` (linnet's
//! CRDs use no `pattern`). `linnet validate` runs them offline so that `replicas: 0` fails in the pull
//! request, located, instead of as a 422 from the agent. Pure: a schema and a value in, a list
//! of `(path, message)` out.

use serde_json::Value;

/// At most this many problems per object: one bad list must not flood the output.
const MAX_PROBLEMS: usize = 20;

/// Checks `value` against the OpenAPI `schema`; each problem is a dotted path (list indices as
/// numbers) and a message that names the rule.
pub fn schema_errors(schema: &Value, value: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    check(schema, value, "", &mut out);
    out.truncate(MAX_PROBLEMS);
    out
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

fn check(schema: &Value, value: &Value, at: &str, out: &mut Vec<(String, String)>) {
    if out.len() >= MAX_PROBLEMS || !schema.is_object() {
        return;
    }
    if value.is_null() {
        // A null is how YAML says "unset"; the API server drops it when `nullable`.
        return;
    }
    let mut problem = |message: String| out.push((at.to_string(), message));
    if let Some(wrong_type) = type_problem(schema, value) {
        problem(wrong_type);
        return;
    }
    for message in scalar_problems(schema, value) {
        problem(message);
    }
    match value {
        Value::Array(items) => check_array(schema, items, at, out),
        Value::Object(fields) => check_object(schema, fields, at, out),
        _ => {}
    }
}

/// Whether `value` is of the schema's `type` (an int-or-string field takes both).
fn type_problem(schema: &Value, value: &Value) -> Option<String> {
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true);
    let want = schema.get("type").and_then(Value::as_str)?;
    let ok = int_or_string
        || match want {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            _ => true,
        };
    (!ok).then(|| format!("must be {}", article(want)))
}

/// A number's bounds, a string's length, and an enum's values.
fn scalar_problems(schema: &Value, value: &Value) -> Vec<String> {
    let get = |k: &str| schema.get(k);
    let mut problems = Vec::new();
    if let Some(n) = value.as_f64() {
        if let Some(min) = get("minimum").and_then(Value::as_f64) {
            let exclusive = get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
            if n < min || (exclusive && n == min) {
                let bound = if exclusive { "more than" } else { "at least" };
                problems.push(format!("must be {bound} {}, not {value}", number(min)));
            }
        }
        if let Some(max) = get("maximum").and_then(Value::as_f64) {
            let exclusive = get("exclusiveMaximum").and_then(Value::as_bool) == Some(true);
            if n > max || (exclusive && n == max) {
                let bound = if exclusive { "less than" } else { "at most" };
                problems.push(format!("must be {bound} {}, not {value}", number(max)));
            }
        }
    }
    if let Some(s) = value.as_str() {
        let chars = s.chars().count() as u64;
        if let Some(min) = get("minLength").and_then(Value::as_u64)
            && chars < min
        {
            problems.push(format!("must be at least {min} characters long"));
        }
        if let Some(max) = get("maxLength").and_then(Value::as_u64)
            && chars > max
        {
            problems.push(format!("must be at most {max} characters long"));
        }
    }
    if let Some(allowed) = get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let names: Vec<String> = allowed.iter().map(Value::to_string).collect();
        problems.push(format!("must be one of {}, not {value}", names.join(", ")));
    }
    problems
}

/// An array's length, and each item against `items`.
fn check_array(schema: &Value, items: &[Value], at: &str, out: &mut Vec<(String, String)>) {
    let get = |k: &str| schema.get(k);
    if let Some(min) = get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        out.push((at.to_string(), format!("must have at least {min} items")));
    }
    if let Some(max) = get("maxItems").and_then(Value::as_u64)
        && (items.len() as u64) > max
    {
        let message = format!("must have at most {max} items, not {}", items.len());
        out.push((at.to_string(), message));
    }
    if let Some(item_schema) = get("items") {
        for (i, item) in items.iter().enumerate() {
            check(item_schema, item, &join(at, &i.to_string()), out);
        }
    }
}

/// An object's required fields and size, and each field against its property's schema (or
/// `additionalProperties`).
fn check_object(
    schema: &Value,
    fields: &serde_json::Map<String, Value>,
    at: &str,
    out: &mut Vec<(String, String)>,
) {
    let get = |k: &str| schema.get(k);
    for name in get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if fields.get(name).is_none_or(Value::is_null) {
            out.push((join(at, name), "is required".into()));
        }
    }
    if let Some(max) = get("maxProperties").and_then(Value::as_u64)
        && (fields.len() as u64) > max
    {
        out.push((at.to_string(), format!("must have at most {max} entries")));
    }
    let properties = get("properties").and_then(Value::as_object);
    let additional = get("additionalProperties").filter(|a| a.is_object());
    for (name, field) in fields {
        match (properties.and_then(|p| p.get(name)), additional) {
            (Some(s), _) | (None, Some(s)) => check(s, field, &join(at, name), out),
            (None, None) => {}
        }
    }
}

fn article(kind: &str) -> String {
    match kind {
        "object" | "array" | "integer" => format!("an {kind}"),
        other => format!("a {other}"),
    }
}

/// `1` for `1.0`: schemars writes bounds as floats.
fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["replicas", "image"],
                    "properties": {
                        "replicas": {"type": "integer", "minimum": 1.0},
                        "image": {"type": "string", "minLength": 1},
                        "mode": {"type": "string", "enum": ["Auto", "Manual"]},
                        "steps": {"type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 1.0}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "port": {"x-kubernetes-int-or-string": true},
                    }
                }
            }
        })
    }

    #[test]
    fn replicas_zero_breaks_the_crds_minimum() {
        // Issue 18: `replicas: 0` passed validate, then the agent got a 422.
        let errors = schema_errors(&schema(), &json!({"spec": {"replicas": 0, "image": "x"}}));
        assert_eq!(
            errors,
            vec![("spec.replicas".into(), "must be at least 1, not 0".into())]
        );
    }

    #[test]
    fn each_keyword_names_the_field_it_failed() {
        let errors = schema_errors(
            &schema(),
            &json!({"spec": {
                "replicas": "three",
                "image": "",
                "mode": "Sometimes",
                "steps": [1, 0, 3],
                "labels": {"a": 1},
                "port": "http",
            }}),
        );
        let mut paths: Vec<&str> = errors.iter().map(|(p, _)| p.as_str()).collect();
        paths.sort_unstable();
        assert_eq!(
            paths,
            vec![
                "spec.image",
                "spec.labels.a",
                "spec.mode",
                "spec.replicas",
                "spec.steps",
                "spec.steps.1",
            ],
            "{errors:?}"
        );
        let mode = errors.iter().find(|(p, _)| p == "spec.mode").unwrap();
        assert!(mode.1.contains(r#""Auto", "Manual""#), "{mode:?}");
        assert_eq!(
            schema_errors(&schema(), &json!({})),
            vec![("spec".into(), "is required".into())]
        );
    }

    #[test]
    fn a_valid_object_and_unset_optional_fields_pass() {
        let ok = json!({"spec": {"replicas": 3, "image": "x", "mode": null, "port": 80}});
        assert!(schema_errors(&schema(), &ok).is_empty());
    }
}
