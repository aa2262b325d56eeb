//! Signed images only (`ImagePolicy.spec.verify.cosign`), against the real registry. The
//! signatures are made here as `cosign sign --key` stores them (a `sha256-<hex>.sig` tag whose
//! OCI manifest has a simple signing payload, its ECDSA P-256 signature in an annotation),
//! with `openssl` signing, so the agent's check is not checked against itself.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use sha2::Digest;

use super::support::registry::{push_image, semver_policy};
use super::support::{self, git};
use super::{Setup, image_commits, image_in_git, setup, start, write_web_and_policy};

fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A P-256 key pair as `cosign generate-key-pair` makes (the private half left unencrypted
/// here): `<name>.key` and `<name>.pub` in `dir`; returns the public PEM.
fn key_pair(dir: &Path, name: &str) -> String {
    let key = format!("{name}.key");
    openssl(
        dir,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            &key,
        ],
    );
    openssl(
        dir,
        &["ec", "-in", &key, "-pubout", "-out", &format!("{name}.pub")],
    );
    std::fs::read_to_string(dir.join(format!("{name}.pub"))).unwrap()
}

/// Uploads `bytes` as a blob of `repository` (`host:port/path`); returns its digest.
async fn upload_blob(http: &reqwest::Client, repository: &str, bytes: &[u8]) -> String {
    let (host, path) = repository.split_once('/').unwrap();
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)));
    let started = http
        .post(format!("https://{host}/v2/{path}/blobs/uploads/"))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status().as_u16(), 202, "{started:?}");
    let location = started.headers()["location"].to_str().unwrap().to_string();
    let location = if location.starts_with('/') {
        format!("https://{host}{location}")
    } else {
        location
    };
    let separator = if location.contains('?') { '&' } else { '?' };
    let done = http
        .put(format!("{location}{separator}digest={digest}"))
        .header("content-type", "application/octet-stream")
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(done.status().as_u16(), 201, "{done:?}");
    digest
}

/// Signs, with `key` (a file in `dir`), a payload naming `signed_digest`, and pushes it as the
/// signature of image `image_digest`: the tag `sha256-<hex>.sig` of `repository`.
async fn push_signature(
    http: &reqwest::Client,
    dir: &Path,
    repository: &str,
    image_digest: &str,
    signed_digest: &str,
    key: &str,
) {
    let payload = serde_json::json!({
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": signed_digest},
            "type": "cosign container image signature",
        },
        "optional": null,
    })
    .to_string();
    std::fs::write(dir.join("payload.json"), &payload).unwrap();
    openssl(
        dir,
        &[
            "dgst",
            "-sha256",
            "-sign",
            key,
            "-out",
            "payload.sig",
            "payload.json",
        ],
    );
    let signature = std::fs::read(dir.join("payload.sig")).unwrap();
    let signature = base64::engine::general_purpose::STANDARD.encode(signature);
    let layer = upload_blob(http, repository, payload.as_bytes()).await;
    let config = upload_blob(http, repository, b"{}").await;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 2, "digest": config},
        "layers": [{
            "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "size": payload.len(),
            "digest": layer,
            "annotations": {"dev.cosignproject.cosign/signature": signature},
        }],
    });
    let (host, path) = repository.split_once('/').unwrap();
    let tag = format!("{}.sig", image_digest.replace(':', "-"));
    let put = http
        .put(format!("https://{host}/v2/{path}/manifests/{tag}"))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(manifest.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 201, "{put:?}");
}

/// Waits for the agent to say `what` in its log.
async fn logged(agent: &super::support::agent::Agent, what: &str) {
    support::eventually(
        &format!("the log to say {what:?}"),
        Duration::from_secs(30),
        || async { agent.log_text().contains(what).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn only_an_image_signed_by_a_policy_key_for_its_own_digest_is_written() {
    let Setup {
        ns,
        tmp,
        tools,
        ca,
        ca_file,
        repository,
        ..
    } = &setup("images-cosign", false).await;
    let keys = tmp.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let public = key_pair(&keys, "cosign");
    key_pair(&keys, "attacker");
    let first = format!("{repository}:1.0.0");
    push_image(tools, tmp.path(), &first, "1.0.0");
    let (bare, work) = support::bare_remote_and_clone(tmp.path());
    let indented: String = public.lines().map(|l| format!("          {l}\n")).collect();
    let policy = format!(
        "{}  verify:\n    cosign:\n      publicKeys:\n        - |\n{indented}",
        semver_policy(repository)
    );
    write_web_and_policy(&work, &ns.name, &first, &policy);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "web, signed images only"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    let (code, out, _) = support::validate_offline(&work, &[]);
    assert_eq!(code, 0, "{out}");

    let agent_dir = tmp.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let mut agent = start(&agent_dir, &bare, &ns.name, ca_file, "1s");
    super::support::agent::wait_ready(&agent).await;
    let http = ca.client();

    // Unsigned: not written.
    let second = format!("{repository}:1.1.0");
    let digest = push_image(tools, tmp.path(), &second, "1.1.0");
    logged(
        &agent,
        &format!("{second} ({digest}) has no cosign signature"),
    )
    .await;
    // Signed by another key: not written.
    push_signature(&http, &keys, repository, &digest, &digest, "attacker.key").await;
    logged(&agent, "does not verify with any of the policy's keys").await;
    // A real signature of another image, replayed as this one's: not written.
    let older = support::registry::stdout(&support::registry::run(
        &tools.join("crane"),
        &["digest", "--insecure", &first],
    ));
    push_signature(
        &http,
        &keys,
        repository,
        &digest,
        older.trim(),
        "cosign.key",
    )
    .await;
    logged(
        &agent,
        &format!("the payload signs {}, not {digest}", older.trim()),
    )
    .await;
    assert_eq!(image_in_git(&bare), first);
    assert!(
        image_commits(&bare).is_empty(),
        "{:?}",
        image_commits(&bare)
    );

    // Signed by the policy's key: in Git within a few scans, and the `.sig` tag is no image.
    push_signature(&http, &keys, repository, &digest, &digest, "cosign.key").await;
    support::eventually("1.1.0 in Git", Duration::from_secs(30), || {
        let (bare, second) = (bare.clone(), second.clone());
        async move { (image_in_git(&bare) == second).then_some(()) }
    })
    .await;
    support::let_time_pass("three more scans", Duration::from_secs(3)).await;
    assert_eq!(image_commits(&bare).len(), 1, "{:?}", image_commits(&bare));
    agent.kill();
}
