//! Helm units: a `linnet-helm.yaml` names a chart (a directory of the repository, or a chart of
//! an allowed remote repository at a pinned version), the release and the values files; the
//! chart is rendered as `helm template` renders it. Helm's template errors name the template,
//! line and column, and are located there.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;

use serde_json::Value;

use super::run::{RunFailure, WorkDir, run_bounded, tool_message};
use super::{RenderOptions, Unit, error_at, join_relative, locate_text};
use crate::specs::SpecError;

/// What a `linnet-helm.yaml` declares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HelmRelease {
    /// The release name (`.Release.Name`); the directory's name when not set.
    pub release_name: String,
    /// `.Release.Namespace`, and the namespace of objects that name none.
    pub namespace: Option<String>,
    /// A path relative to the file, or the chart's name in `repository`.
    pub chart: String,
    /// An `https://` chart repository or an `oci://` registry, when the chart is remote.
    pub repository: Option<String>,
    /// The chart's exact version; required for a remote chart.
    pub version: Option<String>,
    /// Values files, relative to the file, in the order Helm merges them.
    pub values_files: Vec<String>,
    /// Values written in the file itself, merged last.
    pub values: Option<Value>,
    /// Where the chart, repository and values files are written in the file.
    pub written_at: BTreeMap<String, (u64, u64)>,
    /// The chart's dependencies in the repository, and where each is placed (found by the
    /// layout from the charts' `Chart.yaml`, not written in this file).
    pub local_dependencies: Vec<super::chart_deps::Placement>,
}

const FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "releaseName",
    "namespace",
    "chart",
    "repository",
    "version",
    "valuesFiles",
    "values",
];

