//! Verified commits (issue 45): an option to apply only revisions whose tip commit is signed
//! by a listed key, OpenPGP or SSH, as `git verify-commit` and Flux's GitRepository
//! `verify` check them. Pure: keys and signatures in, who signed (or why not) out; the
//! signature and the signed bytes come from Git ([`git2::Repository::extract_signature`]).
//! No `gpg` or `ssh-keygen` is run: the agent's image needs neither.

use std::path::Path;

use pgp::composed::{Deserializable, DetachedSignature, SignedPublicKey};
use pgp::types::KeyDetails as _;

/// The namespace Git signs commits in with SSH keys (`ssh-keygen -Y sign -n git`).
const SSH_NAMESPACE: &str = "git";

/// The largest key file read.
const MAX_KEY_FILE_BYTES: u64 = 1024 * 1024;

/// Why keys could not be read, or a commit is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("{path}: {reason}")]
    KeyFile { path: String, reason: String },
    #[error(
        "{path}: no OpenPGP or SSH public key found; export one with `gpg --export --armor KEY` \
         or give an SSH public key line"
    )]
    NoKeys { path: String },
    #[error("{0}")]
    BadKey(String),
    #[error("it is not signed")]
    Unsigned,
    #[error("{0}")]
    Unreadable(String),
    #[error("signed with {kind} key {key}, which is not a trusted key{more}")]
    Untrusted {
        kind: &'static str,
        key: String,
        more: &'static str,
    },
    #[error("the SSH signature does not verify: {0}")]
    Invalid(String),
}

/// The keys whose signatures make a commit trusted.
#[derive(Clone, Debug, Default)]
pub struct TrustedKeys {
    pgp: Vec<SignedPublicKey>,
    ssh: Vec<ssh_key::PublicKey>,
}

