//! Whom a sync writes as (`--apply-as`: the agent, or a service account it impersonates per
//! namespace) and how it reaches each kind's API.

use kube::api::DynamicObject;
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope, pinned_kind};
use kube::{Api, Client};
use serde_json::Value;

use crate::api::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, SOURCE_LABEL};

use super::*;

/// After a 403 reading an object from Git: the fix is never to widen the agent's own rights.
pub(super) const READ_FORBIDDEN_HINT: &str = "; this identity may not read it. Do not widen linnet's own \
     ClusterRole for an object from Git: the agent reads and writes such objects as the \
     source's account (--apply-as), which a cluster admin grants per namespace \
     (docs/security.md, Permissions)";

/// Whose rights a sync applies and prunes Git's objects with: the source's, not the agent's.
#[derive(Clone, Debug, PartialEq)]
pub enum ApplyAs {
    /// The client's own identity (the engine's tests, with an admin client).
    Client,
    /// ServiceAccount `name` in each object's namespace; cluster-scoped objects are applied as
    /// the one in `home` (the agent's namespace).
    AccountPerNamespace { name: String, home: String },
    /// One ServiceAccount for every object.
    Account { namespace: String, name: String },
}

impl ApplyAs {
    /// The Kubernetes user name of the account that writes objects in `namespace` (empty for
    /// cluster-scoped objects), or `None` for the client's own identity.
    pub fn user_for(&self, namespace: &str) -> Option<String> {
        match self {
            ApplyAs::Client => None,
            ApplyAs::AccountPerNamespace { name, home } => Some(format!(
                "system:serviceaccount:{}:{name}",
                if namespace.is_empty() {
                    home
                } else {
                    namespace
                }
            )),
            ApplyAs::Account { namespace, name } => {
                Some(format!("system:serviceaccount:{namespace}:{name}"))
            }
        }
    }
}

pub(super) fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// The namespace an object of this kind lives in: none when the kind is cluster-scoped,
/// whatever the key says.
pub(super) fn scoped<'a>(caps: &ApiCapabilities, namespace: &'a str) -> &'a str {
    if caps.scope == Scope::Cluster {
        ""
    } else {
        namespace
    }
}

/// An `Api` for `client` in `namespace`, or across namespaces (and for cluster-scoped kinds)
/// when it is empty.
pub(super) fn api_as(client: Client, ar: &ApiResource, namespace: &str) -> Api<DynamicObject> {
    if namespace.is_empty() {
        Api::all_with(client, ar)
    } else {
        Api::namespaced_with(client, namespace, ar)
    }
}

/// The live object as the diff needs it: without `managedFields` and `status`, which Git never
/// sets and which made up most of a full sync's memory at 1,000 rollouts.
pub(super) fn to_value(mut object: DynamicObject, ar: &ApiResource) -> Value {
    object.metadata.managed_fields = None;
    if let Value::Object(data) = &mut object.data {
        data.remove("status");
    }
    if object.types.is_none() {
        object.types = Some(kube::core::TypeMeta {
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
        });
    }
    serde_json::to_value(object).unwrap_or(Value::Null)
}

impl Syncer {
    /// The client that writes objects in `namespace` (empty: cluster-scoped) as the source.
    pub(super) fn writer(&self, namespace: &str) -> Result<Client, ObjectError> {
        let Some(user) = self.apply_as.user_for(namespace) else {
            return Ok(self.client.clone());
        };
        let mut writers = self
            .writers
            .lock()
            .map_err(|_| ObjectError::ActAs("the writer cache is poisoned".into()))?;
        if let Some(client) = writers.get(&user) {
            return Ok(client.clone());
        }
        let mut config = self
            .kube_config
            .clone()
            .ok_or_else(|| ObjectError::ActAs(format!("no configuration to act as {user} with")))?;
        config.auth_info.impersonate = Some(user.clone());
        config.auth_info.impersonate_groups = None;
        let client = crate::kube_client::from_config(config).map_err(|e| {
            ObjectError::ActAs(format!("cannot make a client acting as {user}: {e}"))
        })?;
        writers.insert(user, client.clone());
        Ok(client)
    }

    /// The `Api` that writes `key` as the source.
    pub(super) fn writer_api(
        &self,
        ar: &ApiResource,
        caps: &ApiCapabilities,
        namespace: &str,
    ) -> Result<Api<DynamicObject>, ObjectError> {
        let namespace = scoped(caps, namespace);
        Ok(api_as(self.writer(namespace)?, ar, namespace))
    }

    /// What a 403 on a write means when the source's account made it.
    pub(super) fn forbidden_hint(&self, verb: &str, ar: &ApiResource, namespace: &str) -> String {
        match self.apply_as.user_for(namespace) {
            Some(user) => format!(
                "; the source applies as {user}, which may not {verb} {}{}: a cluster admin \
                 grants it (docs/security.md, Permissions), e.g. a RoleBinding to ClusterRole \
                 linnet-source from deploy/source-rbac.yaml",
                ar.plural,
                if namespace.is_empty() {
                    String::new()
                } else {
                    format!(" in namespace {namespace}")
                }
            ),
            None => String::new(),
        }
    }

    pub(super) async fn resource(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, ApiCapabilities), ObjectError> {
        let cache_key = (api_version.to_string(), kind.to_string());
        if let Some(found) = self.discovery.lock().await.get(&cache_key) {
            return Ok(found.clone());
        }
        let (group, version) = split_api_version(api_version);
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let found = pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| match &e {
                kube::Error::Api(s) if s.code == 404 => ObjectError::NotServed {
                    kind: kind.to_string(),
                    api_version: api_version.to_string(),
                    linnet: group == crate::api::GROUP,
                },
                _ => ObjectError::Lookup {
                    kind: kind.to_string(),
                    api_version: api_version.to_string(),
                    source: e,
                },
            })?;
        self.discovery.lock().await.insert(cache_key, found.clone());
        Ok(found)
    }

    /// The `Api` that reads objects of `ar` in `namespace` as the agent.
    pub(super) fn api(
        &self,
        ar: &ApiResource,
        caps: &ApiCapabilities,
        namespace: &str,
    ) -> Api<DynamicObject> {
        api_as(self.client.clone(), ar, scoped(caps, namespace))
    }

    pub(super) fn selector(&self) -> String {
        format!(
            "{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{SOURCE_LABEL}={}",
            self.source
        )
    }
}
