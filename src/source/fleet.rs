//! A fleet's read of Git (issue 73): the `Fleet` file at the followed branch's tip, and each
//! cluster's `_cluster.yaml` and status files on the status branch, into a
//! [`FleetSnapshot`]. Each branch has a shallow mirror of its own. Whoever can push may be
//! hostile: a Fleet past [`MAX_FILE_BYTES`], status files past [`MAX_STATUS_FILE_BYTES`],
//! clusters past [`MAX_CLUSTERS`], and status files past [`MAX_REPORTS`] or
//! [`MAX_REPORT_BYTES`] in all are left out, and each parse has the loader's budget.

use std::path::{Path, PathBuf};
use std::time::Duration;

use git2::{ObjectType, Oid, Repository, Tree};

use super::git::{GitError, GitMirror, GitRemote};
use crate::api::status_paths::{CLUSTER_KIND, ClusterDocument, STATUS_DIR};
use crate::api::{API_VERSION, ClusterIdentity, FLEET_KIND, Fleet};
use crate::plan::fleet::{FleetSnapshot, Report};

/// The largest Fleet, cluster or status file read.
pub const MAX_FILE_BYTES: usize = 256 * 1024;
/// Clusters read; more are left out (and said).
pub const MAX_CLUSTERS: usize = 500;
/// Status files read in all.
pub const MAX_REPORTS: usize = 100_000;
/// The largest status or `_cluster.yaml` file read (linnet writes about 1 KiB).
pub const MAX_STATUS_FILE_BYTES: usize = 64 * 1024;
/// Bytes of status files read in all, at one read.
pub const MAX_REPORT_BYTES: usize = 256 * 1024 * 1024;

/// Where a fleet is read from.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// The followed branch (the Fleet file is read at its tip).
    pub remote: GitRemote,
    /// The branch the status files go to (`--writeback-branch`).
    pub status_branch: String,
    /// The Fleet file, from the repository's root (`--fleet`).
    pub path: String,
    /// The mirrors' parent directory.
    pub dir: PathBuf,
    pub timeout: Duration,
}

/// The two mirrors a fleet is read from.
pub struct FleetReader {
    spec: GitMirror,
    status: GitMirror,
    path: String,
    /// The tips of the last read (the followed branch's, the status branch's if any).
    read_at: Option<(Oid, Option<Oid>)>,
}

impl FleetReader {
    pub fn open(config: &FleetConfig) -> Result<FleetReader, GitError> {
        let mut spec = GitMirror::open(&config.dir.join("spec"), config.remote.clone())?;
        let mut status = GitMirror::open(
            &config.dir.join("status"),
            GitRemote {
                branch: config.status_branch.clone(),
                ..config.remote.clone()
            },
        )?;
        spec.set_deadline(Some(config.timeout));
        status.set_deadline(Some(config.timeout));
        Ok(FleetReader {
            spec,
            status,
            path: config.path.clone(),
            read_at: None,
        })
    }

    /// Reads the snapshot (blocking: network and disk); `None` when neither branch moved
    /// since the last read, which then asked the remote for two tips and transferred and
    /// parsed nothing. No status branch yet is no report yet.
    pub fn read(&mut self, timeout: Duration) -> Result<Option<FleetSnapshot>, GitError> {
        self.spec.set_deadline(Some(timeout));
        self.status.set_deadline(Some(timeout));
        let spec_tip = tip_of(&self.spec)?;
        let status_tip = match tip_of(&self.status) {
            Ok(tip) => Some(tip),
            Err(GitError::NoSuchBranch { .. }) => None,
            Err(e) => return Err(e),
        };
        if self.read_at == Some((spec_tip, status_tip)) {
            return Ok(None);
        }
        let spec_tree = self.spec.repo().find_commit(spec_tip)?.tree()?;
        let status_tree = match status_tip {
            Some(tip) => Some(self.status.repo().find_commit(tip)?.tree()?),
            None => None,
        };
        let read = snapshot(
            (self.spec.repo(), &spec_tree),
            status_tree.as_ref().map(|t| (self.status.repo(), t)),
            &self.path,
        );
        self.read_at = Some((spec_tip, status_tip));
        Ok(Some(read))
    }
}

