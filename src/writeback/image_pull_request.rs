//! Image automation by pull request (issue 74, `ImagePolicy.spec.pullRequest`): the scan's
//! changes for such policies go to a branch of their own and a pull request on the Git host,
//! merged by the agent only when the policy asks (`autoMerge`) and the agent allows it
//! (`--image-automation-auto-merge`).
//!
//! Restart-safe by naming: the branch is `linnet/images/<base>/<hash of the picks>`, so the
//! same picks after a `kill -9` find the same branch (never pushed twice, never forced) and
//! its open pull request; a newer pick is a new branch, and linnet's older image pull
//! requests into that base are closed. One a person closed is not opened again.

use std::collections::BTreeMap;

use super::image_update::{Changes, Reason, commit_message};
use super::pull_request::PullRequests;
use super::push::{PushResult, StatusWriter, WriteError};
use super::reverter::{Outcome, Proposal, pull_request};

/// Every image pull request's branch starts with this, then `<base>/`.
pub const BRANCH_PREFIX: &str = "linnet/images/";

/// The branch pushed for a proposal, and what its pull request says.
#[derive(Clone, Debug)]
pub struct ImageBranch {
    pub branch: String,
    /// The followed branch: the pull request's base.
    pub base: String,
    pub title: String,
    pub body: String,
    pub changes: Changes,
    /// Pushed now (`false`: it was there, from before a restart or an earlier scan).
    pub pushed: bool,
}

/// What became of a proposal on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proposed {
    Opened {
        url: String,
        number: u64,
    },
    /// Open since an earlier scan (or before a restart).
    Found {
        url: String,
        number: u64,
    },
    /// Merged by the agent (`autoMerge`, allowed by the agent).
    Merged {
        url: String,
    },
    /// A person closed this very pull request: it is not opened again.
    Declined,
}

/// Why an image pull request was not proposed.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    #[error(
        "{policies} ask for pull requests, which need the Git host's API: set \
         --commit-status-provider, --commit-status-api-url, --commit-status-repo and \
         --commit-status-token-file"
    )]
    NoHost { policies: String },
    #[error("pull request: {0}")]
    Git(#[from] WriteError),
    #[error("pull request: {0}")]
    Host(String),
    #[error("cannot merge {url}: {source}")]
    Merge {
        url: String,
        source: super::pull_request::PullRequestError,
    },
}

/// The branch of a proposal of `picks` (keyed by the markers' policy names) into `base`.
pub fn branch_name(base: &str, reasons: &BTreeMap<String, Reason>) -> String {
    let picks: Vec<serde_json::Value> = reasons
        .iter()
        .map(|(name, r)| {
            serde_json::Value::String(format!(
                "{name}={}:{}@{}",
                r.pick.image,
                r.pick.tag,
                r.digest.as_deref().unwrap_or_default()
            ))
        })
        .collect();
    let hash = crate::hash::content_hash(&serde_json::Value::Array(picks));
    format!("{}{hash}", base_prefix(base))
}

/// The start of every image branch into `base`.
pub fn base_prefix(base: &str) -> String {
    format!("{BRANCH_PREFIX}{base}/")
}

impl StatusWriter {
    /// Sets every marked line of `reasons`' policies at `tip` (the followed branch's, as this
    /// scan fetched it: not fetched again) on a branch of its own; `None` when every line
    /// already has its pick.
    pub fn push_image_branch(
        &mut self,
        tip: git2::Oid,
        reasons: &BTreeMap<String, Reason>,
    ) -> Result<Option<ImageBranch>, WriteError> {
        self.mirror.set_deadline(self.timeout);
        let picks = reasons
            .iter()
            .map(|(k, r)| (k.clone(), r.pick.clone()))
            .collect();
        let (Some(commit), changes) = self.image_commit(tip, &picks, reasons)? else {
            return Ok(None);
        };
        let base = self.branch().to_string();
        let branch = branch_name(&base, reasons);
        let pushed = matches!(self.push_to(&branch, commit, None)?, PushResult::Done);
        let message = commit_message(&changes, reasons);
        let (title, body) = message
            .split_once("\n\n")
            .map_or((message.as_str(), ""), |(t, b)| (t, b));
        Ok(Some(ImageBranch {
            title: title.to_string(),
            body: format!(
                "{}\n\nOpened by linnet's image automation. A newer pick replaces this pull \
                 request; closing it keeps these tags out until a newer one is pushed.",
                body.trim_end()
            ),
            branch,
            base,
            changes,
            pushed,
        }))
    }
}

/// Finds or opens the pull request of `branch` (closing linnet's older image pull requests
/// into the same base), and merges it when `merge`.
pub async fn propose(
    host: &PullRequests,
    branch: &ImageBranch,
    merge: bool,
) -> Result<Proposed, ProposeError> {
    let proposal = Proposal {
        prefix: base_prefix(&branch.base),
        branch: branch.branch.clone(),
        base: branch.base.clone(),
        title: branch.title.clone(),
        body: branch.body.clone(),
    };
    propose_branch(host, &proposal, merge).await
}

/// Finds or opens the pull request of a pushed branch (closing linnet's older ones under the
/// same prefix), and merges it when `merge`: an image pick's or a dashboard action's.
pub async fn propose_branch(
    host: &PullRequests,
    proposal: &Proposal,
    merge: bool,
) -> Result<Proposed, ProposeError> {
    host.forget_lists();
    let (url, number, opened) = match pull_request(host, proposal).await {
        Outcome::PullRequest {
            url,
            number,
            opened,
        } => (url, number, opened),
        Outcome::Declined => return Ok(Proposed::Declined),
        Outcome::Failed { error, .. } => return Err(ProposeError::Host(error)),
        other => {
            return Err(ProposeError::Host(format!(
                "unexpected outcome {}",
                other.label()
            )));
        }
    };
    if merge {
        return match host.merge(number, &proposal.title).await {
            Ok(()) => Ok(Proposed::Merged { url }),
            Err(source) => Err(ProposeError::Merge { url, source }),
        };
    }
    Ok(if opened {
        Proposed::Opened { url, number }
    } else {
        Proposed::Found { url, number }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writeback::image_markers::Pick;

    fn reason(tag: &str, digest: Option<&str>) -> Reason {
        Reason {
            pick: Pick {
                image: "reg.example/web".into(),
                tag: tag.into(),
                pinned: None,
            },
            digest: digest.map(str::to_string),
            policy: "ImagePolicy web (policies/web.yaml)".into(),
            pull_request: Some(Default::default()),
        }
    }

    #[test]
    fn the_same_picks_name_the_same_branch_and_a_new_pick_another() {
        let one = BTreeMap::from([("web".to_string(), reason("1.1.0", Some("sha256:aa")))]);
        let again = BTreeMap::from([("web".to_string(), reason("1.1.0", Some("sha256:aa")))]);
        let newer = BTreeMap::from([("web".to_string(), reason("1.2.0", Some("sha256:bb")))]);
        let moved = BTreeMap::from([("web".to_string(), reason("1.1.0", Some("sha256:cc")))]);
        assert_eq!(branch_name("main", &one), branch_name("main", &again));
        assert_ne!(branch_name("main", &one), branch_name("main", &newer));
        assert_ne!(branch_name("main", &one), branch_name("main", &moved));
        assert!(branch_name("main", &one).starts_with("linnet/images/main/"));
        assert_ne!(branch_name("main", &one), branch_name("prod", &one));
    }
}
