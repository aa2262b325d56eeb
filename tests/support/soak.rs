//! What the soaks share (tests/soak.rs, tests/fleet_soak.rs): a request through the gateway
//! every 100 ms, the check of the canary's share of them against the weight the rollout's
//! status showed, an agent's memory, and the report's table of invariants.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::gateway::within_binomial;

/// (time, answer body or error) of each request through the gateway.
pub type Samples = Arc<Mutex<Vec<(Instant, Result<String, String>)>>>;

/// A request to `url` every 100 ms until `stop`, on a thread of its own (a busy test runtime
/// must not delay them), each answer pushed to `samples`.
pub fn requests_every_100ms(
    url: String,
    samples: Samples,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap();
            let mut every = tokio::time::interval(Duration::from_millis(100));
            while !stop.load(Ordering::SeqCst) {
                every.tick().await;
                let at = Instant::now();
                let answer = match client.get(&url).send().await {
                    Ok(r) if r.status().is_success() => {
                        Ok(r.text().await.unwrap_or_default().trim().to_string())
                    }
                    Ok(r) => Err(r.status().to_string()),
                    Err(e) => Err(e.to_string()),
                };
                samples.lock().unwrap().push((at, answer));
            }
        })
    })
}

/// A stretch of one traffic state of a rollout, from its status: from `at`, `weight` percent
/// to `canary` and the rest to `stable`.
#[derive(Clone, Debug, PartialEq)]
pub struct Weighed {
    pub at: Instant,
    pub weight: i32,
    pub stable: String,
    pub canary: String,
}

/// `seen` (in time order) with each run of one (weight, stable, canary) kept at its first.
pub fn stretches_of(seen: impl IntoIterator<Item = Weighed>) -> Vec<Weighed> {
    let mut out: Vec<Weighed> = Vec::new();
    for s in seen {
        let same = out
            .last()
            .is_some_and(|l| (l.weight, &l.stable, &l.canary) == (s.weight, &s.stable, &s.canary));
        if !same {
            out.push(s);
        }
    }
    out
}

/// The canary share of the answers in each stretch of one weight (after 5 s for the gateway to
/// take it, and with at least 20 answers), checked against the binomial's bounds of that
/// weight: (stretches checked, answers checked, the stretches that were off). `t0` is the
/// time the report counts seconds from.
pub fn canary_share(
    stretches: &[Weighed],
    samples: &[(Instant, Result<String, String>)],
    ended: Instant,
    t0: Instant,
) -> (usize, usize, Vec<String>) {
    let secs = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    let (mut count, mut checked, mut off) = (0, 0usize, Vec::new());
    for (i, seen) in stretches.iter().enumerate() {
        let to = stretches.get(i + 1).map_or(ended, |s| s.at);
        let from = seen.at + Duration::from_secs(5);
        if from >= to {
            continue;
        }
        let answers: Vec<&String> = samples
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .filter_map(|(_, a)| a.as_ref().ok())
            .collect();
        if answers.len() < 20 {
            continue;
        }
        count += 1;
        checked += answers.len();
        // Before a canary has an image of its own, every answer is the stable one.
        let (canary_image, weight) = if seen.canary.is_empty() || seen.canary == seen.stable {
            (None, 0)
        } else {
            (Some(&seen.canary), seen.weight)
        };
        let canary = answers.iter().filter(|a| Some(**a) == canary_image).count();
        let stable = answers.iter().filter(|a| ***a == seen.stable).count();
        if !within_binomial(canary, answers.len(), weight) || canary + stable != answers.len() {
            off.push(format!(
                "at {:.0}-{:.0} s weight {weight} ({}→{}): {canary} canary, {stable} stable of {}",
                secs(from),
                secs(to),
                seen.stable,
                seen.canary,
                answers.len()
            ));
        }
    }
    (count, checked, off)
}

/// The failed answers among `samples` from `from` on, by kind (an HTTP status or the error's
/// start), each with its second since `t0`.
pub fn failed_requests(
    samples: &[(Instant, Result<String, String>)],
    from: Instant,
    t0: Instant,
) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut failed: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (t, a) in samples.iter().filter(|(t, _)| *t >= from) {
        if let Err(e) = a {
            let kind = if e.contains("timed out") || e.contains("timeout") {
                "timeout".to_string()
            } else {
                e.chars().take(60).collect()
            };
            failed.entry(kind).or_default().push(format!(
                "{:.1}",
                t.saturating_duration_since(t0).as_secs_f64()
            ));
        }
    }
    failed
}

/// A process's resident memory in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Whether memory samples are flat: the peak of the second half within 20 % + 8 MiB of the
/// first half's; and the two peaks in MiB.
pub fn memory_flat(samples: &[u64]) -> (bool, u64, u64) {
    let half = samples.len() / 2;
    let peak = |m: &[u64]| m.iter().copied().max().unwrap_or(0);
    let (first, second) = (peak(&samples[..half]), peak(&samples[half..]));
    (
        second <= first + first / 5 + 8 * 1024,
        first / 1024,
        second / 1024,
    )
}

/// `lead` and `items` joined by `sep`, or nothing when there are none: a report's detail.
pub fn listed(lead: &str, items: &[String], sep: &str) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!("{lead}{}", items.join(sep))
    }
}

/// A soak's report: one table row per invariant, and the ones that broke.
#[derive(Default)]
pub struct Checks {
    pub rows: Vec<String>,
    pub failures: Vec<String>,
}

impl Checks {
    pub fn check(&mut self, name: &str, ok: bool, detail: String) {
        self.rows.push(format!(
            "| {name} | {} | {detail} |",
            if ok { "held" } else { "**broken**" }
        ));
        if !ok {
            self.failures.push(format!("{name}: {detail}"));
        }
    }

    /// The table, under its header.
    pub fn table(&self) -> String {
        format!(
            "| invariant | result | figures |\n|---|---|---|\n{}\n",
            self.rows.join("\n")
        )
    }
}

/// Waits (up to 120 s) until the last 20 requests through the gateway were all answered.
pub async fn gateway_answering(samples: &Samples) {
    super::eventually(
        "the gateway answering the last 20 requests",
        Duration::from_secs(120),
        || {
            let s = samples.lock().unwrap();
            let ok = s.len() >= 20 && s.iter().rev().take(20).all(|(_, a)| a.is_ok());
            async move { ok.then_some(()) }
        },
    )
    .await;
}
