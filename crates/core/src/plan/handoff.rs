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

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use super::actions::Action;
use super::objects::{Role, RolloutRef, claim_name, handoff_claim};
use super::observed::Observed;
use super::observed::{ClaimView, VolumeView};
use crate::api::{
    CanaryStatefulSetSpec, HANDOFF_TO_ANNOTATION, ROLLOUT_LABEL, VOLUME_NAMESPACE_LABEL,
};

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

/// One volume to move: replica `ordinal`'s of claim template `template`, from set `from` to
/// set `to`; `own` is the replica's own volume when the rollout recorded it
/// (`status.replicaVolumes`).
#[derive(Clone, Copy, Debug)]
pub struct Move<'a> {
    pub template: &'a str,
    pub ordinal: i32,
    pub from: Role,
    pub to: Role,
    pub own: Option<&'a str>,
}

/// The volume claim `dst`, else claim `src`, names: the replica's volume as a handoff finds it.
pub fn named_volume<'o>(observed: &'o Observed, src: &str, dst: &str) -> Option<&'o str> {
    [dst, src]
        .into_iter()
        .find_map(|n| observed.claim(n)?.volume.as_deref())
}

/// The next step of a [`Move`].
pub fn handoff_step(
    rollout: &RolloutRef,
    spec: &CanaryStatefulSetSpec,
    observed: &Observed,
    m: Move<'_>,
) -> HandoffStep {
    let Move {
        template,
        ordinal,
        from,
        to,
        own,
    } = m;
    let from_set = from.set_name(&rollout.name);
    let src_name = claim_name(template, &from_set, ordinal);
    let dst_name = claim_name(template, &to.set_name(&rollout.name), ordinal);
    let src = observed.claim(&src_name);
    let dst = observed.claim(&dst_name);
    // A claim of the replica on another volume than its own (deleted with its pod, made again
    // by the StatefulSet controller): never handed on; the planner fails the rollout.
    if let Some(own) = own
        && let Some(c) = [src, dst]
            .into_iter()
            .flatten()
            .find(|c| c.volume.as_deref() != Some(own))
    {
        return HandoffStep::Waiting(format!(
            "claim {} is not on replica {ordinal}'s own volume {own}; leaving it alone",
            c.name
        ));
    }

    if src.is_none() && dst.is_some_and(|d| d.bound) {
        return HandoffStep::Done;
    }
    let claims = Claims {
        src,
        dst,
        src_name: &src_name,
        dst_name: &dst_name,
    };
    let volume = match replica_volume(observed, &claims, own, ordinal) {
        Ok(volume) => volume,
        Err(waiting) => return waiting,
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
    match src {
        Some(src) => release_source(observed, src, (&from_set, ordinal), volume, &dst_name),
        None => bind_target(dst, volume),
    }
}

/// The replica's two claims: the one it leaves (`src`) and the one it moves to (`dst`).
struct Claims<'o, 'n> {
    src: Option<&'o ClaimView>,
    dst: Option<&'o ClaimView>,
    src_name: &'n str,
    dst_name: &'n str,
}

/// The volume is the one a live claim names: the target claim (linnet pre-creates it with
/// `volumeName`), else the source claim. The target exists before the source is deleted, so
/// one of them always names it. Annotations and `claimRef`s are not enough: a volume left
/// Released by an earlier rollout of the same name carries the same ones. `Err`: more than
/// one volume could be the replica's.
fn replica_volume<'o>(
    observed: &'o Observed,
    claims: &Claims<'o, '_>,
    own: Option<&str>,
    ordinal: i32,
) -> Result<Option<&'o VolumeView>, HandoffStep> {
    let (src_name, dst_name) = (claims.src_name, claims.dst_name);
    let by_name = |name: &str| observed.volumes.iter().find(|v| v.name == name);
    let named = claims
        .dst
        .and_then(|d| d.volume.as_deref())
        .and_then(by_name)
        .or_else(|| {
            claims
                .src
                .and_then(|s| s.volume.as_deref())
                .and_then(by_name)
        });
    if named.is_some() || claims.src.is_some() || claims.dst.is_some() {
        return Ok(named);
    }
    // Both claims gone (deleted by hand): the replica's volume is the rollout's Retain volume
    // whose claimRef still names one of them and that no live claim holds. Going on without
    // it would let the StatefulSet controller give the replica a new, empty volume.
    let orphaned: Vec<&VolumeView> = observed
        .volumes
        .iter()
        .filter(|v| {
            v.retain
                && own.is_none_or(|own| v.name == own)
                && v.claim
                    .as_ref()
                    .is_some_and(|(n, _)| n == src_name || n == dst_name)
                && !observed
                    .claims
                    .iter()
                    .any(|c| c.volume.as_deref() == Some(v.name.as_str()))
        })
        .collect();
    match orphaned.as_slice() {
        [] => Ok(None),
        [only] => Ok(Some(*only)),
        several => {
            let names: Vec<&str> = several.iter().map(|v| v.name.as_str()).collect();
            Err(HandoffStep::Waiting(format!(
                "claims {src_name} and {dst_name} are gone, and volumes {} could each hold replica \
                 {ordinal}'s data; point the one to keep at {dst_name} (or remove the other's \
                 claimRef) to carry on",
                names.join(", ")
            )))
        }
    }
}

