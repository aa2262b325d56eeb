//! Commit statuses on the Git host: each rollout's state, on the commit that last set its spec
//! (`status.sourceRevision`), with context `linnet/<cluster>/<namespace>/<name>`.
//!
//! - [`wanted_for_statefulset`] / [`wanted_for_deployment`]: the status a rollout should show
//!   (pure);
//! - [`request`]: the HTTP request for a provider, as each documents it (pure);
//! - [`Poster`]: sends it, waits out rate limits (`Retry-After`, reset headers) and retries
//!   server errors; a failure is logged and counted, never in a rollout's way.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::api::{
    CanaryDeployment, CanaryStatefulSet, DeploymentPhase, PromotionType, RolloutView,
    StatefulSetPhase,
};

/// The Git hosts linnet posts commit statuses to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    /// GitHub and GitHub Enterprise: `POST /repos/{owner}/{repo}/statuses/{sha}`.
    Github,
    /// GitLab: `POST /projects/{id}/statuses/{sha}`.
    Gitlab,
    /// Gitea and Forgejo: `POST /repos/{owner}/{repo}/statuses/{sha}`.
    Gitea,
    /// Bitbucket Cloud: `POST /repositories/{workspace}/{repo}/commit/{sha}/statuses/build`.
    Bitbucket,
}

/// Where and how commit statuses are posted.
#[derive(Clone, Debug)]
pub struct CommitStatusConfig {
    pub provider: Provider,
    /// The API base, e.g. `https://api.github.com`, `https://gitlab.com/api/v4`,
    /// `https://gitea.example.com/api/v1`.
    pub api_url: String,
    /// `owner/name` (GitHub, Gitea), the project's path or id (GitLab), or
    /// `workspace/repo` (Bitbucket).
    pub repository: String,
    /// The token, read on every post.
    pub token_file: PathBuf,
    /// The cluster's name in the context.
    pub cluster: String,
    /// A link for the status; `{namespace}`, `{name}` and `{kind}` are filled in.
    pub target_url: Option<String>,
    /// A private CA the API's certificate is checked against, besides the platform's roots.
    pub ca_file: Option<PathBuf>,
    /// Longest one request may take, connecting included.
    pub timeout: Duration,
}

/// A commit status's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Pending,
    Success,
    Failure,
    Error,
}

/// The status one rollout should show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub sha: String,
    pub context: String,
    pub state: State,
    pub description: String,
    pub target_url: Option<String>,
}

fn is_sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn wanted<R: RolloutView>(
    cfg: &CommitStatusConfig,
    o: &R,
    state: Option<(State, String)>,
) -> Option<Wanted> {
    wanted_on(cfg, R::KIND, o.meta(), o.source_revision(), state)
}

fn wanted_on(
    cfg: &CommitStatusConfig,
    kind: &str,
    meta: &kube::api::ObjectMeta,
    revision: Option<&str>,
    state: Option<(State, String)>,
) -> Option<Wanted> {
    let sha = revision.filter(|r| is_sha(r))?;
    let (state, description) = state?;
    let namespace = meta.namespace.as_deref()?;
    let name = meta.name.as_deref()?;
    Some(Wanted {
        sha: sha.to_string(),
        context: format!("linnet/{}/{namespace}/{name}", cfg.cluster),
        state,
        description: crate::text::one_line(&description, 140),
        target_url: cfg.target_url.as_ref().map(|t| {
            t.replace("{namespace}", namespace)
                .replace("{name}", name)
                .replace("{kind}", kind)
        }),
    })
}

/// `, 20% of requests` while traffic routing gives the canary a share (nothing without).
fn traffic_note<R: RolloutView>(o: &R) -> String {
    o.canary_weight()
        .map(|w| format!(", {w}% of requests"))
        .unwrap_or_default()
}