impl HelmRelease {
    /// Reads a parsed `linnet-helm.yaml`; an unknown or mistyped field is a located error.
    pub(super) fn from_value(path: &str, v: &Value, text: &str) -> Result<HelmRelease, SpecError> {
        let at = |key: &str, message: String| {
            let (line, column) = locate_text(text, &format!("{key}:"));
            error_at(path, line, column, message)
        };
        let Some(map) = v.as_object() else {
            return Err(error_at(path, 1, 1, "a linnet-helm.yaml is a mapping: chart, releaseName, namespace, valuesFiles, values".into()));
        };
        for key in map.keys() {
            if !FIELDS.contains(&key.as_str()) {
                return Err(at(
                    key,
                    format!(
                        "unknown field `{key}`; a linnet-helm.yaml has {}",
                        FIELDS[2..].join(", ")
                    ),
                ));
            }
        }
        let string = |key: &str| -> Result<Option<String>, SpecError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
                Some(_) => Err(at(key, format!("`{key}` must be a non-empty string"))),
            }
        };
        let chart = string("chart")?.ok_or_else(|| {
            error_at(path, 1, 1, "`chart` is missing: the chart's directory, relative to this file (or its name in `repository`)".into())
        })?;
        let values_files = values_files(map.get("valuesFiles"))
            .ok_or_else(|| at("valuesFiles", "`valuesFiles` is a list of paths".into()))?;
        let values = match map.get("values") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(_) => return Err(at("values", "`values` is a mapping".into())),
        };
        let dir_name = super::dir_of(path)
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        let mut release = HelmRelease {
            release_name: string("releaseName")?.unwrap_or(if dir_name.is_empty() {
                "release".into()
            } else {
                dir_name
            }),
            namespace: string("namespace")?,
            chart,
            repository: string("repository")?,
            version: string("version")?,
            values_files,
            values,
            written_at: BTreeMap::new(),
            local_dependencies: Vec::new(),
        };
        let needles: Vec<String> = [Some(release.chart.clone()), release.repository.clone()]
            .into_iter()
            .flatten()
            .chain(release.values_files.iter().cloned())
            .collect();
        for needle in needles {
            let at = locate_text(text, &needle);
            release.written_at.insert(needle, at);
        }
        if release.repository.is_some() && !release.version.as_deref().is_some_and(is_exact_version)
        {
            return Err(at("repository", "a remote chart needs `version`, an exact version (1.2.3): a range would render differently from one day to the next".into()));
        }
        Ok(release)
    }

    /// Adds the files the release reads to `inputs`, or says why it cannot be rendered.
    pub(super) fn inputs(
        &self,
        path: &str,
        dir: &str,
        files: &BTreeMap<&str, &str>,
        chart_dirs: &BTreeSet<&str>,
        render: &RenderOptions,
        inputs: &mut BTreeMap<String, String>,
    ) -> Result<(), SpecError> {
        let text_error = |needle: &str, message: String| {
            let (line, column) = self.written_at.get(needle).copied().unwrap_or((1, 1));
            error_at(path, line, column, message)
        };
        match &self.repository {
            Some(repo) => {
                let host = super::remote_host(repo).unwrap_or_default();
                if !(repo.starts_with("https://") || repo.starts_with("oci://")) {
                    return Err(text_error(
                        repo,
                        format!(
                            "`repository` is an https:// chart repository or an oci:// registry, not `{repo}`"
                        ),
                    ));
                }
                if host.is_empty() {
                    return Err(text_error(
                        repo,
                        format!(
                            "`repository` `{repo}` has no host linnet can read for sure (a backslash, a space or a password in it): write it as https://host/path"
                        ),
                    ));
                }
                if !render.allows_host(&host) {
                    return Err(text_error(
                        repo,
                        format!(
                            "the chart is fetched from {host}, and rendering is offline: vendor the chart into the repository, or let the agent fetch from {host} with --render-allow-host {host}"
                        ),
                    ));
                }
            }
            None => {
                let chart = join_relative(dir, &self.chart).ok_or_else(|| {
                    text_error(
                        &self.chart,
                        format!("chart `{}` is outside the repository", self.chart),
                    )
                })?;
                if !chart_dirs.contains(chart.as_str()) {
                    return Err(text_error(
                        &self.chart,
                        format!(
                            "no chart at `{}` ({chart}/Chart.yaml is not in the repository)",
                            self.chart
                        ),
                    ));
                }
                let prefix = format!("{chart}/");
                for (p, id) in files.range(prefix.as_str()..) {
                    if !p.starts_with(&prefix) {
                        break;
                    }
                    inputs.insert(p.to_string(), id.to_string());
                }
            }
        }
        for values in &self.values_files {
            let file = join_relative(dir, values)
                .filter(|f| files.contains_key(f.as_str()))
                .ok_or_else(|| {
                    text_error(
                        values,
                        format!("values file `{values}` is not in the repository"),
                    )
                })?;
            inputs.insert(file.clone(), files[file.as_str()].to_string());
        }
        Ok(())
    }
}

