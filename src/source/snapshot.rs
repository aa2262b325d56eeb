//! The specs at a revision, kept between revisions so that only files whose content (blob id)
//! changed are parsed again. A revision whose spec files are all unchanged (for example a
//! commit that touches only `.linnet/status/`) is reported as such, and starts no sync.
//!
//! The combined [`SpecSet`] is kept too, and a change that cannot alter anything beyond its
//! own objects (the same objects, no errors, no analysis) is patched into it in place: a
//! one-file push costs that file, not the repository. Any other change rebuilds the set.
//!
//! A Git source hands over only the files that changed ([`SpecSnapshot::update_changed`],
//! from a tree diff) instead of every file, while the total-bytes limit is not in play.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::render::{ParsedFiles, RENDERED, RenderOptions, is_render_file, render_units};
use crate::source::git::BLOCKED;
use crate::specs::{
    FileContent, FileSpecs, Lineage, LoadOptions, SpecSet, is_spec_file, load_content,
    refuse_largest_past_total,
};

/// Parsed spec files by path, with the content id each was parsed from.
#[derive(Debug, Default)]
pub struct SpecSnapshot {
    files: BTreeMap<String, (String, FileSpecs)>,
    /// The combined set as of the last [`SpecSnapshot::spec_set`].
    set: Arc<SpecSet>,
    /// What changed in `files` since `set` was made.
    pending: Pending,
    /// The bytes the files' objects hold together, as --max-total-bytes counts them.
    total: usize,
    /// Whether a file was refused for the total: which one depends on every file before it,
    /// so only a whole listing can say whether it still is.
    over_total: bool,
    /// How Kustomize and Helm units are rendered.
    render: RenderOptions,
    /// The kustomizations and `linnet-helm.yaml` files read, by content id.
    parsed_render_files: ParsedFiles,
    /// Whether the last listing had a rendered unit: then any change may touch one.
    has_units: bool,
    /// The last whole listing and its units, kept while it has units: a push's changes are
    /// applied to them in place, or give the next whole listing without walking every tree
    /// of the revision again.
    unit_layout: Option<in_place::UnitLayout>,
}

mod in_place;

/// Changes to `files` not yet in the combined set.
#[derive(Debug, Default)]
enum Pending {
    #[default]
    Nothing,
    /// Files whose new objects replace their old ones one for one.
    Patch(Vec<String>),
    /// Anything else: the set is made again from every file.
    Rebuild,
}

impl Pending {
    fn patch(&mut self, path: &str) {
        match self {
            Pending::Nothing => *self = Pending::Patch(vec![path.to_string()]),
            Pending::Patch(paths) => paths.push(path.to_string()),
            Pending::Rebuild => {}
        }
    }
}

/// Whether a file's new objects can replace its old ones in the combined set without
/// touching anything else: neither version has an error, both declare the same objects in
/// the same order (so no duplicate appears or goes), none is an AnalysisTemplate (which
/// other files' rollouts are checked against), and no new object has analysis to check.
fn replaces_one_for_one(old: &FileSpecs, new: &FileSpecs) -> bool {
    old.errors.is_empty()
        && new.errors.is_empty()
        && old.objects.len() == new.objects.len()
        && old.objects.iter().zip(&new.objects).all(|(o, n)| {
            o.key == n.key && n.key.kind != "AnalysisTemplate" && !n.spec.may_have_analysis()
        })
}

/// What [`SpecSnapshot::update`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SnapshotUpdate {
    /// Whether any spec file was added, removed or changed.
    pub changed: bool,
    /// Files parsed in this update.
    pub parsed: usize,
}

impl SpecSnapshot {
    /// A snapshot that renders Kustomize and Helm units with `render`.
    pub fn with_render(render: RenderOptions) -> SpecSnapshot {
        SpecSnapshot {
            render,
            ..SpecSnapshot::default()
        }
    }

