//! The dashboard (`--dashboard-listen`, off by default): one read-only page of every rollout,
//! and a page per rollout, updated live from the agent's shared rollout store by server-sent
//! events (no polling). The page, its script and its style are built into the binary; no
//! framework. It shows what the status says and a few spec fields (replicas, strategy,
//! steps, image), never a pod template, so nothing from a Secret or an env value is shown.
//! With `--dashboard-actions`, a person signed in with a Kubernetes token may promote, advance
//! or abort a rollout: each click becomes a pull request in Git ([`actions`]).

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use crate::api::{CanaryDeployment, CanaryStatefulSet, RolloutView};
use crate::watch::rollouts::{Change, RolloutStores};

use super::state::AgentState;

pub use links::{Links, commit_link};

pub use actions::ActionsConfig;

mod access;
mod actions;
mod history;
mod links;
mod replicas;
mod session;
mod sign_in;

const PAGE: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/app.js");
const STYLE: &str = include_str!("dashboard/style.css");

/// What the flags say of the dashboard.
#[derive(Clone, Debug, Default)]
pub struct DashboardConfig {
    /// `--dashboard-listen`: off when not given.
    pub listen: Option<std::net::SocketAddr>,
    /// Its links to a trace and to a commit.
    pub links: Links,
    /// `--dashboard-actions`: sign-in, and actions as pull requests.
    pub actions: Option<ActionsConfig>,
}

/// Where the status branch's history is read: the write-back clone and its branch.
#[derive(Clone, Debug)]
pub struct StatusHistory {
    pub clone_dir: std::path::PathBuf,
    pub branch: String,
    /// This agent's cluster: its directory of status files.
    pub cluster: String,
}

/// What the handlers read.
struct Shared {
    rollouts: RolloutStores,
    client: kube::Client,
    history: Option<StatusHistory>,
    fleet: Option<FleetSnapshots>,
    source: Arc<AgentState>,
    actions: Option<actions::Actions>,
}

/// What the page follows besides the rollouts: the fleet's view (with `--fleet`) and the
/// source's state (its revision, its last sync, the errors in its specs).
pub struct Feeds {
    pub fleet: Option<FleetSnapshots>,
    pub source: Arc<AgentState>,
    /// `--dashboard-actions`: sign-in and actions as pull requests.
    pub actions: Option<ActionsConfig>,
}

/// The fleet's snapshots as the fleet loop reads them from Git.
pub type FleetSnapshots =
    tokio::sync::watch::Receiver<Option<Arc<crate::plan::fleet::FleetSnapshot>>>;

/// Where the fleet stands (`linnet fleet status --output json`, from this agent's last read
/// of Git): `{"fleet": null}` without `--fleet`, `{"fleet": null, "reading": true}` before the
/// first read.
async fn fleet_view(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    let Some(fleet) = &shared.fleet else {
        return axum::Json(json!({"fleet": null}));
    };
    let snapshot = fleet.borrow().clone();
    axum::Json(match snapshot {
        Some(s) => crate::plan::fleet::view::as_json(&s, jiff::Timestamp::now()),
        None => json!({"fleet": null, "reading": true}),
    })
}

