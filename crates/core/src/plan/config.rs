//! Config that rides with the canary (`versionedConfig`): which ConfigMaps and Secrets a pod
//! template refers to, the copy each version's pods mount instead, and which copies each image
//! keeps from one plan to the next. Pure: the controller reads the objects and makes the
//! copies; this decides which copy a child names.
//!
//! The rule, per plan: the image the spec asks for mounts copies of the config as it is now;
//! the stable image keeps the copies it had while the spec asks for another image (so the
//! stable pods keep the old config through a canary and its rollback), and takes the config
//! as it is now once the spec asks for it again (a config change alone rolls every pod), but
//! not config the sync applied before the spec: the sync applies rollouts before ConfigMaps
//! and Secrets (so that a canary's image is seen before its config), and a revert that puts
//! the stable image back comes before its config, which the stable pods must not take in
//! between ([`ConfigObserved::Stale`]). Images the rollout may still run (canary, previous) keep
//! theirs; the rest are dropped, and their copies are garbage once no child names them.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::json;

use crate::api::{ConfigCopy, ConfigKind, VersionConfig};

/// What the controller saw of a rollout's config this reconcile.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ConfigObserved {
    /// `versionedConfig` is off: children name the ConfigMaps and Secrets themselves.
    #[default]
    Off,
    /// The copies of the config as it is now, one per object the template names that exists.
    Read(Vec<ConfigCopy>),
    /// The same, but some of it was applied by the sync before the rollout's spec: a change
    /// of the spec whose config is still on its way (the sync applies rollouts first). The
    /// image the spec asks for takes it; the stable image keeps what it has.
    Stale(Vec<ConfigCopy>),
}

/// The sync's field manager, whose apply times say which came first, a rollout's spec or
/// its config.
pub const SYNC_FIELD_MANAGER: &str = crate::api::field_managers::SYNC;

/// Of an object's `managedFields`, only the sync's own apply, without its field set: what a
/// store keeps to tell when the sync last applied the object.
pub fn applied_entry(fields: Option<Vec<ManagedFieldsEntry>>) -> Option<Vec<ManagedFieldsEntry>> {
    let kept: Vec<ManagedFieldsEntry> = fields?
        .into_iter()
        .filter(is_sync_apply)
        .map(|mut e| {
            e.fields_v1 = None;
            e
        })
        .collect();
    (!kept.is_empty()).then_some(kept)
}

/// When the sync last applied the object (its `managedFields` entry's time).
pub fn applied_at(fields: Option<&[ManagedFieldsEntry]>) -> Option<jiff::Timestamp> {
    fields?
        .iter()
        .filter(|e| is_sync_apply(e))
        .filter_map(|e| e.time.as_ref().map(|t| t.0))
        .max()
}

fn is_sync_apply(e: &ManagedFieldsEntry) -> bool {
    e.manager.as_deref() == Some(SYNC_FIELD_MANAGER)
        && e.operation.as_deref() == Some("Apply")
        && e.subresource.as_deref().unwrap_or_default().is_empty()
}

/// Every ConfigMap and Secret `pod` names: volumes (projected ones too), `envFrom` and
/// `env[].valueFrom`, of its containers and init containers.
pub fn references(pod: &PodSpec) -> BTreeSet<(ConfigKind, String)> {
    let mut out = BTreeSet::new();
    visit(&mut pod.clone(), &mut |kind, name| {
        out.insert((kind, name.clone()));
    });
    out
}

/// `pod` with every name `copies` has a copy of replaced by that copy.
pub fn rewrite(pod: &mut PodSpec, copies: &[ConfigCopy]) {
    if copies.is_empty() {
        return;
    }
    visit(pod, &mut |kind, name| {
        if let Some(c) = copies.iter().find(|c| c.kind == kind && c.name == *name) {
            *name = c.copy.clone();
        }
    });
}