    /// Brings the snapshot to a new file listing (`path`, content id). `read` returns a file's
    /// content (or why it was not read) and is called only for files that are new or changed.
    pub fn update<E>(
        &mut self,
        listing: &[(String, String)],
        mut read: impl FnMut(&str, &str) -> Result<FileContent, E>,
        opts: &LoadOptions,
    ) -> Result<SnapshotUpdate, E> {
        let mut next = BTreeMap::new();
        let mut update = SnapshotUpdate::default();
        let layout = crate::render::layout(
            listing,
            &mut read,
            &mut self.parsed_render_files,
            opts,
            &self.render,
        )?;
        self.has_units = !layout.units.is_empty();
        self.unit_layout = self
            .has_units
            .then(|| in_place::UnitLayout::new(listing, &layout));
        let listing = &layout.listing();
        // Units to render: their inputs are read here, in order; the tools run together after.
        let mut to_render = Vec::new();
        for (path, id) in listing {
            let name = path.rsplit('/').next().unwrap_or(path);
            // A blocked directory ([`BLOCKED`]) is kept as one refused file.
            if !is_spec_file(name) && !id.starts_with(BLOCKED) && !id.starts_with(RENDERED) {
                continue;
            }
            let (id, specs) = match self.files.remove(path) {
                Some((old_id, specs)) if &old_id == id => (old_id, specs),
                old => {
                    if let Some(unit) = layout.units.get(path) {
                        to_render.push((unit, id, old));
                        continue;
                    }
                    let specs = load_content(path, read(path, id)?, opts);
                    self.note_change(path, old.map(|(_, o)| o), &specs, &mut update);
                    (id.clone(), specs)
                }
            };
            next.insert(path.clone(), (id, specs));
        }
        let started = std::time::Instant::now();
        let units: Vec<_> = to_render.iter().map(|(unit, ..)| *unit).collect();
        let rendered = render_units(&units, &mut read, opts, &self.render)?;
        if !rendered.is_empty() {
            tracing::debug!(
                units = rendered.len(),
                ms = started.elapsed().as_millis() as u64,
                "rendered"
            );
        }
        for ((unit, id, old), specs) in to_render.into_iter().zip(rendered) {
            self.note_change(&unit.key, old.map(|(_, o)| o), &specs, &mut update);
            next.insert(unit.key.clone(), (id.clone(), specs));
        }
        // Past the total, the largest files are kept as errors with no id, so that they are
        // read again once there is room.
        let (total, refused) = refuse_largest_past_total(
            next.iter_mut().map(|(p, (_, specs))| (p, specs)),
            opts.max_total_bytes,
        );
        for path in &refused {
            if let Some((id, _)) = next.get_mut(path) {
                id.clear();
            }
            update.changed = true;
            self.pending = Pending::Rebuild;
        }
        // Anything left was removed.
        if !self.files.is_empty() {
            update.changed = true;
            self.pending = Pending::Rebuild;
        }
        self.over_total = next.values().any(|(id, _)| id.is_empty());
        self.files = next;
        self.total = total;
        Ok(update)
    }

    /// Brings the snapshot to a new revision from only the files that changed since the
    /// listing it has: `(path, Some(id))` for one added or changed, `(path, None)` for one
    /// removed. `None`, with the snapshot untouched, when the total-bytes limit is or would be
    /// in play: then the caller hands over the whole listing ([`SpecSnapshot::update`]).
    /// Below the limit both give the same snapshot, since no running total can then pass it.
    pub fn update_changed<E>(
        &mut self,
        changes: &[(String, Option<String>)],
        mut read: impl FnMut(&str, &str) -> Result<FileContent, E>,
        opts: &LoadOptions,
    ) -> Result<Option<SnapshotUpdate>, E> {
        // A blocked directory's files are not listed one by one: only a whole listing says
        // whether it still is.
        if self.over_total || self.files.values().any(|(id, _)| id.starts_with(BLOCKED)) {
            return Ok(None);
        }
        // With units, which there are and what each reads follow from the whole listing: the
        // last one with these changes applied, when it was kept; a whole new one otherwise.
        if self.has_units || changes.iter().any(|(p, _)| is_render_file(p)) {
            if let Some(update) = self.update_units_in_place(changes, &mut read, opts)? {
                return Ok(Some(update));
            }
            let Some(kept) = self.unit_layout.take() else {
                return Ok(None);
            };
            let listing = with_changes(kept.raw, changes);
            if listing.len() > opts.shape.max_files {
                return Ok(None);
            }
            return self.update(&listing, read, opts).map(Some);
        }
        // One entry per path; a path both removed and added (a type change) is added.
        let mut by_path: BTreeMap<&str, Option<&str>> = BTreeMap::new();
        for (path, id) in changes {
            let name = path.rsplit('/').next().unwrap_or(path);
            if is_spec_file(name) && opts.selection.selects(path) {
                let entry = by_path.entry(path).or_insert(None);
                *entry = entry.or(id.as_deref());
            }
        }
        let mut total = self.total;
        let mut read_files = Vec::new();
        for (&path, &id) in &by_path {
            let old = self.files.get(path);
            if let (Some(id), Some((old_id, _))) = (id, old)
                && old_id == id
            {
                continue;
            }
            if let Some((_, specs)) = old {
                total = total.saturating_sub(specs.json_bytes());
            }
            let Some(id) = id else { continue };
            let specs = load_content(path, read(path, id)?, opts);
            total += specs.json_bytes();
            read_files.push((path, id, specs));
        }
        if total > opts.max_total_bytes {
            return Ok(None);
        }
        let mut update = SnapshotUpdate::default();
        for (&path, &id) in &by_path {
            if id.is_none() && self.files.remove(path).is_some() {
                update.changed = true;
                self.pending = Pending::Rebuild;
            }
        }
        for (path, id, specs) in read_files {
            update.changed = true;
            update.parsed += 1;
            match self.files.get(path) {
                Some((_, old)) if replaces_one_for_one(old, &specs) => self.pending.patch(path),
                _ => self.pending = Pending::Rebuild,
            }
            self.files.insert(path.to_string(), (id.to_string(), specs));
        }
        self.total = total;
        Ok(Some(update))
    }

