//! Build times for `newestBuild` (issue 74): when the image a tag points at was built, from
//! its config's `created`, through the manifest (an index's `linux/amd64` entry, else its
//! first) and the config blob. A digest's config never changes, so each is read once and kept
//! by digest; a scan then costs one `HEAD` per tag. A blob the registry redirects to its
//! storage (Docker Hub and GHCR do) is read there without the registry's credentials.

use super::{Registry, RegistryError, Repository, bounded_body, http_error};

use url::Url;

/// Tags whose build time is read at one scan; past it the greatest tags are kept (and said).
pub const MAX_BUILD_TIME_TAGS: usize = 200;
/// Build times kept, by manifest digest.
const MAX_KEPT: usize = 10_000;

#[derive(serde::Deserialize)]
struct Manifest {
    #[serde(default)]
    manifests: Option<Vec<Entry>>,
    #[serde(default)]
    config: Option<Descriptor>,
}

#[derive(serde::Deserialize)]
struct Entry {
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(serde::Deserialize)]
struct Platform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
}

#[derive(serde::Deserialize)]
struct Descriptor {
    digest: String,
}

#[derive(serde::Deserialize)]
struct ImageConfig {
    #[serde(default)]
    created: Option<String>,
}

impl Registry {
    /// When the image `tag` points at was built (`None` when its config does not say).
    pub async fn build_time(
        &self,
        repo: &Repository,
        tag: &str,
    ) -> Result<Option<jiff::Timestamp>, RegistryError> {
        let digest = self.digest(repo, tag).await?;
        let kept = self.built.lock().ok().and_then(|b| b.get(&digest).copied());
        if let Some(at) = kept {
            return Ok(at);
        }
        let at = self.read_created(repo, &digest).await?;
        if let Ok(mut built) = self.built.lock() {
            if built.len() >= MAX_KEPT {
                built.clear();
            }
            built.insert(digest, at);
        }
        Ok(at)
    }

    async fn read_created(
        &self,
        repo: &Repository,
        digest: &str,
    ) -> Result<Option<jiff::Timestamp>, RegistryError> {
        let mut auth = None;
        let mut read_from = format!("manifests/{digest}");
        let mut manifest: Manifest = self.get_json(repo, &read_from, &mut auth).await?;
        if let Some(entries) = &manifest.manifests {
            let linux_amd64 = entries.iter().find(|e| {
                e.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
            });
            let Some(entry) = linux_amd64.or(entries.first()) else {
                return Ok(None);
            };
            let path = format!(
                "manifests/{}",
                checked_digest(&entry.digest, repo, &read_from)?
            );
            manifest = self.get_json(repo, &path, &mut auth).await?;
            read_from = path;
        }
        let Some(config) = manifest.config else {
            return Ok(None);
        };
        let path = format!(
            "blobs/{}",
            checked_digest(&config.digest, repo, &read_from)?
        );
        let config: ImageConfig = self.get_json(repo, &path, &mut auth).await?;
        Ok(config.created.and_then(|c| c.parse().ok()))
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        repo: &Repository,
        path: &str,
        auth: &mut Option<String>,
    ) -> Result<T, RegistryError> {
        let url = self.url(repo, path)?;
        let (body, _) = self.send(&url, reqwest::Method::GET, auth, repo).await?;
        serde_json::from_slice(&body).map_err(|e| RegistryError::BadAnswer {
            url: url.to_string(),
            reason: e.to_string(),
        })
    }

    /// A blob the registry redirected to `location`: read there once, without credentials,
    /// over HTTPS unless the registry itself is plain HTTP, at most `MAX_PAGE_BYTES`.
    pub(super) async fn redirected_blob(
        &self,
        url: &Url,
        location: Option<&str>,
    ) -> Result<Vec<u8>, RegistryError> {
        let bad = |reason: &str| RegistryError::BadAnswer {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let target = location
            .and_then(|l| url.join(l).ok())
            .ok_or_else(|| bad("a redirect with no usable Location"))?;
        if target.scheme() != "https" && url.scheme() == "https" {
            return Err(bad("a redirect from HTTPS to plain HTTP"));
        }
        self.pace(&target).await;
        let response = self
            .client
            .get(target.clone())
            .send()
            .await
            .map_err(|e| http_error(&target, &e))?;
        if !response.status().is_success() {
            return Err(RegistryError::Status {
                url: target.to_string(),
                status: response.status().as_u16(),
                hint: "",
            });
        }
        bounded_body(&target, response).await
    }
}

/// `sha256:` and 64 hex digits: a digest from the registry's answer (at `read_from`, under
/// the repository) goes into a URL path.
pub(super) fn checked_digest<'a>(
    digest: &'a str,
    repo: &Repository,
    read_from: &str,
) -> Result<&'a str, RegistryError> {
    let ok = digest
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then_some(digest)
        .ok_or_else(|| RegistryError::BadAnswer {
            url: format!("{}v2/{}/{read_from}", repo.base, repo.path),
            reason: format!(
                "{:?} is not a sha256 digest",
                digest.get(..80).unwrap_or(digest)
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sha256_digest_goes_into_a_path() {
        let good = format!("sha256:{}", "a".repeat(64));
        let repo = Repository::parse("reg.example/web", false).unwrap();
        assert!(checked_digest(&good, &repo, "manifests/1.0").is_ok());
        for bad in [
            "sha256:../../x",
            "md5:abc",
            "",
            &format!("sha256:{}/", "a".repeat(63)),
        ] {
            let e = checked_digest(bad, &repo, "manifests/1.0").unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("https://reg.example/v2/web/manifests/1.0: "),
                "{e}"
            );
        }
    }
}
