//! The layout of a revision: which directories are kustomize or Helm units (a unit per root
//! kustomization, with every file it reaches; one per helm file), and which files are read
//! as plain YAML.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::*;
use crate::render::chart_deps::Placement;
use crate::specs::PathSelection;

/// Splits `listing` into plain files and units. Reads (with `read`) only the kustomizations
/// and `linnet-helm.yaml` files not read before; a listing without any is passed through.
pub fn layout<E>(
    listing: &[(String, String)],
    read: &mut impl FnMut(&str, &str) -> Result<FileContent, E>,
    parsed: &mut ParsedFiles,
    opts: &LoadOptions,
    render: &RenderOptions,
) -> Result<Layout, E> {
    let selection = &opts.selection;
    if !listing.iter().any(|(p, _)| is_render_file(p)) {
        return Ok(Layout {
            plain: listing
                .iter()
                .filter(|(p, id)| applied_as_listed(p, id, selection))
                .cloned()
                .collect(),
            units: BTreeMap::new(),
        });
    }
    let files: BTreeMap<&str, &str> = listing
        .iter()
        .map(|(p, i)| (p.as_str(), i.as_str()))
        .collect();
    let dirs = RenderDirs::of(listing);
    let mut new_parsed = HashMap::new();
    let mut parse = |path: &str, kind: RenderFile| -> Result<std::sync::Arc<Parsed>, E> {
        let id = files.get(path).copied().unwrap_or_default();
        let key = (path.to_string(), id.to_string());
        if let Some(p) = parsed.by_id.remove(&key) {
            new_parsed.insert(key, p.clone());
            return Ok(p);
        }
        let p = std::sync::Arc::new(parse_render_file(path, read(path, id)?, kind, opts, render));
        new_parsed.insert(key, p.clone());
        Ok(p)
    };
    let graph = KustomizeGraph::of(&dirs, selection, &mut parse)?;
    let mut units = kustomize_units(&files, &dirs, &graph, selection, render);
    for (&dir, &path) in &dirs.helm {
        if !selection.selects(dir) {
            continue;
        }
        let parsed = parse(path, RenderFile::Helm)?;
        let Parsed::Helm(release) = &*parsed else {
            continue;
        };
        let mut release = release.clone();
        let mut dependencies = Ok(());
        if let Ok(r) = &mut release {
            match local_dependencies(&files, &dirs, dir, r, &mut parse)? {
                Ok(placed) => r.local_dependencies = placed,
                Err(e) => dependencies = Err(e),
            }
        }
        let mut unit = helm_unit(&files, &dirs, (dir, path), release, render);
        if let Err(e) = dependencies {
            unit.problem.get_or_insert(e);
        }
        units.insert(path.to_string(), unit);
    }
    parsed.by_id = new_parsed;
    let owners: HashSet<&str> = dirs
        .kustomize
        .keys()
        .chain(dirs.helm.keys())
        .chain(dirs.charts.iter())
        .copied()
        .collect();
    let plain = listing
        .iter()
        .filter(|(p, id)| {
            applied_as_listed(p, id, selection)
                && (id.starts_with(BLOCKED)
                    || selection
                        .root_of(p)
                        .is_some_and(|root| !owned(p, root, &owners)))
        })
        .cloned()
        .collect();
    Ok(Layout { plain, units })
}

/// Whether a listed file is applied when no renderer owns it: it is below a selected path, or
/// it is a blocked directory ([`BLOCKED`]) holding a selected path.
fn applied_as_listed(path: &str, id: &str, selection: &PathSelection) -> bool {
    selection.selects(path) || (id.starts_with(BLOCKED) && selection.is_above_one(path))
}

/// The directories rendered rather than read: each kustomization's and helm file's (by
/// directory), and every chart's.
struct RenderDirs<'a> {
    kustomize: BTreeMap<&'a str, &'a str>,
    helm: BTreeMap<&'a str, &'a str>,
    charts: BTreeSet<&'a str>,
}

impl<'a> RenderDirs<'a> {
    fn of(listing: &'a [(String, String)]) -> RenderDirs<'a> {
        let mut dirs = RenderDirs {
            kustomize: BTreeMap::new(),
            helm: BTreeMap::new(),
            charts: BTreeSet::new(),
        };
        for (path, _) in listing {
            let name = path.rsplit('/').next().unwrap_or(path);
            let dir = dir_of(path);
            if KUSTOMIZATION_NAMES.contains(&name) {
                // The first name in kustomize's order wins, as in kustomize.
                let better = dirs.kustomize.get(dir).is_none_or(|old| {
                    let rank = |p: &str| KUSTOMIZATION_NAMES.iter().position(|n| p.ends_with(n));
                    rank(path) < rank(old)
                });
                if better {
                    dirs.kustomize.insert(dir, path);
                }
            } else if name == HELM_FILE {
                dirs.helm.insert(dir, path);
            } else if name == CHART_FILE {
                dirs.charts.insert(dir);
            }
        }
        dirs
    }
}

/// The references of every kustomization below a selected path and of those they reach
/// (none other is read), and the kustomizations that cannot be read.
struct KustomizeGraph<'a> {
    edges: BTreeMap<&'a str, Vec<String>>,
    problems: BTreeMap<&'a str, SpecError>,
    /// Kustomizations a selected one uses: not roots, unless a path names them.
    used: HashSet<String>,
}

