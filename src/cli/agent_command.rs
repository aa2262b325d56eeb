//! `linnet agent`: the flags made into an [`crate::agent::AgentConfig`], a checked client, and the
//! run.

use super::*;
use std::sync::Arc;

pub(super) async fn agent(args: AgentArgs) -> Result<ExitCode> {
    check_before_start(&args)?;
    let config = agent_config(&args)?;
    // Writes stop at the Lease's renew deadline ([`crate::kube_client::fence`]).
    let fence = config.leader.as_ref().map(|l| {
        let (duration, grace) = crate::kube_client::fence::lease_timing(l.duration);
        let fence = std::sync::Arc::new(crate::kube_client::fence::Fence::new(
            &l.namespace,
            &l.name,
            duration,
            grace,
        ));
        crate::kube_client::fence::install(fence.clone());
        fence
    });
    let (kube_config, client) =
        crate::kube_client::connect_fenced(&args.cluster.target(), fence).await?;
    crate::kube_client::check_crds(&client).await?;
    crate::agent::run(config, client, kube_config).await?;
    Ok(ExitCode::SUCCESS)
}

/// What stops the start rather than every webhook, status or revision later: the webhook
/// secret, a CA rustls does not take, signing keys that do not read, a liveness deadline
/// shorter than a waiting loop's beat.
fn check_before_start(args: &AgentArgs) -> Result<()> {
    if let Some(file) = &args.webhook_secret_file {
        crate::source::hooks::read_secret(file)
            .map_err(|e| Error::Usage(format!("{e} (--webhook-secret-file)")))?;
    }
    if args.ca_file.is_some() {
        crate::net::http_client(args.ca_file.as_deref(), args.git_timeout)
            .map_err(|e| Error::Usage(e.to_string()))?;
    }
    if let Some(keys) = &args.signing_keys {
        crate::source::verify::TrustedKeys::load(keys)
            .map_err(|e| crate::Error::Usage(format!("--signing-keys: {e}")))?;
    } else if args.verify_commits != crate::source::verify::VerifyCommits::Tip {
        return Err(Error::Usage(
            "--verify-commits=range checks signatures: give the keys with --signing-keys".into(),
        ));
    }
    if let Some(watched) = &args.watch_namespace {
        check_watch_namespace(watched, &args.specs)?;
    }
    if args.liveness_deadline < crate::liveness::MIN_DEADLINE {
        return Err(Error::Usage(format!(
            "--liveness-deadline {:?} is too short: a waiting loop beats every second; give {:?} or more",
            args.liveness_deadline,
            crate::liveness::MIN_DEADLINE
        )));
    }
    Ok(())
}

/// A namespace-scoped agent applies only in the namespace it watches: any other namespace
/// allowed, or a cluster-scoped kind, would be refused by the API server at every sync.
fn check_watch_namespace(watched: &str, specs: &SpecArgs) -> Result<()> {
    if watched.is_empty() {
        return Err(Error::Usage(
            "--watch-namespace is empty: name the namespace to watch".into(),
        ));
    }
    let others: Vec<&String> = specs
        .allowed_namespaces
        .iter()
        .filter(|n| n.as_str() != watched)
        .collect();
    if !others.is_empty() {
        return Err(Error::Usage(format!(
            "--watch-namespace {watched} applies only in {watched}, and --allow-namespace also names {others:?}: \
             leave --allow-namespace out (it becomes {watched}) or run a cluster-wide agent"
        )));
    }
    if !specs.cluster_kinds.is_empty() {
        return Err(Error::Usage(format!(
            "--watch-namespace {watched} applies nothing cluster-scoped, and --allow-cluster-kind names {:?}: \
             apply those from a cluster-wide agent, or with kubectl",
            specs.cluster_kinds
        )));
    }
    Ok(())
}

