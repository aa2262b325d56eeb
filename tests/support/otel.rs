//! A real OpenTelemetry Collector for the trace tests (built from its Go modules by
//! `tests/otel/build.sh`, cached): OTLP/HTTP in from the agent, and out again as OTLP JSON to a
//! small receiver in the test, which keeps every span it is sent.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use super::ports::free_port;

/// The directory with the `otelcol` binary, built on first use.
pub fn otelcol_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(root.join("tests/otel/build.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("tests/otel/build.sh runs (it needs Go)");
        assert!(out.status.success(), "tests/otel/build.sh failed");
        let text = String::from_utf8_lossy(&out.stdout);
        PathBuf::from(text.lines().last().unwrap_or_default())
    })
    .clone()
}

/// One span as the collector exported it.
#[derive(Clone, Debug)]
pub struct Span {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    /// Its string attributes.
    pub attributes: Vec<(String, String)>,
}

/// The collector and the spans it passed on.
pub struct Collector {
    child: Child,
    /// The base URL the agent exports to (`--otlp-endpoint`).
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    _dir: tempfile::TempDir,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Collector {
    /// Starts the receiver and the collector, and waits until the collector listens.
    pub async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let receiver = format!("http://{}", listener.local_addr().unwrap());
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let value: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or_default();
                    kept.lock().unwrap().extend(spans_of(&value));
                    "{}"
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
                 exporters:\n  otlp_http:\n    endpoint: {receiver}\n    encoding: json\n    compression: none\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [otlp_http]\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("otelcol.log")).unwrap();
        let child = Command::new(otelcol_bin().join("otelcol"))
            .arg(format!("--config=file:{}", config.display()))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let endpoint = format!("http://127.0.0.1:{port}");
        super::eventually(
            "the collector listening",
            std::time::Duration::from_secs(30),
            || {
                let url = format!("{endpoint}/v1/traces");
                async move {
                    // An empty export: 200 once the receiver is up.
                    let answer = super::http()
                        .post(url)
                        .header("content-type", "application/json")
                        .body("{}")
                        .send()
                        .await
                        .ok()?;
                    answer.status().is_success().then_some(())
                }
            },
        )
        .await;
        Collector {
            child,
            endpoint,
            spans,
            _dir: dir,
        }
    }

    /// Every span passed on so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The collector's own log, for a failure message.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("otelcol.log")).unwrap_or_default()
    }
}

/// The spans of an OTLP JSON export (`resourceSpans[].scopeSpans[].spans[]`).
fn spans_of(export: &serde_json::Value) -> Vec<Span> {
    let text = |v: &serde_json::Value, key: &str| {
        v.get(key)
            .and_then(|s| s.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let mut out = Vec::new();
    for resource in export["resourceSpans"].as_array().into_iter().flatten() {
        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
            for span in scope["spans"].as_array().into_iter().flatten() {
                let attributes = span["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| {
                        Some((
                            a["key"].as_str()?.to_string(),
                            a["value"]["stringValue"].as_str()?.to_string(),
                        ))
                    })
                    .collect();
                out.push(Span {
                    name: text(span, "name"),
                    trace_id: text(span, "traceId").to_lowercase(),
                    span_id: text(span, "spanId").to_lowercase(),
                    parent_span_id: text(span, "parentSpanId").to_lowercase(),
                    attributes,
                });
            }
        }
    }
    out
}