fn is_exact_version(v: &str) -> bool {
    let v = v.strip_prefix('v').unwrap_or(v);
    let core = v.split(['-', '+']).next().unwrap_or("");
    core.split('.').count() == 3
        && core
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Renders a Helm unit: its output, or an error located in the template, values file or
/// `linnet-helm.yaml` it is about.
pub(super) fn render(
    unit: &Unit,
    release: &HelmRelease,
    inputs: &[(String, Vec<u8>)],
    work: &WorkDir,
    render: &RenderOptions,
) -> Result<Vec<u8>, SpecError> {
    let write_error = |e| super::write_error(unit, e);
    for (path, bytes) in inputs {
        work.write(path, bytes).map_err(write_error)?;
    }
    // Placed as `helm dependency build` would, without a run that might go to the network.
    for placement in &release.local_dependencies {
        let from = format!("{}/", placement.from);
        for (path, bytes) in inputs {
            if let Some(rest) = path.strip_prefix(&from) {
                let into = format!("{}/{rest}", placement.into);
                work.write(&into, bytes).map_err(write_error)?;
            }
        }
    }
    let root = work.inputs();
    let mut args: Vec<OsString> = vec!["template".into(), release.release_name.clone().into()];
    let chart_dir = match &release.repository {
        Some(repo) => {
            if repo.starts_with("oci://") {
                args.push(format!("{}/{}", repo.trim_end_matches('/'), release.chart).into());
            } else {
                args.extend([release.chart.clone().into(), "--repo".into(), repo.into()]);
            }
            args.extend([
                "--version".into(),
                release.version.clone().unwrap_or_default().into(),
            ]);
            None
        }
        None => {
            let chart = join_relative(&unit.dir, &release.chart).unwrap_or_default();
            args.push(root.join(&chart).into_os_string());
            Some(chart)
        }
    };
    if let Some(ns) = &release.namespace {
        args.extend(["--namespace".into(), ns.into()]);
    }
    for values in &release.values_files {
        let file = join_relative(&unit.dir, values).unwrap_or_default();
        args.extend(["--values".into(), root.join(file).into_os_string()]);
    }
    if let Some(values) = &release.values {
        let inline = work.home().join("inline-values.json");
        std::fs::write(&inline, serde_json::to_vec(values).unwrap_or_default())
            .map_err(write_error)?;
        args.extend(["--values".into(), inline.into_os_string()]);
    }
    args.extend(["--include-crds".into(), "--skip-tests".into()]);
    let network = release.repository.is_some();
    run_bounded(&render.helm, &args, &root, &work.home(), network, render).map_err(|e| match e {
        RunFailure::Failed(stderr) => {
            locate_failure(unit, chart_dir.as_deref(), &stderr, &root, inputs)
        }
        other => error_at(&unit.key, 1, 1, format!("helm template failed: {other}")),
    })
}

/// Helm's error, located: `template: NAME/templates/x.yaml:12:3: ...` at that template in the
/// chart, `.../values.yaml: ... line 3` at that values file, otherwise at the unit's file.
fn locate_failure(
    unit: &Unit,
    chart_dir: Option<&str>,
    stderr: &str,
    work_dir: &std::path::Path,
    inputs: &[(String, Vec<u8>)],
) -> SpecError {
    let text = tool_message(stderr, work_dir);
    let message = format!("helm template failed: {text}");
    // `parse error at (NAME/templates/x.yaml:12): ...`: a template that does not parse.
    if let (Some(chart), Some(at)) = (chart_dir, text.find("parse error at (")) {
        let rest = &text[at + "parse error at (".len()..];
        let inside = rest.split(')').next().unwrap_or("");
        if let Some((file, line)) = inside.rsplit_once(':')
            && let (Some((_, in_chart)), Ok(line)) = (file.split_once('/'), line.parse::<u64>())
        {
            return error_at(&format!("{chart}/{in_chart}"), line, 1, message);
        }
    }
    if let (Some(chart), Some(at)) = (chart_dir, text.find("template: ")) {
        // NAME/templates/x.yaml:12:3: the chart's name, then the path in the chart.
        let rest = &text[at + "template: ".len()..];
        let mut parts = rest.splitn(4, ':');
        if let (Some(file), Some(line), col) = (parts.next(), parts.next(), parts.next())
            && let (Some((_, in_chart)), Ok(line)) =
                (file.split_once('/'), line.trim().parse::<u64>())
        {
            let column = col.and_then(|c| c.trim().parse::<u64>().ok()).unwrap_or(1);
            return error_at(&format!("{chart}/{in_chart}"), line, column.max(1), message);
        }
    }
    for (path, _) in inputs {
        if text.contains(path)
            && let Some(line) = line_after(&text, "line ")
        {
            return error_at(path, line, 1, message);
        }
    }
    error_at(&unit.key, 1, 1, message)
}

/// The number after the first `word` in `text`.
fn line_after(text: &str, word: &str) -> Option<u64> {
    let at = text.find(word)? + word.len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// A `valuesFiles` list (none when unset); `None` when it is not a list of paths.
fn values_files(v: Option<&Value>) -> Option<Vec<String>> {
    match v {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect(),
        Some(_) => None,
    }
}
