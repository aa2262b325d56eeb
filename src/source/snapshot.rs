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
            if is_spec_file(name) {
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
mod tests {
    use super::*;

    fn cm(name: &str) -> FileContent {
        FileContent::Bytes(
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n").into_bytes(),
        )
    }

    fn listing(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(p, i)| (p.to_string(), i.to_string()))
            .collect()
    }

    #[test]
    fn a_patched_set_names_the_set_it_came_from_and_the_objects_it_replaced() {
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions::default();
        // The same object in every version of a file, with a label that follows its id.
        let read = |p: &str, id: &str| -> Result<FileContent, ()> {
            let name = p.trim_end_matches(".yaml");
            Ok(FileContent::Bytes(
                format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  labels: {{v: \"{id}\"}}\n")
                    .into_bytes(),
            ))
        };
        snap.update(&listing(&[("a.yaml", "1"), ("b.yaml", "1")]), read, &opts)
            .unwrap();
        let first = snap.spec_set();
        assert_ne!(first.lineage.generation, 0);
        assert_eq!(first.lineage.changed_since(0), None);
        snap.update(&listing(&[("a.yaml", "1"), ("b.yaml", "2")]), read, &opts)
            .unwrap();
        let second = snap.spec_set();
        let names: Vec<&str> = second
            .lineage
            .changed_since(first.lineage.generation)
            .unwrap()
            .iter()
            .map(|k| k.name.as_str())
            .collect();
        assert_eq!(names, ["b"]);
        // Only from the set it was patched from, and not from one before that.
        snap.update(&listing(&[("a.yaml", "2"), ("b.yaml", "2")]), read, &opts)
            .unwrap();
        let third = snap.spec_set();
        assert!(
            third
                .lineage
                .changed_since(second.lineage.generation)
                .is_some()
        );
        assert_eq!(third.lineage.changed_since(first.lineage.generation), None);
        // A file added: the set is made afresh, and says nothing about what changed.
        snap.update(
            &listing(&[("a.yaml", "2"), ("b.yaml", "2"), ("c.yaml", "1")]),
            read,
            &opts,
        )
        .unwrap();
        let fourth = snap.spec_set();
        assert_eq!(fourth.lineage.changed_since(third.lineage.generation), None);
    }

    #[test]
    fn only_changed_files_are_parsed_again() {
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions::default();
        let mut reads = Vec::new();
        let mut read = |p: &str, _: &str| -> Result<FileContent, ()> {
            reads.push(p.to_string());
            Ok(cm(p.trim_end_matches(".yaml")))
        };
        let u = snap
            .update(
                &listing(&[("a.yaml", "1"), ("b.yaml", "1"), ("README.md", "1")]),
                &mut read,
                &opts,
            )
            .unwrap();
        assert_eq!(
            u,
            SnapshotUpdate {
                changed: true,
                parsed: 2
            }
        );
        let u = snap
            .update(
                &listing(&[("a.yaml", "1"), ("b.yaml", "2")]),
                &mut read,
                &opts,
            )
            .unwrap();
        assert_eq!(
            u,
            SnapshotUpdate {
                changed: true,
                parsed: 1
            }
        );
        assert_eq!(reads, vec!["a.yaml", "b.yaml", "b.yaml"]);
        assert_eq!(snap.spec_set().objects.len(), 2);
    }

    #[test]
    fn same_listing_is_unchanged_and_reads_nothing() {
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions::default();
        let l = listing(&[("a.yaml", "1")]);
        snap.update(&l, |_, _| Ok::<_, ()>(cm("a")), &opts).unwrap();
        let u = snap
            .update(
                &l,
                |_, _| -> Result<FileContent, ()> { panic!("read an unchanged file") },
                &opts,
            )
            .unwrap();
        assert_eq!(
            u,
            SnapshotUpdate {
                changed: false,
                parsed: 0
            }
        );
    }

    #[test]
    fn a_changed_value_is_patched_in_place() {
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions::default();
        let text = |value: &str| {
            FileContent::Bytes(
                format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  v: \"{value}\"\n")
                    .into_bytes(),
            )
        };
        snap.update(
            &listing(&[("a.yaml", "1")]),
            |_, _| Ok::<_, ()>(text("1")),
            &opts,
        )
        .unwrap();
        let first = snap.spec_set();
        drop(first);
        snap.update(
            &listing(&[("a.yaml", "2")]),
            |_, _| Ok::<_, ()>(text("2")),
            &opts,
        )
        .unwrap();
        assert!(matches!(snap.pending, Pending::Patch(_)));
        let set = snap.spec_set();
        assert!(
            set.objects
                .values()
                .all(|o| o.spec.to_json()["data"]["v"] == "2")
        );
    }

    /// Files whose contents play against each other: duplicates, errors, analysis that needs a
    /// template in another file, and a template whose arguments do not fit.
    fn variant(i: usize) -> String {
        let cm = |name: &str, v: &str| {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  v: \"{v}\"\n"
            )
        };
        let template = |args: &str| {
            format!(
                "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: AnalysisTemplate\nmetadata:\n  \
                 name: error-rate\nspec:\n{args}  metrics:\n  - name: error-rate\n    \
                 interval: 30s\n    successCondition: result < 0.05\n    provider:\n      \
                 prometheus:\n        address: http://prometheus:9090\n        query: errors\n"
            )
        };
        let web = |image: &str| {
            format!(
                "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryDeployment\nmetadata:\n  \
                 name: web\nspec:\n  replicas: 2\n  image: {image}\n  template:\n    \
                 selector:\n      matchLabels: {{app: web}}\n    template:\n      metadata:\n        \
                 labels: {{app: web}}\n      spec:\n        containers:\n        - name: web\n          \
                 image: web:1\n  analysis:\n    args: [{{name: app, value: web}}]\n    \
                 background:\n      templates: [{{templateName: error-rate}}]\n"
            )
        };
        match i {
            0 => cm("a", "1"),
            1 => cm("a", "2"),
            2 => cm("b", "1"),
            3 => format!("{}---\n{}", cm("a", "1"), cm("b", "2")),
            4 => "kind: [\n".to_string(),
            5 => template("  args:\n  - name: app\n"),
            6 => template(""),
            7 => web("web:1"),
            8 => web("web:2"),
            _ => cm("c", &"x".repeat(400)),
        }
    }

    proptest::proptest! {
        /// A snapshot brought through any series of revisions, patching where it can, has the
        /// set a snapshot made at once from the last revision has.
        #[test]
        fn patched_set_equals_a_rebuilt_one(
            revisions in proptest::collection::vec(
                proptest::collection::vec(proptest::option::of(0usize..10), 4),
                1..8,
            ),
            small_total in proptest::bool::ANY,
        ) {
            let opts = LoadOptions {
                max_total_bytes: if small_total { 1300 } else { LoadOptions::default().max_total_bytes },
                ..LoadOptions::default()
            };
            let read = |_: &str, id: &str| -> Result<FileContent, ()> {
                Ok(FileContent::Bytes(variant(id.parse().unwrap_or(0)).into_bytes()))
            };
            let mut snap = SpecSnapshot::default();
            // The same revisions handed over as changes only, as a Git source does.
            let mut by_changes = SpecSnapshot::default();
            let mut last: Vec<(String, String)> = Vec::new();
            let mut previous: Option<Arc<SpecSet>> = None;
            let mut previous_by_changes: Option<Arc<SpecSet>> = None;
            for files in revisions {
                let l: Vec<(String, String)> = files
                    .iter()
                    .enumerate()
                    .filter_map(|(n, v)| v.map(|v| (format!("f{n}.yaml"), v.to_string())))
                    .collect();
                let u = snap.update(&l, read, &opts).unwrap();
                let mut fresh = SpecSnapshot::default();
                fresh.update(&l, read, &opts).unwrap();
                let changes = changes_between(&last, &l);
                let by_changes_update = match by_changes.update_changed(&changes, read, &opts).unwrap() {
                    Some(update) => update,
                    None => by_changes.update(&l, read, &opts).unwrap(),
                };
                last = l;
                proptest::prop_assert_eq!(by_changes_update.changed, u.changed);
                proptest::prop_assert_eq!(by_changes.total, snap.total);
                let set = snap.spec_set();
                proptest::prop_assert_eq!(&*set, &*fresh.spec_set());
                let patched = by_changes.spec_set();
                proptest::prop_assert_eq!(&*set, &*patched);
                // A patched set's lineage names every object that differs from the set
                // before it, and the keys are the same: a sync may look at those alone.
                for (before, now) in [(&previous, &set), (&previous_by_changes, &patched)] {
                    let Some(before) = before else { continue };
                    let Some(keys) = now.lineage.changed_since(before.lineage.generation) else {
                        continue;
                    };
                    proptest::prop_assert!(before.objects.keys().eq(now.objects.keys()));
                    for (key, object) in &now.objects {
                        if before.objects.get(key) != Some(object) {
                            proptest::prop_assert!(keys.contains(key), "{key} changed but is not named");
                        }
                    }
                }
                previous = Some(set);
                previous_by_changes = Some(patched);
            }
        }
    }

    /// What a tree diff reports between two listings.
    fn changes_between(
        old: &[(String, String)],
        new: &[(String, String)],
    ) -> Vec<(String, Option<String>)> {
        let old: BTreeMap<_, _> = old.iter().cloned().collect();
        let new: BTreeMap<_, _> = new.iter().cloned().collect();
        let removed = old
            .keys()
            .filter(|p| !new.contains_key(*p))
            .map(|p| (p.clone(), None));
        let changed = new
            .iter()
            .filter(|(p, id)| old.get(*p) != Some(id))
            .map(|(p, id)| (p.clone(), Some(id.clone())));
        removed.chain(changed).collect()
    }

    #[test]
    fn changes_alone_read_only_the_changed_files() {
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions::default();
        let l = listing(&[("a.yaml", "1"), ("b.yaml", "1"), ("c.yaml", "1")]);
        snap.update(&l, |p, _| Ok::<_, ()>(cm(p)), &opts).unwrap();
        let mut reads = Vec::new();
        let changes = vec![
            ("b.yaml".to_string(), Some("2".to_string())),
            ("c.yaml".to_string(), None),
            ("README.md".to_string(), Some("9".to_string())),
        ];
        let u = snap
            .update_changed(
                &changes,
                |p, _| {
                    reads.push(p.to_string());
                    Ok::<_, ()>(cm(p))
                },
                &opts,
            )
            .unwrap();
        assert_eq!(
            u,
            Some(SnapshotUpdate {
                changed: true,
                parsed: 1
            })
        );
        assert_eq!(reads, ["b.yaml"]);
        assert_eq!(snap.spec_set().objects.len(), 2);
    }

    #[test]
    fn changes_past_the_total_ask_for_the_whole_listing() {
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions {
            max_total_bytes: 150,
            ..LoadOptions::default()
        };
        let l = listing(&[("a.yaml", "1")]);
        snap.update(&l, |p, _| Ok::<_, ()>(cm(p)), &opts).unwrap();
        let changes = vec![("b.yaml".to_string(), Some("1".to_string()))];
        let big = |_: &str, _: &str| Ok::<_, ()>(cm(&"x".repeat(200)));
        assert_eq!(snap.update_changed(&changes, big, &opts).unwrap(), None);
        assert_eq!(snap.files.len(), 1, "untouched");
    }

    #[test]
    fn past_the_total_the_largest_file_is_refused_not_those_after_it() {
        // Issue 45: files sorted after a big one were refused by --max-total-bytes: one
        // writer blocked every other file of the source.
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions {
            max_total_bytes: 600,
            ..LoadOptions::default()
        };
        let l = listing(&[("a-big.yaml", "1"), ("b.yaml", "1"), ("c.yaml", "1")]);
        snap.update(
            &l,
            |p, _| {
                Ok::<_, ()>(if p == "a-big.yaml" {
                    cm(&"x".repeat(600))
                } else {
                    cm(p)
                })
            },
            &opts,
        )
        .unwrap();
        let set = snap.spec_set();
        assert_eq!(set.blocked_files, ["a-big.yaml"]);
        assert_eq!(set.objects.len(), 2);
        assert!(
            set.errors[0]
                .message
                .contains("the largest files are refused first")
        );
    }

    #[test]
    fn a_blocked_directory_is_one_refused_entry() {
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions::default();
        let l = vec![
            (
                "bomb/".to_string(),
                format!("{BLOCKED}1000000 files below it"),
            ),
            ("ok.yaml".to_string(), "1".to_string()),
        ];
        snap.update(
            &l,
            |p, id| {
                Ok::<_, ()>(match id.strip_prefix(BLOCKED) {
                    Some(why) => FileContent::Refused(why.into()),
                    None => cm(p),
                })
            },
            &opts,
        )
        .unwrap();
        let set = snap.spec_set();
        assert_eq!(set.blocked_files, ["bomb/"]);
        assert_eq!(set.objects.len(), 1);
        // Only a whole listing says whether it still is blocked.
        let changes = vec![("bomb/x.yaml".to_string(), Some("2".to_string()))];
        assert_eq!(
            snap.update_changed(&changes, |p, _| Ok::<_, ()>(cm(p)), &opts)
                .unwrap(),
            None
        );
    }

    #[test]
    fn a_removed_file_is_a_change() {
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions::default();
        snap.update(
            &listing(&[("a.yaml", "1"), ("b.yaml", "1")]),
            |p, _| Ok::<_, ()>(cm(p)),
            &opts,
        )
        .unwrap();
        let u = snap
            .update(
                &listing(&[("a.yaml", "1")]),
                |p, _| Ok::<_, ()>(cm(p)),
                &opts,
            )
            .unwrap();
        assert!(u.changed);
        assert_eq!(snap.spec_set().objects.len(), 1);
    }

    /// Issue 48: with units, a push's changes are applied to the last whole listing, and only
    /// what they touch is read again. The unit here cannot render (its base is outside the
    /// root), so no tool runs: its error stands for its output.
    #[test]
    fn a_push_to_a_repository_with_units_reads_only_what_it_touched() {
        let mut snap = SpecSnapshot::default();
        let opts = LoadOptions::default();
        let content = |p: &str, id: &str| -> FileContent {
            if p.ends_with("kustomization.yaml") {
                FileContent::Bytes(format!("resources: [../../outside-{id}]\n").into_bytes())
            } else {
                cm(p.trim_end_matches(".yaml"))
            }
        };
        let read = |p: &str, id: &str| -> Result<FileContent, ()> { Ok(content(p, id)) };
        let first = listing(&[("app/kustomization.yaml", "1"), ("plain.yaml", "1")]);
        let u = snap.update(&first, read, &opts).unwrap();
        assert_eq!(u.parsed, 2);
        assert_eq!(snap.spec_set().blocked_files, ["app/kustomization.yaml"]);
        // The plain file changes: read alone, through the kept listing.
        let changes = vec![("plain.yaml".to_string(), Some("2".to_string()))];
        let u = snap.update_changed(&changes, read, &opts).unwrap().unwrap();
        assert_eq!(u.parsed, 1);
        // The kustomization changes: its unit alone.
        let changes = vec![("app/kustomization.yaml".to_string(), Some("2".to_string()))];
        let u = snap.update_changed(&changes, read, &opts).unwrap().unwrap();
        assert_eq!(u.parsed, 1);
        let errors = &snap.spec_set().errors;
        assert!(errors[0].message.contains("outside-2"), "{errors:?}");
        // A kustomization appears in a repository that had none: a whole listing is asked for.
        let mut plain = SpecSnapshot::default();
        plain
            .update(&listing(&[("plain.yaml", "1")]), read, &opts)
            .unwrap();
        let changes = vec![("new/kustomization.yaml".to_string(), Some("1".to_string()))];
        assert_eq!(plain.update_changed(&changes, read, &opts).unwrap(), None);
    }

    /// In place, a changed input renders its unit alone, a file nothing reads renders nothing,
    /// and the snapshot equals one made from the whole listing. (No kustomize here: the unit's
    /// render fails to start, and that error stands for its output.)
    #[test]
    fn a_unit_input_changed_in_place_renders_that_unit_alone_as_a_whole_listing_would() {
        let opts = LoadOptions::default();
        let read = |p: &str, id: &str| -> Result<FileContent, ()> {
            Ok(if p.ends_with("kustomization.yaml") {
                FileContent::Bytes(b"resources: [cm.yaml]\n".to_vec())
            } else if p.ends_with("Chart.yaml") {
                FileContent::Bytes(b"apiVersion: v2\nname: c\nversion: 0.1.0\n".to_vec())
            } else {
                cm(&format!("{}-{id}", p.replace(['/', '.'], "-")))
            })
        };
        let render = RenderOptions {
            kustomize: "/nonexistent/kustomize".into(),
            ..RenderOptions::default()
        };
        let mut snap = SpecSnapshot::with_render(render.clone());
        let mut files = listing(&[
            ("a/kustomization.yaml", "1"),
            ("a/cm.yaml", "1"),
            ("b/kustomization.yaml", "1"),
            ("b/cm.yaml", "1"),
            ("unused-chart/Chart.yaml", "1"),
            ("unused-chart/values.yaml", "1"),
            ("plain.yaml", "1"),
        ]);
        snap.update(&files, read, &opts).unwrap();
        let change = |path: &str, id: &str| vec![(path.to_string(), Some(id.to_string()))];
        let u = snap
            .update_changed(&change("a/cm.yaml", "2"), read, &opts)
            .unwrap()
            .unwrap();
        assert_eq!(u.parsed, 1);
        let u = snap
            .update_changed(&change("unused-chart/values.yaml", "2"), read, &opts)
            .unwrap()
            .unwrap();
        assert_eq!((u.parsed, u.changed), (0, false));
        files[1].1 = "2".into();
        files[5].1 = "2".into();
        let mut whole = SpecSnapshot::with_render(render);
        whole.update(&files, read, &opts).unwrap();
        assert_eq!(*snap.spec_set(), *whole.spec_set());
        assert!(snap.spec_set().errors[0].message.contains("cannot run"));
    }

    /// A unit's input files are read into memory to be rendered: together they may hold no
    /// more than a whole revision's specs (--max-total-bytes), or a repository writer could
    /// make the agent hold every file of the revision at once.
    #[test]
    fn a_unit_whose_inputs_pass_the_total_is_refused_before_it_is_read_whole() {
        let opts = LoadOptions {
            max_total_bytes: 1000,
            ..LoadOptions::default()
        };
        let reads = std::cell::Cell::new(0);
        let read = |p: &str, _: &str| -> Result<FileContent, ()> {
            reads.set(reads.get() + 1);
            Ok(if p.ends_with("kustomization.yaml") {
                FileContent::Bytes(b"resources: [big-0.yaml]\n".to_vec())
            } else {
                FileContent::Bytes(vec![b'#'; 600])
            })
        };
        let mut snap = SpecSnapshot::with_render(RenderOptions {
            kustomize: "/nonexistent/kustomize".into(),
            ..RenderOptions::default()
        });
        let files: Vec<(String, String)> =
            std::iter::once(("app/kustomization.yaml".to_string(), "k".to_string()))
                .chain((0..10).map(|i| (format!("app/big-{i}.yaml"), format!("{i}"))))
                .collect();
        snap.update(&files, read, &opts).unwrap();
        let set = snap.spec_set();
        assert_eq!(set.blocked_files, ["app/kustomization.yaml"]);
        assert!(
            set.errors[0].message.contains("--max-total-bytes"),
            "{:?}",
            set.errors
        );
        // The layout reads the kustomization; the render stops at the second big file.
        assert!(reads.get() <= 4, "{} reads", reads.get());
    }
}
