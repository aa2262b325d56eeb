//! The dashboard's sign-in endpoints (`/api/session`, with `--dashboard-actions`): who is
//! signed in, signing in with a Kubernetes token, signing out. The sessions themselves are
//! [`super::session`]'s.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Shared;
use super::session::{refuse, same_origin, set_cookie, signed_in};

/// `GET /api/session`: who is signed in (and the CSRF token for their requests), and
/// whether actions are on at all.
pub async fn whoami(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Json<Value> {
    let Some(actions) = &shared.actions else {
        return Json(json!({"actions": false, "user": null}));
    };
    let session = actions.sessions.of(&headers, Instant::now());
    Json(json!({
        "actions": true,
        "merge": actions.merge,
        "user": session.as_ref().map(|s| &s.user),
        "csrf": session.as_ref().map(|s| &s.csrf),
    }))
}

/// `POST /api/session` `{"token": …}`: signs in with a Kubernetes token.
pub async fn sign_in(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(actions) = &shared.actions else {
        return refuse(
            StatusCode::NOT_FOUND,
            "actions are off (--dashboard-actions)",
        );
    };
    if !same_origin(&headers) {
        return refuse(
            StatusCode::FORBIDDEN,
            "a sign-in from another site is refused",
        );
    }
    let Some(token) = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["token"].as_str().map(|t| t.trim().to_string()))
        .filter(|t| !t.is_empty())
    else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "send {\"token\": \"<a Kubernetes token>\"}",
        );
    };
    let Ok(_permit) = actions.sign_ins.clone().try_acquire_owned() else {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "too many sign-ins at once; try again",
        );
    };
    let user = match super::access::review_token(&shared.client, &token).await {
        Ok(user) => user,
        Err(why @ super::access::AccessError::NotAuthenticated(_)) => {
            tracing::info!(%why, "dashboard: a sign-in was refused");
            return refuse(StatusCode::UNAUTHORIZED, format!("not signed in: {why}"));
        }
        Err(why) => {
            tracing::warn!(%why, "dashboard: cannot check a sign-in's token");
            return refuse(StatusCode::BAD_GATEWAY, format!("not signed in: {why}"));
        }
    };
    let (id, s) = match actions.sessions.create(user, Instant::now()) {
        Ok(created) => created,
        Err(why) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, why.to_string()),
    };
    tracing::info!(user = %s.user.username, "dashboard: signed in");
    (
        [(header::SET_COOKIE, set_cookie(&id))],
        Json(json!({"user": s.user, "csrf": s.csrf, "merge": actions.merge})),
    )
        .into_response()
}

/// `DELETE /api/session`: signs out.
pub async fn sign_out(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let Some(actions) = &shared.actions else {
        return refuse(
            StatusCode::NOT_FOUND,
            "actions are off (--dashboard-actions)",
        );
    };
    if let Err(refused) = signed_in(&actions.sessions, &headers) {
        return refused.into_response();
    }
    actions.sessions.end(&headers);
    (
        [(header::SET_COOKIE, set_cookie(""))],
        Json(json!({"user": null})),
    )
        .into_response()
}
