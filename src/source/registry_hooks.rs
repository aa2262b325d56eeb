//! `/hooks/registry` (issue 74): a registry says an image was pushed, and the image
//! automation scans at once instead of at its next interval. One route for every registry's
//! shape (distribution's notifications, Harbor, Docker Hub, GitHub's `package` events for
//! GHCR): the body is not needed to act, since a scan reads the tags itself, so it is only read
//! for the log, after the caller is known.
//!
//! Who may call: `Authorization: Bearer <secret>` or `Authorization: <secret>` (what
//! distribution's `endpoints[].headers` and Harbor's "Auth Header" send), checked in constant
//! time before the body is read; or GitHub's `X-Hub-Signature-256` over the body. The secret is
//! the webhook secret (`--webhook-secret-file`). Answers: 202 (a scan is coming; scans
//! coalesce), 401, 408, 413, 503 as for the Git hosts' webhooks.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use serde_json::Value;
use subtle::ConstantTimeEq as _;
use tokio::sync::{Notify, Semaphore};

use super::hooks::{Answer, HookSettings, content_length, usable_secret};
use crate::telemetry::Metrics;

#[derive(Clone)]
struct RegistryHookState {
    settings: Arc<HookSettings>,
    scan: Arc<Notify>,
    metrics: Arc<Metrics>,
    bodies: Arc<Semaphore>,
}

/// The `/hooks/registry` route; a verified call wakes `scan`.
pub fn router(settings: HookSettings, scan: Arc<Notify>, metrics: Arc<Metrics>) -> Router {
    let state = RegistryHookState {
        bodies: Arc::new(Semaphore::new(settings.max_unverified_bodies.max(1))),
        settings: Arc::new(settings),
        scan,
        metrics,
    };
    Router::new()
        .route("/hooks/registry", post(handle))
        .with_state(state)
}

async fn handle(State(state): State<RegistryHookState>, request: Request) -> (StatusCode, String) {
    let (status, text) = respond(&state, request)
        .await
        .unwrap_or_else(|refused| refused);
    state.metrics.webhook("registry", status.as_str());
    (status, text)
}

/// The answer: `Err` for a refusal.
async fn respond(state: &RegistryHookState, request: Request) -> Result<Answer, Answer> {
    let secret = usable_secret(&state.settings).await?;
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let by_token = token_matches(headers, &secret);
    if !by_token && !headers.contains_key("x-hub-signature-256") {
        tracing::debug!("registry webhook refused: no token and no signature");
        return Err((StatusCode::UNAUTHORIZED, "missing or wrong token\n".into()));
    }
    if content_length(headers).is_some_and(|n| n > state.settings.max_body_bytes as u64) {
        return Err((StatusCode::PAYLOAD_TOO_LARGE, "body too large\n".into()));
    }
    let Ok(permit) = state.bodies.clone().try_acquire_owned() else {
        let answer = "busy: too many webhook bodies in flight; retry shortly\n".into();
        return Err((StatusCode::SERVICE_UNAVAILABLE, answer));
    };
    let read = axum::body::to_bytes(body, state.settings.max_body_bytes);
    let body = match tokio::time::timeout(state.settings.body_timeout, read).await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => return Err((StatusCode::PAYLOAD_TOO_LARGE, "body too large\n".into())),
        Err(_) => {
            return Err((
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive in time\n".into(),
            ));
        }
    };
    drop(permit);
    if !by_token {
        let signed = headers
            .get("x-hub-signature-256")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().strip_prefix("sha256="))
            .is_some_and(|sig| super::webhook::hmac_matches(&secret, &body, sig));
        if !signed {
            tracing::debug!("registry webhook refused: bad signature");
            return Err((StatusCode::UNAUTHORIZED, "bad signature\n".into()));
        }
    }
    let named = named_repositories(&body);
    tracing::info!(repositories = ?named, "registry webhook: scanning the image policies now");
    state.scan.notify_one();
    Ok((StatusCode::ACCEPTED, "scan queued\n".into()))
}

/// `Authorization: Bearer <secret>` or `Authorization: <secret>`, compared in constant time.
fn token_matches(headers: &HeaderMap, secret: &[u8]) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let token = value.trim();
    let token = token.strip_prefix("Bearer ").unwrap_or(token).trim();
    bool::from(token.as_bytes().ct_eq(secret))
}

/// The repositories a registry's notification names, for the log: distribution's
/// `events[].target.repository`, Harbor's `event_data.repository.repo_full_name`, Docker
/// Hub's `repository.repo_name`, GitHub's `package.name`. At most 20.
fn named_repositories(body: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let text = |v: &Value| v.as_str().map(str::to_string);
    let mut out: Vec<String> = v
        .get("events")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.pointer("/target/repository").and_then(text))
        .collect();
    for pointer in [
        "/event_data/repository/repo_full_name",
        "/repository/repo_name",
        "/package/name",
    ] {
        out.extend(v.pointer(pointer).and_then(text));
    }
    out.retain(|r| r.len() <= 255);
    out.truncate(20);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_taken_with_or_without_bearer_and_nothing_else() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert!(token_matches(
            &with("Bearer s3cret-s3cret"),
            b"s3cret-s3cret"
        ));
        assert!(token_matches(&with("s3cret-s3cret"), b"s3cret-s3cret"));
        assert!(!token_matches(&with("Bearer s3cret"), b"s3cret-s3cret"));
        assert!(!token_matches(&HeaderMap::new(), b"s3cret-s3cret"));
    }

    #[test]
    fn each_registrys_shape_names_its_repository() {
        let distribution =
            br#"{"events":[{"action":"push","target":{"repository":"team/web","tag":"1.2.0"}}]}"#;
        assert_eq!(named_repositories(distribution), vec!["team/web"]);
        let harbor =
            br#"{"type":"PUSH_ARTIFACT","event_data":{"repository":{"repo_full_name":"lib/web"}}}"#;
        assert_eq!(named_repositories(harbor), vec!["lib/web"]);
        let hub = br#"{"push_data":{"tag":"1"},"repository":{"repo_name":"me/web"}}"#;
        assert_eq!(named_repositories(hub), vec!["me/web"]);
        let github = br#"{"action":"published","package":{"name":"web"}}"#;
        assert_eq!(named_repositories(github), vec!["web"]);
        assert!(named_repositories(b"not json").is_empty());
    }
}