    /// Counts a file or unit read again, and how the combined set follows: patched in place
    /// when its objects replace the old ones one for one, made again otherwise.
    fn note_change(
        &mut self,
        path: &str,
        old: Option<FileSpecs>,
        specs: &FileSpecs,
        update: &mut SnapshotUpdate,
    ) {
        update.parsed += 1;
        update.changed = true;
        match old {
            Some(old) if replaces_one_for_one(&old, specs) => self.pending.patch(path),
            _ => self.pending = Pending::Rebuild,
        }
    }

    /// The specs of the current revision. Shared: the snapshot patches its own copy in place
    /// next time only if nobody else holds this one by then.
    pub fn spec_set(&mut self) -> Arc<SpecSet> {
        match std::mem::take(&mut self.pending) {
            Pending::Nothing => {}
            Pending::Patch(paths) => {
                if !self.patch(&paths) {
                    self.rebuild();
                }
            }
            Pending::Rebuild => self.rebuild(),
        }
        self.set.clone()
    }

    fn rebuild(&mut self) {
        let mut set = SpecSet::from_files(
            self.files
                .iter()
                .map(|(path, (_, specs))| (path.clone(), specs.clone()))
                .collect(),
        );
        set.lineage = Lineage::fresh();
        self.set = Arc::new(set);
    }

    /// Replaces the objects of `paths` in the set; false (the set half patched, to be
    /// rebuilt) when one of them is not there as that file's: it was blocked or declared
    /// twice, and its file's change may lift that.
    fn patch(&mut self, paths: &[String]) -> bool {
        let set = Arc::make_mut(&mut self.set);
        let from = set.lineage.generation;
        let mut replaced = Vec::new();
        for path in paths {
            let Some((_, specs)) = self.files.get(path) else {
                return false;
            };
            for object in &specs.objects {
                match set.objects.get_mut(&object.key) {
                    Some(old) if *old.location.file == **path => *old = object.clone(),
                    _ => return false,
                }
                replaced.push(object.key.clone());
            }
        }
        set.lineage = Lineage {
            patched_from: Some((from, replaced)),
            ..Lineage::fresh()
        };
        true
    }
}

/// Brings `snapshot` to the files of the directory tree `root` (`--repo-path`, `linnet
/// validate`): listed within the shape, read only when new or changed.
pub fn update_from_dir(
    snapshot: &mut SpecSnapshot,
    root: &std::path::Path,
    opts: &LoadOptions,
) -> std::io::Result<SnapshotUpdate> {
    let files = crate::specs::list_local_spec_files(root, &opts.shape)?;
    let listing: Vec<(String, String)> = files
        .iter()
        .map(|f| (f.rel.clone(), f.change_id()))
        .collect();
    let by_path: std::collections::HashMap<&str, &crate::specs::LocalSpecFile> =
        files.iter().map(|f| (f.rel.as_str(), f)).collect();
    let update = snapshot
        .update(
            &listing,
            |p, _| -> Result<FileContent, std::convert::Infallible> {
                Ok(match by_path.get(p) {
                    Some(file) => crate::specs::read_local_spec_file(file, opts.max_file_bytes),
                    None => FileContent::Refused("vanished while read".into()),
                })
            },
            opts,
        )
        .unwrap_or_else(|never| match never {});
    Ok(update)
}

/// The specs of a directory tree as the agent reads them, Kustomize and Helm units rendered
/// the same way: what `linnet validate` and `linnet diff` check.
pub fn load_tree(
    root: &std::path::Path,
    opts: &LoadOptions,
    render: RenderOptions,
) -> crate::Result<SpecSet> {
    let mut snapshot = SpecSnapshot::with_render(render);
    update_from_dir(&mut snapshot, root, opts).map_err(|source| crate::Error::Io {
        path: root.to_path_buf(),
        source,
    })?;
    Ok(Arc::unwrap_or_clone(snapshot.spec_set()))
}

/// A whole listing with `changes` applied, in path order. Removals first: a path both
/// removed and added (a type change) is added.
fn with_changes(
    mut listing: BTreeMap<String, String>,
    changes: &[(String, Option<String>)],
) -> Vec<(String, String)> {
    for (path, id) in changes {
        if id.is_none() {
            listing.remove(path);
        }
    }
    for (path, id) in changes {
        if let Some(id) = id {
            listing.insert(path.clone(), id.clone());
        }
    }
    listing.into_iter().collect()
}

#[cfg(test)]
mod tests;
