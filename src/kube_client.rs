//! The Kubernetes client: kube's, speaking HTTP/2 to the API server.
//!
//! kube's default client speaks HTTP/1.1 only, so every request in flight needs its own
//! connection: a restart at 1,000 rollouts opened 1,000 TLS connections to the API server,
//! each with its buffers and its handshake. client-go speaks HTTP/2, multiplexing every
//! request and watch over one connection; so does linnet (catching up after that restart
//! went from 4.9 to 2.1 s, with 5 sockets open). HTTP/2 is chosen by ALPN, so requests sent
//! before the first connection is up may open a few more. Pings notice a dead connection, as
//! client-go's do.
//!
//! kube's own `ClientBuilder` offers only HTTP/1.1 (its TLS connector enables no other ALPN),
//! so this is the one place that assembles kube's stack: the same layers in the same order
//! (base URI, retry, auth, extra headers, trace) and the same connect, read and write
//! timeouts from the `Config`, over a connector that also speaks HTTP/2. Compare it with
//! `kube_client::client::builder::make_generic_builder` when kube is upgraded.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::{Client, Config};
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

pub mod fence;

/// A create (or a replace) that names `manager` as its field manager
/// ([`crate::api::field_managers`]).
pub fn post_as(manager: &str) -> kube::api::PostParams {
    kube::api::PostParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    }
}

/// A merge or JSON patch (an update) that names `manager` as its field manager
/// ([`crate::api::field_managers`]); server-side apply names one with `PatchParams::apply`.
pub fn patch_as(manager: &str) -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    }
}

/// How often an idle connection is pinged, and how long a ping may go unanswered before the
/// connection is dropped (client-go: 30 s and 15 s).
const PING_EVERY: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the first request may take before linnet says the API server is unreachable.
const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Which cluster to use: kubectl's `--kubeconfig` and `--context`. Neither set: found as
/// `kubectl` finds it (KUBECONFIG, ~/.kube/config, else in a pod its ServiceAccount).
#[derive(Clone, Debug, Default)]
pub struct Target {
    pub kubeconfig: Option<std::path::PathBuf>,
    pub context: Option<String>,
}

/// The kubeconfig (or in-cluster) settings of `target`, and a client that has been answered
/// once: a command that cannot reach the API server, or is refused, says so once, in words,
/// instead of failing every request after it.
pub async fn connect_to(target: &Target) -> Result<(Config, Client), crate::Error> {
    connect_fenced(target, None).await
}

/// [`connect_to`], with every write of the client behind `fence` ([`crate::kube_client::fence`]).
pub async fn connect_fenced(
    target: &Target,
    fence: Option<std::sync::Arc<fence::Fence>>,
) -> Result<(Config, Client), crate::Error> {
    let config = load_config(target).await?;
    let client = from_config_fenced(config.clone(), fence)
        .map_err(|e| crate::Error::KubeConfig(Box::new(e)))?;
    check(&client, &config.cluster_url.to_string()).await?;
    Ok((config, client))
}

/// [`connect_to`] the cluster kubectl would use.
pub async fn connect() -> Result<(Config, Client), crate::Error> {
    connect_to(&Target::default()).await
}

async fn load_config(target: &Target) -> Result<Config, crate::Error> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let failed = |why: String| crate::Error::KubeConfig(why.into());
    if target.kubeconfig.is_none() && target.context.is_none() {
        return Config::infer().await.map_err(|_| failed(no_config_found()));
    }
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..KubeConfigOptions::default()
    };
    let kubeconfig = match &target.kubeconfig {
        Some(path) if !path.is_file() => {
            return Err(failed(format!(
                "--kubeconfig {}: no such file",
                path.display()
            )));
        }
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    }
    .map_err(|e| failed(crate::error::error_chain(&e)))?;
    if let Some(context) = &target.context
        && !kubeconfig.contexts.iter().any(|c| &c.name == context)
    {
        let known: Vec<&str> = kubeconfig
            .contexts
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        return Err(failed(format!(
            "--context {context}: the kubeconfig has no such context (it has: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    }
    Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|e| failed(crate::error::error_chain(&e)))
}

/// Why no configuration was found, in kubectl's terms, without kube's error-chain stutter.
fn no_config_found() -> String {
    let files = match std::env::var("KUBECONFIG") {
        Ok(paths) if !paths.is_empty() => {
            format!("KUBECONFIG ({paths}) names no readable kubeconfig")
        }
        _ => {
            let home = std::env::var("HOME").unwrap_or_else(|_| "~".into());
            format!("KUBECONFIG is not set and {home}/.kube/config cannot be read")
        }
    };
    format!(
        "no cluster configured: {files}, and this is not a pod (KUBERNETES_SERVICE_HOST is not \
         set). Set KUBECONFIG or pass --kubeconfig (and --context) as for kubectl"
    )
}

/// Checks that the API server serves every kind of linnet's API, so that an agent without
/// its CustomResourceDefinitions says so once instead of failing every watch.
pub async fn check_crds(client: &Client) -> Result<(), crate::Error> {
    let kinds: Vec<String> = crate::api::crds()
        .into_iter()
        .map(|crd| crd.spec.names.kind)
        .collect();
    let served = match client
        .list_api_group_resources(crate::api::API_VERSION)
        .await
    {
        Ok(list) => list.resources,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Err(crate::Error::CrdsMissing);
        }
        Err(source) => {
            return Err(crate::Error::ClusterRequest {
                doing: "read which kinds the API server serves".into(),
                source,
                forbidden_hint: crate::error::FORBIDDEN_HINT,
            });
        }
    };
    let missing: Vec<String> = kinds
        .into_iter()
        .filter(|k| !served.iter().any(|r| &r.kind == k))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(crate::Error::CrdsOutdated { missing })
}

/// Asks the API server for its version, which any authenticated identity may read.
pub async fn check(client: &Client, url: &str) -> Result<(), crate::Error> {
    match tokio::time::timeout(FIRST_REQUEST_TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(source)) => Err(crate::Error::ClusterRequest {
            doing: format!("use the Kubernetes API server at {url}"),
            source,
            forbidden_hint: crate::error::FORBIDDEN_HINT,
        }),
        Err(_) => Err(crate::Error::ClusterSilent {
            url: url.to_string(),
            waited: FIRST_REQUEST_TIMEOUT,
        }),
    }
}

