//! A bare mirror of one branch of a remote repository, through git2. Every call blocks; the
//! agent runs them on `spawn_blocking`.
//!
//! A poll first asks the remote for the branch tip only ([`GitMirror::remote_tip`]); only a new
//! tip is fetched. Force pushes are just new tips. A cache directory that is not a usable
//! repository is removed and cloned again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::specs::{FileContent, too_large};
use git2::{
    AutotagOption, Cred, CredentialType, Direction, FetchOptions, Oid, RemoteCallbacks, Repository,
};

/// A file added or changed (with its new id) or removed (`None`), by its path.
pub type FileChange = (String, Option<String>);

/// How deep [`GitMirror::changed_files`] follows trees that differ before it leaves the
/// revision to a whole listing: it recurses once per level and keeps each level's path, so
/// a hostile tree nested thousands deep must not reach it. Spec repositories are shallow.
const DIFF_MAX_DEPTH: usize = 64;

/// How [`GitMirror::list_files`] marks a symbolic link's id.
const SYMLINK: &str = "symlink:";

/// Tree entries [`GitMirror::changed_files`] looks at before it leaves the revision to a
/// whole listing, which is bounded by [`RevisionShape`]: a pushed bomb must not be diffed.
const DIFF_MAX_ENTRIES: usize = 20_000;

/// Where the mirror keeps the revision last accepted.
const ACCEPTED_REF: &str = "refs/linnet/accepted";

/// Commits of history a shallow mirror fetches to tell a fast-forward from a rewrite.
const HISTORY_DEPTH: i32 = 64;

/// Subdirectories of one directory that may be blocked one by one; past it the directory
/// itself is blocked, as one error rather than a thousand.
const MAX_BLOCKED_PER_DIRECTORY: usize = 10;

/// Distinct trees one listing counts; past it the subtree being counted is blocked.
const MAX_TREES_COUNTED: usize = 100_000;

pub use crate::specs::RevisionShape;

pub use crate::specs::BLOCKED;

/// What is left of a listing's files (`--max-files`), and whether it ran out.
struct Budget {
    left: usize,
    cut: bool,
}

/// Files below a tree, as counted for [`RevisionShape`].
#[derive(Clone, Copy, Debug)]
enum Count {
    /// Files below it; `clean` when no tree below it is [`Count::Over`] (then it may be
    /// listed whole without looking).
    Files { files: usize, clean: bool },
    /// The tree itself has too many entries, or too many trees were counted.
    Over(usize),
}

/// Credentials for the remote. Secrets are read from files on every connection, so a mounted
/// Kubernetes Secret can rotate without a restart.
#[derive(Clone, Debug, Default)]
pub enum GitAuth {
    /// `file://`, plain paths, or public HTTPS.
    #[default]
    Anonymous,
    /// HTTPS with a user name and a password or token read from a file.
    Basic {
        username: String,
        password_file: PathBuf,
    },
    /// SSH with a private key file; the host must be in `known_hosts`.
    SshKey {
        username: String,
        private_key: PathBuf,
        known_hosts: PathBuf,
    },
}

/// What to follow.
#[derive(Clone, Debug)]
pub struct GitRemote {
    /// `https://…`, `ssh://…`, `user@host:path`, `file://…` or a plain path.
    pub url: String,
    pub branch: String,
    pub auth: GitAuth,
}

/// Why talking to Git failed, with what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("cannot reach {url}: {}: {}", .failure.describe(), .source.message())]
    Unreachable {
        url: String,
        failure: crate::net::Failure,
        #[source]
        source: git2::Error,
    },
    #[error("{url} did not answer within {after:?} (--git-timeout); the call was cancelled")]
    Timeout {
        url: String,
        after: std::time::Duration,
    },
    #[error("authentication to {url} failed: {source}")]
    Auth {
        url: String,
        #[source]
        source: git2::Error,
    },
    #[error(
        "the SSH host key of {url} is not in {known_hosts}; add it (for example with `ssh-keyscan`)"
    )]
    UnknownHostKey { url: String, known_hosts: String },
    #[error("branch {branch:?} does not exist on {url}")]
    NoSuchBranch { url: String, branch: String },
    #[error("cannot read {path}: {source}")]
    CredentialFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "commit {commit} is not applied: {why}. Only commits signed by a key in --signing-keys \
         are; the last good revision stays"
    )]
    Unverified { commit: String, why: String },
    #[error(
        "commit {tip} does not descend from {previous}, the revision synced last: the branch's \
         history was rewritten (a force push). Not applied (--refuse-history-rewrites); the \
         last good revision stays. Push a commit on top of {previous} (git revert), or restart \
         the agent without the flag to take the new history"
    )]
    Rewritten { previous: String, tip: String },
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl GitError {
    /// Every label [`GitError::label`] gives, besides [`crate::net::Failure::LABELS`].
    pub const LABELS: &'static [&'static str] = &[
        "timeout",
        "auth",
        "unknown_host_key",
        "no_such_branch",
        "credential_file",
        "unverified",
        "rewritten",
        "git",
        "io",
    ];

    /// A stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            GitError::Unreachable { failure, .. } => failure.label(),
            GitError::Timeout { .. } => "timeout",
            GitError::Auth { .. } => "auth",
            GitError::UnknownHostKey { .. } => "unknown_host_key",
            GitError::NoSuchBranch { .. } => "no_such_branch",
            GitError::CredentialFile { .. } => "credential_file",
            GitError::Unverified { .. } => "unverified",
            GitError::Rewritten { .. } => "rewritten",
            GitError::Git(_) => "git",
            GitError::Io { .. } => "io",
        }
    }
}

