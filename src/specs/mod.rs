//! Specs from a repository: reads the YAML files under a path into typed objects, with every
//! error located at `file:line:column`. An invalid file blocks only its own objects; every
//! other file is still loaded.
//!
//! [`load_file`] is a pure function of a file's path and bytes, so the Git source can re-parse
//! only the files that changed between two revisions and keep the rest.

mod analysis_refs;
mod budget;
mod key;
pub mod kinds;
mod known;
mod load;
mod locate;
pub mod policy;
mod promote_to;
mod routes;
mod schema;
mod selection;
mod validate;

pub use budget::{ParseBudget, RevisionShape};
pub use key::{ObjectKey, ObjectKeyParts};

/// Parser options within the default [`ParseBudget`] (depth, nodes, aliases, scalar bytes),
/// for code outside the loader that reads a file of the repository again (a revert's or a
/// promotion's edit): whoever can push controls those bytes too.
pub fn bounded_parser_options() -> serde_saphyr::Options {
    budget::Allowance::new(ParseBudget::default()).parser_options()
}

/// How a listing marks a blocked directory's id; its path ends in `/` and the rest of the id
/// says why. Read like a file that was refused (by the Git source and `--repo-path` alike).
pub const BLOCKED: &str = "blocked:";

pub use load::{
    FileContent, LoadOptions, LocalFileKind, LocalSpecFile, is_spec_file, list_local_spec_files,
    load_content, load_dir, load_file, parse_config_file, read_local_spec_file, too_large,
};
pub use locate::find_key;
pub use policy::Policy;
pub use selection::{PathOutsideRepository, PathSelection};

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A place in a spec file. Lines and columns start at 1.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    /// Path relative to the spec root, with `/` separators. Shared: an object's location is
    /// held by its file, the spec set and the sync's hashes (issue 51).
    pub file: Arc<str>,
    pub line: u64,
    pub column: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// What is wrong with a spec, and where.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpecError {
    pub location: Location,
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

impl std::error::Error for SpecError {}

impl SpecError {
    /// An error at `file:line:column`.
    pub fn at(file: &str, line: u64, column: u64, message: String) -> SpecError {
        SpecError {
            location: Location {
                file: file.into(),
                line,
                column,
            },
            message,
        }
    }
}

/// An object from a spec file, checked against its type and kept as the compact JSON it is
/// applied as. Typed, the 1,000 rollouts of the benchmark held 9 MB (heaptrack), mostly empty
/// optional fields of the pod template; as JSON text they hold about a sixth of that. Shared:
/// the agent's snapshot and each sync's spec set hold the same text.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    json: Arc<str>,
}

impl Spec {
    /// Keeps `object` as JSON text.
    pub fn new(object: &impl serde::Serialize) -> Spec {
        // Serialising these types cannot fail: they hold only JSON-representable data.
        let json = serde_json::to_string(object).unwrap_or_else(|_| "null".into());
        Spec { json: json.into() }
    }

    /// Whether `other` has the same text; the same shared text is recognised without reading it.
    pub fn same_text(&self, other: &Spec) -> bool {
        Arc::ptr_eq(&self.json, &other.json) || self.json == other.json
    }

    /// Whether the object may have an `analysis` field anywhere: a cheap test that lets the
    /// many rollouts without one go unparsed.
    pub fn may_have_analysis(&self) -> bool {
        self.json.contains("\"analysis\"")
    }

    /// Whether the JSON text holds `needle` anywhere (a cheap test before a parse).
    pub fn to_json_text_contains(&self, needle: &str) -> bool {
        self.json.contains(needle)
    }

    /// The size of the object as JSON, in bytes.
    pub fn json_len(&self) -> usize {
        self.json.len()
    }

    /// The object as JSON, as it would be sent to the API server.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::from_str(&self.json).unwrap_or(serde_json::Value::Null)
    }

    /// The object as type `T` (for example [`crate::api::CanaryStatefulSet`]), if it is one.
    pub fn typed<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_str(&self.json).ok()
    }
}

/// An object and where it was declared.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedObject {
    pub key: ObjectKey,
    pub spec: Spec,
    /// Where its document starts.
    pub location: Location,
}

/// The objects and errors of one file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FileSpecs {
    /// Empty whenever `errors` is not: a file with an error contributes nothing.
    pub objects: Vec<LoadedObject>,
    pub errors: Vec<SpecError>,
    /// Documents read and left out on purpose (an Argo CD hook), each with why: not errors,
    /// and nothing is applied for them. `validate` and `diff` print them as notes.
    pub left_out: Vec<SpecError>,
}

impl FileSpecs {
    /// Bytes its objects hold, as JSON.
    pub fn json_bytes(&self) -> usize {
        self.objects.iter().map(|o| o.spec.json_len()).sum()
    }

    /// Replaces the file by an error: it holds `bytes` of a revision over the total.
    fn refuse_for_total(&mut self, file: &str, bytes: usize, max: usize) {
        *self = FileSpecs {
            left_out: Vec::new(),
            objects: Vec::new(),
            errors: vec![SpecError {
                location: Location {
                    file: file.into(),
                    line: 1,
                    column: 1,
                },
                message: format!(
                    "this file's objects hold {bytes} bytes, and with the revision's other files \
                     they pass the {max} bytes all spec files may hold together \
                     (--max-total-bytes); the largest files are refused first, the rest sync. \
                     Split it, split the repository into several sources, or raise the limit"
                ),
            }],
        };
    }
}

