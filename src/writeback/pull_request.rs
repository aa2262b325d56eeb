//! Revert pull requests on the Git host (issue 50, `onFailure.revert: pullRequest`), through
//! the same host, API and token as commit statuses: list the open ones (linnet's are found by
//! their branch), open one, close one. [`request`] builds each provider's documented request (pure); [`PullRequests`]
//! sends it.
//!
//! - GitHub: `GET|POST /repos/{owner}/{repo}/pulls`, `PATCH /repos/{owner}/{repo}/pulls/{n}`;
//! - Gitea and Forgejo: the same paths under `/api/v1`;
//! - GitLab: `GET|POST /projects/{id}/merge_requests`, `PUT …/merge_requests/{iid}`.

use serde_json::{Value, json};

use super::commit_status::{CommitStatusConfig, Provider};

/// An open pull request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullRequest {
    /// GitHub's and Gitea's `number`, GitLab's `iid`.
    pub number: u64,
    pub url: String,
}

/// What to ask of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call<'a> {
    /// The open pull requests (the first page: 100, Gitea's 50), to find linnet's among.
    ListOpen,
    /// The closed ones (merged or not; the first page, the newest first).
    ListClosed,
    Open {
        head: &'a str,
        base: &'a str,
        title: &'a str,
        body: &'a str,
    },
    Close {
        number: u64,
    },
    /// Merge it (a merge commit titled `title`).
    Merge {
        number: u64,
        title: &'a str,
    },
}

/// One HTTP request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub method: reqwest::Method,
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Value>,
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The provider's documented request for `call`.
pub fn request(cfg: &CommitStatusConfig, token: &str, call: &Call<'_>) -> Request {
    use reqwest::Method;
    let api = cfg.api_url.trim_end_matches('/');
    let repo = &cfg.repository;
    let (auth, base) = match cfg.provider {
        Provider::Github => (
            vec![
                ("authorization", format!("Bearer {token}")),
                ("accept", "application/vnd.github+json".to_string()),
                ("x-github-api-version", "2022-11-28".to_string()),
            ],
            format!("{api}/repos/{repo}/pulls"),
        ),
        Provider::Gitea => (
            vec![("authorization", format!("token {token}"))],
            format!("{api}/repos/{repo}/pulls"),
        ),
        Provider::Gitlab => (
            vec![("private-token", token.to_string())],
            format!("{api}/projects/{}/merge_requests", encode(repo)),
        ),
    };
    let (method, url, body) = match (cfg.provider, call) {
        (Provider::Github, Call::ListOpen) => {
            (Method::GET, format!("{base}?state=open&per_page=100"), None)
        }
        (Provider::Gitea, Call::ListOpen) => {
            (Method::GET, format!("{base}?state=open&limit=50"), None)
        }
        (Provider::Gitlab, Call::ListOpen) => (
            Method::GET,
            format!("{base}?state=opened&per_page=100"),
            None,
        ),
        (Provider::Github, Call::ListClosed) => (
            Method::GET,
            format!("{base}?state=closed&per_page=100"),
            None,
        ),
        (Provider::Gitea, Call::ListClosed) => {
            (Method::GET, format!("{base}?state=closed&limit=50"), None)
        }
        (Provider::Gitlab, Call::ListClosed) => (
            Method::GET,
            format!("{base}?state=closed&per_page=100"),
            None,
        ),
        (
            Provider::Github | Provider::Gitea,
            Call::Open {
                head,
                base: to,
                title,
                body,
            },
        ) => (
            Method::POST,
            base.clone(),
            Some(json!({"head": head, "base": to, "title": title, "body": body})),
        ),
        (
            Provider::Gitlab,
            Call::Open {
                head,
                base: to,
                title,
                body,
            },
        ) => (
            Method::POST,
            base.clone(),
            Some(
                json!({"source_branch": head, "target_branch": to, "title": title,
                "description": body, "remove_source_branch": true}),
            ),
        ),
        (Provider::Github | Provider::Gitea, Call::Close { number }) => (
            Method::PATCH,
            format!("{base}/{number}"),
            Some(json!({"state": "closed"})),
        ),
        (Provider::Gitlab, Call::Close { number }) => (
            Method::PUT,
            format!("{base}/{number}"),
            Some(json!({"state_event": "close"})),
        ),
        (Provider::Github, Call::Merge { number, title }) => (
            Method::PUT,
            format!("{base}/{number}/merge"),
            Some(json!({"merge_method": "merge", "commit_title": title})),
        ),
        (Provider::Gitea, Call::Merge { number, title }) => (
            Method::POST,
            format!("{base}/{number}/merge"),
            Some(json!({"Do": "merge", "MergeTitleField": title})),
        ),
        (Provider::Gitlab, Call::Merge { number, title }) => (
            Method::PUT,
            format!("{base}/{number}/merge"),
            Some(json!({"merge_commit_message": title})),
        ),
    };
    Request {
        method,
        url,
        headers: auth,
        body,
    }
}

