//! The dashboard's replica map of a CanaryStatefulSet: each ordinal with the pods that hold
//! it (stable or canary set, version, readiness, restarts) and each of its volumes with the
//! claim that holds it, or the two claims it is moving between during a handoff.
//!
//! Read from the pods and claims as they are, never from the plan: the map shows what the
//! cluster has, so a handoff cut off half-way shows half-way.

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::objects::{Role, claim_name};
use super::observed::{ClaimView, PodView};

/// Which of the rollout's sets a pod or claim belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Side {
    Stable,
    Canary,
    /// The one set of a Partition rollout.
    Single,
}

impl Side {
    const ALL: [Side; 3] = [Side::Stable, Side::Canary, Side::Single];

    fn role(self) -> Role {
        match self {
            Side::Stable => Role::Stable,
            Side::Canary => Role::Canary,
            Side::Single => Role::Single,
        }
    }

    /// The side of StatefulSet `set` of rollout `rollout`.
    fn of_set(rollout: &str, set: &str) -> Option<Side> {
        Side::ALL
            .into_iter()
            .find(|s| s.role().set_name(rollout) == set)
    }
}

/// One pod of the map: only what a person needs to see, never the pod template.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaPod {
    pub name: String,
    pub side: Side,
    pub ordinal: i32,
    /// Whether it runs the canary's version: its set is the canary set, or (Partition) its
    /// revision is the canary revision.
    pub canary: bool,
    pub image: Option<String>,
    pub ready: bool,
    /// Restarts of all its containers (init containers too), as the kubelet counts them.
    pub restarts: i32,
    /// Why a container is not running (`CrashLoopBackOff`, `ImagePullBackOff`), if one waits.
    pub waiting: Option<String>,
    pub deleting: bool,
}

/// A pod as the map reads it: the rollout's pod, with its set and ordinal.
#[derive(Clone, Debug, PartialEq)]
pub struct PodFacts {
    pub view: PodView,
    pub restarts: i32,
    pub waiting: Option<String>,
}

impl PodFacts {
    /// `None` for a pod no StatefulSet owns.
    pub fn from_object(pod: &Pod, container: Option<&str>) -> Option<PodFacts> {
        let view = PodView::from_object(pod, container)?;
        let statuses = pod.status.iter().flat_map(|s| {
            let init = s.init_container_statuses.iter().flatten();
            init.chain(s.container_statuses.iter().flatten())
        });
        let mut restarts: i32 = 0;
        let mut waiting = None;
        for c in statuses {
            restarts = restarts.saturating_add(c.restart_count.max(0));
            let reason = c.state.as_ref().and_then(|s| s.waiting.as_ref());
            if waiting.is_none() {
                waiting = reason.and_then(|w| w.reason.clone());
            }
        }
        Some(PodFacts {
            view,
            restarts,
            waiting,
        })
    }
}

/// One volume of an ordinal: which claim holds it, or where it is going.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaVolume {
    /// The claim template (`data`).
    pub template: String,
    /// The PersistentVolume.
    pub volume: String,
    /// The side whose claim is bound to it; `None` while no claim is (between two claims).
    pub held_by: Option<Side>,
    /// The claim bound to it, if one is.
    pub claim: Option<String>,
    /// The side whose claim names it but is not bound yet: the handoff is moving it there.
    pub moving_to: Option<Side>,
    /// Another claim of the same replica holds another volume: two volumes for one replica
    /// (a claim made again on a new, empty volume), what stops a rollout (VolumeSwapped).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub conflict: bool,
}

/// One ordinal of the map.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaRow {
    pub ordinal: i32,
    pub pods: Vec<ReplicaPod>,
    pub volumes: Vec<ReplicaVolume>,
}

/// The most ordinals drawn from `spec.replicas` (anyone who may scale the rollout sets it).
pub const MAX_ORDINALS: i32 = 1000;

/// What the map is drawn from.
pub struct MapInput<'a> {
    pub rollout: &'a str,
    pub replicas: i32,
    /// The spec's claim templates.
    pub templates: &'a [String],
    /// `status.canaryImage` and `status.stableImage`: which of a Partition's pods run the
    /// canary (its image, while the two differ), in every phase, Failed and a rollback too.
    pub canary_image: Option<&'a str>,
    pub stable_image: Option<&'a str>,
    /// `status.canaryRevision`: which run the canary when the two images are the same (a
    /// template change).
    pub canary_revision: Option<&'a str>,
    pub pods: &'a [PodFacts],
    pub claims: &'a [ClaimView],
}

