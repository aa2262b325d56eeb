//! Which rollouts a new read of the fleet can change the answer for, so that only those are
//! reconciled again: every status commit of every cluster is a new read, and most change the
//! reports of one rollout.

use super::{FleetSnapshot, RolloutId};

/// What changed between two reads of the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetChange {
    /// The Fleet itself, its clusters or its readability: any rollout's answer may change.
    All,
    /// Only the reports of these rollouts (in any cluster).
    Rollouts(Vec<RolloutId>),
}

/// What changed from `before` (`None`: the first read) to `after`.
pub fn fleet_change(before: Option<&FleetSnapshot>, after: &FleetSnapshot) -> FleetChange {
    let Some(before) = before else {
        return FleetChange::All;
    };
    if before.name != after.name
        || before.spec != after.spec
        || before.clusters != after.clusters
        || before.problem != after.problem
    {
        return FleetChange::All;
    }
    let mut changed: Vec<RolloutId> = after
        .reports
        .iter()
        .filter(|(id, reports)| before.reports.get(*id) != Some(*reports))
        .map(|(id, _)| id.clone())
        .collect();
    changed.extend(
        before
            .reports
            .keys()
            .filter(|id| !after.reports.contains_key(*id))
            .cloned(),
    );
    FleetChange::Rollouts(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fleet::Report;

    fn id(name: &str) -> RolloutId {
        ("CanaryDeployment".into(), "shop".into(), name.into())
    }

    fn report(phase: &str) -> Report {
        Report {
            phase: phase.into(),
            stable_image: Some("web:1".into()),
            canary_image: None,
            wanted_image: Some("web:1".into()),
            since: None,
        }
    }

    #[test]
    fn a_status_commit_wakes_only_the_rollouts_whose_reports_changed() {
        let mut before = FleetSnapshot::default();
        for name in ["web", "api", "db"] {
            before
                .reports
                .insert(id(name), [("eu-1".to_string(), report("Completed"))].into());
        }
        assert_eq!(fleet_change(None, &before), FleetChange::All);
        let mut after = before.clone();
        after
            .reports
            .get_mut(&id("web"))
            .unwrap()
            .insert("eu-2".into(), report("Progressing"));
        after.reports.remove(&id("db"));
        assert_eq!(
            fleet_change(Some(&before), &after),
            FleetChange::Rollouts(vec![id("web"), id("db")])
        );
        assert_eq!(
            fleet_change(Some(&before), &before),
            FleetChange::Rollouts(vec![])
        );
        let mut approved = before.clone();
        approved.spec.report_deadline_seconds = 60;
        assert_eq!(fleet_change(Some(&before), &approved), FleetChange::All);
    }
}
