//! `kustomize build` of one unit: its inputs written out, its root kustomization asked to
//! annotate each object with the file it came from, and the tool's errors located in the
//! kustomization they are about.

use std::ffi::OsString;

use serde_json::Value;

use super::run::{RunFailure, WorkDir, run_bounded, tool_message};
use super::units::KUSTOMIZATION_NAMES;
use super::{RenderOptions, Unit, error_at, locate_text};
use crate::specs::SpecError;

/// Renders a kustomize unit: its output, or an error located in its kustomization.
pub(super) fn render(
    unit: &Unit,
    inputs: &[(String, Vec<u8>)],
    work: &WorkDir,
    render: &RenderOptions,
) -> Result<Vec<u8>, SpecError> {
    let write_error = |e| super::write_error(unit, e);
    let mut root_text = String::new();
    for (path, bytes) in inputs {
        let name = path.rsplit('/').next().unwrap_or(path);
        if KUSTOMIZATION_NAMES.contains(&name) {
            let is_root = *path == unit.key;
            if is_root {
                root_text = String::from_utf8_lossy(bytes).into_owned();
            }
            work.write(path, &prepared(bytes, is_root))
                .map_err(write_error)?;
            let beside = format!("{}/{ROLLOUT_IMAGES_FILE}", super::dir_of(path));
            work.write(beside.trim_start_matches('/'), ROLLOUT_IMAGES.as_bytes())
                .map_err(write_error)?;
        } else {
            work.write(path, bytes).map_err(write_error)?;
        }
    }
    let dir = work.inputs().join(&unit.dir);
    let args: Vec<OsString> = vec![
        "build".into(),
        dir.clone().into_os_string(),
        "--load-restrictor".into(),
        "LoadRestrictionsRootOnly".into(),
    ];
    let network = !render.allowed_hosts.is_empty();
    run_bounded(
        &render.kustomize,
        &args,
        &work.inputs(),
        &work.home(),
        network,
        render,
    )
    .map_err(|e| {
        let message = match e {
            RunFailure::Failed(stderr) => explain(&stderr, &work.inputs()),
            other => other.to_string(),
        };
        let (line, column) = mentioned(&message, &unit.dir)
            .iter()
            .map(|q| locate_text(&root_text, q))
            .find(|at| *at != (1, 1))
            .unwrap_or((1, 1));
        error_at(
            &unit.key,
            line,
            column,
            format!("kustomize build failed: {message}"),
        )
    })
}

/// Where `images:` finds a rollout's image: its `spec.image` and its pod template's
/// containers, so that an `images:` change starts a canary exactly as an edit of the spec does.
const ROLLOUT_IMAGES: &str = r#"{"images": [
{"path": "spec/image", "kind": "CanaryStatefulSet"},
{"path": "spec/template/template/spec/containers[]/image", "kind": "CanaryStatefulSet"},
{"path": "spec/template/template/spec/initContainers[]/image", "kind": "CanaryStatefulSet"},
{"path": "spec/image", "kind": "CanaryDeployment"},
{"path": "spec/template/template/spec/containers[]/image", "kind": "CanaryDeployment"},
{"path": "spec/template/template/spec/initContainers[]/image", "kind": "CanaryDeployment"}
]}"#;

/// The file [`ROLLOUT_IMAGES`] is written to beside each kustomization.
const ROLLOUT_IMAGES_FILE: &str = "linnet-rollout-images.yaml";

/// A kustomization as linnet renders it: [`ROLLOUT_IMAGES`] added to its `configurations`
/// and, at the root, `buildMetadata: [originAnnotations]`, so that each object says which
/// file it came from. Written as JSON, which is YAML too. Left as it is when it is not a
/// mapping: kustomize then says what is wrong with it.
fn prepared(bytes: &[u8], is_root: bool) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return bytes.to_vec();
    };
    let Ok(Value::Object(mut map)) = serde_saphyr::from_str::<Value>(text) else {
        return bytes.to_vec();
    };
    let mut add = |field: &str, item: &str| {
        let list = map.entry(field).or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(items) = list
            && !items.iter().any(|i| i == item)
        {
            items.push(item.into());
        }
    };
    add("configurations", ROLLOUT_IMAGES_FILE);
    if is_root {
        add("buildMetadata", "originAnnotations");
    }
    serde_json::to_vec(&Value::Object(map)).unwrap_or_else(|_| bytes.to_vec())
}

/// Kustomize's error, read as repository paths, saying why a plugin did not run.
fn explain(stderr: &str, work_dir: &std::path::Path) -> String {
    let text = tool_message(stderr, work_dir);
    if text.contains("plugin") || text.contains("exec") && text.contains("function") {
        return format!(
            "{text} (linnet runs kustomize without plugins, exec or container functions: a \
             repository's writer must not run programs in the agent)"
        );
    }
    text
}

/// What a message names that may be an entry of the kustomization: quoted strings (`'x'`,
/// `"x"`) and file names, also as the kustomization writes them (relative to `dir`).
fn mentioned(message: &str, dir: &str) -> Vec<String> {
    let mut out = quoted(message);
    for word in message.split(|c: char| c.is_whitespace() || "()'\",;`".contains(c)) {
        let word = word.trim_end_matches([':', '.']);
        if [".yaml", ".yml", ".json"].iter().any(|x| word.ends_with(x)) {
            out.push(word.to_string());
        }
    }
    let prefix = format!("{dir}/");
    let relative: Vec<String> = out
        .iter()
        .filter_map(|m| m.strip_prefix(&prefix).map(str::to_string))
        .collect();
    // The form relative to the kustomization first: that is how it is written there.
    relative.into_iter().chain(out).collect()
}

/// The strings quoted in a message (`'x'` or `"x"`).
fn quoted(message: &str) -> Vec<String> {
    let mut out = Vec::new();
    for quote in ['\'', '"'] {
        let mut parts = message.split(quote);
        parts.next();
        while let Some(inside) = parts.next() {
            let inside = inside.trim_start_matches("./");
            let looks_like_an_entry = inside.len() >= 2
                && inside.len() < 200
                && !inside.contains(char::is_whitespace)
                && inside.chars().any(|c| c.is_ascii_alphanumeric());
            if looks_like_an_entry {
                out.push(inside.to_string());
            }
            parts.next();
        }
    }
    out
}
