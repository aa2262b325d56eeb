//! cosign signatures (issue 74, `ImagePolicy.spec.verify.cosign`), checked in-process before
//! a tag reaches Git. cosign's key-based scheme: beside image `sha256:<hex>` the repository has
//! the tag `sha256-<hex>.sig`, an OCI manifest whose layers are "simple signing" payloads
//! (`application/vnd.dev.cosign.simplesigning.v1+json`), each with its signature in the
//! annotation `dev.cosignproject.cosign/signature` (base64). A payload counts when its blob
//! hashes to the layer's digest, it is a "cosign container image signature" of this very
//! digest, and its signature verifies with one of the policy's keys (ECDSA P-256 with SHA-256,
//! DER, as `cosign sign --key` makes; or Ed25519).
//!
//! The registry may be hostile: at most [`MAX_LAYERS`] layers are looked at, each payload at
//! most [`MAX_PAYLOAD_BYTES`], and every answer is bounded as the rest of the registry's.

use base64::Engine;
use sha2::Digest;

use super::{Registry, RegistryError, Repository};

/// Signature layers looked at in one `.sig` manifest.
pub const MAX_LAYERS: usize = 16;
/// The largest payload read (cosign's are a few hundred bytes).
pub const MAX_PAYLOAD_BYTES: u64 = 64 * 1024;
/// Digests found signed, kept so that an unchanged pick costs no request at the next scan.
const MAX_KEPT: usize = 10_000;

const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
const SIGNATURE_TYPE: &str = "cosign container image signature";

/// A policy's keys, parsed.
#[derive(Clone, Debug)]
pub struct CosignKeys {
    keys: Vec<PublicKey>,
    /// What the keys are, for the cache of digests found signed.
    fingerprint: String,
}

#[derive(Clone, Debug)]
enum PublicKey {
    P256(p256::ecdsa::VerifyingKey),
    Ed25519(ed25519_dalek::VerifyingKey),
}

/// A key that is not an ECDSA P-256 or Ed25519 public key in PEM.
#[derive(Debug, thiserror::Error)]
#[error(
    "verify.cosign.publicKeys[{index}] is not an ECDSA P-256 or Ed25519 public key in PEM \
     (cosign.pub): {reason}"
)]
pub struct KeyError {
    pub index: usize,
    pub reason: String,
}

/// Whether an image is signed, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signed {
    Yes,
    /// No `.sig` tag for the digest.
    NoSignature,
    /// Signatures, none of which verifies; the first reason.
    NotByTheseKeys(SignatureError),
}

/// Why one signature does not count.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the payload is not JSON: {0}")]
    Payload(String),
    #[error("the payload's type is {0}, not {SIGNATURE_TYPE:?}")]
    Type(String),
    #[error("the payload signs {named}, not {digest}")]
    OtherDigest { named: String, digest: String },
    #[error("the signature is not base64")]
    NotBase64,
    #[error("the signature does not verify with any of the policy's keys")]
    NoKey,
    #[error("a layer of type {0:?}")]
    LayerType(String),
    #[error("a layer with no signature annotation")]
    NoAnnotation,
    #[error("a payload of {0} bytes")]
    TooLarge(u64),
    #[error("the payload's blob is not {0}")]
    BlobDigest(String),
    #[error("the signature manifest has no simple signing layer")]
    NoLayer,
}

impl CosignKeys {
    pub fn parse(pems: &[String]) -> Result<CosignKeys, KeyError> {
        use ed25519_dalek::pkcs8::DecodePublicKey as _;
        let mut keys = Vec::with_capacity(pems.len());
        for (index, pem) in pems.iter().enumerate() {
            let pem = pem.trim();
            let key = match p256::ecdsa::VerifyingKey::from_public_key_pem(pem) {
                Ok(k) => PublicKey::P256(k),
                Err(p256_error) => match ed25519_dalek::VerifyingKey::from_public_key_pem(pem) {
                    Ok(k) => PublicKey::Ed25519(k),
                    Err(_) => {
                        return Err(KeyError {
                            index,
                            reason: p256_error.to_string(),
                        });
                    }
                },
            };
            keys.push(key);
        }
        let fingerprint = hex::encode(sha2::Sha256::digest(pems.join("\n").as_bytes()));
        Ok(CosignKeys { keys, fingerprint })
    }

