//! A CanaryStatefulSet's replica map for its page (`/api/rollouts/csts/…/replicas`): its
//! pods and claims as the API server has them now, drawn by `plan::replica_map`. Read when
//! the page opens, when the rollout changes and, while something is moving, when the page
//! asks again; never on a timer of the agent's.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::ListParams;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::Shared;
use crate::api::ROLLOUT_LABEL;
use crate::plan::observed::ClaimView;
use crate::plan::replica_map::{MapInput, PodFacts, replica_map};

/// The most pods or claims read for one rollout's map.
const LISTED: u32 = 1000;
/// How long the two lists may take together.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) async fn rollout_replicas(
    State(shared): State<Arc<Shared>>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let held = shared
        .rollouts
        .statefulsets
        .store()
        .get(&ObjectRef::new(&name).within(&namespace));
    let Some(rollout) = held else {
        return (StatusCode::NOT_FOUND, "no such rollout").into_response();
    };
    let own = ListParams::default()
        .labels(&format!("{ROLLOUT_LABEL}={name}"))
        .limit(LISTED);
    let pods = kube::Api::<Pod>::namespaced(shared.client.clone(), &namespace);
    let claims = kube::Api::<PersistentVolumeClaim>::namespaced(shared.client.clone(), &namespace);
    let read = async { tokio::try_join!(pods.list(&own), claims.list(&own)) };
    let (pods, claims) = match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(lists)) => lists,
        Ok(Err(e)) => {
            let why = crate::error::kube_message_hinted(
                &e,
                "; linnet's identity may not list pods or claims: grant it in deploy/rbac.yaml",
            );
            return (StatusCode::BAD_GATEWAY, why).into_response();
        }
        Err(_) => {
            return (
                StatusCode::GATEWAY_TIMEOUT,
                "the pods took over 5 s to list",
            )
                .into_response();
        }
    };
    // More than LISTED of either: the map shows the first, and says so.
    let truncated = pods
        .metadata
        .continue_
        .as_deref()
        .is_some_and(|c| !c.is_empty())
        || claims
            .metadata
            .continue_
            .as_deref()
            .is_some_and(|c| !c.is_empty());
    let container = rollout.spec.container.as_deref();
    let pods: Vec<PodFacts> = pods
        .items
        .iter()
        .filter_map(|p| PodFacts::from_object(p, container))
        .collect();
    let claims: Vec<ClaimView> = claims.items.iter().map(ClaimView::from_object).collect();
    let templates = crate::plan::objects::claim_templates(&rollout.spec);
    let status = rollout.status.as_ref();
    let rows = replica_map(&MapInput {
        rollout: &name,
        replicas: rollout.spec.replicas,
        templates: &templates,
        canary_image: status.and_then(|s| s.canary_image.as_deref()),
        stable_image: status.and_then(|s| s.stable_image.as_deref()),
        canary_revision: status.and_then(|s| s.canary_revision.as_deref()),
        pods: &pods,
        claims: &claims,
    });
    axum::Json(json!({"replicas": rows, "truncated": truncated})).into_response()
}
