//! Which directories of a revision are rendered, and from which files.
//!
//! The rules are Flux's and Argo CD's, made one rule for a tree that holds many apps: a
//! directory with a kustomization is a kustomize unit unless another kustomization uses it
//! (`resources`, `bases` or `components`): a base alone is never applied, its overlays are.
//! A directory with a [`HELM_FILE`] is a Helm unit. No file below a kustomization, a
//! `linnet-helm.yaml` or a chart (`Chart.yaml`) is read as plain YAML; every other spec file is.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{RENDERED, RenderOptions, dir_of, error_at, join_relative, locate_text, remote_host};
use crate::specs::{BLOCKED, FileContent, LoadOptions, SpecError, parse_config_file};

mod layout;
pub use layout::layout;

/// The names kustomize reads as a directory's kustomization, in its order of preference.
pub const KUSTOMIZATION_NAMES: [&str; 3] =
    ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// The file that declares a Helm unit: the chart, the release and the values files.
pub const HELM_FILE: &str = "linnet-helm.yaml";

const CHART_FILE: &str = "Chart.yaml";

/// Whether a changed path can change which units there are.
pub fn is_render_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    KUSTOMIZATION_NAMES.contains(&name) || name == HELM_FILE || name == CHART_FILE
}

/// What renders a unit.
#[derive(Clone, Debug, PartialEq)]
pub enum UnitKind {
    Kustomize,
    Helm(Box<super::helm::HelmRelease>),
}

/// A directory rendered as one unit.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    /// Its kustomization or `linnet-helm.yaml`: the name its objects and errors go by.
    pub key: String,
    /// Its directory (`""` at the root).
    pub dir: String,
    pub kind: UnitKind,
    /// The files it reads, as listed (`path`, content id).
    pub inputs: Vec<(String, String)>,
    /// Why it cannot be rendered, found before any tool runs.
    pub problem: Option<SpecError>,
    /// Hash of the inputs: equal hashes, equal output.
    pub hash: String,
}

/// A revision's listing split into plain spec files and rendered units.
#[derive(Debug, Default)]
pub struct Layout {
    /// Files read as they are (`path`, content id).
    pub plain: Vec<(String, String)>,
    /// Units by key.
    pub units: BTreeMap<String, Unit>,
}

impl Layout {
    /// The listing the snapshot keeps: plain files, and each unit as one entry whose id is
    /// [`RENDERED`] and its hash.
    pub fn listing(&self) -> Vec<(String, String)> {
        let mut out = self.plain.clone();
        out.extend(
            self.units
                .values()
                .map(|u| (u.key.clone(), format!("{RENDERED}{}", u.hash))),
        );
        out.sort();
        out
    }
}

/// A kustomization's references, read once per content id.
#[derive(Clone, Debug)]
pub(super) enum Parsed {
    /// The repository paths its references name (resolved: they depend only on its path and
    /// content, and on the render options, which a snapshot keeps).
    Kustomization(Result<Vec<String>, SpecError>),
    Helm(Result<super::helm::HelmRelease, SpecError>),
    /// A `Chart.yaml`'s dependencies.
    Chart(Result<Vec<super::chart_deps::Dependency>, SpecError>),
}

/// Which kind of render file a path is read as.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum RenderFile {
    Kustomization,
    Helm,
    Chart,
}

/// An entry of `resources`, `bases` or `components`, and where it is written.
#[derive(Clone, Debug)]
pub(super) struct Reference {
    pub text: String,
    pub line: u64,
    pub column: u64,
}

/// What the last layouts read, by (path, content id).
#[derive(Debug, Default)]
pub struct ParsedFiles {
    by_id: HashMap<(String, String), std::sync::Arc<Parsed>>,
}

/// A kustomization's resolved references, or a `linnet-helm.yaml`'s release.
fn parse_render_file(
    path: &str,
    content: FileContent,
    kind: RenderFile,
    opts: &LoadOptions,
    render: &RenderOptions,
) -> Parsed {
    let (value, text) = match content {
        FileContent::Bytes(bytes) => (
            parse_config_file(path, &bytes, opts),
            String::from_utf8_lossy(&bytes).into_owned(),
        ),
        FileContent::Refused(why) => (Err(error_at(path, 1, 1, why)), String::new()),
    };
    match kind {
        RenderFile::Helm => {
            Parsed::Helm(value.and_then(|v| super::helm::HelmRelease::from_value(path, &v, &text)))
        }
        RenderFile::Chart => {
            Parsed::Chart(value.and_then(|v| super::chart_deps::parse(path, &v, &text)))
        }
        RenderFile::Kustomization => {
            let dir = dir_of(path);
            Parsed::Kustomization(value.and_then(|v| {
                super::fetched::check(path, &v, &text, render)?;
                resolve(path, dir, &references(&v, &text), render)
            }))
        }
    }
}