/// The branch's tip, fetched only when the mirror does not have it yet.
fn tip_of(mirror: &GitMirror) -> Result<Oid, GitError> {
    let tip = mirror.remote_tip()?;
    if mirror.local_tip() == Some(tip) {
        return Ok(tip);
    }
    mirror.fetch()
}

/// Why a Fleet file (or a status file) cannot be read; each names its file.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FleetFileError {
    #[error("{path}: no such file on the followed branch (--fleet)")]
    Missing { path: String },
    #[error("{path}: not a file")]
    NotAFile { path: String },
    #[error("{path}: {size} bytes, over the {limit} a fleet reads")]
    TooLarge {
        path: String,
        size: usize,
        limit: usize,
    },
    #[error("{path}: not UTF-8")]
    NotUtf8 { path: String },
    #[error("{path}: {message}")]
    Unreadable { path: String, message: String },
    #[error("{path}: expected apiVersion {API_VERSION} and kind {FLEET_KIND}, not {found}")]
    NotAFleet { path: String, found: String },
    #[error("{path}: {}", problems.join("; "))]
    Invalid { path: String, problems: Vec<String> },
}

/// The snapshot of the Fleet at `path` in `spec` and the status files in `status`. A Fleet
/// that cannot be read is the snapshot's `problem` (every new image then waits).
pub fn snapshot(
    (spec_repo, spec): (&Repository, &Tree<'_>),
    status: Option<(&Repository, &Tree<'_>)>,
    path: &str,
) -> FleetSnapshot {
    let fleet = blob_text(spec_repo, spec, (path, MAX_FILE_BYTES))
        .and_then(|text| text.ok_or_else(|| FleetFileError::Missing { path: path.into() }))
        .and_then(|text| parse_fleet(path, &text));
    let mut snap = match fleet {
        Ok(f) => FleetSnapshot {
            name: f.metadata.name,
            spec: f.spec,
            ..Default::default()
        },
        Err(problem) => FleetSnapshot {
            problem: Some(problem.to_string()),
            ..Default::default()
        },
    };
    if let Some((repo, tree)) = status {
        read_reports(repo, tree, &mut snap);
    }
    snap
}

/// A Fleet file: one document of kind `Fleet`, checked as `linnet validate` checks it.
pub fn parse_fleet(path: &str, text: &str) -> Result<Fleet, FleetFileError> {
    let path = path.to_string();
    if text.len() > MAX_FILE_BYTES {
        return Err(FleetFileError::TooLarge {
            path,
            size: text.len(),
            limit: MAX_FILE_BYTES,
        });
    }
    let parsed = serde_saphyr::from_str_with_options(text, crate::specs::bounded_parser_options());
    let fleet: Fleet = parsed.map_err(|e| FleetFileError::Unreadable {
        path: path.clone(),
        message: e.to_string(),
    })?;
    if fleet.api_version != API_VERSION || fleet.kind != FLEET_KIND {
        let found = format!("{} {}", fleet.api_version, fleet.kind);
        return Err(FleetFileError::NotAFleet { path, found });
    }
    let problems: Vec<String> = fleet
        .spec
        .problems()
        .into_iter()
        .map(|(field, message)| format!("{}: {message}", field.join(".")))
        .collect();
    if !problems.is_empty() {
        return Err(FleetFileError::Invalid { path, problems });
    }
    Ok(fleet)
}

/// The text of the file at `path` in `tree`, `None` when there is none.
fn blob_text(
    repo: &Repository,
    tree: &Tree<'_>,
    (path, limit): (&str, usize),
) -> Result<Option<String>, FleetFileError> {
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return Ok(None);
    };
    if entry.kind() != Some(ObjectType::Blob) {
        return Err(FleetFileError::NotAFile { path: path.into() });
    }
    small_blob(repo, entry.id(), (path, limit)).map(Some)
}

/// A blob's text, refused from its size (read from the object's header) past the limit.
fn small_blob(
    repo: &Repository,
    id: Oid,
    (path, limit): (&str, usize),
) -> Result<String, FleetFileError> {
    let git = |e: git2::Error| FleetFileError::Unreadable {
        path: path.into(),
        message: e.message().to_string(),
    };
    let (size, _) = repo
        .odb()
        .and_then(|odb| odb.read_header(id))
        .map_err(git)?;
    if size > limit {
        return Err(FleetFileError::TooLarge {
            path: path.into(),
            size,
            limit,
        });
    }
    let blob = repo.find_blob(id).map_err(git)?;
    String::from_utf8(blob.content().to_vec())
        .map_err(|_| FleetFileError::NotUtf8 { path: path.into() })
}

/// A status file's fields a fleet reads.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct StatusDocument {
    kind: String,
    namespace: String,
    name: String,
    phase: String,
    since: Option<String>,
    images: StatusImages,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct StatusImages {
    stable: Option<String>,
    canary: Option<String>,
    wanted: Option<String>,
}

/// Every cluster directory under `.linnet/status/` with a `_cluster.yaml`: its identity and
/// the status files of the fleet's rollouts in it.
fn read_reports(repo: &Repository, tree: &Tree<'_>, snap: &mut FleetSnapshot) {
    let Ok(dir) = tree.get_path(Path::new(STATUS_DIR)) else {
        return;
    };
    let Ok(clusters) = repo.find_tree(dir.id()) else {
        return;
    };
    // Status files read, and their bytes.
    let mut reports = (0usize, 0usize);
    for entry in clusters.iter().take(MAX_CLUSTERS * 4) {
        let (Some(name), Some(ObjectType::Tree)) = (entry.name().ok(), entry.kind()) else {
            continue;
        };
        let Ok(cluster_tree) = repo.find_tree(entry.id()) else {
            continue;
        };
        let Some(identity) = cluster_identity(repo, &cluster_tree, name) else {
            continue; // an older layout's namespace directory, or not a cluster
        };
        if snap.clusters.len() >= MAX_CLUSTERS {
            tracing::warn!(
                max = MAX_CLUSTERS,
                "more clusters in the status branch than a fleet reads; the rest are left out"
            );
            break;
        }
        snap.clusters.insert(identity.name.clone(), identity);
        walk_cluster(repo, &cluster_tree, name, snap, &mut reports);
    }
}

/// The cluster a directory's `_cluster.yaml` names, when it names the directory's own.
fn cluster_identity(repo: &Repository, tree: &Tree<'_>, dir: &str) -> Option<ClusterIdentity> {
    let text = blob_text(repo, tree, ("_cluster.yaml", MAX_STATUS_FILE_BYTES)).ok()??;
    let options = crate::specs::bounded_parser_options();
    let doc: ClusterDocument = serde_saphyr::from_str_with_options(&text, options).ok()?;
    (doc.kind == CLUSTER_KIND && doc.cluster.name == dir).then_some(doc.cluster)
}

/// `<namespace>/<xx>/<name>.yaml` under a cluster's directory.
fn walk_cluster(
    repo: &Repository,
    tree: &Tree<'_>,
    cluster: &str,
    snap: &mut FleetSnapshot,
    reports: &mut (usize, usize),
) {
    let subtrees = |t: &Tree<'_>| -> Vec<(String, Oid)> {
        t.iter()
            .filter(|e| e.kind() == Some(ObjectType::Tree))
            .filter_map(|e| Some((e.name().ok()?.to_string(), e.id())))
            .collect()
    };
    for (namespace, ns_id) in subtrees(tree) {
        let Ok(ns_tree) = repo.find_tree(ns_id) else {
            continue;
        };
        for (_, fan_id) in subtrees(&ns_tree) {
            let Ok(fan) = repo.find_tree(fan_id) else {
                continue;
            };
            for file in fan.iter() {
                let Some(rollout) = file.name().ok().and_then(|n| n.strip_suffix(".yaml")) else {
                    continue;
                };
                if reports.0 >= MAX_REPORTS || reports.1 >= MAX_REPORT_BYTES {
                    return;
                }
                reports.0 += 1;
                let Ok(text) = small_blob(repo, file.id(), (rollout, MAX_STATUS_FILE_BYTES)) else {
                    continue;
                };
                reports.1 += text.len();
                let options = crate::specs::bounded_parser_options();
                let Ok(doc) = serde_saphyr::from_str_with_options::<StatusDocument>(&text, options)
                else {
                    continue;
                };
                // A file copied to another place does not speak for that place's rollout.
                if doc.namespace != namespace || doc.name != rollout {
                    continue;
                }
                if !snap.spec.moves(&doc.kind, &doc.namespace, &doc.name) {
                    continue;
                }
                let report = Report {
                    phase: doc.phase,
                    stable_image: doc.images.stable,
                    canary_image: doc.images.canary,
                    wanted_image: doc.images.wanted,
                    since: doc.since.and_then(|s| s.parse().ok()),
                };
                snap.reports
                    .entry((doc.kind, doc.namespace, doc.name))
                    .or_default()
                    .insert(cluster.to_string(), report);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A repository with `files` committed, and its tree.
    fn repo_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Repository) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let mut index = git2::Index::new().unwrap();
        for (path, text) in files {
            let id = repo.blob(text.as_bytes()).unwrap();
            let entry = git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: 0o100644,
                uid: 0,
                gid: 0,
                file_size: text.len() as u32,
                id,
                flags: 0,
                flags_extended: 0,
                path: path.as_bytes().to_vec(),
            };
            index.add(&entry).unwrap();
        }
        let tree = index.write_tree_to(&repo).unwrap();
        let sig = git2::Signature::now("t", "t@example.invalid").unwrap();
        let tree = repo.find_tree(tree).unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "files", &tree, &[])
            .unwrap();
        drop(tree);
        (dir, repo)
    }

    /// A cluster's `_cluster.yaml`, as the write-back writes it.
    fn cluster_file(cluster: ClusterIdentity) -> (String, String) {
        let path = crate::api::status_paths::cluster_path(&cluster.name);
        let doc = ClusterDocument {
            api_version: API_VERSION.into(),
            kind: CLUSTER_KIND.into(),
            cluster,
        };
        (path, serde_saphyr::to_string(&doc).unwrap())
    }

    const FLEET: &str = "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: Fleet\nmetadata: {name: shop}\nspec:\n  waves:\n  - {name: canary, clusters: [eu-1]}\n  - {name: rest, matchLabels: {}}\n";

    fn status(cluster: &str, ns: &str, name: &str, phase: &str, stable: &str) -> (String, String) {
        (
            crate::api::status_paths::path(cluster, ns, name),
            format!(
                "kind: CanaryStatefulSet\ncluster: {cluster}\nnamespace: {ns}\nname: {name}\nphase: {phase}\nsince: '2026-12-03T10:00:00Z'\nimages: {{stable: {stable}, wanted: {stable}}}\n"
            ),
        )
    }

    #[test]
    fn every_cluster_that_says_who_it_is_and_its_reports_are_read() {
        let eu1 = cluster_file(ClusterIdentity {
            name: "eu-1".into(),
            labels: [("region".to_string(), "eu".to_string())].into(),
        });
        let us1 = cluster_file(ClusterIdentity {
            name: "us-1".into(),
            labels: BTreeMap::new(),
        });
        let a = status("eu-1", "shop", "redis", "Stable", "redis:2");
        let b = status("us-1", "shop", "redis", "Stable", "redis:1");
        // A file moved to another rollout's place, and an older layout's file: not reports.
        let forged = (
            status("us-1", "shop", "web", "Stable", "web:9").0,
            a.1.clone(),
        );
        let old = ".linnet/status/shop/34/redis.yaml".to_string();
        let files = [
            ("fleet.yaml".to_string(), FLEET.to_string()),
            eu1,
            us1,
            a.clone(),
            b.clone(),
            forged,
            (old, a.1.clone()),
        ];
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        let (_dir, repo) = repo_with(&files);
        let tree = repo.head().unwrap().peel_to_tree().unwrap();
        let snap = snapshot((&repo, &tree), Some((&repo, &tree)), "fleet.yaml");
        assert_eq!(snap.problem, None);
        assert_eq!(snap.name, "shop");
        assert_eq!(snap.clusters.keys().collect::<Vec<_>>(), ["eu-1", "us-1"]);
        assert_eq!(snap.clusters["eu-1"].labels["region"], "eu");
        let id = (
            "CanaryStatefulSet".to_string(),
            "shop".to_string(),
            "redis".to_string(),
        );
        let reports = &snap.reports[&id];
        assert_eq!(reports.len(), 2);
        assert_eq!(reports["eu-1"].stable_image.as_deref(), Some("redis:2"));
        assert_eq!(reports["eu-1"].since, "2026-12-03T10:00:00Z".parse().ok());
        assert_eq!(snap.reports.len(), 1, "{:?}", snap.reports.keys());
    }

    /// A read with neither branch moved asks for the two tips and reads nothing; a status
    /// file past its limit is left out; a push is read at the next look.
    #[test]
    fn an_unmoved_repository_is_not_read_again_and_a_large_status_file_is_left_out() {
        let a = status("eu-1", "shop", "redis", "Stable", "redis:2");
        let eu1 = cluster_file(ClusterIdentity {
            name: "eu-1".into(),
            labels: BTreeMap::new(),
        });
        let big = status("eu-1", "shop", "web", "Stable", "web:1");
        let big = (
            big.0,
            format!("{}# {}\n", big.1, "x".repeat(MAX_STATUS_FILE_BYTES)),
        );
        let files = [("fleet.yaml".to_string(), FLEET.to_string()), eu1, a, big];
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        let (dir, repo) = repo_with(&files);
        let branch = repo.head().unwrap().shorthand().unwrap().to_string();
        let remote = GitRemote {
            url: format!("file://{}", dir.path().display()),
            branch: branch.clone(),
            auth: crate::source::git::GitAuth::Anonymous,
        };
        let cache = tempfile::tempdir().unwrap();
        let mut reader = FleetReader::open(&FleetConfig {
            remote,
            status_branch: branch,
            path: "fleet.yaml".into(),
            dir: cache.path().to_path_buf(),
            timeout: Duration::from_secs(5),
        })
        .unwrap();
        let first = reader.read(Duration::from_secs(5)).unwrap().unwrap();
        let keys: Vec<&str> = first.reports.keys().map(|(_, _, n)| n.as_str()).collect();
        assert_eq!(keys, ["redis"], "the large file is left out");
        assert_eq!(reader.read(Duration::from_secs(5)).unwrap(), None);
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        let sig = git2::Signature::now("t", "t@example.invalid").unwrap();
        repo.commit(
            Some("HEAD"),
            &sig,
            &sig,
            "again",
            &head.tree().unwrap(),
            &[&head],
        )
        .unwrap();
        assert!(reader.read(Duration::from_secs(5)).unwrap().is_some());
    }

    #[test]
    fn a_fleet_that_cannot_be_read_is_the_snapshots_problem() {
        for (text, says) in [
            ("kind: Fleet\n", "missing field"),
            (
                "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: Fleet\nmetadata: {name: f}\nspec:\n  wavez: []\n",
                "unknown field",
            ),
            (
                "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: Fleet\nmetadata: {name: f}\nspec:\n  waves:\n  - {name: a}\n",
                "spec.waves.0.name: wave a has no clusters",
            ),
        ] {
            let (_dir, repo) = repo_with(&[("fleet.yaml", text)]);
            let tree = repo.head().unwrap().peel_to_tree().unwrap();
            let snap = snapshot((&repo, &tree), None, "fleet.yaml");
            let problem = snap.problem.unwrap_or_default();
            assert!(
                problem.starts_with("fleet.yaml") && problem.contains(says),
                "{problem}"
            );
        }
        let (_dir, repo) = repo_with(&[("other.yaml", "a: 1\n")]);
        let tree = repo.head().unwrap().peel_to_tree().unwrap();
        let snap = snapshot((&repo, &tree), None, "fleet.yaml");
        assert!(snap.problem.unwrap_or_default().contains("no such file"));
        let big = format!("# {}\n{FLEET}", "x".repeat(MAX_FILE_BYTES));
        let (_dir, repo) = repo_with(&[("fleet.yaml", &big)]);
        let tree = repo.head().unwrap().peel_to_tree().unwrap();
        let snap = snapshot((&repo, &tree), None, "fleet.yaml");
        assert!(
            snap.problem.unwrap_or_default().contains("over"),
            "a large file is refused from its size"
        );
    }
}
