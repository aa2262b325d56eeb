//! A smart-HTTP Git server for tests: `git http-backend` (the real one, as CGI) behind a small
//! axum server, with optional Basic authentication, as a Git host would serve a repository.
//! Each authorized request is logged as `<method> <path>` to `requests.log` in the root.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Stdio;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Response, StatusCode};
use base64::Engine as _;
use tokio::io::AsyncWriteExt;

#[derive(Clone)]
struct Backend {
    root: PathBuf,
    /// `(user, password)` required by Basic auth, if any.
    credentials: Option<(String, String)>,
}

/// Serves every bare repository under `root` at `http://127.0.0.1:<port>/<name>.git`.
/// Returns the base URL; the server lives on its own thread until the process ends.
pub fn serve(root: PathBuf, credentials: Option<(&str, &str)>) -> String {
    serve_on("127.0.0.1", root, credentials)
}

/// [`serve`] on address `ip` (e.g. the real node's bridge gateway, which its pods reach).
pub fn serve_on(ip: &str, root: PathBuf, credentials: Option<(&str, &str)>) -> String {
    let ip = ip.to_string();
    let backend = Backend {
        root,
        credentials: credentials.map(|(u, p)| (u.to_string(), p.to_string())),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind((ip.as_str(), 0))
                .await
                .unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new().fallback(handle).with_state(backend);
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

fn authorized(backend: &Backend, headers: &HeaderMap) -> Option<String> {
    let Some((user, password)) = &backend.credentials else {
        return Some(String::new());
    };
    let value = headers.get("authorization")?.to_str().ok()?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(value.strip_prefix("Basic ")?)
        .ok()?;
    (decoded == format!("{user}:{password}").as_bytes()).then(|| user.clone())
}

async fn handle(State(backend): State<Backend>, request: Request) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let Some(user) = authorized(&backend, &parts.headers) else {
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("www-authenticate", "Basic realm=\"git\"")
            .body(Body::empty())
            .unwrap();
    };
    // What was asked, in order (`<root>/requests.log`): a test counts a fetch's round trips.
    if let Ok(mut log) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(backend.root.join("requests.log"))
    {
        use std::io::Write as _;
        let _ = writeln!(log, "{} {}", parts.method, parts.uri.path());
    }
    let body: Bytes = axum::body::to_bytes(body, 64 << 20).await.unwrap();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let mut child = tokio::process::Command::new("git")
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", &backend.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", parts.uri.path())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_USER", user)
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&body).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    // CGI: headers, a blank line, then the body.
    let split = out
        .stdout
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| {
            out.stdout
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, 2))
        })
        .unwrap_or((out.stdout.len(), 0));
    let head = String::from_utf8_lossy(&out.stdout[..split.0]).to_string();
    let mut response = Response::builder().status(StatusCode::OK);
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("status") {
            let code: u16 = value
                .trim()
                .split(' ')
                .next()
                .unwrap_or("200")
                .parse()
                .unwrap_or(200);
            response = response.status(code);
        } else {
            response = response.header(name.trim(), value.trim());
        }
    }
    response
        .body(Body::from(out.stdout[split.0 + split.1..].to_vec()))
        .unwrap()
}