/// The flags made into the agent's configuration.
fn agent_config(args: &AgentArgs) -> Result<crate::agent::AgentConfig> {
    let source = source_config(args)?;
    let leader = leader_config(args)?;
    let state_namespace = args
        .specs
        .agent_namespace
        .clone()
        .unwrap_or_else(|| args.lease_namespace.clone());
    let commit_status = commit_status_config(args)?;
    let signer = commit_signer(args)?;
    let notifications = match &args.notifications_file {
        Some(file) => Some(
            crate::notify::NotifyConfig::load(
                file,
                args.ca_file.clone(),
                args.git_timeout,
                commit_status.clone(),
            )
            .map_err(|e| Error::Usage(format!("{e} (--notifications-file)")))?,
        ),
        None => None,
    };
    Ok(crate::agent::AgentConfig {
        allow_empty: args.allow_empty,
        poll_interval: args.poll_interval,
        drift_interval: args.drift_interval,
        git_timeout: args.git_timeout,
        signing_keys: args.signing_keys.clone(),
        verify_commits: args.verify_commits,
        refuse_history_rewrites: args.refuse_history_rewrites,
        listen: args.listen,
        admin_listen: args.admin_listen,
        probe_listen: args.probe_listen,
        liveness_deadline: args.liveness_deadline,
        metrics_listen: args.metrics_listen,
        dashboard: super::dashboard_config::dashboard(args, &source, &signer, &commit_status)?,
        allowed_host_names: crate::serve::host_names::HostNames::new(
            args.allowed_host_names.clone(),
        ),
        serve_limits: crate::serve::ServeLimits {
            max_connections: args.max_connections.max(1),
            header_timeout: args.header_timeout,
            ..crate::serve::ServeLimits::default()
        },
        webhook: hook_settings(args),
        load: scoped_load_options(args),
        watch_scope: match &args.watch_namespace {
            Some(ns) => crate::watch::WatchScope::namespace(ns),
            None => crate::watch::WatchScope::cluster(),
        },
        render: crate::render::RenderOptions {
            fetch_timeout: args.git_timeout,
            ..args.specs.render.render_options()
        },
        source_name: args.sync.source_name.clone(),
        prune: args.sync.prune,
        apply_as: args.sync.apply_as(args.specs.agent_namespace.as_deref()),
        adopt: args.sync.adopt,
        writeback: writeback_config(args, &source, signer.clone()),
        // Revert and image pull requests go to the same host, with the same token.
        reverts: revert_config(args, &source, commit_status.clone(), signer.clone()),
        commit_status: commit_status.clone(),
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        notifications,
        first_status_wait: args.first_status_wait,
        analysis: crate::controller::analysis::Policy {
            files_dir: args.analysis_files_dir.clone(),
            url_prefixes: args.analysis_url_prefix.clone(),
        },
        state_namespace: state_namespace.clone(),
        installation: installation(args, leader.as_ref(), state_namespace),
        claim_duration: args.lease_duration,
        cluster: args.cluster_identity(),
        fleet: fleet_config(args, &source)?,
        image_automation: image_automation_config(args, &source, signer, commit_status)?,
        leader,
        source,
    })
}

/// Where the fleet is read from (`--fleet`): the followed branch and the status branch, in
/// mirrors of their own.
fn fleet_config(
    args: &AgentArgs,
    source: &crate::agent::SourceConfig,
) -> Result<Option<crate::source::fleet::FleetConfig>> {
    let Some(path) = &args.fleet else {
        return Ok(None);
    };
    let crate::agent::SourceConfig::Remote { remote, cache_dir } = source else {
        return Err(Error::Usage(
            "--fleet needs --repo-url: the clusters of a fleet meet in a repository".into(),
        ));
    };
    if !args.writeback {
        return Err(Error::Usage(
            "--fleet needs write-back (--writeback=true): the other clusters read this one's \
             status files"
                .into(),
        ));
    }
    Ok(Some(crate::source::fleet::FleetConfig {
        remote: remote.clone(),
        status_branch: args.writeback_branch.clone(),
        path: path.trim_start_matches("./").to_string(),
        dir: crate::runtime::config::sibling_dir(cache_dir, "fleet"),
        timeout: args.git_timeout,
    }))
}

/// The key every commit the agent writes is signed with (`--git-signing-key`), read once.
fn commit_signer(args: &AgentArgs) -> Result<Option<Arc<crate::writeback::signing::CommitSigner>>> {
    let Some(path) = &args.git_signing_key else {
        return Ok(None);
    };
    let signer = crate::writeback::signing::CommitSigner::read(path)
        .map_err(|e| Error::Usage(e.to_string()))?;
    tracing::info!(key = %signer.fingerprint(), "commits are signed");
    Ok(Some(Arc::new(signer)))
}

/// Where the image automation reads its policies and commits tags (`--image-automation`):
/// the followed branch, from a clone of its own.
fn image_automation_config(
    args: &AgentArgs,
    source: &crate::agent::SourceConfig,
    signer: Option<Arc<crate::writeback::signing::CommitSigner>>,
    host: Option<crate::writeback::commit_status::CommitStatusConfig>,
) -> Result<Option<crate::runtime::image_automation::ImageAutomationConfig>> {
    if !args.image_automation {
        return Ok(None);
    }
    if args.image_scan_interval < std::time::Duration::from_secs(1) {
        return Err(Error::Usage(
            "--image-scan-interval must be at least 1s (registries rate-limit their tag lists)"
                .into(),
        ));
    }
    let crate::agent::SourceConfig::Remote { remote, cache_dir } = source else {
        return Err(Error::Usage(
            "--image-automation needs --repo-url: it commits the new tags to the repository".into(),
        ));
    };
    Ok(Some(
        crate::runtime::image_automation::ImageAutomationConfig {
            remote: remote.clone(),
            cache_dir: crate::runtime::config::sibling_dir(cache_dir, "images"),
            author_name: args.git_author_name.clone(),
            author_email: args.git_author_email.clone(),
            timeout: args.git_timeout,
            interval: args.image_scan_interval,
            ca_file: args.ca_file.clone(),
            credentials_file: args.registry_credentials.clone(),
            signer,
            registry_spacing: Duration::from_secs_f64(1.0 / args.registry_rate),
            host,
            auto_merge: args.image_automation_auto_merge,
        },
    ))
}

