//! Invariants every single plan keeps, whatever it observed: checked on each plan the simulation makes.

use super::*;

/// Invariants every single plan keeps, whatever it observed.
pub(super) fn check_plan(r: &Rollout<'_>, o: &Observed, p: &Plan) {
    let replicas = r.spec.replicas;
    let floor = replicas - r.spec.canary_replicas;
    // The canary never outgrows the step the new status records.
    let step = p.status.current_step.unwrap_or(0).max(0) as usize;
    let max_step = r
        .spec
        .steps
        .as_ref()
        .and_then(|s| s.get(step).copied())
        .unwrap_or(r.spec.canary_replicas);
    // Exactly one kstatus condition is true, and Ready only when settled on Git's image.
    if crate::plan::machine::tests::standing_of(&p.status.conditions)
        == crate::plan::machine::Standing::Settled
    {
        assert_eq!(p.status.phase, Some(Phase::Stable));
        assert_eq!(
            p.status.stable_image.as_deref(),
            Some(r.spec.image.as_str())
        );
        assert!(p.status.ready_replicas >= replicas, "{:?}", p.status);
    }
    for a in &p.actions {
        // Status is written before the actions run: a finished phase written in the same
        // plan as the canary's deletion was read, in the cluster tests, with the set still
        // there (regression: abort_by_annotation_rolls_back saw redis-canary at 0).
        if let Action::DeleteSet { name } = a {
            assert!(
                !(name.ends_with("-canary")
                    && matches!(p.status.phase, Some(Phase::Stable | Phase::RolledBack))),
                "{:?} written in the plan that deletes {name}",
                p.status.phase
            );
        }
        match a {
            Action::ApplySet(set) => {
                let spec = set.spec.as_ref().unwrap();
                let n = spec.replicas.unwrap();
                let name = set.metadata.name.as_deref().unwrap();
                if name.ends_with("-canary") {
                    assert!(n <= max_step, "canary set asks for {n} > {max_step}");
                } else if name.ends_with("-stable") {
                    assert!(n >= floor, "stable set asks for {n} < {floor}");
                    // Issue 44: the stable set shrinks only while the canary is absent or
                    // Ready (the first step's scale-down comes before the canary exists).
                    if let Some(stable) = &o.stable
                        && n < stable.replicas
                    {
                        assert!(
                            o.canary
                                .as_ref()
                                .is_none_or(|c| c.replicas == 0 || c.ready_replicas >= c.replicas),
                            "stable set scaled down to {n} while the canary is not Ready: {:?}",
                            o.canary
                        );
                    }
                }
                // Issue 44: no ordinal is asked of two sets at once.
                let start = spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0);
                let other = if name.ends_with("-canary") {
                    o.stable.as_ref()
                } else if name.ends_with("-stable") {
                    o.canary.as_ref()
                } else {
                    None
                };
                let planned_other = p.actions.iter().find_map(|a| match a {
                    Action::ApplySet(s)
                        if s.metadata.name.as_deref() == other.map(|o| o.name.as_str()) =>
                    {
                        s.spec.as_ref().map(|s| {
                            (
                                s.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0),
                                s.replicas.unwrap_or(0),
                            )
                        })
                    }
                    _ => None,
                });
                if let Some((other_start, other_n)) = planned_other {
                    let (a, b) = (start..start + n, other_start..other_start + other_n);
                    assert!(
                        a.end <= b.start || b.end <= a.start,
                        "{name} asks for ordinals {a:?}, and the other set for {b:?}"
                    );
                }
                if let Some(part) = spec
                    .update_strategy
                    .as_ref()
                    .and_then(|u| u.rolling_update.as_ref())
                    .and_then(|r| r.partition)
                {
                    assert!(part >= floor || part == 0, "partition {part} below {floor}");
                }
                let retention = spec
                    .persistent_volume_claim_retention_policy
                    .as_ref()
                    .unwrap();
                assert_eq!(retention.when_deleted.as_deref(), Some("Retain"));
                assert_eq!(retention.when_scaled.as_deref(), Some("Retain"));
            }
            Action::DeleteClaim { name, volume, to } => {
                let v = o.volumes.iter().find(|v| v.name == *volume).unwrap();
                assert!(
                    v.retain,
                    "claim {name} deleted while {volume} is not Retain"
                );
                assert_eq!(v.handoff_to.as_deref(), Some(to.as_str()));
                assert!(
                    o.claim(to).is_some(),
                    "claim {name} deleted before {to} exists"
                );
                let claim = o.claim(name).unwrap();
                assert_eq!(claim.volume.as_deref(), Some(volume.as_str()));
                let ordinal = name.rsplit('-').next().unwrap();
                assert!(
                    !o.pods
                        .iter()
                        .any(|p| name.ends_with(&format!("{}-{ordinal}", p.set))
                            && p.ordinal.to_string() == ordinal),
                    "claim {name} deleted while its pod runs"
                );
            }
            _ => {}
        }
    }
}
