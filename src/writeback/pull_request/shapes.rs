//! Each provider's documented pull request calls and answers, pure: the request for a
//! [`Call`], and the pull requests in a list or an open answer.

use serde_json::{Value, json};

use super::{Call, PullRequest};
use crate::writeback::commit_status::{CommitStatusConfig, Provider};

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
        Provider::Bitbucket => (
            vec![("authorization", format!("Bearer {token}"))],
            format!("{api}/repositories/{repo}/pullrequests"),
        ),
    };
    let size = page_size(cfg.provider);
    let (method, url, body) = match (cfg.provider, call) {
        (Provider::Github, Call::ListOpen { page }) => (
            Method::GET,
            format!("{base}?state=open&per_page={size}&page={page}"),
            None,
        ),
        (Provider::Gitea, Call::ListOpen { page }) => (
            Method::GET,
            format!("{base}?state=open&limit={size}&page={page}"),
            None,
        ),
        (Provider::Gitlab, Call::ListOpen { page }) => (
            Method::GET,
            format!("{base}?state=opened&per_page={size}&page={page}"),
            None,
        ),
        (Provider::Bitbucket, Call::ListOpen { page }) => (
            Method::GET,
            format!("{base}?state=OPEN&pagelen={size}&page={page}"),
            None,
        ),
        (Provider::Github | Provider::Gitlab, Call::ListClosed { page }) => (
            Method::GET,
            format!("{base}?state=closed&per_page={size}&page={page}"),
            None,
        ),
        (Provider::Gitea, Call::ListClosed { page }) => (
            Method::GET,
            format!("{base}?state=closed&limit={size}&page={page}"),
            None,
        ),
        (Provider::Bitbucket, Call::ListClosed { page }) => (
            Method::GET,
            format!("{base}?state=DECLINED&state=MERGED&pagelen={size}&page={page}"),
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
        (
            Provider::Bitbucket,
            Call::Open {
                head,
                base: to,
                title,
                body,
            },
        ) => (
            Method::POST,
            base.clone(),
            Some(json!({"title": title, "description": body,
                "source": {"branch": {"name": head}},
                "destination": {"branch": {"name": to}},
                "close_source_branch": true})),
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
        (Provider::Bitbucket, Call::Close { number }) => {
            (Method::POST, format!("{base}/{number}/decline"), None)
        }
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
        (Provider::Bitbucket, Call::Merge { number, title }) => (
            Method::POST,
            format!("{base}/{number}/merge"),
            Some(json!({"merge_strategy": "merge_commit", "message": title,
                "close_source_branch": true})),
        ),
        (Provider::Github, Call::OfCommit { sha }) => (
            Method::GET,
            format!("{api}/repos/{repo}/commits/{sha}/pulls"),
            None,
        ),
        (Provider::Gitea, Call::OfCommit { sha }) => (
            Method::GET,
            format!("{api}/repos/{repo}/commits/{sha}/pull"),
            None,
        ),
        (Provider::Gitlab, Call::OfCommit { sha }) => (
            Method::GET,
            format!(
                "{api}/projects/{}/repository/commits/{sha}/merge_requests",
                encode(repo)
            ),
            None,
        ),
        (Provider::Bitbucket, Call::OfCommit { sha }) => (
            Method::GET,
            format!("{api}/repositories/{repo}/commit/{sha}/pullrequests"),
            None,
        ),
        (Provider::Github | Provider::Gitea, Call::Comment { number, body }) => (
            Method::POST,
            format!("{api}/repos/{repo}/issues/{number}/comments"),
            Some(json!({"body": body})),
        ),
        (Provider::Gitlab, Call::Comment { number, body }) => (
            Method::POST,
            format!("{base}/{number}/notes"),
            Some(json!({"body": body})),
        ),
        (Provider::Bitbucket, Call::Comment { number, body }) => (
            Method::POST,
            format!("{base}/{number}/comments"),
            Some(json!({"content": {"raw": body}})),
        ),
    };
    Request {
        method,
        url,
        headers: auth,
        body,
    }
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
