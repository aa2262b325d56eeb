//! The notifications waiting for their receivers, kept in the cluster so that a restart (or
//! a new leader) still sends them: a ConfigMap `linnet-notifications-<source>` in the agent's
//! namespace, one JSON line per notification with its receiver's name. Written a second after
//! what waits changes, and only then; bounded by the queues ([`super::send::QUEUE`] each) and
//! by [`MAX_BYTES`] in all. A notification sent just before a `kill -9` may be sent again
//! after it (at least once, never lost within the bounds).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use super::events::{Event, Notice};

/// What each receiver has waiting, by receiver name.
pub type Waiting = BTreeMap<String, Vec<Notice>>;

/// The most the ConfigMap holds; past it the newest lines are left out.
pub const MAX_BYTES: usize = 512 * 1024;
/// How long a change waits for the next before it is written.
const SETTLE: Duration = Duration::from_secs(1);
/// The key of the ConfigMap's data.
const KEY: &str = "waiting";

#[derive(Serialize, Deserialize)]
struct Stored {
    receiver: String,
    event: Event,
    kind: String,
    namespace: String,
    name: String,
    phase: String,
    image: String,
    message: String,
    #[serde(default)]
    revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image_source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    evidence: Option<String>,
}

fn config_map_name(source: &str) -> String {
    format!("linnet-notifications-{source}")
}