/// A local bare mirror of one remote branch.
pub struct GitMirror {
    remote: GitRemote,
    dir: PathBuf,
    repo: Repository,
    /// Fetch only the tip (where the transport allows); off for a mirror that commits.
    shallow: bool,
    /// When the network call under way must give up, with how long it was given. libgit2's
    /// socket timeouts (`net::configure_git`) end a silent server; this ends one that answers
    /// too slowly, at the next progress report.
    deadline: Option<(Instant, Duration)>,
}

impl GitMirror {
    /// Opens the mirror in `dir`, or creates it. A directory that is not a usable repository
    /// (corrupt, half-written) is removed and made again.
    pub fn open(dir: &Path, remote: GitRemote) -> Result<GitMirror, GitError> {
        if let Some(path) = local_path(&remote.url)
            && dir.exists()
        {
            link_local_objects(dir, &path)?;
        }
        let repo = match Repository::open_bare(dir) {
            Ok(repo) if repo.is_bare() && repo.find_remote("origin").is_ok() => repo,
            other => {
                if let Err(e) = other
                    && dir.exists()
                {
                    tracing::warn!(dir = %dir.display(), error = %e, "cache is not a usable repository; cloning again");
                }
                if dir.exists() {
                    std::fs::remove_dir_all(dir).map_err(|source| GitError::Io {
                        path: dir.to_path_buf(),
                        source,
                    })?;
                }
                Repository::init_bare(dir)?.remote("origin", &remote.url)?;
                if let Some(path) = local_path(&remote.url) {
                    link_local_objects(dir, &path)?;
                }
                Repository::open_bare(dir)?
            }
        };
        if repo.find_remote("origin")?.url().ok() != Some(remote.url.as_str()) {
            repo.remote_set_url("origin", &remote.url)?;
        }
        Ok(GitMirror {
            remote,
            dir: dir.to_path_buf(),
            repo,
            shallow: true,
            deadline: None,
        })
    }

    /// Opens the mirror in `dir` as it is, for one network call beside the handle that reads
    /// it; never removes or re-creates it.
    pub fn open_existing(dir: &Path, remote: GitRemote) -> Result<GitMirror, GitError> {
        Ok(GitMirror {
            repo: Repository::open_bare(dir)?,
            remote,
            dir: dir.to_path_buf(),
            shallow: true,
            deadline: None,
        })
    }

    /// Network calls from now on give up `timeout` from now.
    pub fn set_deadline(&mut self, timeout: Option<Duration>) {
        self.deadline = timeout.map(|t| (Instant::now() + t, t));
    }

    /// The local ref the fetched branch is kept in.
    fn tracking_ref(&self) -> String {
        format!("refs/remotes/origin/{}", self.remote.branch)
    }

    /// Fetch whole history from now on (a mirror that makes commits pushes them on top).
    pub fn full_history(mut self) -> Self {
        self.shallow = false;
        self
    }

    /// The repository, for write-back.
    pub(crate) fn repo(&self) -> &Repository {
        &self.repo
    }

    /// The remote this mirror follows.
    pub fn remote(&self) -> &GitRemote {
        &self.remote
    }