impl<'a> KustomizeGraph<'a> {
    fn of<E>(
        dirs: &RenderDirs<'a>,
        selection: &PathSelection,
        parse: &mut impl FnMut(&str, RenderFile) -> Result<std::sync::Arc<Parsed>, E>,
    ) -> Result<KustomizeGraph<'a>, E> {
        let mut graph = KustomizeGraph {
            edges: BTreeMap::new(),
            problems: BTreeMap::new(),
            used: HashSet::new(),
        };
        let mut todo: Vec<&'a str> = dirs
            .kustomize
            .keys()
            .copied()
            .filter(|d| selection.selects(d))
            .rev()
            .collect();
        let mut seen = HashSet::new();
        while let Some(dir) = todo.pop() {
            let Some(&path) = dirs.kustomize.get(dir) else {
                continue;
            };
            if !seen.insert(dir) {
                continue;
            }
            let parsed = parse(path, RenderFile::Kustomization)?;
            let Parsed::Kustomization(targets) = &*parsed else {
                continue;
            };
            match targets {
                Ok(targets) => {
                    for t in targets {
                        if let Some((&target, _)) = dirs.kustomize.get_key_value(t.as_str()) {
                            if selection.selects(dir) {
                                graph.used.insert(t.clone());
                            }
                            todo.push(target);
                        }
                    }
                    graph.edges.insert(dir, targets.clone());
                }
                Err(e) => {
                    graph.problems.insert(dir, e.clone());
                }
            }
        }
        Ok(graph)
    }
}

/// A unit per root kustomization, with every file it reaches as inputs; and one with an
/// error per kustomization only a cycle uses.
fn kustomize_units(
    files: &BTreeMap<&str, &str>,
    dirs: &RenderDirs<'_>,
    graph: &KustomizeGraph<'_>,
    selection: &PathSelection,
    render: &RenderOptions,
) -> BTreeMap<String, Unit> {
    let mut units = BTreeMap::new();
    let mut reached: HashSet<String> = HashSet::new();
    let root =
        |dir: &str| selection.selects(dir) && (!graph.used.contains(dir) || selection.names(dir));
    for (&dir, &path) in &dirs.kustomize {
        if !root(dir) {
            continue;
        }
        let mut inputs = BTreeMap::new();
        let mut seen = HashSet::new();
        let mut todo = vec![dir.to_string()];
        while let Some(d) = todo.pop() {
            if !seen.insert(d.clone()) {
                continue;
            }
            add_tree(files, &d, &mut inputs);
            for t in graph.edges.get(d.as_str()).into_iter().flatten() {
                match files.get(t.as_str()) {
                    Some(id) => {
                        inputs.insert(t.clone(), id.to_string());
                    }
                    None => todo.push(t.clone()),
                }
            }
        }
        let problem = graph.problems.get(dir).cloned().or_else(|| {
            seen.iter()
                .find(|d| d.as_str() != dir && graph.problems.contains_key(d.as_str()))
                .and_then(|d| graph.problems.get(d.as_str()).cloned())
        });
        let kind = UnitKind::Kustomize;
        units.insert(
            path.to_string(),
            unit(path, dir, kind, inputs, problem, render),
        );
        reached.extend(seen);
    }
    // Kustomizations that only use each other (a cycle): no unit would render them, and
    // silence would hide them; each is a unit with that error.
    for (&dir, &path) in &dirs.kustomize {
        if reached.contains(dir) || !graph.used.contains(dir) || !selection.selects(dir) {
            continue;
        }
        let problem = error_at(
            path,
            1,
            1,
            "this kustomization is used only by kustomizations that use it in turn (a cycle \
             of `resources`): none of them is rendered; break the cycle"
                .into(),
        );
        let id = files.get(path).copied().unwrap_or_default();
        let inputs = BTreeMap::from([(path.to_string(), id.to_string())]);
        let kind = UnitKind::Kustomize;
        units.insert(
            path.to_string(),
            unit(path, dir, kind, inputs, Some(problem), render),
        );
    }
    units
}

