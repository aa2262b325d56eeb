//! Who is signed in to the dashboard (`--dashboard-actions`): a person signs in with a
//! Kubernetes token, which the API server checks (TokenReview); the agent keeps only who they
//! are, in memory, under a random session id sent back as a cookie (HttpOnly, Secure,
//! SameSite=Strict). Every change also needs the session's CSRF token in a header and a
//! same-origin request ([`same_origin`]). A restart signs everyone out.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

pub use super::access::User;

/// The session cookie's name.
pub const COOKIE: &str = "linnet_session";
/// The header that carries the session's CSRF token.
pub const CSRF_HEADER: &str = "x-linnet-csrf";
/// How long a session lasts.
pub const LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// The most sessions kept; the oldest goes first.
const MAX_SESSIONS: usize = 1024;
/// Sign-ins checked at once; more are refused (429) rather than queued.
pub const SIGN_INS_AT_ONCE: usize = 4;

#[derive(Clone, Debug)]
pub struct Session {
    pub user: User,
    pub csrf: String,
    expires: Instant,
}

/// The sessions, in memory. The lock is never held across an await.
#[derive(Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// A new session for `user`: its id (for the cookie) and the session.
    pub fn create(&self, user: User, now: Instant) -> Result<(String, Session), NoRandom> {
        let session = Session {
            user,
            csrf: random_hex()?,
            expires: now + LIFETIME,
        };
        let id = random_hex()?;
        let mut by_id = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        by_id.retain(|_, s| s.expires > now);
        if by_id.len() >= MAX_SESSIONS {
            let oldest = by_id
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                by_id.remove(&oldest);
            }
        }
        by_id.insert(id.clone(), session.clone());
        Ok((id, session))
    }

    /// The session the request's cookie names, if it is live.
    pub fn of(&self, headers: &HeaderMap, now: Instant) -> Option<Session> {
        let id = cookie(headers)?;
        let by_id = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        by_id.get(id).filter(|s| s.expires > now).cloned()
    }

    /// Signs the request's session out.
    pub fn end(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers) {
            let mut by_id = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
            by_id.remove(id);
        }
    }
}

/// The system gave no random bytes: no session can be made.
#[derive(Debug, thiserror::Error)]
#[error("no random bytes for a session id")]
pub struct NoRandom;

/// 32 random bytes in hex, from the TLS library's random source.
fn random_hex() -> Result<String, NoRandom> {
    let mut bytes = [0u8; 32];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| NoRandom)?;
    Ok(hex::encode(bytes))
}

/// The session id in the request's `Cookie` header.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|id| id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `Set-Cookie` value of session `id` (an empty id with no age signs out).
pub fn set_cookie(id: &str) -> String {
    let age = if id.is_empty() { 0 } else { LIFETIME.as_secs() };
    format!("{COOKIE}={id}; Path=/; Max-Age={age}; HttpOnly; Secure; SameSite=Strict")
}

/// Whether a request that changes something comes from the dashboard's own page: a browser
/// sends `Origin` (and `Sec-Fetch-Site`) with every such request, and they must name this
/// host. A request without `Origin` is not a browser's cross-site one; the CSRF token still
/// has to match.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("sec-fetch-site").is_some_and(|s| s != "same-origin") {
        return false;
    }
    let Some(origin) = header("origin") else {
        return true;
    };
    let Some(host) = header("host") else {
        return false;
    };
    let bare = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    bare.is_some_and(|o| o.eq_ignore_ascii_case(host))
}

/// Whether the request's CSRF header is the session's token.
pub fn csrf_matches(headers: &HeaderMap, session: &Session) -> bool {
    use subtle::ConstantTimeEq;
    headers
        .get(CSRF_HEADER)
        .map(|v| v.as_bytes().ct_eq(session.csrf.as_bytes()).into())
        .unwrap_or(false)
}

/// A request refused: its status and why, sent as `{"error": why}`.
pub(super) struct Refusal(pub(super) StatusCode, pub(super) String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

pub(super) fn refuse(status: StatusCode, why: impl Into<String>) -> Response {
    Refusal(status, why.into()).into_response()
}

/// The request's live session, from this site, with its CSRF token; or the refusal.
pub(super) fn signed_in(sessions: &Sessions, headers: &HeaderMap) -> Result<User, Refusal> {
    let Some(s) = sessions.of(headers, Instant::now()) else {
        return Err(Refusal(
            StatusCode::UNAUTHORIZED,
            "sign in first: the page is read-only until you do".into(),
        ));
    };
    if !same_origin(headers) || !csrf_matches(headers, &s) {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            "refused: not from the dashboard's own page (CSRF)".into(),
        ));
    }
    Ok(s.user)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn user(name: &str) -> User {
        User {
            username: name.into(),
            uid: String::new(),
            groups: vec![],
            extra: Default::default(),
        }
    }

    fn with(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_session_is_found_by_its_cookie_until_it_expires_or_ends() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let (id, s) = sessions.create(user("alice"), now).unwrap();
        assert_eq!(id.len(), 64);
        let h = with(&[("cookie", &format!("theme=dark; {COOKIE}={id}"))]);
        assert_eq!(sessions.of(&h, now).unwrap().user.username, "alice");
        assert!(sessions.of(&h, now + LIFETIME).is_none());
        assert!(csrf_matches(&with(&[(CSRF_HEADER, &s.csrf)]), &s));
        assert!(!csrf_matches(&with(&[(CSRF_HEADER, "00")]), &s));
        assert!(!csrf_matches(&HeaderMap::new(), &s));
        sessions.end(&h);
        assert!(sessions.of(&h, now).is_none());
        let forged = with(&[("cookie", &format!("{COOKIE}={}", "a".repeat(64)))]);
        assert!(sessions.of(&forged, now).is_none());
    }

    #[test]
    fn the_oldest_session_goes_when_there_are_too_many() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let (first, _) = sessions.create(user("first"), now).unwrap();
        for i in 1..MAX_SESSIONS {
            sessions
                .create(user("u"), now + Duration::from_millis(i as u64))
                .unwrap();
        }
        let h = with(&[("cookie", &format!("{COOKIE}={first}"))]);
        assert!(sessions.of(&h, now).is_some());
        sessions
            .create(user("last"), now + Duration::from_secs(5))
            .unwrap();
        assert!(sessions.of(&h, now).is_none());
    }

    #[test]
    fn only_a_same_origin_request_may_change_anything() {
        let host = ("host", "dash.example:8443");
        assert!(same_origin(&with(&[
            host,
            ("origin", "https://dash.example:8443")
        ])));
        assert!(same_origin(&with(&[host])));
        assert!(!same_origin(&with(&[
            host,
            ("origin", "https://evil.example")
        ])));
        assert!(!same_origin(&with(&[host, ("origin", "null")])));
        assert!(!same_origin(&with(&[(
            "origin",
            "https://dash.example:8443"
        )])));
        assert!(!same_origin(&with(&[
            host,
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(!same_origin(&with(&[
            host,
            ("sec-fetch-site", "same-site")
        ])));
    }

    #[test]
    fn the_cookie_is_http_only_secure_and_strict() {
        let c = set_cookie("ab");
        for part in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
            assert!(c.contains(part), "{c}");
        }
        assert!(set_cookie("").contains("Max-Age=0"));
    }
}
