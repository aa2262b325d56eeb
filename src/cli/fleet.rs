//! `linnet fleet status` (issue 73): where a fleet stands, per rollout, wave and cluster, from
//! a clone of the repository alone: the Fleet on the followed branch and every cluster's
//! status files on the status branch, read as the agents read them.

use std::path::PathBuf;
use std::process::ExitCode;

use git2::{Repository, Tree};

use crate::plan::fleet::FleetSnapshot;
use crate::plan::fleet::view::{as_json, fleet_view};
use crate::{Error, Result};

#[derive(clap::Subcommand, Debug)]
pub enum FleetCommand {
    /// Where each of the fleet's rollouts stands in each wave and cluster: the image the
    /// fleet moves, each cluster's state for it (done, baking until, rolling, held and why,
    /// failed, not reported), read from a clone of the repository (`git fetch` it first).
    Status {
        /// The Fleet file, from the repository's root (as the agents' --fleet).
        #[arg(long, value_name = "FILE")]
        fleet: String,
        /// The clone (or a directory in it).
        #[arg(long, default_value = ".")]
        repo: PathBuf,
        /// The branch the Fleet is read on (a local branch or origin's): default HEAD.
        #[arg(long)]
        branch: Option<String>,
        /// The branch the agents write their status files to (their --writeback-branch).
        #[arg(long, default_value = "linnet/status")]
        status_branch: String,
        /// `text` (a table per rollout) or `json`.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

pub fn run(command: &FleetCommand) -> Result<ExitCode> {
    let FleetCommand::Status {
        fleet,
        repo,
        branch,
        status_branch,
        output,
    } = command;
    let git = |e: git2::Error| Error::Usage(format!("{}: {}", repo.display(), e.message()));
    let repository = Repository::discover(repo).map_err(git)?;
    let spec = match branch {
        Some(b) => branch_tree(&repository, b).ok_or_else(|| {
            Error::Usage(format!(
                "no branch {b} (nor origin/{b}) in {}",
                repo.display()
            ))
        })?,
        None => repository
            .head()
            .and_then(|h| h.peel_to_tree())
            .map_err(git)?,
    };
    let status = branch_tree(&repository, status_branch);
    let snapshot = crate::source::fleet::snapshot(
        (&repository, &spec),
        status.as_ref().map(|t| (&repository, t)),
        fleet.trim_start_matches("./"),
    );
    let now = jiff::Timestamp::now();
    let text = match output {
        Output::Text => table(&snapshot, status.is_some(), now),
        Output::Json => format!("{:#}", as_json(&snapshot, now)),
    };
    let _ = std::io::Write::write_all(&mut std::io::stdout(), format!("{text}\n").as_bytes());
    Ok(if snapshot.problem.is_some() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// The tree at the tip of `branch`, a local branch or origin's.
fn branch_tree<'r>(repo: &'r Repository, branch: &str) -> Option<Tree<'r>> {
    [
        format!("refs/heads/{branch}"),
        format!("refs/remotes/origin/{branch}"),
    ]
    .iter()
    .find_map(|r| repo.find_reference(r).ok()?.peel_to_tree().ok())
}

fn table(snapshot: &FleetSnapshot, has_status: bool, now: jiff::Timestamp) -> String {
    if let Some(problem) = &snapshot.problem {
        return format!("the Fleet cannot be read: {problem}");
    }
    let mut out = format!(
        "fleet {}: {} wave(s), {} cluster(s) reporting",
        snapshot.name,
        snapshot.spec.waves.len(),
        snapshot.clusters.len()
    );
    if !has_status {
        out.push_str("\nno status branch yet: no cluster has reported");
    }
    for view in fleet_view(snapshot, now) {
        let (kind, ns, name) = &view.id;
        out.push_str(&format!(
            "\n\n{ns}/{name} ({kind}): {}\n",
            view.image.as_deref().unwrap_or("no image reported")
        ));
        let mut lines = vec![[
            "WAVE".to_string(),
            "CLUSTER".into(),
            "PHASE".into(),
            "STABLE".into(),
            "CANARY".into(),
            "STATE".into(),
        ]];
        for r in view.rows {
            lines.push([r.wave, r.cluster, r.phase, r.stable, r.canary, r.state]);
        }
        let widths: Vec<usize> = (0..5)
            .map(|i| {
                lines
                    .iter()
                    .map(|l| l[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for l in &lines {
            let mut line = String::from("  ");
            for (i, cell) in l.iter().enumerate().take(5) {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
            line.push_str(&l[5]);
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ClusterIdentity;
    use crate::plan::fleet::Report;

    fn t(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_table_names_each_clusters_state_and_why_a_wave_waits() {
        let spec = serde_saphyr::from_str(
            "waves:\n- {name: canary, clusters: [eu-1], bakeSeconds: 600}\n- {name: rest, matchLabels: {}}\n",
        )
        .unwrap();
        let mut snapshot = FleetSnapshot {
            name: "shop".into(),
            spec,
            ..Default::default()
        };
        for c in ["eu-1", "us-1"] {
            snapshot.clusters.insert(
                c.into(),
                ClusterIdentity {
                    name: c.into(),
                    ..Default::default()
                },
            );
        }
        let report = |stable: &str, wanted: &str| Report {
            phase: "Stable".into(),
            stable_image: Some(stable.into()),
            canary_image: None,
            wanted_image: Some(wanted.into()),
            since: Some(t("2026-12-03T10:00:00Z")),
        };
        let id = (
            "CanaryStatefulSet".to_string(),
            "shop".to_string(),
            "redis".to_string(),
        );
        snapshot.reports.insert(
            id,
            [
                ("eu-1".to_string(), report("redis:2", "redis:2")),
                ("us-1".to_string(), report("redis:1", "redis:2")),
            ]
            .into(),
        );
        let text = table(&snapshot, true, t("2026-12-03T10:05:00Z"));
        assert!(
            text.starts_with("fleet shop: 2 wave(s), 2 cluster(s) reporting"),
            "{text}"
        );
        assert!(
            text.contains("shop/redis (CanaryStatefulSet): redis:2"),
            "{text}"
        );
        assert!(
            text.contains(
                "canary  eu-1     Stable  redis:2  -       baking until 2026-12-03T10:10:00Z"
            ),
            "{text}"
        );
        assert!(text.contains("rest    us-1     Stable  redis:1  -       held: wave rest waits for redis:2 to bake in eu-1"), "{text}");
        let later = as_json(&snapshot, t("2026-12-03T10:11:00Z"));
        assert_eq!(later["rollouts"][0]["clusters"][0]["state"], "done");
        assert_eq!(later["rollouts"][0]["clusters"][1]["state"], "may start");
    }
}
