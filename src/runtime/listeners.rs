//! The agent's HTTP listeners, each with its own callers:
//! - `--listen`: the Git host's webhooks (and `/healthz`, `/readyz`);
//! - `--admin-listen`: `/metrics` and `/status` for the cluster's own tools (localhost
//!   unless opted in), and the probes;
//! - `--probe-listen`: the probes only, for the kubelet;
//! - `--metrics-listen`: `/metrics` only, for a scraper in another pod;
//! - `--dashboard-listen`: the read-only dashboard, for people.
//!
//! Inputs: the state, the rollout stores and the metrics. Outputs: the verified webhooks, as
//! wake-ups of the source loop.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use serde::{Deserialize, Serialize};

use super::config::AgentConfig;
use super::state::{AgentState, SourceStatus};
use crate::api::RolloutView;
use crate::serve::serve;
use crate::source::hooks::{self, Waker};
use crate::telemetry::{Metrics, RolloutSeries};
use crate::watch::rollouts::RolloutStores;
use crate::{Error, Result};

/// What the handlers read.
struct Shared {
    state: Arc<AgentState>,
    rollouts: RolloutStores,
    metrics: Arc<Metrics>,
    cluster: crate::api::ClusterIdentity,
}

/// What `/status` answers: the source's state, and each rollout of this source as the
/// shared store has it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    #[serde(flatten)]
    pub source: SourceStatus,
    /// Whether `rollouts` is from a complete list: false until both kinds are listed, and on
    /// a replica waiting for the lease (its watches start once it holds it).
    #[serde(default)]
    pub rollouts_listed: bool,
    #[serde(default)]
    pub rollouts: Vec<RolloutRow>,
    /// This agent's cluster (`--cluster`) and its labels (`--cluster-label`).
    #[serde(default)]
    pub cluster: crate::api::ClusterIdentity,
}

/// One rollout in `/status`, as `linnet status` prints it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutRow {
    /// `csts` or `cdeploy`, as `kubectl get` takes it.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub phase: Option<String>,
    pub ready: Option<String>,
    pub message: Option<String>,
}

/// Binds every listener and serves it in its own task; an address that cannot be bound is
/// an error here, before anything else starts.
pub async fn serve_all(
    config: &AgentConfig,
    client: kube::Client,
    state: Arc<AgentState>,
    rollouts: RolloutStores,
    metrics: Arc<Metrics>,
    waker: Waker,
    tasks: &mut super::supervise::Tasks,
) -> Result<()> {
    let image_scans = state.image_scans.clone();
    let source = state.clone();
    let shared = Arc::new(Shared {
        state,
        rollouts: rollouts.clone(),
        metrics: metrics.clone(),
        cluster: config.cluster.clone(),
    });
    // The dashboard's fleet view (`--fleet`).
    let fleet = config
        .fleet
        .as_ref()
        .map(|_| shared.state.fleet.subscribe());
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(shared.clone());
    let mut hooks_app = probes.clone();
    if let Some(settings) = &config.webhook {
        hooks_app = hooks_app.merge(hooks::router(
            settings.clone(),
            waker.clone(),
            metrics.clone(),
        ));
        if config.image_automation.is_some() {
            let registry =
                crate::source::registry_hooks::router(settings.clone(), image_scans, metrics);
            hooks_app = hooks_app.merge(registry);
        }
    }
    let metrics_app = Router::new()
        .route("/metrics", get(metrics_text))
        .with_state(shared.clone());
    // What names the rollouts is answered only under the names it is served as (issue 70).
    let hosts = &config.allowed_host_names;
    let admin_app = hosts.guard(
        probes.clone().merge(metrics_app.clone()).merge(
            Router::new()
                .route("/status", get(status))
                .with_state(shared),
        ),
    );
    let metrics_app = hosts.guard(metrics_app);
    let hooks_refusals = config.webhook.as_ref().map(|_| {
        let refused: crate::serve::OnRefused = Arc::new(move || waker.missed());
        refused
    });
    let mut listeners = vec![
        ("webhooks", config.listen, hooks_app, hooks_refusals),
        ("metrics and status", config.admin_listen, admin_app, None),
    ];
    if let Some(addr) = config.probe_listen {
        listeners.push(("probes", addr, probes, None));
    }
    if let Some(addr) = config.metrics_listen {
        listeners.push(("metrics", addr, metrics_app, None));
    }
    if let Some(addr) = config.dashboard.listen {
        let app = dashboard(config, rollouts, client, fleet, source);
        listeners.push(("dashboard", addr, hosts.guard(app), None));
    }
    for (what, addr, app, on_refused) in listeners {
        let listener = bind(addr, what).await?;
        tracing::info!(addr = %listener.local_addr().map_err(|source| Error::Io { path: "listener".into(), source })?, serves = what, webhooks = config.webhook.is_some(), "listening");
        tasks.spawn(what, serve(listener, app, config.serve_limits, on_refused));
    }
    Ok(())
}

