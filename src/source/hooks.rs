//! The webhook listener (axum): one route per Git host under `/hooks/`. A verified push to the
//! tracked branch of the tracked repository wakes the source; everything else is acknowledged
//! and changes nothing.
//!
//! Nothing is trusted before the signature holds, and an unauthenticated caller can hold
//! little: GitLab's token header is checked before the body is read; bodies are read only up
//! to the limit, within a timeout, and only a few at once (past that: `503` with
//! `Retry-After`). A verified delivery seen before (by the host's delivery id) wakes nothing.
//! Wake-ups coalesce into the newest one, so a flood costs the source at most one look at the
//! remote at a time, and a push arriving during a flood is never dropped.
//!
//! Answers: 202 once verified, 401 for a bad or missing signature, 408 for a body that did not
//! arrive in time, 413 above the body limit, 400 for a body that is not JSON, 503 (with
//! `Retry-After`) when busy or when the secret is unusable.
//!
//! After a 202, the wake-up reaches the source loop ([`crate::runtime::source_loop`]): it
//! fetches the announced tip (or, for one fetched before, only asks the remote for its tip),
//! parses only the files whose blobs changed, and syncs them.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::sync::{Semaphore, watch};

use super::webhook::{
    GitHost, HookEvent, Refusal, delivery_id, parse_event, same_repository, verify,
};
use crate::telemetry::Metrics;

/// A reason for the source to look at the remote now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wake {
    /// Who sent it; `None` for a look after callers were turned away ([`Waker::missed`]) or
    /// for this agent's own commit to the branch (the image automation's).
    pub host: Option<GitHost>,
    /// The new tip the host announced, if it did.
    pub after: Option<String>,
    /// The webhook's trace context: the sync it leads to is its child.
    pub parent: Option<crate::telemetry::trace::Parent>,
}

/// How the listener checks requests.
#[derive(Clone, Debug)]
pub struct HookSettings {
    /// File holding the shared secret; read on every request, so a mounted Secret can rotate.
    pub secret_file: PathBuf,
    /// The tracked branch; pushes to others are ignored.
    pub branch: String,
    /// Another branch whose pushes wake the agent too (a fleet's status branch, where the
    /// other clusters report).
    pub also_branch: Option<String>,
    /// The tracked repository's URL; pushes a payload says are to another repository are
    /// ignored. `None` checks nothing.
    pub repository_url: Option<String>,
    /// Larger bodies get 413 before anything is read into memory.
    pub max_body_bytes: usize,
    /// How long a body may take to arrive.
    pub body_timeout: Duration,
    /// Bodies read at once before their signature is checked.
    pub max_unverified_bodies: usize,
}

impl HookSettings {
    /// Settings with the shipped limits.
    pub fn new(secret_file: PathBuf, branch: String) -> HookSettings {
        HookSettings {
            secret_file,
            branch,
            also_branch: None,
            repository_url: None,
            max_body_bytes: 4 * 1024 * 1024,
            body_timeout: Duration::from_secs(10),
            max_unverified_bodies: 8,
        }
    }
}

/// The fewest bytes a webhook secret may have.
pub const MIN_SECRET_BYTES: usize = 16;

/// Why a webhook secret is not fit to use, if it is not: empty, too short, or a placeholder
/// from the shipped manifests or the docs.
pub fn secret_problem(secret: &[u8]) -> Option<String> {
    let secret = secret.trim_ascii();
    let text = String::from_utf8_lossy(secret).to_ascii_lowercase();
    if secret.is_empty() {
        return Some("is empty".into());
    }
    if text.contains("replace-with") || text.contains("changeme") || text.contains("change-me") {
        return Some("is a placeholder from the docs or the Helm chart's example values".into());
    }
    if secret.len() < MIN_SECRET_BYTES {
        return Some(format!(
            "has {} bytes, fewer than {MIN_SECRET_BYTES}",
            secret.len()
        ));
    }
    None
}

/// Why the webhook secret cannot be used; the agent does not start.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read {}: {}", file.display(), crate::error::io_reason(.source))]
    Read {
        file: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the webhook secret in {} {problem}; put a long random secret there (for example \
         `openssl rand -hex 32`) and set the same one on the Git host's webhook",
        file.display()
    )]
    Weak {
        file: std::path::PathBuf,
        problem: String,
    },
}

