//! Tests of the spec snapshot: whole listings, changes alone, and units updated in place.

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
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  v: \"{value}\"\n"
            )
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
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  v: \"{v}\"\n")
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

/// Issue 72: with `--path`, a change outside every path that no picked unit reads is not
/// read and changes nothing, with or without units in the repository.
#[test]
fn a_change_outside_every_path_reads_nothing() {
    let read = |p: &str, _: &str| -> Result<FileContent, ()> {
        assert!(!p.starts_with("other/"), "read {p}");
        Ok(cm(&p.replace(['/', '.'], "-")))
    };
    for with_unit in [false, true] {
        // With a unit picked, the change goes through the in-place path.
        let paths: &[&str] = if with_unit {
            &["staging", "units"]
        } else {
            &["staging"]
        };
        let opts = LoadOptions {
            selection: crate::specs::PathSelection::new(paths).unwrap(),
            ..LoadOptions::default()
        };
        let mut snap = SpecSnapshot::default();
        let mut files = vec![("other/a.yaml", "1"), ("staging/b.yaml", "1")];
        if with_unit {
            files.push(("units/kustomization.yaml", "1"));
        }
        snap.update(&listing(&files), read, &opts).unwrap();
        assert_eq!(snap.has_units, with_unit);
        let changes = [("other/a.yaml".to_string(), Some("2".to_string()))];
        let update = snap.update_changed(&changes, read, &opts).unwrap();
        assert_eq!(
            update,
            Some(SnapshotUpdate::default()),
            "with a unit: {with_unit}"
        );
    }
}