/// The dashboard's routes over `rollouts`; `client` reads a rollout's Kubernetes events,
/// `history` (with `--writeback`) its status file's commits.
pub fn router(
    rollouts: RolloutStores,
    client: kube::Client,
    history: Option<StatusHistory>,
    links: Links,
    feeds: Feeds,
) -> Router {
    let _ = LINKS.set(links);
    let actions = feeds.actions.and_then(|config| {
        actions::Actions::start(config, client.clone())
            .inspect_err(|e| tracing::error!(error = %e, "dashboard actions are off"))
            .ok()
    });
    let _ = ACTIONS_ON.set(actions.is_some());
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route(
            "/app.js",
            get(|| async { asset("text/javascript", SCRIPT) }),
        )
        .route("/style.css", get(|| async { asset("text/css", STYLE) }))
        .route("/api/rollouts", get(all))
        .route(
            "/api/rollouts/{short}/{namespace}/{name}/events",
            get(rollout_events),
        )
        .route(
            "/api/rollouts/{short}/{namespace}/{name}/history",
            get(rollout_history),
        )
        .route(
            "/api/rollouts/csts/{namespace}/{name}/replicas",
            get(replicas::rollout_replicas),
        )
        .route("/api/events", get(events))
        .route("/api/fleet", get(fleet_view))
        .route("/api/source", get(source_view))
        .route(
            "/api/session",
            get(sign_in::whoami)
                .post(sign_in::sign_in)
                .delete(sign_in::sign_out)
                .layer(axum::extract::DefaultBodyLimit::max(SIGN_IN_BYTES)),
        )
        .route(
            "/api/rollouts/{short}/{namespace}/{name}/actions/{action}",
            axum::routing::post(actions::act),
        )
        .with_state(Arc::new(Shared {
            rollouts,
            client,
            history,
            fleet: feeds.fleet,
            source: feeds.source,
            actions,
        }))
}

/// The most a sign-in's body may be: a token is a few kilobytes.
const SIGN_IN_BYTES: usize = 16 * 1024;

/// Whether the actions are on: the page offers their buttons.
static ACTIONS_ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// The most events shown for a rollout, newest first.
const EVENTS_SHOWN: usize = 20;

/// The kind of rollout `short`/`namespace`/`name`, if the store holds it. Only such a
/// rollout is looked up: the names go into a field selector and a path, and the page shows
/// this agent's rollouts, not whatever else the agent may read.
fn held_kind(shared: &Shared, short: &str, namespace: &str, name: &str) -> Option<&'static str> {
    use kube::runtime::reflector::ObjectRef;
    match short {
        "csts" => shared
            .rollouts
            .statefulsets
            .store()
            .get(&ObjectRef::new(name).within(namespace))
            .map(|_| CanaryStatefulSet::KIND),
        "cdeploy" => shared
            .rollouts
            .deployments
            .store()
            .get(&ObjectRef::new(name).within(namespace))
            .map(|_| CanaryDeployment::KIND),
        _ => None,
    }
}

/// A rollout's status file history on the status branch (`--writeback`), newest first.
async fn rollout_history(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path((short, namespace, name)): axum::extract::Path<(String, String, String)>,
) -> axum::response::Response {
    if held_kind(&shared, &short, &namespace, &name).is_none() {
        return (axum::http::StatusCode::NOT_FOUND, "no such rollout").into_response();
    }
    let Some(h) = shared.history.clone() else {
        return axum::Json(json!({"off": "write-back is off (--writeback): no status branch"}))
            .into_response();
    };
    let file = crate::writeback::status_files::path(&h.cluster, &namespace, &name);
    let read =
        tokio::task::spawn_blocking(move || history::of_file(&h.clone_dir, &h.branch, &file));
    match tokio::time::timeout(std::time::Duration::from_secs(5), read).await {
        Ok(Ok(Ok(changes))) => axum::Json(json!({"history": changes})).into_response(),
        Ok(Ok(Err(e))) => (
            axum::http::StatusCode::BAD_GATEWAY,
            format!("cannot read the status branch: {}", e.message()),
        )
            .into_response(),
        _ => (
            axum::http::StatusCode::GATEWAY_TIMEOUT,
            "the status branch took over 5 s to read",
        )
            .into_response(),
    }
}