    pub(crate) fn callbacks(&self) -> RemoteCallbacks<'_> {
        let auth = self.remote.auth.clone();
        let mut callbacks = RemoteCallbacks::new();
        if let Some((deadline, _)) = self.deadline {
            // Returning false cancels the transfer; classify() reports it as a timeout.
            callbacks.transfer_progress(move |_| Instant::now() < deadline);
            callbacks.sideband_progress(move |_| Instant::now() < deadline);
            callbacks.push_negotiation(move |_| {
                if Instant::now() < deadline {
                    Ok(())
                } else {
                    Err(git2::Error::from_str("past --git-timeout"))
                }
            });
        }
        let mut attempts = 0;
        callbacks.credentials(move |_url, username_from_url, allowed| {
            // libgit2 asks again after a refusal; give up instead of looping.
            attempts += 1;
            if attempts > 3 {
                return Err(git2::Error::from_str("credentials were refused"));
            }
            match &auth {
                GitAuth::Anonymous => Cred::default(),
                GitAuth::Basic {
                    username,
                    password_file,
                } if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) => {
                    let password = std::fs::read_to_string(password_file).map_err(|e| {
                        git2::Error::from_str(&format!(
                            "cannot read {}: {e}",
                            password_file.display()
                        ))
                    })?;
                    Cred::userpass_plaintext(username, password.trim())
                }
                GitAuth::SshKey {
                    username,
                    private_key,
                    ..
                } => Cred::ssh_key(
                    username_from_url.unwrap_or(username),
                    None,
                    private_key,
                    None,
                ),
                _ => Err(git2::Error::from_str(
                    "the remote asks for credentials linnet was not given",
                )),
            }
        });
        if let GitAuth::SshKey { known_hosts, .. } = &self.remote.auth {
            let known_hosts = known_hosts.clone();
            callbacks.certificate_check(move |cert, host| {
                let Some(hostkey) = cert.as_hostkey().and_then(|h| h.hostkey()) else {
                    return Err(git2::Error::from_str("the server sent no SSH host key"));
                };
                if ssh_host_known(&known_hosts, host, hostkey) {
                    Ok(git2::CertificateCheckStatus::CertificateOk)
                } else {
                    Err(git2::Error::from_str(&format!(
                        "host key of {host} is not in {}",
                        known_hosts.display()
                    )))
                }
            });
        }
        callbacks
    }

    pub(crate) fn classify(&self, e: git2::Error) -> GitError {
        let url = crate::text::redact_credentials(&self.remote.url);
        if let Some((deadline, after)) = self.deadline
            && Instant::now() >= deadline
            && matches!(
                crate::net::classify_git(&e),
                crate::net::Failure::Timeout | crate::net::Failure::Other
            )
        {
            return GitError::Timeout { url, after };
        }
        // libgit2 replaces the certificate callback's error with its own words.
        let host_key_refused = e.code() == git2::ErrorCode::Certificate
            || (e.class() == git2::ErrorClass::Ssh && e.message().contains("hostkey"));
        if host_key_refused && let GitAuth::SshKey { known_hosts, .. } = &self.remote.auth {
            return GitError::UnknownHostKey {
                url,
                known_hosts: known_hosts.display().to_string(),
            };
        }
        match e.class() {
            git2::ErrorClass::Http | git2::ErrorClass::Ssh
                if e.code() == git2::ErrorCode::Auth || e.message().contains("credentials") =>
            {
                GitError::Auth { url, source: e }
            }
            _ if e.code() == git2::ErrorCode::Auth => GitError::Auth { url, source: e },
            // The host answered, and said no: a token without the right, not a network fault.
            git2::ErrorClass::Http
                if e.message().contains("status code: 401")
                    || e.message().contains("status code: 403") =>
            {
                GitError::Auth { url, source: e }
            }
            _ if e.message().contains("credentials") && e.class() != git2::ErrorClass::Net => {
                GitError::Auth { url, source: e }
            }
            _ => GitError::Unreachable {
                url,
                failure: crate::net::classify_git(&e),
                source: e,
            },
        }
    }

    /// Asks the remote for the branch tip, and nothing else: no objects are transferred.
    pub fn remote_tip(&self) -> Result<Oid, GitError> {
        if let Some(path) = local_path(&self.remote.url) {
            return self.local_branch_tip(&path);
        }
        let mut remote = self.repo.remote_anonymous(&self.remote.url)?;
        let connection = remote
            .connect_auth(Direction::Fetch, Some(self.callbacks()), None)
            .map_err(|e| self.classify(e))?;
        let wanted = format!("refs/heads/{}", self.remote.branch);
        let tip = connection
            .list()
            .map_err(|e| self.classify(e))?
            .iter()
            .find(|head| head.name() == wanted)
            .map(|head| head.oid());
        tip.ok_or_else(|| GitError::NoSuchBranch {
            url: crate::text::redact_credentials(&self.remote.url),
            branch: self.remote.branch.clone(),
        })
    }

    /// The branch's tip in the repository at `path` on this machine.
    fn local_branch_tip(&self, path: &Path) -> Result<Oid, GitError> {
        let url = crate::text::redact_credentials(&self.remote.url);
        let remote = Repository::open(path).map_err(|e| GitError::Unreachable {
            url: url.clone(),
            failure: crate::net::classify_git(&e),
            source: e,
        })?;
        remote
            .refname_to_id(&format!("refs/heads/{}", self.remote.branch))
            .map_err(|_| GitError::NoSuchBranch {
                url,
                branch: self.remote.branch.clone(),
            })
    }

    /// The revision last read and accepted (verified, not a refused rewrite), kept in the
    /// mirror so that a restarted agent judges the next tip against it, not against nothing.
    pub fn accepted(&self) -> Option<Oid> {
        self.repo.refname_to_id(ACCEPTED_REF).ok()
    }

    /// Records `tip` as [`GitMirror::accepted`].
    pub fn set_accepted(&self, tip: Oid) -> Result<(), GitError> {
        self.repo
            .reference(ACCEPTED_REF, tip, true, "linnet: accepted")?;
        Ok(())
    }

    /// The tip fetched last, if any.
    pub fn local_tip(&self) -> Option<Oid> {
        self.repo.refname_to_id(&self.tracking_ref()).ok()
    }

    /// Fetches the branch (only it; shallow where the transport allows) and returns its tip.
    /// A rewritten history (force push) is taken as it is.
    pub fn fetch(&self) -> Result<Oid, GitError> {
        self.fetch_to_depth(1)
    }

    /// [`GitMirror::fetch`], with `depth` commits of history where the mirror is shallow.
    fn fetch_to_depth(&self, depth: i32) -> Result<Oid, GitError> {
        // A repository on this machine is read in place (its objects are the mirror's
        // alternates): libgit2's local transport copies every object, inflating each, and a
        // pushed 1 GiB blob took 1.1 GB before its size was checked (issue 45).
        if let Some(path) = local_path(&self.remote.url) {
            let tip = self.local_branch_tip(&path)?;
            self.repo
                .reference(&self.tracking_ref(), tip, true, "linnet: read in place")?;
            return Ok(tip);
        }
        let refspec = format!("+refs/heads/{}:{}", self.remote.branch, self.tracking_ref());
        let mut remote = self.repo.find_remote("origin")?;
        let local = is_local(&self.remote.url);
        let mut options = FetchOptions::new();
        options.remote_callbacks(self.callbacks());
        options.download_tags(AutotagOption::None);
        if !local && self.shallow {
            options.depth(depth);
        }
        remote
            .fetch(&[refspec.as_str()], Some(&mut options), None)
            .map_err(|e| self.classify(e))?;
        self.local_tip().ok_or_else(|| GitError::NoSuchBranch {
            url: crate::text::redact_credentials(&self.remote.url),
            branch: self.remote.branch.clone(),
        })
    }

    /// Whether `tip` descends from `previous` (the revision synced before): `Some(true)` for a
    /// fast-forward, `Some(false)` for a rewritten history (a force push), `None` when the
    /// history fetched cannot tell. A shallow mirror fetches [`HISTORY_DEPTH`] commits of
    /// history once to find out (network: call it where a fetch may be made).
    pub fn descends_from(&self, tip: Oid, previous: Oid) -> Result<Option<bool>, GitError> {
        if tip == previous || self.repo.graph_descendant_of(tip, previous)? {
            return Ok(Some(true));
        }
        if self.shallow && !is_local(&self.remote.url) {
            self.fetch_to_depth(HISTORY_DEPTH)?;
            if self.repo.graph_descendant_of(tip, previous)? {
                return Ok(Some(true));
            }
        }
        // Not found among the ancestors fetched: rewritten if they reach a root, or reach
        // back past the time `previous` was committed (an ancestor is older than its
        // descendants, give or take a clock); else too far back to tell.
        let shallow: std::collections::HashSet<Oid> =
            std::fs::read_to_string(self.repo.path().join("shallow"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| Oid::from_str(l.trim()).ok())
                .collect();
        let previous_time = match self.repo.find_commit(previous) {
            Ok(c) => c.time().seconds(),
            Err(_) => return Ok(None),
        };
        let mut walk = self.repo.revwalk()?;
        walk.push(tip)?;
        let mut oldest = i64::MAX;
        let mut at_boundary = false;
        for (seen, id) in walk.enumerate() {
            let id = id?;
            if seen > HISTORY_DEPTH as usize * 4 {
                at_boundary = true;
                break;
            }
            oldest = oldest.min(self.repo.find_commit(id)?.time().seconds());
            at_boundary |= shallow.contains(&id);
        }
        Ok((!at_boundary || previous_time >= oldest).then_some(false))
    }

    /// An id of what [`GitMirror::list_files`] would list at `commit` under `path`: the tree's
    /// id, or, at the repository's root, an id of its entries but those starting with a dot
    /// (which the listing skips, and where `.linnet/status` lives). Equal ids, equal listings,
    /// found without reading the tree below its top.
    pub fn spec_tree_id(&self, commit: Oid, path: &str) -> Result<Oid, GitError> {
        let tree = self.repo.find_commit(commit)?.tree()?;
        let root = path.trim_matches('/');
        if !(root.is_empty() || root == ".") {
            return Ok(match tree.get_path(Path::new(root)) {
                Ok(entry) => entry.id(),
                Err(_) => Oid::ZERO_SHA1,
            });
        }
        let mut entries = Vec::new();
        for entry in tree.iter() {
            if entry.name_bytes().starts_with(b".") {
                continue;
            }
            entries.extend_from_slice(entry.name_bytes());
            entries.push(0);
            entries.extend_from_slice(&entry.filemode().to_le_bytes());
            entries.extend_from_slice(entry.id().as_bytes());
        }
        Ok(Oid::hash_object(git2::ObjectType::Blob, &entries)?)
    }

    /// Every file below `path` at `commit`, as `(path relative to `path`, file id)`, skipping
    /// hidden directories (`.git`, `.linnet`) and submodules. The id is the blob id, with
    /// `symlink:` in front for a symbolic link, which is never followed.
    pub fn list_files(&self, commit: Oid, path: &str) -> Result<Vec<(String, String)>, GitError> {
        let Some(tree) = self.spec_root(commit, path)? else {
            return Ok(Vec::new());
        };
        let mut files = Vec::new();
        tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            if hidden(entry) {
                return git2::TreeWalkResult::Skip;
            }
            if let Some(id) = file_id(entry) {
                files.push((format!("{dir}{}", entry.name().unwrap_or("")), id));
            }
            git2::TreeWalkResult::Ok
        })?;
        Ok(files)
    }

    /// [`GitMirror::list_files`] within `shape`: a directory with more entries than it allows,
    /// and, while the revision would list more files than it allows, the largest
    /// directories, are listed as one entry each (`dir/`, id [`BLOCKED`] and why), never
    /// walked. Counting is memoized per tree id, so a tree named a thousand times is read once.
    pub fn list_files_within(
        &self,
        commit: Oid,
        path: &str,
        shape: &RevisionShape,
    ) -> Result<Vec<(String, String)>, GitError> {
        let Some(tree) = self.spec_root(commit, path)? else {
            return Ok(Vec::new());
        };
        let mut counts = std::collections::HashMap::new();
        let mut out = Vec::new();
        let mut budget = Budget {
            left: shape.max_files,
            cut: false,
        };
        self.list_within(&tree, "", shape, &mut counts, &mut budget, &mut out)?;
        if budget.cut {
            // Blocked directories count against the files too: past them, one entry says so.
            out.push((
                "./".into(),
                format!(
                    "{BLOCKED}the listing reached the {} files and blocked directories a \
                     revision may hold (--max-files); the directories past it are not read, \
                     the files listed sync",
                    shape.max_files
                ),
            ));
        }
        Ok(out)
    }

    fn count(
        &self,
        tree: &git2::Tree<'_>,
        shape: &RevisionShape,
        counts: &mut std::collections::HashMap<Oid, Count>,
        depth: usize,
    ) -> Result<Count, GitError> {
        if let Some(c) = counts.get(&tree.id()) {
            return Ok(*c);
        }
        let entries = tree.len();
        let count = if entries > shape.max_tree_entries {
            Count::Over(entries)
        } else if counts.len() >= MAX_TREES_COUNTED || depth > DIFF_MAX_DEPTH {
            Count::Over(0)
        } else {
            let (mut files, mut clean) = (0usize, true);
            for e in visible_entries(Some(tree)) {
                if file_id(&e).is_some() {
                    files += 1;
                } else if e.kind() == Some(git2::ObjectType::Tree) {
                    let sub = self.repo.find_tree(e.id())?;
                    match self.count(&sub, shape, counts, depth + 1)? {
                        Count::Files { files: n, clean: c } => {
                            files = files.saturating_add(n);
                            clean &= c;
                        }
                        Count::Over(_) => clean = false,
                    }
                }
            }
            Count::Files { files, clean }
        };
        counts.insert(tree.id(), count);
        Ok(count)
    }

    /// Lists `tree` (at `dir`) into `out`, blocking what does not fit in `budget`; each
    /// blocked entry takes one too, and the budget is marked cut when nothing was left.
    fn list_within(
        &self,
        tree: &git2::Tree<'_>,
        dir: &str,
        shape: &RevisionShape,
        counts: &mut std::collections::HashMap<Oid, Count>,
        budget: &mut Budget,
        out: &mut Vec<(String, String)>,
    ) -> Result<(), GitError> {
        if budget.left == 0 {
            budget.cut = true;
            return Ok(());
        }
        let depth = dir.matches('/').count();
        let blocked = |left: &mut usize, why: String| {
            let at = if dir.is_empty() { "./" } else { dir };
            *left -= 1;
            (at.to_string(), format!("{BLOCKED}{why}"))
        };
        let (files, clean) = match self.count(tree, shape, counts, depth)? {
            Count::Over(0) => {
                out.push(blocked(
                    &mut budget.left,
                    format!(
                        "the trees below it nest deeper than {DIFF_MAX_DEPTH} or number over \
                     {MAX_TREES_COUNTED}; no spec repository needs that: the directory is \
                     blocked, the rest of the revision syncs"
                    ),
                ));
                return Ok(());
            }
            Count::Over(entries) => {
                out.push(blocked(
                    &mut budget.left,
                    format!(
                        "{entries} entries in one directory, over the {} a directory may hold \
                     (--max-tree-entries): the directory is blocked, the rest of the revision \
                     syncs; split it, or raise the limit",
                        shape.max_tree_entries
                    ),
                ));
                return Ok(());
            }
            Count::Files { files, clean } => (files, clean),
        };
        if clean && files <= budget.left {
            budget.left -= files;
            return self.list_all(tree, dir, out);
        }
        // Too many. The directory's own files first, then its subdirectories from the
        // smallest: those that fit are listed whole, the others are looked into in turn (a
        // mixed directory such as `apps/` keeps its good files), unless more than a few do
        // not fit: then this directory is the bomb, and it is blocked as one entry.
        let entries = visible_entries(Some(tree));
        let direct = entries.iter().filter(|e| file_id(e).is_some()).count();
        if direct > budget.left {
            out.push(blocked(
                &mut budget.left,
                format!(
                    "{direct} files in this directory alone, with the {} files a revision may list \
                 (--max-files) mostly taken by the rest: the directory is blocked, the rest of \
                 the revision syncs",
                    shape.max_files
                ),
            ));
            return Ok(());
        }
        let mut subdirs: Vec<(usize, bool, String, Oid)> = Vec::new();
        for e in &entries {
            if e.kind() == Some(git2::ObjectType::Tree) {
                let sub = self.repo.find_tree(e.id())?;
                let (n, clean) = match self.count(&sub, shape, counts, depth + 1)? {
                    Count::Files { files, clean } => (files, clean),
                    Count::Over(_) => (usize::MAX, false),
                };
                subdirs.push((n, clean, e.name().unwrap_or("").to_string(), e.id()));
            }
        }
        subdirs.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.2.cmp(&b.2)));
        let mut room = budget.left - direct;
        let mut too_big = 0;
        for (n, ..) in &subdirs {
            if *n <= room {
                room -= n;
            } else {
                too_big += 1;
            }
        }
        if too_big > MAX_BLOCKED_PER_DIRECTORY {
            out.push(blocked(
                &mut budget.left,
                format!(
                    "{files} files below it would pass the {} files a revision may list \
                 (--max-files), spread over {too_big} subdirectories: the directory is blocked, \
                 the rest of the revision syncs; split the repository into several sources, or \
                 raise the limit",
                    shape.max_files
                ),
            ));
            return Ok(());
        }
        for e in &entries {
            if let Some(id) = file_id(e) {
                budget.left -= 1;
                out.push((format!("{dir}{}", e.name().unwrap_or("")), id));
            } else if is_submodule(e) {
                note_submodule(&format!("{dir}{}", e.name().unwrap_or("")));
            }
        }
        for (n, clean, name, id) in subdirs {
            let sub = self.repo.find_tree(id)?;
            let here = format!("{dir}{name}/");
            if clean && n <= budget.left {
                budget.left -= n;
                self.list_all(&sub, &here, out)?;
            } else {
                self.list_within(&sub, &here, shape, counts, budget, out)?;
            }
        }
        Ok(())
    }

    /// Every file of `tree` (at `dir`), by the rules of [`GitMirror::list_files`].
    fn list_all(
        &self,
        tree: &git2::Tree<'_>,
        dir: &str,
        out: &mut Vec<(String, String)>,
    ) -> Result<(), GitError> {
        tree.walk(git2::TreeWalkMode::PreOrder, |sub, entry| {
            if hidden(entry) {
                return git2::TreeWalkResult::Skip;
            }
            let path = format!("{dir}{sub}{}", entry.name().unwrap_or(""));
            if let Some(id) = file_id(entry) {
                out.push((path, id));
            } else if is_submodule(entry) {
                note_submodule(&path);
            }
            git2::TreeWalkResult::Ok
        })?;
        Ok(())
    }

    /// The files below `path` that differ between commits `from` and `to`, by the rules of
    /// [`GitMirror::list_files`]: `(path, Some(id))` for a file added or changed, `(path,
    /// None)` for one removed. Subtrees with equal ids are not read, so a one-file push costs
    /// the trees on that file's path (and a directory's entries), not the repository. `None`
    /// when a tree's entries are not in Git's order or repeat a name (no Git writes such a
    /// tree; a hostile one could), or when the trees that differ nest deeper than
    /// [`DIFF_MAX_DEPTH`]: then only a whole listing says what is there.
    pub fn changed_files(
        &self,
        from: Oid,
        to: Oid,
        path: &str,
    ) -> Result<Option<Vec<FileChange>>, GitError> {
        let (old, new) = (self.spec_root(from, path)?, self.spec_root(to, path)?);
        let mut changes = Vec::new();
        let mut looked = 0;
        let in_order =
            self.diff_trees(old.as_ref(), new.as_ref(), "", 0, &mut looked, &mut changes)?;
        Ok(in_order.then_some(changes))
    }

    /// The tree [`GitMirror::list_files`] lists at `commit`; `None` when `path` is not there
    /// or is not a directory.
    fn spec_root(&self, commit: Oid, path: &str) -> Result<Option<git2::Tree<'_>>, GitError> {
        let tree = self.repo.find_commit(commit)?.tree()?;
        let root = path.trim_matches('/');
        if root.is_empty() || root == "." {
            return Ok(Some(tree));
        }
        match tree.get_path(Path::new(root)) {
            Ok(entry) if entry.kind() == Some(git2::ObjectType::Tree) => {
                Ok(Some(self.repo.find_tree(entry.id())?))
            }
            _ => Ok(None),
        }
    }

    /// Adds to `changes` the files that differ between `old` and `new` (either may be absent),
    /// below `dir`, `depth` trees down; false when a tree is out of order or too deep.
    fn diff_trees(
        &self,
        old: Option<&git2::Tree<'_>>,
        new: Option<&git2::Tree<'_>>,
        dir: &str,
        depth: usize,
        looked: &mut usize,
        changes: &mut Vec<FileChange>,
    ) -> Result<bool, GitError> {
        if depth > DIFF_MAX_DEPTH {
            return Ok(false);
        }
        // Sizes first: a tree of a million entries is not read into a list here.
        *looked += old.map_or(0, |t| t.len()) + new.map_or(0, |t| t.len());
        if *looked > DIFF_MAX_ENTRIES {
            return Ok(false);
        }
        let (old, new) = (visible_entries(old), visible_entries(new));
        if !in_git_order(&old) || !in_git_order(&new) {
            return Ok(false);
        }
        let (mut i, mut j) = (0, 0);
        while i < old.len() || j < new.len() {
            let order = match (old.get(i), new.get(j)) {
                (Some(o), Some(n)) => git_order(o, n),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            let (o, n) = match order {
                std::cmp::Ordering::Less => (old.get(i), None),
                std::cmp::Ordering::Greater => (None, new.get(j)),
                std::cmp::Ordering::Equal => (old.get(i), new.get(j)),
            };
            i += usize::from(o.is_some());
            j += usize::from(n.is_some());
            if let (Some(o), Some(n)) = (o, n)
                && o.id() == n.id()
                && o.filemode() == n.filemode()
            {
                continue;
            }
            let name = o.or(n).and_then(|e| e.name().ok()).unwrap_or("");
            let here = format!("{dir}{name}");
            let subtree = |e: Option<&git2::TreeEntry<'_>>| -> Result<_, GitError> {
                match e {
                    Some(e) if e.kind() == Some(git2::ObjectType::Tree) => {
                        Ok(Some(self.repo.find_tree(e.id())?))
                    }
                    _ => Ok(None),
                }
            };
            let (old_tree, new_tree) = (subtree(o)?, subtree(n)?);
            if (old_tree.is_some() || new_tree.is_some())
                && !self.diff_trees(
                    old_tree.as_ref(),
                    new_tree.as_ref(),
                    &format!("{here}/"),
                    depth + 1,
                    looked,
                    changes,
                )?
            {
                return Ok(false);
            }
            if n.is_some_and(is_submodule) {
                note_submodule(&here);
            }
            let old_file = o.and_then(file_id);
            let new_file = n.and_then(file_id);
            match (old_file, new_file) {
                (_, Some(id)) => changes.push((here, Some(id))),
                (Some(_), None) => changes.push((here, None)),
                (None, None) => {}
            }
        }
        Ok(true)
    }

    /// The content of a file listed by [`GitMirror::list_files`]: a blob's bytes only when its
    /// size (from the object header, before anything is inflated) is at most `max`; a link's
    /// target is never read as content.
    pub fn read_spec_file(&self, file_id: &str, max: usize) -> Result<FileContent, GitError> {
        if let Some(why) = file_id.strip_prefix(BLOCKED) {
            return Ok(FileContent::Refused(why.to_string()));
        }
        if file_id.starts_with(SYMLINK) {
            return Ok(FileContent::Refused(
                "is a symbolic link; linnet reads only regular files inside the tree and does \
                 not follow links (commit the file itself)"
                    .into(),
            ));
        }
        let id = Oid::from_str(file_id)?;
        let (size, _) = self.repo.odb()?.read_header(id)?;
        if size > max {
            return Ok(FileContent::Refused(too_large(size as u64, max)));
        }
        Ok(FileContent::Bytes(
            self.repo.find_blob(id)?.content().to_vec(),
        ))
    }

    /// Where the mirror lives.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Whether [`GitMirror::list_files`] skips an entry, and all below it: its name starts with
