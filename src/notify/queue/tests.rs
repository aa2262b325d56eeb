use std::time::{Duration, Instant};

use super::*;
use crate::notify::events::Event;

fn notice(name: &str, event: Event, image: &str) -> Notice {
    Notice {
        event,
        kind: "CanaryStatefulSet",
        namespace: "prod".into(),
        name: name.into(),
        phase: "CanaryActive".into(),
        image: image.into(),
        message: format!("{name} {image}"),
        revision: None,
        image_source: None,
        evidence: None,
    }
}

/// The wait of a failure that is tried again.
fn retry(f: Failure) -> Duration {
    match f {
        Failure::Retry { wait, .. } => wait,
        Failure::GivenUp { tries } => panic!("given up after {tries} tries"),
    }
}

/// Regression (issue 69): one failing notification held up every later one, of every
/// rollout, for its whole retry schedule; now only its own rollout's wait behind it.
#[test]
fn a_failing_notification_holds_up_only_its_own_rollout() {
    let t0 = Instant::now();
    let mut q = Queue::new(100);
    q.offer(notice("redis", Event::CanaryStarted, "7.4"), t0);
    q.offer(notice("redis", Event::RolledBack, "7.4"), t0);
    q.offer(notice("kafka", Event::CanaryStarted, "3.8"), t0);
    let (lane, head) = q.due(t0).unwrap();
    assert_eq!(head.name, "kafka", "lanes due at once go in key order");
    q.done(&lane, t0);
    let (lane, head) = q.due(t0).unwrap();
    assert_eq!(
        (head.name.as_str(), head.event),
        ("redis", Event::CanaryStarted)
    );
    let wait = retry(q.failed(&lane, t0, Duration::ZERO));
    assert!(wait >= Duration::from_millis(500), "{wait:?}");
    assert_eq!(
        q.due(t0),
        None,
        "redis's RolledBack waits behind its CanaryStarted"
    );
    q.offer(notice("kafka", Event::Promoted, "3.8"), t0);
    assert_eq!(
        q.due(t0).unwrap().1.name,
        "kafka",
        "kafka does not wait for redis"
    );
}

/// Regression (issue 69): a notification was given up after 5 tries (26 s), and never sent
/// when the receiver came back.
#[test]
fn a_failure_that_may_clear_is_tried_again_for_ever_with_capped_backoff() {
    let mut now = Instant::now();
    let mut q = Queue::new(100);
    q.offer(notice("redis", Event::RolledBack, "7.4"), now);
    let mut waits = Vec::new();
    for _ in 0..30 {
        let (lane, _) = q.due(now).expect("still waiting");
        let wait = retry(q.failed(&lane, now, Duration::ZERO));
        waits.push(wait);
        now += wait;
    }
    assert!(
        waits
            .iter()
            .all(|w| *w <= crate::retry::NOTIFY_BACKOFF_MAX * 2)
    );
    assert!(waits[5] > waits[0], "{waits:?}");
    let (lane, n) = q.due(now).unwrap();
    assert_eq!(n.event, Event::RolledBack);
    q.done(&lane, now);
    assert!(q.is_empty());
    // A Retry-After longer than the backoff is waited for.
    q.offer(notice("redis", Event::Promoted, "7.4"), now);
    let (lane, _) = q.due(now).unwrap();
    assert_eq!(
        retry(q.failed(&lane, now, Duration::from_secs(45))),
        Duration::from_secs(45)
    );
}

#[test]
fn success_resets_the_lanes_backoff_and_the_next_goes_at_once() {
    let mut now = Instant::now();
    let mut q = Queue::new(100);
    q.offer(notice("redis", Event::CanaryStarted, "7.4"), now);
    q.offer(notice("redis", Event::Promoted, "7.4"), now);
    for _ in 0..6 {
        let (lane, _) = q.due(now).unwrap();
        now += retry(q.failed(&lane, now, Duration::ZERO));
    }
    let (lane, _) = q.due(now).unwrap();
    q.done(&lane, now);
    let (lane, n) = q.due(now).expect("the next is due at once");
    assert_eq!(n.event, Event::Promoted);
    assert!(retry(q.failed(&lane, now, Duration::ZERO)) <= Duration::from_secs(2));
}

