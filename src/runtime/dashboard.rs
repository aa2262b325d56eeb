//! The dashboard (`--dashboard-listen`, off by default): one read-only page of every rollout,
//! and a page per rollout, updated live from the agent's shared rollout store by server-sent
//! events (no polling). The page, its script and its style are built into the binary; no
//! framework. It shows what the status says and a few spec fields (replicas, strategy,
//! steps, image), never a pod template, so nothing from a Secret or an env value is shown.

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

const PAGE: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/app.js");
const STYLE: &str = include_str!("dashboard/style.css");

/// The dashboard's routes over `rollouts`.
pub fn router(rollouts: RolloutStores) -> Router {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route(
            "/app.js",
            get(|| async { asset("text/javascript", SCRIPT) }),
        )
        .route("/style.css", get(|| async { asset("text/css", STYLE) }))
        .route("/api/rollouts", get(all))
        .route("/api/events", get(events))
        .with_state(Arc::new(rollouts))
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
fn common<R: RolloutView>(o: &R, spec: Value, status: Value) -> Value {
    let meta = o.meta();
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
        "spec": spec,
        "status": status,
    })
}

fn statefulset(o: &CanaryStatefulSet) -> Value {
    common(
        o,
        json!({
            "replicas": o.spec.replicas,
            "canaryReplicas": o.spec.canary_replicas,
            "strategy": o.spec.strategy,
            "steps": o.spec.steps,
        }),
        serde_json::to_value(&o.status).unwrap_or(Value::Null),
    )
}

fn deployment(o: &CanaryDeployment) -> Value {
    common(
        o,
        json!({
            "replicas": o.spec.replicas,
            "batches": o.spec.batches,
            "strategy": o.spec.strategy,
        }),
        serde_json::to_value(&o.status).unwrap_or(Value::Null),
    )
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

async fn all(State(rollouts): State<Arc<RolloutStores>>) -> axum::Json<Value> {
    axum::Json(snapshot(&rollouts))
}

fn change_event<K>(change: Change<K>, card: fn(&K) -> Value) -> Event {
    let (name, data) = match &change {
        Change::Applied(o) => ("rollout", card(o)),
        Change::Deleted(o) => ("deleted", card(o)),
    };
    Event::default().event(name).data(data.to_string())
}

/// The whole list first, then each rollout as it changes.
async fn events(
    State(rollouts): State<Arc<RolloutStores>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let changes = rollouts.subscribe();
    let first = Event::default()
        .event("snapshot")
        .data(snapshot(&rollouts).to_string());
    let sets = changes
        .statefulsets
        .map(|c| change_event(c, |o: &CanaryStatefulSet| statefulset(o)));
    let deploys = changes
        .deployments
        .map(|c| change_event(c, |o: &CanaryDeployment| deployment(o)));
    let stream = futures::stream::once(async move { first })
        .chain(futures::stream::select(sets, deploys))
        .map(Ok);
    Sse::new(stream).keep_alive(KeepAlive::default())
}
