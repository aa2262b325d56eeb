//! Webhooks from Git hosts: who sent a request, whether its signature holds, and what it
//! asks for. Verification is pure and constant-time; the routes are in [`super::hooks`], served
//! by the runtime's webhook listener.
//!
//! | host | route | check |
//! |---|---|---|
//! | GitHub | `/hooks/github` | `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>` |
//! | GitLab | `/hooks/gitlab` | `X-Gitlab-Token: <secret>` |
//! | Gitea / Forgejo | `/hooks/gitea` | `X-Gitea-Signature` (or `X-Forgejo-Signature`): hex HMAC-SHA256 |
//! | Bitbucket Cloud and Server | `/hooks/bitbucket` | `X-Hub-Signature: sha256=<hex HMAC-SHA256>` |
//! | generic | `/hooks/generic` | `X-Linnet-Signature: sha256=<hex HMAC-SHA256>` |

use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use serde_json::Value;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Which kind of Git host sent a webhook, by its route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GitHost {
    GitHub,
    GitLab,
    Gitea,
    Bitbucket,
    Generic,
}

impl GitHost {
    /// Every host, for routing.
    pub const ALL: [GitHost; 5] = [
        GitHost::GitHub,
        GitHost::GitLab,
        GitHost::Gitea,
        GitHost::Bitbucket,
        GitHost::Generic,
    ];

    /// The label used in routes and metrics.
    pub fn name(self) -> &'static str {
        match self {
            GitHost::GitHub => "github",
            GitHost::GitLab => "gitlab",
            GitHost::Gitea => "gitea",
            GitHost::Bitbucket => "bitbucket",
            GitHost::Generic => "generic",
        }
    }
}

/// Why a webhook was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the signature header is missing")]
    MissingSignature,
    #[error("the signature does not match the configured secret")]
    BadSignature,
    #[error("the body is not JSON")]
    NotJson,
}

impl Refusal {
    /// A stable metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::MissingSignature => "missing_signature",
            Refusal::BadSignature => "bad_signature",
            Refusal::NotJson => "not_json",
        }
    }
}

/// What a verified webhook asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookEvent {
    /// Branches were pushed; each with the new tip when the host says it.
    Push(Vec<PushedRef>),
    /// A test delivery (GitHub `ping`, Bitbucket `diagnostics:ping`, ...).
    Ping,
    /// Any other event; acknowledged and ignored.
    Other(String),
}

/// One ref a push changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushedRef {
    /// The full ref, e.g. `refs/heads/main` or `refs/tags/v1`.
    pub full_ref: String,
    /// The new commit, when the host sends it (absent for a deleted ref).
    pub after: Option<String>,
}

impl HookEvent {
    /// Whether this event moves `branch` (a push to it); tags and other branches do not.
    pub fn touches_branch(&self, branch: &str) -> bool {
        let wanted = format!("refs/heads/{branch}");
        matches!(self, HookEvent::Push(refs) if refs.iter().any(|r| r.full_ref == wanted))
    }
}

type HmacSha256 = Hmac<Sha256>;

/// The lowercase hex HMAC-SHA256 of `body`, as the hosts compute it.
pub fn sign_hex(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match HmacSha256::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Constant-time check of a hex HMAC-SHA256 signature.
pub(super) fn hmac_matches(secret: &[u8], body: &[u8], hex_signature: &str) -> bool {
    let Ok(given) = hex::decode(hex_signature) else {
        return false;
    };
    let Ok(mut mac) = HmacSha256::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    // `verify_slice` compares in constant time.
    mac.verify_slice(&given).is_ok()
}

/// Verifies a request as `host` documents it. Nothing in the body is trusted before this.
pub fn verify(
    host: GitHost,
    headers: &HeaderMap,
    body: &[u8],
    secret: &[u8],
) -> Result<(), Refusal> {
    let prefixed = |name: &str| -> Result<(), Refusal> {
        let value = header(headers, name).ok_or(Refusal::MissingSignature)?;
        let hex_sig = value.strip_prefix("sha256=").ok_or(Refusal::BadSignature)?;
        if hmac_matches(secret, body, hex_sig) {
            Ok(())
        } else {
            Err(Refusal::BadSignature)
        }
    };
    match host {
        GitHost::GitHub => prefixed("x-hub-signature-256"),
        GitHost::Bitbucket => prefixed("x-hub-signature"),
        GitHost::Generic => prefixed("x-linnet-signature"),
        GitHost::Gitea => {
            let value = header(headers, "x-gitea-signature")
                .or_else(|| header(headers, "x-forgejo-signature"))
                .ok_or(Refusal::MissingSignature)?;
            if hmac_matches(secret, body, value) {
                Ok(())
            } else {
                Err(Refusal::BadSignature)
            }
        }
        GitHost::GitLab => {
            let token = header(headers, "x-gitlab-token").ok_or(Refusal::MissingSignature)?;
            if bool::from(token.as_bytes().ct_eq(secret)) {
                Ok(())
            } else {
                Err(Refusal::BadSignature)
            }
        }
    }
}

/// What a verified request asks for, and which repository it says it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub event: HookEvent,
    /// The repository as the payload names it: full names (`owner/name`, GitLab's
    /// `group/sub/name`, Bitbucket Server's `PROJECT/slug`) and URLs (clone, SSH, web); empty
    /// when the payload names none.
    pub repositories: Vec<String>,
}

