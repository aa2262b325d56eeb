//! One receiver's outbox: its own task and queue, so a slow or failing service holds up
//! nothing but its own notifications. Sends are spaced to the receiver's `perMinute`, a
//! failure that may clear (a network error, 429, 5xx) is tried again with a growing wait,
//! and each outcome is counted in `linnet_notifications_total{receiver,result}`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::config::{Receiver, ReceiverKind};
use super::events::Notice;
use super::payload;
use crate::telemetry::{Metrics, NotifyLabels};
use crate::writeback::pull_request::{PullRequestError, PullRequests};

/// Notifications a receiver may have waiting; more are dropped (and counted).
const QUEUE: usize = 100;
/// Tries of one notification, the first included.
const TRIES: u32 = 5;
/// The wait before the second try; it doubles after each.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest a `Retry-After` is waited for; past it the notification is given up.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The most of an answer read (for the log).
const MAX_ANSWER_BYTES: usize = 4096;

/// Every outcome a receiver's counter can have.
pub const RESULTS: [&str; 7] = [
    "sent",
    "refused",
    "gave_up",
    "dropped",
    "url_file",
    "no_pull_request",
    "no_revision",
];

/// Where a receiver's notifications go.
#[derive(Clone)]
pub enum Target {
    /// An HTTP endpoint whose URL is in the receiver's `urlFile`.
    Http(reqwest::Client),
    /// Comments through the Git host's API.
    PullRequest(Arc<PullRequests>),
}

/// A receiver's queue.
pub struct Outbox {
    pub receiver: Arc<Receiver>,
    tx: mpsc::Sender<Notice>,
    metrics: Arc<Metrics>,
}

impl Outbox {
    /// Starts the receiver's task.
    pub fn start(receiver: Receiver, target: Target, metrics: Arc<Metrics>) -> Outbox {
        let receiver = Arc::new(receiver);
        for result in RESULTS {
            let _ = metrics
                .notifications
                .get_or_create(&labels(&receiver, result));
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(deliver_all(receiver.clone(), target, metrics.clone(), rx));
        Outbox {
            receiver,
            tx,
            metrics,
        }
    }

    /// Queues `notice`; drops it (counted, logged) when the queue is full. Never waits.
    pub fn offer(&self, notice: Notice) {
        if let Err(e) = self.tx.try_send(notice) {
            let n = match &e {
                mpsc::error::TrySendError::Full(n) | mpsc::error::TrySendError::Closed(n) => n,
            };
            tracing::warn!(receiver = %self.receiver.name, event = n.event.as_str(), rollout = %format!("{}/{}", n.namespace, n.name), "notification dropped: {QUEUE} are already waiting for this receiver");
            self.metrics
                .notifications
                .get_or_create(&labels(&self.receiver, "dropped"))
                .inc();
        }
    }
}

fn labels(receiver: &Receiver, result: &str) -> NotifyLabels {
    NotifyLabels {
        receiver: receiver.name.clone(),
        result: result.to_string(),
    }
}

async fn deliver_all(
    receiver: Arc<Receiver>,
    target: Target,
    metrics: Arc<Metrics>,
    mut rx: mpsc::Receiver<Notice>,
) {
    let mut next = tokio::time::Instant::now();
    while let Some(notice) = rx.recv().await {
        tokio::time::sleep_until(next).await;
        next = tokio::time::Instant::now() + receiver.spacing();
        let result = match deliver(&receiver, &target, &notice).await {
            Ok(()) => {
                tracing::info!(receiver = %receiver.name, event = notice.event.as_str(), rollout = %format!("{}/{}", notice.namespace, notice.name), "notification sent");
                "sent"
            }
            Err((result, why)) => {
                tracing::warn!(receiver = %receiver.name, event = notice.event.as_str(), rollout = %format!("{}/{}", notice.namespace, notice.name), error = %why, "notification not sent");
                result
            }
        };
        metrics
            .notifications
            .get_or_create(&labels(&receiver, result))
            .inc();
    }
}

/// Why one try failed, and whether another may do better (and after how long at least).
struct Failed {
    result: &'static str,
    why: String,
    retry: Option<Duration>,
}

async fn deliver(
    receiver: &Receiver,
    target: &Target,
    notice: &Notice,
) -> Result<(), (&'static str, String)> {
    let text = payload::text(receiver, notice);
    let mut wait = FIRST_RETRY;
    for attempt in 1..=TRIES {
        let tried = match target {
            Target::Http(http) => post(http, receiver, notice, &text).await,
            Target::PullRequest(prs) => comment(prs, notice, &text).await,
        };
        let failed = match tried {
            Ok(()) => return Ok(()),
            Err(f) => f,
        };
        match failed.retry {
            Some(after) if attempt < TRIES => {
                tracing::debug!(receiver = %receiver.name, attempt, error = %failed.why, "notification failed; trying again");
                tokio::time::sleep(after.max(wait)).await;
                wait *= 2;
            }
            Some(_) => return Err(("gave_up", failed.why)),
            None => return Err((failed.result, failed.why)),
        }
    }
    Err(("gave_up", "no try left".into()))
}

fn read_secret(path: Option<&std::path::Path>, what: &str) -> Result<String, Failed> {
    let path = path.ok_or_else(|| Failed {
        result: "url_file",
        why: format!("no {what} file"),
        retry: None,
    })?;
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| Failed {
            result: "url_file",
            why: format!(
                "cannot read {what} file {}: {}",
                path.display(),
                crate::error::io_reason(&e)
            ),
            retry: None,
        })
}