/// The open pull requests of a list answer whose branch starts with `prefix`, by branch.
pub fn with_prefix(provider: Provider, answer: &Value, prefix: &str) -> Vec<(String, PullRequest)> {
    let Some(list) = answer.as_array() else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|pr| {
            let (branch, number, url) = match provider {
                Provider::Github | Provider::Gitea => (
                    pr.pointer("/head/ref"),
                    pr.get("number"),
                    pr.get("html_url"),
                ),
                Provider::Gitlab => (pr.get("source_branch"), pr.get("iid"), pr.get("web_url")),
            };
            let branch = branch?.as_str()?;
            branch.starts_with(prefix).then(|| {
                (
                    branch.to_string(),
                    PullRequest {
                        number: number.and_then(Value::as_u64).unwrap_or(0),
                        url: url.and_then(Value::as_str).unwrap_or_default().to_string(),
                    },
                )
            })
        })
        .collect()
}

/// The pull request in an answer to [`Call::Open`].
pub fn opened(provider: Provider, answer: &Value) -> Option<PullRequest> {
    let (number, url) = match provider {
        Provider::Github | Provider::Gitea => (answer.get("number"), answer.get("html_url")),
        Provider::Gitlab => (answer.get("iid"), answer.get("web_url")),
    };
    Some(PullRequest {
        number: number?.as_u64()?,
        url: url.and_then(Value::as_str).unwrap_or_default().to_string(),
    })
}

/// Why a call to the host failed.
#[derive(Debug, thiserror::Error)]
pub enum PullRequestError {
    #[error("cannot read the token file {path}: {reason}")]
    Token { path: String, reason: String },
    #[error(
        "the Git host refused the pull request call ({status}): {body}; check the token's scope \
         (it must open pull requests) and --commit-status-repo"
    )]
    Refused { status: u16, body: String },
    #[error("cannot reach the Git host's API at {url}: {message}")]
    Unreachable {
        url: String,
        failure: crate::net::Failure,
        message: String,
    },
    #[error("the Git host answered {status} with a body that is not the pull request: {body}")]
    Answer { status: u16, body: String },
}

impl PullRequestError {
    /// A stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            PullRequestError::Token { .. } => "token",
            PullRequestError::Refused { .. } => "refused",
            PullRequestError::Unreachable { failure, .. } => failure.label(),
            PullRequestError::Answer { .. } => "answer",
        }
    }

    /// Whether asking again later may succeed: not when the host said no, but yes when it
    /// was rate-limiting (429) or failing (5xx).
    pub fn retryable(&self) -> bool {
        !matches!(self, PullRequestError::Refused { status, .. } if *status != 429 && *status < 500)
    }
}

/// The most of an answer read: a page of 50 pull requests is well below it.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Calls the host's pull request API. The lists of open and of closed pull requests are read
/// at most once per batch of jobs ([`PullRequests::forget_lists`] starts a batch): a start
/// looks at every rollout that uses pull requests, and one list serves them all.
pub struct PullRequests {
    config: CommitStatusConfig,
    http: reqwest::Client,
    /// Never held across a call to the host.
    lists: std::sync::Mutex<Lists>,
}

/// The lists read in this batch.
#[derive(Default)]
struct Lists {
    open: Option<std::sync::Arc<Value>>,
    closed: Option<std::sync::Arc<Value>>,
}

