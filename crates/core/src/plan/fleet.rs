//! Fleets (issue 73): whether this cluster may start a rollout's new image, decided from the
//! `Fleet` in Git and the status files every cluster of the fleet wrote to Git, and nothing
//! else (no agent reaches another cluster). Pure: the same Git and the same `now` give the
//! same answer, so an agent restarted mid-wave decides again exactly as before.
//!
//! A cluster of wave k may start image X once every cluster of waves 0..k reports X Stable
//! (a CanaryDeployment: Completed) for at least its wave's bake time, no cluster reports X
//! failed, and, for a manual wave, `spec.approvals` has X for wave k.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use crate::api::{AnalysisGate, AnalysisRef, ClusterIdentity, FleetSpec, RolloutAnalysis};

/// One cluster's status file of one rollout, as read from Git.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub phase: String,
    pub stable_image: Option<String>,
    pub canary_image: Option<String>,
    /// The image the cluster's spec asks for (Git's, as that cluster renders it).
    pub wanted_image: Option<String>,
    /// When the phase began.
    pub since: Option<Timestamp>,
}

/// What one cluster's report says about image X.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterState {
    /// X is Stable there and baked.
    Done,
    /// X is Stable there, baking until then.
    Baking(Timestamp),
    /// The cluster is rolling X out (in this phase).
    Rolling(String),
    /// The cluster's spec asks for X, and the fleet holds it.
    Waiting,
    /// X failed there (in this phase: rolled back or failed).
    Failed(String),
    /// No report of X from this cluster (nor any report at all: `None`).
    NotReported(Option<String>),
}

/// Phases in which a rollout gave up its canary.
const FAILED_PHASES: &[&str] = &["RollingBack", "RolledBack", "Failed", "MigrationFailed"];
/// Phases in which a rollout runs its stable image only.
const DONE_PHASES: &[&str] = &["Stable", "Completed"];

/// What `report` (of a cluster of a wave with `bake` seconds) says about image `image`.
pub fn cluster_state(
    report: Option<&Report>,
    image: &str,
    bake: i64,
    now: Timestamp,
) -> ClusterState {
    let Some(r) = report else {
        return ClusterState::NotReported(None);
    };
    let is = |i: &Option<String>| i.as_deref() == Some(image);
    if FAILED_PHASES.contains(&r.phase.as_str()) && (is(&r.canary_image) || is(&r.wanted_image)) {
        return ClusterState::Failed(r.phase.clone());
    }
    if DONE_PHASES.contains(&r.phase.as_str()) && is(&r.stable_image) {
        let until = r
            .since
            .and_then(|s| s.checked_add(SignedDuration::from_secs(bake.max(0))).ok());
        return match until {
            Some(until) if until > now => ClusterState::Baking(until),
            _ => ClusterState::Done,
        };
    }
    if is(&r.canary_image) {
        return ClusterState::Rolling(r.phase.clone());
    }
    if is(&r.wanted_image) {
        return ClusterState::Waiting;
    }
    ClusterState::NotReported(Some(format!(
        "{} on {}",
        r.phase,
        r.stable_image.as_deref().unwrap_or("no image")
    )))
}

/// Every cluster of the fleet and its reports of one rollout, as found in Git.
#[derive(Clone, Debug, Default)]
pub struct FleetReports {
    /// The clusters that said who they are (their `--cluster-label`s), by name.
    pub clusters: BTreeMap<String, ClusterIdentity>,
    /// Each cluster's status file of the rollout, by cluster name.
    pub reports: BTreeMap<String, Report>,
}

impl FleetReports {
    /// The clusters of each wave: those that said who they are, and those a wave names that
    /// did not (yet). A cluster in no wave is not in the fleet.
    pub fn waves(&self, fleet: &FleetSpec) -> Vec<Vec<String>> {
        let mut waves = vec![Vec::new(); fleet.waves.len()];
        let mut known: Vec<ClusterIdentity> = self.clusters.values().cloned().collect();
        for w in &fleet.waves {
            for c in &w.clusters {
                if !self.clusters.contains_key(c) {
                    known.push(ClusterIdentity {
                        name: c.clone(),
                        labels: BTreeMap::new(),
                    });
                }
            }
        }
        for c in known {
            if let Some(i) = fleet.wave_of(&c)
                && !waves[i].contains(&c.name)
            {
                waves[i].push(c.name);
            }
        }
        for w in &mut waves {
            w.sort();
        }
        waves
    }
}

