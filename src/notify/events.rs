//! What is worth telling a person, from how a rollout's status moved (pure): a canary
//! started, waits for approval, failed its analysis, was rolled back or promoted.
//!
//! The agent keeps what it last saw of each rollout ([`Seen`]). After a restart it has seen
//! nothing: a rollout whose phase began within [`CATCH_UP`] is taken as new (its events are
//! sent, perhaps a second time), an older one as already told. So a restart in the middle of
//! a transition repeats a notification rather than losing it, and never replays a day's.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use serde::Deserialize;

use crate::api::{AnalysisPhase, AnalysisRunStatus, RolloutView};

/// How far back a restarted agent takes a phase's start as news.
pub const CATCH_UP: Duration = Duration::from_secs(60);

/// The events a receiver can be routed.
#[derive(
    Clone, Copy, Debug, Deserialize, serde::Serialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub enum Event {
    CanaryStarted,
    AwaitingApproval,
    AnalysisFailed,
    RolledBack,
    Promoted,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::CanaryStarted => "CanaryStarted",
            Event::AwaitingApproval => "AwaitingApproval",
            Event::AnalysisFailed => "AnalysisFailed",
            Event::RolledBack => "RolledBack",
            Event::Promoted => "Promoted",
        }
    }
}

/// A rollout as the events read it.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub phase: Option<&'static str>,
    pub phase_since: Option<Timestamp>,
    pub message: String,
    /// The image rolled out (the canary's, else the spec's).
    pub image: String,
    /// The canary's image, while the status has one.
    pub canary: Option<String>,
    pub stable_image: Option<String>,
    /// The Git commit that last set the spec.
    pub revision: Option<String>,
    /// Where the spec's image came from (the image automation's policy and commit).
    pub image_source: Option<String>,
    /// The failed analysis runs, without their measurements.
    pub analysis: Vec<AnalysisRunStatus>,
    /// Every run and metric of the canary in words (values, condition, query): what a failure,
    /// a rollback or a promotion tells with it.
    pub evidence: String,
}

impl Snapshot {
    pub fn of<R: RolloutView>(o: &R, analysis: &[AnalysisRunStatus]) -> Option<Snapshot> {
        Some(Snapshot {
            kind: R::KIND,
            namespace: o.meta().namespace.clone()?,
            name: o.meta().name.clone()?,
            phase: o.phase_name(),
            phase_since: o.phase_since().map(|t| t.0),
            message: o.message().unwrap_or_default().to_string(),
            image: o.rolling_out().to_string(),
            canary: o.canary_image().map(str::to_string),
            stable_image: o.stable_image().map(str::to_string),
            revision: o.source_revision().map(str::to_string),
            image_source: o.image_source().map(str::to_string),
            // Only what an event reads: the failed runs, without their measurements (a
            // status change is not a reason to copy every measurement of every run).
            analysis: analysis
                .iter()
                .filter(|r| r.phase == AnalysisPhase::Failed)
                .map(|r| AnalysisRunStatus {
                    name: r.name.clone(),
                    phase: r.phase,
                    started_at: r.started_at.clone(),
                    message: r.message.clone(),
                    metrics: Vec::new(),
                    score: r.score,
                })
                .collect(),
            evidence: evidence(analysis),
        })
    }

    /// Whether a person's approval is what it waits for: a CanaryStatefulSet's canary held
    /// for the promote annotation, or a CanaryDeployment paused between batches.
    fn awaits_approval(&self) -> bool {
        match self.kind {
            "CanaryDeployment" => self.phase == Some("Paused"),
            _ => {
                self.phase == Some("CanaryActive")
                    && self.message.contains(crate::plan::WAITING_FOR_PROMOTION)
            }
        }
    }

    fn failed_runs(&self) -> impl Iterator<Item = &AnalysisRunStatus> {
        self.analysis
            .iter()
            .filter(|r| r.phase == AnalysisPhase::Failed)
    }
}

/// What the agent last saw of a rollout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    phase: Option<&'static str>,
    canary: Option<String>,
    awaiting: bool,
    /// Failed analysis runs told of: name and start.
    failed_runs: BTreeSet<(String, Timestamp)>,
}

/// One thing to tell.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub event: Event,
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub image: String,
    /// The status message, or the failed analysis run's.
    pub message: String,
    pub revision: Option<String>,
    /// Where the image came from, when the image automation wrote it: `image:tag (digest) from
    /// ImagePolicy web, commit …`.
    pub image_source: Option<String>,
    /// The analysis in words, for a failure, a rollback or a promotion (Markdown list items).
    pub evidence: Option<String>,
}