impl ParsedFiles {
    /// Whether kustomization `path`, changed from content `old_id` to `new_id`, still names
    /// the same paths (then no unit's layout changes); its new parse is kept when it does.
    pub fn same_references<E>(
        &mut self,
        path: &str,
        (old_id, new_id): (&str, &str),
        read: &mut impl FnMut(&str, &str) -> Result<FileContent, E>,
        opts: &LoadOptions,
        render: &RenderOptions,
    ) -> Result<bool, E> {
        let old_key = (path.to_string(), old_id.to_string());
        let Some(Parsed::Kustomization(Ok(old))) = self.by_id.get(&old_key).map(|p| &**p) else {
            return Ok(false);
        };
        let new = parse_render_file(
            path,
            read(path, new_id)?,
            RenderFile::Kustomization,
            opts,
            render,
        );
        let same = matches!(&new, Parsed::Kustomization(Ok(targets)) if targets == old);
        if same {
            self.by_id.remove(&old_key);
            self.by_id.insert(
                (path.to_string(), new_id.to_string()),
                std::sync::Arc::new(new),
            );
        }
        Ok(same)
    }
}

impl Unit {
    /// The unit with the content ids of some inputs changed, and its hash made again.
    pub fn with_inputs(&self, changed: &HashMap<&str, &str>, render: &RenderOptions) -> Unit {
        let inputs = self
            .inputs
            .iter()
            .map(|(p, id)| {
                let id = changed.get(p.as_str()).map_or(id.as_str(), |new| *new);
                (p.clone(), id.to_string())
            })
            .collect();
        unit(
            &self.key,
            &self.dir,
            self.kind.clone(),
            inputs,
            self.problem.clone(),
            render,
        )
    }
}

fn unit(
    key: &str,
    dir: &str,
    kind: UnitKind,
    inputs: BTreeMap<String, String>,
    problem: Option<SpecError>,
    render: &RenderOptions,
) -> Unit {
    let mut h = Sha256::new();
    h.update(format!("{kind:?}\0{key}\0{render:?}\0").as_bytes());
    if let Some(p) = &problem {
        h.update(p.to_string().as_bytes());
    }
    for (p, id) in &inputs {
        h.update(p.as_bytes());
        h.update([0]);
        h.update(id.as_bytes());
        h.update([b'\n']);
    }
    Unit {
        key: key.to_string(),
        dir: dir.to_string(),
        kind,
        inputs: inputs.into_iter().collect(),
        problem,
        hash: hex::encode(h.finalize()),
    }
}

/// The entries of a kustomization's `resources`, `bases` and `components`, each located at
/// the first line that writes it.
fn references(v: &Value, text: &str) -> Vec<Reference> {
    let mut out = Vec::new();
    for field in ["resources", "bases", "components"] {
        for item in v.get(field).and_then(Value::as_array).into_iter().flatten() {
            if let Some(s) = item.as_str() {
                let (line, column) = locate_text(text, s);
                out.push(Reference {
                    text: s.to_string(),
                    line,
                    column,
                });
            }
        }
    }
    out
}

