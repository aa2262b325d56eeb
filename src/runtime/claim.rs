//! The source claim in the cluster: a Lease `linnet-source-<source>` in the agent's own
//! namespace, labelled with the source name so that every agent lists every claim on its
//! name, and held by the installation ([`Installation`]) for as long as it acts. Taken
//! before the agent syncs or reconciles anything, renewed by a supervised task, and released
//! at shutdown by an agent without leader election (whose next pod is another holder). What
//! the claims seen allow is decided in [`super::holder`].

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::holder::{self, Installation, SeenClaim};
use crate::error::kube_message;
use crate::{Error, Result};

/// The label every claim carries, its value the source name.
pub const CLAIM_LABEL: &str = "rollouts.linnet.dev/source-claim";
const URL_ANNOTATION: &str = "rollouts.linnet.dev/url";
const BRANCH_ANNOTATION: &str = "rollouts.linnet.dev/branch";
/// Writes of the claim that lost a race (another replica's renewal) before giving up.
const WRITE_ATTEMPTS: usize = 5;
/// After a 403 on a claim: the permission, and where it is granted.
const LEASES_HINT: &str = "; linnet's ClusterRole lists leases in every namespace, and creates \
     and patches them (deploy/rbac.yaml)";

/// Why a held claim is not this agent's any more.
#[derive(Debug, thiserror::Error)]
enum ClaimLost {
    #[error("the source claim was deleted")]
    Deleted,
    #[error("the source claim is held by {0:?} now")]
    TakenBy(String),
}

/// This agent's claim on its source, once taken.
#[derive(Clone)]
pub struct SourceClaim {
    api: Api<Lease>,
    name: String,
    me: Installation,
    duration: Duration,
}

/// Where a claim says its source reads from, for a refusal's message.
pub struct Origin {
    pub url: String,
    pub branch: String,
}

fn seen(lease: &Lease) -> Option<SeenClaim> {
    let spec = lease.spec.as_ref()?;
    let annotation = |key: &str| {
        lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
            .unwrap_or_default()
    };
    Some(SeenClaim {
        namespace: lease.metadata.namespace.clone()?,
        holder: spec.holder_identity.clone().unwrap_or_default(),
        acquired: spec.acquire_time.as_ref().map(|t| t.0),
        renewed: spec.renew_time.as_ref().map(|t| t.0),
        duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64),
        url: annotation(URL_ANNOTATION),
        branch: annotation(BRANCH_ANNOTATION),
    })
}

async fn list_claims(client: &Client, source: &str, me: &Installation) -> Result<Vec<SeenClaim>> {
    let all: Api<Lease> = if me.own_namespace_only {
        Api::namespaced(client.clone(), &me.namespace)
    } else {
        Api::all(client.clone())
    };
    let params = ListParams::default().labels(&format!("{CLAIM_LABEL}={source}"));
    let list = all.list(&params).await.map_err(|e| Error::ClusterRequest {
        doing: format!("list the claims on source name {source:?} (Leases labelled {CLAIM_LABEL})"),
        source: e,
        forbidden_hint: LEASES_HINT,
    })?;
    Ok(list.items.iter().filter_map(seen).collect())
}

/// Before the agent acts (a standby too): refuses if another installation holds a live claim
/// on `source`. One in this namespace (the pod a rolling update replaces, leader election
/// off) is waited for until it lapses, once; one in another namespace is refused at once.
pub async fn check(client: &Client, source: &str, me: &Installation) -> Result<()> {
    let claims = list_claims(client, source, me).await?;
    let now = Timestamp::now();
    let Some(other) = holder::live_other(me, &claims, now) else {
        return Ok(());
    };
    if other.namespace != me.namespace {
        return Err(Error::Usage(holder::refusal(source, other)));
    }
    let wait = other
        .lapses_at()
        .map(|at| at.duration_since(now).unsigned_abs())
        .unwrap_or_default()
        .min(Duration::from_secs(300))
        + Duration::from_secs(1);
    tracing::info!(
        holder = other.holder,
        wait = ?wait,
        "another agent of this source in this namespace holds its claim; waiting once for it to be released or to lapse"
    );
    tokio::time::sleep(wait).await;
    let claims = list_claims(client, source, me).await?;
    match holder::live_other(me, &claims, Timestamp::now()) {
        Some(other) => Err(Error::Usage(holder::refusal(source, other))),
        None => Ok(()),
    }
}

