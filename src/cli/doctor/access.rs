//! What `linnet doctor` asks the API server about itself: its version and clock, and whether
//! the source's account may write what the repository holds and the agent may act as it
//! (SubjectAccessReviews, as a cluster admin can ask them).

use std::collections::BTreeSet;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::{DoctorArgs, Finding, gvk_of, scoped};
use crate::error::kube_message;

/// What a source's account must be allowed for each object: to read it (drift) and apply it.
const SOURCE_VERBS: [&str; 2] = ["get", "patch"];

/// The API server's version, and its clock minus this machine's (from its `Date` header,
/// against the middle of the request; whole seconds).
pub(super) async fn version_and_clock(
    client: &kube::Client,
) -> Result<(String, Option<jiff::SignedDuration>), kube::Error> {
    let request = http::Request::get("/version")
        .body(kube::client::Body::from(Vec::new()))
        .map_err(kube::Error::HttpError)?;
    let before = jiff::Timestamp::now();
    let response = client.send(request).await?;
    let after = jiff::Timestamp::now();
    let theirs = response
        .headers()
        .get(http::header::DATE)
        .and_then(|d| d.to_str().ok())
        .and_then(super::judge::http_date);
    let middle = before.checked_add(after.duration_since(before) / 2).ok();
    let skew = theirs.zip(middle).map(|(t, m)| t.duration_since(m));
    let info = client.apiserver_version().await?;
    Ok((format!("Kubernetes {}", info.git_version), skew))
}

/// A SubjectAccessReview for `user`: may it `verb` `resource` (of `group`, named `name`) in
/// `namespace` (empty: cluster-wide)?
async fn may(
    api: &Api<SubjectAccessReview>,
    user: &str,
    verb: &str,
    (group, resource, name): (&str, &str, Option<&str>),
    namespace: &str,
) -> Result<bool, kube::Error> {
    // A ServiceAccount's user is in its groups too, which bindings may name.
    let groups = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _)| {
            vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".to_string(),
            ]
        });
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups,
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                name: name.map(str::to_string),
                namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Whether the source's account may read and apply every kind the repository holds where it
/// holds it, and the agent may act as that account.
pub(super) async fn grants(
    client: &kube::Client,
    set: &crate::specs::SpecSet,
    args: &DoctorArgs,
    out: &mut impl FnMut(Finding),
) {
    let discovery = match kube::Discovery::new(client.clone()).run().await {
        Ok(d) => d,
        Err(e) => {
            return out(Finding::warn(
                "grant",
                format!("cannot list the cluster's kinds: {}", kube_message(&e)),
            ));
        }
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let apply_as = args.sync.apply_as(Some(args.agent_namespace()));
    let wanted: BTreeSet<(&str, &str, &str)> = set
        .objects
        .keys()
        .map(|k| {
            (
                k.namespace.as_str(),
                k.api_version.as_str(),
                k.kind.as_str(),
            )
        })
        .collect();
    let (mut checked, mut denied) = (0, 0);
    let mut users = BTreeSet::new();
    for (namespace, api_version, kind) in wanted {
        let Some((resource, caps)) = discovery.resolve_gvk(&gvk_of(api_version, kind)) else {
            out(Finding::fail(
                "kind",
                format!(
                    "{api_version} {kind} is not served by this cluster: install its CRD (or \
                     its controller) before the source syncs it"
                ),
            ));
            continue;
        };
        let namespace = scoped(&caps.scope, namespace);
        let Some(user) = apply_as.user_for(&namespace) else {
            continue;
        };
        let what = (resource.group.as_str(), resource.plural.as_str(), None);
        let refused = match refused_verbs(&api, &user, what, &namespace).await {
            Ok(refused) => refused,
            Err(e) => {
                return out(Finding::warn(
                    "grant",
                    format!(
                        "cannot ask whether the source may write (SubjectAccessReview: {}); run \
                         doctor as a cluster admin to check grants",
                        kube_message(&e)
                    ),
                ));
            }
        };
        checked += 1;
        users.insert(user.clone());
        if !refused.is_empty() {
            denied += 1;
            out(refusal(&user, &refused, &resource.plural, &namespace));
        }
    }
    if checked > 0 && denied == 0 {
        out(Finding::ok(
            "grant",
            format!(
                "the source's account may read and apply all {checked} kind(s) where the repository puts them"
            ),
        ));
    }
    impersonation(&api, args, &users, out).await;
}

/// Which of [`SOURCE_VERBS`] `user` may not use on `what` in `namespace`.
async fn refused_verbs(
    api: &Api<SubjectAccessReview>,
    user: &str,
    what: (&str, &str, Option<&str>),
    namespace: &str,
) -> Result<Vec<&'static str>, kube::Error> {
    let mut refused = Vec::new();
    for verb in SOURCE_VERBS {
        if !may(api, user, verb, what, namespace).await? {
            refused.push(verb);
        }
    }
    Ok(refused)
}

/// What the source's account lacks, and the grant that gives it.
fn refusal(user: &str, refused: &[&str], plural: &str, namespace: &str) -> Finding {
    let place = match namespace {
        "" => "the cluster".to_string(),
        ns => format!("namespace {ns}"),
    };
    Finding::fail(
        "grant",
        format!(
            "{user} may not {} {plural} in {place}: a cluster admin binds ClusterRole \
             linnet-source (deploy/source-rbac.yaml) to it there, or grants the kind \
             (docs/security.md, Permissions)",
            refused.join(", ")
        ),
    )
}

/// Whether the agent's account may act as each source account it needs.
async fn impersonation(
    api: &Api<SubjectAccessReview>,
    args: &DoctorArgs,
    users: &BTreeSet<String>,
    out: &mut impl FnMut(Finding),
) {
    let agent = format!(
        "system:serviceaccount:{}:{}",
        args.agent_namespace(),
        args.agent_account
    );
    for user in users {
        let Some((namespace, name)) = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        let what = ("", "serviceaccounts", Some(name));
        match may(api, &agent, "impersonate", what, namespace).await {
            Ok(true) => out(Finding::ok(
                "impersonation",
                format!("the agent may act as {user}"),
            )),
            Ok(false) => out(Finding::fail(
                "impersonation",
                format!(
                    "the agent ({agent}) may not act as {user}: ClusterRole linnet \
                     (deploy/rbac.yaml) lets it impersonate ServiceAccounts named linnet-default; \
                     for another --source-name or --apply-as add the name to its resourceNames"
                ),
            )),
            Err(e) => {
                return out(Finding::warn(
                    "impersonation",
                    format!("cannot ask: {}", kube_message(&e)),
                ));
            }
        }
    }
}
