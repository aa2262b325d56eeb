//! What the registry's headers say: the next page of a tag list (`Link`) and a `Bearer`
//! challenge's parameters (`WWW-Authenticate`).

use reqwest::header::{HeaderMap, LINK};
use url::Url;

/// The next page from a `Link: </v2/…?last=…>; rel="next"` header, on the same registry only.
pub(super) fn next_page(url: &Url, headers: &HeaderMap) -> Option<Url> {
    let link = headers.get(LINK)?.to_str().ok()?;
    // `<a>; rel="prev", <b>; rel="next"`: each link is `<target>` and its parameters.
    let target = link.split('<').skip(1).find_map(|entry| {
        let (target, params) = entry.split_once('>')?;
        let rel = params
            .split(';')
            .filter_map(|p| p.trim().strip_prefix("rel="))
            .any(|r| r.trim_matches(|c| c == '"' || c == ',' || c == ' ') == "next");
        rel.then_some(target)
    })?;
    let next = url.join(target.trim()).ok()?;
    (next.origin() == url.origin() && next.path() == url.path()).then_some(next)
}

/// `Bearer realm="…",service="…",scope="…"` as (key, value) pairs.
pub(super) fn bearer_params(challenge: &str) -> Option<Vec<(String, String)>> {
    let rest = challenge
        .strip_prefix("Bearer ")
        .or_else(|| challenge.strip_prefix("bearer "))?;
    let mut out = Vec::new();
    for part in rest.split(',') {
        let (k, v) = part.split_once('=')?;
        out.push((k.trim().to_string(), v.trim().trim_matches('"').to_string()));
    }
    Some(out)
}
