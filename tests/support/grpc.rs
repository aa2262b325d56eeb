//! A gRPC client for the GRPCRoute tests, at the wire level of gRPC over HTTP/2 (the
//! protocol's documented framing: a 5-byte prefix per message, the status in `grpc-status`,
//! in the trailers or, for an error alone, the headers). It calls the real-node key-value
//! server's `linnet.kv.Kv/Image` (tests/node/kvserver/grpc.go), whose messages are protobuf's
//! `StringValue`, through the gateway over plaintext HTTP/2 (h2c).
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::gateway::Tally;

/// A gRPC channel of its own (HTTP/2 only, no TLS).
#[derive(Clone)]
pub struct GrpcClient(Client<HttpConnector, Full<Bytes>>);

impl Default for GrpcClient {
    fn default() -> Self {
        GrpcClient(
            Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http(),
        )
    }
}

impl GrpcClient {
    /// Calls `linnet.kv.Kv/Image` at `base` (`http://host:port/`) with `headers` as metadata:
    /// `(200, image)` for an OK answer, else what went wrong (`grpc-status 14 ...`).
    pub async fn image(
        &self,
        base: &str,
        headers: &[(&str, &str)],
    ) -> Result<(u16, String), String> {
        let mut req = http::Request::post(format!("{}linnet.kv.Kv/Image", base))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        // An empty StringValue: compressed flag 0, length 0.
        let req = req
            .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
            .map_err(|e| e.to_string())?;
        let call = async {
            let resp = self
                .0
                .request(req)
                .await
                .map_err(|e| format!("request failed: {e}"))?;
            let (parts, body) = resp.into_parts();
            let collected = body
                .collect()
                .await
                .map_err(|e| format!("body failed: {e}"))?;
            let trailers = collected.trailers().cloned().unwrap_or_default();
            let field = |name: &str| {
                trailers
                    .get(name)
                    .or_else(|| parts.headers.get(name))
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            let status = field("grpc-status");
            if parts.status != 200 || status.as_deref() != Some("0") {
                return Err(format!(
                    "HTTP {} grpc-status {} {}",
                    parts.status.as_u16(),
                    status.unwrap_or_else(|| "none".into()),
                    field("grpc-message").unwrap_or_default()
                ));
            }
            string_value(&collected.to_bytes()).map(|image| (200, image))
        };
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .map_err(|_| "timed out after 10 s".to_string())?
    }
}

/// The string in a gRPC answer of one `StringValue` (field 1, length-delimited).
fn string_value(body: &[u8]) -> Result<String, String> {
    let bad = || format!("not one StringValue message: {body:02x?}");
    let (prefix, message) = body.split_at_checked(5).ok_or_else(bad)?;
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if prefix[0] != 0 || message.len() != len {
        return Err(bad());
    }
    if message.is_empty() {
        return Ok(String::new());
    }
    // Tag 0x0a (field 1, wire type 2), then a varint length under 128 for names this short.
    match message {
        [0x0a, n, rest @ ..] if usize::from(*n) == rest.len() && *n < 0x80 => {
            String::from_utf8(rest.to_vec()).map_err(|_| bad())
        }
        _ => Err(bad()),
    }
}

/// Sends `n` calls, 8 at a time, with `headers` as metadata.
pub async fn send_grpc(base: &str, n: usize, headers: &[(&str, &str)]) -> Tally {
    let client = GrpcClient::default();
    let outcomes: Vec<_> = futures::stream::iter(0..n)
        .map(|_| client.image(base, headers))
        .buffer_unordered(8)
        .collect()
        .await;
    let mut t = Tally::default();
    for o in outcomes {
        t.add(o);
    }
    t
}
