//! Config that rides with the canary (`versionedConfig`), the I/O half: each reconcile reads
//! the ConfigMaps and Secrets the pod template names and makes the copy of each one's content
//! (`<name>-<hash>`, immutable, owned by the rollout) before the planner names it
//! ([`crate::plan::config`] decides which copy each version mounts); a settled rollout
//! deletes the copies no version mounts; and a change to a ConfigMap from Git wakes the
//! rollouts that name it. Who owns what: Git's objects are the source's (applied and pruned by
//! it); the copies are the rollout's (its label and owner reference, never the source's label,
//! so prune never touches them, and deleting the rollout deletes them). Secrets are read,
//! copied and deleted as the source's account in the rollout's namespace (`--apply-as`),
//! never with the agent's own rights; their data is copied, never logged: messages name
//! objects only.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::{Context, Doing, ReconcileError};
use crate::api::{
    CONFIG_COPY_LABEL, CONFIG_COPY_OF_ANNOTATION, ConfigCopy, ConfigKind, ROLLOUT_LABEL,
    SOURCE_LABEL, VersionConfig,
};
use crate::plan::config::{
    ConfigObserved, applied_at, config_map_copy_name, copies_in_use, references, secret_copy_name,
};
use crate::plan::objects::RolloutRef;

/// The config as it is now, with a copy of each object the template names (made if no version
/// recorded it yet). An object that does not exist is not copied: the pods name it as the
/// template does, and wait for it as they would without linnet.
/// `spec_applied`: when the sync last applied the rollout; config it applied before that is
/// [`ConfigObserved::Stale`]. The flag: some config was applied after it (a config change, or
/// a rollout this store has not seen the newest spec of yet).
pub(super) async fn read(
    ctx: &Context,
    kind: &str,
    rollout: &RolloutRef,
    pod: Option<PodSpec>,
    spec_applied: Option<jiff::Timestamp>,
    recorded: &[VersionConfig],
) -> Result<(ConfigObserved, bool), ReconcileError> {
    let Some(pod) = pod else {
        return Ok((ConfigObserved::Off, false));
    };
    let made: BTreeSet<(ConfigKind, &str)> = recorded
        .iter()
        .flat_map(|v| &v.copies)
        .map(|c| (c.kind, c.copy.as_str()))
        .collect();
    let mut copies = Vec::new();
    let (mut stale, mut newer) = (false, false);
    for (config_kind, name) in references(&pod) {
        let Some((copy, applied)) = copy_of(ctx, kind, rollout, config_kind, &name).await? else {
            continue;
        };
        stale |= matches!((applied, spec_applied), (Some(a), Some(s)) if a < s);
        // The same second counts: apply times have no finer grain.
        newer |= matches!((applied, spec_applied), (Some(a), Some(s)) if a >= s);
        let copy_name = copy.name_any();
        if !made.contains(&(config_kind, copy_name.as_str())) {
            create(ctx, rollout, copy).await?;
        }
        copies.push(ConfigCopy {
            kind: config_kind,
            name,
            copy: copy_name,
        });
    }
    let observed = if stale {
        ConfigObserved::Stale(copies)
    } else {
        ConfigObserved::Read(copies)
    };
    Ok((observed, newer))
}

/// A copy of object `name` as it is now, and when the sync last applied it (`None` if it does
/// not exist).
async fn copy_of(
    ctx: &Context,
    kind: &str,
    rollout: &RolloutRef,
    config_kind: ConfigKind,
    name: &str,
) -> Result<Option<(Copy, Option<jiff::Timestamp>)>, ReconcileError> {
    let ns = rollout.namespace.as_str();
    let doing = || format!("reading {} {ns}/{name}", config_kind.as_str());
    let meta = |copy: &str| {
        let mut labels = rollout.labels();
        labels.insert(CONFIG_COPY_LABEL.into(), "true".into());
        let mut meta = rollout.meta(copy, kind, labels);
        // Made as the source's account for a Secret, which may not touch the rollout's
        // finalizers: a plain owner reference, which still deletes the copy with the rollout.
        for owner in meta.owner_references.iter_mut().flatten() {
            owner.block_owner_deletion = None;
        }
        meta.annotations = Some(BTreeMap::from([(
            CONFIG_COPY_OF_ANNOTATION.to_string(),
            name.to_string(),
        )]));
        meta
    };
    Ok(match config_kind {
        ConfigKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .doing(doing)?
            .map(|cm| {
                let copy_name = config_map_copy_name(&rollout.name, &cm);
                let applied = applied_at(cm.metadata.managed_fields.as_deref());
                let copy = Copy::ConfigMap(ConfigMap {
                    metadata: meta(&copy_name),
                    data: cm.data,
                    binary_data: cm.binary_data,
                    immutable: Some(true),
                });
                (copy, applied)
            }),
        ConfigKind::Secret => Api::<Secret>::namespaced(secrets_client(ctx, ns)?, ns)
            .get_opt(name)
            .await
            .doing_as_source(doing)?
            .map(|s| {
                let copy_name = secret_copy_name(&rollout.name, &s);
                let applied = applied_at(s.metadata.managed_fields.as_deref());
                let copy = Copy::Secret(Secret {
                    metadata: meta(&copy_name),
                    data: s.data,
                    type_: s.type_,
                    immutable: Some(true),
                    string_data: None,
                });
                (copy, applied)
            }),
    })
}