/// Whether the fleet lets this cluster start its rollout's new image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// The fleet does not hold this rollout here: why (not one of the fleet's rollouts, or this
    /// cluster in no wave).
    Free(String),
    /// This cluster's wave may start the image.
    Open { wave: String },
    /// Not yet (or, for [`HoldReason::FailedInFleet`], not this image).
    Hold(Hold),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub wave: String,
    pub reason: HoldReason,
    /// Names the clusters and times it waits for.
    pub message: String,
    /// When the answer may change with no new Git (a bake ending, a deadline passing).
    pub recheck_at: Option<Timestamp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldReason {
    /// A cluster of an earlier wave is still rolling the image out (or waiting itself).
    EarlierWave,
    /// Every cluster before has the image; some still bake.
    Baking,
    /// A cluster of an earlier wave has not reported the image past the deadline.
    NotReporting,
    /// A manual wave, with no approval of the image in the Fleet.
    AwaitingApproval,
    /// The image failed in a cluster of the fleet: no wave starts it.
    FailedInFleet,
    /// The Fleet in Git has an error: no wave can be known.
    FleetUnreadable,
}

impl HoldReason {
    /// The condition reason (CamelCase, stable).
    pub fn as_str(self) -> &'static str {
        match self {
            HoldReason::EarlierWave => "WaitingForEarlierWave",
            HoldReason::Baking => "EarlierWaveBaking",
            HoldReason::NotReporting => "ClusterNotReporting",
            HoldReason::AwaitingApproval => "AwaitingApproval",
            HoldReason::FailedInFleet => "FailedInFleet",
            HoldReason::FleetUnreadable => "FleetUnreadable",
        }
    }
}

/// The fleet's answer for rollout `kind` `namespace/name` in cluster `me`, whose spec asks for
/// `image`.
pub fn gate(
    fleet_name: &str,
    fleet: &FleetSpec,
    me: &ClusterIdentity,
    (kind, namespace, name): (&str, &str, &str),
    image: &str,
    found: &FleetReports,
    now: Timestamp,
) -> Gate {
    if !fleet.moves(kind, namespace, name) {
        return Gate::Free(format!(
            "{namespace}/{name} is not one of fleet {fleet_name}'s rollouts"
        ));
    }
    let Some(k) = fleet.wave_of(me) else {
        return Gate::Free(format!(
            "cluster {} is in no wave of fleet {fleet_name}",
            me.name
        ));
    };
    let wave = fleet.waves[k].name.clone();
    let hold = |reason, message, recheck_at| {
        Gate::Hold(Hold {
            wave: wave.clone(),
            reason,
            message,
            recheck_at,
        })
    };
    // A failure anywhere stops the image everywhere it has not started.
    if let Some((c, phase)) = failed_elsewhere(found, &me.name, image, now) {
        let message = format!(
            "{image} failed in cluster {c} ({phase}); fleet {fleet_name} starts it nowhere else"
        );
        return hold(HoldReason::FailedInFleet, message, None);
    }
    let deadline = report_deadline(fleet, found, image);
    let e = earlier_waves(fleet, found, (k, &me.name), image, (deadline, now));
    if !e.late.is_empty() {
        let message = format!(
            "wave {wave} waits for {image} in {}: not reported within {}s",
            e.late.join(", "),
            fleet.report_deadline_seconds
        );
        return hold(HoldReason::NotReporting, message, None);
    }
    if !e.rolling.is_empty() {
        let message = format!("wave {wave} waits for {image} in {}", e.rolling.join(", "));
        return hold(
            HoldReason::EarlierWave,
            message,
            deadline.filter(|d| *d > now),
        );
    }
    if !e.baking.is_empty() {
        let message = format!(
            "wave {wave} waits for {image} to bake in {}",
            e.baking.join(", ")
        );
        return hold(HoldReason::Baking, message, e.bake_ends);
    }
    if fleet.waves[k].approval == crate::api::WaveApprovalMode::Manual
        && !fleet.approved(&wave, image)
    {
        let message = format!(
            "wave {wave} waits for an approval of {image} in fleet {fleet_name} \
             (spec.approvals: {{wave: {wave}, image: {image}}})"
        );
        return hold(HoldReason::AwaitingApproval, message, None);
    }
    Gate::Open { wave }
}