#[test]
fn the_same_news_again_is_coalesced_and_order_is_kept() {
    let now = Instant::now();
    let mut q = Queue::new(100);
    assert_eq!(
        q.offer(notice("redis", Event::CanaryStarted, "7.4"), now),
        Offered::Queued
    );
    let mut again = notice("redis", Event::CanaryStarted, "7.4");
    again.message = "newer".into();
    assert_eq!(q.offer(again, now), Offered::Coalesced);
    assert_eq!(
        q.offer(notice("redis", Event::RolledBack, "7.4"), now),
        Offered::Queued
    );
    assert_eq!(
        q.offer(notice("redis", Event::CanaryStarted, "7.5"), now),
        Offered::Queued
    );
    let order: Vec<(Event, &str, &str)> = q
        .waiting()
        .map(|n| (n.event, n.image.as_str(), n.message.as_str()))
        .collect();
    assert_eq!(
        order,
        vec![
            (Event::CanaryStarted, "7.4", "newer"),
            (Event::RolledBack, "7.4", "redis 7.4"),
            (Event::CanaryStarted, "7.5", "redis 7.5"),
        ]
    );
}

#[test]
fn past_the_cap_the_busiest_rollouts_oldest_news_is_dropped() {
    let now = Instant::now();
    let mut q = Queue::new(3);
    q.offer(notice("kafka", Event::CanaryStarted, "3.8"), now);
    q.offer(notice("redis", Event::CanaryStarted, "7.4"), now);
    q.offer(notice("redis", Event::RolledBack, "7.4"), now);
    let Offered::Dropped(dropped) = q.offer(notice("redis", Event::CanaryStarted, "7.5"), now)
    else {
        panic!("one is dropped past the cap");
    };
    // The busiest rollout's oldest.
    assert_eq!(
        (dropped.name.as_str(), dropped.event),
        ("redis", Event::CanaryStarted)
    );
    assert_eq!(q.len(), 3);
    let names: Vec<&str> = q.waiting().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["kafka", "redis", "redis"]);
}

#[test]
fn a_head_the_receiver_refuses_while_it_takes_others_is_given_up_and_the_lane_goes_on() {
    let mut now = Instant::now();
    let mut q = Queue::new(100);
    q.offer(notice("redis", Event::CanaryStarted, "7.4"), now);
    q.offer(notice("redis", Event::RolledBack, "7.4"), now);
    q.offer(notice("kafka", Event::CanaryStarted, "3.8"), now);
    let redis = lane_of(&notice("redis", Event::CanaryStarted, "7.4"));
    // redis's head fails first; kafka's goes through after.
    now += retry(q.failed(&redis, now, Duration::ZERO));
    let (kafka, _) = q.due(now).unwrap();
    assert_eq!(kafka.2, "kafka");
    assert_eq!(q.sent(&kafka, now), 0);
    let mut given_up = None;
    for _ in 0..POISON_TRIES {
        let (lane, _) = q.due(now).unwrap();
        match q.failed(&lane, now, Duration::ZERO) {
            Failure::Retry { wait, .. } => now += wait,
            Failure::GivenUp { tries } => {
                given_up = Some(tries);
                break;
            }
        }
    }
    assert_eq!(given_up, Some(POISON_TRIES));
    let (_, next) = q.due(now).expect("the lane goes on");
    assert_eq!(next.event, Event::RolledBack);
}

#[test]
fn a_receiver_that_takes_nothing_is_never_given_up_on() {
    let mut now = Instant::now();
    let mut q = Queue::new(100);
    q.offer(notice("redis", Event::RolledBack, "7.4"), now);
    for _ in 0..(POISON_TRIES * 5) {
        let (lane, _) = q.due(now).unwrap();
        now += retry(q.failed(&lane, now, Duration::ZERO));
    }
    assert_eq!(q.len(), 1);
}
