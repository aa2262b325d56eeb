//! A dashboard action's change, made in the rollout's own file the way a person would make it:
//! the merge patch's keys set (or added, indented like their neighbours) in the rollout's
//! document, every other line, comment and quote left as it is. The result is checked by
//! parsing both texts: the edited document must be the old one with the patch merged, or the
//! edit is refused (a flow-style map, say) and the person is told to make it by hand.

use serde_json::Value;

use super::revert::documents;

/// Why the change cannot be made in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionEditError {
    #[error("{path} has no {kind} {name}: it moved since the agent last synced")]
    NotInFile {
        path: String,
        kind: String,
        name: String,
    },
    #[error("cannot set {key} in {path} line by line ({why}): make the change by hand, {change}")]
    CannotEdit {
        path: String,
        key: String,
        why: String,
        change: String,
    },
}

/// The rollout whose document is edited, and the file it is in.
pub struct Target<'a> {
    pub path: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
}

/// `text` with `patch` (a merge patch of maps with string or number leaves) made in the
/// document of `target`; `None` when the document already says so.
pub fn apply(
    text: &str,
    target: &Target<'_>,
    patch: &Value,
) -> Result<Option<String>, ActionEditError> {
    let (start, doc, before) = find(text, target).ok_or_else(|| ActionEditError::NotInFile {
        path: target.path.to_string(),
        kind: target.kind.to_string(),
        name: target.name.to_string(),
    })?;
    let mut wanted = before.clone();
    json_patch::merge(&mut wanted, patch);
    if wanted == before {
        return Ok(None);
    }
    let cannot = |key: &str, why: &str| ActionEditError::CannotEdit {
        path: target.path.to_string(),
        key: key.to_string(),
        why: why.to_string(),
        change: patch.to_string(),
    };
    let mut edited = doc.to_string();
    for (path, leaf) in leaves(patch) {
        let key = path.join(".");
        let scalar = match &leaf {
            Value::String(s) => Value::String(s.clone()).to_string(),
            Value::Number(n) => n.to_string(),
            _ => return Err(cannot(&key, "only strings and numbers are set")),
        };
        edited = set_key(&edited, &path, &scalar).map_err(|why| cannot(&key, why))?;
    }
    if parse(&edited).as_ref() != Some(&wanted) {
        return Err(cannot(
            "the change",
            "the edited document reads differently",
        ));
    }
    let mut out = text.to_string();
    out.replace_range(start..start + doc.len(), &edited);
    Ok(Some(out))
}

/// The document of `target` in `text`: its offset, its text and its parsed value.
fn find<'t>(text: &'t str, target: &Target<'_>) -> Option<(usize, &'t str, Value)> {
    documents(text).into_iter().find_map(|(start, doc)| {
        let v = parse(doc)?;
        let this = v["kind"] == target.kind
            && v["metadata"]["name"] == target.name
            && v["metadata"]["namespace"]
                .as_str()
                .is_none_or(|ns| ns == target.namespace);
        this.then_some((start, doc, v))
    })
}

fn parse(doc: &str) -> Option<Value> {
    serde_saphyr::from_str_with_options::<Value>(doc, crate::specs::bounded_parser_options()).ok()
}

/// Each leaf of `patch` with the keys that lead to it.
fn leaves(patch: &Value) -> Vec<(Vec<String>, Value)> {
    let mut out = Vec::new();
    let mut stack = vec![(Vec::new(), patch)];
    while let Some((path, v)) = stack.pop() {
        match v {
            Value::Object(m) => {
                for (k, child) in m.iter().rev() {
                    let mut p = path.clone();
                    p.push(k.clone());
                    stack.push((p, child));
                }
            }
            leaf => out.push((path, leaf.clone())),
        }
    }
    out
}

/// A line's indentation, `None` for a line that holds no key (blank, comment, `---`).
fn indent(line: &str) -> Option<usize> {
    let body = line.trim_start_matches(' ');
    let bare = body.trim_end();
    let markup = bare.is_empty()
        || bare.starts_with('#')
        || bare.starts_with("---")
        || bare.starts_with("...")
        || bare.starts_with('%');
    (!markup).then(|| line.len() - body.len())
}

