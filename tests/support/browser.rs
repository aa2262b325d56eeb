//! A real browser for the dashboard's test: Debian's `chromium`, headless, driven over the
//! Chrome DevTools Protocol (a WebSocket): open a page, read what it shows, run a line of
//! script, take a screenshot. Killed when dropped. It reaches no host but this machine's
//! loopback (every other request goes to a proxy that is not there), and records every
//! request the page makes, so a test can check the page needs nothing but the agent.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub struct Browser {
    child: Child,
    page: Socket,
    next_id: u64,
    /// Every URL the page asked for, in order (`Network.requestWillBeSent`), with its id.
    requests: Vec<(String, String)>,
    /// The requests that failed: their id and why (`Network.loadingFailed`).
    failures: Vec<(String, String)>,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium (1280x900) on a blank page.
    pub async fn start() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let bin = ["chromium", "chromium-browser"]
            .into_iter()
            .find(|b| {
                Command::new(b)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .expect("chromium is installed (tests/deps.sh installs Debian's chromium)");
        let mut child = Command::new(bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
                // No network but loopback (bypassed by default): port 9 on loopback is
                // closed, so any other host, a CDN or an IP address alike, fails.
                "--proxy-server=http://127.0.0.1:9",
                &format!("--user-data-dir={}", profile.path().display()),
                "about:blank",
            ])
            // Chromium's own temporary directories go with the profile, not left in /tmp.
            .env("TMPDIR", profile.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts");
        // "DevTools listening on ws://127.0.0.1:<port>/devtools/browser/<id>"
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let browser_url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium's DevTools address within 30 s");
        let http = browser_url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let targets: Value = reqwest::get(format!("http://{http}/json/list"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let page_url = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .expect("a page target")["webSocketDebuggerUrl"]
            .as_str()
            .unwrap()
            .to_string();
        let (page, _) = tokio_tungstenite::connect_async(page_url).await.unwrap();
        let mut b = Browser {
            child,
            page,
            next_id: 1,
            requests: Vec::new(),
            failures: Vec::new(),
            _profile: profile,
        };
        b.call("Page.enable", json!({})).await;
        b.call("Network.enable", json!({})).await;
        b
    }

    /// Sends one DevTools command and returns its result (events meanwhile are skipped).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.page.send(Message::Text(msg.into())).await.unwrap();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(30), self.page.next())
                .await
                .unwrap_or_else(|_| panic!("{method}: no answer within 30 s"));
            let Some(Ok(Message::Text(text))) = next else {
                continue;
            };
            let v: Value = serde_json::from_str(&text).unwrap();
            let params = &v["params"];
            let request = params["requestId"].as_str().unwrap_or_default().to_string();
            if v["method"] == "Network.requestWillBeSent"
                && let Some(url) = params["request"]["url"].as_str()
            {
                self.requests.push((request, url.to_string()));
            } else if v["method"] == "Network.loadingFailed" {
                let why = params["errorText"].as_str().unwrap_or_default();
                self.failures.push((request, why.to_string()));
            }
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Every URL the page has asked for so far.
    pub async fn requests(&mut self) -> Vec<String> {
        // A round trip reads the events sent before it.
        self.eval("1").await;
        self.requests.iter().map(|(_, url)| url.clone()).collect()
    }

    /// Why each request to `url` failed, so far.
    pub async fn failures_of(&mut self, url: &str) -> Vec<String> {
        self.eval("1").await;
        let ids: Vec<&String> = self
            .requests
            .iter()
            .filter(|(_, u)| u == url)
            .map(|(id, _)| id)
            .collect();
        self.failures
            .iter()
            .filter(|(id, _)| ids.contains(&id))
            .map(|(_, why)| why.clone())
            .collect()
    }

    pub async fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url})).await;
    }

    /// The value of a JavaScript expression in the page.
    pub async fn eval(&mut self, expression: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        r["result"]["value"].clone()
    }

    /// What the page shows, as text.
    pub async fn text(&mut self) -> String {
        self.eval("document.body ? document.body.innerText : ''")
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Waits until the page's text has every one of `wanted`; returns it.
    pub async fn wait_text(&mut self, wanted: &[&str], secs: u64) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let text = self.text().await;
            if wanted.iter().all(|w| text.contains(w)) {
                return text;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the page did not show {wanted:?} within {secs} s; it shows:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A PNG of the whole page (not only the window), written to `path`.
    pub async fn screenshot(&mut self, path: &Path) {
        use png_base64::Engine;
        let size = self.call("Page.getLayoutMetrics", json!({})).await["cssContentSize"].clone();
        let clip = json!({"x": 0, "y": 0, "scale": 1,
            "width": size["width"].as_f64().unwrap_or(1280.0),
            "height": size["height"].as_f64().unwrap_or(900.0).min(4000.0)});
        let r = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "clip": clip, "captureBeyondViewport": true}),
            )
            .await;
        let png = png_base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
