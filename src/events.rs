//! Kubernetes events, published with kube-runtime's `Recorder`, one per bucket of the objects
//! they are about.
//!
//! The Recorder folds a repeated event into a series, from a cache of the events it published
//! in the last six minutes, and drops the expired ones from the whole cache at every publish.
//! With one Recorder, an event's cost grows with the events published lately: at 10,000
//! rollouts, 4 % of the agent's CPU for a one-file push, and a first sync that is quadratic in
//! the rollouts. A series is kept per object (`regarding`), so a Recorder per bucket of objects
//! keeps every series whole while each publish looks only at its own bucket's cache. A bucket
//! that has been quiet for longer than the cache keeps events gets an empty Recorder at the
//! next publish anywhere, as one Recorder's sweep emptied it.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// How many Recorders share the events: about 40 rollouts each at 10,000.
const BUCKETS: usize = 256;

/// After this long without a publish, every entry of a bucket's cache has expired
/// (kube-runtime keeps an event for 6 minutes; one more for clocks).
const IDLE: Duration = Duration::from_secs(7 * 60);

/// Publishes events, each through the Recorder of its object's bucket.
#[derive(Clone)]
pub struct EventRecorders {
    client: Client,
    reporter: Reporter,
    buckets: Arc<Vec<Mutex<Bucket>>>,
}

struct Bucket {
    recorder: Recorder,
    /// The last publish through `recorder`; `None` while its cache is empty.
    last_publish: Option<Instant>,
}

/// Who reports linnet's events: the controller `linnet`, this pod (`POD_NAME`) if known.
pub fn reporter() -> Reporter {
    Reporter {
        controller: "linnet".into(),
        instance: std::env::var("POD_NAME").ok(),
    }
}

impl EventRecorders {
    pub fn new(client: Client, reporter: Reporter) -> EventRecorders {
        let buckets = (0..BUCKETS)
            .map(|_| {
                Mutex::new(Bucket {
                    recorder: Recorder::new(client.clone(), reporter.clone()),
                    last_publish: None,
                })
            })
            .collect();
        EventRecorders {
            client,
            reporter,
            buckets: Arc::new(buckets),
        }
    }

    /// Publishes `event` on `regarding`: created, or counted up in its series when the same
    /// event was published on the same object within the last six minutes.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Instant::now();
        let recorder = {
            let mut bucket = self.buckets[bucket(regarding)]
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            bucket.last_publish = Some(now);
            bucket.recorder.clone()
        };
        self.forget_idle(now);
        recorder.publish(event, regarding).await
    }

    /// Publishes a Normal or Warning event with `reason` and `message` (its first 1,000
    /// characters) on `object`; a failure to publish is logged, never fatal.
    pub async fn publish_note(
        &self,
        object: &ObjectReference,
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(message.chars().take(1000).collect()),
            action: event_action(message),
            secondary: None,
        };
        if let Err(e) = self.publish(&event, object).await {
            log_unpublished(&e, reason);
        }
    }

    /// Publishes an event exactly once, across restarts and replicas: its name comes from
    /// `key`, what the event was decided from. The same decision made again (by the next
    /// leader after a `kill -9` between publishing and writing the status) makes the same
    /// name, and the API server refuses the second (409). The Recorder cannot: it names an
    /// event by the time it is published. A failure to publish is logged, never fatal.
    pub async fn publish_once(
        &self,
        regarding: &ObjectReference,
        key: &[u8],
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        use kube::api::{Api, PostParams};
        let event = decided_event(&self.reporter, regarding, key, warning, reason, message);
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(
            self.client.clone(),
            regarding.namespace.as_deref().unwrap_or("default"),
        );
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(reason, "event already published by an earlier reconcile");
            }
            Err(e) => log_unpublished(&e, reason),
        }
    }

    /// Empties the caches of the buckets idle for [`IDLE`], as one Recorder's sweep emptied
    /// them at any publish: a bucket sweeps only at its own publishes, so a quiet one would
    /// keep its expired events. A new Recorder is made only for a bucket that held events.
    fn forget_idle(&self, now: Instant) {
        for bucket in self.buckets.iter() {
            let Ok(mut bucket) = bucket.try_lock() else {
                continue;
            };
            if bucket.last_publish.is_some_and(|t| is_idle(t, now)) {
                bucket.recorder = Recorder::new(self.client.clone(), self.reporter.clone());
                bucket.last_publish = None;
            }
        }
    }
}

fn log_unpublished(e: &kube::Error, reason: &str) {
    // The object's namespace is going away: nobody will read the event.
    if matches!(e, kube::Error::Api(s) if s.message.contains("is being terminated")) {
        tracing::debug!(reason, "no event: its namespace is being deleted");
        return;
    }
    let error = crate::error::kube_message_hinted(
        e,
        "; linnet's identity may not: grant events.k8s.io in its ClusterRole (deploy/rbac.yaml)",
    );
    tracing::warn!(%error, reason, "could not publish an event");
}

