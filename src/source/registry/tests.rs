use super::*;
use reqwest::header::LINK;

#[test]
fn a_repository_name_is_read_as_docker_reads_it() {
    let r = Repository::parse("reg.example:5000/team/web", false).unwrap();
    assert_eq!(r.base.as_str(), "https://reg.example:5000/");
    assert_eq!(r.path, "team/web");
    let r = Repository::parse("localhost/web", true).unwrap();
    assert_eq!(r.base.as_str(), "http://localhost/");
    let hub = Repository::parse("nginx", false).unwrap();
    assert_eq!(hub.base.as_str(), "https://registry-1.docker.io/");
    assert_eq!(hub.path, "library/nginx");
    assert_eq!(
        Repository::parse("team/web", false).unwrap().path,
        "team/web"
    );
    for bad in [
        "",
        "web:1.0",
        "reg.example/web:1",
        "reg.example/web@sha256:ab",
        "a b",
        "reg.example//web",
    ] {
        assert!(Repository::parse(bad, false).is_err(), "{bad}");
    }
}

#[test]
fn a_next_page_is_followed_only_on_the_same_registry_and_path() {
    let url = Url::parse("https://reg.example/v2/web/tags/list?n=1000").unwrap();
    let headers = |link: &str| {
        let mut h = HeaderMap::new();
        h.insert(LINK, link.parse().unwrap());
        h
    };
    let next = next_page(
        &url,
        &headers("</v2/web/tags/list?last=1.9&n=1000>; rel=\"next\""),
    );
    assert_eq!(
        next.unwrap().as_str(),
        "https://reg.example/v2/web/tags/list?last=1.9&n=1000"
    );
    assert_eq!(
        next_page(
            &url,
            &headers("<https://evil.example/v2/web/tags/list>; rel=\"next\"")
        ),
        None
    );
    assert_eq!(
        next_page(&url, &headers("</v2/other/tags/list>; rel=\"next\"")),
        None
    );
    assert_eq!(
        next_page(&url, &headers("</v2/web/tags/list?last=1>; rel=\"prev\"")),
        None
    );
    // Regression: with two links, the first one's target was taken whatever its rel.
    let both = "</v2/web/tags/list?last=a>; rel=\"prev\", </v2/web/tags/list?last=z>; rel=\"next\"";
    let next = next_page(&url, &headers(both)).unwrap();
    assert_eq!(next.query(), Some("last=z"));
}

#[test]
fn a_registry_that_fails_or_limits_us_is_backed_off_for_at_least_its_retry_after() {
    let mut h = HeaderMap::new();
    h.insert(reqwest::header::RETRY_AFTER, "30".parse().unwrap());
    assert_eq!(retry_after(&h), Some(Duration::from_secs(30)));
    h.insert(reqwest::header::RETRY_AFTER, "99999".parse().unwrap());
    assert_eq!(retry_after(&h), Some(Duration::from_secs(3600)));
    h.insert(
        reqwest::header::RETRY_AFTER,
        "Wed, 21 Oct 2026 07:28:00 GMT".parse().unwrap(),
    );
    assert_eq!(retry_after(&h), None);
    let limited = RegistryError::RateLimited {
        url: "u".into(),
        retry_after: Some(Duration::from_secs(30)),
    };
    assert_eq!(limited.registry_fault(), Some(Duration::from_secs(30)));
    let status = |status| RegistryError::Status {
        url: "u".into(),
        status,
        hint: "",
    };
    assert_eq!(status(503).registry_fault(), Some(Duration::ZERO));
    // The policy's fault, not the registry's: the next scan asks again.
    assert_eq!(status(404).registry_fault(), None);
    assert_eq!(status(401).registry_fault(), None);
}

#[test]
fn a_refusal_says_whether_credentials_were_sent() {
    assert!(hint(401, false).contains("give credentials"));
    assert!(hint(403, true).contains("were refused"));
}

#[test]
fn a_bearer_challenge_is_read() {
    let p = bearer_params(
        "Bearer realm=\"https://auth.example/token\",service=\"reg\",scope=\"repository:web:pull\"",
    )
    .unwrap();
    assert_eq!(p[0], ("realm".into(), "https://auth.example/token".into()));
    assert_eq!(p[1], ("service".into(), "reg".into()));
    assert_eq!(bearer_params("Basic realm=\"x\""), None);
}
