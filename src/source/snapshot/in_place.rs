//! A push to a repository with rendered units, applied in place. When it only changes files
//! that were there (a patch, a values file, a template, a base, an overlay that still names
//! the same paths), the units that read them are hashed again and rendered, and nothing else
//! is looked at: the cost of a push does not grow with the units the repository holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{SnapshotUpdate, SpecSnapshot};
use crate::render::{HELM_FILE, KUSTOMIZATION_NAMES, Layout, RENDERED, Unit, render_units};
use crate::specs::{FileContent, FileSpecs, LoadOptions, is_spec_file, load_content};

/// What the snapshot keeps of the last whole listing that had units.
#[derive(Debug, Default)]
pub(super) struct UnitLayout {
    /// The listing as the source gave it (`path`, content id).
    pub(super) raw: BTreeMap<String, String>,
    pub(super) units: BTreeMap<String, Unit>,
    /// Which units read each input file.
    readers: HashMap<String, Vec<String>>,
}

impl UnitLayout {
    pub(super) fn new(listing: &[(String, String)], layout: &Layout) -> UnitLayout {
        let mut readers: HashMap<String, Vec<String>> = HashMap::new();
        for unit in layout.units.values() {
            for (path, _) in &unit.inputs {
                readers
                    .entry(path.clone())
                    .or_default()
                    .push(unit.key.clone());
            }
        }
        UnitLayout {
            raw: listing.iter().cloned().collect(),
            units: layout.units.clone(),
            readers,
        }
    }
}

impl SpecSnapshot {
    /// Applies `changes` in place, or `None` (the snapshot untouched) when they may change
    /// which units there are or what they read: a file added or removed, a `linnet-helm.yaml`
    /// changed, a kustomization that names other paths now, a unit with an error.
    pub(super) fn update_units_in_place<E>(
        &mut self,
        changes: &[(String, Option<String>)],
        read: &mut impl FnMut(&str, &str) -> Result<FileContent, E>,
        opts: &LoadOptions,
    ) -> Result<Option<SnapshotUpdate>, E> {
        let Some(sorted) = self.sort_changes(changes, read, opts)? else {
            return Ok(None);
        };
        let Some(kept) = &self.unit_layout else {
            return Ok(None);
        };
        let Some(units) = units_reading(kept, &sorted.inputs, &self.render) else {
            return Ok(None);
        };
        let plain = sorted.plain;
        // Everything is read and rendered before anything changes: past the total, the
        // caller lists the whole revision instead.
        let mut total = self.total;
        let old_bytes = |files: &BTreeMap<String, (String, FileSpecs)>, p: &str| {
            files.get(p).map_or(0, |(_, s)| s.json_bytes())
        };
        let mut parsed_plain = Vec::new();
        for (path, id) in plain {
            let specs = load_content(path, read(path, id)?, opts);
            total = total.saturating_sub(old_bytes(&self.files, path)) + specs.json_bytes();
            parsed_plain.push((path, id, specs));
        }
        let rendered = render_units(&units.iter().collect::<Vec<_>>(), read, opts, &self.render)?;
        for (unit, specs) in units.iter().zip(&rendered) {
            total = total.saturating_sub(old_bytes(&self.files, &unit.key)) + specs.json_bytes();
        }
        if total > opts.max_total_bytes {
            return Ok(None);
        }
        let mut update = SnapshotUpdate::default();
        let entries: Vec<(String, String)> = changes
            .iter()
            .filter_map(|(p, id)| Some((p.clone(), id.clone()?)))
            .collect();
        for (path, id, specs) in parsed_plain {
            let old = self.files.remove(path).map(|(_, s)| s);
            self.note_change(path, old, &specs, &mut update);
            self.files.insert(path.clone(), (id.clone(), specs));
        }
        for (unit, specs) in units.iter().zip(rendered) {
            let old = self.files.remove(&unit.key).map(|(_, s)| s);
            self.note_change(&unit.key, old, &specs, &mut update);
            let id = format!("{RENDERED}{}", unit.hash);
            self.files.insert(unit.key.clone(), (id, specs));
        }
        if let Some(kept) = self.unit_layout.as_mut() {
            kept.raw.extend(entries);
            for unit in units {
                kept.units.insert(unit.key.clone(), unit);
            }
        }
        self.total = total;
        Ok(Some(update))
    }
}

