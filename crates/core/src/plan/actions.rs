//! What a plan asks the controller to do. Every variant is one idempotent API call; none of
//! them deletes a PersistentVolume, and [`Action::DeleteClaim`] exists only for a handoff.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};

/// One thing for the controller to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create or update a StatefulSet (server-side apply).
    ApplySet(Box<StatefulSet>),
    /// Set a StatefulSet's replicas (used when a rollout is deleted).
    ScaleSet { name: String, replicas: i32 },
    /// Scale a Deployment without touching its template (one whose image cannot be read).
    ScaleDeployment { name: String, replicas: i32 },
    /// Delete a StatefulSet whose pods are already gone; its claims stay.
    DeleteSet { name: String },
    /// Set a volume's reclaim policy to Retain and mark which claim it is being handed to.
    RetainVolume { volume: String, handoff_to: String },
    /// Create the claim a volume is handed to (bound to it by `volumeName`).
    CreateClaim(Box<PersistentVolumeClaim>),
    /// Delete a claim inside a handoff: its volume is already Retain and marked for `to`.
    DeleteClaim {
        name: String,
        volume: String,
        to: String,
    },
    /// Point a released volume's `claimRef` at its new claim.
    BindVolume {
        volume: String,
        claim: String,
        claim_uid: String,
    },
    /// Annotate a claim whose volume now points at it, so that the PV controller, woken by
    /// the claim's update, binds them now.
    RequestBind { claim: String, volume: String },
    /// Create the migration Job (owned by the rollout).
    CreateJob(Box<Job>),
    /// Delete a pod stuck on a bad revision, so its set can recreate it.
    DeletePod { name: String },
    /// Create or update a CanaryDeployment's Deployment (server-side apply).
    ApplyDeployment(Box<Deployment>),
    /// Delete a Deployment that serves no traffic any more.
    DeleteDeployment { name: String },
    /// Create or update one of a rollout's two Services (server-side apply).
    ApplyService(Box<Service>),
    /// Replace an HTTPRoute's or GRPCRoute's `spec.rules` (guarded by its resourceVersion when
    /// known), and mark it as weighed by `owner` (`<Kind>/<name>`).
    UpdateRoute {
        kind: crate::api::RouteKind,
        name: String,
        rules: serde_json::Value,
        resource_version: Option<String>,
        owner: String,
    },
    /// Point a Service of the user's at one version (its selector's version label), marked as
    /// switched by `owner`; with no version, hand it back (the label taken out).
    SwitchService {
        name: String,
        version: Option<String>,
        owner: String,
    },
}

/// What a phase machine decided: the status to write, then the actions to take, the events
/// to publish and when to look again. Both kinds' plans are this.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned<S, P> {
    pub status: S,
    pub actions: Vec<Action>,
    pub events: Vec<PlanEvent>,
    /// A real timer: a bake time, a measurement or the progress deadline.
    pub requeue_after: Option<Duration>,
    /// Every phase this plan entered, in order (usually none or one).
    pub entered: Vec<P>,
}

/// An event to publish on the rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanEvent {
    pub warning: bool,
    /// PascalCase, e.g. `CanaryStarted`.
    pub reason: &'static str,
    pub message: String,
}

impl Action {
    /// The action in words, for logs and status messages.
    pub fn describe(&self) -> String {
        let name = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            m.name.clone().unwrap_or_default()
        };
        match self {
            Action::ApplySet(s) => format!("apply StatefulSet {}", name(&s.metadata)),
            Action::ScaleSet { name, replicas } => {
                format!("scale StatefulSet {name} to {replicas}")
            }
            Action::ScaleDeployment { name, replicas } => {
                format!("scale Deployment {name} to {replicas}")
            }
            Action::DeleteSet { name } => format!("delete StatefulSet {name} (its claims stay)"),
            Action::RetainVolume { volume, handoff_to } => {
                format!("set volume {volume} to Retain for handoff to {handoff_to}")
            }
            Action::CreateClaim(c) => format!(
                "create claim {} for volume {}",
                name(&c.metadata),
                c.spec
                    .as_ref()
                    .and_then(|s| s.volume_name.clone())
                    .unwrap_or_default()
            ),
            Action::DeleteClaim { name, volume, to } => {
                format!("release volume {volume} from claim {name} (moving to {to})")
            }
            Action::BindVolume { volume, claim, .. } => {
                format!("bind volume {volume} to claim {claim}")
            }
            Action::RequestBind { claim, volume } => {
                format!("ask the PV controller to bind claim {claim} to volume {volume}")
            }
            Action::CreateJob(j) => format!("create Job {}", name(&j.metadata)),
            Action::DeletePod { name } => format!("delete stuck pod {name}"),
            Action::ApplyDeployment(d) => format!(
                "apply Deployment {} ({} replicas)",
                name(&d.metadata),
                d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
            ),
            Action::DeleteDeployment { name } => format!("delete Deployment {name}"),
            Action::ApplyService(s) => format!("apply Service {}", name(&s.metadata)),
            Action::UpdateRoute {
                kind, name, rules, ..
            } => {
                let weight = rules.as_array().and_then(|rules| {
                    rules.iter().find_map(|r| {
                        let refs = r.get("backendRefs")?.as_array()?;
                        (refs.len() == 2).then(|| refs[1].get("weight")?.as_i64())?
                    })
                });
                match weight {
                    Some(w) => format!("set {} {name} to {w}% canary", kind.kind()),
                    None => format!("update {} {name}", kind.kind()),
                }
            }
            Action::SwitchService {
                name,
                version: Some(v),
                ..
            } => format!("point Service {name} at version {v}"),
            Action::SwitchService { name, .. } => {
                format!("hand Service {name}'s selector back (no version)")
            }
        }
    }

    /// Whether the action is one of traffic routing's (a Service or a route).
    pub fn is_traffic(&self) -> bool {
        matches!(
            self,
            Action::ApplyService(_) | Action::UpdateRoute { .. } | Action::SwitchService { .. }
        )
    }
}