/// a dot (`.git`, `.linnet`).
fn hidden(entry: &git2::TreeEntry<'_>) -> bool {
    entry.name_bytes().starts_with(b".")
}

/// A file's id as [`GitMirror::list_files`] gives it; `None` for a tree or a submodule.
fn file_id(entry: &git2::TreeEntry<'_>) -> Option<String> {
    if entry.kind() != Some(git2::ObjectType::Blob) {
        return None;
    }
    Some(if entry.filemode() == i32::from(git2::FileMode::Link) {
        format!("{SYMLINK}{}", entry.id())
    } else {
        entry.id().to_string()
    })
}

/// Makes the objects of the repository at `remote` (on this machine) the mirror's alternates,
/// so they are read in place, never copied.
fn link_local_objects(dir: &Path, remote: &Path) -> Result<(), GitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GitError::Io { path, source }
    };
    let objects = Repository::open(remote)?.path().join("objects");
    let info = dir.join("objects/info");
    std::fs::create_dir_all(&info).map_err(io(&info))?;
    let file = info.join("alternates");
    let line = format!("{}\n", objects.display());
    if std::fs::read_to_string(&file).ok().as_deref() != Some(line.as_str()) {
        std::fs::write(&file, line).map_err(io(&file))?;
    }
    Ok(())
}