/// A cluster other than `me` where `image` failed, and the phase it failed in.
fn failed_elsewhere(
    found: &FleetReports,
    me: &str,
    image: &str,
    now: Timestamp,
) -> Option<(String, String)> {
    found.reports.iter().find_map(
        |(c, r)| match (c != me, cluster_state(Some(r), image, 0, now)) {
            (true, ClusterState::Failed(phase)) => Some((c.clone(), phase)),
            _ => None,
        },
    )
}

/// When a cluster that has not reported `image` counts as silent: the fleet's deadline after
/// the first report of it anywhere.
fn report_deadline(fleet: &FleetSpec, found: &FleetReports, image: &str) -> Option<Timestamp> {
    let first = found
        .reports
        .values()
        .filter(|r| {
            [&r.wanted_image, &r.canary_image, &r.stable_image]
                .iter()
                .any(|i| i.as_deref() == Some(image))
        })
        .filter_map(|r| r.since)
        .min()?;
    first
        .checked_add(SignedDuration::from_secs(fleet.report_deadline_seconds))
        .ok()
}

/// What the clusters of the waves before wave `k` say about `image`, each named with its
/// wave: still rolling (or waiting, or silent within the deadline), silent past it, baking.
#[derive(Default)]
struct Earlier {
    rolling: Vec<String>,
    late: Vec<String>,
    baking: Vec<String>,
    bake_ends: Option<Timestamp>,
}

fn earlier_waves(
    fleet: &FleetSpec,
    found: &FleetReports,
    (k, me): (usize, &str),
    image: &str,
    (deadline, now): (Option<Timestamp>, Timestamp),
) -> Earlier {
    let mut e = Earlier::default();
    let mut silent = Vec::new();
    for (j, clusters) in found.waves(fleet).iter().enumerate().take(k) {
        let w = &fleet.waves[j];
        for c in clusters.iter().filter(|c| c.as_str() != me) {
            match cluster_state(found.reports.get(c), image, w.bake_seconds, now) {
                ClusterState::Done | ClusterState::Failed(_) => {}
                ClusterState::Baking(until) => {
                    e.baking.push(format!("{c} ({} until {until})", w.name));
                    e.bake_ends = Some(e.bake_ends.map_or(until, |t| t.max(until)));
                }
                ClusterState::Rolling(phase) => {
                    e.rolling.push(format!("{c} ({}: {phase})", w.name))
                }
                ClusterState::Waiting => e.rolling.push(format!("{c} ({}: waiting)", w.name)),
                ClusterState::NotReported(last) => {
                    let said = last.map_or("no status yet".into(), |l| format!("last {l}"));
                    match deadline {
                        Some(d) if d <= now => e.late.push(format!("{c} ({}: {said})", w.name)),
                        _ => silent.push(format!("{c} ({}: {said})", w.name)),
                    }
                }
            }
        }
    }
    e.rolling.extend(silent);
    e
}

/// Where a fleet's rollout image failed, for the other clusters that took it to put back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetFailure {
    pub cluster: String,
    /// The phase it failed in there.
    pub phase: String,
    /// The image that cluster went back to.
    pub good: String,
}

/// A rollout as a fleet names it: kind, namespace, name.
pub type RolloutId = (String, String, String);

/// Everything an agent read from Git about its fleet: the Fleet, each cluster that said who
/// it is, and each cluster's status file of each of the fleet's rollouts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetSnapshot {
    pub name: String,
    pub spec: FleetSpec,
    pub clusters: BTreeMap<String, ClusterIdentity>,
    /// By rollout, then by cluster name.
    pub reports: BTreeMap<RolloutId, BTreeMap<String, Report>>,
    /// Why the Fleet could not be read (a located error): every new image then waits, since
    /// no wave can be known.
    pub problem: Option<String>,
}

