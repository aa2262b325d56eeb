//! Traces (issue 71): the spans the agent makes with `tracing` (a webhook, a fetch, a render, a
//! sync, a reconcile, an action, a write-back), exported over OTLP/HTTP when
//! `--otlp-endpoint` is set, and the W3C trace context that ties them into one trace per
//! change: the webhook's context rides the wake-up to the sync, the sync writes it on each
//! rollout it applies (`rollouts.linnet.dev/traceparent`), and the reconciles and write-backs of
//! that rollout take it as their parent. Without an endpoint no context is valid, so nothing
//! is written to the cluster for traces.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The annotation a rollout carries: the W3C `traceparent` of the sync that last applied it.
pub const TRACEPARENT_ANNOTATION: &str = "rollouts.linnet.dev/traceparent";

/// How long one export may take before the batch is dropped (the agent goes on).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why traces cannot be exported.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-endpoint {endpoint}: {reason}")]
pub struct TraceError {
    endpoint: String,
    reason: String,
}

/// The exporter, flushed and stopped when dropped (at the end of `main`).
pub struct Exporter {
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// The OTLP/HTTP exporter for `endpoint` (the collector's base URL, e.g.
/// `http://otel-collector:4318`; `/v1/traces` is added), and the layer that feeds it.
pub fn exporter<S>(
    endpoint: &str,
) -> Result<(impl tracing_subscriber::Layer<S> + use<S>, Exporter), TraceError>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    let error = |reason: String| TraceError {
        endpoint: endpoint.to_string(),
        reason,
    };
    let url = url::Url::parse(endpoint).map_err(|e| error(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(error("give an http:// or https:// URL".into()));
    }
    let traces = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let client = reqwest::blocking::Client::builder()
        .timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| error(e.to_string()))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(traces)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| error(e.to_string()))?;
    let mut resource = opentelemetry_sdk::Resource::builder().with_service_name("linnet");
    if let Ok(pod) = std::env::var("POD_NAME") {
        resource =
            resource.with_attribute(opentelemetry::KeyValue::new("service.instance.id", pod));
    }
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("linnet");
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Ok((
        tracing_opentelemetry::layer().with_tracer(tracer),
        Exporter { provider },
    ))
}

/// A span's trace context, carried to work it causes elsewhere (a wake-up to the sync).
#[derive(Clone)]
pub struct Parent(opentelemetry::Context);

impl std::fmt::Debug for Parent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cx = self.0.span().span_context().clone();
        write!(f, "Parent({}/{})", cx.trace_id(), cx.span_id())
    }
}

impl PartialEq for Parent {
    fn eq(&self, other: &Parent) -> bool {
        self.0.span().span_context() == other.0.span().span_context()
    }
}

impl Eq for Parent {}

impl Parent {
    /// The current span's context, if it is exported (an endpoint is set).
    pub fn current() -> Option<Parent> {
        Parent::of(&tracing::Span::current())
    }

    /// `span`'s context, if it is exported.
    pub fn of(span: &tracing::Span) -> Option<Parent> {
        let cx = span.context();
        cx.span().span_context().is_valid().then_some(Parent(cx))
    }

    /// The context a W3C `traceparent` names, if it reads.
    pub fn from_traceparent(traceparent: &str) -> Option<Parent> {
        let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
        let cx = TraceContextPropagator::new().extract(&carrier);
        cx.span().span_context().is_valid().then_some(Parent(cx))
    }

    /// The trace a rollout's spec was applied in: its [`TRACEPARENT_ANNOTATION`], if it reads.
    pub fn of_annotations(
        annotations: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Option<Parent> {
        Parent::from_traceparent(annotations?.get(TRACEPARENT_ANNOTATION)?)
    }

    /// Makes this context `span`'s parent.
    pub fn adopt(&self, span: &tracing::Span) {
        let _ = span.set_parent(self.0.clone());
    }

    /// As a W3C `traceparent` header value.
    pub fn traceparent(&self) -> Option<String> {
        let mut carrier: HashMap<String, String> = HashMap::new();
        TraceContextPropagator::new().inject_context(&self.0, &mut carrier);
        carrier.remove("traceparent")
    }

    /// The trace's id, 32 hex digits.
    pub fn trace_id(&self) -> String {
        self.0.span().span_context().trace_id().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_to_its_trace() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parent = Parent::from_traceparent(text).unwrap();
        assert_eq!(parent.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent.traceparent().as_deref(), Some(text));
        assert!(Parent::from_traceparent("00-nothing").is_none());
        // Without an exporter no span has a valid context: nothing is written for traces.
        assert!(Parent::current().is_none());
    }
}
