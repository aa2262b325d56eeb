//! The Git host's part, for a bare repository: a `post-receive` hook that signs each pushed
//! ref as a GitHub push event (`X-Hub-Signature-256`) and posts it in the background, as a host
//! delivers webhooks after it has accepted the push. Used by the tests, the demo and the bench.
//! Each send is logged as `<commit> <unix seconds>` to `webhooks-sent.log` in the repository
//! (the bench's webhook to revision read starts there).

use std::path::Path;

/// Installs the hook in `bare`, posting to `url` (e.g. `http://127.0.0.1:8080/hooks/github`)
/// with `secret`.
pub fn install_github_push_hook(bare: &Path, secret: &str, url: &str) -> std::io::Result<()> {
    let hook = bare.join("hooks/post-receive");
    std::fs::write(
        &hook,
        format!(
            r#"#!/bin/sh
while read old new ref; do
  body=$(printf '{{"ref":"%s","before":"%s","after":"%s"}}' "$ref" "$old" "$new")
  sig=$(printf '%s' "$body" | openssl dgst -sha256 -hmac '{secret}' | sed 's/^.*= //')
  echo "$new $(date +%s.%N)" >> webhooks-sent.log
  curl -s -o /dev/null -X POST -H 'X-GitHub-Event: push' -H "X-Hub-Signature-256: sha256=$sig" \
    -H 'Content-Type: application/json' --data "$body" {url} >/dev/null 2>&1 &
done
"#
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755))
}

/// The body of a GitHub push event for `refs/heads/main` of `acme/gitops`, at `after`.
#[allow(dead_code)] // the tests' own webhooks; the demo and the bench include this file too
pub fn github_push_body(after: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "ref": "refs/heads/main",
        "after": after,
        "repository": {"full_name": "acme/gitops"},
    }))
    .unwrap()
}
