//! What the API server says of a person: who a token is (TokenReview) and whether they may
//! do a verb on a rollout (SubjectAccessReview). Each question has 5 s; linnet's identity must
//! create both kinds of review (deploy/rbac.yaml).

use std::time::Duration;

use serde::Serialize;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};

/// The RBAC group of the rollouts.
const GROUP: &str = "rollouts.linnet.dev";
const ASKED_WITHIN: Duration = Duration::from_secs(5);

/// A signed-in person, as the API server told it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct User {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    #[serde(skip)]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// Why the API server gave no answer, or no user.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("the API server did not answer the {0} within 5 s")]
    Timeout(&'static str),
    #[error("{0}")]
    Api(String),
    #[error("{0}")]
    NotAuthenticated(String),
}

/// An error from the API server, with what to grant when it is a refusal of linnet's own.
fn api_error(e: &kube::Error, kind: &str) -> AccessError {
    let hint = format!("; linnet's identity may not create {kind}: grant it in deploy/rbac.yaml");
    AccessError::Api(crate::error::kube_message_hinted(e, &hint))
}

/// Who `token` is, as the API server says (TokenReview), within 5 s; `Err`: why not.
pub async fn review_token(client: &kube::Client, token: &str) -> Result<User, AccessError> {
    let api: kube::Api<TokenReview> = kube::Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            ..Default::default()
        },
        ..Default::default()
    };
    let pp = kube::api::PostParams::default();
    let asked = api.create(&pp, &review);
    let answer = match tokio::time::timeout(ASKED_WITHIN, asked).await {
        Err(_) => return Err(AccessError::Timeout("token review")),
        Ok(Err(e)) => return Err(api_error(&e, "tokenreviews")),
        Ok(Ok(answer)) => answer,
    };
    let status = answer.status.unwrap_or_default();
    match (status.authenticated, status.user) {
        (Some(true), Some(u)) => Ok(User {
            username: u.username.unwrap_or_default(),
            uid: u.uid.unwrap_or_default(),
            groups: u.groups.unwrap_or_default(),
            extra: u.extra.unwrap_or_default().into_iter().collect(),
        }),
        _ => Err(AccessError::NotAuthenticated(status.error.unwrap_or_else(
            || "the cluster does not know this token".into(),
        ))),
    }
}

/// What the API server says about `user` doing `verb` on the rollout.
pub async fn may(
    client: &kube::Client,
    user: &User,
    verb: &str,
    (resource, namespace, name): (&str, &str, &str),
) -> Result<bool, AccessError> {
    let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.username.clone()),
            uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
            groups: Some(user.groups.clone()),
            extra: Some(user.extra.clone().into_iter().collect()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(GROUP.into()),
                resource: Some(resource.into()),
                verb: Some(verb.into()),
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let pp = kube::api::PostParams::default();
    let asked = api.create(&pp, &review);
    match tokio::time::timeout(ASKED_WITHIN, asked).await {
        Err(_) => Err(AccessError::Timeout("access review")),
        Ok(Err(e)) => Err(api_error(&e, "subjectaccessreviews")),
        Ok(Ok(r)) => Ok(r.status.is_some_and(|s| s.allowed)),
    }
}