/// kube's request tracing: a debug span per request with its method, URL and status, and an
/// error event for a failed one (what `RUST_LOG=kube=debug,linnet=debug` shows). A macro,
/// because the layer's type names its closures.
macro_rules! trace_layer {
    () => {{
    use tower_http::classify::ServerErrorsFailureClass;
    tower_http::trace::TraceLayer::new_for_http()
        .make_span_with(|req: &http::Request<kube::client::Body>| {
            tracing::debug_span!(
                "HTTP",
                http.method = %req.method(),
                http.url = %req.uri(),
                http.status_code = tracing::field::Empty,
                otel.name = req.extensions().get::<&'static str>().unwrap_or(&"HTTP"),
                otel.kind = "client",
                otel.status_code = tracing::field::Empty,
            )
        })
        .on_request(|_: &http::Request<kube::client::Body>, _: &tracing::Span| {
            tracing::debug!("requesting");
        })
        .on_response(
            |res: &http::Response<hyper::body::Incoming>, _: Duration, span: &tracing::Span| {
                let status = res.status();
                span.record("http.status_code", status.as_u16());
                if status.is_client_error() || status.is_server_error() {
                    span.record("otel.status_code", "ERROR");
                }
            },
        )
        .on_body_chunk(())
        .on_eos(|_: Option<&http::HeaderMap>, _: Duration, _: &tracing::Span| {
            tracing::debug!("stream closed");
        })
        .on_failure(
            |failure: ServerErrorsFailureClass, _: Duration, span: &tracing::Span| {
                span.record("otel.status_code", "ERROR");
                match failure {
                    ServerErrorsFailureClass::StatusCode(status) => {
                        span.record("http.status_code", status.as_u16());
                        // The caller says what failed, with its context; this is detail.
                        tracing::debug!("failed with status {status}");
                    }
                    ServerErrorsFailureClass::Error(err) => {
                        tracing::debug!("failed with error {err}");
                    }
                }
            },
        )
    }};
}

/// A client for `config`, behind the process's fence if it has one: a client made later
/// (one impersonating a source's account) writes only while the Lease is held, like the
/// agent's own. Settings this client does not handle itself (an HTTP proxy, a TLS server
/// name) get kube's own HTTP/1.1 client instead.
pub fn from_config(config: Config) -> Result<Client, kube::Error> {
    from_config_fenced(config, fence::current().cloned())
}

/// [`from_config`], with every write behind `fence`. kube's own client (a proxy, a TLS
/// server name) has no fence: said in the log.
pub fn from_config_fenced(
    config: Config,
    fence: Option<std::sync::Arc<fence::Fence>>,
) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() || config.tls_server_name.is_some() {
        if fence.is_some() {
            tracing::warn!(
                "with an HTTP proxy or a TLS server name the client is kube's own, and writes are not fenced by the lease"
            );
        }
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // HTTP/2 writes a request's frames separately; without this, Nagle holds the last one back.
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    // kube's timeouts: a connection that stops reading or writing is dropped (its watches
    // then start again), instead of holding a request for ever.
    let mut https = hyper_timeout::TimeoutConnector::new(https);
    https.set_connect_timeout(config.connect_timeout);
    https.set_read_timeout(config.read_timeout);
    https.set_write_timeout(config.write_timeout);
    https.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_EVERY)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(trace_layer!())
        .option_layer(fence.map(fence::FenceLayer))
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}
