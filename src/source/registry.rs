//! The registry scanner (issue 74): a repository's tags and a tag's digest, read through the
//! OCI distribution API (`/v2/<name>/tags/list`, `HEAD /v2/<name>/manifests/<tag>`). Whoever
//! can push an image controls what comes back, so every answer is bounded: bytes per page
//! ([`MAX_PAGE_BYTES`]), pages ([`MAX_PAGES`]) and tags ([`MAX_TAGS`]), each request by the
//! client's timeout and the whole listing by a deadline. A `Link` to the next page is followed
//! only on the same registry, and a token is asked for only from the realm a registry names
//! (anonymously; the token is never sent anywhere but that registry).

use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderMap, LINK, WWW_AUTHENTICATE};
use url::Url;

/// The largest page of a tag list read (Docker Hub's pages of 1,000 tags are about 30 KiB).
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;
/// Pages of one listing.
pub const MAX_PAGES: usize = 200;
/// Tags of one repository; more are left out (and said).
pub const MAX_TAGS: usize = 100_000;
/// Tags asked for per page.
const PAGE_SIZE: usize = 1000;

/// The manifest types a digest is asked for: an index first, as a multi-platform push makes.
const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// Why a listing failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("image {image:?} is not a repository name (registry/path, no tag or digest)")]
    BadImage { image: String },
    #[error("{url}: {reason}")]
    Http { url: String, reason: String },
    #[error("{url} answered {status}{hint}")]
    Status {
        url: String,
        status: u16,
        hint: &'static str,
    },
    #[error("{url}: the answer is past {MAX_PAGE_BYTES} bytes")]
    TooLarge { url: String },
    #[error("{url}: the answer is not a tag list: {reason}")]
    NotTags { url: String, reason: String },
    #[error("{url}: no digest in the answer")]
    NoDigest { url: String },
    #[error("listing {image} took longer than {deadline:?}")]
    Deadline { image: String, deadline: Duration },
}

impl RegistryError {
    /// A stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            RegistryError::BadImage { .. } => "bad_image",
            RegistryError::Http { .. } => "http",
            RegistryError::Status { .. } => "status",
            RegistryError::TooLarge { .. } => "too_large",
            RegistryError::NotTags { .. } => "not_tags",
            RegistryError::NoDigest { .. } => "no_digest",
            RegistryError::Deadline { .. } => "deadline",
        }
    }
}

/// Where an image's repository is: its registry's base URL and its path there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repository {
    pub base: Url,
    pub path: String,
}

impl Repository {
    /// `registry.example:5000/team/web` → `https://registry.example:5000`, `team/web`; a name
    /// with no host is Docker Hub's (`web` → `library/web`). `insecure`: plain HTTP.
    pub fn parse(image: &str, insecure: bool) -> Result<Repository, RegistryError> {
        let bad = || RegistryError::BadImage {
            image: image.to_string(),
        };
        let (host, path) = crate::plan::image_tags::registry_and_path(image).ok_or_else(bad)?;
        let scheme = if insecure { "http" } else { "https" };
        let base = Url::parse(&format!("{scheme}://{host}")).map_err(|_| bad())?;
        Ok(Repository { base, path })
    }
}

/// Reads tag lists and digests with one HTTP client (the agent's roots and `--ca-file`).
pub struct Registry {
    client: reqwest::Client,
}

impl Registry {
    /// `client` should follow no redirects: a `Link` or a realm is checked before it is used.
    pub fn new(client: reqwest::Client) -> Registry {
        Registry { client }
    }

    /// Every tag of `repo` (up to [`MAX_TAGS`]; the bool says whether more were left out),
    /// within `deadline`.
    pub async fn tags(
        &self,
        repo: &Repository,
        deadline: Duration,
    ) -> Result<(Vec<String>, bool), RegistryError> {
        let start = Instant::now();
        let late = || RegistryError::Deadline {
            image: format!("{}{}", repo.base, repo.path),
            deadline,
        };
        let mut url = self.url(repo, &format!("tags/list?n={PAGE_SIZE}"))?;
        let mut token: Option<String> = None;
        let mut tags = Vec::new();
        for _ in 0..MAX_PAGES {
            let left = deadline.checked_sub(start.elapsed()).ok_or_else(late)?;
            let page = tokio::time::timeout(
                left,
                self.send(&url, reqwest::Method::GET, &mut token, repo),
            )
            .await
            .map_err(|_| late())??;
            let (body, headers) = page;
            let list: TagList =
                serde_json::from_slice(&body).map_err(|e| RegistryError::NotTags {
                    url: url.to_string(),
                    reason: e.to_string(),
                })?;
            // What the OCI grammar refuses is never kept: at most MAX_TAGS of 128 bytes.
            let page: Vec<String> = list
                .tags
                .unwrap_or_default()
                .into_iter()
                .filter(|t| crate::plan::image_tags::is_tag(t))
                .collect();
            let room = MAX_TAGS - tags.len();
            let more = page.len() > room;
            tags.extend(page.into_iter().take(room));
            if more {
                return Ok((tags, true));
            }
            match next_page(&url, &headers) {
                Some(next) if next != url => url = next,
                _ => return Ok((tags, false)),
            }
        }
        Ok((tags, true))
    }

    /// The digest `tag` points at now (`sha256:…`), as the registry says in
    /// `Docker-Content-Digest`.
    pub async fn digest(&self, repo: &Repository, tag: &str) -> Result<String, RegistryError> {
        let url = self.url(repo, &format!("manifests/{tag}"))?;
        let mut token = None;
        let (_, headers) = self
            .send(&url, reqwest::Method::HEAD, &mut token, repo)
            .await?;
        headers
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .filter(|d| {
                d.strip_prefix("sha256:")
                    .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            })
            .map(str::to_string)
            .ok_or(RegistryError::NoDigest {
                url: url.to_string(),
            })
    }

