use super::*;

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).unwrap()
}

fn moved(
    to: Option<(Stage, Option<i32>, Option<i32>)>,
    reason: &'static str,
    s: i64,
) -> Moved<'static> {
    Moved {
        to,
        reason,
        message: "what the move said",
        commit: Some("c0ffee"),
        now: at(s),
    }
}

const STEP1: Option<(Stage, Option<i32>, Option<i32>)> = Some((Stage::Step, Some(1), Some(1)));
const STEP2: Option<(Stage, Option<i32>, Option<i32>)> = Some((Stage::Step, Some(2), Some(2)));

#[test]
fn a_move_within_a_stage_changes_nothing() {
    let mut stages = Vec::new();
    record(&mut stages, moved(STEP1, "CanaryStarted", 0));
    let before = stages.clone();
    record(&mut stages, moved(STEP1, "StableScaledDown", 5));
    record(&mut stages, moved(STEP1, "CanaryReady", 9));
    assert_eq!(stages, before);
    assert_eq!(stages[0].started_at, Time(at(0)));
}

#[test]
fn a_new_stage_closes_the_open_one_with_its_reason() {
    let mut stages = Vec::new();
    record(&mut stages, moved(STEP1, "CanaryStarted", 0));
    record(&mut stages, moved(STEP2, "StepComplete", 7));
    assert_eq!(stages[0].finished_at, Some(Time(at(7))));
    assert_eq!(stages[0].closed_by.as_deref(), Some("StepComplete"));
    assert_eq!(stages[1].opened_by, "StepComplete");
    assert_eq!(stages[1].commit.as_deref(), Some("c0ffee"));
    // Out of the canary: the open stage closes, nothing opens.
    record(&mut stages, moved(None, "", 9));
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[1].closed_by.as_deref(), Some("Moved"));
    // And staying out records nothing more.
    record(&mut stages, moved(None, "Available", 11));
    assert_eq!(stages[1].finished_at, Some(Time(at(9))));
}

#[test]
fn a_first_step_starts_a_new_list_and_the_list_is_bounded() {
    let mut stages = Vec::new();
    record(&mut stages, moved(STEP1, "CanaryStarted", 0));
    record(
        &mut stages,
        moved(Some((Stage::Rollback, None, None)), "Aborted", 1),
    );
    record(&mut stages, moved(STEP1, "CanaryStarted", 2));
    assert_eq!(stages.len(), 1);
    assert_eq!(stages[0].started_at, Time(at(2)));
    for n in 2..100 {
        record(
            &mut stages,
            moved(
                Some((Stage::Step, Some(n), Some(1))),
                "StepComplete",
                n as i64,
            ),
        );
    }
    assert_eq!(stages.len(), KEPT);
    assert_eq!(stages.last().unwrap().step, Some(99));
}

#[test]
fn a_long_commit_is_cut() {
    let mut stages = Vec::new();
    let long = "a".repeat(100_000);
    record(
        &mut stages,
        Moved {
            commit: Some(&long),
            ..moved(STEP1, "CanaryStarted", 0)
        },
    );
    assert_eq!(stages[0].commit.as_ref().map(String::len), Some(COMMIT));
}

#[test]
fn a_long_message_is_cut() {
    let mut stages = Vec::new();
    let long = "é".repeat(1000);
    record(
        &mut stages,
        Moved {
            message: &long,
            ..moved(STEP1, "CanaryStarted", 0)
        },
    );
    assert_eq!(stages[0].detail.chars().count(), DETAIL);
}

#[test]
fn every_canary_phase_has_a_stage_and_no_other_does() {
    use Phase::*;
    for p in [ScalingDownStable, DeployingCanary, CanaryActive] {
        assert_eq!(stage_of(p, 1, 3), Some((Stage::Step, Some(2), Some(3))));
    }
    for p in [AwaitingMigration, MigratingData] {
        assert_eq!(stage_of(p, 0, 1), Some((Stage::Migration, None, None)));
    }
    assert_eq!(
        stage_of(Promoting, 0, 1),
        Some((Stage::Promotion, None, None))
    );
    // A failed migration rolls the canary back.
    for p in [RollingBack, MigrationFailed] {
        assert_eq!(stage_of(p, 0, 1), Some((Stage::Rollback, None, None)));
    }
    let far = stage_of(DeployingCanary, usize::MAX, 1).and_then(|s| s.1);
    assert_eq!(far, Some(i32::MAX));
    for p in [Initializing, Stable, RolledBack, Failed] {
        assert_eq!(stage_of(p, 0, 1), None);
    }
}
