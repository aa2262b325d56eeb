//! Each provider's documented pull request calls and answers, pure: the request for a
//! [`Call`], and the pull requests in a list or an open answer.

use serde_json::{Value, json};

use super::{Call, PullRequest};
use crate::writeback::commit_status::{CommitStatusConfig, Provider, encode_path_segment};

/// One HTTP request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub method: reqwest::Method,
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Value>,
}

/// How many pull requests a page of a list holds (the most each host gives).
pub fn page_size(provider: Provider) -> usize {
    match provider {
        Provider::Github | Provider::Gitlab => 100,
        Provider::Gitea | Provider::Bitbucket => 50,
    }
}

/// The provider's documented request for `call`.
pub fn request(cfg: &CommitStatusConfig, token: &str, call: &Call<'_>) -> Request {
    use reqwest::Method;
    let (headers, base) = auth_and_base(cfg, token);
    let provider = cfg.provider;
    let (method, url, body) = match call {
        Call::ListOpen { page } => (Method::GET, list_url(provider, &base, *page, false), None),
        Call::ListClosed { page } => (Method::GET, list_url(provider, &base, *page, true), None),
        Call::Open {
            head,
            base: to,
            title,
            body,
        } => (
            Method::POST,
            base.clone(),
            Some(open_body(provider, head, to, title, body)),
        ),
        Call::Close { number } => close(provider, &base, *number),
        Call::Merge { number, title } => merge(provider, &base, *number, title),
        Call::OfCommit { sha } => (Method::GET, of_commit_url(cfg, sha), None),
        Call::Comment { number, body } => comment(cfg, &base, *number, body),
    };
    Request {
        method,
        url,
        headers,
        body,
    }
}

/// A call with its method, URL and body.
type Shaped = (reqwest::Method, String, Option<Value>);

/// The provider's authentication headers, and the URL of the repository's pull requests.
fn auth_and_base(cfg: &CommitStatusConfig, token: &str) -> (Vec<(&'static str, String)>, String) {
    let api = cfg.api_url.trim_end_matches('/');
    let repo = &cfg.repository;
    match cfg.provider {
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
            format!(
                "{api}/projects/{}/merge_requests",
                encode_path_segment(repo)
            ),
        ),
        Provider::Bitbucket => (
            vec![("authorization", format!("Bearer {token}"))],
            format!("{api}/repositories/{repo}/pullrequests"),
        ),
    }
}

/// A page of the open (or the closed and merged) pull requests.
fn list_url(provider: Provider, base: &str, page: u32, closed: bool) -> String {
    let size = page_size(provider);
    let state = match (provider, closed) {
        (Provider::Gitlab, false) => "opened",
        (Provider::Bitbucket, false) => "OPEN",
        (Provider::Bitbucket, true) => "DECLINED&state=MERGED",
        (_, false) => "open",
        (_, true) => "closed",
    };
    let per_page = match provider {
        Provider::Github | Provider::Gitlab => "per_page",
        Provider::Gitea => "limit",
        Provider::Bitbucket => "pagelen",
    };
    format!("{base}?state={state}&{per_page}={size}&page={page}")
}

/// The body that opens a pull request from `head` to `to`.
fn open_body(provider: Provider, head: &str, to: &str, title: &str, body: &str) -> Value {
    match provider {
        Provider::Github | Provider::Gitea => {
            json!({"head": head, "base": to, "title": title, "body": body})
        }
        Provider::Gitlab => json!({"source_branch": head, "target_branch": to, "title": title,
            "description": body, "remove_source_branch": true}),
        Provider::Bitbucket => json!({"title": title, "description": body,
            "source": {"branch": {"name": head}},
            "destination": {"branch": {"name": to}},
            "close_source_branch": true}),
    }
}

fn close(provider: Provider, base: &str, number: u64) -> Shaped {
    use reqwest::Method;
    let url = format!("{base}/{number}");
    match provider {
        Provider::Github | Provider::Gitea => {
            (Method::PATCH, url, Some(json!({"state": "closed"})))
        }
        Provider::Gitlab => (Method::PUT, url, Some(json!({"state_event": "close"}))),
        Provider::Bitbucket => (Method::POST, format!("{url}/decline"), None),
    }
}

