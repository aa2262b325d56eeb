//! The config a promotion carries to the next environment (issue 50): the keys of the
//! ConfigMaps and Secrets the rollout reads that changed in the same commit as its image
//! (files beside the rollout's file) are set the same way in the next environment's
//! ConfigMap or Secret of the same name. Environments differ on purpose (a database address,
//! a replica count), so only the change is carried, key by key: a key the next environment
//! holds at the value the change started from gets the new value (or goes, if the change
//! removed it); one it holds at another value is a choice someone made there, and is kept
//! and named in the pull request. Values are compared, never logged or written to the body
//! (Secrets).
//!
//! [`key_changes`] and [`carry_into`] are pure; [`changes_with_the_image`] reads the history.

use std::collections::BTreeMap;
use std::path::Path;

use git2::{Commit, ObjectType, Repository};
use serde_json::Value;

use super::revert::{Revert, documents};
use crate::api::{ConfigKind, RevertMode};

/// The maps of a ConfigMap or Secret whose keys are carried.
const FIELDS: [&str; 3] = ["data", "stringData", "binaryData"];
/// A change with more files than this is not one rollout's.
const MAX_FILES: usize = 50;
/// A config file larger than this is not read.
const MAX_FILE_BYTES: usize = 1 << 20;

/// One key's change: its map, its name, and its value before and after (`None`: absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyChange {
    pub field: &'static str,
    pub key: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// The changed keys of one ConfigMap or Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigChange {
    pub kind: ConfigKind,
    pub name: String,
    pub keys: Vec<KeyChange>,
}

/// What carrying did to the next environment's files, for the pull request's body (key
/// names only).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    /// `ConfigMap web-config: LOG_LEVEL` for each key set or removed.
    pub set: Vec<String>,
    /// Each key left as the next environment has it, with why.
    pub kept: Vec<String>,
    /// The edited files: path and new text.
    pub files: Vec<(String, String)>,
}

fn kind_of(kind: &str) -> Option<ConfigKind> {
    match kind {
        "ConfigMap" => Some(ConfigKind::ConfigMap),
        "Secret" => Some(ConfigKind::Secret),
        _ => None,
    }
}

/// The ConfigMaps and Secrets of a file: kind, name, the parsed document, and its place.
fn config_documents(text: &str) -> Vec<(ConfigKind, String, Value, usize, usize)> {
    documents(text)
        .into_iter()
        .filter_map(|(start, doc)| {
            let value: Value =
                serde_saphyr::from_str_with_options(doc, crate::specs::bounded_parser_options())
                    .ok()?;
            let kind = kind_of(value.get("kind")?.as_str()?)?;
            let name = value.pointer("/metadata/name")?.as_str()?.to_string();
            Some((kind, name, value, start, doc.len()))
        })
        .collect()
}

/// A map of a document as strings (a YAML number or boolean is read as its text).
fn map_of(doc: Option<&Value>, field: &str) -> BTreeMap<String, String> {
    let Some(Value::Object(map)) = doc.and_then(|d| d.get(field)) else {
        return BTreeMap::new();
    };
    map.iter()
        .map(|(k, v)| {
            let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            (k.clone(), text)
        })
        .collect()
}

/// The keys of `wanted`'s ConfigMaps and Secrets that differ between `before` (the file's
/// text before the change; `None`: the change added the file) and `after`.
pub fn key_changes(
    before: Option<&str>,
    after: &str,
    wanted: &[(ConfigKind, String)],
) -> Vec<ConfigChange> {
    let old = before.map(config_documents).unwrap_or_default();
    let mut out = Vec::new();
    for (kind, name, doc, _, _) in config_documents(after) {
        if !wanted.iter().any(|(k, n)| *k == kind && *n == name) {
            continue;
        }
        let earlier = old
            .iter()
            .find(|(k, n, ..)| *k == kind && *n == name)
            .map(|(_, _, d, _, _)| d);
        let mut keys = Vec::new();
        for field in FIELDS {
            let (was, now) = (map_of(earlier, field), map_of(Some(&doc), field));
            let names: std::collections::BTreeSet<&String> = was.keys().chain(now.keys()).collect();
            for key in names {
                let (b, a) = (was.get(key), now.get(key));
                if b != a {
                    keys.push(KeyChange {
                        field,
                        key: key.clone(),
                        before: b.cloned(),
                        after: a.cloned(),
                    });
                }
            }
        }
        if !keys.is_empty() {
            out.push(ConfigChange { kind, name, keys });
        }
    }
    out
}