    /// Whether `signature` (base64, as in the annotation) over `payload` verifies with one
    /// of the keys, and the payload names `digest`.
    pub fn check(
        &self,
        payload: &[u8],
        signature: &str,
        digest: &str,
    ) -> Result<(), SignatureError> {
        let claims: serde_json::Value =
            serde_json::from_slice(payload).map_err(|e| SignatureError::Payload(e.to_string()))?;
        let signed_type = claims.pointer("/critical/type").and_then(|v| v.as_str());
        if signed_type != Some(SIGNATURE_TYPE) {
            return Err(SignatureError::Type(format!("{signed_type:?}")));
        }
        let named = claims
            .pointer("/critical/image/docker-manifest-digest")
            .and_then(|v| v.as_str());
        if named != Some(digest) {
            return Err(SignatureError::OtherDigest {
                named: named.unwrap_or("no digest").to_string(),
                digest: digest.to_string(),
            });
        }
        let signature = base64::engine::general_purpose::STANDARD
            .decode(signature.trim())
            .map_err(|_| SignatureError::NotBase64)?;
        let verifies = self.keys.iter().any(|key| match key {
            PublicKey::P256(k) => {
                use p256::ecdsa::signature::Verifier as _;
                p256::ecdsa::Signature::from_der(&signature)
                    .is_ok_and(|s| k.verify(payload, &s).is_ok())
            }
            PublicKey::Ed25519(k) => ed25519_dalek::Signature::from_slice(&signature)
                .is_ok_and(|s| k.verify_strict(payload, &s).is_ok()),
        });
        if verifies {
            Ok(())
        } else {
            Err(SignatureError::NoKey)
        }
    }
}

