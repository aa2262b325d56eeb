use super::*;

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
    let r = request(&gh, "t", &Call::ListOpen);
    assert_eq!(r.method, reqwest::Method::GET);
    assert_eq!(
        r.url,
        "https://api.github.com/repos/acme/gitops/pulls?state=open&per_page=100"
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
        request(&gh, "t", &Call::ListClosed).url,
        "https://api.github.com/repos/acme/gitops/pulls?state=closed&per_page=100"
    );
    let r = request(&gl, "t", &Call::ListOpen);
    assert_eq!(
        r.url,
        "https://gitlab.com/api/v4/projects/acme%2Fgitops/merge_requests?state=opened&per_page=100"
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
