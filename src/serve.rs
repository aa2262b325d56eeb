//! Serving HTTP to callers who may be hostile: the webhook port faces the internet. Every
//! connection holds a slot of a fixed number; a caller past the limit gets `503` with
//! `Retry-After` (not a silent drop) and the connection is closed. Request headers must arrive
//! within a timeout, which also closes a kept-alive connection that sends nothing. Bodies are
//! bounded by their handlers (the webhook routes bound theirs).

pub mod host_names;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How much one listener lets its callers hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections open at once; more get `503` and are closed.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers (or, between requests,
    /// stay idle) before it is closed.
    pub header_timeout: Duration,
    /// How long a connection may stay open at all: one that never reads its answers would
    /// otherwise hold its slot for good (hyper's header timeout runs only while it reads).
    pub max_connection_age: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(60),
        }
    }
}

/// Sent to a connection past the limit. Git hosts log it; clients that honour `Retry-After`
/// come back.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
Content-Type: text/plain\r\nContent-Length: 42\r\nConnection: close\r\n\r\n\
busy: too many connections; retry shortly\n";

/// Refusals being written at once; past this a connection is closed without an answer. Each
/// waits at most [`REFUSAL_WAIT`] for a request head with a 512-byte buffer (about 1 KiB in
/// all), so 1,024 of them cost about 1 MiB: 64 were all held by 1,000 idle connections, and a
/// Git host's webhook got a reset instead of the 503 (issue 45).
const MAX_REFUSALS_IN_FLIGHT: usize = 1024;

/// How long a refused connection may take to send its request head before it is closed.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);

/// Called for each caller turned away at the connection limit.
pub type OnRefused = Arc<dyn Fn() + Send + Sync>;

/// Serves `app` on `listener` until the task is dropped. A caller turned away is reported to
/// `on_refused` (the webhook listener schedules a look at the remote: it may have been a push).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    on_refused: Option<OnRefused>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(64 * 1024);
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if let Ok(refusal) = refusals.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    let _refusal = refusal;
                    let _ = tokio::time::timeout(REFUSAL_WAIT, async {
                        // An answer before the request reads as an error to HTTP clients:
                        // wait for the request's head (at most 16 KiB), then answer.
                        let mut chunk = [0u8; 512];
                        let mut tail = [0u8; 3];
                        let mut seen = 0;
                        while seen < 16 * 1024 {
                            let n = stream.read(&mut chunk).await?;
                            if n == 0 || ends_head(&mut tail, &chunk[..n]) {
                                break;
                            }
                            seen += n;
                        }
                        stream.write_all(BUSY).await?;
                        stream.shutdown().await?;
                        // Closing with the body unread would reset the connection, and the
                        // caller would see an error instead of the 503.
                        while stream.read(&mut chunk).await? > 0 {}
                        Ok::<_, std::io::Error>(())
                    })
                    .await;
                });
            }
            if let Some(refused) = &on_refused {
                refused();
            }
            tracing::debug!(%peer, "connection refused: at the connection limit");
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let age = limits.max_connection_age;
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(age, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "connection ended"),
                Err(_) => tracing::debug!(%peer, "connection closed: open too long"),
            }
        });
    }
}

/// Whether `bytes`, read after the bytes that left `tail` (the last three seen), complete a
/// request head (`\r\n\r\n`); keeps `tail` up to date.
fn ends_head(tail: &mut [u8; 3], bytes: &[u8]) -> bool {
    for &b in bytes {
        if *tail == *b"\r\n\r" && b == b'\n' {
            return true;
        }
        *tail = [tail[1], tail[2], b];
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_split_across_reads_is_seen_to_end() {
        let mut tail = [0u8; 3];
        assert!(!ends_head(&mut tail, b"GET / HTTP/1.1\r\nHost: x\r"));
        assert!(!ends_head(&mut tail, b"\n"));
        assert!(ends_head(&mut tail, b"\r\n"));
        let mut tail = [0u8; 3];
        assert!(ends_head(&mut tail, b"a\r\n\r\nbody"));
        let mut tail = [0u8; 3];
        assert!(!ends_head(&mut tail, b"\r"));
        assert!(!ends_head(&mut tail, b"\n"));
        assert!(!ends_head(&mut tail, b"\r"));
        assert!(ends_head(&mut tail, b"\n"));
    }
}