/// Calls `f` with each ConfigMap or Secret name in `pod`, which it may change.
fn visit(pod: &mut PodSpec, f: &mut impl FnMut(ConfigKind, &mut String)) {
    for v in pod.volumes.iter_mut().flatten() {
        if let Some(cm) = v.config_map.as_mut() {
            f(ConfigKind::ConfigMap, &mut cm.name);
        }
        if let Some(s) = v.secret.as_mut()
            && let Some(name) = s.secret_name.as_mut()
        {
            f(ConfigKind::Secret, name);
        }
        for source in v
            .projected
            .iter_mut()
            .flat_map(|p| p.sources.iter_mut().flatten())
        {
            if let Some(cm) = source.config_map.as_mut() {
                f(ConfigKind::ConfigMap, &mut cm.name);
            }
            if let Some(s) = source.secret.as_mut() {
                f(ConfigKind::Secret, &mut s.name);
            }
        }
    }
    let containers = pod
        .containers
        .iter_mut()
        .chain(pod.init_containers.iter_mut().flatten());
    for c in containers {
        for from in c.env_from.iter_mut().flatten() {
            if let Some(cm) = from.config_map_ref.as_mut() {
                f(ConfigKind::ConfigMap, &mut cm.name);
            }
            if let Some(s) = from.secret_ref.as_mut() {
                f(ConfigKind::Secret, &mut s.name);
            }
        }
        for value in c
            .env
            .iter_mut()
            .flatten()
            .filter_map(|e| e.value_from.as_mut())
        {
            if let Some(k) = value.config_map_key_ref.as_mut() {
                f(ConfigKind::ConfigMap, &mut k.name);
            }
            if let Some(k) = value.secret_key_ref.as_mut() {
                f(ConfigKind::Secret, &mut k.name);
            }
        }
    }
}

/// The name of `name`'s copy whose content (and rollout) hash to `hash`: `<name>-<10 hex>`,
/// within the 253 characters of an object name.
pub fn copy_name(name: &str, hash: &str) -> String {
    let hash: String = hash.chars().take(10).collect();
    let prefix: String = name.chars().take(253 - 1 - hash.len()).collect();
    format!("{prefix}-{hash}")
}

/// The name of rollout `rollout`'s copy of ConfigMap `cm` as it is: its content and the
/// rollout's name hashed, so two rollouts never share (and delete) one copy.
pub fn config_map_copy_name(rollout: &str, cm: &ConfigMap) -> String {
    let content = json!({"data": cm.data, "binaryData": cm.binary_data});
    copy_name(
        &cm.metadata.name.clone().unwrap_or_default(),
        &hashed(rollout, content),
    )
}

/// [`config_map_copy_name`] for a Secret (its type counts too).
pub fn secret_copy_name(rollout: &str, secret: &Secret) -> String {
    let content = json!({"data": secret.data, "type": secret.type_});
    copy_name(
        &secret.metadata.name.clone().unwrap_or_default(),
        &hashed(rollout, content),
    )
}

fn hashed(rollout: &str, content: serde_json::Value) -> String {
    crate::hash::content_hash(&json!({"rollout": rollout, "content": content}))
}

/// The copies `image`'s pods mount (none: the template's own names).
pub fn copies_for<'a>(versions: &'a [VersionConfig], image: &str) -> &'a [ConfigCopy] {
    versions
        .iter()
        .find(|v| v.image == image)
        .map_or(&[], |v| &v.copies)
}

/// Every copy some version still mounts: the rest may be deleted.
pub fn copies_in_use(versions: &[VersionConfig]) -> BTreeSet<(ConfigKind, String)> {
    versions
        .iter()
        .flat_map(|v| &v.copies)
        .map(|c| (c.kind, c.copy.clone()))
        .collect()
}

/// The copies each image mounts after this plan (see the module's rule). `recorded` is the
/// status's, `wanted` the spec's image, `stable` the image the stable pods run, and `keep` the
/// other images the rollout may still run (canary, previous, rollback's ends).
pub fn versions(
    recorded: &[VersionConfig],
    observed: &ConfigObserved,
    wanted: &str,
    stable: &str,
    keep: &[&str],
) -> Vec<VersionConfig> {
    let (now, held) = match observed {
        ConfigObserved::Off => return Vec::new(),
        ConfigObserved::Read(now) => (now, false),
        ConfigObserved::Stale(now) => (now, wanted == stable),
    };
    let mut out: Vec<VersionConfig> = recorded
        .iter()
        .filter(|v| {
            (v.image != wanted || held) && (v.image == stable || keep.contains(&v.image.as_str()))
        })
        .cloned()
        .collect();
    if !out.iter().any(|v| v.image == wanted) {
        out.push(VersionConfig {
            image: wanted.to_string(),
            copies: now.clone(),
        });
    }
    out.sort_by(|a, b| a.image.cmp(&b.image));
    out
}

