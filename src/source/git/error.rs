//! How the mirror reaches its remote (the URL, the credentials) and how that fails: one
//! error type with a stable label per failure.

use std::path::PathBuf;

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
    #[error(
        "there is no Git repository at {url}: check --repo-url; for a private repository on a \
         Git host, check that the token can read it (hosts answer 404, not 403, to a token \
         that may not)"
    )]
    NotFound { url: String },
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
    #[error("cannot read {path}: {}", crate::error::io_reason(.source))]
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
    #[error(
        "cannot tell whether commit {tip} descends from {previous}, the revision synced last: \
         {previous} is not among the {depth} commits of history fetched below {tip}. Not \
         applied (--refuse-history-rewrites does not take a history it cannot check); the last \
         good revision stays. If the new history is meant, push a merge of {previous} into it \
         (git merge -s ours {previous}), or restart the agent without the flag"
    )]
    HistoryUnknown {
        previous: String,
        tip: String,
        depth: i32,
    },
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("{path}: {}", crate::error::io_reason(.source))]
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
        "not_found",
        "auth",
        "unknown_host_key",
        "no_such_branch",
        "credential_file",
        "unverified",
        "rewritten",
        "history_unknown",
        "git",
        "io",
    ];

    /// A stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            GitError::Unreachable { failure, .. } => failure.label(),
            GitError::Timeout { .. } => "timeout",
            GitError::NotFound { .. } => "not_found",
            GitError::Auth { .. } => "auth",
            GitError::UnknownHostKey { .. } => "unknown_host_key",
            GitError::NoSuchBranch { .. } => "no_such_branch",
            GitError::CredentialFile { .. } => "credential_file",
            GitError::Unverified { .. } => "unverified",
            GitError::Rewritten { .. } => "rewritten",
            GitError::HistoryUnknown { .. } => "history_unknown",
            GitError::Git(_) => "git",
            GitError::Io { .. } => "io",
        }
    }
}