/// Whether `entry` is a submodule (a commit of another repository).
fn is_submodule(entry: &git2::TreeEntry<'_>) -> bool {
    entry.kind() == Some(git2::ObjectType::Commit)
}

/// A submodule is never followed, so its URL is never contacted (a repository writer could
/// point it anywhere); said once per listing that meets it, rather than skipped silently.
fn note_submodule(path: &str) {
    tracing::info!(
        path,
        "a submodule: linnet does not follow submodules (its URL is never contacted), so no \
         spec below it is read; commit the files themselves"
    );
}

/// A tree's entries but those [`GitMirror::list_files`] skips (names starting with a dot).
fn visible_entries<'t>(tree: Option<&'t git2::Tree<'_>>) -> Vec<git2::TreeEntry<'t>> {
    tree.map(|t| t.iter().filter(|e| !hidden(e)).collect())
        .unwrap_or_default()
}

/// Git's order of tree entries: by name, a directory's name read with a `/` after it. (A name
/// holding a `/`, which only a hand-made tree has, is ordered by the same reading, which can
/// differ from Git's own comparison there.)
fn git_order(a: &git2::TreeEntry<'_>, b: &git2::TreeEntry<'_>) -> std::cmp::Ordering {
    let dir = |e: &git2::TreeEntry<'_>| e.filemode() == i32::from(git2::FileMode::Tree);
    name_order(a.name_bytes(), dir(a), b.name_bytes(), dir(b))
}