/// The event [`EventRecorders::publish_once`] creates: named `<object>.<16 hex digits>` from
/// the object's uid, `key` and `reason`, and otherwise as the Recorder makes one.
fn decided_event(
    reporter: &Reporter,
    regarding: &ObjectReference,
    key: &[u8],
    warning: bool,
    reason: &str,
    message: &str,
) -> k8s_openapi::api::events::v1::Event {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    for part in [
        regarding.uid.as_deref().unwrap_or_default().as_bytes(),
        key,
        reason.as_bytes(),
    ] {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    let digest = digest.finalize();
    // 253 characters at most: a long object name is cut (names are ASCII), and a cut that
    // ends in `-` or `.` is not a valid name's label.
    let object: String = regarding
        .name
        .as_deref()
        .unwrap_or("linnet")
        .chars()
        .take(200)
        .collect();
    let object = object.trim_end_matches(['-', '.']);
    k8s_openapi::api::events::v1::Event {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{object}.{}", hex::encode(&digest[..8]))),
            namespace: regarding.namespace.clone(),
            ..Default::default()
        },
        action: Some(event_action(message)),
        reason: Some(reason.to_string()),
        note: Some(message.chars().take(1000).collect()),
        event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            jiff::Timestamp::now(),
        )),
        regarding: Some(regarding.clone()),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        type_: Some(if warning { "Warning" } else { "Normal" }.to_string()),
        ..Default::default()
    }
}

/// Whether a bucket last published at `last` holds only expired events at `now`.
fn is_idle(last: Instant, now: Instant) -> bool {
    now.saturating_duration_since(last) > IDLE
}

/// The bucket of an object: the same for the same object for the life of the process.
fn bucket(object: &ObjectReference) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&object.kind, &object.namespace, &object.name).hash(&mut hasher);
    (hasher.finish() % BUCKETS as u64) as usize
}

/// The event's `action`, which with its reason keys the Recorder's series: the same text
/// again counts up one event, and new text (the next canary's image) makes a new event
/// instead of raising the count of one that still shows the first occurrence's text.
pub fn event_action(message: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    message.hash(&mut hasher);
    format!("Reconcile-{:08x}", hasher.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(namespace: &str, name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("rollouts.linnet.dev/v1alpha1".into()),
            kind: Some("CanaryStatefulSet".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    #[test]
    fn an_object_keeps_its_bucket_so_its_series_stay_whole() {
        let mut later = rollout("shop", "redis");
        later.uid = Some("b1d4".into());
        later.resource_version = Some("42".into());
        assert_eq!(bucket(&rollout("shop", "redis")), bucket(&later));
    }

    #[test]
    fn a_bucket_is_idle_only_once_its_newest_event_has_expired() {
        let last = Instant::now();
        assert!(!is_idle(last, last));
        assert!(!is_idle(last, last + Duration::from_secs(6 * 60)));
        assert!(is_idle(last, last + IDLE + Duration::from_secs(1)));
        // A clock read before `last` (another thread's) is not idle.
        assert!(!is_idle(last + Duration::from_secs(1), last));
    }

    #[tokio::test]
    async fn a_quiet_bucket_with_events_gets_an_empty_recorder_at_the_next_publish_anywhere() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap_or_default());
        let Ok(client) = Client::try_from(config) else {
            panic!("a client needs no server until it sends");
        };
        let reporter = Reporter {
            controller: "linnet".into(),
            instance: None,
        };
        let recorders = EventRecorders::new(client, reporter);
        let start = Instant::now();
        let at = |i: usize| {
            recorders.buckets[i]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .last_publish
        };
        let set = |i: usize, t: Option<Instant>| {
            recorders.buckets[i]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .last_publish = t;
        };
        set(1, Some(start));
        set(2, Some(start + Duration::from_secs(120)));
        recorders.forget_idle(start + IDLE + Duration::from_secs(60));
        assert_eq!(at(1), None, "idle for 8 minutes: emptied");
        assert_eq!(
            at(2),
            Some(start + Duration::from_secs(120)),
            "6 minutes: kept"
        );
        assert_eq!(at(3), None, "never published: left as it was");
    }

    #[test]
    fn the_same_decision_names_the_same_event_and_another_a_new_one() {
        let reporter = reporter();
        let mut redis = rollout("shop", "redis");
        redis.uid = Some("b1d4".into());
        let name = |object: &ObjectReference, key: &[u8], reason: &str| {
            decided_event(&reporter, object, key, false, reason, "m")
                .metadata
                .name
                .unwrap_or_default()
        };
        let first = name(&redis, b"status 1", "CanaryStarted");
        assert_eq!(first, name(&redis, b"status 1", "CanaryStarted"));
        assert!(first.starts_with("redis.") && first.len() == "redis.".len() + 16);
        assert_ne!(first, name(&redis, b"status 2", "CanaryStarted"));
        assert_ne!(first, name(&redis, b"status 1", "Promoted"));
        // The same name made again after the rollout was deleted and made anew is a new event.
        let mut again = redis.clone();
        again.uid = Some("c2e5".into());
        assert_ne!(first, name(&again, b"status 1", "CanaryStarted"));
        let long = rollout("shop", &"a".repeat(253));
        assert!(name(&long, b"k", "CanaryStarted").len() <= 253);
        // Cut just after a dot or a dash, the name would end a label in one (refused: 422).
        for cut in [".", "-", ".-"] {
            let long = rollout(
                "shop",
                &format!("{}{cut}{}", "a".repeat(200 - cut.len()), "b".repeat(40)),
            );
            let event = name(&long, b"k", "CanaryStarted");
            assert!(
                event.starts_with(&format!("{}.", "a".repeat(200 - cut.len()))),
                "{event}"
            );
            assert!(!event.contains("..") && !event.contains("-."), "{event}");
        }
    }

    #[test]
    fn ten_thousand_rollouts_spread_over_the_buckets() {
        let mut counts = [0usize; BUCKETS];
        for i in 0..10_000 {
            counts[bucket(&rollout("bench", &format!("app-{i:05}")))] += 1;
        }
        let most = counts.iter().max().copied().unwrap_or_default();
        // 39 on average; a bucket several times fuller would bring the cost back.
        assert!(most < 80, "fullest bucket holds {most}");
        assert!(counts.iter().all(|&c| c > 0));
    }
}
