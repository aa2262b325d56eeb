//! Properties over random event sequences, refusals that stay shown, and kstatus readings.

use super::*;

/// One thing that can happen between reconciles.
#[derive(Clone, Debug)]
enum Event {
    Tick,
    Image(u8),
    Promote(bool),
    Abort(bool),
    Crash(usize),
    /// Git changes the canary's size: (canaryReplicas, steps) from a few shapes.
    CanaryShape(u8),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => Just(Event::Tick),
        1 => (0u8..4).prop_map(Event::Image),
        1 => any::<bool>().prop_map(Event::Promote),
        1 => any::<bool>().prop_map(Event::Abort),
        1 => (0usize..3).prop_map(Event::Crash),
        1 => (0u8..3).prop_map(Event::CanaryShape),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random Git changes, crashes and clock ticks: every plan keeps the invariants (checked
    /// in `reconcile`), Ready never drops below the floor while canaries are healthy, no
    /// volume is ever lost, and once things calm down the rollout settles with every replica
    /// on its own volume.
    #[test]
    fn invariants_hold_over_random_histories(
        two in any::<bool>(),
        steps in any::<bool>(),
        events in proptest::collection::vec(event(), 1..60),
    ) {
        let mut s = if two { two_sets() } else { partition() };
        if steps {
            s.spec.canary_replicas = 2;
            s.spec.steps = Some(vec![1, 2]);
        }
        s.stabilise();
        let shape = (s.spec.canary_replicas, s.spec.steps.clone());
        let before = s.volumes_by_ordinal();
        let pv_count = s.volumes.len();
        for e in events {
            match e {
                Event::Tick => {
                    s.reconcile();
                    s.check_ready_floor();
                    s.tick();
                }
                Event::Image(i) => s.spec.image = format!("redis:{}", i + 1),
                Event::Promote(on) => s.promote = on.then(|| "true".into()),
                Event::Abort(on) => s.abort = on.then(|| "true".into()),
                Event::Crash(n) => {
                    s.reconcile_partial(Some(n));
                    s.tick();
                }
                Event::CanaryShape(i) => {
                    // The shape it leaves counts too: its canary may still hold those ordinals.
                    s.widest_canary = s.widest_canary.max(s.spec.canary_replicas);
                    (s.spec.canary_replicas, s.spec.steps) = match i {
                        0 => (1, None),
                        1 => (2, None),
                        _ => (2, Some(vec![1, 2])),
                    };
                    s.widest_canary = s.widest_canary.max(s.spec.canary_replicas);
                }
            }
            // Determinism: the same state plans the same way.
            prop_assert_eq!(s.plan(), s.plan());
            prop_assert!(s.volumes.len() >= pv_count, "a volume disappeared");
        }
        // Calm: Git settles on the last image, promoted, in a shape that covers every
        // ordinal a canary may hold (a narrower one is refused, as asserted elsewhere).
        (s.spec.canary_replicas, s.spec.steps) = if s.widest_canary > 0 {
            (s.widest_canary, None)
        } else {
            shape
        };
        s.abort = None;
        s.promote = Some(s.spec.image.clone());
        s.run_until("settled", |s| {
            s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some(&s.spec.image)
                || s.phase() == Some(Phase::RolledBack)
        });
        if s.phase() == Some(Phase::RolledBack) {
            let image = s.status.stable_image.clone().unwrap();
            s.spec.image = image;
            s.stabilise();
        }
        prop_assert_eq!(s.volumes_by_ordinal(), before);
        prop_assert_eq!(s.volumes.len(), pv_count, "volumes were created: a replica lost its data");
    }
}

#[test]
fn a_refused_action_shows_as_stalled_until_the_plan_no_longer_needs_it() {
    // Issue 18: a 422 on every retry while status said Stable, Ready=True.
    let mut s = two_sets();
    s.stabilise();
    s.sets.get_mut("redis-stable").unwrap().replicas = 1;
    let p = s.plan();
    let apply = p.actions[0].describe();
    let mut blocked = p.status.clone();
    let failure = format!("{apply}: spec: Forbidden (Invalid, HTTP 422)");
    crate::plan::mark_action_failed(&mut blocked, &apply, &failure, true, s.now);
    s.status = blocked.clone();
    let condition = |st: &CanaryStatefulSetStatus, t: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    assert_eq!(
        condition(&blocked, "Ready"),
        Some(("False".into(), "ActionFailed".into()))
    );
    // A retry plans the same action: the status stays as written, so nothing is rewritten.
    let again = s.plan();
    assert_eq!(again.status, blocked);
    // Once the action went through, the failure is gone with it.
    s.sets.get_mut("redis-stable").unwrap().replicas = 3;
    let after = s.reconcile();
    assert!(after.actions.is_empty());
    assert_eq!(
        condition(&after.status, "Stalled"),
        Some(("False".into(), "Stable".into()))
    );
    assert_eq!(
        condition(&after.status, "Ready"),
        Some(("True".into(), "Stable".into()))
    );
}

#[test]
fn a_strategy_switch_on_a_live_rollout_is_refused_until_put_back() {
    // Issue 18: Partition -> TwoSets made redis-stable on new volumes beside redis: 8 pods for 4.
    let mut s = partition();
    s.stabilise();
    s.spec.strategy.type_ = StatefulSetStrategyType::TwoSets;
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::Failed));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(
        p.events
            .iter()
            .any(|e| e.warning && e.reason == "UnsafeChange")
    );
    let message = p.status.message.clone().unwrap();
    assert!(
        message.starts_with("redis.yaml: spec.strategy.type changed to TwoSets")
            && message.contains("Put spec.strategy.type back to Partition"),
        "{message}"
    );
    assert!(!s.sets.contains_key("redis-stable"));
    s.spec.strategy.type_ = StatefulSetStrategyType::Partition;
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::Stable));
    assert!(s.events.contains(&"SpecFixed"));
}

