//! Reading spec files: bytes -> documents -> typed objects, each error located.

use std::collections::BTreeMap;
use std::path::Path;

use kube::api::DynamicObject;
use serde_json::Value;

use super::budget::{self, Allowance, ParseBudget, budget_refusal};
use super::locate::find_key;
use super::policy::{Policy, controller_mark, never_from_git};
use super::validate::{check_canary_deployment, check_canary_statefulset, crd_errors};
use super::{FileSpecs, LoadedObject, Location, ObjectKey, Spec, SpecError, SpecSet};
use crate::api::{API_VERSION, AnalysisTemplate, CanaryDeployment, CanaryStatefulSet};
use crate::{Error, Result};

/// How specs are read.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Namespace for namespaced objects that name none.
    pub default_namespace: String,
    /// What this source may apply (namespaces, cluster-scoped kinds).
    pub policy: Policy,
    /// Files larger than this are refused whole, before they are read.
    pub max_file_bytes: usize,
    /// What one file may expand to while it is parsed.
    pub budget: ParseBudget,
    /// What all files' objects may hold together, as JSON; past it the largest files are
    /// refused with an error.
    pub max_total_bytes: usize,
    /// What a revision's listing may hold: files, entries per directory.
    pub shape: super::RevisionShape,
    /// Report fields the Kubernetes types (of k8s-openapi's release, 1.36) do not have as
    /// errors: on for `validate` and `diff`. Off in the agent, which leaves them to the API
    /// server: a newer cluster knows fields this release does not, and blocking them would
    /// stop a file the cluster accepts.
    pub unknown_fields_are_errors: bool,
    /// What of the repository is applied (`--path`); the rest is read only as a unit's input.
    pub selection: super::PathSelection,
}

/// The most one object may be as JSON: about what the API server stores (etcd's 1.5 MiB).
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            default_namespace: "default".into(),
            policy: Policy::default(),
            max_file_bytes: 1024 * 1024,
            budget: ParseBudget::default(),
            max_total_bytes: 64 * 1024 * 1024,
            shape: super::RevisionShape::default(),
            unknown_fields_are_errors: false,
            selection: super::PathSelection::whole(),
        }
    }
}

/// Kinds that live outside namespaces (Kubernetes' own, as of 1.36); the rest are taken as
/// namespaced offline. The sync asks the cluster, so a CRD's cluster-scoped kind meets the same
/// policy there.
const CLUSTER_SCOPED_KINDS: &[&str] = &[
    "Namespace",
    "Node",
    "PersistentVolume",
    "StorageClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "IngressClass",
    "RuntimeClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "APIService",
    "CSIDriver",
    "CSINode",
    "VolumeAttachment",
    "VolumeAttributesClass",
    "CertificateSigningRequest",
    "ClusterTrustBundle",
    "FlowSchema",
    "PriorityLevelConfiguration",
    "DeviceClass",
    "ResourceSlice",
    "ServiceCIDR",
    "IPAddress",
    "StorageVersionMigration",
];

/// Whether a kind is cluster-scoped, as far as linnet knows offline.
pub fn is_cluster_scoped(kind: &str) -> bool {
    CLUSTER_SCOPED_KINDS.contains(&kind)
}

/// Loads every `*.yaml` / `*.yml` below `root` (hidden directories such as `.git` and
/// `.linnet` are skipped). Fails only if `root` itself cannot be read; problems with files are
/// reported as located errors in the result. Only regular files inside the tree are read, and
/// none past `max_file_bytes`: links are reported, not followed.
pub fn load_dir(root: &Path, opts: &LoadOptions) -> Result<SpecSet> {
    let mut files = BTreeMap::new();
    for entry in list_local_spec_files(root, &opts.shape).map_err(|source| Error::Io {
        path: root.to_path_buf(),
        source,
    })? {
        let name = entry.rel.rsplit('/').next().unwrap_or(&entry.rel);
        if !is_spec_file(name) && !matches!(entry.kind, LocalFileKind::Blocked(_)) {
            continue;
        }
        let content = read_local_spec_file(&entry, opts.max_file_bytes);
        let specs = load_content(&entry.rel, content, opts);
        files.insert(entry.rel, specs);
    }
    super::refuse_largest_past_total(files.iter_mut(), opts.max_total_bytes);
    Ok(SpecSet::from_files(files))
}

