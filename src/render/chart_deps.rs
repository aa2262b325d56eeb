//! A chart's dependencies that live in the repository (`repository: file://../lib` in its
//! `Chart.yaml`): placed into the chart's `charts/` as `helm dependency build` would, but
//! without running it, so rendering stays offline and reads only the repository. A
//! dependency fetched from elsewhere must be vendored into `charts/`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{dir_of, error_at, join_relative, locate_text};
use crate::specs::SpecError;

/// One entry of a chart's `dependencies`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dependency {
    /// The dependency's chart name (`name`).
    pub name: String,
    /// `repository` as written.
    pub repository: String,
    /// The chart's directory in the repository, for a `file://` dependency.
    pub local_dir: Option<String>,
    /// Where the `repository` is written in the `Chart.yaml`.
    pub at: (u64, u64),
}

/// A dependency to copy: the repository's chart at `from` becomes `into` (a directory under
/// the depending chart's `charts/`) in the render's work directory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    pub from: String,
    pub into: String,
}

/// The dependencies of the `Chart.yaml` at `path`, parsed.
pub fn parse(path: &str, value: &Value, text: &str) -> Result<Vec<Dependency>, SpecError> {
    let Some(list) = value.get("dependencies") else {
        return Ok(Vec::new());
    };
    let (line, column) = locate_text(text, "dependencies:");
    let bad = |why: &str| error_at(path, line, column, format!("`dependencies` {why}"));
    let Some(list) = list.as_array() else {
        return match list {
            Value::Null => Ok(Vec::new()),
            _ => Err(bad("is a list of charts")),
        };
    };
    let chart_dir = dir_of(path);
    let mut out = Vec::new();
    for entry in list {
        let field = |key: &str| entry.get(key).and_then(Value::as_str).unwrap_or_default();
        let name = field("name");
        if name.is_empty() {
            return Err(bad("has an entry without a `name`"));
        }
        // The name becomes a directory under charts/: one plain path segment, no way out.
        if name == "." || name == ".." || name.contains(['/', '\\']) {
            let (line, column) = locate_text(text, name);
            return Err(error_at(
                path,
                line,
                column,
                format!("dependency name `{name}` is not a chart name (no `/`, `\\` or `..`)"),
            ));
        }
        let repository = field("repository").to_string();
        let at = locate_text(text, &repository);
        let local_dir = match repository.strip_prefix("file://") {
            Some(rel) => Some(join_relative(chart_dir, rel).ok_or_else(|| {
                error_at(
                    path,
                    at.0,
                    at.1,
                    format!("dependency {name} at `{repository}` is outside the repository"),
                )
            })?),
            None => None,
        };
        out.push(Dependency {
            name: name.to_string(),
            repository,
            local_dir,
            at,
        });
    }
    Ok(out)
}

/// Whether the chart at `chart_dir` has `name` vendored in its `charts/` (a directory or a
/// packaged `NAME-VERSION.tgz`), judged by the listed paths.
pub fn vendored(listed: &BTreeMap<&str, &str>, chart_dir: &str, name: &str) -> bool {
    let charts = if chart_dir.is_empty() {
        "charts/".to_string()
    } else {
        format!("{chart_dir}/charts/")
    };
    let start = format!("{charts}{name}");
    listed
        .range(start.as_str()..)
        .map_while(|(p, _)| p.strip_prefix(&start))
        .any(|rest| {
            rest.starts_with('/')
                || (rest.starts_with('-') && rest.ends_with(".tgz") && !rest.contains('/'))
        })
}

/// The deepest chain of local dependencies followed; a chart that depends on itself through
/// a longer one is refused.
pub const MAX_DEPTH: usize = 8;

/// The most dependencies one release places, all levels together: charts that each name
/// many others would otherwise multiply at every level.
pub const MAX_PLACEMENTS: usize = 64;

/// The error for a dependency that cannot be rendered from the repository.
pub fn not_renderable(chart_file: &str, d: &Dependency, why: &str) -> SpecError {
    error_at(
        chart_file,
        d.at.0,
        d.at.1,
        format!("dependency {}: {why}", d.name),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deps(text: &str) -> Result<Vec<Dependency>, SpecError> {
        let value: Value = serde_saphyr::from_str(text).unwrap();
        parse("charts/app/Chart.yaml", &value, text)
    }

    #[test]
    fn a_file_dependency_is_resolved_from_the_charts_directory() {
        let d = deps(
            "apiVersion: v2\nname: app\nversion: 0.1.0\ndependencies:\n- name: lib\n  version: 0.1.0\n  repository: file://../lib\n- name: redis\n  repository: https://charts.example/\n",
        )
        .unwrap();
        assert_eq!(d[0].local_dir.as_deref(), Some("charts/lib"));
        assert_eq!(d[0].at, (7, 15));
        assert_eq!(d[1].local_dir, None);
    }

    #[test]
    fn a_dependency_outside_the_repository_is_located() {
        let e = deps("name: app\ndependencies:\n- name: x\n  repository: file://../../../etc\n")
            .unwrap_err();
        assert_eq!((e.location.line, e.location.column), (4, 15));
        assert!(e.message.contains("outside the repository"), "{e}");
    }

    #[test]
    fn vendored_charts_are_directories_or_packages_of_that_name() {
        let listed = [
            "c/charts/lib/Chart.yaml",
            "c/charts/redis-1.2.3.tgz",
            "c/charts/libx/Chart.yaml",
        ];
        let listed: BTreeMap<&str, &str> = listed.iter().map(|p| (*p, "id")).collect();
        assert!(vendored(&listed, "c", "lib"));
        assert!(vendored(&listed, "c", "redis"));
        assert!(!vendored(&listed, "c", "li"));
        assert!(!vendored(&listed, "d", "lib"));
    }
}
