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
    #[error(
        "signed with OpenPGP key {key}, which {why}: what it signs is not trusted any more. \
         Sign with a valid key, or put the key's current export in --signing-keys"
    )]
    KeyNotValid { key: String, why: String },
    #[error(
        "the OpenPGP signature names trusted key {key} but does not verify over this commit: \
         the commit was changed after it was signed, or the signature was copied from another \
         commit"
    )]
    NotOverThisCommit { key: String },
    #[error(
        "more than {max} commits are new since the last verified commit {since}; \
         --verify-commits=range checks at most {max}. Check them by hand, then restart once \
         with --verify-commits=tip to take this tip as the new starting point"
    )]
    RangeTooLong { since: String, max: usize },
    #[error(
        "the tip does not descend from the last verified commit {since} (history rewritten, or \
         not found within the history fetched): --verify-commits=range cannot tell which \
         commits are new. Check the new history by hand, then restart once with \
         --verify-commits=tip to take this tip as the new starting point"
    )]
    NotAbove { since: String },
    #[error("{commit} ({below} below the tip, {subject:?}) {why}")]
    InRange {
        commit: String,
        below: usize,
        subject: String,
        why: Box<VerifyError>,
    },
}

/// Which commits `--signing-keys` checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifyCommits {
    /// The tip only, as Flux's GitRepository `verify` (mode HEAD) and `git verify-commit`.
    #[default]
    Tip,
    /// Every commit since the last verified one, merges and their sides too, up to
    /// [`MAX_VERIFIED_RANGE`].
    Range,
}

/// The most commits one new tip may bring in range mode.
pub const MAX_VERIFIED_RANGE: usize = 1000;

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
            return self.verify_ssh(text, signed);
        }
        if text.contains("-----BEGIN PGP SIGNATURE-----") {
            return self.verify_pgp(signature, signed);
        }
        Err(VerifyError::Unreadable(
            "the signature is neither OpenPGP nor SSH (X.509 signatures are not verified)".into(),
        ))
    }

    /// An SSH signature (namespace `git`) by one of the trusted SSH keys.
    fn verify_ssh(&self, text: &str, signed: &[u8]) -> Result<String, VerifyError> {
        let sig = ssh_key::SshSig::from_pem(text).map_err(|e| {
            VerifyError::Unreadable(format!("the SSH signature does not read: {e}"))
        })?;
        if sig.namespace() != SSH_NAMESPACE {
            return Err(VerifyError::Unreadable(format!(
                "the SSH signature is for namespace {:?}, not {SSH_NAMESPACE:?}",
                sig.namespace()
            )));
        }
        if let Some(key) = self.ssh.iter().find(|k| k.key_data() == sig.public_key()) {
            return key
                .verify(SSH_NAMESPACE, signed, &sig)
                .map(|()| key.fingerprint(Default::default()).to_string())
                .map_err(|e| VerifyError::Invalid(e.to_string()));
        }
        let by = ssh_key::PublicKey::from(sig.public_key().clone());
        Err(VerifyError::Untrusted {
            kind: "SSH",
            key: by.fingerprint(Default::default()).to_string(),
            more: "",
        })
    }

    /// An OpenPGP signature by a trusted primary key or one of its bound subkeys, each valid
    /// now (not expired, not revoked).
    fn verify_pgp(&self, signature: &[u8], signed: &[u8]) -> Result<String, VerifyError> {
        let (sig, _) = DetachedSignature::from_armor_single(std::io::Cursor::new(signature))
            .map_err(|e| {
                VerifyError::Unreadable(format!("the OpenPGP signature does not read: {e}"))
            })?;
        let now = pgp::types::Timestamp::now().as_secs();
        for key in &self.pgp {
            let fingerprint = hex(key.fingerprint().as_bytes());
            let why = if sig.verify(key, signed).is_ok() {
                primary_key_refusal(key, now)
            } else if let Some(sub) = key.public_subkeys.iter().find(|sub| {
                sub.verify_bindings(&key.primary_key).is_ok() && sig.verify(*sub, signed).is_ok()
            }) {
                primary_key_refusal(key, now).or_else(|| subkey_refusal(sub, now))
            } else {
                continue;
            };
            return match why {
                Some(why) => Err(VerifyError::KeyNotValid {
                    key: fingerprint,
                    why,
                }),
                None => Ok(fingerprint),
            };
        }
        let issuers: Vec<String> = sig
            .signature
            .issuer_fingerprint()
            .iter()
            .map(|f| hex(f.as_bytes()))
            .collect();
        // A trusted key's signature that does not verify: over another commit (issue 70: the
        // message called the trusted key untrusted).
        let trusted: Vec<String> = self
            .pgp
            .iter()
            .flat_map(|k| {
                std::iter::once(hex(k.fingerprint().as_bytes())).chain(
                    k.public_subkeys
                        .iter()
                        .map(|s| hex(s.key.fingerprint().as_bytes())),
                )
            })
            .collect();
        if let Some(key) = issuers.iter().find(|i| trusted.contains(i)) {
            return Err(VerifyError::NotOverThisCommit { key: key.clone() });
        }
        Err(VerifyError::Untrusted {
            kind: "OpenPGP",
            key: if issuers.is_empty() {
                "?".to_string()
            } else {
                issuers.join(", ")
            },
            more: " (or the signature does not verify)",
        })
    }
}