impl PullRequests {
    pub fn new(config: CommitStatusConfig) -> Result<PullRequests, crate::net::CaFileError> {
        Ok(PullRequests {
            http: crate::net::http_client(config.ca_file.as_deref(), config.timeout)?,
            config,
            lists: Default::default(),
        })
    }

    /// A new batch of jobs: the next lookups list the pull requests again. Within a batch each
    /// rollout has at most one job per kind (revert, promotion), so what one job opens or
    /// closes is never what another one looks for.
    pub fn forget_lists(&self) {
        *self
            .lists
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Lists::default();
    }

    /// The open (or closed) pull requests, listed once per batch.
    async fn list(&self, closed: bool) -> Result<std::sync::Arc<Value>, PullRequestError> {
        let cached = {
            let lists = self
                .lists
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if closed {
                lists.closed.clone()
            } else {
                lists.open.clone()
            }
        };
        if let Some(list) = cached {
            return Ok(list);
        }
        let call = if closed {
            Call::ListClosed
        } else {
            Call::ListOpen
        };
        let list = std::sync::Arc::new(self.call(&call).await?);
        let mut lists = self
            .lists
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if closed {
            lists.closed = Some(list.clone());
        } else {
            lists.open = Some(list.clone());
        }
        Ok(list)
    }

    async fn call(&self, call: &Call<'_>) -> Result<Value, PullRequestError> {
        let path = &self.config.token_file;
        let token = std::fs::read_to_string(path).map_err(|e| PullRequestError::Token {
            path: path.display().to_string(),
            reason: crate::error::io_reason(&e),
        })?;
        let req = request(&self.config, token.trim(), call);
        let mut http = self.http.request(req.method, &req.url);
        for (k, v) in &req.headers {
            http = http.header(*k, v);
        }
        if let Some(body) = &req.body {
            http = http.json(body);
        }
        let mut answer = http.send().await.map_err(|e| {
            let (failure, message) = crate::net::explain_http(&e);
            PullRequestError::Unreachable {
                url: crate::text::redact_credentials(&self.config.api_url),
                failure,
                message: crate::text::redact_credentials(&message),
            }
        })?;
        let status = answer.status().as_u16();
        let mut body = Vec::new();
        while let Ok(Some(chunk)) = answer.chunk().await {
            let room = MAX_ANSWER_BYTES - body.len();
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() >= MAX_ANSWER_BYTES {
                break;
            }
        }
        let text = String::from_utf8_lossy(&body);
        if !(200..300).contains(&status) {
            return Err(PullRequestError::Refused {
                status,
                body: crate::text::one_line(&text, 200),
            });
        }
        // Gitea answers a merge with no body.
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&body).map_err(|_| PullRequestError::Answer {
            status,
            body: crate::text::one_line(&text, 200),
        })
    }

    /// The open pull requests whose branch starts with `prefix`, by branch.
    pub async fn open_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, PullRequest)>, PullRequestError> {
        let answer = self.list(false).await?;
        Ok(with_prefix(self.config.provider, &answer, prefix))
    }

    /// Whether a pull request from `branch` was closed (by a person: linnet's branches are
    /// named after what they propose, and a merged one leaves nothing to propose).
    pub async fn closed_from(&self, branch: &str) -> Result<bool, PullRequestError> {
        let answer = self.list(true).await?;
        Ok(with_prefix(self.config.provider, &answer, branch)
            .iter()
            .any(|(b, _)| b == branch))
    }

    /// Opens a pull request from `head` into `base`.
    pub async fn open(
        &self,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<PullRequest, PullRequestError> {
        let answer = self
            .call(&Call::Open {
                head,
                base,
                title,
                body,
            })
            .await?;
        opened(self.config.provider, &answer).ok_or_else(|| PullRequestError::Answer {
            status: 201,
            body: crate::text::one_line(&answer.to_string(), 200),
        })
    }

    /// Merges pull request `number`.
    pub async fn merge(&self, number: u64, title: &str) -> Result<(), PullRequestError> {
        self.call(&Call::Merge { number, title }).await.map(|_| ())
    }

    /// Closes pull request `number` (without merging it).
    pub async fn close(&self, number: u64) -> Result<(), PullRequestError> {
        self.call(&Call::Close { number }).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests;