/// The evidence a notice of `event` carries: a failure's, a rollback's or a promotion's.
fn told_with_evidence(event: Event, now: &Snapshot) -> Option<String> {
    let decided = matches!(
        event,
        Event::AnalysisFailed | Event::RolledBack | Event::Promoted
    );
    (decided && !now.evidence.is_empty()).then(|| now.evidence.clone())
}

/// What a notice carries of the evidence at most: the values of many metrics are long.
const EVIDENCE_CHARS: usize = 4000;

/// The runs in words, at most [`EVIDENCE_CHARS`], cut at a line.
fn evidence(runs: &[AnalysisRunStatus]) -> String {
    crate::plan::analysis::report::runs_text(runs, EVIDENCE_CHARS)
}

fn is_promotion(kind: &str, phase: &str, before: Option<&str>) -> bool {
    let before = before.unwrap_or_default();
    match kind {
        "CanaryDeployment" => phase == "Completed" && matches!(before, "Progressing" | "Paused"),
        _ => {
            phase == "Stable"
                && matches!(
                    before,
                    "Promoting" | "CanaryActive" | "AwaitingMigration" | "MigratingData"
                )
        }
    }
}

/// What `now` tells that `before` did not, and what to remember of it. `before` is `None` the
/// first time the agent sees the rollout; `clock` is the time now.
pub fn happened(before: Option<&Seen>, now: &Snapshot, clock: Timestamp) -> (Seen, Vec<Notice>) {
    let fresh = now.phase_since.is_some_and(|since| {
        clock.duration_since(since).unsigned_abs() <= CATCH_UP || since > clock
    });
    let seen = Seen {
        phase: now.phase,
        canary: now.canary.clone(),
        awaiting: now.awaits_approval(),
        failed_runs: now
            .failed_runs()
            .map(|r| (r.name.clone(), r.started_at.0))
            .collect(),
    };
    let before = match before {
        Some(b) => b.clone(),
        // First sight: an old phase was told before the restart; a fresh one may not have been.
        None if !fresh => seen.clone(),
        // A fresh phase: its own news is told; a canary only when this phase is its start.
        None => Seen {
            canary: match now.phase {
                Some("DeployingCanary" | "Progressing") => None,
                _ => now.canary.clone(),
            },
            ..Seen::default()
        },
    };
    let notice = |event: Event, message: &str| Notice {
        event,
        kind: now.kind,
        namespace: now.namespace.clone(),
        name: now.name.clone(),
        phase: now.phase.unwrap_or_default().to_string(),
        image: match event {
            Event::RolledBack => now
                .stable_image
                .clone()
                .unwrap_or_else(|| now.image.clone()),
            _ => now.image.clone(),
        },
        message: message.to_string(),
        revision: now.revision.clone(),
        evidence: told_with_evidence(event, now),
        image_source: match event {
            Event::RolledBack => None,
            _ => now.image_source.clone(),
        },
    };
    let mut notices = Vec::new();
    // A canary starts when the status names a canary image it did not name before: whatever
    // phases one reconcile went through, and not again when a paused batch resumes.
    if now.canary.is_some() && now.canary != before.canary {
        notices.push(notice(Event::CanaryStarted, &now.message));
    }
    if let Some(phase) = now.phase.filter(|p| Some(*p) != before.phase) {
        if phase == "RolledBack" {
            notices.push(notice(Event::RolledBack, &now.message));
        }
        if is_promotion(now.kind, phase, before.phase) {
            notices.push(notice(Event::Promoted, &now.message));
        }
    }
    for run in now.failed_runs() {
        if !before
            .failed_runs
            .contains(&(run.name.clone(), run.started_at.0))
        {
            let why = run.message.as_deref().unwrap_or("no metric said why");
            notices.push(notice(
                Event::AnalysisFailed,
                &format!("analysis {}: {why}", run.name),
            ));
        }
    }
    if seen.awaiting && !before.awaiting {
        notices.push(notice(Event::AwaitingApproval, &now.message));
    }
    (seen, notices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn sts(phase: &'static str, since: i64, message: &str) -> Snapshot {
        Snapshot {
            kind: "CanaryStatefulSet",
            namespace: "shop".into(),
            name: "redis".into(),
            phase: Some(phase),
            phase_since: Some(at(since)),
            message: message.into(),
            image: "redis:7.4".into(),
            canary: (phase != "Stable").then(|| "redis:7.4".into()),
            stable_image: Some("redis:7.2".into()),
            revision: Some("abc".into()),
            image_source: None,
            analysis: Vec::new(),
            evidence: String::new(),
        }
    }

    /// Runs `steps` through [`happened`] from nothing, as one agent sees them.
    fn events(steps: &[Snapshot], clock: i64) -> Vec<Event> {
        let mut seen = None;
        let mut all = Vec::new();
        for s in steps {
            let (next, notices) = happened(seen.as_ref(), s, at(clock));
            all.extend(notices.into_iter().map(|n| n.event));
            seen = Some(next);
        }
        all
    }

    fn waiting() -> String {
        format!(
            "canary of redis:7.4 Ready on 1 replica(s); {}: set the annotation",
            crate::plan::WAITING_FOR_PROMOTION
        )
    }

    #[test]
    fn a_manual_canary_tells_start_approval_and_promotion_once_each() {
        let steps = [
            sts("Stable", 0, "stable"),
            sts("DeployingCanary", 10, "deploying"),
            sts("CanaryActive", 20, "waiting for 1 canary pod"),
            sts("CanaryActive", 20, &waiting()),
            sts("CanaryActive", 20, &waiting()),
            sts("Promoting", 40, "promoting"),
            sts("Stable", 50, "stable"),
            sts("Stable", 50, "stable"),
        ];
        assert_eq!(
            events(&steps, 0),
            [
                Event::CanaryStarted,
                Event::AwaitingApproval,
                Event::Promoted
            ]
        );
    }

    #[test]
    fn a_failed_analysis_and_its_rollback_are_told_once() {
        let mut failing = sts("CanaryActive", 20, "analysis failed");
        failing.analysis = vec![AnalysisRunStatus {
            name: "error-rate".into(),
            phase: AnalysisPhase::Failed,
            started_at: Time(at(15)),
            message: Some("error-rate 0.31 failed result < 0.05".into()),
            metrics: Vec::new(),
            score: None,
        }];
        let mut rolling = sts("RollingBack", 30, "rolling back");
        rolling.analysis = failing.analysis.clone();
        let mut rolled = sts("RolledBack", 40, "rolled back: analysis failed");
        rolled.analysis = failing.analysis.clone();
        let steps = [
            sts("DeployingCanary", 10, ""),
            failing.clone(),
            failing,
            rolling,
            rolled.clone(),
            rolled.clone(),
        ];
        assert_eq!(
            events(&steps, 0),
            [
                Event::CanaryStarted,
                Event::AnalysisFailed,
                Event::RolledBack
            ]
        );
        let (_, notices) = happened(None, &rolled, at(41));
        let failed = notices
            .iter()
            .find(|n| n.event == Event::AnalysisFailed)
            .unwrap();
        assert_eq!(
            failed.message,
            "analysis error-rate: error-rate 0.31 failed result < 0.05"
        );
        let back = notices
            .iter()
            .find(|n| n.event == Event::RolledBack)
            .unwrap();
        assert_eq!(back.image, "redis:7.2");
    }

    #[test]
    fn a_canary_seen_first_past_its_start_is_still_told_once() {
        // One reconcile may take a rollout from Stable to CanaryActive (its pods were Ready).
        let steps = [
            sts("Stable", 0, ""),
            sts("CanaryActive", 10, "waiting for 1 canary pod"),
            sts("CanaryActive", 10, "waiting for 1 canary pod"),
        ];
        assert_eq!(events(&steps, 0), [Event::CanaryStarted]);
    }

    #[test]
    fn a_restart_tells_a_fresh_phase_again_and_an_old_one_never() {
        let active = sts("CanaryActive", 0, &waiting());
        let (_, fresh) = happened(None, &active, at(30));
        assert_eq!(
            fresh.iter().map(|n| n.event).collect::<Vec<_>>(),
            [Event::AwaitingApproval]
        );
        let (_, old) = happened(None, &active, at(3600));
        assert!(old.is_empty(), "{old:?}");
        let started = sts("DeployingCanary", 0, "");
        let (_, fresh) = happened(None, &started, at(59));
        assert_eq!(fresh[0].event, Event::CanaryStarted);
        // A new rollout's first Stable is not a promotion, fresh or not.
        let (_, first) = happened(None, &sts("Stable", 0, ""), at(1));
        assert!(first.is_empty(), "{first:?}");
    }

    #[test]
    fn a_deployment_pause_asks_for_approval_and_its_resume_is_no_new_canary() {
        let d = |phase: &'static str, since: i64| Snapshot {
            kind: "CanaryDeployment",
            canary: (phase != "Completed").then(|| "nginx:1.28".into()),
            ..sts(phase, since, "")
        };
        let steps = [
            d("Completed", 0),
            d("Progressing", 10),
            d("Paused", 20),
            d("Progressing", 30),
            d("Completed", 40),
        ];
        assert_eq!(
            events(&steps, 0),
            [
                Event::CanaryStarted,
                Event::AwaitingApproval,
                Event::Promoted
            ]
        );
    }
}