/// A copy to create.
enum Copy {
    ConfigMap(ConfigMap),
    Secret(Secret),
}

impl Copy {
    fn kind(&self) -> ConfigKind {
        match self {
            Copy::ConfigMap(_) => ConfigKind::ConfigMap,
            Copy::Secret(_) => ConfigKind::Secret,
        }
    }

    fn name_any(&self) -> String {
        match self {
            Copy::ConfigMap(c) => c.name_any(),
            Copy::Secret(s) => s.name_any(),
        }
    }
}

/// Creates `copy`; one that exists already is the same content (its name is its hash).
async fn create(ctx: &Context, rollout: &RolloutRef, copy: Copy) -> Result<(), ReconcileError> {
    let (ns, name, kind) = (rollout.namespace.as_str(), copy.name_any(), copy.kind());
    let doing = || format!("creating config copy {ns}/{name}");
    let as_source = matches!(copy, Copy::Secret(_));
    let result = match copy {
        Copy::ConfigMap(c) => Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
            .create(
                &crate::kube_client::post_as(crate::api::field_managers::CONFIG_COPIES),
                &c,
            )
            .await
            .map(|_| ()),
        Copy::Secret(s) => Api::<Secret>::namespaced(secrets_client(ctx, ns)?, ns)
            .create(
                &crate::kube_client::post_as(crate::api::field_managers::CONFIG_COPIES),
                &s,
            )
            .await
            .map(|_| ()),
    };
    match result {
        // There already: this rollout's copy of the same content, unless someone else made
        // an object of that name, which pods must never mount in its place.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let owners = owners_of(ctx, ns, &name, kind).await?;
            if owners.is_none_or(|o| o.iter().any(|o| o.uid == rollout.uid)) {
                Ok(())
            } else {
                Err(ReconcileError::NotOurs {
                    doing: doing(),
                    why: format!(
                        "{ns}/{name} exists and is not {}'s config copy; rename or delete it",
                        rollout.name
                    ),
                })
            }
        }
        other => {
            if as_source {
                other.doing_as_source(doing)?;
            } else {
                other.doing(doing)?;
            }
            tracing::info!(copy = %format!("{ns}/{name}"), "made a config copy for a version");
            Ok(())
        }
    }
}

/// The owners of object `name` of `kind` (`None` if it is gone).
async fn owners_of(
    ctx: &Context,
    ns: &str,
    name: &str,
    kind: ConfigKind,
) -> Result<Option<Vec<OwnerReference>>, ReconcileError> {
    let doing = || format!("reading {} {ns}/{name}", kind.as_str());
    let meta = match kind {
        ConfigKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
            .get_metadata_opt(name)
            .await
            .doing(doing)?
            .map(|m| m.metadata),
        ConfigKind::Secret => Api::<Secret>::namespaced(secrets_client(ctx, ns)?, ns)
            .get_metadata_opt(name)
            .await
            .doing_as_source(doing)?
            .map(|m| m.metadata),
    };
    Ok(meta.map(|m| m.owner_references.unwrap_or_default()))
}

/// The copies each rollout mounted when its copies were last collected: a settled rollout
/// lists its copies only when that changed (or after a restart), not on every reconcile.
#[derive(Default)]
pub struct Collected(Mutex<HashMap<String, BTreeSet<(ConfigKind, String)>>>);

/// Deletes the copies of `rollout` that no version in `versions` mounts. Called once the
/// rollout is settled, so no pod of a version being replaced still starts from one.
pub(super) async fn collect(
    ctx: &Context,
    rollout: &RolloutRef,
    versions: &[VersionConfig],
) -> Result<(), ReconcileError> {
    let in_use = copies_in_use(versions);
    let key = format!("{}/{}", rollout.namespace, rollout.name);
    if ctx
        .config_collected
        .0
        .lock()
        .is_ok_and(|done| done.get(&key) == Some(&in_use))
    {
        return Ok(());
    }
    let ns = rollout.namespace.as_str();
    let own = ListParams::default().labels(&format!(
        "{ROLLOUT_LABEL}={},{CONFIG_COPY_LABEL}=true",
        rollout.name
    ));
    let mut unused = Vec::new();
    let owned = |m: &kube::core::ObjectMeta| {
        m.owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == rollout.uid)
    };
    let doing = || format!("listing the config copies of {key}");
    for m in Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
        .list_metadata(&own)
        .await
        .doing(doing)?
    {
        unused.push((ConfigKind::ConfigMap, m.name_any(), owned(&m.metadata)));
    }
    for m in Api::<Secret>::namespaced(secrets_client(ctx, ns)?, ns)
        .list_metadata(&own)
        .await
        .doing_as_source(doing)?
    {
        unused.push((ConfigKind::Secret, m.name_any(), owned(&m.metadata)));
    }
    for (kind, name, ours) in unused {
        if !ours || in_use.contains(&(kind, name.clone())) {
            continue;
        }
        let deleted = match kind {
            ConfigKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
            ConfigKind::Secret => Api::<Secret>::namespaced(secrets_client(ctx, ns)?, ns)
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
        };
        match deleted {
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            other if kind == ConfigKind::Secret => {
                other.doing_as_source(|| format!("deleting config copy {ns}/{name}"))?
            }
            other => other.doing(|| format!("deleting config copy {ns}/{name}"))?,
        }
        tracing::info!(copy = %format!("{ns}/{name}"), kind = kind.as_str(), "deleted a config copy no version mounts");
    }
    if let Ok(mut done) = ctx.config_collected.0.lock() {
        done.insert(key, in_use);
    }
    Ok(())
}