/// Git's order of two names, each read with a `/` after it when it names a directory. The
/// names are compared as slices: a directory of 10,000 entries is compared twice per push.
fn name_order(a: &[u8], a_dir: bool, b: &[u8], b_dir: bool) -> std::cmp::Ordering {
    let common = a.len().min(b.len());
    match a[..common].cmp(&b[..common]) {
        // One is a prefix of the other: the rest, with its `/`, decides in a byte or two.
        std::cmp::Ordering::Equal => {
            fn rest(name: &[u8], from: usize, dir: bool) -> impl Iterator<Item = u8> + '_ {
                name[from..].iter().copied().chain(dir.then_some(b'/'))
            }
            rest(a, common, a_dir).cmp(rest(b, common, b_dir))
        }
        unequal => unequal,
    }
}

/// Whether entries are strictly in Git's order (and so name no path twice).
fn in_git_order(entries: &[git2::TreeEntry<'_>]) -> bool {
    entries
        .windows(2)
        .all(|w| git_order(&w[0], &w[1]) == std::cmp::Ordering::Less)
}

fn is_local(url: &str) -> bool {
    local_path(url).is_some()
}

/// The directory of a remote on this machine (`file://…` or a path), which libgit2 reaches
/// with its local transport.
pub(crate) fn local_path(url: &str) -> Option<PathBuf> {
    if let Some(path) = url.strip_prefix("file://") {
        return Some(path.into());
    }
    (url.starts_with('/') || url.starts_with('.')).then(|| url.into())
}

/// Whether `known_hosts` lists `host` with this raw host key.
fn ssh_host_known(known_hosts: &Path, host: &str, key: &[u8]) -> bool {
    use base64::Engine as _;
    let Ok(text) = std::fs::read_to_string(known_hosts) else {
        return false;
    };
    let key = base64::engine::general_purpose::STANDARD.encode(key);
    text.lines().any(|line| {
        let mut parts = line.split_whitespace();
        let (Some(hosts), Some(_kind), Some(k)) = (parts.next(), parts.next(), parts.next()) else {
            return false;
        };
        k == key
            && hosts
                .split(',')
                .any(|h| h == host || h.trim_start_matches('[').starts_with(&format!("{host}]")))
    })
}

#[cfg(test)]
mod tests {
    use super::name_order;
    use proptest::prelude::*;

    /// The order by definition: each name read with a `/` after it when it is a directory.
    fn by_definition(a: &[u8], a_dir: bool, b: &[u8], b_dir: bool) -> std::cmp::Ordering {
        let key = |name: &[u8], dir: bool| {
            let mut k = name.to_vec();
            if dir {
                k.push(b'/');
            }
            k
        };
        key(a, a_dir).cmp(&key(b, b_dir))
    }

    #[test]
    fn a_directory_sorts_as_if_its_name_ended_in_a_slash() {
        use std::cmp::Ordering::*;
        // `a.b` < `a/` (a directory) < `a0`, and a file `a` < directory `a`.
        assert_eq!(name_order(b"a.b", false, b"a", true), Less);
        assert_eq!(name_order(b"a", true, b"a0", false), Less);
        assert_eq!(name_order(b"a", false, b"a", true), Less);
        assert_eq!(name_order(b"a", true, b"a", true), Equal);
        assert_eq!(name_order(b"ab", false, b"a", false), Greater);
    }

    proptest! {
        #[test]
        fn name_order_is_the_order_by_definition(
            a in proptest::collection::vec(prop_oneof![Just(b'/'), Just(b'.'), Just(b'a'), Just(b'0'), any::<u8>()], 0..5),
            b in proptest::collection::vec(prop_oneof![Just(b'/'), Just(b'.'), Just(b'a'), Just(b'0'), any::<u8>()], 0..5),
            a_dir: bool,
            b_dir: bool,
        ) {
            prop_assert_eq!(name_order(&a, a_dir, &b, b_dir), by_definition(&a, a_dir, &b, b_dir));
            // Shared prefixes are where the two readings can differ.
            let mut longer = a.clone();
            longer.extend_from_slice(&b);
            prop_assert_eq!(
                name_order(&a, a_dir, &longer, b_dir),
                by_definition(&a, a_dir, &longer, b_dir)
            );
        }
    }
}