/// The dashboard's routes: the rollouts, their history in Git (with write-back) and the
/// fleet's view (with `--fleet`).
fn dashboard(
    config: &AgentConfig,
    rollouts: RolloutStores,
    client: kube::Client,
    fleet: Option<super::dashboard::FleetSnapshots>,
    source: Arc<AgentState>,
) -> Router {
    let history = config
        .writeback
        .as_ref()
        .map(|w| super::dashboard::StatusHistory {
            clone_dir: w.cache_dir.clone(),
            branch: w.remote.branch.clone(),
            cluster: w.cluster.name.clone(),
        });
    let feeds = super::dashboard::Feeds {
        fleet,
        source,
        actions: config.dashboard.actions.clone(),
    };
    super::dashboard::router(
        rollouts,
        client,
        history,
        config.dashboard.links.clone(),
        feeds,
    )
}

async fn bind(addr: SocketAddr, what: &str) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Io {
            path: format!("{addr} ({what})").into(),
            source,
        })
}

/// Alive: every loop has come round within the deadline ([`crate::liveness`]).
async fn healthz() -> (StatusCode, String) {
    let beats = crate::liveness::process();
    let missed = beats.missed(std::time::Instant::now());
    if missed.is_empty() {
        return (StatusCode::OK, "ok\n".into());
    }
    let named: Vec<String> = missed
        .iter()
        .map(|m| format!("{} (no heartbeat for {}s)", m.name, m.since.as_secs()))
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "not alive: {} missed the {}s deadline\n",
            named.join(", "),
            beats.deadline().as_secs()
        ),
    )
}

async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if shared.state.ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting to hold the lease (another replica acts) or for the first sync\n",
        )
    }
}

/// OpenMetrics when the scraper asks for it (Prometheus does), else the classic text format
/// (`promtool check metrics`, curl).
async fn metrics_text(
    State(shared): State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
) -> ([(&'static str, &'static str); 1], String) {
    use crate::telemetry::classic;
    let sets = shared.rollouts.statefulsets.store().state();
    let deploys = shared.rollouts.deployments.store().state();
    let sets = sets.iter().flat_map(|o| problems_of(o.as_ref()));
    let deploys = deploys.iter().flat_map(|o| problems_of(o.as_ref()));
    let text = shared.metrics.encode_with_rollouts(sets.chain(deploys));
    let accept = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    if classic::wants_openmetrics(accept) {
        let openmetrics = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        ([("content-type", openmetrics)], text)
    } else {
        let plain = "text/plain; version=0.0.4; charset=utf-8";
        ([("content-type", plain)], classic::to_classic(&text))
    }
}

/// Phases a rollout ends in when it did not get where Git asked.
const FAILED_PHASES: [&str; 3] = ["Failed", "RolledBack", "MigrationFailed"];

/// What `o` needs a person for (its Stalled condition, a phase it failed in, both or none),
/// and its canary's weight when it routes traffic.
fn problems_of<'a, R: RolloutView>(
    o: &'a R,
) -> impl Iterator<Item = (&'static str, &'a str, &'a str, RolloutSeries)> + use<'a, R> {
    let stalled = o
        .conditions()
        .iter()
        .find(|c| c.type_ == crate::api::condition::STALLED && c.status == "True")
        .map(|c| RolloutSeries::Stalled(c.reason.clone()));
    let failed = o
        .phase_name()
        .filter(|p| FAILED_PHASES.contains(p))
        .map(|p| RolloutSeries::Failed(p.to_string()));
    let weight = o.canary_weight().map(RolloutSeries::CanaryWeight);
    let meta = o.meta();
    let named = meta.namespace.as_deref().zip(meta.name.as_deref());
    [stalled, failed, weight]
        .into_iter()
        .flatten()
        .filter_map(move |p| named.map(|(ns, name)| (R::KIND, ns, name, p)))
}

/// A rollout's row: its kind as `kubectl get` takes it, and what its status says.
fn row<R: RolloutView>(o: &R) -> RolloutRow {
    RolloutRow {
        kind: R::SHORT_NAME.into(),
        namespace: o.meta().namespace.clone().unwrap_or_default(),
        name: o.meta().name.clone().unwrap_or_default(),
        phase: o.phase_name().map(str::to_string),
        ready: o.ready().map(str::to_string),
        message: o.message().map(str::to_string),
    }
}

async fn status(State(shared): State<Arc<Shared>>) -> axum::Json<StatusReport> {
    let sets = shared.rollouts.statefulsets.store().state();
    let deploys = shared.rollouts.deployments.store().state();
    let mut rollouts: Vec<RolloutRow> = sets
        .iter()
        .map(|o| row(o.as_ref()))
        .chain(deploys.iter().map(|o| row(o.as_ref())))
        .collect();
    rollouts
        .sort_by(|a, b| (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name)));
    axum::Json(StatusReport {
        source: shared.state.status(),
        rollouts_listed: shared.rollouts.listed(),
        rollouts,
        cluster: shared.cluster.clone(),
    })
}
