//! The dashboard's flags (`--dashboard-listen`, `--trace-link`, `--commit-link`,
//! `--dashboard-actions`, `--dashboard-merge`) made into its configuration, with a usage error
//! for an action that could not work.

use std::sync::Arc;

use super::*;
use crate::runtime::dashboard::{ActionsConfig, DashboardConfig, Links, commit_link};
use crate::writeback::commit_status::CommitStatusConfig;
use crate::writeback::signing::CommitSigner;

/// The dashboard's configuration.
pub(super) fn dashboard(
    args: &AgentArgs,
    source: &crate::agent::SourceConfig,
    signer: &Option<Arc<CommitSigner>>,
    host: &Option<CommitStatusConfig>,
) -> Result<DashboardConfig> {
    Ok(DashboardConfig {
        listen: args.dashboard_listen,
        links: links(args),
        actions: actions(args, source, signer.clone(), host.clone())?,
    })
}

/// The dashboard's links: `--trace-link`, and `--commit-link` or one made from `--repo-url`.
fn links(args: &AgentArgs) -> Links {
    Links {
        trace: args.trace_link.clone(),
        commit: commit_link(
            args.commit_link.as_deref(),
            args.repo_url.as_deref(),
            args.commit_status_provider,
        ),
    }
}

/// The dashboard's actions (`--dashboard-actions`): pull requests on the Git host, from a
/// clone of their own.
fn actions(
    args: &AgentArgs,
    source: &crate::agent::SourceConfig,
    signer: Option<Arc<CommitSigner>>,
    host: Option<CommitStatusConfig>,
) -> Result<Option<ActionsConfig>> {
    if !args.dashboard_actions {
        if args.dashboard_merge {
            return Err(Error::Usage(
                "--dashboard-merge needs --dashboard-actions".into(),
            ));
        }
        return Ok(None);
    }
    let needs = |what: &str| Error::Usage(format!("--dashboard-actions needs {what}"));
    if args.dashboard_listen.is_none() {
        return Err(needs("--dashboard-listen: the dashboard they are on"));
    }
    let crate::agent::SourceConfig::Remote { remote, cache_dir } = source else {
        return Err(needs(
            "--repo-url: each action is a pull request in the repository",
        ));
    };
    let host = host.ok_or_else(|| {
        needs(
            "the Git host's API for its pull requests: --commit-status-provider, \
             --commit-status-api-url, --commit-status-repo and --commit-status-token-file",
        )
    })?;
    Ok(Some(ActionsConfig {
        writer: crate::runtime::writer_slot::WriterSettings {
            remote: remote.clone(),
            cache_dir: crate::runtime::config::sibling_dir(cache_dir, "actions"),
            author_name: args.git_author_name.clone(),
            author_email: args.git_author_email.clone(),
            signer,
            timeout: args.git_timeout,
        },
        host,
        merge: args.dashboard_merge,
    }))
}