    fn url(&self, repo: &Repository, rest: &str) -> Result<Url, RegistryError> {
        repo.base
            .join(&format!("/v2/{}/{rest}", repo.path))
            .map_err(|_| RegistryError::BadImage {
                image: repo.path.clone(),
            })
    }

    /// One request, and once more with a token when the registry asks for one.
    async fn send(
        &self,
        url: &Url,
        method: reqwest::Method,
        token: &mut Option<String>,
        repo: &Repository,
    ) -> Result<(Vec<u8>, HeaderMap), RegistryError> {
        for _ in 0..2 {
            let mut request = self
                .client
                .request(method.clone(), url.clone())
                .header(ACCEPT, MANIFEST_TYPES);
            if let Some(t) = token.as_ref() {
                request = request.header(AUTHORIZATION, format!("Bearer {t}"));
            }
            let response = request.send().await.map_err(|e| http_error(url, &e))?;
            let status = response.status();
            if status.as_u16() == 401 && token.is_none() {
                let challenge = response
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                if let Some(t) = self.token(url, challenge.as_deref(), repo).await? {
                    *token = Some(t);
                    continue;
                }
            }
            if !status.is_success() {
                return Err(RegistryError::Status {
                    url: url.to_string(),
                    status: status.as_u16(),
                    hint: hint(status.as_u16()),
                });
            }
            let headers = response.headers().clone();
            let body = bounded_body(url, response).await?;
            return Ok((body, headers));
        }
        Err(RegistryError::Status {
            url: url.to_string(),
            status: 401,
            hint: hint(401),
        })
    }

    /// An anonymous pull token from the realm of a `Bearer` challenge, if there is one.
    async fn token(
        &self,
        url: &Url,
        challenge: Option<&str>,
        repo: &Repository,
    ) -> Result<Option<String>, RegistryError> {
        let Some(params) = challenge.and_then(bearer_params) else {
            return Ok(None);
        };
        let Some(realm) = params.iter().find(|(k, _)| k == "realm").map(|(_, v)| v) else {
            return Ok(None);
        };
        let Ok(mut realm) = Url::parse(realm) else {
            return Ok(None);
        };
        // A realm over plain HTTP would carry the request in the clear; only a registry that
        // is itself plain HTTP may name one.
        if realm.scheme() != "https" && url.scheme() == "https" {
            return Ok(None);
        }
        {
            let mut query = realm.query_pairs_mut();
            if let Some((_, service)) = params.iter().find(|(k, _)| k == "service") {
                query.append_pair("service", service);
            }
            query.append_pair("scope", &format!("repository:{}:pull", repo.path));
        }
        let response = self
            .client
            .get(realm.clone())
            .send()
            .await
            .map_err(|e| http_error(&realm, &e))?;
        if !response.status().is_success() {
            return Err(RegistryError::Status {
                url: realm.to_string(),
                status: response.status().as_u16(),
                hint: " (the registry's token service refused an anonymous pull token)",
            });
        }
        let body = bounded_body(&realm, response).await?;
        let answer: TokenAnswer =
            serde_json::from_slice(&body).map_err(|e| RegistryError::NotTags {
                url: realm.to_string(),
                reason: e.to_string(),
            })?;
        Ok(answer.token.or(answer.access_token))
    }
}

#[derive(serde::Deserialize)]
struct TagList {
    /// Some registries answer `null` for a repository with no tags.
    #[serde(default)]
    tags: Option<Vec<String>>,
}

#[derive(serde::Deserialize)]
struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
}

fn hint(status: u16) -> &'static str {
    match status {
        401 | 403 => " (the repository is private: credentials for registries are not built yet)",
        404 => " (no such repository on the registry)",
        429 => " (rate limited; the next scan tries again)",
        _ => "",
    }
}

fn http_error(url: &Url, e: &reqwest::Error) -> RegistryError {
    RegistryError::Http {
        url: url.to_string(),
        reason: crate::net::explain_http(e).1,
    }
}

/// The body, or an error once it passes [`MAX_PAGE_BYTES`] (read no further).
async fn bounded_body(
    url: &Url,
    mut response: reqwest::Response,
) -> Result<Vec<u8>, RegistryError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| http_error(url, &e))? {
        if body.len() + chunk.len() > MAX_PAGE_BYTES {
            return Err(RegistryError::TooLarge {
                url: url.to_string(),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The next page from a `Link: </v2/…?last=…>; rel="next"` header, on the same registry only.
fn next_page(url: &Url, headers: &HeaderMap) -> Option<Url> {
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
fn bearer_params(challenge: &str) -> Option<Vec<(String, String)>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let both =
            "</v2/web/tags/list?last=a>; rel=\"prev\", </v2/web/tags/list?last=z>; rel=\"next\"";
        let next = next_page(&url, &headers(both)).unwrap();
        assert_eq!(next.query(), Some("last=z"));
    }

    #[test]
    fn a_bearer_challenge_is_read() {
        let p = bearer_params("Bearer realm=\"https://auth.example/token\",service=\"reg\",scope=\"repository:web:pull\"").unwrap();
        assert_eq!(p[0], ("realm".into(), "https://auth.example/token".into()));
        assert_eq!(p[1], ("service".into(), "reg".into()));
        assert_eq!(bearer_params("Basic realm=\"x\""), None);
    }
}