/// Reads the secret file and checks it ([`secret_problem`]); the error says what to do.
pub fn read_secret(file: &Path) -> Result<Vec<u8>, SecretError> {
    let secret = std::fs::read(file).map_err(|source| SecretError::Read {
        file: file.to_path_buf(),
        source,
    })?;
    match secret_problem(&secret) {
        Some(problem) => Err(SecretError::Weak {
            file: file.to_path_buf(),
            problem,
        }),
        None => Ok(secret.trim_ascii().to_vec()),
    }
}

/// The sending half of the wake-ups: the newest replaces any not yet taken.
#[derive(Clone)]
pub struct Waker {
    tx: Arc<watch::Sender<Option<Wake>>>,
    look_scheduled: Arc<AtomicBool>,
}

/// How long after turning a caller away the source looks at the remote; more refusals
/// meanwhile add nothing, so a flood costs at most one look per this interval. Well under a
/// second: a push whose webhook was turned away as a flood ended is applied within a second
/// of its end, the look and the sync included (at 1 s, the last look could come after it).
pub const MISSED_LOOK_DELAY: Duration = Duration::from_millis(500);

impl Waker {
    /// Wakes the source; never blocks and never fails.
    pub fn wake(&self, wake: Wake) {
        self.tx.send_replace(Some(wake));
    }

    /// A caller was turned away (busy); it may have been a Git host with a push, which it
    /// will not send again. The source looks at the remote shortly, once for any number of
    /// refusals, so no push is lost to a flood.
    pub fn missed(&self) {
        if self.look_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let waker = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(MISSED_LOOK_DELAY).await;
            waker.look_scheduled.store(false, Ordering::Release);
            waker.wake(Wake {
                host: None,
                after: None,
                parent: None,
            });
        });
    }
}

/// The receiving half of the wake-ups.
pub struct WakeReceiver(watch::Receiver<Option<Wake>>);

impl WakeReceiver {
    /// Another receiver of the same wake-ups (the fleet loop's).
    pub fn another(&self) -> WakeReceiver {
        WakeReceiver(self.0.clone())
    }

    /// Waits for a wake-up and returns the newest; `None` once every [`Waker`] is gone.
    pub async fn next(&mut self) -> Option<Wake> {
        self.0.changed().await.ok()?;
        self.0.borrow_and_update().clone()
    }

    /// The newest wake-up not yet taken, without waiting.
    pub fn try_next(&mut self) -> Option<Wake> {
        if self.0.has_changed().unwrap_or(false) {
            self.0.borrow_and_update().clone()
        } else {
            None
        }
    }
}

/// A channel of wake-ups that coalesces: it holds only the newest.
pub fn wake_channel() -> (Waker, WakeReceiver) {
    let (tx, rx) = watch::channel(None);
    let waker = Waker {
        tx: Arc::new(tx),
        look_scheduled: Arc::default(),
    };
    (waker, WakeReceiver(rx))
}

/// Delivery ids seen last, so a replayed delivery wakes nothing.
#[derive(Default)]
struct RecentDeliveries {
    order: VecDeque<String>,
    ids: HashSet<String>,
}

const REMEMBERED_DELIVERIES: usize = 1024;

impl RecentDeliveries {
    /// Records `id`; false when it was there already.
    fn first_time(&mut self, id: &str) -> bool {
        if self.ids.contains(id) {
            return false;
        }
        if self.order.len() >= REMEMBERED_DELIVERIES
            && let Some(old) = self.order.pop_front()
        {
            self.ids.remove(&old);
        }
        self.order.push_back(id.to_string());
        self.ids.insert(id.to_string());
        true
    }
}

#[derive(Clone)]
struct HookState {
    settings: Arc<HookSettings>,
    wake: Waker,
    metrics: Arc<Metrics>,
    unverified_bodies: Arc<Semaphore>,
    recent: Arc<Mutex<RecentDeliveries>>,
}

/// The `/hooks/*` routes. Wake-ups go to `wake`.
pub fn router(settings: HookSettings, wake: Waker, metrics: Arc<Metrics>) -> Router {
    let state = HookState {
        unverified_bodies: Arc::new(Semaphore::new(settings.max_unverified_bodies.max(1))),
        settings: Arc::new(settings),
        wake,
        metrics,
        recent: Arc::default(),
    };
    let mut router = Router::new();
    for host in GitHost::ALL {
        router = router.route(
            &format!("/hooks/{}", host.name()),
            post(move |state: State<HookState>, request: Request| handle(host, state, request)),
        );
    }
    router.with_state(state)
}

