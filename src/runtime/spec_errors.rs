//! Commit statuses for spec errors: a rollout already in the cluster whose file now has an
//! error gets an error status on the new revision, read from the shared stores.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::watch::rollouts::RolloutStores;
use crate::writeback::commit_status::Wanted;

/// Error statuses on `revision` for the rollouts (already in the cluster, from an earlier
/// revision) whose files now have errors, read from the shared stores.
pub(super) async fn spec_error_statuses(
    rollouts: RolloutStores,
    cfg: crate::writeback::commit_status::CommitStatusConfig,
    revision: String,
    errors: Vec<crate::specs::SpecError>,
    tx: mpsc::Sender<Wanted>,
) {
    use crate::api::SOURCE_PATH_ANNOTATION;
    use crate::writeback::commit_status::wanted_for_spec_error;
    // The first sync may come before the stores' first list; each kind is read once it is
    // listed, and one that never lists (its CRD missing, its RBAC refused) does not hold up
    // the other.
    let wait = Duration::from_secs(30);
    let (sts_ready, deploy_ready) = tokio::join!(
        tokio::time::timeout(wait, rollouts.statefulsets.ready().wait()),
        tokio::time::timeout(wait, rollouts.deployments.ready().wait()),
    );
    let mut metas: Vec<kube::api::ObjectMeta> = Vec::new();
    if matches!(sts_ready, Ok(Ok(()))) {
        metas.extend(
            rollouts
                .statefulsets
                .store()
                .state()
                .iter()
                .map(|o| crate::api::packed_meta::metadata(o.as_ref()).into_owned()),
        );
    }
    if matches!(deploy_ready, Ok(Ok(()))) {
        metas.extend(
            rollouts
                .deployments
                .store()
                .state()
                .iter()
                .map(|o| crate::api::packed_meta::metadata(o.as_ref()).into_owned()),
        );
    }
    if !(matches!(sts_ready, Ok(Ok(()))) && matches!(deploy_ready, Ok(Ok(())))) {
        tracing::warn!(
            "a rollout kind is not listed yet; no error statuses for its rollouts this time (the spec errors are logged above)"
        );
    }
    for e in &errors {
        for m in &metas {
            let file = m
                .annotations
                .as_ref()
                .and_then(|a| a.get(SOURCE_PATH_ANNOTATION));
            if file.map(String::as_str) != Some(&*e.location.file) {
                continue;
            }
            let (Some(ns), Some(name)) = (&m.namespace, &m.name) else {
                continue;
            };
            if let Some(w) = wanted_for_spec_error(&cfg, ns, name, &revision, &e.to_string()) {
                let _ = tx.send(w).await;
            }
        }
    }
}
