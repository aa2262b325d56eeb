//! Logging, traces and metrics set-up: `tracing` to stderr, as text for people or JSON for
//! collectors, and its spans to an OpenTelemetry collector when asked ([`trace`]).

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
/// With `otlp_endpoint`, spans are exported there too, until the returned exporter is dropped.
pub fn init(
    format: LogFormat,
    default_level: &str,
    otlp_endpoint: Option<&str>,
) -> Result<Option<trace::Exporter>, trace::TraceError> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let (spans, exporter) = match otlp_endpoint {
        Some(endpoint) => {
            let (layer, exporter) = trace::exporter(endpoint)?;
            (Some(layer), Some(exporter))
        }
        None => (None, None),
    };
    let registry = tracing_subscriber::registry().with(filter).with(spans);
    // A second init (tests, embedding) keeps the first subscriber; that is fine.
    // Colour only for a person at a terminal; not in a file or a log collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = match format {
        LogFormat::Text => registry
            .with(fmt::layer().with_ansi(ansi).with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init(),
    };
    Ok(exporter)
}

pub mod classic;
mod fleet_metrics;
mod labels;
pub mod memory;
mod metrics;
mod rollout_series;
pub mod trace;
pub use fleet_metrics::*;
pub use labels::*;
pub use metrics::*;
