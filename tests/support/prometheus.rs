//! A real Prometheus for the analysis tests and `make demo` (built from its Go module by
//! `tests/prometheus/build.sh`, cached), scraping every second a small exporter that the test
//! runs on 127.0.0.1 and whose request and error counters it controls. Self-contained: the
//! demo includes this file by path.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::ports::free_port;

/// The directory with the `prometheus` binary, built on first use.
pub fn prometheus_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(root.join("tests/prometheus/build.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("tests/prometheus/build.sh runs (it needs Go)");
        assert!(out.status.success(), "tests/prometheus/build.sh failed");
        let text = String::from_utf8_lossy(&out.stdout);
        PathBuf::from(text.lines().last().unwrap_or_default())
    })
    .clone()
}

/// An application's `/metrics`: `app_requests_total` and `app_errors_total` for label
/// `app`, counting 100 requests a second, of which the error ratio the test sets fail; and
/// the same for `<app>-stable`, the stable version's pods to judge against, of which 0.5 %
/// fail. It runs on a thread of its own: a test's runtime may block for a moment (a `git`
/// command), and a scrape missed then would look like no traffic.
/// The share of the stable version's requests that fail (`<app>-stable`).
pub const STABLE_ERROR_RATIO: f64 = 0.005;

pub struct Exporter {
    pub port: u16,
    /// The error ratio, in millionths.
    ratio: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Exporter {
    pub async fn start(app: &str) -> Exporter {
        let ratio = Arc::new(AtomicU64::new(0));
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (app, thread_ratio) = (app.to_string(), ratio.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(serve_metrics(app, thread_ratio, port_tx, stopped));
        });
        let port = port_rx.recv().unwrap();
        Exporter {
            port,
            ratio,
            stop: Some(stop),
        }
    }

    /// From now on, this share of requests fails.
    pub fn set_error_ratio(&self, ratio: f64) {
        self.ratio.store((ratio * 1e6) as u64, Ordering::Relaxed);
    }
}

async fn serve_metrics(
    app: String,
    ratio: Arc<AtomicU64>,
    port: std::sync::mpsc::Sender<u16>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    port.send(listener.local_addr().unwrap().port()).unwrap();
    // (requests, errors) of the app, then of its stable version.
    let counts = Arc::new(Mutex::new([(0u64, 0f64); 2]));
    let ticker_counts = counts.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(100));
        loop {
            every.tick().await;
            let r = ratio.load(Ordering::Relaxed) as f64 / 1e6;
            let mut c = ticker_counts.lock().unwrap();
            for (i, r) in [r, STABLE_ERROR_RATIO].into_iter().enumerate() {
                c[i].0 += 10;
                c[i].1 += 10.0 * r;
            }
        }
    });
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (counts, app) = (counts.clone(), app.clone());
            async move {
                let [(requests, errors), (stable_requests, stable_errors)] =
                    *counts.lock().unwrap();
                format!(
                    "# TYPE app_requests_total counter\n\
                     app_requests_total{{app=\"{app}\"}} {requests}\n\
                     app_requests_total{{app=\"{app}-stable\"}} {stable_requests}\n\
                     # TYPE app_errors_total counter\n\
                     app_errors_total{{app=\"{app}\"}} {}\n\
                     app_errors_total{{app=\"{app}-stable\"}} {}\n",
                    errors.floor(),
                    stable_errors.floor()
                )
            }
        }),
    );
    let _ = axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = stopped.await;
        })
        .await;
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A Prometheus server scraping one exporter every second; killed when dropped.
pub struct Prometheus {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    pub async fn start(exporter: &Exporter) -> Prometheus {
        Prometheus::scraping(&format!("127.0.0.1:{}", exporter.port)).await
    }

    /// A Prometheus scraping `target` (`host:port`, path `/metrics`) every second.
    pub async fn scraping(target: &str) -> Prometheus {
        Prometheus::scraping_with_rules(target, &[]).await
    }

    /// [`Prometheus::scraping`], evaluating the rule files `rules` every second.
    pub async fn scraping_with_rules(target: &str, rules: &[PathBuf]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let rule_files: String = rules
            .iter()
            .map(|r| format!("- '{}'\n", r.display()))
            .collect();
        let rule_files = if rule_files.is_empty() {
            String::new()
        } else {
            format!("rule_files:\n{rule_files}")
        };
        std::fs::write(
            dir.path().join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{rule_files}\
                 scrape_configs:\n- job_name: app\n  honor_labels: true\n  static_configs:\n  - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let mut p = Prometheus {
            child: None,
            port: free_port(),
            dir,
        };
        p.restart().await;
        p
    }

    /// `http://127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The value of the instant query `query` now, if it has one.
    pub async fn value(&self, query: &str) -> Option<f64> {
        let url = reqwest::Url::parse_with_params(
            &format!("{}/api/v1/query", self.address()),
            &[("query", query)],
        )
        .ok()?;
        let answer: serde_json::Value = super::gateway::http()
            .get(url)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        answer["data"]["result"][0]["value"][1]
            .as_str()?
            .parse()
            .ok()
    }

    /// Waits until the error ratio of `app` over the last `window` (a PromQL duration) is
    /// `at_least`: the rate window of an analysis full of what the test set.
    pub async fn wait_error_ratio(&self, app: &str, window: &str, at_least: f64) {
        let query = format!(
            "sum(rate(app_errors_total{{app=\"{app}\"}}[{window}])) / sum(rate(app_requests_total{{app=\"{app}\"}}[{window}]))"
        );
        super::gateway::eventually(
            &format!("an error ratio of {at_least} for {app} over {window}"),
            Duration::from_secs(60),
            || async {
                self.value(&query)
                    .await
                    .filter(|v| *v >= at_least)
                    .map(|_| ())
            },
        )
        .await
    }

    /// Stops it at once (SIGKILL): queries are refused until [`Prometheus::restart`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it (again) on the same port and data, and waits until it is ready.
    pub async fn restart(&mut self) {
        self.stop();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("prometheus.log"))
            .unwrap();
        let child = Command::new(prometheus_bin().join("prometheus"))
            .arg(format!(
                "--config.file={}",
                self.dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        self.child = Some(child);
        let ready = format!("{}/-/ready", self.address());
        linnet::net::install_crypto_provider();
        let http = reqwest::Client::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = http.get(&ready).send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "Prometheus was not ready within 60 s:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!(
                "---- prometheus log (last lines)\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}
