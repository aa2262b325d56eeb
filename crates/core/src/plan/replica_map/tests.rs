use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;

fn pod(set: &str, ordinal: i32, ready: bool, restarts: i32, waiting: Option<&str>) -> Pod {
    let state = match waiting {
        Some(r) => json!({"waiting": {"reason": r}}),
        None => json!({"running": {}}),
    };
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("{set}-{ordinal}"),
            "labels": {"controller-revision-hash": format!("{set}-rev")},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": set,
                "uid": "u", "controller": true}]
        },
        "spec": {"containers": [{"name": "kv", "image": format!("kv:{set}")}]},
        "status": {
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "containerStatuses": [{"name": "kv", "image": "kv", "imageID": "", "ready": ready,
                "restartCount": restarts, "state": state}]
        }
    }))
    .unwrap()
}

fn facts(pods: &[Pod]) -> Vec<PodFacts> {
    pods.iter()
        .filter_map(|p| PodFacts::from_object(p, None))
        .collect()
}

fn claim(name: &str, volume: Option<&str>, bound: bool) -> ClaimView {
    ClaimView {
        name: name.into(),
        volume: volume.map(String::from),
        bound,
        ..Default::default()
    }
}

fn map(pods: &[PodFacts], claims: &[ClaimView]) -> Vec<ReplicaRow> {
    replica_map(&MapInput {
        rollout: "kv",
        replicas: 3,
        templates: &["data".to_string()],
        canary_image: None,
        stable_image: None,
        canary_revision: None,
        pods,
        claims,
    })
}

fn stable_claims() -> Vec<ClaimView> {
    (0..3)
        .map(|k| {
            claim(
                &format!("data-kv-stable-{k}"),
                Some(&format!("pv-{k}")),
                true,
            )
        })
        .collect()
}

#[test]
fn a_stable_rollout_shows_each_ordinal_on_its_own_volume() {
    let pods = facts(&[
        pod("kv-stable", 0, true, 0, None),
        pod("kv-stable", 1, true, 2, None),
        pod("kv-stable", 2, true, 0, None),
    ]);
    let rows = map(&pods, &stable_claims());
    assert_eq!(rows.len(), 3);
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(row.ordinal, k as i32);
        assert_eq!(row.pods.len(), 1);
        assert_eq!(row.pods[0].side, Side::Stable);
        assert!(!row.pods[0].canary);
        assert_eq!(
            row.volumes,
            vec![ReplicaVolume {
                template: "data".into(),
                volume: format!("pv-{k}"),
                held_by: Some(Side::Stable),
                claim: Some(format!("data-kv-stable-{k}")),
                moving_to: None,
                conflict: false,
            }]
        );
    }
    assert_eq!(rows[1].pods[0].restarts, 2);
}

/// Each step of the handoff (plan/handoff.rs) as the map shows it.
#[test]
fn a_handoff_shows_the_volume_held_then_moving_then_arrived() {
    let mut claims = stable_claims();
    // 2. The canary claim names the volume; the stable claim still holds it.
    claims.push(claim("data-kv-canary-2", Some("pv-2"), false));
    let v = &map(&[], &claims)[2].volumes[0];
    assert_eq!(
        (v.volume.as_str(), v.held_by, v.moving_to),
        ("pv-2", Some(Side::Stable), Some(Side::Canary))
    );
    // 3. The stable claim is gone: the volume is between the two.
    claims.retain(|c| c.name != "data-kv-stable-2");
    let v = &map(&[], &claims)[2].volumes[0];
    assert_eq!(
        (
            v.volume.as_str(),
            v.held_by,
            v.moving_to,
            v.claim.as_deref()
        ),
        ("pv-2", None, Some(Side::Canary), None)
    );
    // 5. Bound: the canary holds it.
    claims.last_mut().unwrap().bound = true;
    let v = &map(&[], &claims)[2].volumes[0];
    assert_eq!(
        (v.held_by, v.moving_to, v.claim.as_deref()),
        (Some(Side::Canary), None, Some("data-kv-canary-2"))
    );
    // And back: the stable claim names it again.
    claims.push(claim("data-kv-stable-2", Some("pv-2"), false));
    let v = &map(&[], &claims)[2].volumes[0];
    assert_eq!(
        (v.held_by, v.moving_to),
        (Some(Side::Canary), Some(Side::Stable))
    );
}

#[test]
fn a_canary_pod_that_crashes_shows_its_restarts_and_why_it_waits() {
    let pods = facts(&[
        pod("kv-stable", 0, true, 0, None),
        pod("kv-stable", 1, true, 0, None),
        pod("kv-canary", 2, false, 4, Some("CrashLoopBackOff")),
    ]);
    let row = &map(&pods, &stable_claims())[2];
    let p = &row.pods[0];
    assert_eq!(
        (p.name.as_str(), p.side, p.canary, p.ready, p.restarts),
        ("kv-canary-2", Side::Canary, true, false, 4)
    );
    assert_eq!(p.waiting.as_deref(), Some("CrashLoopBackOff"));
    assert_eq!(p.image.as_deref(), Some("kv:kv-canary"));
}

#[test]
fn two_pods_of_one_ordinal_both_show_during_a_swap() {
    let mut stable = pod("kv-stable", 2, true, 0, None);
    stable.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
    );
    let pods = facts(&[stable, pod("kv-canary", 2, false, 0, None)]);
    let row = &map(&pods, &[])[2];
    let names: Vec<(&str, bool)> = row
        .pods
        .iter()
        .map(|p| (p.name.as_str(), p.deleting))
        .collect();
    assert_eq!(names, vec![("kv-canary-2", false), ("kv-stable-2", true)]);
}

