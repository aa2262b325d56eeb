//! A render's output read like one spec file, named after its unit: an object over the limits
//! blocks the unit, and an error in a rendered object is located in the file it came from
//! (the base, the overlay's patch, the template) when the tool says which.

use serde_json::Value;

use super::{RenderOptions, Unit, UnitKind, error_at, join_relative, locate_text};
use crate::specs::{FileSpecs, LoadOptions, ParseBudget, Spec, load_file};

/// Where kustomize writes the file an object came from (`buildMetadata: [originAnnotations]`).
const ORIGIN: &str = "config.kubernetes.io/origin";

/// Reads a unit's output into its objects, or its errors.
pub(super) fn read_rendered(
    unit: &Unit,
    out: &[u8],
    inputs: &[(String, Vec<u8>)],
    opts: &LoadOptions,
    render: &RenderOptions,
) -> FileSpecs {
    let mut opts = opts.clone();
    opts.max_file_bytes = render.max_output_bytes;
    // A unit is many files' worth of objects: its budget grows with the objects it may hold.
    opts.budget = ParseBudget {
        max_nodes: opts
            .budget
            .max_nodes
            .max(render.max_objects.saturating_mul(500)),
        max_bytes: opts.budget.max_bytes.max(render.max_output_bytes),
        ..opts.budget
    };
    if let UnitKind::Helm(release) = &unit.kind
        && let Some(ns) = &release.namespace
    {
        opts.default_namespace = ns.clone();
    }
    let mut specs = load_file(&unit.key, out, &opts);
    let text = String::from_utf8_lossy(out);
    for e in &mut specs.errors {
        if *e.location.file != *unit.key {
            continue;
        }
        let Some(origin) = origin_of_line(unit, &text, e.location.line) else {
            e.message = format!("{} (in what {} renders)", e.message, unit.key);
            continue;
        };
        let rendered_line = text
            .lines()
            .nth(e.location.line.saturating_sub(1) as usize)
            .unwrap_or("")
            .trim();
        e.message = format!(
            "{} (in the object {} renders from {origin})",
            e.message, unit.key
        );
        // The line as rendered, in the file it came from; or in another of the unit's files
        // (an overlay's patch) when that one does not have it as written.
        let (file, line, column) =
            locate_rendered_line(&origin, rendered_line, inputs).unwrap_or((origin, 1, 1));
        e.location = crate::specs::Location {
            file: file.into(),
            line,
            column,
        };
    }
    if specs.objects.len() > render.max_objects {
        return FileSpecs {
            left_out: Vec::new(),
            objects: Vec::new(),
            errors: vec![error_at(
                &unit.key,
                1,
                1,
                format!(
                    "renders {} objects, over the {} one unit may hold (--render-max-objects): \
                     nothing of it is applied, and nothing it applied before is pruned",
                    specs.objects.len(),
                    render.max_objects
                ),
            )],
        };
    }
    for object in &mut specs.objects {
        object.location.line = 1;
        object.location.column = 1;
        if object.spec.to_json_text_contains(ORIGIN) {
            let mut v = object.spec.to_json();
            strip_origin(&mut v);
            object.spec = Spec::new(&v);
        }
    }
    specs
}

/// Where `line` (trimmed, not empty) is written: in `origin` first, then in the unit's other
/// YAML files that are not kustomizations, as `(file, line, column)`.
fn locate_rendered_line(
    origin: &str,
    line: &str,
    inputs: &[(String, Vec<u8>)],
) -> Option<(String, u64, u64)> {
    if line.is_empty() {
        return None;
    }
    let candidates = inputs
        .iter()
        .filter(|(p, _)| p == origin)
        .chain(inputs.iter().filter(|(p, _)| {
            let name = p.rsplit('/').next().unwrap_or(p);
            p != origin
                && (name.ends_with(".yaml") || name.ends_with(".yml"))
                && !super::KUSTOMIZATION_NAMES.contains(&name)
        }));
    for (path, bytes) in candidates {
        let text = String::from_utf8_lossy(bytes);
        if text.lines().any(|l| l.contains(line)) {
            let (l, c) = locate_text(&text, line);
            return Some((path.clone(), l, c));
        }
    }
    None
}

fn strip_origin(v: &mut Value) {
    if let Some(annotations) = v
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(ORIGIN);
        if annotations.is_empty()
            && let Some(meta) = v.pointer_mut("/metadata").and_then(Value::as_object_mut)
        {
            meta.remove("annotations");
        }
    }
}

/// The repository file the rendered document around `line` came from: helm's `# Source:`
/// comment, or kustomize's origin annotation.
fn origin_of_line(unit: &Unit, text: &str, line: u64) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let at = (line.saturating_sub(1) as usize).min(lines.len().saturating_sub(1));
    let is_marker = |l: &str| l == "---" || l.starts_with("--- ");
    let start = (0..=at)
        .rev()
        .find(|&i| is_marker(lines.get(i).unwrap_or(&"")))
        .unwrap_or(0);
    let end = (at + 1..lines.len())
        .find(|&i| is_marker(lines[i]))
        .unwrap_or(lines.len());
    let doc = lines.get(start..end)?;
    match &unit.kind {
        UnitKind::Helm(release) => {
            let source = doc.iter().find_map(|l| l.strip_prefix("# Source: "))?;
            let chart = join_relative(&unit.dir, &release.chart)?;
            let (_, in_chart) = source.trim().split_once('/')?;
            (release.repository.is_none()).then(|| format!("{chart}/{in_chart}"))
        }
        UnitKind::Kustomize => {
            let i = doc.iter().position(|l| l.contains(ORIGIN))?;
            let path = doc[i + 1..]
                .iter()
                .take(4)
                .find_map(|l| l.trim().strip_prefix("path: "))?;
            join_relative(&unit.dir, path.trim().trim_matches(['"', '\'']))
        }
    }
}
