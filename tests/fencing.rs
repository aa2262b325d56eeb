//! Fencing (issue 69): with etcd frozen, the leader's renewals hang, and it used to go on
//! writing until it saw another holder (in 3 of 3 runs, a write 16 s after its Lease had
//! expired). The API server's audit log shows every write linnet makes: none may be received
//! past the leader's renew deadline until a renewal has gone through again. Its own binary:
//! freezing etcd stops every other test's cluster too.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::time::Duration;

use linnet::api::{CanaryStatefulSet, StatefulSetPhase};
use serde_json::{Value, json};
use support::rollout::Fixture;

/// etcd's process, stopped (`SIGSTOP`) or let go on (`SIGCONT`).
fn signal_etcd(signal: &str) {
    let pid = std::fs::read_to_string(support::cluster_dir().join("pid/etcd.pid")).unwrap();
    let ok = std::process::Command::new("kill")
        .args([signal, pid.trim()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {signal} etcd");
}

/// Lets etcd go on when dropped, also when the test fails.
struct Frozen;

impl Drop for Frozen {
    fn drop(&mut self) {
        signal_etcd("-CONT");
    }
}

fn audit_since(from: u64) -> Vec<Value> {
    let log = std::fs::read(support::cluster_dir().join("logs/audit.log")).unwrap_or_default();
    String::from_utf8_lossy(log.get(from as usize..).unwrap_or_default())
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn at(event: &Value, field: &str) -> jiff::Timestamp {
    event[field].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_cannot_be_renewed_writes_nothing_past_its_deadline() {
    // A background analysis measured every second keeps the leader writing status.
    let port = support::web_gate(std::sync::Arc::new(std::sync::atomic::AtomicBool::new(
        true,
    )))
    .await;
    let mut f = Fixture::prepare("fencing", |ns| {
        support::rollout::small_redis(
            ns,
            json!({"analysis": {"background": {"templates": [{"templateName": "health"}]}}}),
        )
    })
    .await;
    let ns = f.ns.name.clone();
    f.write_file(
        "templates.yaml",
        &[support::web_gate_template(&ns, port, json!({}))],
    );
    f.start_agent().await;
    f.wait_for("Stable", 90, |r: &CanaryStatefulSet| {
        r.status.as_ref().and_then(|s| s.phase) == Some(StatefulSetPhase::Stable)
    })
    .await;
    f.patch_spec(json!({"image": "redis:7.4"}));
    f.wait_for("the canary analysed", 60, |r: &CanaryStatefulSet| {
        let s = r.status.clone().unwrap_or_default();
        s.phase == Some(StatefulSetPhase::CanaryActive) && !s.analysis.is_empty()
    })
    .await;
    let from = support::audit_offset();
    let frozen_at = jiff::Timestamp::now();
    signal_etcd("-STOP");
    let frozen = Frozen;
    support::let_time_pass(
        "etcd frozen past the Lease's duration (4 s), so the leader's renewal lapses",
        Duration::from_secs(10),
    )
    .await;
    // Promoted while etcd is frozen: the sync's apply (made as the source's account, by a
    // client of its own) waits for etcd and is sent the moment it thaws, before the Lease is
    // renewed. Writes through that client once went past the fence.
    f.annotate(linnet::api::PROMOTE_ANNOTATION, "redis:7.4");
    support::let_time_pass(
        "etcd still frozen, the promotion's writes queued behind it",
        Duration::from_secs(10),
    )
    .await;
    drop(frozen);
    let thawed_at = jiff::Timestamp::now();
    f.wait_for("Stable on redis:7.4", 180, |r: &CanaryStatefulSet| {
        let s = r.status.clone().unwrap_or_default();
        s.phase == Some(StatefulSetPhase::Stable) && s.stable_image.as_deref() == Some("redis:7.4")
    })
    .await;

    // Every write must be received within the Lease's duration (4 s) of a renewal that went
    // through: the fence stops writes 3.75 s after the last renewal was sent.
    let audit = audit_since(from);
    let writes = |e: &&Value| {
        matches!(
            e["verb"].as_str(),
            Some("create" | "update" | "patch" | "delete")
        ) && e["stage"] == "ResponseComplete"
    };
    let renewals: Vec<jiff::Timestamp> = audit
        .iter()
        .filter(writes)
        .filter(|e| {
            e["objectRef"]["resource"] == "leases" && e["objectRef"]["namespace"] == ns.as_str()
        })
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_i64()
                .is_some_and(|c| c < 300)
        })
        .map(|e| at(e, "requestReceivedTimestamp"))
        .collect();
    let deadline = jiff::SignedDuration::from_millis(4000);
    let late: Vec<String> = audit
        .iter()
        .filter(writes)
        .filter(|e| e["objectRef"]["resource"] != "leases")
        .filter(|e| e["objectRef"]["namespace"] == ns.as_str())
        .filter(|e| {
            let t = at(e, "requestReceivedTimestamp");
            // Writes received before the first renewal of the log are not judged.
            renewals.iter().any(|r| *r <= t)
                && !renewals
                    .iter()
                    .any(|r| *r <= t && t.duration_since(*r) <= deadline)
        })
        .map(|e| {
            format!(
                "{} {} {} at {} (answered {})",
                e["verb"],
                e["objectRef"]["resource"],
                e["objectRef"]["name"],
                e["requestReceivedTimestamp"],
                e["responseStatus"]["code"]
            )
        })
        .collect();
    let log = f.agent.as_ref().unwrap().log_text();
    assert!(
        late.is_empty(),
        "writes with no renewal of the lease within its deadline before them (etcd frozen \
         {frozen_at} to {thawed_at}; renewals received at {renewals:?}):\n{}",
        late.join("\n"),
    );
    assert!(
        log.contains("no writes until it is") && log.contains("writes resume"),
        "the fence closed and opened again, and said so:\n{log}"
    );
}