/// The value after `key:` on `line` when the line is that key's, at `at` spaces.
fn key_value<'l>(line: &'l str, at: usize, key: &str) -> Option<&'l str> {
    let body = line.get(at..)?;
    [key.to_string(), format!("\"{key}\""), format!("'{key}'")]
        .iter()
        .find_map(|k| body.strip_prefix(k.as_str())?.strip_prefix(':'))
        .filter(|rest| rest.is_empty() || rest.starts_with([' ', '\n', '\r', '\t']))
}

/// `doc` with the key at `path` set to `scalar` (YAML text), or why it could not be.
fn set_key(doc: &str, path: &[String], scalar: &str) -> Result<String, &'static str> {
    let mut lines: Vec<String> = doc.split_inclusive('\n').map(str::to_string).collect();
    if let Some(last) = lines.last_mut().filter(|l| !l.ends_with('\n')) {
        last.push('\n');
    }
    // The lines of the map being searched: [from, to), its keys at `at` spaces.
    let (mut from, mut to, mut parent) = (0, lines.len(), None::<usize>);
    for (depth, key) in path.iter().enumerate() {
        let children = lines[from..to].iter().filter_map(|l| indent(l)).next();
        let at = match (children, parent) {
            (Some(c), Some(p)) if c > p => c,
            (Some(c), None) => c,
            (_, p) => p.map_or(0, |p| p + 2),
        };
        let last = depth + 1 == path.len();
        let found = (from..to)
            .find(|&i| indent(&lines[i]) == Some(at) && key_value(&lines[i], at, key).is_some());
        match found {
            Some(i) => {
                let rest = key_value(&lines[i], at, key).unwrap_or_default();
                let value = rest.split(" #").next().unwrap_or_default().trim();
                if last {
                    let end_of_block = block_end(&lines, i, at);
                    if value.is_empty() && end_of_block > i + 1 {
                        return Err("its value is a block, not a scalar");
                    }
                    let value_end = rest.find(value).map_or(0, |v| v + value.len());
                    let comment = rest[value_end..].trim_end();
                    let quoted = key_text(&lines[i], at, key);
                    lines[i] = format!("{}{quoted}: {scalar}{comment}\n", " ".repeat(at));
                    return Ok(lines.concat());
                }
                if !value.is_empty() && value != "{}" {
                    return Err("it is written in flow style");
                }
                if value == "{}" {
                    lines[i] = format!("{}{}:\n", " ".repeat(at), key_text(&lines[i], at, key));
                }
                (from, to, parent) = (i + 1, block_end(&lines, i, at), Some(at));
            }
            None => {
                // Added after the map's last key line (its own block included).
                let after = (from..to)
                    .rev()
                    .find(|&i| indent(&lines[i]).is_some())
                    .map_or(from, |i| i + 1);
                let mut added = Vec::new();
                for (k, key) in path[depth..].iter().enumerate() {
                    let pad = " ".repeat(at + 2 * k);
                    added.push(if depth + k + 1 == path.len() {
                        format!("{pad}{key}: {scalar}\n")
                    } else {
                        format!("{pad}{key}:\n")
                    });
                }
                lines.splice(after..after, added);
                return Ok(lines.concat());
            }
        }
    }
    Err("the key has no name")
}

/// How the key is written on its line (plain or quoted), kept when the value changes.
fn key_text<'l>(line: &'l str, at: usize, key: &str) -> &'l str {
    let body = &line[at..];
    let quoted = body.starts_with(['"', '\'']);
    &body[..key.len() + if quoted { 2 } else { 0 }]
}