impl TrustedKeys {
    /// Reads every key in `path`, a file or a directory of files (a mounted Secret or
    /// ConfigMap: hidden entries such as `..data` are skipped). A file holds armored OpenPGP
    /// public key blocks (`gpg --export --armor`), or SSH public keys one per line
    /// (`ssh-ed25519 AAAA… comment`, as in `authorized_keys`; an `allowed_signers` line's
    /// leading principal is skipped).
    pub fn load(path: &Path) -> Result<TrustedKeys, VerifyError> {
        let file_error = |file: &Path, reason: String| VerifyError::KeyFile {
            path: file.display().to_string(),
            reason,
        };
        let mut keys = TrustedKeys::default();
        let files: Vec<std::path::PathBuf> = if path.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(path)
                .map_err(|e| file_error(path, crate::error::io_reason(&e)))?
                .filter_map(|e| e.ok())
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            files
        } else {
            vec![path.to_path_buf()]
        };
        for file in files {
            let size = std::fs::metadata(&file)
                .map_err(|e| file_error(&file, crate::error::io_reason(&e)))?
                .len();
            if size > MAX_KEY_FILE_BYTES {
                return Err(file_error(
                    &file,
                    format!("{size} bytes; a key file may hold at most {MAX_KEY_FILE_BYTES}"),
                ));
            }
            let text = std::fs::read_to_string(&file)
                .map_err(|e| file_error(&file, crate::error::io_reason(&e)))?;
            keys.add(&text)
                .map_err(|e| file_error(&file, e.to_string()))?;
        }
        if keys.is_empty() {
            return Err(VerifyError::NoKeys {
                path: path.display().to_string(),
            });
        }
        Ok(keys)
    }

    /// Adds the keys in `text`.
    pub fn add(&mut self, text: &str) -> Result<(), VerifyError> {
        if text.contains("-----BEGIN PGP PUBLIC KEY BLOCK-----") {
            let (found, _) = SignedPublicKey::from_armor_many(std::io::Cursor::new(
                text.as_bytes(),
            ))
            .map_err(|e| VerifyError::BadKey(format!("not an armored OpenPGP public key: {e}")))?;
            for key in found {
                let key = key.map_err(|e| {
                    VerifyError::BadKey(format!("not an armored OpenPGP public key: {e}"))
                })?;
                key.verify_bindings().map_err(|e| {
                    VerifyError::BadKey(format!(
                        "an OpenPGP key whose self-signatures do not verify: {e}"
                    ))
                })?;
                self.pgp.push(key);
            }
            return Ok(());
        }
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // `allowed_signers`: a principal (and options) before the key type.
            let from = line
                .find("ssh-")
                .or_else(|| line.find("ecdsa-"))
                .or_else(|| line.find("sk-"))
                .unwrap_or(0);
            let key = ssh_key::PublicKey::from_openssh(&line[from..]).map_err(|e| {
                VerifyError::BadKey(format!("line {}: not an SSH public key: {e}", n + 1))
            })?;
            self.ssh.push(key);
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.pgp.is_empty() && self.ssh.is_empty()
    }

    /// Who among the keys made `signature` over `signed` (a fingerprint), or why none did.
    pub fn verify(&self, signature: &[u8], signed: &[u8]) -> Result<String, VerifyError> {
        let text = std::str::from_utf8(signature)
            .map_err(|_| VerifyError::Unreadable("the signature is not text".into()))?;
        if text.contains("-----BEGIN SSH SIGNATURE-----") {
            let sig = ssh_key::SshSig::from_pem(text).map_err(|e| {
                VerifyError::Unreadable(format!("the SSH signature does not read: {e}"))
            })?;
            if sig.namespace() != SSH_NAMESPACE {
                return Err(VerifyError::Unreadable(format!(
                    "the SSH signature is for namespace {:?}, not {SSH_NAMESPACE:?}",
                    sig.namespace()
                )));
            }
            for key in &self.ssh {
                if key.key_data() == sig.public_key() {
                    return key
                        .verify(SSH_NAMESPACE, signed, &sig)
                        .map(|()| key.fingerprint(Default::default()).to_string())
                        .map_err(|e| VerifyError::Invalid(e.to_string()));
                }
            }
            let by = ssh_key::PublicKey::from(sig.public_key().clone());
            return Err(VerifyError::Untrusted {
                kind: "SSH",
                key: by.fingerprint(Default::default()).to_string(),
                more: "",
            });
        }
        if text.contains("-----BEGIN PGP SIGNATURE-----") {
            let (sig, _) = DetachedSignature::from_armor_single(std::io::Cursor::new(signature))
                .map_err(|e| {
                    VerifyError::Unreadable(format!("the OpenPGP signature does not read: {e}"))
                })?;
            for key in &self.pgp {
                if sig.verify(key, signed).is_ok() {
                    return Ok(hex(key.fingerprint().as_bytes()));
                }
                for sub in &key.public_subkeys {
                    if sub.verify_bindings(&key.primary_key).is_ok()
                        && sig.verify(sub, signed).is_ok()
                    {
                        return Ok(hex(key.fingerprint().as_bytes()));
                    }
                }
            }
            let issuers: Vec<String> = sig
                .signature
                .issuer_fingerprint()
                .iter()
                .map(|f| hex(f.as_bytes()))
                .collect();
            return Err(VerifyError::Untrusted {
                kind: "OpenPGP",
                key: if issuers.is_empty() {
                    "?".to_string()
                } else {
                    issuers.join(", ")
                },
                more: " (or the signature does not verify)",
            });
        }
        Err(VerifyError::Unreadable(
            "the signature is neither OpenPGP nor SSH (X.509 signatures are not verified)".into(),
        ))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// Why a commit is not trusted, if it is not: unsigned, or not by one of `keys`; else who
/// signed it.
pub fn check_commit(
    repo: &git2::Repository,
    commit: git2::Oid,
    keys: &TrustedKeys,
) -> Result<String, VerifyError> {
    let (signature, signed) = match repo.extract_signature(&commit, None) {
        Ok(found) => found,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Err(VerifyError::Unsigned),
        Err(e) => {
            return Err(VerifyError::Unreadable(format!(
                "its signature cannot be read: {}",
                e.message()
            )));
        }
    };
    keys.verify(&signature, &signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_without_keys_is_an_error() {
        let mut keys = TrustedKeys::default();
        assert!(keys.add("# nothing here\n\n").is_ok());
        assert!(keys.is_empty());
        assert!(keys.add("ssh-ed25519 not-base64").is_err());
        assert!(
            keys.add(
                "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nxx\n-----END PGP PUBLIC KEY BLOCK-----\n"
            )
            .is_err()
        );
    }

    #[test]
    fn an_allowed_signers_line_reads_its_key() {
        let mut keys = TrustedKeys::default();
        keys.add("dev@example.invalid ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIgiMCmyhNewoP9A/Irct+tn9HdzPh5pzsFIz6zhddSU dev\n")
            .unwrap();
        assert_eq!(keys.ssh.len(), 1);
    }

    #[test]
    fn a_signature_of_neither_kind_is_refused() {
        let keys = TrustedKeys::default();
        assert!(
            keys.verify(b"-----BEGIN SIGNED MESSAGE-----", b"x")
                .is_err()
        );
        assert!(keys.verify(&[0xff, 0xfe], b"x").is_err());
    }
}