/// A push's changed files, by what reads them.
struct SortedChanges<'c> {
    /// Inputs of rendered units (`path`, new content id).
    inputs: HashMap<&'c str, &'c str>,
    /// Spec files applied as they are.
    plain: Vec<(&'c String, &'c String)>,
}

impl SpecSnapshot {
    /// Sorts `changes` into the inputs of units and plain spec files, or `None` when one may
    /// change which units there are or what they read.
    fn sort_changes<'c, E>(
        &mut self,
        changes: &'c [(String, Option<String>)],
        read: &mut impl FnMut(&str, &str) -> Result<FileContent, E>,
        opts: &LoadOptions,
    ) -> Result<Option<SortedChanges<'c>>, E> {
        let Some(kept) = &self.unit_layout else {
            return Ok(None);
        };
        let mut sorted = SortedChanges {
            inputs: HashMap::new(),
            plain: Vec::new(),
        };
        for (path, id) in changes {
            let (Some(id), Some(old)) = (id, kept.raw.get(path)) else {
                return Ok(None);
            };
            if old == id {
                continue;
            }
            // Outside every --path and read by no unit: nothing applied reads it.
            if !kept.readers.contains_key(path) && !opts.selection.selects(path) {
                continue;
            }
            let name = path.rsplit('/').next().unwrap_or(path);
            // A chart's dependencies decide which files its release reads.
            if name == HELM_FILE || name == "Chart.yaml" {
                return Ok(None);
            }
            if KUSTOMIZATION_NAMES.contains(&name)
                && !self.parsed_render_files.same_references(
                    path,
                    (old, id),
                    read,
                    opts,
                    &self.render,
                )?
            {
                return Ok(None);
            }
            if kept.readers.contains_key(path) {
                sorted.inputs.insert(path, id);
            } else if self.files.contains_key(path) {
                sorted.plain.push((path, id));
            } else if is_spec_file(name) && !owned_by_no_unit(path, &kept.raw) {
                return Ok(None);
            }
        }
        Ok(Some(sorted))
    }
}

/// The units that read a changed input, with their inputs and hash made new; `None` if one
/// is not known or has an error now (the caller lists the whole revision).
fn units_reading(
    kept: &UnitLayout,
    inputs: &HashMap<&str, &str>,
    render: &crate::render::RenderOptions,
) -> Option<Vec<Unit>> {
    let keys: BTreeSet<&String> = inputs
        .keys()
        .flat_map(|p| kept.readers.get(*p).into_iter().flatten())
        .collect();
    let mut units = Vec::new();
    for key in keys {
        let unit = kept.units.get(key)?.with_inputs(inputs, render);
        if unit.problem.is_some() {
            return None;
        }
        units.push(unit);
    }
    Some(units)
}

/// Whether `path` lies in a directory a renderer owns without any unit reading it (a chart no
/// `linnet-helm.yaml` names): a change there changes nothing. Decided from its neighbours in
/// the listing: a kustomization, `linnet-helm.yaml` or `Chart.yaml` at or above it.
fn owned_by_no_unit(path: &str, raw: &BTreeMap<String, String>) -> bool {
    let mut dir = crate::render::dir_of(path);
    loop {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let marks = KUSTOMIZATION_NAMES
            .iter()
            .copied()
            .chain([HELM_FILE, "Chart.yaml"]);
        if marks
            .into_iter()
            .any(|m| raw.contains_key(&format!("{prefix}{m}")))
        {
            return true;
        }
        if dir.is_empty() {
            return false;
        }
        dir = crate::render::dir_of(dir);
    }
}