#[test]
fn a_change_kubernetes_cannot_make_to_a_live_set_is_refused_by_name() {
    // Issue 18: a selector added to a live rollout's template was a 422 retried forever.
    for field in ["selector", "serviceName", "volumeClaimTemplates"] {
        let mut s = two_sets();
        s.stabilise();
        let before = s.spec.clone();
        match field {
            "selector" => {
                s.spec.template.update(|t| {
                    t.selector
                        .match_labels
                        .get_or_insert_default()
                        .insert("tier".into(), "db".into());
                });
            }
            "serviceName" => s
                .spec
                .template
                .update(|t| t.service_name = Some("other".into())),
            _ => s.spec.template.update(|t| {
                let claims = t.volume_claim_templates.as_mut().unwrap();
                claims[0].metadata.name = Some("state".into());
            }),
        }
        let p = s.reconcile();
        assert_eq!(p.status.phase, Some(Phase::Failed), "{field}");
        assert!(p.actions.is_empty(), "{field}: {:?}", p.actions);
        let message = p.status.message.clone().unwrap();
        assert!(
            message.starts_with(&format!("redis.yaml: spec.template.{field} changed"))
                && message.contains("redis-stable"),
            "{message}"
        );
        s.spec = before;
        assert_eq!(s.reconcile().status.phase, Some(Phase::Stable), "{field}");
    }
}

#[test]
fn a_canary_claim_deleted_by_hand_is_recreated_on_its_volume_before_it_moves_back() {
    // Issue 18: with both claims of ordinal 2 gone, the handoff back called it done, and the
    // stable set's controller gave replica 2 a new, empty volume.
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.claims.get_mut("data-redis-canary-2").unwrap().deleting = true;
    s.promote = Some("true".into());
    s.run_until("Stable on redis:2", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn a_rollout_failed_by_a_strategy_switch_counts_the_pods_it_still_runs() {
    // Issue 44: READY 0/3 (and "0 on redis:7.0.5; 0/3 ready" in commit subjects) while the
    // Partition set's 3 pods were Ready: no pod was listed without a set of the new strategy.
    let mut s = partition();
    s.stabilise();
    s.spec.strategy.type_ = StatefulSetStrategyType::TwoSets;
    let o = s.observed();
    assert!(o.stable.is_none() && o.canary.is_none() && has_pods(&o));
    for _ in 0..2 {
        let p = s.reconcile();
        assert_eq!(p.status.phase, Some(Phase::Failed));
        assert_eq!(
            (p.status.ready.as_deref(), p.status.ready_replicas),
            (Some("3/3"), 3)
        );
        assert_eq!(p.status.canary_ready_replicas, 0);
    }
}

#[test]
fn a_rollout_failed_mid_canary_still_counts_its_canary() {
    let mut s = two_sets();
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    let canary = s.status.canary_ready_replicas;
    assert!(canary > 0);
    s.spec
        .template
        .update(|t| t.service_name = Some("other".into()));
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::Failed));
    assert_eq!(p.status.ready_replicas, s.spec.replicas);
    assert_eq!(p.status.canary_ready_replicas, canary);
}