/// `text` (a file of the next environment) with `changes` carried into its ConfigMaps and
/// Secrets of the same names (any namespace): `Some` edited text when a key was set, with
/// what was set and kept added to `carried`, and each config found marked in `found`. Only
/// an edited document is written again (its comments go; every other document stays as it
/// is, byte for byte).
pub fn carry_into(
    text: &str,
    changes: &[ConfigChange],
    carried: &mut Carried,
    found: &mut Vec<(ConfigKind, String)>,
) -> Option<String> {
    let mut out = text.to_string();
    let mut edited = false;
    // From the last document back, so earlier offsets stay right.
    let mut docs = config_documents(text);
    docs.reverse();
    for (kind, name, mut doc, start, len) in docs {
        let Some(change) = changes.iter().find(|c| c.kind == kind && c.name == name) else {
            continue;
        };
        found.push((kind, name.clone()));
        let mut this_doc = false;
        for k in &change.keys {
            let label = format!("{} {name}: {}", kind.as_str(), k.key);
            let current = map_of(Some(&doc), k.field).get(&k.key).cloned();
            if current == k.after {
                continue;
            }
            if current != k.before {
                carried.kept.push(format!(
                    "{label} (kept: this environment's {} differs from what the change started from)",
                    k.field
                ));
                continue;
            }
            let Some(map) = doc.as_object_mut().map(|d| {
                d.entry(k.field)
                    .or_insert_with(|| Value::Object(Default::default()))
            }) else {
                continue;
            };
            let Some(map) = map.as_object_mut() else {
                carried
                    .kept
                    .push(format!("{label} (kept: its {} is not a map)", k.field));
                continue;
            };
            match &k.after {
                Some(v) => {
                    map.insert(k.key.clone(), Value::String(v.clone()));
                }
                None => {
                    map.remove(&k.key);
                }
            }
            carried.set.push(label);
            this_doc = true;
        }
        if this_doc {
            let Ok(yaml) = serde_saphyr::to_string(&doc) else {
                continue;
            };
            let marker = if text[start..].starts_with("---") {
                "---\n"
            } else {
                ""
            };
            out.replace_range(start..start + len, &format!("{marker}{yaml}"));
            edited = true;
        }
    }
    edited.then_some(out)
}