/// Why primary key `key` may not sign at `now` (seconds), if it may not: a revocation
/// signature (each was checked against the key when it was read), or past its expiry.
fn primary_key_refusal(key: &SignedPublicKey, now: u32) -> Option<String> {
    if !key.details.revocation_signatures.is_empty() {
        return Some("was revoked".into());
    }
    let self_signatures: Vec<&pgp::packet::Signature> = key
        .details
        .users
        .iter()
        .flat_map(|u| &u.signatures)
        .chain(&key.details.direct_signatures)
        .collect();
    expiry_refusal(
        &self_signatures,
        key.primary_key.created_at().as_secs(),
        now,
    )
}

/// Why subkey `sub` may not sign at `now`, if it may not: revoked, or past its expiry.
fn subkey_refusal(sub: &pgp::composed::SignedPublicSubKey, now: u32) -> Option<String> {
    use pgp::packet::SignatureType;
    if sub
        .signatures
        .iter()
        .any(|s| s.typ() == Some(SignatureType::SubkeyRevocation))
    {
        return Some("has its signing subkey revoked".into());
    }
    let bindings: Vec<&pgp::packet::Signature> = sub
        .signatures
        .iter()
        .filter(|s| s.typ() == Some(SignatureType::SubkeyBinding))
        .collect();
    expiry_refusal(&bindings, sub.key.created_at().as_secs(), now)
        .map(|why| format!("has a signing subkey that {why}"))
}

/// Whether the newest of `signatures` (a key's self-signatures, or a subkey's bindings) sets
/// an expiry that `now` is past, for a key created at `created` (seconds).
fn expiry_refusal(
    signatures: &[&pgp::packet::Signature],
    created: u32,
    now: u32,
) -> Option<String> {
    let newest = signatures
        .iter()
        .max_by_key(|s| s.created().map(|t| t.as_secs()))?;
    let lasts = newest.key_expiration_time()?.as_secs();
    expired(created, lasts, now)
}

