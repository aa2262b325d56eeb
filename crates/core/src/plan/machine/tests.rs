//! The phase machine's test helpers shared by both kinds' tests (how kstatus reads a
//! rollout's conditions), and its own tests.

use super::*;

#[test]
fn the_value_a_person_sets_always_acts_on_the_running_canary() {
    for at_start in [None, Some("true"), Some("redis:2"), Some("redis:1")] {
        let value = acting_value(at_start, "redis:2");
        assert!(
            annotation_acts(Some(&value), at_start, "redis:2"),
            "{value} with {at_start:?} at the start"
        );
    }
    assert_eq!(acting_value(None, "redis:2"), "true");
    assert!(!annotation_acts(Some("true"), Some("true"), "redis:2"));
}

/// Which of Ready, Reconciling and Stalled is true; panics unless exactly one is (tests).
pub(crate) fn standing_of(conditions: &[Condition]) -> Standing {
    use crate::api::condition::{READY, RECONCILING, STALLED};
    let is_true = |t: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == t && c.status == "True")
    };
    let set: Vec<_> = [
        (READY, Standing::Settled),
        (RECONCILING, Standing::Working),
        (STALLED, Standing::Stuck),
    ]
    .into_iter()
    .filter(|(t, _)| is_true(t))
    .map(|(_, s)| s)
    .collect();
    assert_eq!(
        set.len(),
        1,
        "exactly one of Ready, Reconciling, Stalled: {conditions:?}"
    );
    assert!(
        conditions
            .iter()
            .all(|c| !RETIRED_CONDITIONS.contains(&c.type_.as_str())),
        "{conditions:?}"
    );
    set[0]
}

/// Asserts that kstatus reads each case's object as the case wants: `(what, object, want)`.
pub(crate) fn assert_kstatus_reads(cases: &[(String, serde_json::Value, &str)]) {
    let objects: Vec<_> = cases.iter().map(|(_, o, _)| o.clone()).collect();
    let read = kstatus_of(&objects);
    let wrong: Vec<String> = cases
        .iter()
        .zip(&read)
        .filter(|((_, _, want), got)| want != got)
        .map(|((what, _, want), got)| format!("{what}: kstatus says {got}, want {want}"))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Asks sigs.k8s.io/cli-utils' kstatus, the rules Flux health checks and kpt apply, for the
/// status of each object (`Current`, `InProgress`, `Failed`, ...). Its binary comes from
/// `tests/tools/build.sh`, which builds it once per machine from the pinned Go module.
pub(crate) fn kstatus_of(objects: &[serde_json::Value]) -> Vec<String> {
    use std::io::Write as _;
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let bin = BIN.get_or_init(|| {
        // The workspace root, two levels above this crate.
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let built = std::process::Command::new(root.join("tests/tools/build.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("tests/tools/build.sh runs (it needs Go)");
        assert!(built.status.success(), "tests/tools/build.sh failed");
        let dir = String::from_utf8_lossy(&built.stdout);
        std::path::Path::new(dir.lines().last().unwrap_or_default()).join("kstatus")
    });
    let mut child = std::process::Command::new(bin)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("kstatus starts");
    let mut stdin = child.stdin.take().unwrap();
    for o in objects {
        writeln!(stdin, "{o}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kstatus failed");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(lines.len(), objects.len());
    lines
}

mod failed_action_tests {
    use super::super::*;
    use crate::api::CanaryStatefulSetStatus;

    fn stalled(s: &CanaryStatefulSetStatus) -> bool {
        s.conditions
            .iter()
            .any(|c| c.type_ == crate::api::condition::STALLED && c.status == "True")
    }

    #[test]
    fn a_refused_action_stays_shown_while_the_plan_repeats_it() {
        // A refusal's message did not lead with its action, so the status lost and regained
        // its Stalled condition on every retry; the action is now a field of its own.
        let action = "retain volume pv-1 for data-db-canary-0";
        let now = Timestamp::UNIX_EPOCH;
        let mut shown = CanaryStatefulSetStatus::default();
        mark_action_failed(
            &mut shown,
            action,
            "the volume is not rollout shop/db's",
            true,
            now,
        );
        assert_eq!(shown.failed_action.as_deref(), Some(action));
        let mut next = CanaryStatefulSetStatus::default();
        carry_action_failure(&shown, &mut next, [action.to_string()], now);
        assert!(stalled(&next), "{next:?}");
        assert_eq!(next.failed_action.as_deref(), Some(action));
    }

    #[test]
    fn a_failure_is_dropped_once_the_plan_no_longer_needs_its_action() {
        let now = Timestamp::UNIX_EPOCH;
        let mut shown = CanaryStatefulSetStatus::default();
        // The message leads with text that another action starts with: only the field counts.
        mark_action_failed(
            &mut shown,
            "scale set db-canary to 1",
            "scale set db-canary to 1: forbidden",
            true,
            now,
        );
        let mut next = CanaryStatefulSetStatus::default();
        carry_action_failure(&shown, &mut next, ["scale set db-canary".to_string()], now);
        assert!(!stalled(&next), "{next:?}");
        assert_eq!(next.failed_action, None);
    }
}
