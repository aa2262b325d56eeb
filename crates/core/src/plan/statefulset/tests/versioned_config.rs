//! Config copied per version (`versionedConfig`) through both strategies' canaries and rollbacks.

use super::*;

/// A Sim whose pods mount ConfigMap `redis-config`, copied per version, as `copy` now.
fn with_versioned_config(mut s: Sim) -> Sim {
    let mut spec = serde_json::to_value(&s.spec).unwrap();
    spec["versionedConfig"] = serde_json::json!(true);
    spec["template"]["template"]["spec"]["volumes"] =
        serde_json::json!([{"name": "config", "configMap": {"name": "redis-config"}}]);
    s.spec = serde_json::from_value(spec).unwrap();
    s.config_now("redis-config-aaa");
    s
}

impl Sim {
    fn config_now(&mut self, copy: &str) {
        self.config = crate::plan::config::ConfigObserved::Read(vec![crate::api::ConfigCopy {
            kind: crate::api::ConfigKind::ConfigMap,
            name: "redis-config".into(),
            copy: copy.into(),
        }]);
    }

    fn mounted(&self, set: &str) -> Vec<String> {
        self.sets[set].config.clone()
    }
}

#[test]
fn versioned_config_rides_with_a_two_sets_canary() {
    let mut s = with_versioned_config(two_sets());
    s.stabilise();
    assert_eq!(s.mounted("redis-stable"), ["redis-config-aaa"]);
    s.spec.image = "redis:2".into();
    s.config_now("redis-config-bbb");
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(s.mounted("redis-stable"), ["redis-config-aaa"]);
    assert_eq!(s.mounted("redis-canary"), ["redis-config-bbb"]);
    s.promote = Some("true".into());
    s.stabilise();
    assert_eq!(s.status.stable_image.as_deref(), Some("redis:2"));
    assert_eq!(s.mounted("redis-stable"), ["redis-config-bbb"]);
    let images: Vec<&str> = s
        .status
        .version_config
        .iter()
        .map(|v| v.image.as_str())
        .collect();
    assert_eq!(images, ["redis:2"], "redis:1's copies are garbage now");
}

#[test]
fn versioned_config_stays_old_through_a_rollback_of_either_strategy() {
    for start in [two_sets(), partition()] {
        let mut s = with_versioned_config(start);
        s.stabilise();
        let stable_set = if s.sets.contains_key("redis") {
            "redis"
        } else {
            "redis-stable"
        };
        s.spec.image = "redis:2".into();
        s.config_now("redis-config-bbb");
        s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
        if stable_set == "redis" {
            // One set: its template is the canary's; the partition keeps the rest on the old
            // revision, which names the old copy.
            assert_eq!(s.mounted("redis"), ["redis-config-bbb"]);
        }
        s.abort = Some("true".into());
        s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
        assert_eq!(s.mounted(stable_set), ["redis-config-aaa"], "{stable_set}");
        assert!(!s.sets.contains_key("redis-canary"));
    }
}

/// The sync applies a rollout before its config: the canary's first plans see the old config,
/// and a revert's image comes back before its config. The stable set never moves.
#[test]
fn versioned_config_seen_after_its_image_moves_only_the_canary_set() {
    let mut s = with_versioned_config(two_sets());
    s.stabilise();
    s.spec.image = "redis:2".into();
    s.reconcile();
    s.tick();
    s.config_now("redis-config-bbb");
    s.run_until("CanaryActive", |s| s.phase() == Some(Phase::CanaryActive));
    assert_eq!(s.mounted("redis-stable"), ["redis-config-aaa"]);
    s.run_until("the canary on the new config", |s| {
        s.mounted("redis-canary") == ["redis-config-bbb"]
    });
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    s.abort = None;
    s.spec.image = "redis:1".into();
    // The config was applied before this spec: stale.
    let crate::plan::config::ConfigObserved::Read(bbb) = s.config.clone() else {
        panic!()
    };
    s.config = crate::plan::config::ConfigObserved::Stale(bbb);
    for _ in 0..3 {
        s.reconcile();
        s.tick();
        assert_eq!(s.mounted("redis-stable"), ["redis-config-aaa"]);
    }
    s.config_now("redis-config-aaa");
    s.stabilise();
    assert_eq!(s.mounted("redis-stable"), ["redis-config-aaa"]);
}