/// A rollout's Kubernetes events (events.k8s.io), newest first: read when its page opens
/// and when it changes, never on a timer.
async fn rollout_events(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path((short, namespace, name)): axum::extract::Path<(String, String, String)>,
) -> axum::response::Response {
    use k8s_openapi::api::events::v1::Event as KubeEvent;
    let Some(kind) = held_kind(&shared, &short, &namespace, &name) else {
        return (axum::http::StatusCode::NOT_FOUND, "no such rollout").into_response();
    };
    let api: kube::Api<KubeEvent> = kube::Api::namespaced(shared.client.clone(), &namespace);
    let params = kube::api::ListParams::default()
        .fields(&format!("regarding.kind={kind},regarding.name={name}"))
        .limit(200);
    let listed = match api.list(&params).await {
        Ok(l) => l,
        Err(e) => {
            let why = crate::error::kube_message_hinted(
                &e,
                "; linnet's identity may not list events: grant it in deploy/rbac.yaml",
            );
            return (axum::http::StatusCode::BAD_GATEWAY, why).into_response();
        }
    };
    let mut rows: Vec<(String, Value)> = listed
        .items
        .iter()
        .map(|e| {
            let at = e
                .deprecated_last_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
                .or_else(|| {
                    e.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string())
                })
                .unwrap_or_default();
            let row = json!({
                "time": at,
                "type": e.type_,
                "reason": e.reason,
                "note": e.note,
                "controller": e.reporting_controller,
                "count": e.series.as_ref().map_or(1, |s| s.count),
            });
            (at, row)
        })
        .collect();
    rows.sort_by(|a, b| b.0.cmp(&a.0));
    let rows: Vec<Value> = rows
        .into_iter()
        .take(EVENTS_SHOWN)
        .map(|(_, r)| r)
        .collect();
    axum::Json(Value::Array(rows)).into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            ("content-type", content_type),
            ("cache-control", "no-cache"),
        ],
        body,
    )
}

/// What the page shows of any rollout.
/// `--trace-link` and `--commit-link`: one per process, like the dashboard.
static LINKS: std::sync::OnceLock<Links> = std::sync::OnceLock::new();

fn common<R: RolloutView>(o: &R, spec: Value, status: Value) -> Value {
    let meta = o.meta();
    let links = LINKS.get();
    let trace_url = o
        .trace_id()
        .zip(links.and_then(|l| l.trace.as_ref()))
        .map(|(id, link)| link.replace("{traceId}", id));
    json!({
        "kind": R::KIND,
        "short": R::SHORT_NAME,
        "namespace": meta.namespace,
        "name": meta.name,
        "created": meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
        "phase": o.phase_name(),
        "phaseSince": o.phase_since().map(|t| t.0.to_string()),
        "ready": o.ready(),
        "message": o.message(),
        "stableImage": o.stable_image(),
        "canaryImage": o.canary_image(),
        "specImage": o.spec_image(),
        "revision": o.source_revision(),
        "serving": o.serving(),
        "traffic": o.traffic(),
        "weight": o.canary_weight(),
        "step": o.step(),
        "batch": o.batch(),
        "traceId": o.trace_id(),
        "traceUrl": trace_url,
        "commitLink": links.and_then(|l| l.commit.as_ref()),
        "spec": spec,
        "status": status,
    })
}

fn statefulset(o: &CanaryStatefulSet) -> Value {
    let mut v = common(
        o,
        json!({
            "replicas": o.spec.replicas,
            "canaryReplicas": o.spec.canary_replicas,
            "strategy": o.spec.strategy,
            "steps": o.spec.steps,
        }),
        serde_json::to_value(&o.status).unwrap_or(Value::Null),
    );
    v["approval"] = json!(crate::plan::approval::statefulset_approval(o));
    v["actions"] = offered(|a| crate::plan::approval::statefulset_action(o, a).is_ok());
    v
}

/// The actions that apply to a rollout now (none while actions are off).
fn offered(applies: impl Fn(crate::plan::approval::DashboardAction) -> bool) -> Value {
    use crate::plan::approval::DashboardAction as A;
    if !ACTIONS_ON.get().copied().unwrap_or(false) {
        return json!([]);
    }
    let names: Vec<&str> = [A::Promote, A::Advance, A::Abort]
        .into_iter()
        .filter(|a| applies(*a))
        .map(A::name)
        .collect();
    json!(names)
}

