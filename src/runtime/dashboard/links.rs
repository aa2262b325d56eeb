//! Where the dashboard links out: a trace in the tracing UI (`--trace-link`) and a commit on
//! the Git host (`--commit-link`, else made from an http(s) `--repo-url`).

use crate::writeback::commit_status::Provider;

/// The dashboard's link templates, each with its placeholder.
#[derive(Clone, Debug, Default)]
pub struct Links {
    /// `{traceId}` filled in.
    pub trace: Option<String>,
    /// `{commit}` filled in.
    pub commit: Option<String>,
}

/// The link to a commit of `repo_url` on its Git host, `{commit}` to fill in: `given` when
/// set, else made from an http(s) address (its credentials dropped) in the host's form:
/// GitLab's `/-/commit/`, Bitbucket's `/commits/`, and `/commit/` (GitHub, Gitea, Forgejo).
/// `None` for an ssh or file address, where the host's web address is not known.
pub fn commit_link(
    given: Option<&str>,
    repo_url: Option<&str>,
    provider: Option<Provider>,
) -> Option<String> {
    if let Some(link) = given {
        return Some(link.to_string());
    }
    let mut url = url::Url::parse(repo_url?).ok()?;
    if !matches!(url.scheme(), "https" | "http") {
        return None;
    }
    url.set_username("").ok()?;
    url.set_password(None).ok()?;
    url.set_query(None);
    url.set_fragment(None);
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    let provider = provider.or(if host.contains("gitlab") {
        Some(Provider::Gitlab)
    } else if host == "bitbucket.org" {
        Some(Provider::Bitbucket)
    } else {
        None
    });
    let base = url.as_str().trim_end_matches('/');
    let base = base.strip_suffix(".git").unwrap_or(base);
    let path = match provider {
        Some(Provider::Gitlab) => "/-/commit/{commit}",
        Some(Provider::Bitbucket) => "/commits/{commit}",
        _ => "/commit/{commit}",
    };
    Some(format!("{base}{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_link_wins() {
        assert_eq!(
            commit_link(
                Some("https://git.example/c/{commit}"),
                Some("https://github.com/a/b.git"),
                None
            )
            .as_deref(),
            Some("https://git.example/c/{commit}")
        );
    }

    #[test]
    fn each_host_gets_its_form() {
        let cases = [
            (
                "https://github.com/acme/gitops.git",
                None,
                "https://github.com/acme/gitops/commit/{commit}",
            ),
            (
                "https://gitlab.com/acme/gitops.git",
                None,
                "https://gitlab.com/acme/gitops/-/commit/{commit}",
            ),
            (
                "https://bitbucket.org/acme/gitops.git",
                None,
                "https://bitbucket.org/acme/gitops/commits/{commit}",
            ),
            (
                "https://git.corp/acme/gitops/",
                Some(Provider::Gitlab),
                "https://git.corp/acme/gitops/-/commit/{commit}",
            ),
            (
                "https://gitea.corp:3000/acme/gitops",
                Some(Provider::Gitea),
                "https://gitea.corp:3000/acme/gitops/commit/{commit}",
            ),
            (
                "http://127.0.0.1:3000/acme/gitops.git",
                None,
                "http://127.0.0.1:3000/acme/gitops/commit/{commit}",
            ),
        ];
        for (repo, provider, want) in cases {
            assert_eq!(
                commit_link(None, Some(repo), provider).as_deref(),
                Some(want),
                "{repo}"
            );
        }
    }

    /// Regression: a token in the repository address must never reach the page.
    #[test]
    fn credentials_in_the_repository_address_are_dropped() {
        let link = commit_link(
            None,
            Some("https://x-access-token:ghp_secret@github.com/acme/gitops.git?t=1#f"),
            None,
        )
        .unwrap();
        assert_eq!(link, "https://github.com/acme/gitops/commit/{commit}");
        assert!(!link.contains("secret"));
    }

    #[test]
    fn no_web_address_is_guessed_for_ssh_or_file() {
        for repo in [
            "git@github.com:acme/gitops.git",
            "ssh://git@github.com/acme/gitops.git",
            "file:///srv/gitops",
            "not a url",
        ] {
            assert_eq!(commit_link(None, Some(repo), None), None, "{repo}");
        }
        assert_eq!(commit_link(None, None, None), None);
    }
}
