//! The dashboard's actions (`--dashboard-actions`): promote, advance a batch, abort. A click
//! never patches the cluster. It becomes the change a person would make in Git, in the
//! rollout's own file, committed as the signed-in person on a branch of its own, and a pull
//! request into the followed branch (merged by the agent only with `--dashboard-merge` and the
//! person's `merge` right on the rollout). Git stays the one place a rollout is changed.
//!
//! Who may: the session's person ([`super::session`]) when the API server allows them to
//! `patch` the rollout (SubjectAccessReview). Each action is an event on the rollout
//! (`DashboardAction`). The Git work runs on one task that owns the actions' clone, one job at
//! a time; a full queue answers 503.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use super::Shared;
use super::access;
use super::session::{self, Refusal, Sessions, User, refuse};
use crate::api::{CanaryDeployment, CanaryStatefulSet, RolloutView, SOURCE_PATH_ANNOTATION};
use crate::plan::approval::{DashboardAction, deployment_action, statefulset_action};
use crate::runtime::writer_slot::{WriterSettings, WriterSlot};
use crate::writeback::Proposal;
use crate::writeback::action_branch::ActionCommit;
use crate::writeback::image_pull_request::{Proposed, propose_branch};
use crate::writeback::pull_request::PullRequests;
use crate::writeback::push::BranchPushed;

/// What `--dashboard-actions` needs.
#[derive(Clone)]
pub struct ActionsConfig {
    /// The actions' own clone of the followed branch.
    pub writer: WriterSettings,
    /// The Git host's pull request API (that of commit statuses).
    pub host: crate::writeback::commit_status::CommitStatusConfig,
    /// `--dashboard-merge`: a person with the `merge` right on a rollout gets the pull
    /// request merged by the agent.
    pub merge: bool,
}

impl std::fmt::Debug for ActionsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActionsConfig")
            .field("clone", &self.writer.cache_dir)
            .field("merge", &self.merge)
            .finish_non_exhaustive()
    }
}

/// Why an action was not done.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("cannot reach the Git host's API: {0}")]
    Host(String),
    #[error("{0}")]
    Git(String),
}

/// The actions' state, shared by the handlers.
pub struct Actions {
    pub(super) sessions: Sessions,
    pub(super) sign_ins: Arc<tokio::sync::Semaphore>,
    jobs: tokio::sync::mpsc::Sender<Job>,
    pub(super) merge: bool,
    events: crate::events::EventRecorders,
}

/// Jobs waiting for the Git task; more are refused.
const QUEUED: usize = 8;
/// The RBAC verbs the API server is asked about.
const MAY_PROPOSE: &str = "patch";
const MAY_MERGE: &str = "merge";

struct Job {
    commit: ActionCommit,
    merge: bool,
    reply: tokio::sync::oneshot::Sender<Result<(BranchPushed, Option<Proposed>), ActionError>>,
}

impl Actions {
    /// The actions, with their Git task started.
    pub fn start(config: ActionsConfig, client: kube::Client) -> Result<Actions, ActionError> {
        let host =
            PullRequests::new(config.host.clone()).map_err(|e| ActionError::Host(e.to_string()))?;
        let (jobs, queue) = tokio::sync::mpsc::channel(QUEUED);
        crate::liveness::spawn(
            "dashboard-actions",
            git_task(config.writer.clone(), host, queue),
        );
        Ok(Actions {
            sessions: Sessions::default(),
            sign_ins: Arc::new(tokio::sync::Semaphore::new(session::SIGN_INS_AT_ONCE)),
            jobs,
            merge: config.merge,
            events: crate::events::EventRecorders::new(client, crate::events::reporter()),
        })
    }
}

/// One job at a time on the actions' clone: the branch, then its pull request.
async fn git_task(
    settings: WriterSettings,
    host: PullRequests,
    mut queue: tokio::sync::mpsc::Receiver<Job>,
) {
    let mut slot = WriterSlot::default();
    while let Some(job) = queue.recv().await {
        let commit = job.commit.clone();
        let pushed = slot
            .run(&settings, move |w| w.push_action_branch(&commit))
            .await;
        let out = match pushed {
            Err(e) => Err(ActionError::Git(crate::text::redact_credentials(
                &e.to_string(),
            ))),
            Ok(BranchPushed::NotNeeded) => Ok((BranchPushed::NotNeeded, None)),
            Ok(pushed) => {
                let proposal = Proposal {
                    prefix: job.commit.prefix(),
                    branch: job.commit.branch(),
                    base: settings.remote.branch.clone(),
                    title: job.commit.message.lines().next().unwrap_or_default().into(),
                    body: job.commit.message.clone(),
                };
                propose_branch(&host, &proposal, job.merge)
                    .await
                    .map(|p| (pushed, Some(p)))
                    .map_err(|e| ActionError::Git(crate::text::redact_credentials(&e.to_string())))
            }
        };
        let _ = job.reply.send(out);
    }
}