/// What a CanaryStatefulSet shows on its commit; `None` where it posts nothing new (a
/// promotion under way keeps the status it had until it is done).
pub fn wanted_for_statefulset(cfg: &CommitStatusConfig, o: &CanaryStatefulSet) -> Option<Wanted> {
    let s = o.status.as_ref()?;
    let image = o.rolling_out();
    let state = match s.phase? {
        StatefulSetPhase::Initializing => Some((State::Pending, "starting".to_string())),
        StatefulSetPhase::Stable => Some((
            State::Success,
            format!(
                "stable: {} on {}",
                o.ready().unwrap_or("-"),
                o.stable_image().unwrap_or("-")
            ),
        )),
        StatefulSetPhase::ScalingDownStable | StatefulSetPhase::DeployingCanary => Some((
            State::Pending,
            format!("canary of {image} in progress{}", traffic_note(o)),
        )),
        StatefulSetPhase::CanaryActive => Some((
            State::Pending,
            match o.spec.promotion.type_ {
                PromotionType::Manual => {
                    format!(
                        "canary of {image} ready{}; waiting for promotion (merge the promote annotation)",
                        traffic_note(o)
                    )
                }
                PromotionType::Auto => {
                    format!("canary of {image} ready{}; baking", traffic_note(o))
                }
            },
        )),
        StatefulSetPhase::AwaitingMigration | StatefulSetPhase::MigratingData => Some((
            State::Pending,
            format!("migrating data before promoting {image}"),
        )),
        StatefulSetPhase::Promoting | StatefulSetPhase::RollingBack => None,
        StatefulSetPhase::MigrationFailed | StatefulSetPhase::RolledBack => Some((
            State::Failure,
            match crate::plan::analysis::failure(&s.analysis) {
                Some(why) => format!("rolled back: {why}"),
                None => format!("rolled back: {image} was not promoted"),
            },
        )),
        StatefulSetPhase::Failed => Some((
            State::Error,
            s.message
                .clone()
                .unwrap_or_else(|| "the spec cannot be acted on".into()),
        )),
    };
    wanted(cfg, o, state)
}

/// What a CanaryDeployment shows on its commit.
pub fn wanted_for_deployment(cfg: &CommitStatusConfig, o: &CanaryDeployment) -> Option<Wanted> {
    let s = o.status.as_ref()?;
    let image = o.rolling_out();
    let blue_green = o.spec.strategy.type_ == crate::api::DeploymentStrategyType::BlueGreen;
    let state = match s.phase? {
        DeploymentPhase::Initializing => Some((State::Pending, "starting".to_string())),
        DeploymentPhase::Progressing if blue_green => Some((
            State::Pending,
            match s.current_batch {
                Some(2) => format!("blue-green switch to {image}{}", traffic_note(o)),
                _ => format!("starting the preview of {image} beside the old version"),
            },
        )),
        DeploymentPhase::Progressing => Some((
            State::Pending,
            match s.batch.as_deref() {
                Some(b) => format!("rolling out {image}: batch {b}{}", traffic_note(o)),
                None => format!("rolling out {image}"),
            },
        )),
        DeploymentPhase::Paused if blue_green && s.current_batch == Some(2) => Some((
            State::Pending,
            format!(
                "blue-green switch to {image} held by its analysis{}",
                traffic_note(o)
            ),
        )),
        DeploymentPhase::Paused if blue_green => Some((
            State::Pending,
            format!(
                "preview of {image} ready{}; waiting for approval to switch (set currentBatch to 2)",
                traffic_note(o)
            ),
        )),
        DeploymentPhase::Paused => Some((
            State::Pending,
            format!(
                "batch {} of {image} done{}; waiting for approval (raise currentBatch)",
                s.batch.as_deref().unwrap_or("-"),
                traffic_note(o)
            ),
        )),
        DeploymentPhase::Completed => Some((
            State::Success,
            format!(
                "complete: {} on {}",
                o.ready().unwrap_or("-"),
                o.stable_image().unwrap_or("-")
            ),
        )),
        DeploymentPhase::RollingBack => None,
        DeploymentPhase::RolledBack | DeploymentPhase::Failed => Some((
            State::Failure,
            s.message
                .clone()
                .unwrap_or_else(|| format!("{image} failed")),
        )),
    };
    wanted(cfg, o, state)
}

/// The error status for rollout `namespace/name`, whose file has `located_error` at
/// `revision`: the commit that broke the spec shows what is wrong and where.
pub fn wanted_for_spec_error(
    cfg: &CommitStatusConfig,
    namespace: &str,
    name: &str,
    revision: &str,
    located_error: &str,
) -> Option<Wanted> {
    let meta = kube::api::ObjectMeta {
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        ..Default::default()
    };
    wanted_on(
        cfg,
        "spec",
        &meta,
        Some(revision),
        Some((State::Error, format!("invalid spec: {located_error}"))),
    )
}

/// One HTTP request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Value,
}