fn deployment(o: &CanaryDeployment) -> Value {
    let mut v = common(
        o,
        json!({
            "replicas": o.spec.replicas,
            "batches": o.spec.batches,
            "strategy": o.spec.strategy,
        }),
        serde_json::to_value(&o.status).unwrap_or(Value::Null),
    );
    v["approval"] = json!(crate::plan::approval::deployment_approval(o));
    v["actions"] = offered(|a| crate::plan::approval::deployment_action(o, a).is_ok());
    v
}

/// Every rollout the store holds, and whether it is complete.
fn snapshot(rollouts: &RolloutStores) -> Value {
    let sets = rollouts.statefulsets.store().state();
    let deploys = rollouts.deployments.store().state();
    let all: Vec<Value> = sets
        .iter()
        .map(|o| statefulset(o))
        .chain(deploys.iter().map(|o| deployment(o)))
        .collect();
    json!({"listed": rollouts.listed(), "rollouts": all})
}

async fn all(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    axum::Json(snapshot(&shared.rollouts))
}

fn change_event<K>(change: Change<K>, card: fn(&K) -> Value) -> Event {
    let (name, data) = match &change {
        Change::Applied(o) => ("rollout", card(o)),
        Change::Deleted(o) => ("deleted", card(o)),
    };
    Event::default().event(name).data(data.to_string())
}

/// The fleet's view now and at each new read of Git (nothing without `--fleet`).
fn fleet_events(fleet: Option<FleetSnapshots>) -> impl Stream<Item = Event> + Send {
    futures::stream::unfold((fleet, true), |(rx, first)| async move {
        let mut rx = rx?;
        if !first {
            rx.changed().await.ok()?;
        }
        let snapshot = rx.borrow_and_update().clone();
        let view = match snapshot {
            Some(s) => crate::plan::fleet::view::as_json(&s, jiff::Timestamp::now()),
            None => json!({"fleet": null, "reading": true}),
        };
        let event = Event::default().event("fleet").data(view.to_string());
        Some((event, (Some(rx), false)))
    })
}

/// The source as the page shows it: `/status`'s source part (its name, the revision synced,
/// when, the last error, the located errors in its specs and the objects not applied), and
/// the commit link.
fn source_json(state: &AgentState) -> Value {
    let mut v = serde_json::to_value(state.status()).unwrap_or(Value::Null);
    v["commitLink"] = json!(LINKS.get().and_then(|l| l.commit.as_ref()));
    v
}

async fn source_view(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    axum::Json(source_json(&shared.source))
}

/// The source now and each time its state changes (a change that shows the same is not sent).
fn source_events(state: Arc<AgentState>) -> impl Stream<Item = Event> + Send {
    let rx = state.subscribe();
    futures::stream::unfold(
        (state, rx, None::<String>),
        |(state, mut rx, last)| async move {
            loop {
                let now = source_json(&state).to_string();
                if last.as_deref() != Some(now.as_str()) {
                    let event = Event::default().event("source").data(&now);
                    return Some((event, (state, rx, Some(now))));
                }
                rx.changed().await.ok()?;
            }
        },
    )
}

/// The whole list first, then each rollout as it changes (and the fleet, with `--fleet`).
async fn events(
    State(shared): State<Arc<Shared>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let changes = shared.rollouts.subscribe();
    let first = Event::default()
        .event("snapshot")
        .data(snapshot(&shared.rollouts).to_string());
    let sets = changes
        .statefulsets
        .map(|c| change_event(c, |o: &CanaryStatefulSet| statefulset(o)));
    let deploys = changes
        .deployments
        .map(|c| change_event(c, |o: &CanaryDeployment| deployment(o)));
    let fleet = fleet_events(shared.fleet.clone());
    let source = source_events(shared.source.clone());
    let stream = futures::stream::once(async move { first })
        .chain(futures::stream::select(
            futures::stream::select(sets, deploys),
            futures::stream::select(fleet, source),
        ))
        .map(Ok);
    Sse::new(stream).keep_alive(KeepAlive::default())
}