/// The key changes that came into `source_path` (the passed rollout's file, from the
/// repository's root) in the commit that brought `image` into it, for the config `wanted`,
/// from files in its directory or below; empty when the image came alone, or that commit is
/// not found within the bounds of [`super::config_revert`].
pub fn changes_with_the_image(
    repo: &Repository,
    tip: &Commit<'_>,
    source_path: &str,
    (kind, name, image): (&'static str, &str, &str),
    wanted: &[(ConfigKind, String)],
) -> Result<Vec<ConfigChange>, git2::Error> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    // The passed rollout, as the commit that brought its image in is looked for by a revert.
    let rollout = Revert {
        path: source_path.to_string(),
        kind,
        namespace: String::new(),
        name: name.to_string(),
        failed: image.to_string(),
        good: String::new(),
        why: String::new(),
        mode: RevertMode::None,
        revision: None,
        shared_base: false,
        cluster: None,
        failed_in: None,
    };
    let Some(change) = super::config_revert::change_that_brought(repo, tip, &rollout)? else {
        return Ok(Vec::new());
    };
    let before = change.parent(0)?;
    let (before_tree, change_tree) = (before.tree()?, change.tree()?);
    let diff = repo.diff_tree_to_tree(Some(&before_tree), Some(&change_tree), None)?;
    if diff.deltas().len() > MAX_FILES {
        return Ok(Vec::new());
    }
    let dir = Path::new(source_path).parent().unwrap_or(Path::new(""));
    let text_at = |tree: &git2::Tree<'_>, path: &Path| -> Option<String> {
        let entry = tree.get_path(path).ok()?;
        let blob = repo.find_blob(entry.id()).ok()?;
        (entry.kind() == Some(ObjectType::Blob) && blob.size() <= MAX_FILE_BYTES)
            .then(|| String::from_utf8(blob.content().to_vec()).ok())?
    };
    let mut out = Vec::new();
    for delta in diff.deltas() {
        let Some(path) = delta.new_file().path() else {
            continue;
        };
        let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
        if !yaml || !path.starts_with(dir) || path == Path::new(source_path) {
            continue;
        }
        let Some(after) = text_at(&change_tree, path) else {
            continue;
        };
        let earlier = text_at(&before_tree, path);
        out.extend(key_changes(earlier.as_deref(), &after, wanted));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAGING_BEFORE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web-config, namespace: staging}\ndata:\n  LOG_LEVEL: info\n  DB: staging-db\n  OLD: x\n";
    const STAGING_AFTER: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web-config, namespace: staging}\ndata:\n  LOG_LEVEL: debug\n  DB: staging-db2\n  NEW: \"1\"\n";

    fn wanted() -> Vec<(ConfigKind, String)> {
        vec![(ConfigKind::ConfigMap, "web-config".into())]
    }

    #[test]
    fn only_the_changed_keys_of_the_config_the_rollout_reads_are_a_change() {
        let changes = key_changes(Some(STAGING_BEFORE), STAGING_AFTER, &wanted());
        assert_eq!(changes.len(), 1);
        let keys: Vec<(&str, Option<&str>, Option<&str>)> = changes[0]
            .keys
            .iter()
            .map(|k| (k.key.as_str(), k.before.as_deref(), k.after.as_deref()))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("DB", Some("staging-db"), Some("staging-db2")),
                ("LOG_LEVEL", Some("info"), Some("debug")),
                ("NEW", None, Some("1")),
                ("OLD", Some("x"), None),
            ]
        );
        // A ConfigMap the rollout does not read is not carried.
        assert!(key_changes(Some(STAGING_BEFORE), STAGING_AFTER, &[]).is_empty());
    }

    #[test]
    fn a_key_at_the_value_the_change_started_from_is_carried_and_one_set_by_hand_is_kept() {
        let changes = key_changes(Some(STAGING_BEFORE), STAGING_AFTER, &wanted());
        let prod = "# production\napiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryDeployment\nmetadata: {name: web}\nspec: {image: web:1}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\n  namespace: prod\ndata:\n  LOG_LEVEL: info\n  DB: prod-db\n  OLD: x\n";
        let (mut carried, mut found) = (Carried::default(), Vec::new());
        let text = carry_into(prod, &changes, &mut carried, &mut found).unwrap();
        // The rollout's document is untouched, byte for byte.
        assert!(
            text.starts_with(&prod[..prod.find("---").unwrap()]),
            "{text}"
        );
        let docs = config_documents(&text);
        let data = map_of(Some(&docs[0].2), "data");
        assert_eq!(data.get("LOG_LEVEL").map(String::as_str), Some("debug"));
        assert_eq!(data.get("NEW").map(String::as_str), Some("1"));
        assert_eq!(data.get("OLD"), None);
        // Production's own database stays.
        assert_eq!(data.get("DB").map(String::as_str), Some("prod-db"));
        assert_eq!(
            docs[0].2.pointer("/metadata/namespace"),
            Some(&"prod".into())
        );
        assert_eq!(
            carried.set,
            vec![
                "ConfigMap web-config: LOG_LEVEL",
                "ConfigMap web-config: NEW",
                "ConfigMap web-config: OLD"
            ]
        );
        assert_eq!(carried.kept.len(), 1);
        assert!(carried.kept[0].starts_with("ConfigMap web-config: DB (kept"));
        assert_eq!(found, wanted());
        // Carried already: nothing to write.
        let mut again = Carried::default();
        assert_eq!(
            carry_into(&text, &changes, &mut again, &mut Vec::new()),
            None
        );
    }

    #[test]
    fn a_secrets_values_never_reach_what_is_said_about_it() {
        let before = "kind: Secret\nmetadata: {name: creds}\nstringData: {password: old-secret}\n";
        let after = "kind: Secret\nmetadata: {name: creds}\nstringData: {password: new-secret}\n";
        let changes = key_changes(Some(before), after, &[(ConfigKind::Secret, "creds".into())]);
        let (mut carried, mut found) = (Carried::default(), Vec::new());
        let prod = "kind: Secret\nmetadata: {name: creds, namespace: prod}\nstringData: {password: prod-secret}\n";
        assert_eq!(carry_into(prod, &changes, &mut carried, &mut found), None);
        let said = format!("{:?}{:?}", carried.set, carried.kept);
        assert!(
            !said.contains("secret\"") && !said.contains("prod-secret"),
            "{said}"
        );
        assert!(
            !said.contains("new-secret") && !said.contains("old-secret"),
            "{said}"
        );
        assert_eq!(carried.kept.len(), 1);
    }
}