/// The provider's documented request for `w` (always a POST).
pub fn request(cfg: &CommitStatusConfig, token: &str, w: &Wanted) -> Request {
    let api = cfg.api_url.trim_end_matches('/');
    let repo = &cfg.repository;
    let sha = &w.sha;
    let state = state_name(cfg.provider, w.state);
    let mut body = json!({"description": w.description, "state": state});
    if let Some(url) = &w.target_url {
        body["target_url"] = json!(url);
    }
    let (url, headers) = match cfg.provider {
        Provider::Github => {
            body["context"] = json!(w.context);
            let headers = vec![
                ("authorization", format!("Bearer {token}")),
                ("accept", "application/vnd.github+json".into()),
                ("x-github-api-version", "2022-11-28".into()),
            ];
            (format!("{api}/repos/{repo}/statuses/{sha}"), headers)
        }
        Provider::Gitlab => {
            body["name"] = json!(w.context);
            let project = encode_path_segment(repo);
            let url = format!("{api}/projects/{project}/statuses/{sha}");
            (url, vec![("private-token", token.to_string())])
        }
        Provider::Bitbucket => {
            // Bitbucket's build statuses need a link: the commit's own, when none is set.
            let commit = format!("{api}/repositories/{repo}/commit/{sha}");
            let link = w.target_url.clone().unwrap_or_else(|| commit.clone());
            body = json!({
                "key": w.context,
                "name": w.context,
                "description": w.description,
                "url": link,
                "state": state,
            });
            let headers = vec![("authorization", format!("Bearer {token}"))];
            (format!("{commit}/statuses/build"), headers)
        }
        Provider::Gitea => {
            body["context"] = json!(w.context);
            let headers = vec![("authorization", format!("token {token}"))];
            (format!("{api}/repos/{repo}/statuses/{sha}"), headers)
        }
    };
    Request { url, headers, body }
}

/// Each host's name for a status's state.
fn state_name(provider: Provider, state: State) -> &'static str {
    match (provider, state) {
        (Provider::Bitbucket, State::Pending) => "INPROGRESS",
        (Provider::Bitbucket, State::Success) => "SUCCESSFUL",
        (Provider::Bitbucket, State::Failure | State::Error) => "FAILED",
        (_, State::Pending) => "pending",
        (_, State::Success) => "success",
        (Provider::Gitlab, State::Failure | State::Error) => "failed",
        (_, State::Failure) => "failure",
        (_, State::Error) => "error",
    }
}

/// `s` percent-encoded as one path segment (a GitLab project's `group/name`).
pub(crate) fn encode_path_segment(s: &str) -> String {
    crate::text::percent_encoded(s)
}

/// Why a post failed for good.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("cannot read the token file {path}: {}", crate::error::io_reason(.source))]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the Git host refused the status ({status}): {body}; check the token's scope and --commit-status-repo"
    )]
    Refused { status: u16, body: String },
    #[error("the Git host did not take the status after {tries} tries: {last}")]
    GaveUp { tries: u32, last: String },
    #[error("cannot reach the Git host's API at {url}: {message}")]
    Unreachable {
        url: String,
        failure: crate::net::Failure,
        message: String,
    },
}

impl PostError {
    /// Every label [`PostError::label`] gives, besides [`crate::net::Failure::LABELS`].
    pub const LABELS: &'static [&'static str] = &["token", "refused", "gave_up"];

    /// A stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            PostError::Token { .. } => "token",
            PostError::Refused { .. } => "refused",
            PostError::GaveUp { .. } => "gave_up",
            PostError::Unreachable { failure, .. } => failure.label(),
        }
    }

    /// Whether posting again later may succeed: the host was away or failing, or the token
    /// file could not be read (a Secret being mounted); not when the host said no.
    pub fn retryable(&self) -> bool {
        !matches!(self, PostError::Refused { .. })
    }
}

/// How long a rate-limited answer asks us to wait, from `Retry-After` (seconds) or a reset
/// time (`X-RateLimit-Reset`, Unix seconds), capped at `cap`.
pub fn rate_limit_wait(
    headers: &reqwest::header::HeaderMap,
    now_unix: u64,
    cap: Duration,
) -> Option<Duration> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let wait = number("retry-after").map(Duration::from_secs).or_else(|| {
        let exhausted = number("x-ratelimit-remaining") == Some(0);
        let reset = number("x-ratelimit-reset").or_else(|| number("ratelimit-reset"))?;
        exhausted.then(|| Duration::from_secs(reset.saturating_sub(now_unix)))
    })?;
    Some(wait.min(cap))
}

/// Posts commit statuses with retries.
pub struct Poster {
    config: CommitStatusConfig,
    http: reqwest::Client,
    tries: u32,
    max_wait: Duration,
}

