//! The source's account, for what a controller does with the source's rights rather than the
//! agent's: the Secret copies of `versionedConfig` are read, made and deleted as the account
//! the source applies Git's objects with in that namespace (`--apply-as`), so the agent's own
//! ClusterRole never reads a Secret.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Client;

use crate::sync::ApplyAs;

/// Clients acting as the source's account, one per account, made on first use.
pub struct SourceAccount {
    apply_as: ApplyAs,
    /// The agent's own configuration, from which impersonating clients are made (`None`: act
    /// as the agent's client, as the engine's tests do).
    config: Option<kube::Config>,
    clients: Mutex<HashMap<String, Client>>,
}

/// Why no client acting as the source could be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot act as the source's account {user}: {why}")]
pub struct ActAsError {
    pub user: String,
    pub why: String,
}

impl SourceAccount {
    pub fn new(apply_as: ApplyAs, config: Option<kube::Config>) -> SourceAccount {
        SourceAccount {
            apply_as,
            config,
            clients: Mutex::default(),
        }
    }

    /// The agent's own identity (no `--apply-as`, or the engine's tests).
    pub fn agent() -> SourceAccount {
        SourceAccount::new(ApplyAs::Client, None)
    }

    /// A client acting as the source in `namespace`, or `own` when the source applies as the
    /// agent.
    pub fn client(&self, own: &Client, namespace: &str) -> Result<Client, ActAsError> {
        let Some(user) = self.apply_as.user_for(namespace) else {
            return Ok(own.clone());
        };
        let failed = |why: String| ActAsError {
            user: user.clone(),
            why,
        };
        let mut clients = self
            .clients
            .lock()
            .map_err(|_| failed("the client cache is poisoned".into()))?;
        if let Some(client) = clients.get(&user) {
            return Ok(client.clone());
        }
        let mut config = self
            .config
            .clone()
            .ok_or_else(|| failed("no configuration to impersonate it with".into()))?;
        config.auth_info.impersonate = Some(user.clone());
        config.auth_info.impersonate_groups = None;
        let client = crate::kube_client::from_config(config).map_err(|e| failed(e.to_string()))?;
        clients.insert(user, client.clone());
        Ok(client)
    }
}
