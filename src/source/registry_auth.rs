//! Registry credentials for the image automation (issue 74, `--registry-credentials`): a
//! Docker config file (`~/.docker/config.json`, or a `kubernetes.io/dockerconfigjson` Secret
//! mounted as a file), read again at each scan so that a rotated Secret is used without a
//! restart. Each credential is bound to the registry host its `auths` key names and is sent
//! only there (and to the token service that host's challenge names), and only over HTTPS:
//! a policy in Git, which anyone who can push may write, can never send a credential to a host
//! of its choosing or in the clear.
//!
//! An entry is `auth` (base64 `user:password`), `username` and `password`, or `registrytoken`
//! (a bearer token sent as it is: a GitHub or GitLab token for their registries).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;

/// The largest credentials file read.
pub const MAX_CREDENTIALS_BYTES: u64 = 1024 * 1024;

/// One registry's credential. Its `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// Sent as `Authorization: Basic …` to a registry that asks for it, and to its token
    /// service for a token.
    Basic { user: String, password: String },
    /// Sent as `Authorization: Bearer …` from the first request.
    Bearer { token: String },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Basic { user, .. } => write!(f, "Basic({user}, <redacted>)"),
            Credential::Bearer { .. } => f.write_str("Bearer(<redacted>)"),
        }
    }
}

impl Credential {
    /// The `Authorization` header's value.
    pub fn header(&self) -> String {
        match self {
            Credential::Basic { user, password } => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            ),
            Credential::Bearer { token } => format!("Bearer {token}"),
        }
    }
}

/// The credentials of a Docker config file, by registry host (`host` or `host:port`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryCredentials {
    by_host: BTreeMap<String, Credential>,
}

/// Why a credentials file was not used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: larger than {MAX_CREDENTIALS_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path}: not a Docker config file: {reason}")]
    NotDockerConfig { path: PathBuf, reason: String },
    #[error(
        "{path}: the entry for {host:?} has no usable auth, username and password, or registrytoken"
    )]
    NoSecret { path: PathBuf, host: String },
}

#[derive(serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    registrytoken: Option<String>,
}

impl RegistryCredentials {
    /// Reads `path` (at most [`MAX_CREDENTIALS_BYTES`]).
    pub fn read(path: &Path) -> Result<RegistryCredentials, CredentialsError> {
        use std::io::Read as _;
        let failed = |e: std::io::Error| CredentialsError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let mut text = Vec::new();
        std::fs::File::open(path)
            .map_err(failed)?
            .take(MAX_CREDENTIALS_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(failed)?;
        if text.len() as u64 > MAX_CREDENTIALS_BYTES {
            return Err(CredentialsError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        Self::parse(path, &text)
    }

    /// The credentials of a Docker config's text (`path` names it in errors).
    pub fn parse(path: &Path, text: &[u8]) -> Result<RegistryCredentials, CredentialsError> {
        let config: DockerConfig =
            serde_json::from_slice(text).map_err(|e| CredentialsError::NotDockerConfig {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        let mut by_host = BTreeMap::new();
        for (key, entry) in config.auths {
            let host = registry_host(&key);
            let credential = entry_credential(&entry).ok_or(CredentialsError::NoSecret {
                path: path.to_path_buf(),
                host: key.clone(),
            })?;
            by_host.insert(host, credential);
        }
        Ok(RegistryCredentials { by_host })
    }

    /// The credential for a registry at `host` (`host` or `host:port`), if any.
    pub fn for_host(&self, host: &str) -> Option<&Credential> {
        self.by_host.get(&registry_host(host))
    }

    /// The hosts there are credentials for.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.by_host.keys().map(String::as_str)
    }
}

fn entry_credential(entry: &AuthEntry) -> Option<Credential> {
    if let Some(token) = entry.registrytoken.as_ref().filter(|t| !t.is_empty()) {
        return Some(Credential::Bearer {
            token: token.clone(),
        });
    }
    if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        return Some(Credential::Basic {
            user: user.clone(),
            password: password.clone(),
        });
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(entry.auth.as_deref()?.trim())
        .ok()?;
    let (user, password) = String::from_utf8(decoded)
        .ok()?
        .split_once(':')
        .map(|(u, p)| (u.to_string(), p.to_string()))?;
    Some(Credential::Basic { user, password })
}

/// The host (and port) an `auths` key or a registry URL names, as the image automation
/// addresses it: `https://index.docker.io/v1/` and `docker.io` are Docker Hub's
/// `registry-1.docker.io`; a scheme and a path are dropped; lower case.
pub fn registry_host(key: &str) -> String {
    let without_scheme = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = without_scheme
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match host.as_str() {
        "docker.io" | "index.docker.io" | "registry.hub.docker.com" => {
            "registry-1.docker.io".to_string()
        }
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> RegistryCredentials {
        RegistryCredentials::parse(Path::new("config.json"), text.as_bytes()).unwrap()
    }

    #[test]
    fn each_entry_shape_of_a_docker_config_is_read() {
        let creds = parse(
            r#"{"auths": {
                "https://index.docker.io/v1/": {"auth": "dXNlcjpwYXNz"},
                "reg.example:5000": {"username": "ci", "password": "p:w"},
                "ghcr.io": {"registrytoken": "ghp_x"}
            }, "credsStore": "desktop"}"#,
        );
        assert_eq!(
            creds.for_host("registry-1.docker.io"),
            Some(&Credential::Basic {
                user: "user".into(),
                password: "pass".into()
            })
        );
        assert_eq!(
            creds.for_host("REG.example:5000").unwrap().header(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("ci:p:w")
            )
        );
        assert_eq!(creds.for_host("ghcr.io").unwrap().header(), "Bearer ghp_x");
        // Bound to the host and port named: never another's.
        assert_eq!(creds.for_host("reg.example"), None);
        assert_eq!(creds.for_host("evil.example"), None);
    }

    #[test]
    fn a_secret_never_shows_in_debug_output() {
        let creds = parse(
            r#"{"auths": {"a.example": {"username": "u", "password": "hunter2"}, "b.example": {"registrytoken": "tok3n"}}}"#,
        );
        let shown = format!("{creds:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("tok3n"),
            "{shown}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_docker_config_is_refused_with_its_path() {
        let e = RegistryCredentials::parse(Path::new("/run/creds"), b"auths: {}").unwrap_err();
        assert!(
            e.to_string().starts_with("/run/creds: not a Docker config"),
            "{e}"
        );
        let e = RegistryCredentials::parse(
            Path::new("/run/creds"),
            br#"{"auths": {"reg.example": {"auth": "bm8tY29sb24="}}}"#,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("\"reg.example\" has no usable"),
            "{e}"
        );
    }

    #[test]
    fn a_registry_is_named_by_its_host_and_port() {
        assert_eq!(
            registry_host("https://Reg.Example:5000/v2/"),
            "reg.example:5000"
        );
        assert_eq!(registry_host("docker.io"), "registry-1.docker.io");
        assert_eq!(registry_host("ghcr.io"), "ghcr.io");
    }
}