async fn post(
    http: &reqwest::Client,
    receiver: &Receiver,
    notice: &Notice,
    text: &str,
) -> Result<(), Failed> {
    let url = read_secret(receiver.url_file.as_deref(), "URL")?;
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(Failed {
            result: "url_file",
            why: "the URL file does not hold an http(s) URL".into(),
            retry: None,
        });
    }
    let body = serde_json::to_vec(&payload::body(receiver, notice, text)).unwrap_or_default();
    let mut request = http
        .post(&url)
        .header("content-type", "application/json")
        .header(payload::EVENT_HEADER, notice.event.as_str());
    if receiver.kind == ReceiverKind::Webhook {
        let key = read_secret(receiver.secret_file.as_deref(), "secret")?;
        let signature = crate::source::webhook::sign_hex(key.as_bytes(), &body);
        request = request.header(payload::SIGNATURE_HEADER, format!("sha256={signature}"));
    }
    // The URL is a secret (it is the credential): never logged, not even in an error.
    let answer = request.body(body).send().await.map_err(|e| Failed {
        result: "gave_up",
        why: format!(
            "cannot reach the receiver: {}",
            crate::net::explain_http(&e).1.replace(&url, "<url>")
        ),
        retry: Some(FIRST_RETRY),
    })?;
    let status = answer.status().as_u16();
    if (200..300).contains(&status) {
        return Ok(());
    }
    let retry_after = answer
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let mut answer = answer;
    let mut read = Vec::new();
    while let Ok(Some(chunk)) = answer.chunk().await {
        read.extend_from_slice(&chunk[..chunk.len().min(MAX_ANSWER_BYTES - read.len())]);
        if read.len() >= MAX_ANSWER_BYTES {
            break;
        }
    }
    let why = format!(
        "the receiver answered {status}: {}",
        crate::text::one_line(&String::from_utf8_lossy(&read), 200)
    );
    let retry = match status {
        429 => match retry_after {
            Some(after) if after > MAX_RETRY_AFTER => None,
            after => Some(after.unwrap_or(FIRST_RETRY)),
        },
        500.. => Some(FIRST_RETRY),
        _ => None,
    };
    Err(Failed {
        result: if retry.is_some() || status == 429 {
            "gave_up"
        } else {
            "refused"
        },
        why,
        retry,
    })
}

async fn comment(prs: &PullRequests, notice: &Notice, text: &str) -> Result<(), Failed> {
    let failed = |e: PullRequestError| Failed {
        result: if e.retryable() { "gave_up" } else { "refused" },
        retry: e.retryable().then_some(FIRST_RETRY),
        why: e.to_string(),
    };
    let revision = notice.revision.as_deref().ok_or_else(|| Failed {
        result: "no_revision",
        why: "the rollout names no Git commit".into(),
        retry: None,
    })?;
    let pr = prs
        .of_commit(revision)
        .await
        .map_err(failed)?
        .ok_or_else(|| Failed {
            result: "no_pull_request",
            why: format!("no pull request brought commit {revision} in"),
            retry: None,
        })?;
    prs.comment(pr.number, &payload::comment(notice, text))
        .await
        .map_err(failed)
}