/// The rollout's change for `action`, its file and its RBAC resource, from the store.
struct Asked {
    resource: &'static str,
    kind: &'static str,
    change: Value,
    path: String,
    what: String,
    object: k8s_openapi::api::core::v1::ObjectReference,
}

/// A rollout found in the store and the change `action` asks of it.
struct Found {
    resource: &'static str,
    kind: &'static str,
    change: Value,
    meta: kube::api::ObjectMeta,
    object: k8s_openapi::api::core::v1::ObjectReference,
    canary: String,
}

fn not_now(action: DashboardAction, why: String) -> Refusal {
    let why = format!("cannot {} it now: {why}", action.name());
    Refusal(StatusCode::CONFLICT, why)
}

fn found(
    shared: &Shared,
    short: &str,
    (namespace, name): (&str, &str),
    action: DashboardAction,
) -> Result<Found, Refusal> {
    let gone = || Refusal(StatusCode::NOT_FOUND, "no such rollout".into());
    let canary = |image: Option<&String>| image.cloned().unwrap_or_default();
    match short {
        "csts" => {
            let key = ObjectRef::new(name).within(namespace);
            let store = shared.rollouts.statefulsets.store();
            let r = store.get(&key).ok_or_else(gone)?;
            Ok(Found {
                resource: "canarystatefulsets",
                kind: CanaryStatefulSet::KIND,
                change: statefulset_action(&r, action).map_err(|w| not_now(action, w.0))?,
                meta: crate::api::packed_meta::metadata(&*r).into_owned(),
                object: r.object_ref(&()),
                canary: canary(r.status.as_ref().and_then(|s| s.canary_image.as_ref())),
            })
        }
        "cdeploy" => {
            let key = ObjectRef::new(name).within(namespace);
            let store = shared.rollouts.deployments.store();
            let r = store.get(&key).ok_or_else(gone)?;
            Ok(Found {
                resource: "canarydeployments",
                kind: CanaryDeployment::KIND,
                change: deployment_action(&r, action).map_err(|w| not_now(action, w.0))?,
                meta: crate::api::packed_meta::metadata(&*r).into_owned(),
                object: r.object_ref(&()),
                canary: canary(r.status.as_ref().and_then(|s| s.canary_image.as_ref())),
            })
        }
        _ => Err(gone()),
    }
}

fn asked(
    shared: &Shared,
    short: &str,
    namespace: &str,
    name: &str,
    action: DashboardAction,
) -> Result<Asked, Refusal> {
    let f = found(shared, short, (namespace, name), action)?;
    let path = f
        .meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(SOURCE_PATH_ANNOTATION))
        .cloned()
        .ok_or_else(|| not_now(action, "it did not come from a file in Git".into()))?;
    if crate::writeback::rendered_edit::rendered(&path).is_some() {
        let why = format!("it is rendered from {path}: make the change in its source by hand");
        return Err(not_now(action, why));
    }
    Ok(Asked {
        resource: f.resource,
        kind: f.kind,
        change: f.change,
        path,
        what: f.canary,
        object: f.object,
    })
}