/// Takes the claim on `source` for `me`, then looks again: of two agents that wrote their
/// claims at the same moment in two namespaces, the later one releases its claim and stops.
pub async fn take(
    client: &Client,
    source: &str,
    me: &Installation,
    duration: Duration,
    origin: &Origin,
) -> Result<SourceClaim> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &me.namespace);
    let claim = SourceClaim {
        api: api.clone(),
        name: holder::claim_name(source),
        me: me.clone(),
        duration,
    };
    let settle = holder::settle_time(duration);
    let mut stamped_late = false;
    for _ in 0..WRITE_ATTEMPTS {
        let claims = list_claims(client, source, me).await?;
        let now = Timestamp::now();
        if let Some(other) = holder::live_other(me, &claims, now) {
            return Err(Error::Usage(holder::refusal(source, other)));
        }
        let current = api
            .get_opt(&claim.name)
            .await
            .map_err(|e| Error::ClusterRequest {
                doing: format!("read the source claim {}/{}", me.namespace, claim.name),
                source: e,
                forbidden_hint: LEASES_HINT,
            })?;
        let mine_before = current
            .as_ref()
            .and_then(seen)
            .filter(|c| c.holder == me.identity && c.is_live(now));
        // A replica of a running installation keeps its acquisition time: it came first. A
        // claim this call wrote too late is not that: it is stamped again.
        let acquired = match mine_before {
            Some(c) if !stamped_late => c.acquired.unwrap_or(now),
            _ => now,
        };
        let written = claim
            .write(current.as_ref(), source, origin, acquired, now)
            .await?;
        if !written {
            continue;
        }
        if !holder::written_in_time(now, Timestamp::now(), settle) {
            tracing::info!(
                claim = %format!("{}/{}", me.namespace, claim.name),
                "the source claim's write took longer than {settle:?}; stamping it again"
            );
            stamped_late = true;
            continue;
        }
        // Every claim stamped before this one is in the cluster by now.
        let since = Timestamp::now().duration_since(now).unsigned_abs();
        tokio::time::sleep(settle.saturating_sub(since)).await;
        let claims = list_claims(client, source, me).await?;
        if let Some(first) = holder::came_first(me, acquired, &claims, Timestamp::now()) {
            let why = holder::refusal(source, first);
            claim.release().await;
            return Err(Error::Usage(why));
        }
        tracing::info!(
            claim = %format!("{}/{}", me.namespace, claim.name),
            holder = me.identity,
            "holding the claim on this source name; no other agent may apply or prune for it"
        );
        return Ok(claim);
    }
    Err(Error::ClaimContended {
        claim: format!("{}/{}", me.namespace, claim.name),
    })
}