#[test]
fn a_canary_claim_deleted_with_its_pod_stops_the_rollout_before_it_promotes_a_new_volume() {
    // Issue 44: a drain deleted the canary's claim, then its pod; the StatefulSet controller
    // made a new claim on a new volume, and linnet promoted onto it and handed the empty
    // volume to the stable set. The replica's own volume was left Released.
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.claims.get_mut("data-redis-canary-2").unwrap().deleting = true;
    s.pods.remove("redis-canary-2");
    s.tick(); // the claim goes; the set's controller makes pod and claim again, first
    let fresh = s.claims["data-redis-canary-2"].volume.clone().unwrap();
    assert_ne!(fresh, before[2]);
    s.promote = Some("true".into());
    let p = s.reconcile();
    assert_eq!(p.status.phase, Some(Phase::Failed));
    let message = p.status.message.clone().unwrap();
    assert!(
        message.contains(&before[2]) && message.contains(&fresh),
        "{message}"
    );
    assert!(s.events.contains(&"VolumeSwapped"));
    for _ in 0..5 {
        assert!(s.reconcile().actions.is_empty());
        s.tick();
    }
    assert_eq!(s.phase(), Some(Phase::Failed));
    assert!(!s.phases.contains(&Phase::Promoting));
    assert!(!s.claims.contains_key("data-redis-stable-2"));
    // As the message says: the canary set to 0 and the wrong claim deleted; the canary is
    // rolled back onto the replica's own volume.
    s.sets.get_mut("redis-canary").unwrap().replicas = 0;
    s.tick();
    s.claims.remove("data-redis-canary-2");
    s.volumes.remove(&fresh);
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(s.volumes_by_ordinal(), before);
}

#[test]
fn a_canary_claim_gone_with_its_pod_is_made_again_on_the_replicas_own_volume() {
    // Issue 44, the other order: linnet sees the claim gone before the StatefulSet
    // controller makes it again, and makes it on the replica's own volume.
    let mut s = two_sets();
    s.stabilise();
    let before = s.volumes_by_ordinal();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.claims.remove("data-redis-canary-2");
    s.pods.remove("redis-canary-2");
    let p = s.reconcile();
    // Regression (issue 69): said in an event, not only done.
    let remade = p.events.iter().find(|e| e.reason == "ClaimRemade");
    assert!(
        remade.is_some_and(|e| e.warning
            && e.message.contains("data-redis-canary-2")
            && e.message.contains(before[2].as_str())),
        "{:?}",
        p.events
    );
    assert!(
        p.actions.iter().any(|a| matches!(a, Action::CreateClaim(c)
            if c.metadata.name.as_deref() == Some("data-redis-canary-2")
            && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(before[2].as_str()))),
        "{:?}",
        p.actions
    );
    s.run_until("bound", |s| {
        s.claims.get("data-redis-canary-2").is_some_and(|c| c.bound)
    });
    assert_eq!(s.phase(), Some(Phase::CanaryActive));
    if let Some(pod) = s.pods.get_mut("redis-canary-2") {
        pod.ready = true; // the kubelet starts it once its claim is bound
    }
    s.promote = Some("true".into());
    s.run_until("Stable on redis:2", |s| {
        s.phase() == Some(Phase::Stable) && s.status.stable_image.as_deref() == Some("redis:2")
    });
    assert_eq!(s.volumes_by_ordinal(), before);
    assert!(
        s.status.replica_volumes.is_empty(),
        "forgotten once promoted"
    );
}

