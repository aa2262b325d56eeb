use super::*;
use crate::writeback::commit_status::Provider;
use serde_json::json;

fn cfg(provider: Provider, api: &str, repo: &str) -> CommitStatusConfig {
    CommitStatusConfig {
        provider,
        api_url: api.into(),
        repository: repo.into(),
        token_file: "/dev/null".into(),
        cluster: "prod".into(),
        target_url: None,
        ca_file: None,
        timeout: std::time::Duration::from_secs(10),
    }
}

const HEAD: &str = "linnet/revert/demo/redis";

#[test]
fn each_provider_gets_its_documented_requests() {
    let open = Call::Open {
        head: HEAD,
        base: "main",
        title: "Revert demo/redis to redis:7.2",
        body: "why",
    };
    let gh = cfg(Provider::Github, "https://api.github.com/", "acme/gitops");
    let r = request(&gh, "t", &Call::ListOpen { page: 1 });
    assert_eq!(r.method, reqwest::Method::GET);
    assert_eq!(
        r.url,
        "https://api.github.com/repos/acme/gitops/pulls?state=open&per_page=100&page=1"
    );
    assert_eq!(r.headers[0], ("authorization", "Bearer t".to_string()));
    let r = request(&gh, "t", &open);
    assert_eq!(r.method, reqwest::Method::POST);
    assert_eq!(r.url, "https://api.github.com/repos/acme/gitops/pulls");
    assert_eq!(
        r.body.unwrap(),
        json!({"head": HEAD, "base": "main", "title": "Revert demo/redis to redis:7.2", "body": "why"})
    );
    let r = request(&gh, "t", &Call::Close { number: 7 });
    assert_eq!(r.method, reqwest::Method::PATCH);
    assert_eq!(r.url, "https://api.github.com/repos/acme/gitops/pulls/7");
    assert_eq!(r.body.unwrap(), json!({"state": "closed"}));

    let gitea = cfg(Provider::Gitea, "https://git.example/api/v1", "acme/gitops");
    let r = request(&gitea, "t", &open);
    assert_eq!(r.url, "https://git.example/api/v1/repos/acme/gitops/pulls");
    assert_eq!(r.headers, vec![("authorization", "token t".to_string())]);

    let gl = cfg(Provider::Gitlab, "https://gitlab.com/api/v4", "acme/gitops");
    assert_eq!(
        request(&gh, "t", &Call::ListClosed { page: 2 }).url,
        "https://api.github.com/repos/acme/gitops/pulls?state=closed&per_page=100&page=2"
    );
    let r = request(&gl, "t", &Call::ListOpen { page: 1 });
    assert_eq!(
        r.url,
        "https://gitlab.com/api/v4/projects/acme%2Fgitops/merge_requests?state=opened&per_page=100&page=1"
    );
    assert_eq!(r.headers, vec![("private-token", "t".to_string())]);
    let r = request(&gl, "t", &open);
    assert_eq!(r.body.unwrap()["source_branch"], HEAD);
    let r = request(&gl, "t", &Call::Close { number: 3 });
    assert_eq!(r.method, reqwest::Method::PUT);
    assert_eq!(r.body.unwrap(), json!({"state_event": "close"}));
}

/// `promoteTo.autoMerge`: each provider's documented merge request.
#[test]
fn a_merge_is_each_providers_documented_request() {
    let merge = Call::Merge {
        number: 5,
        title: "Promote redis:7.4",
    };
    let gh = cfg(Provider::Github, "https://api.github.com", "acme/gitops");
    let r = request(&gh, "t", &merge);
    assert_eq!(r.method, reqwest::Method::PUT);
    assert_eq!(
        r.url,
        "https://api.github.com/repos/acme/gitops/pulls/5/merge"
    );
    assert_eq!(
        r.body.unwrap(),
        json!({"merge_method": "merge", "commit_title": "Promote redis:7.4"})
    );
    let gitea = cfg(Provider::Gitea, "https://git.example/api/v1", "acme/gitops");
    let r = request(&gitea, "t", &merge);
    assert_eq!(r.method, reqwest::Method::POST);
    assert_eq!(
        r.url,
        "https://git.example/api/v1/repos/acme/gitops/pulls/5/merge"
    );
    assert_eq!(
        r.body.unwrap(),
        json!({"Do": "merge", "MergeTitleField": "Promote redis:7.4"})
    );
    let gl = cfg(Provider::Gitlab, "https://gitlab.com/api/v4", "acme/gitops");
    let r = request(&gl, "t", &merge);
    assert_eq!(r.method, reqwest::Method::PUT);
    assert_eq!(
        r.url,
        "https://gitlab.com/api/v4/projects/acme%2Fgitops/merge_requests/5/merge"
    );
    assert_eq!(
        r.body.unwrap(),
        json!({"merge_commit_message": "Promote redis:7.4"})
    );
}

