//! One receiver's outbox: its own task and [`Queue`], so a slow or failing service holds up
//! nothing but its own notifications. Sends are spaced to the receiver's `perMinute`; a
//! failure that may clear (a network error, 429, 5xx) is tried again with backoff until it
//! goes through, holding up only its rollout's later notifications; each outcome is counted
//! in `linnet_notifications_total{receiver,result}`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::config::{Receiver, ReceiverKind};
use super::events::Notice;
use super::payload;
use super::persist::Waiting;
use super::queue::{Failure, Offered, Queue};
use crate::telemetry::{Metrics, NotifyLabels};
use crate::writeback::pull_request::{PullRequestError, PullRequests};

/// Notifications a receiver may have waiting; past it the oldest of the busiest rollout is
/// dropped (and counted).
pub const QUEUE: usize = 100;
/// Offers not yet taken into the queue (the task takes them between tries).
const OFFERS: usize = 1000;
/// The wait asked for after a failure that gives no `Retry-After`: the lane's backoff decides.
const NO_WAIT: Duration = Duration::ZERO;
/// The longest a `Retry-After` is waited for; past it the lane's backoff decides.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The most of an answer read (for the log).
const MAX_ANSWER_BYTES: usize = 4096;

/// Every outcome a receiver's counter can have.
pub const RESULTS: [&str; 7] = [
    "sent",
    "refused",
    "retried",
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
    /// Starts the receiver's task, with `stored` (waiting when the agent last stopped) first;
    /// `waiting` is told what waits after each change.
    pub fn start(
        receiver: Receiver,
        target: Target,
        metrics: Arc<Metrics>,
        stored: Vec<Notice>,
        waiting: Arc<tokio::sync::watch::Sender<Waiting>>,
    ) -> Outbox {
        let receiver = Arc::new(receiver);
        for result in RESULTS {
            let _ = metrics
                .notifications
                .get_or_create(&labels(&receiver, result));
        }
        let (tx, rx) = mpsc::channel(OFFERS);
        let mut queue = Queue::new(QUEUE);
        let now = clock_now();
        for notice in stored {
            queue.offer(notice, now);
        }
        let attempt = {
            let receiver = receiver.clone();
            move |notice: Notice| {
                let (receiver, target) = (receiver.clone(), target.clone());
                async move { try_once(&receiver, &target, &notice).await }
            }
        };
        crate::liveness::spawn(
            "notification delivery",
            deliver_all(
                receiver.clone(),
                attempt,
                metrics.clone(),
                rx,
                queue,
                waiting,
            ),
        );
        Outbox {
            receiver,
            tx,
            metrics,
        }
    }

    /// Hands `notice` to the receiver's task; never waits (past [`OFFERS`] not yet taken, it
    /// is dropped and counted).
    pub fn offer(&self, notice: Notice) {
        if let Err(e) = self.tx.try_send(notice) {
            let n = match &e {
                mpsc::error::TrySendError::Full(n) | mpsc::error::TrySendError::Closed(n) => n,
            };
            tracing::warn!(receiver = %self.receiver.name, event = n.event.as_str(), rollout = %format!("{}/{}", n.namespace, n.name), "notification dropped: {OFFERS} are already on their way to this receiver's queue");
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

/// Publishes what waits for receiver `name` (for `/status` and the dashboard), when it
/// changed.
fn publish_waiting(waiting: &tokio::sync::watch::Sender<Waiting>, name: &str, queue: &Queue) {
    waiting.send_if_modified(|all| {
        let now: Vec<Notice> = queue.waiting().cloned().collect();
        let before = all.get(name).map_or(&[][..], Vec::as_slice);
        if before == now.as_slice() {
            return false;
        }
        if now.is_empty() {
            all.remove(name);
        } else {
            all.insert(name.to_string(), now);
        }
        true
    });
}

/// Now, on tokio's clock (paused in tests), as the [`Queue`]'s `Instant`.
fn clock_now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// The receiver's task: takes offers into its [`Queue`], and tries the notification due
/// first (with `attempt`), spaced to `perMinute`. A failure that may clear backs off its
/// rollout's lane only.
async fn deliver_all<F, Fut>(
    receiver: Arc<Receiver>,
    attempt: F,
    metrics: Arc<Metrics>,
    mut rx: mpsc::Receiver<Notice>,
    mut queue: Queue,
    waiting: Arc<tokio::sync::watch::Sender<Waiting>>,
) where
    F: Fn(Notice) -> Fut,
    Fut: std::future::Future<Output = Result<(), Failed>>,
{
    let count = |result: &str| {
        metrics
            .notifications
            .get_or_create(&labels(&receiver, result))
            .inc();
    };
    let mut next_send = tokio::time::Instant::now();
    let heartbeat =
        crate::liveness::process().register(format!("notifications to {}", receiver.name));
    let mut idle_beat = tokio::time::interval(crate::liveness::IDLE_BEAT);
    idle_beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        heartbeat.beat();
        crate::liveness::hang_if_asked("notifications").await;
        publish_waiting(&waiting, &receiver.name, &queue);
        let due = queue
            .next_due()
            .map(|d| tokio::time::Instant::from_std(d).max(next_send));
        tokio::select! {
            _ = idle_beat.tick() => {}
            offered = rx.recv() => {
                let Some(notice) = offered else { return };
                if let Offered::Dropped(n) = queue.offer(notice, clock_now()) {
                    tracing::warn!(receiver = %receiver.name, event = n.event.as_str(), rollout = %format!("{}/{}", n.namespace, n.name), "notification dropped: {QUEUE} are waiting for this receiver; the oldest of the busiest rollout goes");
                    count("dropped");
                }
            }
            () = sleep_until(due), if due.is_some() => {
                let Some((lane, notice)) = queue.due(clock_now()) else { continue };
                next_send = tokio::time::Instant::now() + receiver.spacing();
                let rollout = format!("{}/{}", notice.namespace, notice.name);
                let event = notice.event.as_str();
                let now = clock_now;
                match attempt(notice.clone()).await {
                    Ok(()) => {
                        match queue.sent(&lane, now()) {
                            0 => tracing::info!(receiver = %receiver.name, event, %rollout, "notification sent"),
                            failed => tracing::info!(receiver = %receiver.name, event, %rollout, failed_tries = failed, "notification sent after the receiver failed"),
                        }
                        count("sent");
                    }
                    Err(Failed { retry: Some(after), why, .. }) => match queue.failed(&lane, now(), after) {
                        Failure::GivenUp { tries } => {
                            tracing::warn!(receiver = %receiver.name, event, %rollout, error = %why, tries, "notification given up: the receiver takes others but not this one");
                            count("dropped");
                        }
                        Failure::Retry { wait, tries: 1 } => {
                            tracing::warn!(receiver = %receiver.name, event, %rollout, error = %why, retry_in = ?wait, "notification not sent yet; tried again with backoff until it is (later ones of this rollout wait behind it)");
                            count("retried");
                        }
                        Failure::Retry { wait, tries } => {
                            tracing::debug!(receiver = %receiver.name, event, %rollout, error = %why, retry_in = ?wait, tries, "notification still not sent");
                            count("retried");
                        }
                    },
                    Err(Failed { result, why, .. }) => {
                        tracing::warn!(receiver = %receiver.name, event, %rollout, error = %why, "notification not sent, and not tried again");
                        queue.done(&lane, now());
                        count(result);
                    }
                }
            }
        }
    }
}

async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why one try failed, and whether another may do better (after at least how long).
struct Failed {
    result: &'static str,
    why: String,
    retry: Option<Duration>,
}

/// One try of `notice`.
async fn try_once(receiver: &Receiver, target: &Target, notice: &Notice) -> Result<(), Failed> {
    let text = payload::text(receiver, notice);
    match target {
        Target::Http(http) => post(http, receiver, notice, &text).await,
        Target::PullRequest(prs) => comment(prs, notice, &text).await,
    }
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
        result: "retried",
        why: format!("cannot reach the receiver: {}", unreachable_why(e, &url)),
        retry: Some(NO_WAIT),
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
        429 => Some(retry_after.unwrap_or(NO_WAIT).min(MAX_RETRY_AFTER)),
        500.. => Some(NO_WAIT),
        _ => None,
    };
    Err(Failed {
        result: if retry.is_some() {
            "retried"
        } else {
            "refused"
        },
        why,
        retry,
    })
}

async fn comment(prs: &PullRequests, notice: &Notice, text: &str) -> Result<(), Failed> {
    let failed = |e: PullRequestError| Failed {
        result: if e.retryable() { "retried" } else { "refused" },
        retry: e.retryable().then_some(NO_WAIT),
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

/// Why the receiver at `url` was not reached, without the URL: reqwest writes the URL as
/// it parsed it (a `/x/../` segment gone), so replacing the text of the file missed it and
/// the secret URL was logged (issue 70); the URL is taken off the error instead.
fn unreachable_why(e: reqwest::Error, url: &str) -> String {
    crate::net::explain_http(&e.without_url())
        .1
        .replace(url, "<url>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::events::Event;
    use tokio::time::Instant;

    fn receiver(per_minute: u32) -> Arc<Receiver> {
        let config = serde_json::json!({"name": "r", "type": "webhook", "perMinute": per_minute});
        Arc::new(serde_json::from_value(config).unwrap())
    }

    fn notice(rollout: &str, event: Event) -> Notice {
        Notice {
            event,
            kind: "CanaryStatefulSet",
            namespace: "ns".into(),
            name: rollout.into(),
            phase: "CanaryActive".into(),
            image: "redis:7.4".into(),
            message: String::new(),
            revision: None,
            image_source: None,
            evidence: None,
        }
    }

    /// Every try, by rollout and event, with its time on the (paused) clock.
    type Tries = Arc<std::sync::Mutex<Vec<(String, Event, Instant)>>>;

    /// Starts a receiver's task whose tries `fail` decides (`Some(after)`: failed, may clear,
    /// not before `after`), with `notices` waiting; returns the tries as they happen.
    fn deliver(
        per_minute: u32,
        notices: Vec<Notice>,
        fail: impl Fn(&Notice, usize) -> Option<Duration> + Send + Sync + 'static,
    ) -> Tries {
        let tries: Tries = Arc::default();
        let seen = tries.clone();
        let fail = Arc::new(fail);
        let attempt = move |n: Notice| {
            let (seen, fail) = (seen.clone(), fail.clone());
            async move {
                let mut all = seen.lock().unwrap();
                let before = all
                    .iter()
                    .filter(|(r, e, _)| *r == n.name && *e == n.event)
                    .count();
                all.push((n.name.clone(), n.event, Instant::now()));
                match fail(&n, before) {
                    None => Ok(()),
                    Some(after) => Err(Failed {
                        result: "retried",
                        why: "503".into(),
                        retry: Some(after),
                    }),
                }
            }
        };
        let mut queue = Queue::new(QUEUE);
        for n in notices {
            queue.offer(n, clock_now());
        }
        let (_tx, rx) = mpsc::channel(1);
        let waiting = Arc::new(tokio::sync::watch::channel(Waiting::default()).0);
        let metrics = Arc::new(Metrics::default());
        tokio::spawn(async move {
            let _keep_open = _tx;
            deliver_all(receiver(per_minute), attempt, metrics, rx, queue, waiting).await
        });
        tries
    }

    fn gaps(tries: &Tries, rollout: &str) -> Vec<Duration> {
        let at: Vec<Instant> = tries
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _, _)| r == rollout)
            .map(|(_, _, t)| *t)
            .collect();
        at.windows(2).map(|w| w[1] - w[0]).collect()
    }

    // On tokio's paused clock (issue 71): minutes of backoff pass in no wall-clock time.
    #[tokio::test(start_paused = true)]
    async fn a_failing_notification_is_tried_again_later_and_later_until_it_goes() {
        let wall = std::time::Instant::now();
        let tries = deliver(600, vec![notice("a", Event::CanaryStarted)], |_, before| {
            (before < 6).then_some(NO_WAIT)
        });
        tokio::time::sleep(Duration::from_secs(600)).await;
        let gaps = gaps(&tries, "a");
        assert_eq!(gaps.len(), 6, "six failures, then sent: {gaps:?}");
        // 1 s doubling, each with up to as much again of jitter, capped at a minute.
        for (k, gap) in gaps.iter().enumerate() {
            let base = Duration::from_secs(1 << k).min(crate::retry::NOTIFY_BACKOFF_MAX);
            assert!(
                *gap >= base && *gap <= base * 2,
                "try {}: {gap:?} after {base:?}",
                k + 2
            );
        }
        assert!(
            wall.elapsed() < Duration::from_secs(5),
            "the clock was not paused"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_is_waited_for_even_when_the_backoff_is_shorter() {
        let tries = deliver(600, vec![notice("a", Event::CanaryStarted)], |_, before| {
            (before == 0).then_some(Duration::from_secs(30))
        });
        tokio::time::sleep(Duration::from_secs(120)).await;
        let gaps = gaps(&tries, "a");
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert!(gaps[0] >= Duration::from_secs(30), "{gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_rollout_holds_up_its_own_later_notifications_and_nobody_elses() {
        let notices = vec![
            notice("a", Event::CanaryStarted),
            notice("a", Event::Promoted),
            notice("b", Event::CanaryStarted),
        ];
        // Rollout a's first notification fails four times; b's goes at once.
        let tries = deliver(600, notices, |n, before| {
            (n.name == "a" && n.event == Event::CanaryStarted && before < 4).then_some(NO_WAIT)
        });
        tokio::time::sleep(Duration::from_secs(300)).await;
        let all = tries.lock().unwrap().clone();
        let when = |rollout: &str, event: Event| {
            all.iter()
                .filter(|(r, e, _)| r == rollout && *e == event)
                .map(|(_, _, t)| *t)
                .collect::<Vec<_>>()
        };
        let (a_started, a_promoted, b_started) = (
            when("a", Event::CanaryStarted),
            when("a", Event::Promoted),
            when("b", Event::CanaryStarted),
        );
        assert_eq!(
            (a_started.len(), a_promoted.len(), b_started.len()),
            (5, 1, 1)
        );
        // b is not held up by a's backoff: it went before a's second try.
        assert!(b_started[0] < a_started[1], "{all:?}");
        // a's later notification waits for its first, in order.
        assert!(a_promoted[0] > a_started[4], "{all:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn sends_are_spaced_to_the_receivers_per_minute() {
        let notices = ["a", "b", "c", "d"]
            .map(|r| notice(r, Event::CanaryStarted))
            .to_vec();
        let tries = deliver(6, notices, |_, _| None);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let at: Vec<Instant> = tries.lock().unwrap().iter().map(|(_, _, t)| *t).collect();
        assert_eq!(at.len(), 4);
        for w in at.windows(2) {
            assert!(w[1] - w[0] >= Duration::from_secs(10), "{at:?}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_receivers_url_is_never_said_even_written_another_way() {
        // Issue 70: a URL file holding `/x/../` was logged at WARN as reqwest normalised it.
        crate::net::install_crypto_provider();
        let url = "http://127.0.0.1:9/x/../hooks/T0KEN-secret-path";
        let e = reqwest::Client::new()
            .post(url)
            .send()
            .await
            .expect_err("port 9 is closed");
        let why = unreachable_why(e, url);
        assert!(!why.contains("T0KEN") && !why.contains("hooks"), "{why}");
        assert!(why.contains("refused") || why.contains("connect"), "{why}");
    }
}