/// The webhook's secret and bounds, when it has a secret.
fn hook_settings(args: &AgentArgs) -> Option<crate::source::hooks::HookSettings> {
    let secret = args.webhook_secret_file.as_ref()?;
    Some(crate::source::hooks::HookSettings {
        repository_url: args.repo_url.clone(),
        max_body_bytes: args.webhook_max_body_bytes,
        body_timeout: args.webhook_body_timeout,
        max_unverified_bodies: args.webhook_max_unverified_bodies,
        also_branch: args.fleet.as_ref().map(|_| args.writeback_branch.clone()),
        ..crate::source::hooks::HookSettings::new(secret.clone(), args.branch.clone())
    })
}

/// Where the specs come from: a directory, or a remote with its credentials.
fn source_config(args: &AgentArgs) -> Result<crate::agent::SourceConfig> {
    use crate::agent::SourceConfig;
    use crate::source::git::GitRemote;
    let url = match (&args.repo_url, &args.repo_path) {
        (_, Some(dir)) => return Ok(SourceConfig::Local { dir: dir.clone() }),
        (Some(url), None) => url,
        (None, None) => return unreachable_source(),
    };
    let auth = args.git_auth.auth()?;
    Ok(SourceConfig::Remote {
        remote: GitRemote {
            url: url.clone(),
            branch: args.branch.clone(),
            auth,
        },
        cache_dir: args.cache_dir.clone(),
    })
}

/// Status commits to `--writeback-branch`, from a clone of its own.
fn writeback_config(
    args: &AgentArgs,
    source: &crate::agent::SourceConfig,
    signer: Option<Arc<crate::writeback::signing::CommitSigner>>,
) -> Option<crate::writeback::WritebackConfig> {
    let crate::agent::SourceConfig::Remote { remote, cache_dir } = source else {
        return None;
    };
    args.writeback.then(|| crate::writeback::WritebackConfig {
        remote: crate::source::git::GitRemote {
            branch: args.writeback_branch.clone(),
            ..remote.clone()
        },
        cache_dir: crate::runtime::config::sibling_dir(cache_dir, "writeback"),
        author_name: args.git_author_name.clone(),
        author_email: args.git_author_email.clone(),
        signer,
        interval: args.writeback_interval,
        timeout: args.git_timeout,
        cluster: args.cluster_identity(),
    })
}

/// Revert commits (and pull requests, to `host`) on the followed branch.
fn revert_config(
    args: &AgentArgs,
    source: &crate::agent::SourceConfig,
    host: Option<crate::writeback::commit_status::CommitStatusConfig>,
    signer: Option<Arc<crate::writeback::signing::CommitSigner>>,
) -> Option<crate::writeback::revert_loop::RevertConfig> {
    let crate::agent::SourceConfig::Remote { remote, cache_dir } = source else {
        return None;
    };
    args.writeback
        .then(|| crate::writeback::revert_loop::RevertConfig {
            // The followed branch: a revert changes the spec itself.
            remote: remote.clone(),
            cache_dir: crate::runtime::config::sibling_dir(cache_dir, "revert"),
            author_name: args.git_author_name.clone(),
            author_email: args.git_author_email.clone(),
            signer,
            timeout: args.git_timeout,
            host,
            promotion_auto_merge: args.promotion_auto_merge,
            fleet: None,
            cluster: args.cluster_identity(),
        })
}