fn merge(provider: Provider, base: &str, number: u64, title: &str) -> Shaped {
    use reqwest::Method;
    let url = format!("{base}/{number}/merge");
    match provider {
        Provider::Github => (
            Method::PUT,
            url,
            Some(json!({"merge_method": "merge", "commit_title": title})),
        ),
        Provider::Gitea => (
            Method::POST,
            url,
            Some(json!({"Do": "merge", "MergeTitleField": title})),
        ),
        Provider::Gitlab => (
            Method::PUT,
            url,
            Some(json!({"merge_commit_message": title})),
        ),
        Provider::Bitbucket => (
            Method::POST,
            url,
            Some(json!({"merge_strategy": "merge_commit", "message": title,
                "close_source_branch": true})),
        ),
    }
}

/// The pull requests that hold commit `sha`.
fn of_commit_url(cfg: &CommitStatusConfig, sha: &str) -> String {
    let api = cfg.api_url.trim_end_matches('/');
    let repo = &cfg.repository;
    match cfg.provider {
        Provider::Github => format!("{api}/repos/{repo}/commits/{sha}/pulls"),
        Provider::Gitea => format!("{api}/repos/{repo}/commits/{sha}/pull"),
        Provider::Gitlab => format!(
            "{api}/projects/{}/repository/commits/{sha}/merge_requests",
            encode_path_segment(repo)
        ),
        Provider::Bitbucket => format!("{api}/repositories/{repo}/commit/{sha}/pullrequests"),
    }
}

fn comment(cfg: &CommitStatusConfig, base: &str, number: u64, body: &str) -> Shaped {
    let api = cfg.api_url.trim_end_matches('/');
    let repo = &cfg.repository;
    let (url, body) = match cfg.provider {
        Provider::Github | Provider::Gitea => (
            format!("{api}/repos/{repo}/issues/{number}/comments"),
            json!({"body": body}),
        ),
        Provider::Gitlab => (format!("{base}/{number}/notes"), json!({"body": body})),
        Provider::Bitbucket => (
            format!("{base}/{number}/comments"),
            json!({"content": {"raw": body}}),
        ),
    };
    (reqwest::Method::POST, url, Some(body))
}

/// The pull request in an answer to [`Call::OfCommit`]: Gitea's one object, the first of
/// GitHub's and GitLab's lists, the first of Bitbucket's `values`.
pub fn of_commit(provider: Provider, answer: &Value) -> Option<PullRequest> {
    let first = match provider {
        Provider::Gitea => Some(answer),
        Provider::Github | Provider::Gitlab => answer.as_array()?.first(),
        Provider::Bitbucket => answer.get("values")?.as_array()?.first(),
    }?;
    opened(provider, first)
}

/// Every pull request of a list answer (one page), by branch, and how many the page held.
pub fn listed(provider: Provider, answer: &Value) -> (Vec<(String, PullRequest)>, usize) {
    let list = match provider {
        Provider::Bitbucket => answer.get("values").and_then(Value::as_array),
        _ => answer.as_array(),
    };
    let Some(list) = list else {
        return (Vec::new(), 0);
    };
    let found = list
        .iter()
        .filter_map(|pr| {
            let (branch, number, url) = match provider {
                Provider::Github | Provider::Gitea => (
                    pr.pointer("/head/ref"),
                    pr.get("number"),
                    pr.get("html_url"),
                ),
                Provider::Gitlab => (pr.get("source_branch"), pr.get("iid"), pr.get("web_url")),
                Provider::Bitbucket => (
                    pr.pointer("/source/branch/name"),
                    pr.get("id"),
                    pr.pointer("/links/html/href"),
                ),
            };
            Some((
                branch?.as_str()?.to_string(),
                PullRequest {
                    number: number.and_then(Value::as_u64).unwrap_or(0),
                    url: url.and_then(Value::as_str).unwrap_or_default().to_string(),
                },
            ))
        })
        .collect();
    (found, list.len())
}

/// The pull requests of a list answer whose branch starts with `prefix`, by branch.
pub fn with_prefix(provider: Provider, answer: &Value, prefix: &str) -> Vec<(String, PullRequest)> {
    let (all, _) = listed(provider, answer);
    all.into_iter()
        .filter(|(branch, _)| branch.starts_with(prefix))
        .collect()
}

/// The pull request in an answer to [`Call::Open`].
pub fn opened(provider: Provider, answer: &Value) -> Option<PullRequest> {
    let (number, url) = match provider {
        Provider::Github | Provider::Gitea => (answer.get("number"), answer.get("html_url")),
        Provider::Gitlab => (answer.get("iid"), answer.get("web_url")),
        Provider::Bitbucket => (answer.get("id"), answer.pointer("/links/html/href")),
    };
    Some(PullRequest {
        number: number?.as_u64()?,
        url: url.and_then(Value::as_str).unwrap_or_default().to_string(),
    })
}
