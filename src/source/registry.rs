//! The registry scanner (issue 74): a repository's tags and a tag's digest, read through the
//! OCI distribution API (`/v2/<name>/tags/list`, `HEAD /v2/<name>/manifests/<tag>`). Whoever
//! can push an image controls what comes back, so every answer is bounded: bytes per page
//! ([`MAX_PAGE_BYTES`]), pages ([`MAX_PAGES`]) and tags ([`MAX_TAGS`]), each request by the
//! client's timeout and the whole listing by a deadline. A `Link` to the next page is followed
//! only on the same registry, and a token is asked for only from the realm a registry names.
//! Credentials (`--registry-credentials`, [`super::registry_auth`]) go only to the registry
//! host they are for, over HTTPS. Requests to one registry are spaced (`--registry-rate`), and
//! a 429's `Retry-After` is kept for the caller's backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::registry_auth::{Credential, RegistryCredentials};

mod build_time;
mod headers;
mod signatures;
pub use build_time::MAX_BUILD_TIME_TAGS;
use headers::{bearer_params, next_page};
pub use signatures::{CosignKeys, KeyError, Signed};

use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderMap, WWW_AUTHENTICATE};
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
    #[error("{url}: the answer is not what the distribution API gives: {reason}")]
    BadAnswer { url: String, reason: String },
    #[error("listing {image} took longer than {deadline:?}")]
    Deadline { image: String, deadline: Duration },
    #[error("{url} answered 429 (rate limited){}", retry_after.map(|d| format!("; it asked to wait {}s", d.as_secs())).unwrap_or_default())]
    RateLimited {
        url: String,
        retry_after: Option<Duration>,
    },
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
            RegistryError::BadAnswer { .. } => "bad_answer",
            RegistryError::Deadline { .. } => "deadline",
            RegistryError::RateLimited { .. } => "rate_limited",
        }
    }

    /// Whether the registry itself is failing or limiting us (not the policy's fault): its
    /// requests then wait, longer each time ([`crate::retry`]), at least as long as it asked.
    pub fn registry_fault(&self) -> Option<Duration> {
        match self {
            RegistryError::RateLimited { retry_after, .. } => Some(retry_after.unwrap_or_default()),
            RegistryError::Http { .. } | RegistryError::Deadline { .. } => Some(Duration::ZERO),
            RegistryError::Status { status, .. } if *status >= 500 => Some(Duration::ZERO),
            _ => None,
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

    /// The registry's `host` or `host:port`: what credentials, spacing and backoff go by.
    pub fn host(&self) -> String {
        url_host(&self.base)
    }
}

fn url_host(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host,
    }
}

/// Reads tag lists and digests with one HTTP client (the agent's roots and `--ca-file`).
pub struct Registry {
    client: reqwest::Client,
    credentials: Mutex<Arc<RegistryCredentials>>,
    /// The least time between two requests to one registry host.
    spacing: Duration,
    /// When each host may next be asked.
    next_request: Mutex<HashMap<String, Instant>>,
    /// Build times by manifest digest (`newestBuild`).
    built: Mutex<HashMap<String, Option<jiff::Timestamp>>>,
    /// Digests found signed, with the keys' fingerprint (`verify.cosign`).
    signed: Mutex<std::collections::HashSet<String>>,
}

impl Registry {
    /// `client` should follow no redirects: a `Link` or a realm is checked before it is used.
    /// `spacing`: the least time between two requests to one registry.
    pub fn new(client: reqwest::Client, spacing: Duration) -> Registry {
        Registry {
            client,
            credentials: Mutex::default(),
            spacing,
            next_request: Mutex::default(),
            built: Mutex::default(),
            signed: Mutex::default(),
        }
    }

    /// The credentials used from now on (read again at each scan).
    pub fn set_credentials(&self, credentials: RegistryCredentials) {
        if let Ok(mut c) = self.credentials.lock() {
            *c = Arc::new(credentials);
        }
    }

    /// The credential for `url`'s host: never over plain HTTP.
    fn credential(&self, url: &Url) -> Option<Credential> {
        if url.scheme() != "https" {
            return None;
        }
        let credentials = self.credentials.lock().ok()?.clone();
        credentials.for_host(&url_host(url)).cloned()
    }