/// Rollout analysis `own` with `wave`'s templates joined to it: to the gate after the
/// rollout's last step or batch (`last`), which must pass before it completes, or, for a
/// rollout with no such gate (a rolling CanaryDeployment), to its background analysis. An
/// argument both set keeps the rollout's value.
pub fn with_wave_analysis(
    own: Option<&RolloutAnalysis>,
    wave: &AnalysisRef,
    last: Option<i32>,
) -> RolloutAnalysis {
    let mut merged = own.cloned().unwrap_or_default();
    let (templates, args) = match last {
        Some(after) => {
            let i = match merged.gates.iter().position(|g| g.after == after) {
                Some(i) => i,
                None => {
                    merged.gates.push(AnalysisGate {
                        after,
                        templates: Vec::new(),
                        args: Vec::new(),
                    });
                    merged.gates.len() - 1
                }
            };
            let g = &mut merged.gates[i];
            (&mut g.templates, &mut g.args)
        }
        None => {
            let b = merged.background.get_or_insert_with(|| AnalysisRef {
                templates: Vec::new(),
                args: Vec::new(),
            });
            (&mut b.templates, &mut b.args)
        }
    };
    for t in &wave.templates {
        if !templates.contains(t) {
            templates.push(t.clone());
        }
    }
    for a in &wave.args {
        if !args.iter().any(|x| x.name == a.name) {
            args.push(a.clone());
        }
    }
    merged
}

impl FleetSnapshot {
    /// Whether a revert of rollout `kind` `namespace/name` may edit a base the fleet's
    /// overlays share (`onFailure: revert`, and the fleet moves the rollout).
    pub fn reverts_shared_base(&self, (kind, namespace, name): (&str, &str, &str)) -> bool {
        self.problem.is_none()
            && self.spec.on_failure == crate::api::FleetFailurePolicy::Revert
            && self.spec.moves(kind, namespace, name)
    }

    /// With `onFailure: revert`, a failure of `image` of rollout `kind` `namespace/name` in a
    /// cluster of the fleet other than `me` (in a wave), which went back to another image:
    /// `me`, which took the image, puts that one back too.
    pub fn failure_to_revert(
        &self,
        me: &ClusterIdentity,
        id: (&str, &str, &str),
        image: &str,
    ) -> Option<FleetFailure> {
        if !self.reverts_shared_base(id) || self.spec.wave_of(me).is_none() {
            return None;
        }
        let key = (id.0.to_string(), id.1.to_string(), id.2.to_string());
        let is = |i: &Option<String>| i.as_deref() == Some(image);
        self.reports.get(&key)?.iter().find_map(|(c, r)| {
            let failed = *c != me.name
                && FAILED_PHASES.contains(&r.phase.as_str())
                && (is(&r.canary_image) || is(&r.wanted_image));
            let good = r.stable_image.clone().filter(|g| g != image)?;
            failed.then(|| FleetFailure {
                cluster: c.clone(),
                phase: r.phase.clone(),
                good,
            })
        })
    }

    /// The analysis of the wave cluster `me` is in, for rollout `kind` `namespace/name`:
    /// `None` when the fleet cannot be read, does not move the rollout, or the wave has none.
    pub fn wave_analysis(
        &self,
        me: &ClusterIdentity,
        (kind, namespace, name): (&str, &str, &str),
    ) -> Option<&AnalysisRef> {
        if self.problem.is_some() || !self.spec.moves(kind, namespace, name) {
            return None;
        }
        self.spec
            .waves
            .get(self.spec.wave_of(me)?)?
            .analysis
            .as_ref()
    }

    /// [`gate`] for rollout `kind` `namespace/name` of cluster `me`, whose spec asks for
    /// `image`.
    pub fn gate(
        &self,
        me: &ClusterIdentity,
        (kind, namespace, name): (&str, &str, &str),
        image: &str,
        now: Timestamp,
    ) -> Gate {
        if let Some(problem) = &self.problem {
            return Gate::Hold(Hold {
                wave: String::new(),
                reason: HoldReason::FleetUnreadable,
                message: format!("the Fleet cannot be read: {problem}"),
                recheck_at: None,
            });
        }
        let id = (kind.to_string(), namespace.to_string(), name.to_string());
        let found = FleetReports {
            clusters: self.clusters.clone(),
            reports: self.reports.get(&id).cloned().unwrap_or_default(),
        };
        gate(
            &self.name,
            &self.spec,
            me,
            (kind, namespace, name),
            image,
            &found,
            now,
        )
    }
}

pub mod changes;
#[cfg(test)]
mod tests;
pub mod view;