#[test]
fn linnets_open_pull_requests_are_found_by_branch_in_each_providers_list() {
    let github = json!([
        {"number": 4, "html_url": "https://h/pull/4", "head": {"ref": "feature"}},
        {"number": 9, "html_url": "https://h/pull/9", "head": {"ref": format!("{HEAD}/0123456789ab")}},
    ]);
    assert_eq!(
        with_prefix(Provider::Github, &github, "linnet/revert/demo/redis/"),
        vec![(
            format!("{HEAD}/0123456789ab"),
            PullRequest {
                number: 9,
                url: "https://h/pull/9".into()
            }
        )]
    );
    // Another rollout's prefix (`redis-2` starts like `redis`, its prefix does not).
    assert!(with_prefix(Provider::Gitea, &github, "linnet/revert/demo/redis-2/").is_empty());
    let gitlab =
        json!([{"iid": 2, "web_url": "https://g/mr/2", "source_branch": format!("{HEAD}/x")}]);
    assert_eq!(with_prefix(Provider::Gitlab, &gitlab, HEAD)[0].1.number, 2);
    // Not a list (an error page, say): none.
    assert!(with_prefix(Provider::Github, &json!({"message": "x"}), HEAD).is_empty());
    assert_eq!(
        opened(Provider::Gitlab, &json!({"iid": 5, "web_url": "u"})),
        Some(PullRequest {
            number: 5,
            url: "u".into()
        })
    );
    assert_eq!(
        opened(Provider::Github, &json!({"message": "Validation Failed"})),
        None
    );
}

#[test]
fn a_rate_limited_or_failing_host_is_asked_again_and_a_refusal_is_not() {
    let refused = |status| PullRequestError::Refused {
        status,
        body: String::new(),
    };
    assert!(refused(429).retryable());
    assert!(refused(502).retryable());
    assert!(!refused(403).retryable());
    assert!(!refused(422).retryable());
}

/// Bitbucket Cloud's documented pull request calls and answers.
#[test]
fn bitbucket_gets_its_documented_requests_and_its_answers_are_read() {
    let bb = cfg(
        Provider::Bitbucket,
        "https://api.bitbucket.org/2.0",
        "acme/gitops",
    );
    let base = "https://api.bitbucket.org/2.0/repositories/acme/gitops/pullrequests";
    let r = request(&bb, "t", &Call::ListOpen { page: 3 });
    assert_eq!(
        (r.method, r.url),
        (
            reqwest::Method::GET,
            format!("{base}?state=OPEN&pagelen=50&page=3")
        )
    );
    assert_eq!(r.headers, vec![("authorization", "Bearer t".to_string())]);
    assert_eq!(
        request(&bb, "t", &Call::ListClosed { page: 1 }).url,
        format!("{base}?state=DECLINED&state=MERGED&pagelen=50&page=1")
    );
    let open = Call::Open {
        head: HEAD,
        base: "production",
        title: "Promote",
        body: "why",
    };
    let r = request(&bb, "t", &open);
    assert_eq!((r.method, r.url.as_str()), (reqwest::Method::POST, base));
    assert_eq!(
        r.body.unwrap(),
        json!({"title": "Promote", "description": "why",
            "source": {"branch": {"name": HEAD}}, "destination": {"branch": {"name": "production"}},
            "close_source_branch": true})
    );
    let r = request(&bb, "t", &Call::Close { number: 7 });
    assert_eq!(
        (r.method, r.url, r.body),
        (reqwest::Method::POST, format!("{base}/7/decline"), None)
    );
    let r = request(
        &bb,
        "t",
        &Call::Merge {
            number: 7,
            title: "Promote",
        },
    );
    assert_eq!(r.url, format!("{base}/7/merge"));
    assert_eq!(r.body.unwrap()["merge_strategy"], "merge_commit");
    let page = json!({"pagelen": 50, "values": [
        {"id": 7, "source": {"branch": {"name": format!("{HEAD}/x")}},
         "links": {"html": {"href": "https://bitbucket.org/acme/gitops/pull-requests/7"}}}]});
    let (found, held) = listed(Provider::Bitbucket, &page);
    assert_eq!(held, 1);
    assert_eq!(found[0].0, format!("{HEAD}/x"));
    assert_eq!(found[0].1.number, 7);
    assert_eq!(
        opened(
            Provider::Bitbucket,
            &json!({"id": 8, "links": {"html": {"href": "u"}}})
        ),
        Some(PullRequest {
            number: 8,
            url: "u".into()
        })
    );
}