/// The unit of the helm file at `path` in `dir`: its release, or why it cannot render.
fn helm_unit(
    files: &BTreeMap<&str, &str>,
    dirs: &RenderDirs<'_>,
    (dir, path): (&str, &str),
    release: Result<crate::render::helm::HelmRelease, SpecError>,
    render: &RenderOptions,
) -> Unit {
    let mut inputs = BTreeMap::new();
    inputs.insert(
        path.to_string(),
        files.get(path).copied().unwrap_or_default().to_string(),
    );
    let (kind, problem) = match release {
        Ok(release) => {
            let problem = dirs
                .kustomize
                .get(dir)
                .map(|k| {
                    error_at(
                        path,
                        1,
                        1,
                        format!(
                            "this directory holds {k} too; a directory is rendered one way: \
                             move one of them"
                        ),
                    )
                })
                .or_else(|| {
                    release
                        .inputs(path, dir, files, &dirs.charts, render, &mut inputs)
                        .err()
                });
            for placement in &release.local_dependencies {
                add_tree(files, &placement.from, &mut inputs);
            }
            (UnitKind::Helm(Box::new(release)), problem)
        }
        Err(e) => (UnitKind::Helm(Default::default()), Some(e)),
    };
    unit(path, dir, kind, inputs, problem, render)
}

/// Where each of a local chart's dependencies in the repository is placed (its own too, under
/// its copy), or the dependency that cannot be rendered from the repository.
fn local_dependencies<E>(
    files: &BTreeMap<&str, &str>,
    dirs: &RenderDirs<'_>,
    dir: &str,
    release: &crate::render::helm::HelmRelease,
    parse: &mut impl FnMut(&str, RenderFile) -> Result<std::sync::Arc<Parsed>, E>,
) -> Result<Result<Vec<Placement>, SpecError>, E> {
    use crate::render::chart_deps::{MAX_DEPTH, MAX_PLACEMENTS, not_renderable, vendored};
    let chart = match (&release.repository, join_relative(dir, &release.chart)) {
        (None, Some(chart)) if dirs.charts.contains(chart.as_str()) => chart,
        // A remote chart brings its own; a missing one is the release's error.
        _ => return Ok(Ok(Vec::new())),
    };
    let mut placed = Vec::new();
    let mut stack = vec![(chart.clone(), chart, 0)];
    while let Some((source, into, depth)) = stack.pop() {
        let chart_file = format!("{source}/{CHART_FILE}")
            .trim_start_matches('/')
            .to_string();
        let dependencies = match &*parse(&chart_file, RenderFile::Chart)? {
            Parsed::Chart(Ok(d)) => d.clone(),
            Parsed::Chart(Err(e)) => return Ok(Err(e.clone())),
            _ => Vec::new(),
        };
        for d in dependencies {
            if vendored(files, &source, &d.name) {
                continue;
            }
            let Some(from) = d.local_dir.clone() else {
                return Ok(Err(not_renderable(
                    &chart_file,
                    &d,
                    &format!(
                        "it is fetched from `{}`, and rendering is offline: vendor it (run \
                         `helm dependency build` and commit the chart's charts/ directory)",
                        d.repository
                    ),
                )));
            };
            if !dirs.charts.contains(from.as_str()) {
                let why = format!(
                    "no chart at `{}` ({from}/Chart.yaml is not in the repository)",
                    d.repository
                );
                return Ok(Err(not_renderable(&chart_file, &d, &why)));
            }
            if depth + 1 > MAX_DEPTH {
                let why = format!("dependencies nest deeper than {MAX_DEPTH} charts (a cycle?)");
                return Ok(Err(not_renderable(&chart_file, &d, &why)));
            }
            if placed.len() == MAX_PLACEMENTS {
                let why = format!(
                    "the release would place more than {MAX_PLACEMENTS} dependencies, all levels \
                     together"
                );
                return Ok(Err(not_renderable(&chart_file, &d, &why)));
            }
            let to = format!("{into}/charts/{}", d.name);
            placed.push(Placement {
                from: from.clone(),
                into: to.clone(),
            });
            stack.push((from, to, depth + 1));
        }
    }
    Ok(Ok(placed))
}

/// Whether a directory at or above `path`, up to the selected path `root`, belongs to a
/// renderer (one above `root` is not applied; its files below `root` are plain, as they were
/// when `--path` was the boundary).
fn owned(path: &str, root: &str, owners: &HashSet<&str>) -> bool {
    let mut dir = dir_of(path);
    loop {
        if owners.contains(dir) {
            return true;
        }
        if dir.len() <= root.len() {
            return false;
        }
        dir = dir_of(dir);
    }
}