    /// Waits until `url`'s host may be asked again (no lock is held while waiting).
    async fn pace(&self, url: &Url) {
        let now = Instant::now();
        let wait = {
            let Ok(mut next) = self.next_request.lock() else {
                return;
            };
            let slot = next.entry(url_host(url)).or_insert(now);
            let at = (*slot).max(now);
            *slot = at + self.spacing;
            at - now
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
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
        let mut auth: Option<String> = None;
        let mut tags = Vec::new();
        for _ in 0..MAX_PAGES {
            let left = deadline.checked_sub(start.elapsed()).ok_or_else(late)?;
            let page =
                tokio::time::timeout(left, self.send(&url, reqwest::Method::GET, &mut auth, repo))
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
        let mut auth = None;
        let (_, headers) = self
            .send(&url, reqwest::Method::HEAD, &mut auth, repo)
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

    /// One request, and once more with credentials or a token when the registry asks for
    /// them. `auth` is the `Authorization` value that worked, kept for the next page.
    async fn send(
        &self,
        url: &Url,
        method: reqwest::Method,
        auth: &mut Option<String>,
        repo: &Repository,
    ) -> Result<(Vec<u8>, HeaderMap), RegistryError> {
        let credential = self.credential(url);
        if let (None, Some(c @ Credential::Bearer { .. })) = (auth.as_ref(), &credential) {
            *auth = Some(c.header());
        }
        let mut asked = false;
        loop {
            self.pace(url).await;
            let mut request = self
                .client
                .request(method.clone(), url.clone())
                .header(ACCEPT, MANIFEST_TYPES);
            if let Some(a) = auth.as_ref() {
                request = request.header(AUTHORIZATION, a);
            }
            let response = request.send().await.map_err(|e| http_error(url, &e))?;
            let status = response.status().as_u16();
            if status == 401 && !asked {
                asked = true;
                let challenge = response
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let answer = self
                    .answer(url, challenge.as_deref(), repo, credential.as_ref())
                    .await?;
                if let Some(a) = answer {
                    *auth = Some(a);
                    continue;
                }
            }
            if response.status().is_redirection() && url.path().contains("/blobs/") {
                let location = response.headers().get(reqwest::header::LOCATION);
                let location = location.and_then(|l| l.to_str().ok()).map(str::to_string);
                let body = self.redirected_blob(url, location.as_deref()).await?;
                return Ok((body, HeaderMap::new()));
            }
            if status == 429 {
                return Err(RegistryError::RateLimited {
                    url: url.to_string(),
                    retry_after: retry_after(response.headers()),
                });
            }
            if !response.status().is_success() {
                return Err(RegistryError::Status {
                    url: url.to_string(),
                    status,
                    hint: hint(status, credential.is_some()),
                });
            }
            let headers = response.headers().clone();
            let body = bounded_body(url, response).await?;
            return Ok((body, headers));
        }
    }

    /// What answers a registry's 401: its credential for a `Basic` challenge, or a token from
    /// the realm of a `Bearer` one (asked with the credential when there is one).
    async fn answer(
        &self,
        url: &Url,
        challenge: Option<&str>,
        repo: &Repository,
        credential: Option<&Credential>,
    ) -> Result<Option<String>, RegistryError> {
        let basic =
            challenge.is_some_and(|c| c.get(..6).is_some_and(|s| s.eq_ignore_ascii_case("basic ")));
        match credential {
            Some(c @ Credential::Basic { .. }) if basic => return Ok(Some(c.header())),
            _ if basic => return Ok(None),
            _ => {}
        }
        let token = self.token(url, challenge, repo, credential).await?;
        Ok(token.map(|t| format!("Bearer {t}")))
    }

    /// A pull token from the realm of a `Bearer` challenge, if there is one: asked with the
    /// registry's credential when there is one (over HTTPS only), else anonymously.
    async fn token(
        &self,
        url: &Url,
        challenge: Option<&str>,
        repo: &Repository,
        credential: Option<&Credential>,
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
        let mut request = self.client.get(realm.clone());
        let basic = credential.filter(|c| matches!(c, Credential::Basic { .. }));
        if let Some(c) = basic.filter(|_| realm.scheme() == "https") {
            request = request.header(AUTHORIZATION, c.header());
        }
        self.pace(&realm).await;
        let response = request.send().await.map_err(|e| http_error(&realm, &e))?;
        if !response.status().is_success() {
            return Err(RegistryError::Status {
                url: realm.to_string(),
                status: response.status().as_u16(),
                hint: if basic.is_some() {
                    " (the registry's token service refused the credentials of --registry-credentials)"
                } else {
                    " (the registry's token service refused an anonymous pull token: give credentials in --registry-credentials)"
                },
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

fn hint(status: u16, had_credential: bool) -> &'static str {
    match status {
        401 | 403 if had_credential => {
            " (the credentials for this registry in --registry-credentials were refused)"
        }
        401 | 403 => {
            " (the repository is private: give credentials for its host in --registry-credentials)"
        }
        404 => " (no such repository on the registry)",
        _ => "",
    }
}

/// A `Retry-After` in seconds (an HTTP date is not read), at most an hour.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs.min(3600)))
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

#[cfg(test)]
mod tests;