/// Regression: only the first page of pull requests was read, so past 100 open ones a
/// restarted agent did not find its own and opened a second.
#[tokio::test]
async fn every_page_of_open_pull_requests_is_read_until_one_is_not_full() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let pages = std::sync::Arc::new(AtomicU32::new(0));
    let served = pages.clone();
    let app = axum::Router::new().route(
        "/repos/acme/gitops/pulls",
        axum::routing::get(
            move |uri: axum::http::Uri| {
                let served = served.clone();
                async move {
                    served.fetch_add(1, Ordering::SeqCst);
                    let page: usize = uri
                        .query()
                        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("page=")))
                        .and_then(|p| p.parse().ok())
                        .unwrap_or(1);
                    // Two full pages of other pull requests, then linnet's on the third.
                    let list: Vec<serde_json::Value> = match page {
                        1 | 2 => (0..100)
                            .map(|i| json!({"number": page * 1000 + i, "head": {"ref": format!("feature-{i}")}}))
                            .collect(),
                        3 => vec![json!({"number": 42, "html_url": "https://h/pull/42",
                            "head": {"ref": format!("{HEAD}/x")}})],
                        _ => Vec::new(),
                    };
                    axum::Json(serde_json::Value::Array(list))
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let token = tempfile::NamedTempFile::new().unwrap();
    let mut config = cfg(Provider::Github, &format!("http://{addr}"), "acme/gitops");
    config.token_file = token.path().to_path_buf();
    let host = PullRequests::new(config).unwrap();
    let found = host.open_with_prefix(HEAD).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1.number, 42);
    assert_eq!(pages.load(Ordering::SeqCst), 3);
    // Listed once per batch: a second lookup asks nothing.
    host.open_with_prefix("other/").await.unwrap();
    assert_eq!(pages.load(Ordering::SeqCst), 3);
}

/// Issue 52: the pull request a commit came from, and a comment on it, as each host
/// documents them.
#[test]
fn a_commits_pull_request_is_found_and_commented_on_as_each_host_documents() {
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let cases = [
        (
            Provider::Github,
            "https://api.github.com",
            format!("https://api.github.com/repos/acme/gitops/commits/{sha}/pulls"),
            "https://api.github.com/repos/acme/gitops/issues/7/comments",
            json!({"body": "hi"}),
            json!([{"number": 7, "html_url": "u"}]),
        ),
        (
            Provider::Gitea,
            "https://gitea.example/api/v1",
            format!("https://gitea.example/api/v1/repos/acme/gitops/commits/{sha}/pull"),
            "https://gitea.example/api/v1/repos/acme/gitops/issues/7/comments",
            json!({"body": "hi"}),
            json!({"number": 7, "html_url": "u"}),
        ),
        (
            Provider::Gitlab,
            "https://gitlab.com/api/v4",
            format!(
                "https://gitlab.com/api/v4/projects/acme%2Fgitops/repository/commits/{sha}/merge_requests"
            ),
            "https://gitlab.com/api/v4/projects/acme%2Fgitops/merge_requests/7/notes",
            json!({"body": "hi"}),
            json!([{"iid": 7, "web_url": "u"}]),
        ),
        (
            Provider::Bitbucket,
            "https://api.bitbucket.org/2.0",
            format!(
                "https://api.bitbucket.org/2.0/repositories/acme/gitops/commit/{sha}/pullrequests"
            ),
            "https://api.bitbucket.org/2.0/repositories/acme/gitops/pullrequests/7/comments",
            json!({"content": {"raw": "hi"}}),
            json!({"values": [{"id": 7, "links": {"html": {"href": "u"}}}]}),
        ),
    ];
    for (provider, api, of_commit_url, comment_url, comment_body, answer) in cases {
        let c = cfg(provider, api, "acme/gitops");
        let r = request(&c, "t", &Call::OfCommit { sha });
        assert_eq!((r.method, r.url), (reqwest::Method::GET, of_commit_url));
        let r = request(
            &c,
            "t",
            &Call::Comment {
                number: 7,
                body: "hi",
            },
        );
        assert_eq!(r.method, reqwest::Method::POST);
        assert_eq!(r.url, comment_url);
        assert_eq!(r.body.unwrap(), comment_body);
        assert_eq!(
            of_commit(provider, &answer),
            Some(PullRequest {
                number: 7,
                url: "u".into()
            }),
            "{provider:?}"
        );
        assert_eq!(of_commit(provider, &json!([])), None);
    }
}
