//! What one revert or promotion job does: the Git writer (a revert commit, or the branch of a
//! pull request) and the host's pull request API (find, open, close). The queue that decides
//! which jobs to run is [`super::revert_loop`]'s.

use std::sync::Arc;

use super::promotion::Promotion;
use super::promotion_branch::PromotionPushed;
use super::pull_request::PullRequests;
use super::push::{BranchPushed, Pushed, StatusWriter, WriteError};
use super::revert::Revert;
use crate::api::RevertMode;

/// A rollout, by kind, namespace and name.
pub(super) type Key = (&'static str, String, String);

/// Work for the host or the branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Job {
    Revert(Revert),
    /// Close the rollout's open revert pull requests: Git moved on.
    Close,
    Promote(Promotion),
}

/// What one job did.
pub(super) enum Outcome {
    Committed(git2::Oid),
    /// Git no longer asks for the failed image.
    Unchanged,
    PullRequest {
        url: String,
        number: u64,
        opened: bool,
    },
    /// A promotion pull request merged by linnet (`autoMerge`).
    Merged {
        url: String,
    },
    /// A person closed this very pull request: not opened again.
    Declined,
    Closed(usize),
    Failed {
        label: &'static str,
        error: String,
        retry: bool,
    },
}

impl Outcome {
    pub(super) fn label(&self) -> &'static str {
        match self {
            Outcome::Committed(_) => "committed",
            Outcome::Unchanged => "unchanged",
            Outcome::PullRequest { opened: true, .. } => "pull_request_opened",
            Outcome::PullRequest { opened: false, .. } => "pull_request_found",
            Outcome::Declined => "pull_request_declined",
            Outcome::Merged { .. } => "pull_request_merged",
            Outcome::Closed(_) => "pull_request_closed",
            Outcome::Failed { label, .. } => label,
        }
    }
}

/// Makes reverts: the Git writer (moved into each blocking write and handed back, so no lock
/// is held while Git is waited for) and the host's pull request API.
pub(super) struct Reverter {
    pub(super) open:
        Arc<dyn Fn() -> Result<StatusWriter, crate::source::git::GitError> + Send + Sync>,
    pub(super) writer: Option<StatusWriter>,
    pub(super) host: Option<PullRequests>,
    /// `--promotion-auto-merge`: a promotion with `autoMerge` is merged once opened.
    pub(super) auto_merge: bool,
    /// This cluster's name, unless it has none (`--cluster`): its revert branches carry it.
    pub(super) cluster: Option<String>,
}

impl Reverter {
    /// Runs `f` on the writer (opened if need be) on a blocking thread.
    async fn with_writer<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut StatusWriter) -> Result<T, WriteError> + Send + 'static,
    ) -> Result<T, WriteError> {
        let current = self.writer.take();
        let open = self.open.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mut w = match current {
                Some(w) => w,
                None => open()?,
            };
            let result = f(&mut w);
            Ok::<_, WriteError>((w, result))
        })
        .await;
        match done {
            Ok(Ok((w, result))) => {
                self.writer = Some(w);
                result
            }
            Ok(Err(e)) => Err(e),
            Err(e) => Err(WriteError::Panicked(e.to_string())),
        }
    }

    pub(super) async fn run(&mut self, key: &Key, job: &Job) -> Outcome {
        match job {
            Job::Revert(r) if r.mode == RevertMode::Commit => self.revert_commit(r).await,
            Job::Revert(r) => self.revert_pull_request(r).await,
            Job::Promote(p) => self.promotion_pull_request(key, p).await,
            Job::Close => match &self.host {
                Some(host) => {
                    let prefix =
                        super::revert::branch_prefix(self.cluster.as_deref(), &key.1, &key.2);
                    match host.open_with_prefix(&prefix).await {
                        Ok(open) => close_listed(host, &open, None).await,
                        Err(e) => pr_failed(e),
                    }
                }
                None => Outcome::Closed(0),
            },
        }
    }

    /// A revert committed straight to the branch.
    async fn revert_commit(&mut self, r: &Revert) -> Outcome {
        let r = r.clone();
        match self.with_writer(move |w| w.revert(&r)).await {
            Ok(Pushed::Committed { commit, .. }) => Outcome::Committed(commit),
            Ok(Pushed::Unchanged) => Outcome::Unchanged,
            Err(e) => write_failed(e),
        }
    }

    /// A revert pushed to its own branch, and the pull request that proposes it.
    async fn revert_pull_request(&mut self, r: &Revert) -> Outcome {
        if self.host.is_none() {
            return no_host();
        }
        let (rev, branch) = (r.clone(), r.branch());
        let pushed = {
            let branch = branch.clone();
            self.with_writer(move |w| {
                let base = w.branch().to_string();
                w.push_revert_branch(&rev, &branch).map(|p| (p, base))
            })
            .await
        };
        let base = match pushed {
            Ok((BranchPushed::NotNeeded, _)) => return Outcome::Unchanged,
            Ok((_, base)) => base,
            Err(e) => return write_failed(e),
        };
        let change = Proposal {
            prefix: r.branch_prefix(),
            branch,
            base,
            title: r.title(),
            body: r.body(),
        };
        match &self.host {
            Some(host) => pull_request(host, &change).await,
            None => Outcome::Unchanged,
        }
    }

    /// A promotion pushed to its own branch, its pull request, and its merge when both the
    /// rollout and this agent allow it.
    async fn promotion_pull_request(&mut self, key: &Key, p: &Promotion) -> Outcome {
        if self.host.is_none() {
            return no_host();
        }
        let (promotion, branch) = (p.clone(), p.branch());
        let pushed = {
            let branch = branch.clone();
            self.with_writer(move |w| w.push_promotion_branch(&promotion, &branch))
                .await
        };
        let (edit, base, carried) = match pushed {
            Ok(PromotionPushed {
                pushed: BranchPushed::NotNeeded,
                ..
            })
            | Ok(PromotionPushed { edit: None, .. }) => return Outcome::Unchanged,
            Ok(PromotionPushed {
                edit: Some(edit),
                base,
                carried,
                ..
            }) => (edit, base, carried),
            Err(e) => return write_failed(e),
        };
        let change = Proposal {
            prefix: p.branch_prefix(),
            branch,
            base,
            title: p.title(),
            body: p.body(&edit, &carried),
        };
        let Some(host) = &self.host else {
            return Outcome::Unchanged;
        };
        match pull_request(host, &change).await {
            Outcome::PullRequest { url, number, .. } if p.auto_merge && self.auto_merge => {
                match host.merge(number, &p.title()).await {
                    Ok(()) => Outcome::Merged { url },
                    Err(e) => pr_failed(e),
                }
            }
            outcome @ Outcome::PullRequest { opened: true, .. } if p.auto_merge => {
                tracing::warn!(rollout = %format!("{}/{}", key.1, key.2), "promoteTo.autoMerge is set, but this agent runs without --promotion-auto-merge: the pull request waits for a person");
                outcome
            }
            outcome => outcome,
        }
    }
}