/// `POST /api/rollouts/{short}/{namespace}/{name}/actions/{action}`.
pub async fn act(
    State(shared): State<Arc<Shared>>,
    Path((short, namespace, name, action)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(actions) = &shared.actions else {
        return refuse(
            StatusCode::NOT_FOUND,
            "actions are off (--dashboard-actions)",
        );
    };
    let user = match session::signed_in(&actions.sessions, &headers) {
        Ok(user) => user,
        Err(refused) => return refused.into_response(),
    };
    let Some(action) = DashboardAction::parse(&action) else {
        return refuse(
            StatusCode::NOT_FOUND,
            "no such action: promote, advance or abort",
        );
    };
    let asked = match asked(&shared, &short, &namespace, &name, action) {
        Ok(a) => a,
        Err(refused) => return refused.into_response(),
    };
    let on = (asked.resource, namespace.as_str(), name.as_str());
    match access::may(&shared.client, &user, MAY_PROPOSE, on).await {
        Ok(true) => {}
        Ok(false) => {
            return refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "{} may not {MAY_PROPOSE} {}/{name} in {namespace}",
                    user.username, asked.resource
                ),
            );
        }
        Err(why) => return refuse(StatusCode::BAD_GATEWAY, why.to_string()),
    }
    let merge = actions.merge
        && access::may(&shared.client, &user, MAY_MERGE, on)
            .await
            .unwrap_or(false);
    let commit = ActionCommit {
        message: message(action, &namespace, &name, &asked, &user),
        path: asked.path.clone(),
        kind: asked.kind,
        namespace: namespace.clone(),
        name: name.clone(),
        action: action.name(),
        change: asked.change.clone(),
        author: author(&user),
    };
    let branch = commit.branch();
    let (reply, answer) = tokio::sync::oneshot::channel();
    if actions
        .jobs
        .try_send(Job {
            commit,
            merge,
            reply,
        })
        .is_err()
    {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many actions under way; try again",
        );
    }
    let done = match answer.await {
        Ok(Ok((_, done))) => done,
        Ok(Err(why)) => return refuse(StatusCode::BAD_GATEWAY, why.to_string()),
        Err(_) => return refuse(StatusCode::SERVICE_UNAVAILABLE, "the agent is stopping"),
    };
    let on = (namespace.as_str(), name.as_str(), branch);
    reported(actions, &asked, &user, (action, on), done).await
}

/// The answer to a click, said in an event on the rollout and in the log.
async fn reported(
    actions: &Actions,
    asked: &Asked,
    user: &User,
    (action, (namespace, name, branch)): (DashboardAction, (&str, &str, String)),
    done: Option<Proposed>,
) -> Response {
    let (state, url) = match done {
        None => ("already", None),
        Some(Proposed::Opened { url, .. }) => ("opened", Some(url)),
        Some(Proposed::Found { url, .. }) => ("found", Some(url)),
        Some(Proposed::Merged { url }) => ("merged", Some(url)),
        Some(Proposed::Declined) => {
            return refuse(
                StatusCode::CONFLICT,
                "the pull request of this very change was closed on the Git host: reopen it there, or make the change by hand",
            );
        }
    };
    let note = match &url {
        Some(url) => format!(
            "{} asked to {} from the dashboard: pull request {url} ({state})",
            user.username,
            action.name()
        ),
        None => format!(
            "{} asked to {} from the dashboard: Git says so already",
            user.username,
            action.name()
        ),
    };
    tracing::info!(user = %user.username, action = action.name(), rollout = %format!("{namespace}/{name}"), state, url = url.as_deref().unwrap_or(""), "dashboard action");
    actions
        .events
        .publish_note(&asked.object, false, "DashboardAction", &note)
        .await;
    Json(json!({"state": state, "pullRequest": url, "branch": branch, "change": asked.change}))
        .into_response()
}

/// The commit's author: the person, with their name as the address when it is one.
fn author(user: &User) -> (String, String) {
    // Git refuses `<` and `>` in a name or an address (they delimit the address).
    let name = user.username.replace(['<', '>', '\n'], "-");
    let email = if name.contains('@') {
        name.clone()
    } else {
        format!("{}@kubernetes.invalid", name.replace(' ', "-"))
    };
    (name, email)
}

fn message(
    action: DashboardAction,
    namespace: &str,
    name: &str,
    asked: &Asked,
    user: &User,
) -> String {
    let verb = match action {
        DashboardAction::Promote => "Promote",
        DashboardAction::Advance => "Advance",
        DashboardAction::Abort => "Abort",
    };
    format!(
        "{verb} {namespace}/{name} ({})\n\n{} asked for this on linnet's dashboard: {} in {}.\nThe change: {}\n",
        asked.what,
        user.username,
        action_words(action),
        asked.path,
        asked.change
    )
}

fn action_words(action: DashboardAction) -> &'static str {
    match action {
        DashboardAction::Promote => "promote its canary to every replica",
        DashboardAction::Advance => "start its next batch",
        DashboardAction::Abort => "stop its canary and go back to the stable version",
    }
}