/// The ordinals `0..replicas` (at most [`MAX_ORDINALS`]), and any other one a pod or a moving
/// claim still has (a scale-down under way), in order.
pub fn replica_map(input: &MapInput) -> Vec<ReplicaRow> {
    let mut ordinals: Vec<i32> = (0..input.replicas.clamp(0, MAX_ORDINALS)).collect();
    ordinals.extend(
        input
            .pods
            .iter()
            .filter(|p| Side::of_set(input.rollout, &p.view.set).is_some())
            .map(|p| p.view.ordinal),
    );
    // A claim of an ordinal scaled away stays (the sets retain them): only one still moving
    // (unbound, or going) shows its ordinal.
    ordinals.extend(
        input
            .claims
            .iter()
            .filter(|c| !c.bound || c.deleting)
            .filter_map(|c| claim_ordinal(input, &c.name)),
    );
    ordinals.sort_unstable();
    ordinals.dedup();
    ordinals
        .into_iter()
        .map(|ordinal| ReplicaRow {
            ordinal,
            pods: pods_at(input, ordinal),
            volumes: input
                .templates
                .iter()
                .flat_map(|t| volumes_at(input, t, ordinal))
                .collect(),
        })
        .collect()
}

fn pods_at(input: &MapInput, ordinal: i32) -> Vec<ReplicaPod> {
    let mut pods: Vec<ReplicaPod> = input
        .pods
        .iter()
        .filter(|p| p.view.ordinal == ordinal)
        .filter_map(|p| {
            let side = Side::of_set(input.rollout, &p.view.set)?;
            let canary = match side {
                Side::Canary => true,
                Side::Stable => false,
                Side::Single => match (input.canary_image, input.stable_image) {
                    (Some(canary), stable) if Some(canary) != stable => {
                        p.view.image.as_deref() == Some(canary)
                    }
                    _ => {
                        input.canary_revision.is_some()
                            && p.view.revision.as_deref() == input.canary_revision
                    }
                },
            };
            Some(ReplicaPod {
                name: p.view.name.clone(),
                side,
                ordinal,
                canary,
                image: p.view.image.clone(),
                ready: p.view.ready,
                restarts: p.restarts,
                waiting: p.waiting.clone(),
                deleting: p.view.deleting,
            })
        })
        .collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    pods
}

/// The ordinal of claim `name`, if it is one of the rollout's templates' claims.
fn claim_ordinal(input: &MapInput, name: &str) -> Option<i32> {
    input.templates.iter().find_map(|t| {
        Side::ALL.into_iter().find_map(|side| {
            let prefix = format!("{t}-{}-", side.role().set_name(input.rollout));
            name.strip_prefix(&prefix)?.parse().ok()
        })
    })
}

/// Template `template`'s volumes at `ordinal`: the replica's (held by the side whose claim is
/// bound to it, moving to the side whose claim names it unbound), then any other volume a
/// claim of the other side is bound to, marked as a conflict.
fn volumes_at(input: &MapInput, template: &str, ordinal: i32) -> Vec<ReplicaVolume> {
    let claims: Vec<(Side, &ClaimView)> = Side::ALL
        .into_iter()
        .filter_map(|side| {
            let name = claim_name(template, &side.role().set_name(input.rollout), ordinal);
            let claim = input.claims.iter().find(|c| c.name == name)?;
            Some((side, claim))
        })
        .filter(|(_, c)| !c.deleting || c.bound)
        .collect();
    let held = |v: &str| {
        claims
            .iter()
            .find(|(_, c)| c.bound && c.volume.as_deref() == Some(v))
    };
    // The volume a handoff is moving (named by an unbound claim) is the replica's data;
    // otherwise the first bound claim's.
    let moving = claims.iter().find(|(_, c)| !c.bound && c.volume.is_some());
    let first = match moving {
        Some((side, c)) => c.volume.clone().map(|v| (v, Some(*side))),
        None => claims
            .iter()
            .find(|(_, c)| c.bound)
            .and_then(|(_, c)| c.volume.clone())
            .map(|v| (v, None)),
    };
    let Some((volume, moving_to)) = first else {
        return Vec::new();
    };
    let others: Vec<(Side, &ClaimView)> = claims
        .iter()
        .filter(|(_, c)| c.bound && c.volume.as_deref().is_some_and(|v| v != volume))
        .copied()
        .collect();
    let conflict = !others.is_empty();
    let holder = held(&volume);
    let mut out = vec![ReplicaVolume {
        template: template.to_string(),
        held_by: holder.map(|(s, _)| *s),
        claim: holder.map(|(_, c)| c.name.clone()),
        volume,
        moving_to,
        conflict,
    }];
    out.extend(others.into_iter().map(|(side, c)| ReplicaVolume {
        template: template.to_string(),
        volume: c.volume.clone().unwrap_or_default(),
        held_by: Some(side),
        claim: Some(c.name.clone()),
        moving_to: None,
        conflict: true,
    }));
    out
}

#[cfg(test)]
mod tests;
