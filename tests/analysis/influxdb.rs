//! Issue 75: the InfluxDB provider against a real InfluxDB 1.8 (influxd, built from its Go
//! module by `tests/influxdb/build.sh`, cached), over HTTPS (a test CA the agent is given as
//! `caFile`) with authentication on: the agent reads as a user granted READ on the database
//! only, by `Authorization: Token user:password`. The test writes the points the queries
//! read. For the timing-out query only, a small HTTPS proxy in front of the server holds
//! requests for query `slow` 3 s (InfluxQL has no sleep); every request goes through it, and
//! every answer is the server's.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, Uri};
use serde_json::{Value, json};

use super::provider_gate::{Provider, passes_fails_errs_and_times_out};
use super::support;
use support::tls::TestCa;

const ADMIN: (&str, &str) = ("admin", "adm1n-only");
const READER: &str = "linnet:r3ad-only";

/// The directory with `influxd`, built on first use.
fn influxdb_bin() -> PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("tests/influxdb/build.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("tests/influxdb/build.sh runs (it needs Go)");
    assert!(out.status.success(), "tests/influxdb/build.sh failed");
    let text = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(text.lines().last().unwrap_or_default())
}

/// A running influxd on 127.0.0.1, its data in a temporary directory; stopped on drop.
struct InfluxDb {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    /// A client that trusts the server's CA.
    http: reqwest::Client,
}

impl Drop for InfluxDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("influxd.log"));
            eprintln!("---- influxd log\n{}", log.unwrap_or_default());
        }
    }
}

impl InfluxDb {
    async fn start(ca: &TestCa) -> InfluxDb {
        let dir = tempfile::tempdir().unwrap();
        let cert = ca.server_cert();
        std::fs::write(dir.path().join("cert.pem"), &cert.cert_pem).unwrap();
        std::fs::write(dir.path().join("key.pem"), &cert.key_pem).unwrap();
        let (port, bind) = (support::ports::free_port(), support::ports::free_port());
        let at = |sub: &str| dir.path().join(sub).display().to_string();
        let log = std::fs::File::create(dir.path().join("influxd.log")).unwrap();
        let child = Command::new(influxdb_bin().join("influxd"))
            .arg("run")
            .env("INFLUXDB_REPORTING_DISABLED", "true")
            .env("INFLUXDB_HTTP_BIND_ADDRESS", format!("127.0.0.1:{port}"))
            .env("INFLUXDB_BIND_ADDRESS", format!("127.0.0.1:{bind}"))
            .env("INFLUXDB_HTTP_AUTH_ENABLED", "true")
            .env("INFLUXDB_META_DIR", at("meta"))
            .env("INFLUXDB_DATA_DIR", at("data"))
            .env("INFLUXDB_DATA_WAL_DIR", at("wal"))
            .env("INFLUXDB_HTTP_HTTPS_ENABLED", "true")
            .env("INFLUXDB_HTTP_HTTPS_CERTIFICATE", at("cert.pem"))
            .env("INFLUXDB_HTTP_HTTPS_PRIVATE_KEY", at("key.pem"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("influxd starts");
        let http = ca.client();
        let db = InfluxDb {
            child,
            port,
            dir,
            http,
        };
        support::eventually("influxd to answer /ping", Duration::from_secs(60), || {
            let url = format!("{}/ping", db.address());
            let http = db.http.clone();
            async move {
                let r = http.get(url).send().await.ok()?;
                r.status().is_success().then_some(())
            }
        })
        .await;
        db
    }

    fn address(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Runs `statement` as the admin (the first one, with no admin yet, creates it).
    async fn admin(&self, statement: &str) {
        let url = format!("{}/query", self.address());
        let url = reqwest::Url::parse_with_params(&url, &[("q", statement)]).unwrap();
        let r = self
            .http
            .post(url)
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert!(
            status.is_success() && body["results"][0]["error"].is_null(),
            "{statement}: {status} {body}"
        );
    }

    async fn write(&self, lines: &str) {
        let r = self
            .http
            .post(format!("{}/write?db=app", self.address()))
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .body(lines.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT, "{:?}", r.text().await);
    }
}

/// The HTTPS proxy every query goes through: requests for query `slow` wait 3 s, then each
/// is sent to influxd and its answer returned as it is.
async fn delaying_proxy(ca: &TestCa, upstream: String) -> u16 {
    let http = ca.client();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let forward = move |uri: Uri, headers: HeaderMap| {
        let (upstream, http) = (upstream.clone(), http.clone());
        async move {
            let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
            if path.contains("slow") {
                let why = "the proxy holds a slow query 3 s";
                support::let_time_pass(why, Duration::from_secs(3)).await;
            }
            let mut request = http.get(format!("{upstream}{path}"));
            if let Some(auth) = headers.get("authorization") {
                request = request.header("authorization", auth.clone());
            }
            let answer = request.send().await.unwrap();
            let status = StatusCode::from_u16(answer.status().as_u16()).unwrap();
            (status, answer.text().await.unwrap())
        }
    };
    let router = axum::Router::new().fallback(forward);
    tokio::spawn(support::tls::serve_https(
        listener,
        router,
        ca.server_config(),
    ));
    port
}

/// The InfluxQL each of the flow's queries stands for: the last error rate written for it,
/// or (`refused`) a query InfluxDB cannot parse.
fn influxql(query: &str) -> String {
    match query {
        "refused" => "SELECT last(\"rate\") FROM".to_string(),
        q => format!("SELECT last(\"rate\") AS errors FROM \"errors\" WHERE \"q\" = '{q}'"),
    }
}

/// Passing, failing, refused (InfluxQL that does not parse) and timed-out InfluxDB queries
/// through a gate, against the real server.
#[tokio::test]
async fn an_influxdb_query_passes_fails_errs_and_times_out_through_a_gate() {
    let ca = TestCa::new("linnet test InfluxDB CA");
    let db = InfluxDb::start(&ca).await;
    let (user, password) = READER.split_once(':').unwrap();
    db.admin(&format!(
        "CREATE USER {} WITH PASSWORD '{}' WITH ALL PRIVILEGES",
        ADMIN.0, ADMIN.1
    ))
    .await;
    db.admin("CREATE DATABASE app").await;
    db.admin(&format!("CREATE USER {user} WITH PASSWORD '{password}'"))
        .await;
    db.admin(&format!("GRANT READ ON app TO {user}")).await;
    db.write("errors,q=pass rate=0.01\nerrors,q=fail rate=0.3\nerrors,q=slow rate=0.01")
        .await;
    let port = delaying_proxy(&ca, db.address()).await;
    let provider = move |query: &str, keys: &str| {
        json!({"influxdb": {"address": format!("https://127.0.0.1:{port}"),
            "database": "app", "query": influxql(query), "field": "errors", "timeout": "1s",
            "tokenFile": format!("{keys}/token"), "caFile": format!("{keys}/ca.pem")}})
    };
    passes_fails_errs_and_times_out(Provider {
        prefix: "an-influxdb",
        port,
        scheme: "https",
        key_files: &[("token", &format!("{READER}\n")), ("ca.pem", &ca.cert_pem)],
        provider: &provider,
        query_shown: "InfluxDB SELECT last(\"rate\") AS errors FROM \"errors\" WHERE \"q\" = 'pass' (field errors) on database app at https://127.0.0.1:",
        refusal: "answered 400 Bad Request: error parsing query",
    })
    .await;
}