/// Commit statuses, when the provider, the repository and the token are all given.
fn commit_status_config(
    args: &AgentArgs,
) -> Result<Option<crate::writeback::commit_status::CommitStatusConfig>> {
    use crate::writeback::commit_status::{CommitStatusConfig, Provider};
    let (Some(provider), Some(repo), Some(token)) = (
        args.commit_status_provider,
        &args.commit_status_repo,
        &args.commit_status_token_file,
    ) else {
        return Ok(None);
    };
    let api_url = match (&args.commit_status_api_url, provider) {
        (Some(url), _) => url.clone(),
        (None, Provider::Github) => "https://api.github.com".into(),
        (None, Provider::Gitlab) => "https://gitlab.com/api/v4".into(),
        (None, Provider::Bitbucket) => "https://api.bitbucket.org/2.0".into(),
        (None, Provider::Gitea) => {
            return Err(Error::Usage(
                "--commit-status-provider gitea needs --commit-status-api-url (e.g. https://gitea.example.com/api/v1)".into(),
            ));
        }
    };
    Ok(Some(CommitStatusConfig {
        provider,
        api_url,
        repository: repo.clone(),
        token_file: token.clone(),
        cluster: args.cluster_name.clone(),
        target_url: args.commit_status_target_url.clone(),
        ca_file: args.ca_file.clone(),
        timeout: args.git_timeout,
    }))
}

/// The loader's options; a namespace-scoped agent's source may use its namespace only.
fn scoped_load_options(args: &AgentArgs) -> crate::specs::LoadOptions {
    let mut load = args.specs.load_options();
    if let Some(ns) = &args.watch_namespace {
        load.policy.allowed_namespaces = vec![ns.clone()];
    }
    load
}

/// Who this agent is as a holder of its source's claim: one Lease name in one namespace,
/// or, without leader election, one pod.
fn installation(
    args: &AgentArgs,
    leader: Option<&crate::agent::LeaderConfig>,
    namespace: String,
) -> crate::runtime::holder::Installation {
    crate::runtime::holder::Installation {
        namespace,
        identity: match leader {
            Some(leader) => format!("lease/{}", leader.name),
            // A restarted process of one pod is the same holder; another pod is not.
            None => format!(
                "replica/{}",
                args.lease_identity.clone().unwrap_or_else(host_name)
            ),
        },
        own_namespace_only: args.watch_namespace.is_some(),
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "linnet".into())
}

/// The Leases of `--leader-elect` and `--shards`.
fn leader_config(args: &AgentArgs) -> Result<Option<crate::agent::LeaderConfig>> {
    if !args.leader_elect {
        if args.shards > 1 {
            return Err(crate::Error::Usage(
                "--shards needs leader election: each shard is a Lease (drop --leader-elect=false)"
                    .into(),
            ));
        }
        return Ok(None);
    }
    let identity = args
        .lease_identity
        .clone()
        .unwrap_or_else(|| format!("{}-{}", host_name(), std::process::id()));
    let home_shard = match args.shard_index {
        Some(i) => i,
        None if args.shards <= 1 => 0,
        None => crate::controller::shards::ordinal(&identity).ok_or_else(|| {
            crate::Error::Usage(format!(
                "--shards {}: which shard is this replica's? Pass --shard-index, or run as a \
                 StatefulSet, whose pod names (the --lease-identity, {identity}) end in an ordinal",
                args.shards
            ))
        })?,
    } % args.shards;
    Ok(Some(crate::agent::LeaderConfig {
        name: args
            .lease_name
            .clone()
            .unwrap_or_else(|| format!("linnet-{}", args.sync.source_name)),
        namespace: args.lease_namespace.clone(),
        identity,
        duration: args.lease_duration,
        shards: args.shards,
        home_shard,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent_args(extra: &[&str]) -> AgentArgs {
        let mut argv = vec!["linnet", "agent", "--repo-path", "/tmp/specs"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Agent(args)) => *args,
            other => panic!("{other:?}"),
        }
    }

    /// Issue 72: a namespace-scoped agent applies in its namespace only, and says at start
    /// what else it was asked for.
    #[test]
    fn a_namespace_scoped_agent_allows_its_namespace_only() {
        let args = agent_args(&["--watch-namespace", "shop"]);
        assert!(check_watch_namespace("shop", &args.specs).is_ok());
        let load = scoped_load_options(&args);
        assert_eq!(load.policy.allowed_namespaces, ["shop"]);
        assert!(load.policy.namespace_refusal("default").is_some());
        assert!(installation(&args, None, "linnet-system".into()).own_namespace_only);

        let args = agent_args(&[
            "--watch-namespace",
            "shop",
            "--allow-namespace",
            "shop,cart",
        ]);
        let refused = check_watch_namespace("shop", &args.specs)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("cart") && refused.contains("--allow-namespace"),
            "{refused}"
        );

        let args = agent_args(&[
            "--watch-namespace",
            "shop",
            "--allow-cluster-kind",
            "Namespace",
        ]);
        let refused = check_watch_namespace("shop", &args.specs)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("cluster-scoped"), "{refused}");

        let args = agent_args(&[]);
        assert!(!installation(&args, None, "linnet-system".into()).own_namespace_only);
    }
}
