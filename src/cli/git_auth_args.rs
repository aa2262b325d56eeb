//! The flags that say how the Git host is logged in to (shared by `agent` and `doctor`, so
//! that doctor in the agent's pod logs in as the agent does).

use super::*;

/// How the Git host is logged in to (shared by `agent` and `doctor`).
#[derive(Debug, Clone, clap::Args)]
pub struct GitAuthArgs {
    /// HTTPS user name (with --git-password-file).
    #[arg(
        help_heading = "Source",
        long,
        default_value = "git",
        env = "LINNET_GIT_USERNAME"
    )]
    pub git_username: String,
    /// File with the HTTPS password or token; read on every connection.
    #[arg(help_heading = "Source", long, env = "LINNET_GIT_PASSWORD_FILE")]
    pub git_password_file: Option<PathBuf>,
    /// SSH private key (deploy key) for ssh:// and scp-style URLs.
    #[arg(
        help_heading = "Source",
        long,
        env = "LINNET_SSH_KEY_FILE",
        requires = "ssh_known_hosts"
    )]
    pub ssh_key_file: Option<PathBuf>,
    /// known_hosts file that must list the SSH server's key.
    #[arg(help_heading = "Source", long, env = "LINNET_SSH_KNOWN_HOSTS")]
    pub ssh_known_hosts: Option<PathBuf>,
}

impl GitAuthArgs {
    /// The credentials these flags name; a credential file that is missing or empty is an
    /// error now (a mistake in the installation, which retrying every poll would only hide).
    pub fn auth(&self) -> Result<crate::source::git::GitAuth> {
        use crate::source::git::GitAuth;
        if let Some(key) = &self.ssh_key_file {
            credential_file_readable(key, "--ssh-key-file", "the deploy key's private key")?;
            return Ok(GitAuth::SshKey {
                username: "git".into(),
                private_key: key.clone(),
                known_hosts: self.ssh_known_hosts.clone().unwrap_or_default(),
            });
        }
        if let Some(file) = &self.git_password_file {
            credential_file_readable(
                file,
                "--git-password-file",
                "a token of the Git host that can read the repository",
            )?;
            return Ok(GitAuth::Basic {
                username: self.git_username.clone(),
                password_file: file.clone(),
            });
        }
        Ok(GitAuth::Anonymous)
    }
}

/// A credential file read on every fetch (so that a rotated Secret is used at once) must be
/// there at the start.
fn credential_file_readable(path: &Path, flag: &str, holds: &str) -> Result<()> {
    let why = match std::fs::read(path) {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => "is empty".to_string(),
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            "cannot be read by this user (permission denied)".to_string()
        }
        Err(e) => format!("cannot be read: {}", crate::error::error_chain(&e)),
    };
    Err(Error::Usage(format!(
        "{flag} {}: the file {why}; it must hold {holds} (in a cluster: the Secret mounted \
         there, see docs/getting-started.md)",
        path.display()
    )))
}