/// A spec file's content as a source found it: its bytes, or why they were not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileContent {
    Bytes(Vec<u8>),
    Refused(String),
}

/// Why a file over `max` bytes is not read.
pub fn too_large(len: u64, max: usize) -> String {
    format!("file is {len} bytes, over the limit of {max} bytes; split it into smaller files")
}

/// Loads a file as a source found it: [`load_file`] on its bytes, or its refusal as an error
/// at its first line.
pub fn load_content(file: &str, content: FileContent, opts: &LoadOptions) -> FileSpecs {
    match content {
        FileContent::Bytes(bytes) => load_file(file, &bytes, opts),
        FileContent::Refused(message) => FileSpecs {
            left_out: Vec::new(),
            objects: Vec::new(),
            errors: vec![error_at(file, 1, 1, message)],
        },
    }
}

/// Whether a file name is a spec file.
pub fn is_spec_file(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml")
}

fn error_at(file: &str, line: u64, column: u64, message: String) -> SpecError {
    SpecError::at(file, line, column, message)
}

/// Loads one file. Pure: the same path and bytes always give the same result. If any
/// document has an error, the file's objects are all withheld.
pub fn load_file(file: &str, bytes: &[u8], opts: &LoadOptions) -> FileSpecs {
    let mut errors = Vec::new();
    let mut objects = Vec::new();
    let mut left_out = Vec::new();
    if bytes.len() > opts.max_file_bytes {
        errors.push(error_at(
            file,
            1,
            1,
            too_large(bytes.len() as u64, opts.max_file_bytes),
        ));
        return FileSpecs {
            objects,
            errors,
            left_out,
        };
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t.strip_prefix('\u{feff}').unwrap_or(t),
        Err(e) => {
            let (line, column) = line_col_of_byte(bytes, e.valid_up_to());
            let bad = bytes.get(e.valid_up_to()).copied().unwrap_or(0);
            errors.push(error_at(
                file,
                line,
                column,
                format!("file is not valid UTF-8 (byte 0x{bad:02x}); save it as UTF-8"),
            ));
            return FileSpecs {
                objects,
                errors,
                left_out,
            };
        }
    };
    let allowance = Allowance::new(opts.budget);
    for doc in split_documents(text) {
        match load_document(file, &doc, opts, &allowance) {
            Ok(Loaded::Object(object)) => objects.push(object),
            Ok(Loaded::LeftOut(why)) => left_out.push(why),
            Ok(Loaded::Nothing) => {}
            Err(mut e) => {
                // A file over its budget is refused once, at the place it ran out.
                let over_budget = e.iter().any(|e| e.message.starts_with(budget::OVER));
                errors.append(&mut e);
                if over_budget {
                    break;
                }
            }
        }
    }
    if !errors.is_empty() {
        objects.clear();
    }
    // Kept for as long as the file is unchanged: a one-object file's vector grew to room for
    // four, 600 bytes a file, 5.8 MiB at 10,000 files (heaptrack).
    objects.shrink_to_fit();
    FileSpecs {
        objects,
        errors,
        left_out,
    }
}

/// Parses a configuration file of a renderer (a kustomization, a `linnet-helm.yaml`) into
/// one JSON value, within the same size and parse budget as a spec file; an error is located.
pub fn parse_config_file(
    file: &str,
    bytes: &[u8],
    opts: &LoadOptions,
) -> std::result::Result<Value, SpecError> {
    if bytes.len() > opts.max_file_bytes {
        let message = too_large(bytes.len() as u64, opts.max_file_bytes);
        return Err(error_at(file, 1, 1, message));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let (line, column) = line_col_of_byte(bytes, e.valid_up_to());
        error_at(
            file,
            line,
            column,
            "file is not valid UTF-8; save it as UTF-8".into(),
        )
    })?;
    let doc = Document {
        text: text.strip_prefix('\u{feff}').unwrap_or(text).to_string(),
        first_line: 1,
    };
    Allowance::new(opts.budget).parse(&doc.text).map_err(|e| {
        let mut located = yaml_error(file, &doc, &e, "invalid YAML: ");
        if let Some(refusal) = budget_refusal(&e, &opts.budget) {
            located.message = refusal;
        }
        located
    })
}