#[derive(serde::Deserialize)]
struct SignatureManifest {
    #[serde(default)]
    layers: Vec<Layer>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Layer {
    media_type: String,
    digest: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

impl Registry {
    /// Whether the image `digest` of `repo` carries a cosign signature by one of `keys`.
    pub async fn cosign_signed(
        &self,
        repo: &Repository,
        digest: &str,
        keys: &CosignKeys,
    ) -> Result<Signed, RegistryError> {
        let kept = format!("{digest} {}", keys.fingerprint);
        if self.signed.lock().is_ok_and(|s| s.contains(&kept)) {
            return Ok(Signed::Yes);
        }
        let hex = super::build_time::checked_digest(digest, repo, "manifests")?
            .trim_start_matches("sha256:");
        let mut auth = None;
        let url = self.url(repo, &format!("manifests/sha256-{hex}.sig"))?;
        let body = match self.send(&url, reqwest::Method::GET, &mut auth, repo).await {
            Ok((body, _)) => body,
            Err(RegistryError::Status { status: 404, .. }) => return Ok(Signed::NoSignature),
            Err(e) => return Err(e),
        };
        let manifest: SignatureManifest =
            serde_json::from_slice(&body).map_err(|e| RegistryError::BadAnswer {
                url: url.to_string(),
                reason: e.to_string(),
            })?;
        let mut first_reason = None;
        for layer in manifest.layers.iter().take(MAX_LAYERS) {
            let reason = match self
                .check_layer(repo, layer, digest, keys, &mut auth)
                .await?
            {
                Ok(()) => {
                    if let Ok(mut signed) = self.signed.lock() {
                        if signed.len() >= MAX_KEPT {
                            signed.clear();
                        }
                        signed.insert(kept);
                    }
                    return Ok(Signed::Yes);
                }
                Err(reason) => reason,
            };
            first_reason.get_or_insert(reason);
        }
        Ok(Signed::NotByTheseKeys(
            first_reason.unwrap_or(SignatureError::NoLayer),
        ))
    }

    /// One layer: its payload read (bounded, checked against its digest) and checked.
    async fn check_layer(
        &self,
        repo: &Repository,
        layer: &Layer,
        digest: &str,
        keys: &CosignKeys,
        auth: &mut Option<String>,
    ) -> Result<Result<(), SignatureError>, RegistryError> {
        if layer.media_type != SIMPLE_SIGNING {
            return Ok(Err(SignatureError::LayerType(layer.media_type.clone())));
        }
        let Some(signature) = layer.annotations.get(SIGNATURE_ANNOTATION) else {
            return Ok(Err(SignatureError::NoAnnotation));
        };
        if layer.size > MAX_PAYLOAD_BYTES {
            return Ok(Err(SignatureError::TooLarge(layer.size)));
        }
        let path = format!(
            "blobs/{}",
            super::build_time::checked_digest(&layer.digest, repo, "manifests")?
        );
        let url = self.url(repo, &path)?;
        let (payload, _) = self.send(&url, reqwest::Method::GET, auth, repo).await?;
        let hashed = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&payload)));
        if hashed != layer.digest || payload.len() as u64 > MAX_PAYLOAD_BYTES {
            return Ok(Err(SignatureError::BlobDigest(layer.digest.clone())));
        }
        Ok(keys.check(&payload, signature, digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer as _;

    fn payload(digest: &str) -> Vec<u8> {
        serde_json::json!({
            "critical": {
                "identity": {"docker-reference": "reg.example/web"},
                "image": {"docker-manifest-digest": digest},
                "type": SIGNATURE_TYPE,
            },
            "optional": null,
        })
        .to_string()
        .into_bytes()
    }

    fn p256_key(seed: u8) -> (p256::ecdsa::SigningKey, String) {
        use p256::pkcs8::EncodePublicKey as _;
        let signing = p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap();
        let pem = signing
            .verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .unwrap();
        (signing, pem)
    }

    fn signed(key: &p256::ecdsa::SigningKey, payload: &[u8]) -> String {
        let s: p256::ecdsa::Signature = key.sign(payload);
        base64::engine::general_purpose::STANDARD.encode(s.to_der().as_bytes())
    }

    #[test]
    fn a_payload_signed_by_a_policy_key_for_this_digest_verifies() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let (key, pem) = p256_key(7);
        let keys = CosignKeys::parse(&[pem]).unwrap();
        let p = payload(&digest);
        assert_eq!(keys.check(&p, &signed(&key, &p), &digest), Ok(()));
    }

    #[test]
    fn another_key_another_digest_or_another_payload_does_not() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let (key, pem) = p256_key(7);
        let (other, _) = p256_key(9);
        let keys = CosignKeys::parse(&[pem]).unwrap();
        let p = payload(&digest);
        assert!(keys.check(&p, &signed(&other, &p), &digest).is_err());
        let elsewhere = payload(&format!("sha256:{}", "b".repeat(64)));
        let e = keys
            .check(&elsewhere, &signed(&key, &elsewhere), &digest)
            .unwrap_err();
        assert!(e.to_string().contains("not sha256:aaaa"), "{e}");
        let mut tampered = p.clone();
        tampered.extend_from_slice(b" ");
        assert!(keys.check(&tampered, &signed(&key, &p), &digest).is_err());
        assert!(keys.check(&p, "not base64!", &digest).is_err());
        assert!(keys.check(b"[]", &signed(&key, b"[]"), &digest).is_err());
    }

    #[test]
    fn an_ed25519_key_verifies_too() {
        use ed25519_dalek::Signer as _;
        use ed25519_dalek::pkcs8::EncodePublicKey as _;
        let digest = format!("sha256:{}", "c".repeat(64));
        let signing = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let pem = signing
            .verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .unwrap();
        let keys = CosignKeys::parse(&[pem]).unwrap();
        let p = payload(&digest);
        let s = base64::engine::general_purpose::STANDARD.encode(signing.sign(&p).to_bytes());
        assert_eq!(keys.check(&p, &s, &digest), Ok(()));
    }

    #[test]
    fn a_key_that_is_not_one_names_its_index() {
        let (_, pem) = p256_key(7);
        let e = CosignKeys::parse(&[
            pem,
            "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----".into(),
        ])
        .unwrap_err();
        assert_eq!(e.index, 1);
        assert!(e.to_string().contains("publicKeys[1]"), "{e}");
    }
}