/// The ConfigMap's text for `waiting`: deterministic, at most [`MAX_BYTES`].
pub fn encode(waiting: &Waiting) -> String {
    let mut out = String::new();
    // The evidence (up to 4,000 characters a notice) gets half: past it a notice is kept
    // without its evidence, never left out for it.
    let mut evidence_left = MAX_BYTES / 2;
    for (receiver, notices) in waiting {
        for n in notices {
            let evidence = n.evidence.clone().filter(|e| e.len() <= evidence_left);
            evidence_left -= evidence.as_ref().map_or(0, String::len);
            let line = serde_json::to_string(&Stored {
                receiver: receiver.clone(),
                event: n.event,
                kind: n.kind.to_string(),
                namespace: n.namespace.clone(),
                name: n.name.clone(),
                phase: n.phase.clone(),
                image: n.image.clone(),
                message: n.message.clone(),
                revision: n.revision.clone(),
                image_source: n.image_source.clone(),
                evidence,
            })
            .unwrap_or_default();
            if out.len() + line.len() + 1 > MAX_BYTES {
                return out;
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// What `text` holds, by receiver; lines that do not read (or name a kind linnet does not
/// have) are skipped.
pub fn decode(text: &str) -> Waiting {
    let mut out = Waiting::new();
    for line in text.lines().take(MAX_BYTES / 64) {
        let Ok(s) = serde_json::from_str::<Stored>(line) else {
            continue;
        };
        let kind = match s.kind.as_str() {
            "CanaryStatefulSet" => "CanaryStatefulSet",
            "CanaryDeployment" => "CanaryDeployment",
            _ => continue,
        };
        out.entry(s.receiver).or_default().push(Notice {
            event: s.event,
            kind,
            namespace: s.namespace,
            name: s.name,
            phase: s.phase,
            image: s.image,
            message: s.message,
            revision: s.revision,
            image_source: s.image_source,
            evidence: s.evidence,
        });
    }
    out
}

/// Where the waiting notifications are kept.
#[derive(Clone)]
pub struct Store {
    pub client: Client,
    pub namespace: String,
    pub source: String,
}

impl Store {
    /// What waited when the agent last stopped; nothing if it cannot be read (said in the log).
    pub async fn load(&self) -> (Waiting, Option<String>) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let name = config_map_name(&self.source);
        match tokio::time::timeout(Duration::from_secs(30), api.get_opt(&name)).await {
            Ok(Ok(Some(cm))) => {
                let text = cm.data.and_then(|mut d| d.remove(KEY)).unwrap_or_default();
                let waiting = decode(&text);
                let n: usize = waiting.values().map(Vec::len).sum();
                if n > 0 {
                    tracing::info!(waiting = n, configmap = %name, "notifications still waiting from before the restart: sending them first");
                }
                (waiting, Some(text))
            }
            Ok(Ok(None)) => (Waiting::new(), None),
            Ok(Err(e)) => {
                tracing::warn!(configmap = %name, error = %crate::error::kube_message(&e), "cannot read the notifications waiting from before the restart; they are not sent");
                (Waiting::new(), None)
            }
            Err(_) => {
                tracing::warn!(configmap = %name, "reading the notifications waiting from before the restart took over 30 s; they are not sent");
                (Waiting::new(), None)
            }
        }
    }

    /// Keeps the ConfigMap as `waiting` says, until its senders are gone. `written` is the
    /// text the ConfigMap holds now.
    pub async fn keep(self, mut waiting: watch::Receiver<Waiting>, mut written: Option<String>) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let name = config_map_name(&self.source);
        let params = PatchParams::apply(crate::api::field_managers::NOTIFICATIONS).force();
        let mut retry = backon::BackoffBuilder::build(crate::retry::notify_builder());
        let mut failing = false;
        loop {
            if !failing && waiting.changed().await.is_err() {
                return;
            }
            tokio::time::sleep(SETTLE).await;
            let text = encode(&waiting.borrow_and_update());
            if written.as_deref() == Some(text.as_str()) || (written.is_none() && text.is_empty()) {
                failing = false;
                continue;
            }
            let object = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": self.namespace,
                    "labels": {"app.kubernetes.io/managed-by": "linnet"}},
                "data": {KEY: text},
            });
            let wrote = tokio::time::timeout(
                Duration::from_secs(30),
                api.patch(&name, &params, &Patch::Apply(&object)),
            )
            .await;
            match wrote {
                Ok(Ok(_)) => {
                    if failing {
                        tracing::info!(configmap = %name, "waiting notifications kept again");
                    }
                    written = Some(text);
                    failing = false;
                    retry = backon::BackoffBuilder::build(crate::retry::notify_builder());
                }
                failed => {
                    let why = match failed {
                        Ok(Err(e)) => crate::error::kube_message(&e),
                        _ => "no answer within 30 s".into(),
                    };
                    let wait = retry.next().unwrap_or(crate::retry::NOTIFY_BACKOFF_MAX);
                    if !failing {
                        tracing::warn!(configmap = %name, error = %why, retry_in = ?wait, "cannot keep the waiting notifications for a restart; retrying with backoff");
                    }
                    failing = true;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(name: &str, message: &str) -> Notice {
        Notice {
            event: Event::RolledBack,
            kind: "CanaryDeployment",
            namespace: "prod".into(),
            name: name.into(),
            phase: "RolledBack".into(),
            image: "web:v2".into(),
            message: message.into(),
            revision: Some("abc".into()),
            image_source: None,
            evidence: None,
        }
    }

    /// Regression (issue 75): a notice's evidence is up to 4,000 characters; a hundred of them
    /// for each of two receivers would have filled the ConfigMap, and notices would have been
    /// left out. The evidence gets half of it; past that, notices are kept without.
    #[test]
    fn long_evidence_never_crowds_out_a_notice() {
        let with_evidence = |i: usize| {
            let mut n = notice(&format!("web-{i}"), "m");
            n.evidence = Some("e".repeat(4000));
            n
        };
        let waiting: Waiting = ["chat", "hook"]
            .into_iter()
            .map(|r| (r.to_string(), (0..100).map(with_evidence).collect()))
            .collect();
        let text = encode(&waiting);
        assert!(text.len() <= MAX_BYTES);
        let back = decode(&text);
        assert_eq!(back.values().map(Vec::len).sum::<usize>(), 200);
        let kept = back
            .values()
            .flatten()
            .filter(|n| n.evidence.is_some())
            .count();
        assert_eq!(kept, MAX_BYTES / 2 / 4000);
    }

    #[test]
    fn what_waits_reads_back_as_it_was() {
        let waiting = Waiting::from([
            (
                "chat".to_string(),
                vec![notice("web", "a\nb"), notice("api", "c")],
            ),
            ("pager".to_string(), vec![notice("web", "d")]),
        ]);
        let text = encode(&waiting);
        assert_eq!(text.lines().count(), 3);
        assert_eq!(decode(&text), waiting);
    }

    #[test]
    fn unreadable_lines_and_unknown_kinds_are_skipped_and_the_text_is_bounded() {
        let mut text = encode(&Waiting::from([(
            "chat".to_string(),
            vec![notice("web", "ok")],
        )]));
        text.push_str("not json\n");
        text.push_str(&text.replace("CanaryDeployment", "Pod"));
        assert_eq!(decode(&text)["chat"].len(), 1);
        let huge = Waiting::from([(
            "chat".to_string(),
            (0..100)
                .map(|i| notice(&format!("w{i}"), &"x".repeat(10_000)))
                .collect(),
        )]);
        let text = encode(&huge);
        assert!(text.len() <= MAX_BYTES);
        assert_eq!(decode(&text)["chat"].len(), text.lines().count());
    }
}