#[test]
fn a_partitions_canary_is_told_by_its_revision() {
    let mut canary = pod("kv", 2, true, 0, None);
    canary
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("controller-revision-hash".into(), "kv-new".into());
    let pods = facts(&[pod("kv", 0, true, 0, None), canary]);
    let claims = [claim("data-kv-0", Some("pv-0"), true)];
    let rows = replica_map(&MapInput {
        rollout: "kv",
        replicas: 3,
        templates: &["data".to_string()],
        canary_image: None,
        stable_image: None,
        canary_revision: Some("kv-new"),
        pods: &pods,
        claims: &claims,
    });
    assert_eq!(rows[0].pods[0].side, Side::Single);
    assert!(!rows[0].pods[0].canary);
    assert!(rows[2].pods[0].canary);
    assert_eq!(rows[0].volumes[0].held_by, Some(Side::Single));
    assert!(rows[1].pods.is_empty() && rows[1].volumes.is_empty());
}

#[test]
fn ordinals_beyond_the_replicas_show_while_they_go_and_others_pods_do_not() {
    let pods = facts(&[
        pod("kv-stable", 4, true, 0, None),
        pod("other-stable", 1, true, 0, None),
    ]);
    let mut claims = stable_claims();
    claims.push(claim("data-kv-stable-5", Some("pv-5"), true));
    claims.last_mut().unwrap().deleting = true;
    // A claim the set retained for an ordinal scaled away long ago: no row of its own.
    claims.push(claim("data-kv-stable-7", Some("pv-7"), true));
    claims.push(claim("logs-kv-stable-0", Some("pv-logs"), true));
    // A claim being made, no volume yet: nothing to draw.
    claims.push(claim("data-kv-canary-1", None, false));
    let rows = map(&pods, &claims);
    let ordinals: Vec<i32> = rows.iter().map(|r| r.ordinal).collect();
    assert_eq!(ordinals, vec![0, 1, 2, 4, 5]);
    assert!(rows[1].pods.is_empty(), "another rollout's pod");
    assert_eq!(rows[1].volumes[0].held_by, Some(Side::Stable));
    assert_eq!(rows[3].pods[0].name, "kv-stable-4");
    assert_eq!(rows[4].volumes[0].volume, "pv-5");
    assert_eq!(rows[0].volumes.len(), 1, "only the spec's templates");
}

#[test]
fn the_map_serializes_in_the_apis_words() {
    let rows = map(&facts(&[pod("kv-canary", 2, true, 1, None)]), &[]);
    let v = serde_json::to_value(&rows[2]).unwrap();
    assert_eq!(v["pods"][0]["side"], "canary");
    assert_eq!(v["pods"][0]["restarts"], 1);
    assert!(v.get("volumes").is_some());
}

/// Found by review: a Partition's canary pods stay the canary when the status's canary
/// revision is gone (Failed, a rollback): they run the canary's image.
#[test]
fn a_partitions_canary_is_told_by_its_image_in_every_phase() {
    let mut canary = pod("kv", 2, true, 0, None);
    canary.spec.as_mut().unwrap().containers[0].image = Some("kv:2".into());
    let mut stable = pod("kv", 0, true, 0, None);
    stable.spec.as_mut().unwrap().containers[0].image = Some("kv:1".into());
    let pods = facts(&[stable, canary]);
    let rows = replica_map(&MapInput {
        rollout: "kv",
        replicas: 3,
        templates: &["data".to_string()],
        canary_image: Some("kv:2"),
        stable_image: Some("kv:1"),
        canary_revision: None,
        pods: &pods,
        claims: &[],
    });
    assert!(!rows[0].pods[0].canary);
    assert!(rows[2].pods[0].canary);
}

/// Found by review: two volumes for one replica (the StatefulSet controller made the stable
/// claim again on a new volume while the canary's holds the replica's) both show.
#[test]
fn two_volumes_for_one_replica_both_show_as_a_conflict() {
    let mut claims = stable_claims();
    claims.retain(|c| c.name != "data-kv-stable-2");
    claims.push(claim("data-kv-canary-2", Some("pv-2"), true));
    claims.push(claim("data-kv-stable-2", Some("pv-new"), true));
    let vs = &map(&[], &claims)[2].volumes;
    let shown: Vec<(&str, Option<Side>, bool)> = vs
        .iter()
        .map(|v| (v.volume.as_str(), v.held_by, v.conflict))
        .collect();
    assert_eq!(
        shown,
        vec![
            ("pv-new", Some(Side::Stable), true),
            ("pv-2", Some(Side::Canary), true)
        ]
    );
}

/// Found by review: `spec.replicas` is anyone's who may scale the rollout; the map is bounded.
#[test]
fn a_huge_replica_count_draws_a_bounded_map() {
    let rows = replica_map(&MapInput {
        rollout: "kv",
        replicas: i32::MAX,
        templates: &[],
        canary_image: None,
        stable_image: None,
        canary_revision: None,
        pods: &[],
        claims: &[],
    });
    assert_eq!(rows.len(), MAX_ORDINALS as usize);
}

#[test]
fn restarts_count_init_containers_and_never_overflow() {
    let mut p = pod("kv-stable", 0, false, i32::MAX, None);
    let status = p.status.as_mut().unwrap();
    status.init_container_statuses = Some(vec![
        serde_json::from_value(serde_json::json!({
            "name": "init", "image": "i", "imageID": "", "ready": false, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}}
        }))
        .unwrap(),
    ]);
    let f = PodFacts::from_object(&p, None).unwrap();
    assert_eq!(f.restarts, i32::MAX);
    assert_eq!(f.waiting.as_deref(), Some("CrashLoopBackOff"));
}