fn line_col_of_byte(bytes: &[u8], offset: usize) -> (u64, u64) {
    let before = &bytes[..offset.min(bytes.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() as u64 + 1;
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map(|p| p + 1)
        .unwrap_or(0);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count() as u64
        + 1;
    (line, column)
}

/// One YAML document and the line it starts on (1-based) in its file.
struct Document {
    text: String,
    first_line: u64,
}

/// Splits a YAML stream at `---` lines. A `---` at column 0 always starts a document in YAML
/// (block scalars are indented), so this split is exact for the documents linnet reads.
fn split_documents(text: &str) -> Vec<Document> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut first_line = 1u64;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_end_matches(['\n', '\r']);
        let is_marker =
            trimmed == "---" || trimmed.starts_with("--- ") || trimmed.starts_with("---\t");
        if is_marker {
            if !current.trim().is_empty() {
                docs.push(Document {
                    text: std::mem::take(&mut current),
                    first_line,
                });
            }
            current.clear();
            // Keep the marker line (it may carry content); it parses as a document start.
            current.push_str(line);
            first_line = i as u64 + 1;
            continue;
        }
        current.push_str(line);
    }
    if !current.trim().is_empty() {
        docs.push(Document {
            text: current,
            first_line,
        });
    }
    docs
}

/// A serde-saphyr error, moved from document coordinates to file coordinates.
fn yaml_error(file: &str, doc: &Document, err: &serde_saphyr::Error, what: &str) -> SpecError {
    let (line, column) = err
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((1, 1));
    let message = clean_yaml_message(&err.without_snippet().to_string());
    error_at(
        file,
        doc.first_line + line.saturating_sub(1),
        column.max(1),
        format!("{what}{message}"),
    )
}

/// serde-saphyr puts the location into its message as well; we print it once, in front.
fn clean_yaml_message(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message).trim();
    let cut = first
        .find(" at line ")
        .map(|i| &first[..i])
        .unwrap_or(first);
    cut.trim_end_matches(['.', ',']).to_string()
}

/// The first controller mark (label or annotation key) on a `metadata` nested anywhere below
/// the top level, with the dotted path of its map. The path is written only for a mark found:
/// writing it at every node costs the square of a deep or wide document.
fn nested_controller_mark(value: &Value) -> Option<(String, String)> {
    enum Segment<'a> {
        Key(&'a str),
        Index(usize),
    }
    fn render(path: &[Segment]) -> String {
        let mut out = String::new();
        for segment in path {
            match segment {
                Segment::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    }
    fn walk<'a>(value: &'a Value, path: &mut Vec<Segment<'a>>) -> Option<(String, String)> {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    path.push(Segment::Key(k));
                    if path.len() > 1 && k == "metadata" {
                        for map_name in ["labels", "annotations"] {
                            let keys = v
                                .get(map_name)
                                .and_then(Value::as_object)
                                .map(|m| m.keys().map(String::as_str).collect::<Vec<_>>())
                                .unwrap_or_default();
                            if let Some(mark) = controller_mark(keys) {
                                return Some((
                                    format!("{}.{map_name}", render(path)),
                                    mark.to_string(),
                                ));
                            }
                        }
                    }
                    if let Some(found) = walk(v, path) {
                        return Some(found);
                    }
                    path.pop();
                }
                None
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    path.push(Segment::Index(i));
                    if let Some(found) = walk(v, path) {
                        return Some(found);
                    }
                    path.pop();
                }
                None
            }
            _ => None,
        }
    }
    walk(value, &mut Vec::new())
}

mod document;
mod local;
mod place;
mod read_from_git;

use document::*;
pub use local::{LocalFileKind, LocalSpecFile, list_local_spec_files, read_local_spec_file};
use place::Loaded;

#[cfg(test)]
mod tests;
