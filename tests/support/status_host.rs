//! A Git host's commit-status API for tests: a local HTTP server that records every request
//! and answers from a scripted queue (201 when it is empty).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::Value;

#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

/// An answer to give: the status code and headers.
pub type Answer = (u16, Vec<(&'static str, String)>);

#[derive(Clone, Default)]
pub struct Host {
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    /// Answers to give, in order: status and headers. Then 201.
    pub answers: Arc<Mutex<VecDeque<Answer>>>,
}

async fn record(State(host): State<Host>, req: Request) -> impl IntoResponse {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    host.requests.lock().unwrap().push(Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        headers: parts.headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    });
    let (status, headers) = host
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or((201, vec![]));
    let mut response = (StatusCode::from_u16(status).unwrap(), "{}").into_response();
    for (k, v) in headers {
        response.headers_mut().insert(k, v.parse().unwrap());
    }
    response
}

/// Starts the server; returns it and its base URL.
pub async fn host() -> (Host, String) {
    let host = Host::default();
    let app = Router::new().fallback(record).with_state(host.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (host, format!("http://{addr}"))
}

/// [`host`] over HTTPS with `config`'s certificate; the base URL is `https://127.0.0.1:<port>`.
pub async fn host_https(config: Arc<rustls::ServerConfig>) -> (Host, String) {
    let host = Host::default();
    let app = Router::new().fallback(record).with_state(host.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(super::tls::serve_https(listener, app, config));
    (host, format!("https://{addr}"))
}
