//! A hung host, made real: a proxy in front of a real server that forwards every connection,
//! or accepts it and then never sends a byte (as a Git host behind a wedged load balancer
//! does), for every connection or only for requests that name a pattern (say
//! `git-receive-pack`, to hang pushes while fetches go through). The test switches modes.
//! With a TLS configuration it is the HTTPS end, as a load balancer terminating TLS is: a
//! stalled new connection then hangs in the TLS handshake, and the pattern is looked for in
//! the decrypted request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does with a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Forward,
    /// Every connection, new or open, goes silent.
    StallAll,
    /// A new connection whose first bytes (the request line) contain this goes silent.
    StallMatching(String),
}

/// The proxy; it runs on its own thread until the process ends.
#[derive(Clone)]
pub struct StallProxy {
    /// Where to connect instead of the server.
    pub addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    stalled_connections: Arc<AtomicUsize>,
    /// Bytes passed on, both ways, and connections made through the proxy.
    forwarded: Arc<(AtomicU64, AtomicUsize)>,
}

impl StallProxy {
    /// A proxy forwarding to `target`.
    pub fn start(target: SocketAddr) -> StallProxy {
        Self::start_with(target, None)
    }

    /// A proxy that serves HTTPS with `tls` and forwards plain bytes to `target`.
    pub fn start_tls(target: SocketAddr, tls: Arc<rustls::ServerConfig>) -> StallProxy {
        Self::start_with(target, Some(tls))
    }

    fn start_with(target: SocketAddr, tls: Option<Arc<rustls::ServerConfig>>) -> StallProxy {
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let (tx, rx) = std::sync::mpsc::channel();
        let mode = Arc::new(Mutex::new(Mode::Forward));
        let stalled_connections = Arc::new(AtomicUsize::new(0));
        let forwarded = Arc::new((AtomicU64::new(0), AtomicUsize::new(0)));
        let (m, n, f) = (mode.clone(), stalled_connections.clone(), forwarded.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let (m, n, acceptor) = (m.clone(), n.clone(), acceptor.clone());
                    let f = f.clone();
                    f.1.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        if *m.lock().unwrap() == Mode::StallAll {
                            return hold(client, &n).await;
                        }
                        match acceptor {
                            Some(acceptor) => {
                                if let Ok(tls) = acceptor.accept(client).await {
                                    handle(tls, target, m, n, f).await;
                                }
                            }
                            None => handle(client, target, m, n, f).await,
                        }
                    });
                }
            });
        });
        StallProxy {
            addr: rx.recv().unwrap(),
            mode,
            stalled_connections,
            forwarded,
        }
    }

    /// (bytes passed on both ways, connections accepted) so far.
    pub fn traffic(&self) -> (u64, usize) {
        (
            self.forwarded.0.load(Ordering::SeqCst),
            self.forwarded.1.load(Ordering::SeqCst),
        )
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// How many connections went silent so far.
    pub fn stalled_connections(&self) -> usize {
        self.stalled_connections.load(Ordering::SeqCst)
    }

    /// `http://127.0.0.1:<port>`
    pub fn http_base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `https://127.0.0.1:<port>`, for a proxy started with [`StallProxy::start_tls`].
    pub fn https_base(&self) -> String {
        format!("https://{}", self.addr)
    }
}

async fn handle<S>(
    client: S,
    target: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    stalled: Arc<AtomicUsize>,
    forwarded: Arc<(AtomicU64, AtomicUsize)>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut client_read, client_write) = tokio::io::split(client);
    let current = mode.lock().unwrap().clone();
    let mut first = vec![0u8; 16 * 1024];
    let n = match current {
        Mode::Forward => 0,
        Mode::StallAll => return hold((client_read, client_write), &stalled).await,
        Mode::StallMatching(pattern) => {
            let Ok(n) = client_read.read(&mut first).await else {
                return;
            };
            if String::from_utf8_lossy(&first[..n]).contains(&pattern) {
                return hold((client_read, client_write), &stalled).await;
            }
            n
        }
    };
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (server_read, mut server_write) = tokio::io::split(server);
    if n > 0 && server_write.write_all(&first[..n]).await.is_err() {
        return;
    }
    forwarded.0.fetch_add(n as u64, Ordering::SeqCst);
    let ways = (mode.clone(), stalled.clone(), forwarded.clone());
    tokio::join!(
        pump(client_read, server_write, ways),
        pump(server_read, client_write, (mode, stalled, forwarded)),
    );
}

/// The proxy's mode, its count of stalled connections, and its traffic.
type Shared = (
    Arc<Mutex<Mode>>,
    Arc<AtomicUsize>,
    Arc<(AtomicU64, AtomicUsize)>,
);

/// Keeps the connection open and says nothing, for as long as the test runs.
async fn hold<C>(connection: C, stalled: &AtomicUsize) {
    stalled.fetch_add(1, Ordering::SeqCst);
    let _held = connection;
    std::future::pending::<()>().await;
}

/// Copies `from` to `to` until either closes; when the proxy stalls everything, an open
/// connection goes silent too (its bytes are read and never passed on).
async fn pump<R, W>(mut from: R, mut to: W, (mode, stalled, forwarded): Shared)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if *mode.lock().unwrap() == Mode::StallAll {
            return hold((from, to), &stalled).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        forwarded.0.fetch_add(n as u64, Ordering::SeqCst);
    }
}
