//! Webhook to revision read against `git fetch` (issue 77): for each push of figure 1, the
//! time from the Git host's webhook leaving its `post-receive` hook to the agent's log saying
//! it read the new revision, beside a plain `git fetch` of the same push into a full clone
//! one push behind, from the same server, with the same token, in the same run.
//!
//! The hook writes `<commit> <unix seconds>` to `webhooks-sent.log` in the bare repository
//! just before it posts (`support::push_hook`); the agent's `new revision` line carries its
//! own UTC timestamp. Both clocks are this machine's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::Row;

/// The clone `git fetch` is timed in.
pub struct Reader {
    dir: PathBuf,
}

impl Reader {
    /// A full clone of `url` (which the token opens) in `dir`.
    pub fn clone(url: &str, token: &str, dir: &Path) -> Reader {
        let authed = url.replacen("://", &format!("://git:{token}@"), 1);
        let dir = dir.join("reader");
        crate::support::git(
            dir.parent().unwrap_or(Path::new(".")),
            &["clone", "-q", &authed, dir.to_str().unwrap_or("reader")],
        );
        Reader { dir }
    }

    /// Milliseconds `git fetch origin main` took (process start to exit).
    pub fn fetch_ms(&self) -> f64 {
        let started = Instant::now();
        let status = Command::new("git")
            .args([
                "-C",
                self.dir.to_str().unwrap_or("."),
                "fetch",
                "-q",
                "origin",
                "main",
            ])
            .env_remove("GIT_SSL_CAINFO")
            .status();
        let took = started.elapsed().as_secs_f64() * 1000.0;
        match status {
            Ok(s) if s.success() => took,
            other => panic!("git fetch in {}: {other:?}", self.dir.display()),
        }
    }
}

/// The hook's send times, by commit (`webhooks-sent.log` in `bare`).
fn sent_at(bare: &Path) -> HashMap<String, f64> {
    std::fs::read_to_string(bare.join("webhooks-sent.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (commit, at) = l.split_once(' ')?;
            Some((commit.to_string(), at.trim().parse().ok()?))
        })
        .collect()
}

/// The agent's `new revision` lines: when each revision was read (Unix seconds).
fn read_at(agent_log: &Path) -> HashMap<String, f64> {
    let text = std::fs::read_to_string(agent_log).unwrap_or_default();
    let mut read = HashMap::new();
    for line in text.lines() {
        let Some((_, rest)) = line.split_once("new revision revision=") else {
            continue;
        };
        let commit: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
        let stamp = line.split_whitespace().next().unwrap_or_default();
        if let Ok(t) = stamp.parse::<jiff::Timestamp>() {
            read.entry(commit).or_insert(t.as_nanosecond() as f64 / 1e9);
        }
    }
    read
}

/// Each push's (webhook to read, `git fetch`) milliseconds, from the pushes' `(commit, git
/// fetch ms)`; a commit missing from either log is left out.
pub fn paired(bare: &Path, agent_log: &Path, pushes: &[(String, f64)]) -> (Vec<f64>, Vec<f64>) {
    let (sent, read) = (sent_at(bare), read_at(agent_log));
    pushes
        .iter()
        .filter_map(|(c, fetch)| Some(((read.get(c)? - sent.get(c)?) * 1000.0, *fetch)))
        .unzip()
}

/// Row labels, in the order [`rows`] gives them.
pub const FETCH: [&str; 3] = [
    "   1 webhook -> revision read",
    "   1 git fetch of the same push (a full clone one push behind)",
    "   1 webhook -> revision read, over git fetch (per push)",
];

/// The three rows for `size`: each push's webhook to read, its `git fetch`, and the
/// difference per push (the target).
pub fn rows(size: usize, read_ms: Vec<f64>, fetch_ms: Vec<f64>) -> Vec<Row> {
    let over: Vec<f64> = read_ms.iter().zip(&fetch_ms).map(|(r, f)| r - f).collect();
    let (over_median, _, _) = super::stats(over.clone());
    let plain = |label: &'static str, v: Vec<f64>| Row {
        figure: label,
        ..super::row(size, 1, "ms", v, "-", None)
    };
    vec![
        plain(FETCH[0], read_ms),
        plain(FETCH[1], fetch_ms),
        Row {
            figure: FETCH[2],
            ..super::row(
                size,
                1,
                "ms",
                over.clone(),
                "median <= 50 ms",
                (!over.is_empty()).then_some(over_median <= 50.0),
            )
        },
    ]
}
