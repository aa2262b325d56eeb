//! The least evidence before a promotion (issue 75, `minMeasurements`, `minDuration`): what
//! the background run still lacks, in words that count it, and when the time is met.

use super::*;

/// What the background run lacks before the canary may be promoted, and how long until its
/// `minDuration` is met (a timer for the planner); `None` when nothing is asked or all is in.
pub fn missing(
    runs: &[AnalysisRunStatus],
    spec: Option<&RolloutAnalysis>,
    now: Timestamp,
) -> Option<(String, Option<Duration>)> {
    let spec = spec?;
    let min_duration = spec
        .min_duration
        .as_deref()
        .and_then(|d| parse_duration(d).ok());
    if spec.min_measurements.is_none() && min_duration.is_none() {
        return None;
    }
    let Some(run) = runs.iter().find(|r| r.name == BACKGROUND) else {
        return Some((
            "waiting for evidence: minMeasurements and minDuration count the background \
             analysis, which has not started"
                .into(),
            None,
        ));
    };
    let mut lacking = Vec::new();
    if let Some(n) = spec.min_measurements {
        for m in run.metrics.iter().filter(|m| m.count < n) {
            lacking.push(format!("{} {} of {n} measurements", m.name, m.count));
        }
    }
    let mut left = None;
    if let Some(d) = min_duration {
        let measured = elapsed(Some(&run.started_at), now);
        if measured < d {
            left = Some(d - measured);
            lacking.push(format!(
                "measured {} s of {} s",
                measured.as_secs(),
                d.as_secs()
            ));
        }
    }
    (!lacking.is_empty()).then(|| {
        (
            format!(
                "waiting for evidence before promotion: {}",
                lacking.join(", ")
            ),
            left,
        )
    })
}

fn elapsed(since: Option<&Time>, now: Timestamp) -> Duration {
    since
        .map(|t| now.duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default()
}
