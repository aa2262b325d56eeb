//! The volume handoff, one replica at a time: the PersistentVolume of replica k moves from
//! `<claim>-<from>-k` to `<claim>-<to>-k`, so the pod that takes over ordinal k finds its data.
//!
//! 1. The volume is set to Retain and annotated with the claim it goes to.
//! 2. The new claim is created with `volumeName` set (it stays Pending for now).
//! 3. The old claim is deleted, once no pod of the old set uses it.
//! 4. The released volume's `claimRef` is pointed at the new claim.
//! 5. The new claim is annotated with the volume. The PV controller binds a claim when the
//!    claim changes, or at its resync (about 15 s, most of a canary's start before); the
//!    annotation is that change, so the claim binds at once.
//!
//! Each call looks at the cluster as it is and returns the next step, so a handoff cut off at
//! any point carries on where it stopped. A claim deleted by hand is recreated on its volume
//! (found by its `claimRef`) before the volume moves on. A claim is deleted only when its volume is Retain
//! and marked for a new claim that exists; a volume is never deleted.

use super::actions::Action;
use super::objects::{Role, RolloutRef, claim_name, handoff_claim};
use super::observed::Observed;
use crate::api::CanaryStatefulSetSpec;

/// Where the handoff of one volume stands.
#[derive(Clone, Debug, PartialEq)]
pub enum HandoffStep {
    /// The volume is bound to the target claim (or replica k never had one).
    Done,
    /// Waiting for the cluster; the text says for what.
    Waiting(String),
    /// The next step.
    Act(Action),
}

/// The next step of moving replica `ordinal`'s volume of claim template `template` from set
/// `from` to set `to`.
pub fn handoff_step(
    rollout: &RolloutRef,
    spec: &CanaryStatefulSetSpec,
    observed: &Observed,
    template: &str,
    ordinal: i32,
    from: Role,
    to: Role,
) -> HandoffStep {
    let from_set = from.set_name(&rollout.name);
    let src_name = claim_name(template, &from_set, ordinal);
    let dst_name = claim_name(template, &to.set_name(&rollout.name), ordinal);
    let src = observed.claim(&src_name);
    let dst = observed.claim(&dst_name);

    if src.is_none() && dst.is_some_and(|d| d.bound) {
        return HandoffStep::Done;
    }
    // The volume is the one a live claim names: the target claim (linnet pre-creates it with
    // `volumeName`), else the source claim. The target exists before the source is deleted, so
    // one of them always names it. Annotations and `claimRef`s are not enough: a volume left
    // Released by an earlier rollout of the same name carries the same ones.
    let by_name = |name: &str| observed.volumes.iter().find(|v| v.name == name);
    let volume = dst
        .and_then(|d| d.volume.as_deref())
        .and_then(by_name)
        .or_else(|| src.and_then(|s| s.volume.as_deref()).and_then(by_name));
    // Both claims gone (deleted by hand): the replica's volume is the rollout's Retain volume
    // whose claimRef still names one of them and that no live claim holds. Going on without
    // it would let the StatefulSet controller give the replica a new, empty volume.
    let orphaned: Vec<_> = if src.is_none() && dst.is_none() {
        observed
            .volumes
            .iter()
            .filter(|v| {
                v.retain
                    && v.claim
                        .as_ref()
                        .is_some_and(|(n, _)| *n == src_name || *n == dst_name)
                    && !observed
                        .claims
                        .iter()
                        .any(|c| c.volume.as_deref() == Some(v.name.as_str()))
            })
            .collect()
    } else {
        Vec::new()
    };
    let volume = match (volume, orphaned.as_slice()) {
        (Some(v), _) => Some(v),
        (None, [only]) => Some(*only),
        (None, []) => None,
        (None, several) => {
            let names: Vec<&str> = several.iter().map(|v| v.name.as_str()).collect();
            return HandoffStep::Waiting(format!(
                "claims {src_name} and {dst_name} are gone, and volumes {} could each hold replica \
                 {ordinal}'s data; point the one to keep at {dst_name} (or remove the other's \
                 claimRef) to carry on",
                names.join(", ")
            ));
        }
    };
    let Some(volume) = volume else {
        return match (src, dst) {
            (None, None) => HandoffStep::Done,
            (Some(s), _) if !s.bound => {
                HandoffStep::Waiting(format!("claim {src_name} is not bound to a volume yet"))
            }
            _ => HandoffStep::Waiting(format!("looking for the volume of {src_name}")),
        };
    };
    if !volume.retain || volume.handoff_to.as_deref() != Some(dst_name.as_str()) {
        return HandoffStep::Act(Action::RetainVolume {
            volume: volume.name.clone(),
            handoff_to: dst_name,
        });
    }
    let Some(dst) = dst else {
        return HandoffStep::Act(Action::CreateClaim(Box::new(handoff_claim(
            rollout,
            spec,
            template,
            to,
            ordinal,
            &volume.name,
            volume.storage_class.as_deref(),
        ))));
    };
    if let Some(src) = src {
        if src.volume.as_deref() != Some(volume.name.as_str()) {
            return HandoffStep::Waiting(format!(
                "claim {src_name} is not bound to {}; leaving it alone",
                volume.name
            ));
        }
        if observed.pods_of(&from_set).any(|p| p.ordinal == ordinal) {
            return HandoffStep::Waiting(format!("pod {from_set}-{ordinal} still uses {src_name}"));
        }
        if src.deleting {
            return HandoffStep::Waiting(format!("claim {src_name} is being deleted"));
        }
        return HandoffStep::Act(Action::DeleteClaim {
            name: src_name,
            volume: volume.name.clone(),
            to: dst_name,
        });
    }
    let bound_to_dst = volume
        .claim
        .as_ref()
        .is_some_and(|(n, uid)| *n == dst.name && uid.as_deref() == Some(dst.uid.as_str()));
    if !bound_to_dst {
        return HandoffStep::Act(Action::BindVolume {
            volume: volume.name.clone(),
            claim: dst.name.clone(),
            claim_uid: dst.uid.clone(),
        });
    }
    if dst.bind_requested.as_deref() != Some(volume.name.as_str()) {
        return HandoffStep::Act(Action::RequestBind {
            claim: dst.name.clone(),
            volume: volume.name.clone(),
        });
    }
    HandoffStep::Waiting(format!("claim {dst_name} to bind volume {}", volume.name))
}
