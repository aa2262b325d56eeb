use super::*;
use crate::plan::traffic::{ServiceView, TrafficView};

fn sides() -> Sides {
    let side = |v: &str| BTreeMap::from([(VERSION_LABEL.to_string(), v.to_string())]);
    Sides {
        stable: side("aaaa1111"),
        canary: side("bbbb2222"),
        ..Sides::default()
    }
}

fn active(version: Option<&str>, endpoints: &[(&str, i32)]) -> TrafficView {
    TrafficView {
        services: vec![ServiceView {
            name: "web".into(),
            selector: Some(BTreeMap::from([("app".into(), "web".into())])),
            selector_version: version.map(str::to_string),
            labelled: version.is_some(),
            endpoint_versions: endpoints.iter().map(|(v, n)| (v.to_string(), *n)).collect(),
            ..ServiceView::default()
        }],
        routes: Vec::new(),
    }
}

const SWITCHED: Switched = Switched {
    active: "web",
    preview: None,
};

fn step(view: &TrafficView, weight: i32, recorded: Recorded, now: Timestamp) -> TrafficStep {
    let want = Want {
        weight,
        header: false,
        canary_endpoints: 4,
        settle: true,
    };
    let ready = SideReady {
        stable: 4,
        canary: 4,
        canary_labels: BTreeMap::from([("app".into(), "web".into())]),
    };
    service_switch_step(
        ("web", "ns"),
        Some(SWITCHED),
        &[],
        &sides(),
        (want, ready),
        view,
        recorded,
        now,
    )
}

#[test]
fn a_pods_version_is_the_segment_after_the_rollouts_name() {
    assert_eq!(pod_version("web", "web-bbbb2222-5d8f7c-x2x4z"), "bbbb2222");
    assert_eq!(pod_version("web", "web-baseline-5d8f7c-x2x4z"), "baseline");
    assert_eq!(pod_version("web", "webapp-1234-5d8f7c-x2x4z"), "");
    assert_eq!(pod_version("web", ""), "");
    // Kubernetes cuts a generated pod name's prefix at 58 characters: with a rollout name of
    // 49 or 50, the version runs into the random suffix, or loses its last character.
    let name49 = "a".repeat(49);
    let pod = format!("{name49}-bbbb2222x2x4z");
    assert_eq!(pod_version(&name49, &pod), "bbbb2222");
    let name50 = "a".repeat(50);
    let pod = format!("{name50}-bbbb222x2x4z");
    assert_eq!(pod_version(&name50, &pod), "bbbb222x");
    assert!(same_version("bbbb222", "bbbb2222"));
    assert!(!same_version("", "bbbb2222"));
}

#[test]
fn the_switch_is_done_only_once_every_endpoint_is_the_new_versions() {
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let before = active(Some("aaaa1111"), &[("aaaa1111", 4)]);
    let s = step(&before, 100, Recorded::default(), now);
    assert_eq!(
        s.actions,
        vec![Action::SwitchService {
            name: "web".into(),
            version: Some("bbbb2222".into()),
            owner: "CanaryDeployment/web".into(),
        }]
    );
    assert!(
        s.waiting
            .unwrap()
            .contains("pointing Service web at version bbbb2222")
    );
    // The selector changed; the EndpointSlices still list old pods.
    let lagging = active(Some("bbbb2222"), &[("aaaa1111", 4), ("bbbb2222", 2)]);
    let s = step(&lagging, 100, s.now, now);
    assert!(s.actions.is_empty());
    assert_eq!(
        s.now.since, None,
        "no settle clock before the endpoints follow"
    );
    assert!(
        s.waiting
            .unwrap()
            .contains("2 ready of bbbb2222, 4 of other versions")
    );
    // They follow: the settle time starts.
    let done = active(Some("bbbb2222"), &[("bbbb2222", 4)]);
    let s = step(&done, 100, s.now, now);
    assert_eq!(s.now.since, Some(now));
    assert_eq!(s.now.weight, Some(100));
    assert_eq!(s.recheck_after, Some(SWITCH_SETTLE));
    let later = now + jiff::SignedDuration::from_secs(11);
    let s = step(&done, 100, s.now, later);
    assert_eq!(s.waiting, None);
}

#[test]
fn a_service_of_no_version_is_pointed_at_the_stable_one_and_recorded_as_none() {
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let unswitched = active(None, &[("aaaa1111", 4), ("bbbb2222", 1)]);
    let s = step(&unswitched, 0, Recorded::default(), now);
    assert_eq!(s.now.weight, None);
    assert!(matches!(
        &s.actions[..],
        [Action::SwitchService { version: Some(v), .. }] if v == "aaaa1111"
    ));
}

#[test]
fn a_service_another_rollout_switches_is_left_to_it() {
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let mut view = active(Some("aaaa1111"), &[("aaaa1111", 4)]);
    view.services[0].switched_by = Some("CanaryDeployment/shop".into());
    let s = step(&view, 100, Recorded::default(), now);
    assert!(s.actions.is_empty(), "{:?}", s.actions);
    assert!(
        s.waiting
            .unwrap()
            .contains("Service web is switched by CanaryDeployment/shop"),
    );
}