/// A write to Git that failed; retried when another try may succeed.
fn write_failed(e: WriteError) -> Outcome {
    Outcome::Failed {
        label: e.label(),
        retry: matches!(
            e,
            WriteError::Git(_) | WriteError::KeptMoving { .. } | WriteError::Panicked(_)
        ),
        error: e.to_string(),
    }
}

fn no_host() -> Outcome {
    Outcome::Failed {
        label: "no_host",
        error: "a pull request needs the Git host's API: set --commit-status-provider, \
                --commit-status-api-url, --commit-status-repo and --commit-status-token-file"
            .into(),
        retry: false,
    }
}

/// A pull request to have open: from `branch` into `base`; the others under `prefix` (the
/// same rollout's, for an earlier failure or image) are closed.
pub struct Proposal {
    /// linnet's other pull requests from branches with this prefix are closed.
    pub prefix: String,
    pub branch: String,
    pub base: String,
    pub title: String,
    pub body: String,
}

/// Finds the open pull request of `change` or opens it; closes the rollout's others.
pub(super) async fn pull_request(host: &PullRequests, change: &Proposal) -> Outcome {
    let branch = change.branch.as_str();
    let open = match host.open_with_prefix(&change.prefix).await {
        Ok(open) => open,
        Err(e) => return pr_failed(e),
    };
    if let Outcome::Failed {
        label,
        error,
        retry,
    } = close_listed(host, &open, Some(branch)).await
    {
        return Outcome::Failed {
            label,
            error,
            retry,
        };
    }
    if let Some((_, pr)) = open.iter().find(|(b, _)| b == branch) {
        return Outcome::PullRequest {
            url: pr.url.clone(),
            number: pr.number,
            opened: false,
        };
    }
    // A person closed it (before a restart, say): not opened again.
    match host.closed_from(branch).await {
        Ok(true) => return Outcome::Declined,
        Ok(false) => {}
        Err(e) => return pr_failed(e),
    }
    match host
        .open(branch, &change.base, &change.title, &change.body)
        .await
    {
        Ok(pr) => Outcome::PullRequest {
            url: pr.url,
            number: pr.number,
            opened: true,
        },
        Err(e) => pr_failed(e),
    }
}

/// Closes the listed open pull requests, but the one from `keep`.
async fn close_listed(
    host: &PullRequests,
    open: &[(String, super::pull_request::PullRequest)],
    keep: Option<&str>,
) -> Outcome {
    let mut closed = 0;
    for (branch, pr) in open.iter().filter(|(b, _)| Some(b.as_str()) != keep) {
        if let Err(e) = host.close(pr.number).await {
            return pr_failed(e);
        }
        tracing::info!(url = %pr.url, %branch, "closed a pull request of linnet's: Git moved on");
        closed += 1;
    }
    Outcome::Closed(closed)
}

fn pr_failed(e: super::pull_request::PullRequestError) -> Outcome {
    Outcome::Failed {
        label: e.label(),
        retry: e.retryable(),
        error: e.to_string(),
    }
}