/// The delivery id a host puts on each request (the same on a redelivery), if any.
pub fn delivery_id(headers: &HeaderMap) -> Option<&str> {
    [
        "x-github-delivery",
        "x-gitea-delivery",
        "x-forgejo-delivery",
        "x-gitlab-event-uuid",
        "x-request-uuid",
        "x-request-id",
        "x-linnet-delivery",
    ]
    .iter()
    .find_map(|name| header(headers, name))
    .filter(|id| !id.is_empty() && id.len() <= 128)
}

/// Whether one name of a payload's repository (see [`Delivery::repositories`]) is the
/// repository at `url`: a URL by its whole path (a host under a relative root such as
/// `/gitlab/` included), a full name by the whole path too. A local path cannot be named by
/// a Git host, so it matches anything.
pub fn same_repository(url: &str, named: &str) -> bool {
    let Some(path) = repository_path(url) else {
        return true;
    };
    if named.contains("://") || (named.contains('@') && named.contains(':')) {
        return repository_path(named).is_some_and(|p| p == path);
    }
    let name = named
        .trim()
        .trim_matches('/')
        .trim_end_matches(".git")
        .to_ascii_lowercase();
    // The whole path: `sub/app` is another project than `group/sub/app`. Bitbucket Server
    // serves its repositories under `scm/`.
    !name.is_empty() && (path == name || path.strip_prefix("scm/") == Some(name.as_str()))
}

/// The path of a remote URL, lowercased, without `.git` (`https://h/a/b.git` -> `a/b`,
/// `git@h:a/b` -> `a/b`); `None` for a local path.
fn repository_path(url: &str) -> Option<String> {
    let rest = if let Some((scheme, rest)) = url.split_once("://") {
        if scheme == "file" {
            return None;
        }
        rest.split_once('/').map(|(_, path)| path)?
    } else if !url.starts_with('/') && !url.starts_with('.') {
        // scp-style: [user@]host:path
        url.split_once(':').map(|(_, path)| path)?
    } else {
        return None;
    };
    Some(
        rest.trim_matches('/')
            .trim_end_matches(".git")
            .to_ascii_lowercase(),
    )
}

fn named_repositories(payload: &Value) -> Vec<String> {
    let str_at = |path: &str| payload.pointer(path).and_then(Value::as_str);
    let mut names: Vec<String> = [
        "/repository/full_name",
        "/repository/clone_url",
        "/repository/ssh_url",
        "/repository/html_url",
        "/repository/links/html/href",
        "/project/path_with_namespace",
        "/project/git_http_url",
        "/project/git_ssh_url",
        "/project/web_url",
    ]
    .iter()
    .filter_map(|p| str_at(p))
    .map(str::to_string)
    .collect();
    // Bitbucket Server / Data Center.
    if let (Some(key), Some(slug)) = (
        str_at("/repository/project/key"),
        str_at("/repository/slug"),
    ) {
        names.push(format!("{key}/{slug}"));
    }
    names
}

/// Reads what a verified request asks for.
pub fn parse_event(host: GitHost, headers: &HeaderMap, body: &[u8]) -> Result<Delivery, Refusal> {
    let payload: Value = serde_json::from_slice(body).map_err(|_| Refusal::NotJson)?;
    let repositories = named_repositories(&payload);
    let event = event_of(host, headers, &payload);
    Ok(Delivery {
        event,
        repositories,
    })
}