async fn handle(host: GitHost, State(state): State<HookState>, request: Request) -> Response {
    use tracing::Instrument as _;
    let span = tracing::info_span!(
        "webhook",
        host = host.name(),
        revision = tracing::field::Empty,
        status = tracing::field::Empty
    );
    let (status, text) = respond(host, &state, request)
        .instrument(span.clone())
        .await;
    span.record("status", status.as_u16());
    state.metrics.webhook(host.name(), status.as_str());
    if status == StatusCode::REQUEST_TIMEOUT
        || (status == StatusCode::SERVICE_UNAVAILABLE && text.starts_with("busy"))
    {
        state.wake.missed();
    }
    let mut response = (status, text).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn refused(host: GitHost, refusal: Refusal) -> (StatusCode, String) {
    // Debug, not warn: a flood of forgeries must not become a flood of log lines; the
    // metric linnet_webhook_requests_total{result="401"} counts them.
    tracing::debug!(
        host = host.name(),
        reason = refusal.label(),
        "webhook refused"
    );
    (StatusCode::UNAUTHORIZED, format!("{refusal}\n"))
}

async fn respond(host: GitHost, state: &HookState, request: Request) -> Answer {
    let secret = match usable_secret(&state.settings).await {
        Ok(secret) => secret,
        Err(answer) => return answer,
    };
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let body = match verified_body(host, state, headers, body, &secret).await {
        Ok(body) => body,
        Err(answer) => return answer,
    };
    let delivery = match parse_event(host, headers, &body) {
        Ok(d) => d,
        Err(refusal) => return (StatusCode::BAD_REQUEST, format!("{refusal}\n")),
    };
    drop(body);
    if let Some(answer) = ignored(host, state, headers, &delivery) {
        return answer;
    }
    let tracked = format!("refs/heads/{}", state.settings.branch);
    let after = match &delivery.event {
        HookEvent::Push(refs) => refs
            .iter()
            .filter(|r| r.full_ref == tracked)
            .find_map(|r| r.after.clone())
            .filter(|a| a.len() <= 64 && a.bytes().all(|b| b.is_ascii_hexdigit())),
        _ => None,
    };
    tracing::Span::current().record("revision", after.as_deref());
    state.wake.wake(Wake {
        host: Some(host),
        after,
        parent: crate::telemetry::trace::Parent::current(),
    });
    (StatusCode::ACCEPTED, "accepted\n".into())
}

/// A webhook's answer: its status and body.
pub(super) type Answer = (StatusCode, String);

/// The webhook secret as the file holds it now (so that a rotated Secret is used at once),
/// unless it cannot be read or is unusable: then every webhook is refused.
pub(super) async fn usable_secret(settings: &HookSettings) -> Result<Vec<u8>, Answer> {
    let secret = match tokio::fs::read(&settings.secret_file).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(file = %settings.secret_file.display(), error = %e, "cannot read the webhook secret");
            let answer = "webhook secret unavailable\n".into();
            return Err((StatusCode::SERVICE_UNAVAILABLE, answer));
        }
    };
    // A secret rotated to something unusable must not let everything through.
    if let Some(problem) = secret_problem(&secret) {
        tracing::error!(file = %settings.secret_file.display(), "the webhook secret {problem}; every webhook is refused until it is fixed");
        let answer = "webhook secret unusable\n".into();
        return Err((StatusCode::SERVICE_UNAVAILABLE, answer));
    }
    Ok(secret.trim_ascii().to_vec())
}

/// The body, read within its bounds (size, time, bodies in flight) and verified: GitLab's
/// token before the body is read, the other hosts' signatures of the body.
async fn verified_body(
    host: GitHost,
    state: &HookState,
    headers: &axum::http::HeaderMap,
    body: axum::body::Body,
    secret: &[u8],
) -> Result<axum::body::Bytes, Answer> {
    let settings = &state.settings;
    // GitLab signs nothing: its token is all there is, and it is in a header.
    if host == GitHost::GitLab
        && let Err(refusal) = verify(host, headers, b"", secret)
    {
        return Err(refused(host, refusal));
    }
    // Before reading: a declared length over the limit, and a free slot for the body.
    if content_length(headers).is_some_and(|n| n > settings.max_body_bytes as u64) {
        return Err((StatusCode::PAYLOAD_TOO_LARGE, "body too large\n".into()));
    }
    let Ok(permit) = state.unverified_bodies.clone().try_acquire_owned() else {
        let answer = "busy: too many webhook bodies in flight; retry shortly\n".into();
        return Err((StatusCode::SERVICE_UNAVAILABLE, answer));
    };
    let read = axum::body::to_bytes(body, settings.max_body_bytes);
    let body = match tokio::time::timeout(settings.body_timeout, read).await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => return Err((StatusCode::PAYLOAD_TOO_LARGE, "body too large\n".into())),
        Err(_) => {
            let answer = "the body did not arrive in time\n".into();
            return Err((StatusCode::REQUEST_TIMEOUT, answer));
        }
    };
    // GitLab's token was checked above; the others sign the body.
    if host != GitHost::GitLab
        && let Err(refusal) = verify(host, headers, &body, secret)
    {
        return Err(refused(host, refusal));
    }
    drop(permit);
    Ok(body)
}

