//! Signed commits (issue 74, `--git-signing-key`): every commit the agent writes (write-back,
//! reverts, image automation) is signed with an OpenSSH private key, as `git commit -S` with
//! `gpg.format=ssh` signs one (an SSH signature, namespace `git`, in the `gpgsig` header). A
//! repository that requires signed commits takes them, and so does an agent whose
//! `--signing-keys` lists the key's public half: its own commits pass its own verification.

use std::path::{Path, PathBuf};

use git2::{Commit, Oid, Repository, Signature, Tree};

/// The largest key file read.
const MAX_KEY_BYTES: u64 = 64 * 1024;

/// The key commits are signed with.
pub struct CommitSigner {
    key: ssh_key::PrivateKey,
}

impl std::fmt::Debug for CommitSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CommitSigner({})", self.fingerprint())
    }
}

/// Why a signing key was not used.
#[derive(Debug, thiserror::Error)]
pub enum SigningKeyError {
    #[error("--git-signing-key {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error(
        "--git-signing-key {path}: the key is encrypted; give an unencrypted key (from a Secret)"
    )]
    Encrypted { path: PathBuf },
}

impl CommitSigner {
    /// Reads an OpenSSH private key (`ssh-keygen -t ed25519`; also ECDSA and RSA).
    pub fn read(path: &Path) -> Result<CommitSigner, SigningKeyError> {
        use std::io::Read as _;
        let failed = |reason: String| SigningKeyError::Read {
            path: path.to_path_buf(),
            reason,
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(|e| failed(e.to_string()))?
            .take(MAX_KEY_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| failed(e.to_string()))?;
        let key = ssh_key::PrivateKey::from_openssh(text.trim())
            .map_err(|e| failed(format!("not an OpenSSH private key: {e}")))?;
        if key.is_encrypted() {
            return Err(SigningKeyError::Encrypted {
                path: path.to_path_buf(),
            });
        }
        Ok(CommitSigner { key })
    }

    /// The key's fingerprint (`SHA256:…`), as `ssh-keygen -l` shows it.
    pub fn fingerprint(&self) -> String {
        self.key.fingerprint(ssh_key::HashAlg::Sha256).to_string()
    }

    /// The armored SSH signature of a commit's text.
    fn sign(&self, content: &[u8]) -> Result<String, git2::Error> {
        let sig = self
            .key
            .sign("git", ssh_key::HashAlg::Sha512, content)
            .map_err(|e| git2::Error::from_str(&format!("signing the commit: {e}")))?;
        sig.to_pem(ssh_key::LineEnding::LF)
            .map_err(|e| git2::Error::from_str(&format!("signing the commit: {e}")))
    }
}

/// A commit (not on any reference), signed when `signer` is given.
pub fn create_commit(
    repo: &Repository,
    signer: Option<&CommitSigner>,
    author: &Signature<'_>,
    message: &str,
    tree: &Tree<'_>,
    parents: &[&Commit<'_>],
) -> Result<Oid, git2::Error> {
    create_commit_for(repo, signer, (author, author), message, tree, parents)
}

/// [`create_commit`] with an author other than the committer: a person's change that the
/// agent commits for them (a dashboard action).
pub fn create_commit_for(
    repo: &Repository,
    signer: Option<&CommitSigner>,
    (author, committer): (&Signature<'_>, &Signature<'_>),
    message: &str,
    tree: &Tree<'_>,
    parents: &[&Commit<'_>],
) -> Result<Oid, git2::Error> {
    let Some(signer) = signer else {
        return repo.commit(None, author, committer, message, tree, parents);
    };
    let content = repo.commit_create_buffer(author, committer, message, tree, parents)?;
    let signature = signer.sign(&content)?;
    let text = std::str::from_utf8(&content)
        .map_err(|_| git2::Error::from_str("a commit's text is not UTF-8"))?;
    repo.commit_signed(text, &signature, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed ed25519 key (ssh-key's own test key): no randomness in a unit test.
    const KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACCzPq7zfqLffKoBDe/eo04kH2XxtSmk9D7RQyf1xUqrYgAAAJgAIAxdACAM
XQAAAAtzc2gtZWQyNTUxOQAAACCzPq7zfqLffKoBDe/eo04kH2XxtSmk9D7RQyf1xUqrYg
AAAEC2BsIi0QwW2uFscKTUUXNHLsYX4FxlaSDSblbAj7WR7bM+rvN+ot98qgEN796jTiQf
ZfG1KaT0PtFDJ/XFSqtiAAAAEHVzZXJAZXhhbXBsZS5jb20BAgMEBQ==
-----END OPENSSH PRIVATE KEY-----";

    #[test]
    fn a_signed_commit_carries_an_ssh_signature_its_public_key_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, KEY).unwrap();
        let signer = CommitSigner::read(&key_file).unwrap();
        assert!(format!("{signer:?}").starts_with("CommitSigner(SHA256:"));
        let repo = Repository::init(dir.path().join("repo")).unwrap();
        let tree = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let who = Signature::now("linnet", "linnet@example.invalid").unwrap();
        let id = create_commit(&repo, Some(&signer), &who, "signed\n", &tree, &[]).unwrap();
        let (signature, content) = repo.extract_signature(&id, None).unwrap();
        let sig = ssh_key::SshSig::from_pem(signature.as_str().unwrap()).unwrap();
        signer
            .key
            .public_key()
            .verify("git", &content, &sig)
            .unwrap();
        // Without a signer, a plain commit.
        let plain = create_commit(&repo, None, &who, "plain\n", &tree, &[]).unwrap();
        assert!(repo.extract_signature(&plain, None).is_err());
    }

    #[test]
    fn a_key_that_is_not_one_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, "not a key").unwrap();
        let e = CommitSigner::read(&key_file).unwrap_err();
        assert!(e.to_string().contains("not an OpenSSH private key"), "{e}");
    }
}