/// The target claim exists: the source claim is deleted once no pod of `set` `ordinal`
/// uses it (its volume stays, retained).
fn release_source(
    observed: &Observed,
    src: &ClaimView,
    (set, ordinal): (&str, i32),
    volume: &VolumeView,
    dst_name: &str,
) -> HandoffStep {
    let src_name = &src.name;
    if src.volume.as_deref() != Some(volume.name.as_str()) {
        return HandoffStep::Waiting(format!(
            "claim {src_name} is not bound to {}; leaving it alone",
            volume.name
        ));
    }
    if observed.pods_of(set).any(|p| p.ordinal == ordinal) {
        return HandoffStep::Waiting(format!("pod {set}-{ordinal} still uses {src_name}"));
    }
    if src.deleting {
        return HandoffStep::Waiting(format!("claim {src_name} is being deleted"));
    }
    HandoffStep::Act(Action::DeleteClaim {
        name: src_name.clone(),
        volume: volume.name.clone(),
        to: dst_name.to_string(),
    })
}

/// The source claim is gone: the volume is pointed at the target claim, which is asked to
/// bind it.
fn bind_target(dst: &ClaimView, volume: &VolumeView) -> HandoffStep {
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
    HandoffStep::Waiting(format!("claim {} to bind volume {}", dst.name, volume.name))
}

/// A patch the handoff makes to a PersistentVolume.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum VolumePatch<'a> {
    /// Retain, labelled with the rollout, annotated with the claim it goes to.
    Retain,
    /// `claimRef` pointed at `claim` (uid `claim_uid`), which the handoff created.
    Bind { claim: &'a str, claim_uid: &'a str },
}

/// Whether an earlier handoff of `rollout` in `ns` labelled volume `pv`.
fn marked_by(pv: &PersistentVolume, ns: &str, rollout: &str) -> bool {
    label(&pv.metadata, ROLLOUT_LABEL) == Some(rollout)
        && label(&pv.metadata, VOLUME_NAMESPACE_LABEL) == Some(ns)
}

fn label<'m>(
    meta: &'m k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'m str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Why the handoff of rollout `rollout` in namespace `ns` may not make `patch` to `pv`, if it
