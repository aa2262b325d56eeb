//! The commands besides `agent`: `get`, `status`, `diff` and `validate`, and what they print.

use super::*;

/// A checked client of the cluster `cluster` names, and the namespace to use: `namespace`,
/// else the kubeconfig context's.
pub(super) async fn client_in(
    namespace: Option<String>,
    cluster: &ClusterArgs,
) -> Result<(kube::Client, String)> {
    let (_, client) = crate::kube_client::connect_to(&cluster.target()).await?;
    let ns = namespace.unwrap_or_else(|| client.default_namespace().to_string());
    Ok((client, ns))
}

/// Where `linnet get` looks and how it prints.
pub(super) struct GetScope {
    pub namespace: Option<String>,
    pub all_namespaces: bool,
    pub output: Option<GetOutput>,
    pub watch: bool,
}

pub(super) async fn get(
    name: Option<&str>,
    scope: GetScope,
    cluster: &ClusterArgs,
) -> Result<ExitCode> {
    let (client, ns) = client_in(scope.namespace, cluster).await?;
    let now = jiff::Timestamp::now();
    let Some(name) = name else {
        let rollouts =
            crate::inspect::list(&client, (!scope.all_namespaces).then_some(ns.as_str())).await?;
        match scope.output {
            Some(GetOutput::Yaml | GetOutput::Json) => {
                let items: Vec<serde_json::Value> = rollouts
                    .iter()
                    .map(|r| r.to_json())
                    .collect::<Result<_>>()?;
                print_objects(
                    &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}),
                    scope.output,
                )?;
            }
            wide => {
                if rollouts.is_empty() {
                    let place = if scope.all_namespaces {
                        "any namespace".to_string()
                    } else {
                        format!("namespace {ns}")
                    };
                    eprintln!("No CanaryStatefulSets or CanaryDeployments in {place}.");
                } else {
                    let columns = crate::inspect::list::ListColumns {
                        namespace: scope.all_namespaces,
                        wide: wide == Some(GetOutput::Wide),
                    };
                    say_raw!("{}", crate::inspect::list::render(&rollouts, columns, now));
                }
            }
        }
        return Ok(ExitCode::SUCCESS);
    };
    if !scope.watch {
        let tree = crate::inspect::snapshot(&client, &ns, name).await?;
        match scope.output {
            Some(GetOutput::Yaml | GetOutput::Json) => {
                print_objects(&tree.rollout.to_json()?, scope.output)?
            }
            _ => say_raw!("{}", tree.render(now)),
        }
        return Ok(ExitCode::SUCCESS);
    }
    use std::io::IsTerminal as _;
    let terminal = std::io::stdout().is_terminal();
    crate::inspect::watch(&client, &ns, name, |text| {
        if terminal {
            // Clear the screen and draw from the top, as `watch` does.
            say_raw!("\x1b[H\x1b[2J{text}");
        } else {
            say_raw!("{}\n{text}", "-".repeat(78));
        }
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// `value` as YAML or JSON, as `kubectl get -o` prints it.
fn print_objects(value: &serde_json::Value, output: Option<GetOutput>) -> Result<()> {
    let text = if output == Some(GetOutput::Json) {
        serde_json::to_string_pretty(value)? + "\n"
    } else {
        serde_saphyr::to_string(value)?
    };
    say_raw!("{text}");
    Ok(())
}

pub(super) async fn pull(
    name: &str,
    namespace: Option<String>,
    cluster: &ClusterArgs,
    lever: crate::inspect::Lever,
) -> Result<ExitCode> {
    let (client, ns) = client_in(namespace, cluster).await?;
    let done = crate::inspect::pull(&client, &ns, name, lever).await?;
    say!("{done}");
    Ok(ExitCode::SUCCESS)
}

pub(super) fn unreachable_source() -> Result<crate::agent::SourceConfig> {
    Err(Error::Usage("give --repo-url or --repo-path".into()))
}

/// `linnet status`: what the agent's `/status` says, the source and every rollout of it as
/// the agent's shared stores have them. No cluster I/O of its own.
pub(super) async fn status(agent_url: &str) -> Result<ExitCode> {
    let url = format!("{}/status", agent_url.trim_end_matches('/'));
    let http = crate::net::http_client(None, std::time::Duration::from_secs(10))
        .map_err(|e| Error::Usage(e.to_string()))?;
    let response = http
        .get(&url)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| {
            Error::Usage(format!(
                "cannot reach the agent at {url}: {}; give --agent-url, or in a cluster run \
                 `kubectl -n linnet-system port-forward deploy/linnet 9090` first",
                crate::net::explain_http(&e).1
            ))
        })?;
    let report = response
        .json::<crate::agent::StatusReport>()
        .await
        .map_err(|e| Error::Usage(format!("{url} answered, but not with a status: {e}")))?;
    let s = &report.source;
    say!("source {}:", s.source);
    say!(
        "  revision:   {}",
        s.revision.as_deref().unwrap_or("(not synced yet)")
    );
    say!("  last sync:  {}", s.last_sync.as_deref().unwrap_or("-"));
    say!(
        "  last error: {}",
        s.last_error.as_deref().unwrap_or("none")
    );
    say!("  objects:    {}", s.objects);
    let labels: Vec<String> = (report.cluster.labels.iter())
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let cluster = format!("  cluster:    {} {}", report.cluster.name, labels.join(","));
    say!("{}", cluster.trim_end());
    for e in &s.spec_errors {
        say!("  spec error: {e}");
    }
    if s.spec_error_count > s.spec_errors.len() {
        say!(
            "  spec error: … and {} more",
            s.spec_error_count - s.spec_errors.len()
        );
    }
    for e in &s.sync_errors {
        say!("  not applied: {e}");
    }
    if s.sync_error_count > s.sync_errors.len() {
        say!(
            "  not applied: … and {} more",
            s.sync_error_count - s.sync_errors.len()
        );
    }
    for c in &s.conditions {
        say!("  {}: {} ({}): {}", c.type_, c.status, c.reason, c.message);
    }
    say!(
        "{:<14} {:<40} {:<18} {:<7} MESSAGE",
        "KIND",
        "NAMESPACE/NAME",
        "PHASE",
        "READY"
    );
    for r in &report.rollouts {
        status_row(r);
    }
    if !report.rollouts_listed {
        say!(
            "(rollouts not listed yet: the agent is starting, or this replica waits for the lease)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One line of `linnet status`'s rollout table.
pub(super) fn status_row(r: &crate::agent::RolloutRow) {
    say!(
        "{:<14} {:<40} {:<18} {:<7} {}",
        r.kind,
        format!("{}/{}", r.namespace, r.name),
        r.phase.as_deref().unwrap_or("-"),
        r.ready.as_deref().unwrap_or("-"),
        r.message.as_deref().unwrap_or_default()
    );
}

pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_unpark(crate::telemetry::memory::on_worker_unpark)
        .on_thread_park(crate::telemetry::memory::on_worker_park)
        .build()
        .map_err(|e| {
            Error::Runtime(std::io::Error::other(format!(
                "cannot start the async runtime: {e}"
            )))
        })
}

/// Why a directory without any spec is refused (a wrong path, most likely).
pub(super) fn no_specs(dir: &Path) -> String {
    format!(
        "no specs found in {}: no .yaml or .yml file with an object; give the \
         directory that holds them, or --allow-empty",
        dir.display()
    )
}

/// Why `set`, read from `dir`, is refused as (partly) empty: nothing in it at all, or a
/// `--path` that holds no spec (a typo, or a directory moved away).
pub(super) fn empty_of(
    dir: &Path,
    set: &crate::specs::SpecSet,
    selection: &crate::specs::PathSelection,
) -> Option<String> {
    if set.is_empty() {
        return Some(no_specs(dir));
    }
    let empty = selection.holding_nothing(set.files.iter().map(String::as_str));
    (!empty.is_empty()).then(|| {
        format!(
            "no specs found in {} (--path {}): no .yaml or .yml file with an object and no \
             unit below it; give the paths that hold them, or --allow-empty",
            dir.display(),
            empty.join(",")
        )
    })
}

pub(super) async fn diff(
    dir: &Path,
    allow_empty: bool,
    unknown_fields: UnknownFields,
    (args, sync): (&SpecArgs, &SyncArgs),
    cluster: &ClusterArgs,
) -> Result<ExitCode> {
    use crate::sync::{Change, Syncer, diff::render_diff};
    let opts = args.checking_options(unknown_fields);
    let set = crate::source::snapshot::load_tree(dir, &opts, args.render.render_options())?;
    if let Some(empty) = empty_of(dir, &set, &opts.selection).filter(|_| !allow_empty) {
        return Err(Error::Usage(empty));
    }
    for e in &set.errors {
        eprintln!("{e}");
    }
    for e in &set.left_out {
        eprintln!("note: {e}");
    }
    let (_, client) = crate::kube_client::connect_to(&cluster.target()).await?;
    let load = args.load_options();
    let syncer = Syncer::new(
        client,
        &sync.source_name,
        load.policy.allowed_namespaces.clone(),
    )
    .with_adopt(sync.adopt)
    .with_policy(load.policy)
    // Prunes shown are those the agent would make: of its inventory, in its namespace.
    .with_inventory(
        args.agent_namespace
            .clone()
            .unwrap_or_else(|| "default".to_string()),
        "",
    );
    let (plan, read_errors) = syncer.plan(&set, "working-tree", sync.prune).await;
    let mut changed = 0;
    for change in &plan {
        let verb = match change.change {
            Change::Unchanged => continue,
            Change::Create => "create",
            Change::Update => "update",
            Change::Prune => "prune",
            Change::KeepVolume => {
                say!(
                    "= keep {} (no longer in Git, but linnet never deletes volumes)",
                    change.key
                );
                continue;
            }
        };
        changed += 1;
        let from = change
            .desired
            .as_ref()
            .map(|d| format!(" ({})", d.source_path))
            .unwrap_or_default();
        say!("~ {verb} {}{from}", change.key);
        say_raw!("{}", render_diff(change));
    }
    for (key, e) in &read_errors {
        eprintln!("error: {key}: {e}");
    }
    let unchanged = plan
        .iter()
        .filter(|c| c.change == Change::Unchanged)
        .count();
    say!("{changed} to change, {unchanged} unchanged");
    // 2 for an error, never 1: in CI, 1 reads as "a change is pending".
    Ok(if !set.errors.is_empty() || !read_errors.is_empty() {
        ExitCode::from(2)
    } else if changed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
