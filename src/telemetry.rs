//! Logging and metrics set-up: `tracing` to stderr, as text for people or JSON for collectors.

use clap::ValueEnum;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. `RUST_LOG` overrides `default_level` (e.g. `linnet=debug`).
pub fn init(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let registry = tracing_subscriber::registry().with(filter);
    // A second init (tests, embedding) keeps the first subscriber; that is fine.
    let _ = match format {
        LogFormat::Text => registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init(),
    };
}

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RevisionLabel {
    pub revision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub host: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    pub action: String,
}

/// The agent's metrics, served on `/metrics` in the OpenMetrics text format.
pub struct Metrics {
    pub registry: Registry,
    /// 1 for the revision last synced (the label carries it).
    pub synced_revision: Family<RevisionLabel, Gauge>,
    pub fetch_duration: Histogram,
    pub fetch_errors: Family<ReasonLabel, Counter>,
    pub webhook_requests: Family<WebhookLabels, Counter>,
    pub sync_duration: Histogram,
    pub objects_applied: Family<ActionLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("linnet");
        let synced_revision = Family::<RevisionLabel, Gauge>::default();
        registry.register(
            "source_synced_revision",
            "The Git revision last synced to the cluster (value 1)",
            synced_revision.clone(),
        );
        let fetch_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "git_fetch_duration_seconds",
            "Time to ask the remote for the tip and, when it moved, fetch it",
            fetch_duration.clone(),
        );
        let fetch_errors = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "git_fetch_errors",
            "Failed polls and fetches, by reason",
            fetch_errors.clone(),
        );
        let webhook_requests = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "webhook_requests",
            "Webhook requests by Git host and result",
            webhook_requests.clone(),
        );
        let sync_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "sync_duration_seconds",
            "Time to sync specs to the cluster",
            sync_duration.clone(),
        );
        let objects_applied = Family::<ActionLabel, Counter>::default();
        registry.register(
            "objects_applied",
            "Objects written to the cluster, by action (create, update, prune)",
            objects_applied.clone(),
        );
        Metrics {
            registry,
            synced_revision,
            fetch_duration,
            fetch_errors,
            webhook_requests,
            sync_duration,
            objects_applied,
        }
    }
}

impl Metrics {
    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Counts one webhook request.
    pub fn webhook(&self, host: &str, result: &str) {
        self.webhook_requests
            .get_or_create(&WebhookLabels {
                host: host.to_string(),
                result: result.to_string(),
            })
            .inc();
    }
}
