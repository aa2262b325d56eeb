//! A bare mirror of one branch of a remote repository, through git2. Every call blocks; the
//! agent runs them on `spawn_blocking`.
//!
//! A poll first asks the remote for the branch tip only ([`GitMirror::remote_tip`]); only a new
//! tip is fetched. Force pushes are just new tips. A cache directory that is not a usable
//! repository is removed and cloned again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use git2::{
    AutotagOption, Cred, CredentialType, Direction, FetchOptions, Oid, RemoteCallbacks, Repository,
};

/// Where the mirror keeps the revision last accepted.
const ACCEPTED_REF: &str = "refs/linnet/accepted";
/// The last commit `--verify-commits=range` checked: where the next range starts.
const VERIFIED_REF: &str = "refs/linnet/verified";

/// Commits of history a shallow mirror fetches to tell a fast-forward from a rewrite.
const HISTORY_DEPTH: i32 = 64;
/// The deepest a shallow mirror fetches to find the revision synced last below a new tip:
/// past it, "cannot tell" (which `--refuse-history-rewrites` refuses).
pub const MAX_HISTORY_DEPTH: i32 = 4096;

pub use crate::specs::RevisionShape;

pub use crate::specs::BLOCKED;

mod diff;
mod error;
mod history;
mod one_round;
mod tree;

pub use diff::FileChange;
pub use error::{GitAuth, GitError, GitRemote};

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
            // The host answered: there is no repository there (or none this token may see).
            git2::ErrorClass::Http if e.message().contains("status code: 404") => {
                GitError::NotFound { url }
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
        let remote = Repository::open(path).map_err(|e| match e.code() {
            git2::ErrorCode::NotFound => GitError::NotFound { url: url.clone() },
            _ => GitError::Unreachable {
                url: url.clone(),
                failure: crate::net::classify_git(&e),
                source: e,
            },
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

    /// The last commit verified by `--verify-commits=range`, kept like [`GitMirror::accepted`].
    pub fn verified(&self) -> Option<Oid> {
        self.repo.refname_to_id(VERIFIED_REF).ok()
    }

    /// Records `tip` as [`GitMirror::verified`].
    pub fn set_verified(&self, tip: Oid) -> Result<(), GitError> {
        self.repo
            .reference(VERIFIED_REF, tip, true, "linnet: verified")?;
        Ok(())
    }

    /// Whether `tip` descends from `ancestor` in the history here, without fetching.
    pub fn has_below(&self, tip: Oid, ancestor: Oid) -> bool {
        tip == ancestor
            || self
                .repo
                .graph_descendant_of(tip, ancestor)
                .unwrap_or(false)
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
        let mut options = FetchOptions::new();
        options.remote_callbacks(self.callbacks());
        if self.shallow {
            options.depth(depth);
        }
        self.fetch_branch(options)
    }

    /// Fetches the branch (never its tags) into its tracking ref with `options`, and returns
    /// the tip fetched.
    fn fetch_branch(&self, mut options: FetchOptions<'_>) -> Result<Oid, GitError> {
        let refspec = format!("+refs/heads/{}:{}", self.remote.branch, self.tracking_ref());
        let mut remote = self.repo.find_remote("origin")?;
        options.download_tags(AutotagOption::None);
        remote
            .fetch(&[refspec.as_str()], Some(&mut options), None)
            .map_err(|e| self.classify(e))?;
        self.local_tip().ok_or_else(|| GitError::NoSuchBranch {
            url: crate::text::redact_credentials(&self.remote.url),
            branch: self.remote.branch.clone(),
        })
    }

    /// Where the mirror lives.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Makes the objects of the repository at `remote` (on this machine) the mirror's alternates,
/// so they are read in place, never copied.
fn link_local_objects(dir: &Path, remote: &Path) -> Result<(), GitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GitError::Io { path, source }
    };
    let repository = Repository::open(remote).map_err(|e| match e.code() {
        git2::ErrorCode::NotFound => GitError::NotFound {
            url: remote.display().to_string(),
        },
        _ => GitError::Git(e),
    })?;
    let objects = repository.path().join("objects");
    let info = dir.join("objects/info");
    std::fs::create_dir_all(&info).map_err(io(&info))?;
    let file = info.join("alternates");
    let line = format!("{}\n", objects.display());
    if std::fs::read_to_string(&file).ok().as_deref() != Some(line.as_str()) {
        std::fs::write(&file, line).map_err(io(&file))?;
    }
    Ok(())
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
    use super::GitError;
    use super::tree::name_order;
    use proptest::prelude::*;

    #[test]
    fn the_label_list_holds_every_label_given() {
        let e = || git2::Error::from_str("x");
        let url = String::new;
        for g in [
            GitError::Timeout {
                url: url(),
                after: std::time::Duration::ZERO,
            },
            GitError::NotFound { url: "u".into() },
            GitError::Auth {
                url: url(),
                source: e(),
            },
            GitError::UnknownHostKey {
                url: url(),
                known_hosts: url(),
            },
            GitError::NoSuchBranch {
                url: url(),
                branch: url(),
            },
            GitError::CredentialFile {
                path: "p".into(),
                source: std::io::Error::other("x"),
            },
            GitError::Git(e()),
            GitError::Io {
                path: "p".into(),
                source: std::io::Error::other("x"),
            },
        ] {
            assert!(GitError::LABELS.contains(&g.label()), "{g:?}");
        }
    }

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
