//! The webhook listener (axum): one route per Git host under `/hooks/`. A verified push to the
//! tracked branch queues a wake-up for the source; everything else is acknowledged and changes
//! nothing. Answers: 202 once verified, 401 for a bad or missing signature, 413 above the body
//! limit, 400 for a body that is not JSON, 503 when the wake-up queue is full.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use tokio::sync::mpsc;

use super::webhook::{GitHost, HookEvent, parse_event, verify};
use crate::telemetry::Metrics;

/// A reason for the source to look at the remote now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wake {
    pub host: GitHost,
    /// The new tip the host announced, if it did.
    pub after: Option<String>,
}

/// How the listener checks requests.
#[derive(Clone, Debug)]
pub struct HookSettings {
    /// File holding the shared secret; read on every request, so a mounted Secret can rotate.
    pub secret_file: PathBuf,
    /// The tracked branch; pushes to others are ignored.
    pub branch: String,
    /// Larger bodies get 413 before anything is read into memory.
    pub max_body_bytes: usize,
}

#[derive(Clone)]
struct HookState {
    settings: Arc<HookSettings>,
    wake: mpsc::Sender<Wake>,
    metrics: Arc<Metrics>,
}

/// The `/hooks/*` routes. Wake-ups go to `wake`; a full queue answers 503.
pub fn router(settings: HookSettings, wake: mpsc::Sender<Wake>, metrics: Arc<Metrics>) -> Router {
    let limit = settings.max_body_bytes;
    let state = HookState {
        settings: Arc::new(settings),
        wake,
        metrics,
    };
    let mut router = Router::new();
    for host in GitHost::ALL {
        router = router.route(
            &format!("/hooks/{}", host.name()),
            post(
                move |state: State<HookState>, headers: HeaderMap, body: Bytes| {
                    handle(host, state, headers, body)
                },
            ),
        );
    }
    router.layer(DefaultBodyLimit::max(limit)).with_state(state)
}

async fn handle(
    host: GitHost,
    State(state): State<HookState>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let (status, text) = respond(host, &state, &headers, &body).await;
    state.metrics.webhook(host.name(), status.as_str());
    (status, text)
}

async fn respond(
    host: GitHost,
    state: &HookState,
    headers: &HeaderMap,
    body: &Bytes,
) -> (StatusCode, String) {
    let secret = match tokio::fs::read(&state.settings.secret_file).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(file = %state.settings.secret_file.display(), error = %e, "cannot read the webhook secret");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "webhook secret unavailable\n".into(),
            );
        }
    };
    let secret = secret.trim_ascii();
    if let Err(refusal) = verify(host, headers, body, secret) {
        tracing::warn!(
            host = host.name(),
            reason = refusal.label(),
            "webhook refused"
        );
        return (StatusCode::UNAUTHORIZED, format!("{refusal}\n"));
    }
    let event = match parse_event(host, headers, body) {
        Ok(e) => e,
        Err(refusal) => return (StatusCode::BAD_REQUEST, format!("{refusal}\n")),
    };
    if !event.touches_branch(&state.settings.branch) {
        let what = match &event {
            HookEvent::Ping => "ping".to_string(),
            HookEvent::Other(e) => format!("event {e:?}"),
            HookEvent::Push(_) => "push to another ref".to_string(),
        };
        tracing::debug!(
            host = host.name(),
            what,
            "webhook acknowledged; nothing to do"
        );
        return (StatusCode::ACCEPTED, format!("ignored: {what}\n"));
    }
    let after = match &event {
        HookEvent::Push(refs) => refs.iter().find_map(|r| r.after.clone()),
        _ => None,
    };
    match state.wake.try_send(Wake { host, after }) {
        Ok(()) => (StatusCode::ACCEPTED, "accepted\n".into()),
        Err(mpsc::error::TrySendError::Full(_)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "busy: a fetch is already queued; retry later\n".into(),
        ),
        Err(mpsc::error::TrySendError::Closed(_)) => {
            (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into())
        }
    }
}

/// Takes one wake-up and every other already queued, so a burst of pushes costs one fetch.
pub async fn next_coalesced(wake: &mut mpsc::Receiver<Wake>) -> Option<Vec<Wake>> {
    let first = wake.recv().await?;
    let mut all = vec![first];
    while let Ok(more) = wake.try_recv() {
        all.push(more);
    }
    Some(all)
}