/// `Some("expired at …")` when a key created at `created` that lasts `lasts` seconds (0: for
/// ever) has expired at `now`.
fn expired(created: u32, lasts: u32, now: u32) -> Option<String> {
    if lasts == 0 {
        return None;
    }
    let at = u64::from(created) + u64::from(lasts);
    (u64::from(now) >= at).then(|| {
        let when = jiff::Timestamp::from_second(at as i64)
            .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
            .unwrap_or_else(|_| at.to_string());
        format!("expired at {when}")
    })
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

/// Every commit reachable from `tip` and not from `since` (the last verified commit, an
/// ancestor of `tip`: the caller makes sure), each signed by one of `keys`; at most `max` of
/// them. The tip's signer, or the first commit that fails, from the tip down.
pub fn check_range(
    repo: &git2::Repository,
    tip: git2::Oid,
    since: git2::Oid,
    keys: &TrustedKeys,
    max: usize,
) -> Result<String, VerifyError> {
    let walk_error = |e: git2::Error| {
        VerifyError::Unreadable(format!("cannot walk the history: {}", e.message()))
    };
    let mut walk = repo.revwalk().map_err(walk_error)?;
    walk.set_sorting(git2::Sort::TOPOLOGICAL)
        .map_err(walk_error)?;
    walk.push(tip).map_err(walk_error)?;
    walk.hide(since).map_err(walk_error)?;
    let mut tip_signer = None;
    for (below, commit) in walk.enumerate() {
        let commit = commit.map_err(walk_error)?;
        if below >= max {
            return Err(VerifyError::RangeTooLong {
                since: since.to_string(),
                max,
            });
        }
        match check_commit(repo, commit, keys) {
            Ok(signer) => {
                if commit == tip {
                    tip_signer = Some(signer);
                }
            }
            Err(why) => {
                let subject: String = match repo.find_commit(commit) {
                    Ok(c) => c
                        .summary()
                        .ok()
                        .flatten()
                        .map(|s| s.chars().take(80).collect())
                        .unwrap_or_default(),
                    Err(_) => String::new(),
                };
                return Err(VerifyError::InRange {
                    commit: commit.to_string(),
                    below,
                    subject,
                    why: Box::new(why),
                });
            }
        }
    }
    match tip_signer {
        Some(signer) => Ok(signer),
        // The tip is `since` itself: verified before.
        None => check_commit(repo, tip, keys),
    }
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
    fn an_expired_key_is_refused_from_its_expiry_on() {
        // Issue 70: revocation and expiry were ignored.
        let created = 1_700_000_000;
        assert_eq!(expired(created, 0, created + 10 * 365 * 86_400), None);
        assert_eq!(expired(created, 86_400, created + 86_399), None);
        let why = expired(created, 86_400, created + 86_400).unwrap();
        assert!(why.starts_with("expired at 2023-11-"), "{why}");
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

    fn commit(repo: &git2::Repository, parent: Option<git2::Oid>, message: &str) -> git2::Oid {
        let who = git2::Signature::now("dev", "dev@example.invalid").unwrap();
        let tree = repo.treebuilder(None).unwrap().write().unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let parents: Vec<git2::Commit> = parent
            .iter()
            .map(|p| repo.find_commit(*p).unwrap())
            .collect();
        let parents: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(None, &who, &who, message, &tree, &parents)
            .unwrap()
    }

    #[test]
    fn range_mode_names_the_first_unsigned_commit_below_the_tip_and_is_bounded() {
        // Issue 70: only the tip was verified; unsigned commits below a signed tip went in.
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_bare(dir.path()).unwrap();
        let base = commit(&repo, None, "base");
        let middle = commit(&repo, Some(base), "unsigned change");
        let tip = commit(&repo, Some(middle), "tip");
        let keys = TrustedKeys::default();
        match check_range(&repo, tip, base, &keys, MAX_VERIFIED_RANGE) {
            Err(VerifyError::InRange {
                commit,
                below,
                subject,
                why,
            }) => {
                assert_eq!(
                    (commit, below, subject.as_str()),
                    (tip.to_string(), 0, "tip")
                );
                assert!(matches!(*why, VerifyError::Unsigned));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_range(&repo, tip, base, &keys, 1),
            Err(VerifyError::InRange { .. })
        ));
        match check_range(&repo, tip, base, &keys, 0) {
            Err(e @ VerifyError::RangeTooLong { .. }) => {
                assert!(e.to_string().contains("--verify-commits=tip"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
}