/// Why a verified delivery is acknowledged without a look at the remote: a push to another
/// repository or branch, another event, a delivery seen before.
fn ignored(
    host: GitHost,
    state: &HookState,
    headers: &axum::http::HeaderMap,
    delivery: &crate::source::webhook::Delivery,
) -> Option<Answer> {
    let settings = &state.settings;
    // Another repository when the payload names its repository and no name is ours.
    if let Some(url) = &settings.repository_url
        && let Some(other) = delivery.repositories.first()
        && !delivery
            .repositories
            .iter()
            .any(|name| same_repository(url, name))
    {
        let other = crate::text::one_line(other, 100);
        tracing::info!(
            host = host.name(),
            repository = %other,
            "webhook for another repository; ignored (is the secret shared?)"
        );
        let answer = format!("ignored: push to another repository ({other})\n");
        return Some((StatusCode::ACCEPTED, answer));
    }
    let also = settings
        .also_branch
        .as_ref()
        .is_some_and(|b| delivery.event.touches_branch(b));
    if !delivery.event.touches_branch(&settings.branch) && !also {
        let what = match &delivery.event {
            HookEvent::Ping => "ping".to_string(),
            HookEvent::Other(e) => format!("event {:?}", crate::text::one_line(e, 60)),
            HookEvent::Push(_) => "push to another ref".to_string(),
        };
        tracing::debug!(
            host = host.name(),
            what,
            "webhook acknowledged; nothing to do"
        );
        return Some((StatusCode::ACCEPTED, format!("ignored: {what}\n")));
    }
    let id = delivery_id(headers)?;
    let first_time = state
        .recent
        .lock()
        .map(|mut recent| recent.first_time(id))
        .unwrap_or(true);
    if first_time {
        return None;
    }
    tracing::debug!(
        host = host.name(),
        delivery = id,
        "delivery seen before; ignored"
    );
    let answer = "ignored: delivery seen before\n".into();
    Some((StatusCode::ACCEPTED, answer))
}

pub(super) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_short_and_placeholder_secrets_are_refused() {
        assert!(secret_problem(b"").is_some());
        assert!(secret_problem(b"  \n\t ").is_some());
        assert!(secret_problem(b"REPLACE-WITH-A-LONG-RANDOM-SECRET\n").is_some());
        assert!(secret_problem(b"short").is_some());
        assert_eq!(secret_problem(b"0123456789abcdef0123\n"), None);
    }

    #[test]
    fn a_delivery_is_taken_once_and_old_ones_are_forgotten() {
        let mut recent = RecentDeliveries::default();
        assert!(recent.first_time("a"));
        assert!(!recent.first_time("a"));
        for i in 0..REMEMBERED_DELIVERIES {
            recent.first_time(&i.to_string());
        }
        assert!(recent.first_time("a"));
        assert!(recent.ids.len() <= REMEMBERED_DELIVERIES);
    }

    #[tokio::test]
    async fn wake_ups_coalesce_into_the_newest() {
        let (waker, mut rx) = wake_channel();
        assert_eq!(rx.try_next(), None);
        for after in ["a", "b", "c"] {
            waker.wake(Wake {
                host: Some(GitHost::GitHub),
                after: Some(after.into()),
                parent: None,
            });
        }
        assert_eq!(rx.next().await.and_then(|w| w.after).as_deref(), Some("c"));
        assert_eq!(rx.try_next(), None);
    }

    // On tokio's paused clock (issue 71): the half-second debounce is checked without waiting
    // for it.
    #[tokio::test(start_paused = true)]
    async fn many_refusals_are_one_look_a_moment_later() {
        let (waker, mut rx) = wake_channel();
        for _ in 0..100 {
            waker.missed();
        }
        assert_eq!(rx.try_next(), None);
        let wake = tokio::time::timeout(MISSED_LOOK_DELAY * 3, rx.next())
            .await
            .unwrap();
        assert_eq!(
            wake,
            Some(Wake {
                host: None,
                after: None,
                parent: None,
            })
        );
        tokio::time::sleep(MISSED_LOOK_DELAY * 2).await;
        assert_eq!(rx.try_next(), None);
    }
}