impl SourceClaim {
    /// Writes the claim over `current` (as read), or creates it: `false` if another write
    /// came first (the caller reads again).
    async fn write(
        &self,
        current: Option<&Lease>,
        source: &str,
        origin: &Origin,
        acquired: Timestamp,
        now: Timestamp,
    ) -> Result<bool> {
        let Some(lease) = current else {
            let lease = self.lease_object(source, origin, acquired, now, 0);
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(self.write_error(e)),
            };
        };
        let spec = lease.spec.as_ref();
        let transitions = spec.and_then(|s| s.lease_transitions).unwrap_or(0);
        let changed_hands =
            spec.and_then(|s| s.holder_identity.as_deref()) != Some(self.me.identity.as_str());
        let mut object = self.lease_object(
            source,
            origin,
            acquired,
            now,
            transitions + i32::from(changed_hands),
        );
        object.metadata.resource_version = lease.metadata.resource_version.clone();
        self.patch(&object).await
    }

    fn lease_object(
        &self,
        source: &str,
        origin: &Origin,
        acquired: Timestamp,
        now: Timestamp,
        transitions: i32,
    ) -> Lease {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.me.namespace.clone()),
                labels: Some(
                    [
                        (CLAIM_LABEL.to_string(), source.to_string()),
                        ("app.kubernetes.io/managed-by".into(), "linnet".into()),
                    ]
                    .into(),
                ),
                annotations: Some(
                    [
                        (URL_ANNOTATION.to_string(), origin.url.clone()),
                        (BRANCH_ANNOTATION.to_string(), origin.branch.clone()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.me.identity.clone()),
                lease_duration_seconds: Some(self.duration.as_secs().min(i32::MAX as u64) as i32),
                acquire_time: Some(MicroTime(acquired)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(transitions),
                ..Default::default()
            }),
        }
    }

    /// A merge patch carrying the resourceVersion read: `false` if another write came first.
    async fn patch(&self, object: &Lease) -> Result<bool> {
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(object))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(self.write_error(e)),
        }
    }

    fn write_error(&self, e: kube::Error) -> Error {
        Error::ClusterRequest {
            doing: format!("write the source claim {}/{}", self.me.namespace, self.name),
            source: e,
            forbidden_hint: LEASES_HINT,
        }
    }

    /// Renews the claim every third of its duration until the agent stops. Ends (a fault the
    /// supervisor stops the agent for) when another holder has it. A claim that could not be
    /// renewed for a while (the API server away, etcd frozen) is only said: the renewal that
    /// gets through finds out whether another agent took it meanwhile.
    pub async fn keep(self) {
        let heartbeat = crate::liveness::process().register("source claim");
        let mut tick = tokio::time::interval((self.duration / 3).max(Duration::from_millis(500)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewed = tokio::time::Instant::now();
        let mut lapsed = false;
        let mut written = None;
        loop {
            tick.tick().await;
            heartbeat.beat();
            match self.renew(&mut written).await {
                Ok(true) => {
                    if std::mem::take(&mut lapsed) {
                        tracing::info!(
                            claim = self.name,
                            "the source claim is renewed again, still this agent's"
                        );
                    }
                    renewed = tokio::time::Instant::now();
                }
                Ok(false) => {}
                Err(why) => {
                    tracing::error!(
                        claim = self.name,
                        "{why}; stopping so that only its holder acts"
                    );
                    return;
                }
            }
            if !lapsed && renewed.elapsed() > self.duration {
                lapsed = true;
                tracing::warn!(
                    claim = self.name,
                    "the source claim was not renewed for its whole duration; another agent of \
                     this source could take it now (this one stops if it does)"
                );
            }
        }
    }

    /// `Ok(false)`: not renewed this time (a race with another replica, a failed call).
    /// `written` is the resourceVersion of this agent's last renewal: while nobody else
    /// writes the claim, a renewal is one patch; after any other write (the patch is refused)
    /// the next one reads the claim again, and finds out whether another agent holds it.
    async fn renew(&self, written: &mut Option<String>) -> std::result::Result<bool, ClaimLost> {
        let version = match written.take() {
            Some(version) => version,
            None => {
                let lease = match self.api.get_opt(&self.name).await {
                    Ok(Some(lease)) => lease,
                    Ok(None) => return Err(ClaimLost::Deleted),
                    Err(e) => {
                        tracing::warn!(claim = self.name, error = %kube_message(&e), "cannot renew the source claim");
                        return Ok(false);
                    }
                };
                let holder = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.clone())
                    .unwrap_or_default();
                if holder != self.me.identity {
                    return Err(ClaimLost::TakenBy(holder));
                }
                lease.metadata.resource_version.unwrap_or_default()
            }
        };
        let body = json!({
            "metadata": {"resourceVersion": version},
            "spec": {"renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now())},
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(lease) => {
                *written = lease.metadata.resource_version;
                Ok(true)
            }
            Err(e) => {
                tracing::debug!(claim = self.name, error = %kube_message(&e), "source claim renewal not taken; read again next time");
                Ok(false)
            }
        }
    }

    /// Gives the claim up, so that the next holder (the pod a rolling update starts) need not
    /// wait for it to lapse. Best effort: it lapses by itself.
    pub async fn release(&self) {
        let release = async {
            let lease = self.api.get_opt(&self.name).await.ok()??;
            let holder = lease.spec.as_ref()?.holder_identity.clone();
            if holder.as_deref() != Some(self.me.identity.as_str()) {
                return Some(());
            }
            let body = json!({
                "metadata": {"resourceVersion": lease.metadata.resource_version},
                "spec": {"holderIdentity": null},
            });
            self.api
                .patch(&self.name, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .ok()
                .map(|_| ())
        };
        match tokio::time::timeout(Duration::from_secs(3), release).await {
            Ok(Some(())) => tracing::info!(claim = self.name, "released the source claim"),
            _ => tracing::warn!(
                claim = self.name,
                "could not release the source claim; it lapses by itself"
            ),
        }
    }
}
