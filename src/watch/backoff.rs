//! How the watches wait after errors: each watch backs off on its own, briefly, so that a
//! restarted API server is followed within seconds.
//!
//! kube's `Controller` puts one backoff on all its trigger streams together (up to 30 s, reset
//! after 120 s without errors). Across a kube-apiserver restart every child watch failed and
//! then answered 410 Gone, one error after another, and each paused every trigger for up to
//! 30 s: the controllers acted on nothing for minutes (issue 44). Each stream here carries
//! [`watch_backoff`] and the controller's shared one never waits ([`NoTriggerBackoff`]).

use std::time::Duration;

use kube::runtime::utils::Backoff;

/// The first wait of a watch after an error.
pub const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest wait of a watch between two tries: a restarted API server is seen again
/// within this (and the jitter) of answering.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(4);

/// One watch's backoff: kube's exponential backoff from [`WATCH_BACKOFF_MIN`] to
/// [`WATCH_BACKOFF_MAX`], with jitter, reset by any event (kube's `StreamBackoff` resets it
/// on success).
pub fn watch_backoff() -> kube::runtime::watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(WATCH_BACKOFF_MIN)
        .with_max_delay(WATCH_BACKOFF_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// The controller's backoff over all its trigger streams together: none, since each stream
/// backs off on its own ([`watch_backoff`]); one stream's errors never hold up the others.
pub struct NoTriggerBackoff;

impl Iterator for NoTriggerBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for NoTriggerBackoff {
    fn reset(&mut self) {}
}

/// `stream` (a watcher's) with each `Init` held back until the list that follows it answers:
/// given with the list's first item, dropped when the list fails. kube's watcher says `Init`
/// before it lists, and `StreamBackoff` resets on any `Ok`, so a list that always fails (a
/// 404 for a kind the cluster does not serve) was retried at the first wait for ever, never
/// the longer ones. A reflector still sees `Init` before the list's objects.
pub fn hold_init<K, E>(
    stream: impl futures::Stream<Item = Result<kube::runtime::watcher::Event<K>, E>> + Send,
) -> impl futures::Stream<Item = Result<kube::runtime::watcher::Event<K>, E>> + Send
where
    K: Send,
    E: Send,
{
    use futures::StreamExt;
    use kube::runtime::watcher::Event;
    let mut held = false;
    stream.flat_map(move |item| {
        let out = match item {
            Ok(Event::Init) => {
                held = true;
                Vec::new()
            }
            Err(e) => {
                held = false;
                vec![Err(e)]
            }
            Ok(event) if std::mem::take(&mut held) => vec![Ok(Event::Init), Ok(event)],
            Ok(event) => vec![Ok(event)],
        };
        futures::stream::iter(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_init_whose_list_fails_is_dropped_so_the_backoff_grows() {
        use futures::StreamExt;
        use kube::runtime::watcher::Event;
        let events: Vec<Result<Event<u8>, &str>> = vec![
            Ok(Event::Init),
            Err("404"),
            Ok(Event::Init),
            Err("404"),
            Ok(Event::Init),
            Ok(Event::InitApply(1)),
            Ok(Event::InitDone),
            Ok(Event::Apply(2)),
        ];
        let out: Vec<String> = hold_init(futures::stream::iter(events))
            .map(|e| match e {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitApply(n)) => format!("init-apply {n}"),
                Ok(Event::InitDone) => "init-done".to_string(),
                Ok(Event::Apply(n)) => format!("apply {n}"),
                Ok(Event::Delete(n)) => format!("delete {n}"),
                Err(e) => e.to_string(),
            })
            .collect()
            .await;
        // No Ok between the two failures: kube's StreamBackoff is not reset by them.
        assert_eq!(
            out,
            ["404", "404", "init", "init-apply 1", "init-done", "apply 2"]
        );
    }

    #[test]
    fn a_watch_waits_at_most_a_few_seconds_between_tries() {
        let mut b = watch_backoff();
        let waits: Vec<Duration> = (&mut b).take(20).collect();
        assert!(
            waits.iter().all(|w| *w <= WATCH_BACKOFF_MAX * 2),
            "{waits:?}"
        );
        b.reset();
        assert!(
            b.next().is_some_and(|w| w < WATCH_BACKOFF_MAX),
            "reset starts over"
        );
    }

    #[test]
    fn the_controllers_shared_backoff_never_waits() {
        assert_eq!(NoTriggerBackoff.next(), Some(Duration::ZERO));
    }
}