/// The line after the last one of the block the key on line `i` (at `at` spaces) opens.
fn block_end(lines: &[String], i: usize, at: usize) -> usize {
    let mut end = i + 1;
    for (j, line) in lines.iter().enumerate().skip(i + 1) {
        match indent(line) {
            Some(n) if n <= at => break,
            Some(_) => end = j + 1,
            None => {}
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FILE: &str = "\
# the web tier
apiVersion: v1
kind: ConfigMap
metadata:
  name: web
---
apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryStatefulSet
metadata:
  name: web  # the rollout
  labels:
    app: web
spec:
  replicas: 3   # three
  image: \"web:2\"
  template:
    spec:
      containers: []
";

    fn target() -> Target<'static> {
        Target {
            path: "apps/web.yaml",
            kind: "CanaryStatefulSet",
            name: "web",
            namespace: "demo",
        }
    }

    fn diff(before: &str, after: &str) -> Vec<String> {
        let old: Vec<&str> = before.lines().collect();
        after
            .lines()
            .filter(|l| !old.contains(l))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn an_annotation_is_added_under_metadata_with_its_map_and_nothing_else_changes() {
        let patch = json!({"metadata": {"annotations": {"rollouts.linnet.dev/promote": "true"}}});
        let out = apply(FILE, &target(), &patch).unwrap().unwrap();
        assert_eq!(
            diff(FILE, &out),
            vec![
                "  annotations:",
                "    rollouts.linnet.dev/promote: \"true\""
            ]
        );
        assert!(out.contains("    app: web\n  annotations:\n"), "{out}");
        assert!(out.starts_with("# the web tier\n"));
        assert_eq!(apply(&out, &target(), &patch).unwrap(), None);
    }

    #[test]
    fn an_existing_annotation_is_replaced_and_its_comment_and_quoting_kept() {
        let file = FILE.replace(
            "  labels:\n",
            "  annotations:\n    \"rollouts.linnet.dev/abort\": \"false\"  # not yet\n    other: x\n  labels:\n",
        );
        let patch = json!({"metadata": {"annotations": {"rollouts.linnet.dev/abort": "web:2"}}});
        let out = apply(&file, &target(), &patch).unwrap().unwrap();
        assert_eq!(
            diff(&file, &out),
            vec!["    \"rollouts.linnet.dev/abort\": \"web:2\"  # not yet"]
        );
    }

    #[test]
    fn a_number_is_set_in_place_or_added_to_the_spec() {
        let patch = json!({"spec": {"replicas": 5}});
        let out = apply(FILE, &target(), &patch).unwrap().unwrap();
        assert_eq!(diff(FILE, &out), vec!["  replicas: 5   # three"]);
        let patch = json!({"spec": {"currentBatch": 2}});
        let out = apply(FILE, &target(), &patch).unwrap().unwrap();
        assert_eq!(diff(FILE, &out), vec!["  currentBatch: 2"]);
        assert!(
            out.ends_with("      containers: []\n  currentBatch: 2\n"),
            "{out}"
        );
    }

    #[test]
    fn a_flow_style_map_is_refused_with_the_change_to_make_by_hand() {
        let file = FILE.replace("  labels:\n    app: web\n", "  annotations: {a: b}\n");
        let patch = json!({"metadata": {"annotations": {"rollouts.linnet.dev/promote": "true"}}});
        let err = apply(&file, &target(), &patch).unwrap_err();
        assert!(err.to_string().contains("flow style"), "{err}");
        assert!(
            err.to_string().contains("rollouts.linnet.dev/promote"),
            "{err}"
        );
    }

    #[test]
    fn another_namespace_or_a_missing_rollout_is_not_edited() {
        let file = FILE.replace(
            "  name: web  # the rollout\n",
            "  name: web\n  namespace: prod\n",
        );
        let patch = json!({"spec": {"currentBatch": 2}});
        assert!(matches!(
            apply(&file, &target(), &patch),
            Err(ActionEditError::NotInFile { .. })
        ));
    }

    #[test]
    fn a_value_that_is_a_block_is_not_overwritten() {
        let patch = json!({"spec": {"template": "x"}});
        let err = apply(FILE, &target(), &patch).unwrap_err();
        assert!(err.to_string().contains("block"), "{err}");
    }

    #[test]
    fn a_file_without_a_final_newline_gets_one_before_the_added_line() {
        let file = FILE.trim_end().to_string();
        let patch = json!({"spec": {"currentBatch": 2}});
        let out = apply(&file, &target(), &patch).unwrap().unwrap();
        assert!(
            out.ends_with("containers: []\n  currentBatch: 2\n"),
            "{out}"
        );
    }
}