/// The repository paths a kustomization's references name, or why one is refused: remote
/// (unless its host is allowed) or outside the repository.
fn resolve(
    path: &str,
    dir: &str,
    refs: &[Reference],
    render: &RenderOptions,
) -> Result<Vec<String>, SpecError> {
    let mut out = Vec::new();
    for r in refs {
        let at = |message: String| error_at(path, r.line, r.column, message);
        if let Some(host) = remote_host(&r.text) {
            if render.allows_host(&host) {
                continue;
            }
            return Err(at(format!(
                "`{}` is a remote base, and rendering is offline: linnet renders what the \
                 repository holds. Vendor it into the repository, or let the agent fetch from \
                 {host} with --render-allow-host {host}",
                r.text
            )));
        }
        match join_relative(dir, &r.text) {
            Some(target) => out.push(target),
            None => {
                return Err(at(format!(
                    "`{}` is outside the repository; linnet renders only what the repository \
                     holds: vendor the base into it",
                    r.text
                )));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(files: &[(&str, &str)]) -> (Vec<(String, String)>, BTreeMap<String, String>) {
        let listing = files
            .iter()
            .enumerate()
            .map(|(i, (p, _))| (p.to_string(), format!("id{i}")))
            .collect();
        let content = files
            .iter()
            .map(|(p, c)| (p.to_string(), c.to_string()))
            .collect();
        (listing, content)
    }

    fn layout_of(files: &[(&str, &str)], render: &RenderOptions) -> Layout {
        let (listing, content) = listing(files);
        let mut read = |p: &str, _: &str| -> Result<FileContent, ()> {
            Ok(FileContent::Bytes(content[p].clone().into_bytes()))
        };
        layout(
            &listing,
            &mut read,
            &mut ParsedFiles::default(),
            &LoadOptions::default(),
            render,
        )
        .unwrap()
    }

    fn plain(l: &Layout) -> Vec<&str> {
        l.plain.iter().map(|(p, _)| p.as_str()).collect()
    }

    const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n";

    #[test]
    fn a_base_used_by_overlays_is_not_a_unit_of_its_own_and_its_files_are_not_plain() {
        let l = layout_of(
            &[
                ("apps/plain.yaml", CM),
                ("base/kustomization.yaml", "resources: [cm.yaml]\n"),
                ("base/cm.yaml", CM),
                (
                    "overlays/staging/kustomization.yaml",
                    "resources: [../../base]\nnamespace: staging\n",
                ),
                ("overlays/staging/patch.yaml", CM),
                (
                    "overlays/prod/kustomization.yml",
                    "resources:\n- ../../base\n",
                ),
            ],
            &RenderOptions::default(),
        );
        assert_eq!(plain(&l), ["apps/plain.yaml"]);
        let keys: Vec<&str> = l.units.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "overlays/prod/kustomization.yml",
                "overlays/staging/kustomization.yaml"
            ]
        );
        let staging = &l.units["overlays/staging/kustomization.yaml"];
        let inputs: Vec<&str> = staging.inputs.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            inputs,
            [
                "base/cm.yaml",
                "base/kustomization.yaml",
                "overlays/staging/kustomization.yaml",
                "overlays/staging/patch.yaml"
            ]
        );
        assert!(staging.problem.is_none());
    }

    #[test]
    fn a_unit_hash_changes_with_its_inputs_only() {
        let files = [
            ("base/kustomization.yaml", "resources: [cm.yaml]\n"),
            ("base/cm.yaml", CM),
            ("a/kustomization.yaml", "resources: [../base]\n"),
            ("b/kustomization.yaml", "resources: [cm.yaml]\n"),
            ("b/cm.yaml", CM),
        ];
        let (mut listing, content) = listing(&files);
        let render = RenderOptions::default();
        let mut read = |p: &str, _: &str| -> Result<FileContent, ()> {
            Ok(FileContent::Bytes(content[p].clone().into_bytes()))
        };
        let mut parsed = ParsedFiles::default();
        let opts = LoadOptions::default();
        let before = layout(&listing, &mut read, &mut parsed, &opts, &render).unwrap();
        // b's file changes: a's hash stays, b's moves.
        listing[4].1 = "changed".into();
        let after = layout(&listing, &mut read, &mut parsed, &opts, &render).unwrap();
        assert_eq!(
            before.units["a/kustomization.yaml"].hash,
            after.units["a/kustomization.yaml"].hash
        );
        assert_ne!(
            before.units["b/kustomization.yaml"].hash,
            after.units["b/kustomization.yaml"].hash
        );
        // The base changes: a moves.
        listing[1].1 = "changed".into();
        let base_changed = layout(&listing, &mut read, &mut parsed, &opts, &render).unwrap();
        assert_ne!(
            after.units["a/kustomization.yaml"].hash,
            base_changed.units["a/kustomization.yaml"].hash
        );
    }

    #[test]
    fn a_remote_base_is_a_located_error_unless_its_host_is_allowed() {
        let files = [
            (
                "app/kustomization.yaml",
                "resources:\n- cm.yaml\n- https://github.com/org/repo//base?ref=v1\n",
            ),
            ("app/cm.yaml", CM),
        ];
        let l = layout_of(&files, &RenderOptions::default());
        let problem = l.units["app/kustomization.yaml"].problem.clone().unwrap();
        assert_eq!((problem.location.line, problem.location.column), (3, 3));
        assert!(
            problem.message.contains("--render-allow-host github.com"),
            "{problem}"
        );
        let allowed = RenderOptions {
            allowed_hosts: vec!["github.com".into()],
            ..RenderOptions::default()
        };
        assert!(
            layout_of(&files, &allowed).units["app/kustomization.yaml"]
                .problem
                .is_none()
        );
    }

    #[test]
    fn a_reference_outside_the_repository_is_a_located_error() {
        let l = layout_of(
            &[("app/kustomization.yaml", "resources:\n- ../../elsewhere\n")],
            &RenderOptions::default(),
        );
        let problem = l.units["app/kustomization.yaml"].problem.clone().unwrap();
        assert_eq!(problem.location.line, 2);
        assert!(
            problem.message.contains("outside the repository"),
            "{problem}"
        );
    }

    #[test]
    fn remote_forms_are_told_from_local_paths() {
        for (r, host) in [
            ("https://example.com/x.yaml", Some("example.com")),
            ("github.com/org/repo//path?ref=v1", Some("github.com")),
            ("git@gitlab.com:org/repo.git", Some("gitlab.com")),
            ("ssh://git@host.io:22/r", Some("host.io")),
            ("../base", None),
            ("deployment.yaml", None),
            ("dir.v2/file.yaml", None),
        ] {
            assert_eq!(remote_host(r).as_deref(), host, "{r}");
        }
    }

    #[test]
    fn a_helm_unit_reads_its_chart_and_values_and_owns_its_directory() {
        let l = layout_of(
            &[
                (
                    "charts/web/Chart.yaml",
                    "apiVersion: v2\nname: web\nversion: 0.1.0\n",
                ),
                ("charts/web/templates/cm.yaml", "{{ .Values.x }}"),
                (
                    "envs/staging/linnet-helm.yaml",
                    "chart: ../../charts/web\nnamespace: staging\nvaluesFiles: [values.yaml]\n",
                ),
                ("envs/staging/values.yaml", "x: 1\n"),
                ("envs/plain.yaml", CM),
            ],
            &RenderOptions::default(),
        );
        assert_eq!(plain(&l), ["envs/plain.yaml"]);
        let unit = &l.units["envs/staging/linnet-helm.yaml"];
        assert!(unit.problem.is_none(), "{:?}", unit.problem);
        let inputs: Vec<&str> = unit.inputs.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            inputs,
            [
                "charts/web/Chart.yaml",
                "charts/web/templates/cm.yaml",
                "envs/staging/linnet-helm.yaml",
                "envs/staging/values.yaml"
            ]
        );
        let UnitKind::Helm(release) = &unit.kind else {
            panic!("not helm")
        };
        assert_eq!(release.release_name, "staging");
    }

    #[test]
    fn helm_declarations_with_mistakes_are_located_errors() {
        for (decl, line, says) in [
            ("chart: ../nope\n", 1, "no chart at"),
            (
                "chart: ../c\nvaluesFiles: [missing.yaml]\n",
                2,
                "values file `missing.yaml`",
            ),
            ("chart: ../c\ncharts: x\n", 2, "unknown field `charts`"),
            (
                "chart: web\nrepository: https://charts.example.com\nversion: 1.2.3\n",
                2,
                "--render-allow-host charts.example.com",
            ),
            (
                "chart: web\nrepository: https://charts.example.com\nversion: ^1.2\n",
                2,
                "exact version",
            ),
        ] {
            let l = layout_of(
                &[
                    ("c/Chart.yaml", "apiVersion: v2\nname: c\nversion: 0.1.0\n"),
                    ("r/linnet-helm.yaml", decl),
                ],
                &RenderOptions::default(),
            );
            let problem = l.units["r/linnet-helm.yaml"].problem.clone().unwrap();
            assert!(problem.message.contains(says), "{decl}: {problem}");
            assert_eq!(problem.location.line, line, "{decl}: {problem}");
        }
    }

    #[test]
    fn kustomizations_that_use_each_other_are_errors_not_silence() {
        let l = layout_of(
            &[
                ("a/kustomization.yaml", "resources: [../b]\n"),
                ("b/kustomization.yaml", "resources: [../a]\n"),
            ],
            &RenderOptions::default(),
        );
        for key in ["a/kustomization.yaml", "b/kustomization.yaml"] {
            let problem = l.units[key].problem.clone().unwrap();
            assert!(problem.message.contains("cycle"), "{problem}");
        }
    }

    #[test]
    fn a_listing_without_units_is_passed_through() {
        let l = layout_of(
            &[("a.yaml", CM), ("b/c.yaml", CM)],
            &RenderOptions::default(),
        );
        assert_eq!(plain(&l), ["a.yaml", "b/c.yaml"]);
        assert!(l.units.is_empty());
    }
}