#[test]
fn a_replica_count_changed_mid_canary_is_refused_until_put_back() {
    // Issue 44: replicas 3 -> 4 while the canary held ordinal 2's volume moved the canary to
    // ordinal 3 and started ordinal 2 again in the stable set, on a new, empty volume.
    for (replicas, canary, steps) in [(4, 1, None), (2, 1, None), (3, 1, Some(vec![1]))] {
        let mut s = two_sets();
        s.spec.canary_replicas = 2;
        s.spec.steps = Some(vec![1, 2]);
        s.stabilise();
        let before = s.volumes_by_ordinal();
        let pv_count = s.volumes.len();
        s.spec.image = "redis:2".into();
        s.run_until("second step", |s| {
            s.phase() == Some(Phase::CanaryActive) && s.status.current_step == Some(1)
        });
        let shape = (
            s.spec.replicas,
            s.spec.canary_replicas,
            s.spec.steps.clone(),
        );
        (s.spec.replicas, s.spec.canary_replicas, s.spec.steps) = (replicas, canary, steps);
        let p = s.reconcile();
        assert_eq!(p.status.phase, Some(Phase::Failed), "{replicas} {canary}");
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        let message = p.status.message.clone().unwrap();
        assert!(
            message.starts_with("redis.yaml: spec.replicas, spec.canaryReplicas or spec.steps")
                && message.contains("ordinal(s) 1, 2")
                && message.contains("(3 replicas and a canary of at least 2)"),
            "{message}"
        );
        for _ in 0..3 {
            s.tick();
            assert!(s.reconcile().actions.is_empty());
        }
        assert_eq!(s.volumes.len(), pv_count);
        (s.spec.replicas, s.spec.canary_replicas, s.spec.steps) = shape;
        s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
        assert_eq!(s.volumes_by_ordinal(), before);
        assert_eq!(s.volumes.len(), pv_count);
    }
}

#[test]
fn a_canary_grown_mid_canary_goes_on() {
    // Growing the canary keeps the ordinals it holds inside it: no refusal.
    let mut s = two_sets();
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    s.spec.canary_replicas = 2;
    let p = s.reconcile();
    assert_ne!(
        p.status.phase,
        Some(Phase::Failed),
        "{:?}",
        p.status.message
    );
}

/// Regression (issue 69): a stable claim deleted with its pod while Stable got a new, empty
/// volume from the StatefulSet controller, and linnet said nothing. Now the condition
/// VolumeReplaced names both volumes (with the way back for a kept one), a Warning event says
/// it once, and the condition clears when the claim is back on its volume, or the old volume is
/// gone.
#[test]
fn a_stable_claim_on_a_new_volume_is_a_condition_and_an_event_naming_both() {
    use crate::api::condition::VOLUME_REPLACED;
    for mut s in [partition(), two_sets()] {
        s.stabilise();
        let before = s.volumes_by_ordinal();
        let p = s.reconcile();
        assert_eq!(
            p.status.stable_volumes.len(),
            3,
            "{:?}",
            p.status.stable_volumes
        );
        let claim = s
            .claims
            .keys()
            .find(|c| c.ends_with("-1") && !c.contains("canary"))
            .cloned()
            .unwrap();
        s.claims.get_mut(&claim).unwrap().volume = Some("pv-fresh".into());
        let old = s.volumes.get_mut(&before[1]).unwrap();
        old.retain = true;
        old.claim = None;
        let p = s.reconcile();
        let c = crate::api::find_condition(&p.status.conditions, VOLUME_REPLACED).unwrap();
        assert_eq!(c.status, "True");
        assert!(
            c.message.contains("pv-fresh")
                && c.message.contains(&before[1])
                && c.message.contains("Retain"),
            "{}",
            c.message
        );
        assert!(
            p.events
                .iter()
                .any(|e| e.warning && e.reason == "VolumeReplaced")
        );
        let again = s.reconcile();
        assert!(
            !again.events.iter().any(|e| e.reason == "VolumeReplaced"),
            "said once"
        );
        assert!(
            again.actions.is_empty(),
            "nothing is done by itself: {:?}",
            again.actions
        );
        // Back on its own volume (as the condition says how): cleared.
        s.claims.get_mut(&claim).unwrap().volume = Some(before[1].clone());
        let p = s.reconcile();
        let c = crate::api::find_condition(&p.status.conditions, VOLUME_REPLACED).unwrap();
        assert_eq!(c.status, "False");
        // A replacement whose old volume is gone is the replica's volume from then on.
        s.claims.get_mut(&claim).unwrap().volume = Some("pv-fresh".into());
        s.volumes.remove(&before[1]);
        let p = s.reconcile();
        assert_eq!(p.status.stable_volumes[&claim], "pv-fresh");
        let c = crate::api::find_condition(&p.status.conditions, VOLUME_REPLACED).unwrap();
        assert_eq!(c.status, "False");
    }
}
