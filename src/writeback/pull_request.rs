//! Revert pull requests on the Git host (issue 50, `onFailure.revert: pullRequest`), through
//! the same host, API and token as commit statuses: list the open ones (linnet's are found by
//! their branch, every page up to a bound), open one, close one, merge one. [`request`] builds
//! each provider's documented request (pure, in [`shapes`]); [`PullRequests`] sends it.
//!
//! - GitHub: `GET|POST /repos/{owner}/{repo}/pulls`, `PATCH /repos/{owner}/{repo}/pulls/{n}`;
//! - Gitea and Forgejo: the same paths under `/api/v1`;
//! - GitLab: `GET|POST /projects/{id}/merge_requests`, `PUT …/merge_requests/{iid}`;
//! - Bitbucket Cloud: `GET|POST /repositories/{workspace}/{repo}/pullrequests`,
//!   `POST …/pullrequests/{id}/decline` and `…/merge`.

use serde_json::Value;

use super::commit_status::CommitStatusConfig;

mod shapes;
pub use shapes::{Request, listed, of_commit, opened, page_size, request, with_prefix};

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
    /// A page (from 1) of the open pull requests, to find linnet's among.
    ListOpen {
        page: u32,
    },
    /// A page of the closed ones (merged or not, the newest first).
    ListClosed {
        page: u32,
    },
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
    /// The pull request merged as (or carrying) commit `sha`.
    OfCommit {
        sha: &'a str,
    },
    /// Comment `body` (Markdown) on pull request `number`.
    Comment {
        number: u64,
        body: &'a str,
    },
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

/// The most of an answer read: a page of 100 pull requests is well below it.
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
    open: Option<Listed>,
    closed: Option<Listed>,
}

/// Every pull request of a list, by branch (only what linnet reads of each).
type Listed = std::sync::Arc<Vec<(String, PullRequest)>>;

/// The most pages of a list read: past 2,000 open (1,000 on Gitea and Bitbucket) pull
/// requests, the oldest are not looked at.
const MAX_PAGES: u32 = 20;

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

    /// The open (or closed) pull requests, listed once per batch, page after page until a
    /// page is not full (or [`MAX_PAGES`]).
    async fn list(&self, closed: bool) -> Result<Listed, PullRequestError> {
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
        let provider = self.config.provider;
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let call = if closed {
                Call::ListClosed { page }
            } else {
                Call::ListOpen { page }
            };
            let (found, held) = listed(provider, &self.call(&call).await?);
            all.extend(found);
            if held < page_size(provider) {
                break;
            }
        }
        let list = std::sync::Arc::new(all);
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

    /// The pull request that brought commit `sha` in, if the host knows one.
    pub async fn of_commit(&self, sha: &str) -> Result<Option<PullRequest>, PullRequestError> {
        match self.call(&Call::OfCommit { sha }).await {
            Ok(answer) => Ok(of_commit(self.config.provider, &answer)),
            // Gitea answers 404 for a commit no pull request merged.
            Err(PullRequestError::Refused { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Comments `body` on pull request `number`.
    pub async fn comment(&self, number: u64, body: &str) -> Result<(), PullRequestError> {
        self.call(&Call::Comment { number, body }).await.map(|_| ())
    }

    /// The open pull requests whose branch starts with `prefix`, by branch.
    pub async fn open_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, PullRequest)>, PullRequestError> {
        let list = self.list(false).await?;
        Ok(list
            .iter()
            .filter(|(branch, _)| branch.starts_with(prefix))
            .cloned()
            .collect())
    }

    /// Whether a pull request from `branch` was closed (by a person: linnet's branches are
    /// named after what they propose, and a merged one leaves nothing to propose).
    pub async fn closed_from(&self, branch: &str) -> Result<bool, PullRequestError> {
        let list = self.list(true).await?;
        Ok(list.iter().any(|(b, _)| b == branch))
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
