//! Config copied per version (`versionedConfig`) through batches, promotions and rollbacks of a CanaryDeployment.

use super::*;

/// A Sim whose pods mount ConfigMap `web-config`, copied per version, as `copy` now.
fn with_versioned_config(strategy: Strategy) -> Sim {
    let mut s = Sim::new(strategy, 2, PauseMode::First);
    let mut spec = serde_json::to_value(&s.spec).unwrap();
    spec["versionedConfig"] = serde_json::json!(true);
    spec["template"]["template"]["spec"]["volumes"] =
        serde_json::json!([{"name": "config", "configMap": {"name": "web-config"}}]);
    s.spec = serde_json::from_value(spec).unwrap();
    s.config_now("web-config-aaa");
    s
}

impl Sim {
    fn config_now(&mut self, copy: &str) {
        self.config = crate::plan::config::ConfigObserved::Read(vec![crate::api::ConfigCopy {
            kind: crate::api::ConfigKind::ConfigMap,
            name: "web-config".into(),
            copy: copy.into(),
        }]);
    }

    /// The ConfigMaps mounted by the pods of each image.
    fn mounted_by_image(&self) -> BTreeMap<String, Vec<String>> {
        self.deployments
            .iter()
            .map(|(name, d)| (d.image.clone().unwrap(), self.mounted[name].clone()))
            .collect()
    }
}

#[test]
fn versioned_config_rides_with_the_canary_and_is_promoted_with_it() {
    let mut s = with_versioned_config(Strategy::Batches);
    s.completed_on("web:1");
    assert_eq!(
        s.mounted_by_image(),
        BTreeMap::from([("web:1".into(), vec!["web-config-aaa".into()])])
    );
    // One commit: a new image and a new config.
    s.spec.image = "web:2".into();
    s.config_now("web-config-bbb");
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    assert_eq!(
        s.mounted_by_image(),
        BTreeMap::from([
            ("web:1".into(), vec!["web-config-aaa".into()]),
            ("web:2".into(), vec!["web-config-bbb".into()]),
        ]),
        "only the canary's pods mount the new config"
    );
    s.spec.current_batch = 2;
    s.completed_on("web:2");
    assert_eq!(
        s.mounted_by_image(),
        BTreeMap::from([("web:2".into(), vec!["web-config-bbb".into()])])
    );
    // The previous image keeps its copies (what `strategy: Rollback` returns to).
    let images: Vec<&str> = s
        .status
        .version_config
        .iter()
        .map(|v| v.image.as_str())
        .collect();
    assert_eq!(images, ["web:1", "web:2"]);
}

#[test]
fn versioned_config_stays_old_on_the_stable_pods_through_a_rollback() {
    let mut s = with_versioned_config(Strategy::Batches);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.config_now("web-config-bbb");
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    assert_eq!(
        s.mounted_by_image(),
        BTreeMap::from([("web:1".into(), vec!["web-config-aaa".into()])])
    );
    // Git puts image and config back (a revert): nothing moves.
    s.abort = None;
    s.spec.image = "web:1".into();
    s.config_now("web-config-aaa");
    s.completed_on("web:1");
    assert_eq!(
        s.mounted_by_image(),
        BTreeMap::from([("web:1".into(), vec!["web-config-aaa".into()])])
    );
    assert_eq!(s.deployments.len(), 1);
    let images: Vec<&str> = s
        .status
        .version_config
        .iter()
        .map(|v| v.image.as_str())
        .collect();
    assert_eq!(images, ["web:1"], "web:2's copies are garbage now");
}

#[test]
fn a_config_change_alone_rolls_the_stable_pods_onto_the_new_copy() {
    for strategy in [Strategy::Batches, Strategy::Rolling] {
        let mut s = with_versioned_config(strategy);
        s.completed_on("web:1");
        let before: Vec<String> = s.deployments.keys().cloned().collect();
        s.config_now("web-config-ccc");
        s.reconcile();
        s.tick();
        s.completed_on("web:1");
        assert_eq!(
            s.mounted_by_image(),
            BTreeMap::from([("web:1".into(), vec!["web-config-ccc".into()])]),
            "{strategy:?}"
        );
        let after: Vec<String> = s.deployments.keys().cloned().collect();
        assert_eq!(
            before, after,
            "{strategy:?}: the same Deployment, updated in place"
        );
    }
}

#[test]
fn without_versioned_config_the_pods_mount_the_templates_names() {
    let mut s = with_versioned_config(Strategy::Batches);
    s.spec.versioned_config = false;
    s.config = Default::default();
    s.completed_on("web:1");
    assert_eq!(
        s.mounted_by_image(),
        BTreeMap::from([("web:1".into(), vec!["web-config".into()])])
    );
    assert!(s.status.version_config.is_empty());
}

/// The sync applies a rollout before its config: the canary's first plans see the old config,
/// and a revert's image comes back before its config. The stable pods never move.
#[test]
fn versioned_config_seen_after_its_image_moves_only_the_canary() {
    let mut s = with_versioned_config(Strategy::Batches);
    s.completed_on("web:1");
    s.spec.image = "web:2".into();
    s.reconcile();
    s.tick();
    s.config_now("web-config-bbb");
    s.run_until("Paused", |s| s.phase() == Some(Phase::Paused));
    let stable_only_old =
        |s: &Sim| s.mounted_by_image().get("web:1") == Some(&vec!["web-config-aaa".to_string()]);
    assert!(stable_only_old(&s));
    assert_eq!(
        s.mounted_by_image()["web:2"],
        ["web-config-bbb"],
        "the canary moved onto the new config"
    );
    s.abort = Some("true".into());
    s.run_until("RolledBack", |s| s.phase() == Some(Phase::RolledBack));
    // The revert: image first, config a moment later.
    s.abort = None;
    s.spec.image = "web:1".into();
    // The config was applied before this spec: stale.
    let crate::plan::config::ConfigObserved::Read(bbb) = s.config.clone() else {
        panic!()
    };
    s.config = crate::plan::config::ConfigObserved::Stale(bbb);
    for _ in 0..3 {
        s.reconcile();
        s.tick();
        assert!(stable_only_old(&s), "{:?}", s.mounted_by_image());
    }
    s.config_now("web-config-aaa");
    s.completed_on("web:1");
    assert!(stable_only_old(&s));
    assert_eq!(s.deployments.len(), 1);
}