/// may not. Checked against the cluster right before every patch: a volume is the rollout's
/// only when its `claimRef` names, by namespace, name and uid, a live claim of the rollout, or
/// (its claim deleted since) when an earlier, checked patch marked it as the rollout's.
/// `named`: the claim in `ns` that the `claimRef`'s name names, if any; `target`: for a bind,
/// the claim it goes to.
pub fn volume_refusal(
    pv: &PersistentVolume,
    ns: &str,
    rollout: &str,
    named: Option<&PersistentVolumeClaim>,
    target: Option<&PersistentVolumeClaim>,
    patch: VolumePatch<'_>,
) -> Option<String> {
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Some("it is bound to no claim, so to none of the rollout's".into());
    };
    let (ref_ns, ref_name) = (
        claim_ref.namespace.as_deref().unwrap_or_default(),
        claim_ref.name.as_deref().unwrap_or_default(),
    );
    if ref_ns != ns {
        return Some(format!(
            "its claimRef names {ref_ns}/{ref_name}, a claim in another namespace"
        ));
    }
    let of_rollout = |c: &PersistentVolumeClaim| {
        c.metadata.namespace.as_deref() == Some(ns)
            && label(&c.metadata, ROLLOUT_LABEL) == Some(rollout)
    };
    // The claim the claimRef names, if it is still the same claim (same uid).
    let holder = named.filter(|c| {
        c.metadata.name.as_deref() == Some(ref_name)
            && c.metadata.uid.is_some()
            && c.metadata.uid == claim_ref.uid
    });
    let marked = marked_by(pv, ns, rollout);
    match patch {
        VolumePatch::Retain => match holder {
            Some(c) if of_rollout(c) => None,
            Some(_) => Some(format!(
                "it is bound to claim {ns}/{ref_name}, which is not one of rollout {rollout}'s"
            )),
            None if marked => None,
            None => Some(format!(
                "its claim {ns}/{ref_name} is gone, and no earlier handoff of rollout {rollout} \
                 marked it"
            )),
        },
        VolumePatch::Bind { claim, claim_uid } => {
            let handed_to = pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(HANDOFF_TO_ANNOTATION))
                .map(String::as_str);
            if !marked || handed_to != Some(claim) {
                return Some(format!(
                    "no checked handoff of rollout {rollout} marked it for claim {claim}"
                ));
            }
            let target_ok = target.is_some_and(|t| {
                of_rollout(t)
                    && t.metadata.name.as_deref() == Some(claim)
                    && t.metadata.uid.as_deref() == Some(claim_uid)
            });
            if !target_ok {
                return Some(format!(
                    "claim {ns}/{claim} (uid {claim_uid}) is not a live claim of rollout {rollout}"
                ));
            }
            match holder {
                Some(c) if c.metadata.name.as_deref() != Some(claim) => {
                    Some(format!("it is still bound to live claim {ns}/{ref_name}"))
                }
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod volume_refusal_tests {
    use super::*;

    fn pv(
        claim_ns: &str,
        claim: &str,
        uid: &str,
        marked_for: Option<(&str, &str)>,
    ) -> PersistentVolume {
        let mut labels = serde_json::Map::new();
        let mut annotations = serde_json::Map::new();
        if let Some((rollout, to)) = marked_for {
            labels.insert(ROLLOUT_LABEL.into(), rollout.into());
            labels.insert(VOLUME_NAMESPACE_LABEL.into(), "shop".into());
            annotations.insert(HANDOFF_TO_ANNOTATION.into(), to.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1", "labels": labels, "annotations": annotations},
            "spec": {"claimRef": {"namespace": claim_ns, "name": claim, "uid": uid}},
        }))
        .unwrap_or_default()
    }

    fn claim(ns: &str, name: &str, uid: &str, rollout: &str) -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": uid,
                "labels": {ROLLOUT_LABEL: rollout}},
        }))
        .unwrap_or_default()
    }

    #[test]
    fn a_volume_bound_to_the_rollouts_claim_may_be_retained() {
        let src = claim("shop", "data-db-stable-0", "u1", "db");
        let v = pv("shop", "data-db-stable-0", "u1", None);
        assert_eq!(
            volume_refusal(&v, "shop", "db", Some(&src), None, VolumePatch::Retain),
            None
        );
    }

    #[test]
    fn another_namespaces_volume_is_never_touched() {
        // A claim template naming someone else's volume, or a same-named rollout elsewhere.
        let v = pv(
            "bank",
            "data-db-stable-0",
            "u9",
            Some(("db", "data-db-canary-0")),
        );
        let src = claim("shop", "data-db-stable-0", "u1", "db");
        let e = volume_refusal(&v, "shop", "db", Some(&src), None, VolumePatch::Retain).unwrap();
        assert!(e.contains("another namespace"), "{e}");
        let dst = claim("shop", "data-db-canary-0", "u2", "db");
        let bind = VolumePatch::Bind {
            claim: "data-db-canary-0",
            claim_uid: "u2",
        };
        assert!(volume_refusal(&v, "shop", "db", None, Some(&dst), bind).is_some());
    }

    #[test]
    fn a_volume_of_a_claim_that_is_not_the_rollouts_is_refused() {
        let other = claim("shop", "data-db-stable-0", "u1", "cache");
        let v = pv("shop", "data-db-stable-0", "u1", None);
        assert!(
            volume_refusal(&v, "shop", "db", Some(&other), None, VolumePatch::Retain).is_some()
        );
        // Same name, recreated (another uid), and never marked: not provably the rollout's.
        let recreated = claim("shop", "data-db-stable-0", "u7", "db");
        assert!(
            volume_refusal(
                &v,
                "shop",
                "db",
                Some(&recreated),
                None,
                VolumePatch::Retain
            )
            .is_some()
        );
    }

    #[test]
    fn a_marked_volume_moves_only_to_the_claim_it_was_marked_for() {
        let v = pv(
            "shop",
            "data-db-stable-0",
            "u1",
            Some(("db", "data-db-canary-0")),
        );
        let dst = claim("shop", "data-db-canary-0", "u2", "db");
        let bind = VolumePatch::Bind {
            claim: "data-db-canary-0",
            claim_uid: "u2",
        };
        assert_eq!(
            volume_refusal(&v, "shop", "db", None, Some(&dst), bind),
            None
        );
        let elsewhere = VolumePatch::Bind {
            claim: "evil",
            claim_uid: "u3",
        };
        let evil = claim("shop", "evil", "u3", "db");
        assert!(volume_refusal(&v, "shop", "db", None, Some(&evil), elsewhere).is_some());
        // Still held by its live source claim: not released yet.
        let src = claim("shop", "data-db-stable-0", "u1", "db");
        let e = volume_refusal(&v, "shop", "db", Some(&src), Some(&dst), bind).unwrap();
        assert!(e.contains("still bound"), "{e}");
    }
}
