//! Each batch's start and finish in status (the dashboard's timeline): set when the move is
//! seen, kept while the batch stays so, started again by the next rollout.

use super::*;

fn times(s: &Sim) -> Vec<(BatchState, Option<Timestamp>, Option<Timestamp>)> {
    s.status
        .batches
        .iter()
        .map(|b| {
            let t = |x: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
                x.as_ref().map(|t| t.0)
            };
            (b.state, t(&b.started_at), t(&b.finished_at))
        })
        .collect()
}

#[test]
fn each_batch_records_when_it_started_and_finished_and_the_next_rollout_starts_again() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    let t0 = s.now;
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    let paused_at = s.now;
    let [(first, started, finished), (second, None, None)] = times(&s)[..] else {
        panic!("{:?}", times(&s));
    };
    assert_eq!((first, second), (BatchState::Finished, BatchState::Pending));
    let (started, finished) = (started.unwrap(), finished.unwrap());
    assert!(t0 <= started && started < finished && finished <= paused_at);
    // Paused a while: nothing moves.
    for _ in 0..5 {
        s.reconcile();
        s.tick();
    }
    assert_eq!(times(&s)[0], (first, Some(started), Some(finished)));
    s.spec.current_batch = 2;
    s.run_until("Completed", |s| s.phase() == Some(Phase::Completed));
    let done = times(&s);
    assert_eq!(
        done[0],
        (BatchState::Finished, Some(started), Some(finished))
    );
    let (state, second_started, second_finished) = done[1];
    assert_eq!(state, BatchState::Finished);
    assert!(second_started.unwrap() > paused_at, "{done:?}");
    assert!(second_finished.unwrap() >= second_started.unwrap());
    // The next rollout's first batch starts again.
    s.spec.image = "web:3".into();
    s.spec.current_batch = 1;
    s.reconcile();
    let next = times(&s);
    assert_eq!(next[0].0, BatchState::InProgress, "{next:?}");
    assert!(next[0].1.unwrap() > second_finished.unwrap());
    assert_eq!((next[1].1, next[1].2), (None, None));
}

/// Found by review: a rollout that failed at batch 1 with no new pod (a webhook refused them)
/// and a new image: superseded, rolled back and started again in one plan, batch 1 went from
/// InProgress to InProgress and kept the failed rollout's start.
#[test]
fn a_superseded_rollouts_batch_starts_again() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.spec.progress_deadline_seconds = 5;
    s.completed_on("web:1");
    s.spec.image = "web:broken".into();
    s.run_until("Failed", |s| s.phase() == Some(Phase::Failed));
    let first = times(&s)[0];
    assert_eq!(first.0, BatchState::InProgress, "{:?}", times(&s));
    // Its pods were never made.
    for d in s.deployments.values_mut() {
        if d.image.as_deref() == Some("web:broken") {
            d.pods = 0;
        }
    }
    s.spec.image = "web:3".into();
    s.now += jiff::SignedDuration::from_secs(1);
    s.reconcile();
    assert_eq!(
        s.status.canary_image.as_deref(),
        Some("web:3"),
        "{:?}",
        s.phases
    );
    assert!(times(&s)[0].1 > first.1, "{:?} then {:?}", first, times(&s));
}

/// Found by review: a batch read back without times (an older agent's status, or a CRD
/// without the fields) got `now` at every plan, so its status was written at every reconcile.
#[test]
fn a_batch_without_times_is_not_given_new_ones_while_its_state_stays() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    for b in &mut s.status.batches {
        (b.started_at, b.finished_at) = (None, None);
    }
    let before = s.status.batches.clone();
    s.reconcile();
    assert_eq!(s.status.batches, before);
}

/// The charts' points: the available pods of each image as the batches moved them, from the
/// rollout's start; the next rollout starts a new series.
#[test]
fn the_series_follows_the_available_pods_of_each_image_through_the_batches() {
    let mut s = Sim::new(Strategy::Batches, 2, PauseMode::First);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    s.spec.current_batch = 2;
    s.run_until("Completed", |s| s.phase() == Some(Phase::Completed));
    let new: Vec<i32> = s
        .status
        .series
        .iter()
        .map(|p| {
            p.ready
                .iter()
                .find(|r| r.image == "web:2")
                .map_or(0, |r| r.replicas)
        })
        .collect();
    assert_eq!(new.first(), Some(&0), "{:?}", s.status.series);
    assert_eq!(new.last(), Some(&s.spec.replicas), "{:?}", s.status.series);
    assert!(new.windows(2).any(|w| w[0] < w[1]), "{new:?}");
    let done = s.status.series.last().unwrap().at.0;
    s.spec.image = "web:3".into();
    s.spec.current_batch = 1;
    s.reconcile();
    assert!(
        s.status.series.iter().all(|p| p.at.0 > done),
        "{:?}",
        s.status.series
    );
}
