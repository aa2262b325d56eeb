//! Where a fleet stands, per rollout, wave and cluster, as `linnet fleet status` and the
//! dashboard show it: the image the fleet moves and each cluster's state for it, with the
//! fleet's own answer for a cluster that waits. Pure, from a [`FleetSnapshot`] and `now`.

use jiff::Timestamp;
use serde_json::json;

use super::{ClusterState, FleetReports, FleetSnapshot, Gate, cluster_state};
use crate::api::ClusterIdentity;

/// One rollout's row per cluster, wave by wave.
pub struct RolloutView {
    pub id: (String, String, String),
    pub image: Option<String>,
    pub rows: Vec<Row>,
}

pub struct Row {
    pub wave: String,
    pub cluster: String,
    pub state: String,
    pub phase: String,
    pub stable: String,
    pub canary: String,
}

/// Every rollout the fleet has reports of: the image it moves (the newest any cluster asks
/// for) and each cluster's state for it.
pub fn fleet_view(snapshot: &FleetSnapshot, now: Timestamp) -> Vec<RolloutView> {
    let mut views = Vec::new();
    for (id, reports) in &snapshot.reports {
        let image = reports
            .values()
            .filter(|r| r.wanted_image.is_some())
            .max_by_key(|r| r.since)
            .and_then(|r| r.wanted_image.clone());
        let found = FleetReports {
            clusters: snapshot.clusters.clone(),
            reports: reports.clone(),
        };
        let mut rows = Vec::new();
        for (k, clusters) in found.waves(&snapshot.spec).into_iter().enumerate() {
            let wave = &snapshot.spec.waves[k];
            for c in clusters {
                let report = reports.get(&c);
                let state = match &image {
                    None => "no image reported".to_string(),
                    Some(image) => {
                        state_text(snapshot, &found, (id, &c, image), wave.bake_seconds, now)
                    }
                };
                rows.push(Row {
                    wave: wave.name.clone(),
                    state,
                    phase: report.map_or("-".into(), |r| r.phase.clone()),
                    stable: report
                        .and_then(|r| r.stable_image.clone())
                        .unwrap_or("-".into()),
                    canary: report
                        .and_then(|r| r.canary_image.clone())
                        .unwrap_or("-".into()),
                    cluster: c,
                });
            }
        }
        views.push(RolloutView {
            id: id.clone(),
            image,
            rows,
        });
    }
    views
}

/// A cluster's state for `image`, and for one that waits, why (the fleet's own answer).
fn state_text(
    snapshot: &FleetSnapshot,
    found: &FleetReports,
    ((kind, ns, name), cluster, image): (&(String, String, String), &str, &str),
    bake: i64,
    now: Timestamp,
) -> String {
    match cluster_state(found.reports.get(cluster), image, bake, now) {
        ClusterState::Done => "done".into(),
        ClusterState::Baking(until) => format!("baking until {until}"),
        ClusterState::Rolling(phase) => format!("rolling ({phase})"),
        ClusterState::Failed(phase) => format!("failed ({phase})"),
        ClusterState::Waiting | ClusterState::NotReported(_) => {
            let me = snapshot
                .clusters
                .get(cluster)
                .cloned()
                .unwrap_or(ClusterIdentity {
                    name: cluster.to_string(),
                    ..Default::default()
                });
            match snapshot.gate(&me, (kind, ns, name), image, now) {
                Gate::Hold(h) => format!("held: {}", h.message),
                Gate::Open { .. } => "may start".into(),
                Gate::Free(why) => why,
            }
        }
    }
}

/// The view as one JSON object (`linnet fleet status --output json`, the dashboard's
/// `/api/fleet`).
pub fn as_json(snapshot: &FleetSnapshot, now: Timestamp) -> serde_json::Value {
    let rollouts: Vec<serde_json::Value> = fleet_view(snapshot, now)
        .into_iter()
        .map(|v| {
            json!({
                "kind": v.id.0, "namespace": v.id.1, "name": v.id.2, "image": v.image,
                "clusters": v.rows.iter().map(|r| json!({
                    "wave": r.wave, "cluster": r.cluster, "state": r.state,
                    "phase": r.phase, "stable": r.stable, "canary": r.canary,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "fleet": snapshot.name,
        "problem": snapshot.problem,
        "clusters": snapshot.clusters.keys().collect::<Vec<_>>(),
        "rollouts": rollouts,
    })
}