/// Drops, at the end of a plan, the copies of images the rollout no longer runs or may
/// return to (a promotion just made the old stable image one).
pub fn retain(versions: &mut Vec<VersionConfig>, keep: &[&str]) {
    versions.retain(|v| keep.contains(&v.image.as_str()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, ConfigMapProjection, ConfigMapVolumeSource,
        Container, EnvFromSource, EnvVar, EnvVarSource, ProjectedVolumeSource, SecretEnvSource,
        SecretKeySelector, SecretProjection, SecretVolumeSource, Volume, VolumeProjection,
    };

    fn copy(kind: ConfigKind, name: &str, copy: &str) -> ConfigCopy {
        ConfigCopy {
            kind,
            name: name.into(),
            copy: copy.into(),
        }
    }

    fn version(image: &str, copies: &[ConfigCopy]) -> VersionConfig {
        VersionConfig {
            image: image.into(),
            copies: copies.to_vec(),
        }
    }

    /// A pod naming config every way Kubernetes allows.
    fn pod() -> PodSpec {
        let container = |name: &str| Container {
            name: name.into(),
            env_from: Some(vec![
                EnvFromSource {
                    config_map_ref: Some(ConfigMapEnvSource {
                        name: "env-cm".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                EnvFromSource {
                    secret_ref: Some(SecretEnvSource {
                        name: "env-secret".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
            env: Some(vec![
                EnvVar {
                    name: "A".into(),
                    value_from: Some(EnvVarSource {
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "key-cm".into(),
                            key: "a".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                EnvVar {
                    name: "B".into(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "key-secret".into(),
                            key: "b".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                EnvVar {
                    name: "PLAIN".into(),
                    value: Some("x".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        PodSpec {
            containers: vec![container("app")],
            init_containers: Some(vec![container("init")]),
            volumes: Some(vec![
                Volume {
                    name: "config".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: "app-config".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "tls".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some("tls".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "both".into(),
                    projected: Some(ProjectedVolumeSource {
                        sources: Some(vec![
                            VolumeProjection {
                                config_map: Some(ConfigMapProjection {
                                    name: "projected-cm".into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            },
                            VolumeProjection {
                                secret: Some(SecretProjection {
                                    name: "projected-secret".into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            },
                        ]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn every_way_a_pod_names_config_is_found() {
        let found: Vec<String> = references(&pod())
            .into_iter()
            .map(|(k, n)| format!("{}/{n}", k.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                "ConfigMap/app-config",
                "ConfigMap/env-cm",
                "ConfigMap/key-cm",
                "ConfigMap/projected-cm",
                "Secret/env-secret",
                "Secret/key-secret",
                "Secret/projected-secret",
                "Secret/tls",
            ]
        );
    }

    #[test]
    fn rewrite_names_the_copies_and_leaves_the_rest() {
        let mut p = pod();
        rewrite(
            &mut p,
            &[
                copy(ConfigKind::ConfigMap, "app-config", "app-config-1"),
                copy(ConfigKind::Secret, "env-secret", "env-secret-2"),
                // Same name, other kind: not a copy of the ConfigMap.
                copy(ConfigKind::Secret, "key-cm", "key-cm-3"),
            ],
        );
        let found: BTreeSet<String> = references(&p)
            .into_iter()
            .map(|(k, n)| format!("{}/{n}", k.as_str()))
            .collect();
        assert!(found.contains("ConfigMap/app-config-1"));
        assert!(found.contains("Secret/env-secret-2"));
        assert!(found.contains("ConfigMap/key-cm"), "{found:?}");
        assert!(!found.contains("ConfigMap/app-config"));
        // The init container's references are rewritten too.
        let init = &p.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            init.env_from.as_ref().unwrap()[1]
                .secret_ref
                .as_ref()
                .unwrap()
                .name,
            "env-secret-2"
        );
    }

    #[test]
    fn copy_names_fit_an_object_name() {
        assert_eq!(copy_name("app", "0123456789abcdef"), "app-0123456789");
        let long = "a".repeat(300);
        assert_eq!(copy_name(&long, "0123456789ab").len(), 253);
    }

    #[test]
    fn off_records_nothing() {
        let recorded = [version("a", &[copy(ConfigKind::ConfigMap, "c", "c-1")])];
        assert!(versions(&recorded, &ConfigObserved::Off, "a", "a", &[]).is_empty());
    }

    #[test]
    fn a_canary_mounts_the_new_config_and_stable_keeps_the_old() {
        let old = [copy(ConfigKind::ConfigMap, "c", "c-old")];
        let new = vec![copy(ConfigKind::ConfigMap, "c", "c-new")];
        let recorded = [version("app:1", &old)];
        let v = versions(
            &recorded,
            &ConfigObserved::Read(new.clone()),
            "app:2",
            "app:1",
            &["app:2"],
        );
        assert_eq!(copies_for(&v, "app:1"), &old);
        assert_eq!(copies_for(&v, "app:2"), &new[..]);
        // Promoted: app:2 is stable, app:1 dropped (unless kept as previous).
        let promoted = versions(
            &v,
            &ConfigObserved::Read(new.clone()),
            "app:2",
            "app:2",
            &[],
        );
        assert_eq!(promoted, vec![version("app:2", &new)]);
        let kept = versions(
            &v,
            &ConfigObserved::Read(new.clone()),
            "app:2",
            "app:2",
            &["app:1"],
        );
        assert_eq!(copies_for(&kept, "app:1"), &old);
        assert_eq!(
            copies_in_use(&v),
            BTreeSet::from([
                (ConfigKind::ConfigMap, "c-new".to_string()),
                (ConfigKind::ConfigMap, "c-old".to_string())
            ])
        );
    }

    #[test]
    fn a_config_change_alone_moves_the_stable_image() {
        let recorded = [version("app:1", &[copy(ConfigKind::Secret, "s", "s-old")])];
        let new = vec![copy(ConfigKind::Secret, "s", "s-new")];
        let v = versions(
            &recorded,
            &ConfigObserved::Read(new.clone()),
            "app:1",
            "app:1",
            &[],
        );
        assert_eq!(v, vec![version("app:1", &new)]);
    }

    #[test]
    fn git_back_on_the_stable_image_after_a_rollback_takes_its_config_as_it_is() {
        // Rolled back from app:2 (config c-new); Git reverted image and config.
        let recorded = [
            version("app:1", &[copy(ConfigKind::ConfigMap, "c", "c-old")]),
            version("app:2", &[copy(ConfigKind::ConfigMap, "c", "c-new")]),
        ];
        let now = vec![copy(ConfigKind::ConfigMap, "c", "c-old")];
        let v = versions(
            &recorded,
            &ConfigObserved::Read(now.clone()),
            "app:1",
            "app:1",
            &[],
        );
        assert_eq!(v, vec![version("app:1", &now)]);
    }

    #[test]
    fn config_applied_before_the_spec_does_not_move_the_stable_image() {
        // A revert: the spec is back on app:1 (rolled back), its config not yet.
        let old = [copy(ConfigKind::ConfigMap, "c", "c-old")];
        let recorded = [
            version("app:1", &old),
            version("app:2", &[copy(ConfigKind::ConfigMap, "c", "c-new")]),
        ];
        let bad = ConfigObserved::Stale(vec![copy(ConfigKind::ConfigMap, "c", "c-new")]);
        let v = versions(&recorded, &bad, "app:1", "app:1", &[]);
        assert_eq!(copies_for(&v, "app:1"), &old);
        // Never recorded: the first plan takes the config as it is.
        let first = versions(&[], &bad, "app:1", "app:1", &[]);
        // A canary takes it either way.
        let canary = versions(&recorded, &bad, "app:2", "app:1", &[]);
        assert_eq!(copies_for(&canary, "app:2")[0].copy, "c-new");
        assert_eq!(copies_for(&first, "app:1")[0].copy, "c-new");
    }

    #[test]
    fn a_stable_image_never_recorded_mounts_the_templates_names() {
        // Turned on during a canary: nothing recorded for the stable image.
        let v = versions(
            &[],
            &ConfigObserved::Read(vec![copy(ConfigKind::ConfigMap, "c", "c-1")]),
            "app:2",
            "app:1",
            &[],
        );
        assert!(copies_for(&v, "app:1").is_empty());
        assert_eq!(copies_for(&v, "app:2").len(), 1);
    }
}
