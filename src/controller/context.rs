//! What every reconcile shares: the client, the event reporter, and the source whose rollouts
//! this agent runs.

use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Shared by all reconciles of all controllers, as an `Arc`.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    /// The `rollouts.linnet.dev/source` label value this agent syncs; it runs only the
    /// rollouts (and watches only the children) that carry it.
    pub source: String,
}

impl Context {
    pub fn new(client: Client, source: &str) -> Context {
        let reporter = Reporter {
            controller: "linnet".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            source: source.to_string(),
        }
    }

    /// The label selector of this agent's rollouts and their children.
    pub fn selector(&self) -> String {
        format!("{}={}", crate::api::SOURCE_LABEL, self.source)
    }

    /// Publishes an event on `object`; a failure to publish is logged, never fatal.
    pub async fn publish(
        &self,
        object: &k8s_openapi::api::core::v1::ObjectReference,
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
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, object).await {
            tracing::warn!(error = %e, reason, "could not publish an event; check RBAC for events.k8s.io");
        }
    }
}