/// Every listed file in `dir` and below.
fn add_tree(files: &BTreeMap<&str, &str>, dir: &str, into: &mut BTreeMap<String, String>) {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    for (p, id) in files.range(prefix.as_str()..) {
        if !p.starts_with(&prefix) {
            break;
        }
        into.insert(p.to_string(), id.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n";

    /// Flux's layout (fluxcd/flux2-kustomize-helm-example): one base, an overlay per cluster.
    const FLUX: &[(&str, &str)] = &[
        (
            "apps/base/podinfo/kustomization.yaml",
            "resources: [cm.yaml]\n",
        ),
        ("apps/base/podinfo/cm.yaml", CM),
        (
            "apps/staging/kustomization.yaml",
            "resources: [../base/podinfo]\n",
        ),
        (
            "apps/production/kustomization.yaml",
            "resources: [../base/podinfo]\n",
        ),
        ("apps/production/patch.yaml", CM),
        ("clusters/staging/apps.yaml", CM),
        ("README.yaml", CM),
    ];

    fn layout_at(files: &[(&str, &str)], paths: &[&str]) -> Layout {
        let listing: Vec<(String, String)> = files
            .iter()
            .enumerate()
            .map(|(i, (p, _))| (p.to_string(), format!("id{i}")))
            .collect();
        let content: BTreeMap<&str, &str> = files.iter().copied().collect();
        let mut read = |p: &str, _: &str| -> Result<FileContent, ()> {
            Ok(FileContent::Bytes(content[p].as_bytes().to_vec()))
        };
        let opts = LoadOptions {
            selection: PathSelection::new(paths).unwrap(),
            ..LoadOptions::default()
        };
        let render = RenderOptions::default();
        layout(
            &listing,
            &mut read,
            &mut ParsedFiles::default(),
            &opts,
            &render,
        )
        .unwrap()
    }

    fn units(l: &Layout) -> Vec<&str> {
        l.units.keys().map(String::as_str).collect()
    }

    fn plain(l: &Layout) -> Vec<&str> {
        l.plain.iter().map(|(p, _)| p.as_str()).collect()
    }

    #[test]
    fn flux_staging_overlay_uses_a_base_outside_its_path() {
        let l = layout_at(FLUX, &["apps/staging"]);
        assert_eq!(units(&l), ["apps/staging/kustomization.yaml"]);
        let unit = &l.units["apps/staging/kustomization.yaml"];
        assert!(unit.problem.is_none(), "{:?}", unit.problem);
        let inputs: Vec<&str> = unit.inputs.iter().map(|(p, _)| p.as_str()).collect();
        assert!(inputs.contains(&"apps/base/podinfo/cm.yaml"), "{inputs:?}");
        assert!(plain(&l).is_empty(), "{:?}", plain(&l));
    }

    #[test]
    fn several_paths_pick_their_units_and_plain_files() {
        let l = layout_at(FLUX, &["apps/production", "clusters/staging"]);
        assert_eq!(units(&l), ["apps/production/kustomization.yaml"]);
        assert_eq!(plain(&l), ["clusters/staging/apps.yaml"]);
        // The whole repository, as before: both overlays, the base in neither alone.
        let l = layout_at(FLUX, &["."]);
        assert_eq!(
            units(&l),
            [
                "apps/production/kustomization.yaml",
                "apps/staging/kustomization.yaml"
            ]
        );
        assert_eq!(plain(&l), ["clusters/staging/apps.yaml", "README.yaml"]);
    }

    #[test]
    fn a_base_a_path_names_is_rendered_on_its_own() {
        // An Argo CD Application pointed at a kustomization another one uses.
        let l = layout_at(FLUX, &["apps/base/podinfo"]);
        assert_eq!(units(&l), ["apps/base/podinfo/kustomization.yaml"]);
        // Under a path that holds its overlays too, it is a base as before.
        let l = layout_at(FLUX, &["apps"]);
        assert!(!l.units.contains_key("apps/base/podinfo/kustomization.yaml"));
    }

    #[test]
    fn a_kustomization_outside_every_path_and_unreached_is_not_read() {
        let mut files = FLUX.to_vec();
        files.push(("broken/kustomization.yaml", "resources: [../../../etc]\n"));
        let l = layout_at(&files, &["apps/staging"]);
        assert_eq!(units(&l), ["apps/staging/kustomization.yaml"]);
        assert!(l.units.values().all(|u| u.problem.is_none()));
    }

    #[test]
    fn files_below_a_path_inside_an_unselected_kustomization_are_plain() {
        let files = [
            (
                "apps/staging/kustomization.yaml",
                "resources: [extra/cm.yaml]\n",
            ),
            ("apps/staging/extra/cm.yaml", CM),
        ];
        let l = layout_at(&files, &["apps/staging/extra"]);
        assert!(l.units.is_empty());
        assert_eq!(plain(&l), ["apps/staging/extra/cm.yaml"]);
    }

    #[test]
    fn a_listing_without_units_is_cut_to_the_paths() {
        let files = [("a/x.yaml", CM), ("b/y.yaml", CM)];
        let l = layout_at(&files, &["b"]);
        assert_eq!(plain(&l), ["b/y.yaml"]);
    }
}
