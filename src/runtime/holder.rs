//! One live agent per source name. The source name is in the label on everything a source
//! applies, cluster-wide: two agents with one name (two repositories, both with the default)
//! took over each other's objects, posted commit statuses on each other's commits, and, before
//! the inventory, pruned each other's objects (issue 45). At start, an agent whose source name
//! has a LinnetSource in another namespace, with a Lease there still renewed (or no Lease to
//! tell), refuses to start and names that agent.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::api::LinnetSource;
use crate::error::kube_message;
use crate::{Error, Result};

/// A LinnetSource of the same name seen in another namespace, and its agent's Lease.
#[derive(Clone, Debug, PartialEq)]
pub struct OtherSource {
    pub namespace: String,
    pub url: String,
    pub branch: String,
    /// The Lease `linnet-<source>` there: who holds it and when it was renewed.
    pub lease: Option<(String, Option<Timestamp>)>,
}

/// How long a Lease may go unrenewed before its agent counts as gone.
pub const GONE_AFTER: Duration = Duration::from_secs(300);

/// Why this agent may not take `source`, if another live agent has it.
pub fn holder_refusal(source: &str, others: &[OtherSource], now: Timestamp) -> Option<String> {
    let live = others.iter().find(|o| match &o.lease {
        Some((_, Some(renewed))) => {
            now.duration_since(*renewed).unsigned_abs() < GONE_AFTER || *renewed > now
        }
        // Without a renewed Lease (leader election off) nothing tells it is gone.
        _ => true,
    })?;
    let who = match &live.lease {
        Some((holder, _)) if !holder.is_empty() => format!(" (Lease held by {holder})"),
        _ => String::new(),
    };
    Some(format!(
        "source name {source:?} is already used by the agent in namespace {ns}{who}, \
         following {url} branch {branch}: two agents with one source name take over each \
         other's objects and post on each other's commits. Give this agent another \
         --source-name; if that agent is gone, delete its LinnetSource \
         (kubectl delete linnetsource -n {ns} {source})",
        ns = live.namespace,
        url = if live.url.is_empty() { "?" } else { &live.url },
        branch = if live.branch.is_empty() {
            "?"
        } else {
            &live.branch
        },
    ))
}

/// Looks for another agent with this source name; an error if one is live. A lookup that
/// fails is a warning, not a refusal: the check is a guard, the API server may be busy.
pub async fn check_source_name(
    client: &Client,
    source: &str,
    own_namespace: &str,
    lease_name: &str,
) -> Result<()> {
    let all: Api<LinnetSource> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("metadata.name={source}"));
    let found = match all.list(&params).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(error = %kube_message(&e), "cannot check whether another agent uses this source name (linnet's ClusterRole lists linnetsources)");
            return Ok(());
        }
    };
    let mut others = Vec::new();
    for s in found {
        let Some(namespace) = s.metadata.namespace.clone() else {
            continue;
        };
        if namespace == own_namespace {
            continue;
        }
        let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
        let lease = match leases.get_opt(lease_name).await {
            Ok(l) => l.and_then(|l| l.spec).map(|spec| {
                (
                    spec.holder_identity.unwrap_or_default(),
                    spec.renew_time.map(|t| t.0),
                )
            }),
            Err(e) => {
                tracing::warn!(namespace, error = %kube_message(&e), "cannot read the other agent's Lease");
                None
            }
        };
        others.push(OtherSource {
            namespace,
            url: s.spec.url.clone(),
            branch: s.spec.branch.clone(),
            lease,
        });
    }
    match holder_refusal(source, &others, Timestamp::now()) {
        Some(why) => Err(Error::Usage(why)),
        None => {
            for o in &others {
                tracing::warn!(
                    namespace = o.namespace,
                    "a LinnetSource of this source name is in another namespace, but its agent's Lease has not been renewed for 5 minutes: taking the name"
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other(lease: Option<(String, Option<Timestamp>)>) -> OtherSource {
        OtherSource {
            namespace: "team-a".into(),
            url: "https://git.example/a.git".into(),
            branch: "main".into(),
            lease,
        }
    }

    #[test]
    fn a_second_agent_with_a_live_holders_source_name_is_refused_naming_it() {
        // Issue 45: two agents with the default source name deleted each other's objects.
        let now = Timestamp::now();
        let live = other(Some(("linnet-7d9".into(), Some(now))));
        let why = holder_refusal("default", &[live], now).unwrap();
        assert!(
            why.contains("namespace team-a")
                && why.contains("linnet-7d9")
                && why.contains("https://git.example/a.git")
                && why.contains("--source-name"),
            "{why}"
        );
        // Leader election off: no Lease tells it is gone.
        assert!(holder_refusal("default", &[other(None)], now).is_some());
    }

    #[test]
    fn a_holder_whose_lease_lapsed_long_ago_is_gone() {
        let now = Timestamp::now();
        let old = now - jiff::SignedDuration::from_secs(600);
        assert!(holder_refusal("default", &[other(Some(("x".into(), Some(old))))], now).is_none());
        assert!(holder_refusal("default", &[], now).is_none());
    }
}
