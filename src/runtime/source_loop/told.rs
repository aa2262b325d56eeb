//! What the source loop tells about its source besides its status: Warning events on the
//! LinnetSource, and a rewritten branch history (a log line, an event and a condition).

use super::SourceLoop;

impl SourceLoop {
    /// Publishes a Warning event about the source on its LinnetSource.
    pub(super) async fn source_event(&self, reason: &str, note: &str) {
        use kube::runtime::events::{Event, EventType};
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(crate::api::API_VERSION.to_string()),
            kind: Some("LinnetSource".into()),
            namespace: Some(self.config.state_namespace.clone()),
            name: Some(self.config.source_name.clone()),
            ..Default::default()
        };
        let note: String = note.chars().take(1000).collect();
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            action: crate::events::event_action(&note),
            note: Some(note),
            secondary: None,
        };
        if let Err(e) = self.events.publish(&event, &reference).await {
            tracing::debug!(error = %e, reason, "could not publish the source's event");
        }
    }

    /// The branch's history was rewritten between `previous` and `tip` (a force push): a
    /// log line, an event and a condition, whether or not the new tip is applied.
    pub(super) async fn history_rewritten(&self, previous: git2::Oid, tip: git2::Oid) {
        let message = format!(
            "the tracked branch was force-pushed: {tip} does not descend from {previous}, the \
             tip before it; {}",
            if self.config.refuse_history_rewrites {
                "not applied (--refuse-history-rewrites)"
            } else {
                "applied as it is (--refuse-history-rewrites refuses it)"
            }
        );
        tracing::warn!(%previous, %tip, "{message}");
        self.source_event("HistoryRewritten", &message).await;
        self.state.update(|s| {
            s.history_rewritten = Some(message);
            s.set_degraded();
        });
    }

    /// A tip that descends from the one before: a rewrite reported earlier is over.
    pub(super) fn history_fast_forward(&self) {
        if self.state.status().history_rewritten.is_some() {
            self.state.update(|s| {
                s.history_rewritten = None;
                s.set_degraded();
            });
        }
    }
}