/// While `files` together hold more than `max` bytes, refuses the largest (by path on a tie),
/// so that one big file blocks itself rather than every file sorted after it (issue 45).
/// Returns the bytes kept and the paths refused.
pub fn refuse_largest_past_total<'a>(
    files: impl Iterator<Item = (&'a String, &'a mut FileSpecs)>,
    max: usize,
) -> (usize, Vec<String>) {
    let mut sized: Vec<(usize, &String, &mut FileSpecs)> =
        files.map(|(p, f)| (f.json_bytes(), p, f)).collect();
    let mut total: usize = sized.iter().map(|(n, ..)| *n).sum();
    let mut refused = Vec::new();
    if total <= max {
        return (total, refused);
    }
    sized.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    for (bytes, path, specs) in sized {
        if total <= max || bytes == 0 {
            break;
        }
        total -= bytes;
        specs.refuse_for_total(path, bytes, max);
        refused.push(path.clone());
    }
    (total, refused)
}

/// Everything loaded from a spec root.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecSet {
    /// The valid objects, by key.
    pub objects: BTreeMap<ObjectKey, LoadedObject>,
    /// Every error, sorted by location.
    pub errors: Vec<SpecError>,
    /// Files that contributed nothing because of an error in them.
    pub blocked_files: Vec<String>,
    /// Documents left out on purpose (Argo CD hooks), each with why.
    pub left_out: Vec<SpecError>,
    /// The files and units (by key) that gave an object or an error.
    pub files: Vec<String>,
    /// Which set this one was made from, and what differs (see [`Lineage`]).
    pub lineage: Lineage,
}

/// Where a [`SpecSet`] came from: a set made afresh has a new `generation`; a set patched
/// from another names that one's generation and the keys whose objects were replaced. The
/// keys are the same in both sets (a patch replaces objects one for one). A sync that
/// started from that generation looks only at those keys ([`Lineage::changed_since`]), not
/// at every object.
/// Generation 0 is a set of unknown origin. It says how a set was made, not what it holds,
/// so it takes no part in comparing sets.
#[derive(Clone, Debug, Default)]
pub struct Lineage {
    pub generation: u64,
    pub patched_from: Option<(u64, Vec<ObjectKey>)>,
}

impl PartialEq for Lineage {
    fn eq(&self, _: &Lineage) -> bool {
        true
    }
}

impl Lineage {
    /// A generation no other set of this process has.
    pub fn fresh() -> Lineage {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Lineage {
            generation: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            patched_from: None,
        }
    }

    /// The keys whose objects may differ from the set of generation `since`, when this set
    /// was patched from that one; `None` when anything may differ.
    pub fn changed_since(&self, since: u64) -> Option<&[ObjectKey]> {
        match &self.patched_from {
            Some((from, keys)) if since != 0 && *from == since => Some(keys),
            _ => None,
        }
    }
}

impl SpecSet {
    /// Whether nothing was found: no object and no error (a wrong path, most likely).
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.errors.is_empty()
    }

    /// Combines per-file results: drops files with errors, and objects declared twice.
    pub fn from_files(files: BTreeMap<String, FileSpecs>) -> SpecSet {
        let mut set = SpecSet::default();
        let mut first_seen: BTreeMap<ObjectKey, Location> = BTreeMap::new();
        let mut duplicated: Vec<ObjectKey> = Vec::new();
        for (file, specs) in files {
            set.left_out.extend(specs.left_out);
            if !specs.objects.is_empty() || !specs.errors.is_empty() {
                set.files.push(file.clone());
            }
            if !specs.errors.is_empty() {
                set.blocked_files.push(file);
                set.errors.extend(specs.errors);
                continue;
            }
            for object in specs.objects {
                if let Some(first) = first_seen.get(&object.key) {
                    set.errors.push(SpecError {
                        message: format!(
                            "{} is declared twice: here and at {first}; remove one of them \
                             (neither is applied until then)",
                            object.key
                        ),
                        location: object.location.clone(),
                    });
                    duplicated.push(object.key.clone());
                    continue;
                }
                first_seen.insert(object.key.clone(), object.location.clone());
                set.objects.insert(object.key.clone(), object);
            }
        }
        for key in duplicated {
            set.objects.remove(&key);
        }
        set.block_broken_analysis();
        set.block_broken_routes();
        set.block_broken_promotions();
        set.errors.sort();
        set
    }

    /// Records `broken`, and drops every object of each file it names: a rollout that fails
    /// a check across objects blocks its file, as a parse error does.
    fn block_files(&mut self, broken: Vec<SpecError>) {
        for error in broken {
            let file = error.location.file.clone();
            self.objects.retain(|_, o| o.location.file != file);
            if !self.blocked_files.iter().any(|f| **f == *file) {
                self.blocked_files.push(file.to_string());
            }
            self.errors.push(error);
        }
    }

    /// Checks that every AnalysisTemplate a rollout references is in the set, in its
    /// namespace, and gets a value for each argument without a default, and that each gate
    /// follows a step or batch the rollout has. A rollout that fails blocks its file.
    fn block_broken_analysis(&mut self) {
        let broken = analysis_refs::broken(self.objects.values());
        self.block_files(broken);
    }
}
