//! `linnet validate`'s one look at a cluster: whether the namespaces the specs deploy to
//! exist (or are created by the specs themselves). A spec in a namespace that does not exist
//! passed validation, and the agent then reported its source's 403 (issue 47).

use super::*;

/// Whether `validate` asks a cluster about namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NamespaceCheck {
    /// When a kubeconfig (or the pod's account) names a cluster that answers within 3 s;
    /// otherwise skipped, with a note on stderr.
    Auto,
    /// Always; a cluster that cannot be asked is an error.
    Always,
    /// Never: validate stays offline.
    Never,
}

/// How long `auto` waits for the cluster before it validates offline.
const AUTO_TIMEOUT: Duration = Duration::from_secs(3);

/// Adds an error at each object whose namespace does not exist in the cluster `cluster`
/// names and is not created by `set`. `Ok(None)` when checked, `Ok(Some(why))` when `auto`
/// could not check, an error when `always` could not.
pub(super) fn check_namespaces(
    set: &mut crate::specs::SpecSet,
    mode: NamespaceCheck,
    cluster: &ClusterArgs,
) -> Result<Option<String>> {
    if mode == NamespaceCheck::Never {
        return Ok(None);
    }
    let created: std::collections::BTreeSet<String> = set
        .objects
        .keys()
        .filter(|k| k.kind == "Namespace" && k.api_version == "v1")
        .map(|k| k.name.clone())
        .collect();
    let used: std::collections::BTreeSet<String> = set
        .objects
        .keys()
        .map(|k| k.namespace.clone())
        .filter(|ns| !ns.is_empty() && !created.contains(ns))
        .collect();
    if used.is_empty() {
        return Ok(None);
    }
    let target = cluster.target();
    let ask = async {
        let client = match crate::kube_client::connect_to(&target).await {
            Ok((_, client)) => client,
            // No kubeconfig at all (a CI runner): offline, as before, without a word.
            Err(Error::KubeConfig(_)) if mode == NamespaceCheck::Auto => {
                return Err(String::new());
            }
            Err(e) => return Err(e.to_string()),
        };
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let mut missing = std::collections::BTreeSet::new();
        for ns in used {
            match namespaces.get_opt(&ns).await {
                Ok(None) => {
                    missing.insert(ns);
                }
                Ok(Some(_)) => {}
                Err(e) => return Err(crate::error::kube_message(&e)),
            }
        }
        Ok(missing)
    };
    // `auto` bounds the whole look, connection and reads, so an offline run is never slowed.
    let missing = runtime()?.block_on(async {
        match mode {
            NamespaceCheck::Auto => tokio::time::timeout(AUTO_TIMEOUT, ask)
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {}s", AUTO_TIMEOUT.as_secs()))),
            _ => ask.await,
        }
    });
    let missing = match (missing, mode) {
        (Ok(missing), _) => missing,
        (Err(why), NamespaceCheck::Auto) => return Ok(Some(why).filter(|w| !w.is_empty())),
        (Err(why), _) => {
            return Err(Error::Usage(format!(
                "cannot check the specs' namespaces in the cluster: {why} (--check-namespaces \
                 never validates offline)"
            )));
        }
    };
    for object in set.objects.values() {
        if missing.contains(&object.key.namespace) {
            set.errors.push(crate::specs::SpecError {
                location: object.location.clone(),
                message: crate::sync::apply::missing_namespace(&object.key.namespace),
            });
        }
    }
    set.errors.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(None)
}