/// The most of an answer's body read (it is only quoted in an error).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Reads at most [`MAX_ANSWER_BYTES`] of `r`'s body, as text.
async fn answer_text(mut r: reqwest::Response) -> String {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = r.chunk().await {
        let room = MAX_ANSWER_BYTES - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ANSWER_BYTES {
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

impl Poster {
    /// A poster for `config`; fails only when its `ca_file` cannot be used.
    pub fn new(config: CommitStatusConfig) -> Result<Poster, crate::net::CaFileError> {
        Ok(Poster {
            http: crate::net::http_client(config.ca_file.as_deref(), config.timeout)?,
            config,
            tries: 5,
            max_wait: Duration::from_secs(300),
        })
    }

    /// Posts `w`, waiting out rate limits and retrying server errors; returns the attempts.
    pub async fn post(&self, w: &Wanted) -> Result<u32, PostError> {
        let path = &self.config.token_file;
        let token = std::fs::read_to_string(path).map_err(|source| PostError::Token {
            path: path.display().to_string(),
            source,
        })?;
        let req = request(&self.config, token.trim(), w);
        let mut last = String::new();
        let mut retries = crate::retry::Retries::new(
            crate::retry::COMMIT_STATUS_POST_MIN,
            crate::retry::COMMIT_STATUS_POST_MAX,
        );
        for attempt in 1..=self.tries {
            let mut call = self.http.post(&req.url).json(&req.body);
            for (k, v) in &req.headers {
                call = call.header(*k, v);
            }
            match call.send().await {
                Ok(r) if r.status().is_success() => return Ok(attempt),
                Ok(r) => {
                    let status = r.status().as_u16();
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let limited = rate_limit_wait(r.headers(), now, self.max_wait);
                    let body = answer_text(r).await;
                    last = format!("{status} {}", crate::text::one_line(&body, 200));
                    match (status, limited) {
                        (429 | 403, Some(wait)) => {
                            tracing::info!(
                                ?wait,
                                "the Git host rate-limits commit statuses; waiting"
                            );
                            tokio::time::sleep(wait).await;
                        }
                        (429, None) | (500..=599, _) => tokio::time::sleep(retries.wait()).await,
                        _ => {
                            return Err(PostError::Refused {
                                status,
                                body: crate::text::one_line(&body, 200),
                            });
                        }
                    }
                }
                // The host is not answering (or not trusted): no quick retries here; the
                // status is tried again later, after a backoff (`StatusPoster`).
                Err(e) => {
                    let (failure, message) = crate::net::explain_http(&e);
                    return Err(PostError::Unreachable {
                        url: crate::text::redact_credentials(&self.config.api_url),
                        failure,
                        message: crate::text::redact_credentials(&message),
                    });
                }
            }
        }
        Err(PostError::GaveUp {
            tries: self.tries,
            last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CanaryDeploymentStatus, DeploymentPhase};

    const SHA: &str = "2222222222222222222222222222222222222222";

    /// Issue 75: a blue-green rollout says preview, approval to switch, and switch, not
    /// batches.
    #[test]
    fn a_blue_green_rollout_shows_its_preview_and_its_switch() {
        let cfg = CommitStatusConfig {
            provider: Provider::Github,
            api_url: "https://api.github.com".into(),
            repository: "acme/gitops".into(),
            token_file: "/dev/null".into(),
            cluster: "prod".into(),
            target_url: None,
            ca_file: None,
            timeout: Duration::from_secs(10),
        };
        let mut d: CanaryDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1", "kind": "CanaryDeployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 4, "image": "web:2", "strategy": {"type": "BlueGreen"},
                "template": {"selector": {"matchLabels": {"app": "web"}},
                    "template": {"spec": {"containers": [{"name": "web"}]}}}}
        }))
        .unwrap();
        let mut said = Vec::new();
        for (phase, stage, weight) in [
            (DeploymentPhase::Progressing, 1, 0),
            (DeploymentPhase::Paused, 1, 0),
            (DeploymentPhase::Progressing, 2, 100),
            (DeploymentPhase::Paused, 2, 100),
        ] {
            d.status = Some(CanaryDeploymentStatus {
                phase: Some(phase),
                current_batch: Some(stage),
                canary_image: Some("web:2".into()),
                stable_image: Some("web:1".into()),
                canary_weight: Some(weight),
                source_revision: Some(SHA.into()),
                ..Default::default()
            });
            said.push(wanted_for_deployment(&cfg, &d).unwrap().description);
        }
        assert_eq!(
            said,
            [
                "starting the preview of web:2 beside the old version",
                "preview of web:2 ready, 0% of requests; waiting for approval to switch (set currentBatch to 2)",
                "blue-green switch to web:2, 100% of requests",
                "blue-green switch to web:2 held by its analysis, 100% of requests",
            ]
        );
    }
}