fn event_of(host: GitHost, headers: &HeaderMap, payload: &Value) -> HookEvent {
    let event = match host {
        GitHost::GitHub => header(headers, "x-github-event"),
        GitHost::GitLab => header(headers, "x-gitlab-event"),
        GitHost::Gitea => {
            header(headers, "x-gitea-event").or_else(|| header(headers, "x-forgejo-event"))
        }
        GitHost::Bitbucket => header(headers, "x-event-key"),
        GitHost::Generic => Some("push"),
    }
    .unwrap_or("")
    .to_string();
    let str_at =
        |v: &Value, path: &str| v.pointer(path).and_then(Value::as_str).map(str::to_string);
    let simple_push = |payload: &Value| {
        let full_ref = str_at(payload, "/ref").unwrap_or_default();
        let after = str_at(payload, "/after").filter(|a| !a.trim_matches('0').is_empty());
        HookEvent::Push(vec![PushedRef { full_ref, after }])
    };
    match (host, event.as_str()) {
        (GitHost::GitHub, "ping") | (GitHost::Bitbucket, "diagnostics:ping") => HookEvent::Ping,
        (GitHost::GitHub | GitHost::Gitea, "push")
        | (GitHost::GitLab, "Push Hook" | "Tag Push Hook")
        | (GitHost::Generic, _) => simple_push(payload),
        // Bitbucket Cloud: push.changes[].new {type, name, target.hash}.
        (GitHost::Bitbucket, "repo:push") => HookEvent::Push(
            payload
                .pointer("/push/changes")
                .and_then(Value::as_array)
                .map(|changes| {
                    changes
                        .iter()
                        .filter_map(|c| c.get("new").filter(|n| !n.is_null()))
                        .map(|new| {
                            let name = str_at(new, "/name").unwrap_or_default();
                            let kind = if str_at(new, "/type").as_deref() == Some("tag") {
                                "tags"
                            } else {
                                "heads"
                            };
                            PushedRef {
                                full_ref: format!("refs/{kind}/{name}"),
                                after: str_at(new, "/target/hash"),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default(),
        ),
        // Bitbucket Server / Data Center: changes[] {ref.id, toHash}.
        (GitHost::Bitbucket, "repo:refs_changed") => HookEvent::Push(
            payload
                .pointer("/changes")
                .and_then(Value::as_array)
                .map(|changes| {
                    changes
                        .iter()
                        .map(|c| PushedRef {
                            full_ref: str_at(c, "/ref/id")
                                .or_else(|| str_at(c, "/refId"))
                                .unwrap_or_default(),
                            after: str_at(c, "/toHash").filter(|a| !a.trim_matches('0').is_empty()),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        ),
        (_, other) => HookEvent::Other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const SECRET: &[u8] = b"It's a Secret to Everybody";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn github_documented_test_vector() {
        // The example in GitHub's "Validating webhook deliveries" documentation.
        let body = b"Hello, World!";
        assert_eq!(
            sign_hex(SECRET, body),
            "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
        let h = headers(&[(
            "x-hub-signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        )]);
        assert_eq!(verify(GitHost::GitHub, &h, body, SECRET), Ok(()));
    }

    #[test]
    fn every_host_refuses_a_missing_or_wrong_signature() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        for host in GitHost::ALL {
            assert_eq!(
                verify(host, &HeaderMap::new(), body, SECRET),
                Err(Refusal::MissingSignature),
                "{host:?}"
            );
        }
        let bad = "sha256=".to_string() + &"0".repeat(64);
        let cases = [
            (GitHost::GitHub, "x-hub-signature-256", bad.clone()),
            (GitHost::Bitbucket, "x-hub-signature", bad.clone()),
            (GitHost::Generic, "x-linnet-signature", bad.clone()),
            (GitHost::Gitea, "x-gitea-signature", "0".repeat(64)),
            (GitHost::GitLab, "x-gitlab-token", "wrong".into()),
        ];
        for (host, name, value) in cases {
            assert_eq!(
                verify(host, &headers(&[(name, &value)]), body, SECRET),
                Err(Refusal::BadSignature),
                "{host:?}"
            );
        }
    }

    #[test]
    fn every_host_accepts_its_documented_signature() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let sig = sign_hex(SECRET, body);
        let secret = std::str::from_utf8(SECRET).unwrap();
        let cases = [
            (
                GitHost::GitHub,
                "x-hub-signature-256",
                format!("sha256={sig}"),
            ),
            (
                GitHost::Bitbucket,
                "x-hub-signature",
                format!("sha256={sig}"),
            ),
            (
                GitHost::Generic,
                "x-linnet-signature",
                format!("sha256={sig}"),
            ),
            (GitHost::Gitea, "x-gitea-signature", sig.clone()),
            (GitHost::Gitea, "x-forgejo-signature", sig.clone()),
            (GitHost::GitLab, "x-gitlab-token", secret.to_string()),
        ];
        for (host, name, value) in cases {
            assert_eq!(
                verify(host, &headers(&[(name, &value)]), body, SECRET),
                Ok(()),
                "{host:?} {name}"
            );
        }
    }

    #[test]
    fn signature_of_another_body_is_refused() {
        let sig = format!("sha256={}", sign_hex(SECRET, b"original"));
        let h = headers(&[("x-hub-signature-256", &sig)]);
        assert_eq!(
            verify(GitHost::GitHub, &h, b"tampered", SECRET),
            Err(Refusal::BadSignature)
        );
    }

    #[test]
    fn push_events_name_their_branch() {
        let gh = parse_event(
            GitHost::GitHub,
            &headers(&[("x-github-event", "push")]),
            br#"{"ref":"refs/heads/main","after":"abc"}"#,
        )
        .unwrap()
        .event;
        assert!(gh.touches_branch("main"));
        assert!(!gh.touches_branch("dev"));
        let tag = parse_event(
            GitHost::GitLab,
            &headers(&[("x-gitlab-event", "Tag Push Hook")]),
            br#"{"ref":"refs/tags/main","after":"abc"}"#,
        )
        .unwrap()
        .event;
        assert!(!tag.touches_branch("main"));
        let cloud = parse_event(
            GitHost::Bitbucket,
            &headers(&[("x-event-key", "repo:push")]),
            br#"{"push":{"changes":[{"new":{"type":"branch","name":"main","target":{"hash":"abc"}}}]}}"#,
        )
        .unwrap()
        .event;
        assert!(cloud.touches_branch("main"));
        let server = parse_event(
            GitHost::Bitbucket,
            &headers(&[("x-event-key", "repo:refs_changed")]),
            br#"{"changes":[{"ref":{"id":"refs/heads/main","type":"BRANCH"},"toHash":"abc"}]}"#,
        )
        .unwrap()
        .event;
        assert!(server.touches_branch("main"));
    }

    #[test]
    fn ping_and_unknown_events_touch_nothing() {
        let ping = parse_event(
            GitHost::GitHub,
            &headers(&[("x-github-event", "ping")]),
            b"{}",
        )
        .unwrap()
        .event;
        assert_eq!(ping, HookEvent::Ping);
        assert!(!ping.touches_branch("main"));
        let issue = parse_event(
            GitHost::Gitea,
            &headers(&[("x-gitea-event", "issues")]),
            b"{}",
        )
        .unwrap()
        .event;
        assert!(!issue.touches_branch("main"));
    }

    #[test]
    fn the_repository_a_payload_names_is_compared_with_the_remote() {
        let gh = parse_event(
            GitHost::GitHub,
            &headers(&[("x-github-event", "push")]),
            br#"{"ref":"refs/heads/main","repository":{"full_name":"Acme/GitOps"}}"#,
        )
        .unwrap();
        assert_eq!(gh.repositories, vec!["Acme/GitOps"]);
        for url in [
            "https://github.com/acme/gitops.git",
            "https://token@github.com/acme/gitops",
            "git@github.com:acme/gitops.git",
            "ssh://git@github.com/acme/gitops.git",
        ] {
            assert!(same_repository(url, "Acme/GitOps"), "{url}");
            assert!(!same_repository(url, "acme/other"), "{url}");
            assert!(!same_repository(url, "cme/gitops"), "{url}");
        }
        assert!(same_repository(
            "https://gitlab.com/group/sub/app.git",
            "group/sub/app"
        ));
        assert!(!same_repository(
            "https://gitlab.com/group/sub/app.git",
            "sub/app"
        ));
        assert!(same_repository(
            "https://bb.example.com/scm/PROJ/app.git",
            "PROJ/app"
        ));
        // GitLab under a relative root: its full name lacks the root, its URLs have it.
        let gitlab = "https://git.example.com/gitlab/group/app.git";
        assert!(!same_repository(gitlab, "group/app"));
        assert!(same_repository(
            gitlab,
            "https://git.example.com/gitlab/group/app"
        ));
        assert!(same_repository(
            gitlab,
            "git@git.example.com:gitlab/group/app.git"
        ));
        assert!(!same_repository(
            gitlab,
            "https://git.example.com/gitlab/other/app"
        ));
        assert!(same_repository("/srv/git/app.git", "anything/else"));
        assert!(same_repository("file:///srv/git/app.git", "anything/else"));
        let server = parse_event(
            GitHost::Bitbucket,
            &headers(&[("x-event-key", "repo:refs_changed")]),
            br#"{"repository":{"slug":"app","project":{"key":"PROJ"}},"changes":[]}"#,
        )
        .unwrap();
        assert_eq!(server.repositories, vec!["PROJ/app"]);
    }

    #[test]
    fn non_json_body_is_refused() {
        assert_eq!(
            parse_event(GitHost::GitHub, &HeaderMap::new(), b"not json").map(|d| d.event),
            Err(Refusal::NotJson)
        );
    }
}
