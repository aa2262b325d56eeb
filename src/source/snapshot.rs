//! The specs at a revision, kept between revisions so that only files whose content (blob id)
//! changed are parsed again. A revision whose spec files are all unchanged (for example a
//! commit that touches only `.linnet/status/`) is reported as such, and starts no sync.

use std::collections::BTreeMap;

use crate::specs::{FileContent, FileSpecs, LoadOptions, SpecSet, is_spec_file, load_content};

/// Parsed spec files by path, with the content id each was parsed from.
#[derive(Debug, Default)]
pub struct SpecSnapshot {
    files: BTreeMap<String, (String, FileSpecs)>,
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
        let mut total = 0;
        for (path, id) in listing {
            let name = path.rsplit('/').next().unwrap_or(path);
            if !is_spec_file(name) {
                continue;
            }
            let (id, mut specs) = match self.files.remove(path) {
                Some((old_id, specs)) if &old_id == id => (old_id, specs),
                _ => {
                    let content = read(path, id)?;
                    update.parsed += 1;
                    update.changed = true;
                    (id.clone(), load_content(path, content, opts))
                }
            };
            // Past the total, the file is kept as an error with no id, so that it is read
            // again once there is room.
            let id = if specs.charge_total(path, &mut total, opts.max_total_bytes) {
                update.changed = true;
                String::new()
            } else {
                id
            };
            next.insert(path.clone(), (id, specs));
        }
        // Anything left was removed.
        update.changed |= !self.files.is_empty();
        self.files = next;
        Ok(update)
    }

    /// The specs of the current revision.
    pub fn spec_set(&self) -> SpecSet {
        SpecSet::from_files(
            self.files
                .iter()
                .map(|(path, (_, specs))| (path.clone(), specs.clone()))
                .collect(),
        )
    }
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
}