/// Rollouts to reconcile because a ConfigMap of this source changed: those with
/// `versionedConfig` whose template names it. Watched by metadata only, by the source's label
/// (copies do not carry it). Secrets are not watched: the agent may not list them (they are
/// read as the source's account), so a Secret changed alone reaches its rollouts at their
/// next reconcile.
pub(super) fn config_wakes<K>(
    client: Client,
    scope: crate::watch::WatchScope,
    store: Store<K>,
    source: &str,
    config_template: fn(&K) -> Option<PodSpec>,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let config = crate::watch::watch_config(&format!("{SOURCE_LABEL}={source}"));
    // Changes only: at start (the first list) every rollout is reconciled anyway, and waking
    // each for each of its namespace's ConfigMaps would cost rollouts x ConfigMaps. A list
    // after a broken watch may hide changes, so those count.
    let mut listed = false;
    let changed = move |event: watcher::Result<watcher::Event<PartialObjectMeta<ConfigMap>>>| {
        let object = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => Some(o),
            Ok(watcher::Event::InitApply(o)) if listed => Some(o),
            Ok(watcher::Event::InitDone) => {
                listed = true;
                None
            }
            _ => None,
        };
        futures::future::ready(object.and_then(|m| Some((m.metadata.namespace?, m.metadata.name?))))
    };
    let namespace = scope.only().map(str::to_string);
    futures::stream::once(allowed_to_watch(client.clone(), "configmaps", namespace))
        .flat_map(move |()| {
            watcher(
                scope.api::<PartialObjectMeta<ConfigMap>>(&client),
                config.clone(),
            )
            .backoff(crate::watch::backoff::watch_backoff())
        })
        .filter_map(changed)
        .flat_map(move |(ns, name)| {
            let woken: Vec<ObjectRef<K>> = store
                .state()
                .iter()
                .filter(|r| r.namespace().as_deref() == Some(ns.as_str()))
                .filter(|r| {
                    config_template(r).is_some_and(|pod| {
                        references(&pod).contains(&(ConfigKind::ConfigMap, name.clone()))
                    })
                })
                .map(|r| ObjectRef::from_obj(r.as_ref()))
                .collect();
            futures::stream::iter(woken)
        })
}

/// Resolves once this agent may list and watch `resource` in every namespace (in `namespace`
/// only, for a namespace-scoped agent). Until then (the rule dropped from its ClusterRole, as
/// docs/config.md allows, or not in effect yet) it asks again later and later, and says so
/// once: a watch refused would log the API server's answer on every retry.
async fn allowed_to_watch(client: Client, resource: &'static str, namespace: Option<String>) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let api = Api::<SelfSubjectAccessReview>::all(client);
    let ask = |verb: &str| SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                resource: Some(resource.into()),
                namespace: namespace.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut delays = backon::BackoffBuilder::build(crate::retry::retry_builder());
    let mut said = false;
    loop {
        let mut allowed = true;
        for verb in ["list", "watch"] {
            let answer = api.create(&PostParams::default(), &ask(verb)).await;
            allowed &= answer.is_ok_and(|r| r.status.is_some_and(|s| s.allowed));
        }
        if allowed {
            if said {
                tracing::info!(
                    resource,
                    "may watch it now: a config change alone wakes its rollouts again"
                );
            }
            return;
        }
        if !said {
            tracing::info!(
                resource,
                scope = namespace.as_deref().unwrap_or("every namespace"),
                "this agent may not list and watch it there: with versionedConfig, a config change alone reaches its rollouts only at their next reconcile (a change of the rollout or its children); see docs/config.md"
            );
            said = true;
        }
        let delay = delays.next().unwrap_or(std::time::Duration::from_secs(300));
        tokio::time::sleep(delay).await;
    }
}

/// Secrets are read, copied and deleted as the source's account in `ns`, never with the
/// agent's own rights.
fn secrets_client(ctx: &Context, ns: &str) -> Result<Client, ReconcileError> {
    Ok(ctx.source_account.client(&ctx.client, ns)?)
}
