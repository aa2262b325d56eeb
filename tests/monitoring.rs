//! Issue 52, monitoring that ships: deploy/monitoring's alert rules pass promtool (their
//! syntax and their own unit tests), the Grafana dashboard's queries are valid PromQL over
//! metrics the agent serves, and in a real Prometheus scraping a real agent on the local
//! control plane, a stalled rollout fires LinnetRolloutStalled and a fix resolves it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use linnet::api::CanaryStatefulSet;
use serde_json::{Value, json};
use support::agent::wait_ready;
use support::eventually;
use support::ports::free_port;
use support::prometheus::{Prometheus, prometheus_bin};
use support::rollout::{Fixture, small_redis};

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring")
}

/// Regression (issue 72): `promtool check metrics` found 13 counters without HELP: the
/// agent wrote only OpenMetrics, whose counter HELP names the family, not its `_total`
/// samples. A client that does not ask for OpenMetrics gets the classic format.
#[test]
fn the_metrics_in_the_classic_format_pass_promtool_check_metrics() {
    let classic = linnet::telemetry::classic::to_classic(&every_family());
    let mut child = Command::new(prometheus_bin().join("promtool"))
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs (tests/prometheus/build.sh builds it)");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(classic.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check metrics:\n{said}\n{classic}"
    );
    assert!(!said.contains("no help text"), "{said}");
}

/// Runs promtool with `args`; panics with its output unless it succeeds.
fn promtool(args: &[&str]) -> String {
    let out = Command::new(prometheus_bin().join("promtool"))
        .args(args)
        .current_dir(monitoring_dir())
        .output()
        .expect("promtool runs (tests/prometheus/build.sh builds it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

fn yaml_file(path: &Path) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The metric names in a PromQL expression: `linnet_…` words.
fn linnet_metrics_in(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("linnet_") {
        let word: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + word.len()..];
        names.insert(word);
    }
    names
}

/// Every series name the agent's metrics can have: each family, with its type's suffixes.
/// A family shows only once it has a series, so each labelled one is given one first.
fn served_names() -> BTreeSet<String> {
    use linnet::telemetry::{KindLabel, RolloutSeries};
    let m = linnet::agent::metrics();
    m.source_state("default", true, 0, 0, 1.0);
    let _ = m.encode_with_rollouts([
        (
            "CanaryStatefulSet",
            "a",
            "b",
            RolloutSeries::Stalled("X".into()),
        ),
        (
            "CanaryStatefulSet",
            "a",
            "b",
            RolloutSeries::Failed("Failed".into()),
        ),
    ]);
    m.rollout_phase("CanaryStatefulSet", "a/b", Some("Stable"));
    m.reconcile_duration
        .get_or_create(&KindLabel {
            kind: "CanaryStatefulSet".into(),
        })
        .observe(0.1);
    m.webhook("github", "accepted");
    m.notifications
        .get_or_create(&linnet::telemetry::NotifyLabels {
            receiver: "r".into(),
            result: "sent".into(),
        })
        .inc();
    let text = m.encode();
    names_in(&text)
}

/// The metrics with a series of each family, as the agent encodes them (OpenMetrics).
fn every_family() -> String {
    use linnet::telemetry::{KindLabel, RolloutSeries};
    let m = linnet::agent::metrics();
    m.source_state("default", true, 0, 0, 1.0);
    let _ = m.encode_with_rollouts([(
        "CanaryStatefulSet",
        "a",
        "b",
        RolloutSeries::Stalled("X".into()),
    )]);
    m.reconcile_duration
        .get_or_create(&KindLabel {
            kind: "CanaryStatefulSet".into(),
        })
        .observe(0.1);
    m.webhook("github", "accepted");
    m.encode()
}

fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            _ => &[""],
        };
        for s in suffixes {
            names.insert(format!("{name}{s}"));
        }
    }
    names
}

#[test]
fn the_alert_rules_pass_promtool_and_their_own_tests() {
    let checked = promtool(&["check", "rules", "alerts.yaml"]);
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // The PrometheusRule for prometheus-operator holds the same rules.
    let rules = yaml_file(&monitoring_dir().join("alerts.yaml"));
    let wrapped = yaml_file(&monitoring_dir().join("prometheusrule.yaml"));
    assert_eq!(wrapped["kind"], "PrometheusRule");
    assert_eq!(
        wrapped["spec"], rules,
        "prometheusrule.yaml differs from alerts.yaml"
    );
    // Every metric a rule reads is one the agent serves.
    let served = served_names();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            for name in linnet_metrics_in(rule["expr"].as_str().unwrap()) {
                assert!(
                    served.contains(&name),
                    "alert {} reads {name}, which the agent does not serve",
                    rule["alert"]
                );
            }
        }
    }
}

#[test]
fn every_dashboard_query_is_valid_promql_over_metrics_the_agent_serves() {
    let path = monitoring_dir().join("grafana-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .expect("grafana-dashboard.json is JSON");
    assert_eq!(dashboard["uid"], "linnet");
    let panels = dashboard["panels"].as_array().unwrap();
    let served = served_names();
    let mut exprs = Vec::new();
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_i64().unwrap()),
            "two panels with id {}",
            panel["id"]
        );
        let pos = &panel["gridPos"];
        assert!(
            pos["x"].as_i64().unwrap() + pos["w"].as_i64().unwrap() <= 24,
            "panel {} is wider than the grid",
            panel["title"]
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {} does not use the dashboard's data source variable",
            panel["title"]
        );
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            for name in linnet_metrics_in(expr) {
                assert!(
                    served.contains(&name),
                    "panel {} reads {name}, which the agent does not serve",
                    panel["title"]
                );
            }
            // Grafana's own variable, as Grafana would substitute it.
            exprs.push(expr.replace("$__rate_interval", "5m"));
        }
    }
    assert!(exprs.len() >= 10, "{} queries", exprs.len());
    // promtool parses each query as the expression of a recording rule.
    let dir = tempfile::tempdir().unwrap();
    let rules = json!({"groups": [{"name": "dashboard", "rules": exprs.iter().enumerate()
        .map(|(i, e)| json!({"record": format!("dashboard:query{i}"), "expr": e}))
        .collect::<Vec<_>>()}]});
    let file = dir.path().join("dashboard-queries.json.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(&rules).unwrap()).unwrap();
    let checked = promtool(&["check", "rules", file.to_str().unwrap()]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{checked}"
    );
}

/// The alerts Prometheus has now: (name, state, labels).
async fn alerts(prometheus: &Prometheus) -> Vec<(String, String, Value)> {
    let body: Value = support::http()
        .get(format!("{}/api/v1/alerts", prometheus.address()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["data"]["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|a| {
            (
                a["labels"]["alertname"].as_str().unwrap_or_default().into(),
                a["state"].as_str().unwrap_or_default().into(),
                a["labels"].clone(),
            )
        })
        .collect()
}

/// The value of `query`'s first sample, if any.
async fn query(prometheus: &Prometheus, query: &str) -> Option<f64> {
    let body: Value = support::http()
        .post(format!("{}/api/v1/query", prometheus.address()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("query={}", linnet::text::percent_encoded(query)))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    body["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// The alert rules as shipped, in a real Prometheus scraping a real agent through
/// `--metrics-listen`: a rollout whose StatefulSet the API server refuses is Stalled, and
/// LinnetRolloutStalled goes pending, then fires, naming it; once Git fixes the spec the
/// series goes and so does the alert. Nothing else fires.
#[tokio::test]
async fn a_stalled_rollout_fires_its_alert_in_a_real_prometheus() {
    let mut f = Fixture::prepare("monitor", |ns| {
        let mut spec = small_redis(ns, json!({}));
        // A port the API server refuses (0 is not a valid port); validate does not check pods.
        spec["spec"]["template"]["template"]["spec"]["containers"][0]["ports"] =
            json!([{"containerPort": 0}]);
        spec
    })
    .await;
    let metrics_port = free_port();
    let agent = f.spawn_agent(
        "agent",
        &[format!("--metrics-listen=127.0.0.1:{metrics_port}")],
    );
    wait_ready(&agent).await;
    f.agent = Some(agent);
    // The metrics port serves /metrics and nothing else.
    let base = format!("http://127.0.0.1:{metrics_port}");
    let text = support::http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("linnet_leader 1"), "{text}");
    let status = support::http()
        .get(format!("{base}/status"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 404, "/status must not be on the metrics port");

    let prometheus = Prometheus::scraping_with_rules(
        &format!("127.0.0.1:{metrics_port}"),
        &[monitoring_dir().join("alerts.yaml")],
    )
    .await;
    let ns = f.ns.name.clone();
    f.wait_for("Stalled", 60, |r: &CanaryStatefulSet| {
        r.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Stalled" && c.status == "True")
        })
    })
    .await;
    let stalled_here = |alerts: &[(String, String, Value)], state: &str| {
        alerts.iter().any(|(name, s, labels)| {
            name == "LinnetRolloutStalled"
                && s == state
                && labels["namespace"] == ns.as_str()
                && labels["name"] == "redis"
                && labels["kind"] == "CanaryStatefulSet"
                && labels["reason"] == "ActionFailed"
        })
    };
    eventually(
        "LinnetRolloutStalled pending",
        Duration::from_secs(30),
        || {
            let prometheus = &prometheus;
            async move { stalled_here(&alerts(prometheus).await, "pending").then_some(()) }
        },
    )
    .await;
    // `for: 1m` in alerts.yaml, evaluated every second here.
    let fired = eventually(
        "LinnetRolloutStalled firing",
        Duration::from_secs(100),
        || {
            let prometheus = &prometheus;
            async move {
                let all = alerts(prometheus).await;
                stalled_here(&all, "firing").then_some(all)
            }
        },
    )
    .await;
    // The refused apply is retried, and each retry counts as a reconcile error:
    // LinnetReconcileErrors may be pending (for 15 minutes); nothing else fires.
    let others: Vec<_> = fired
        .iter()
        .filter(|(name, state, _)| name != "LinnetRolloutStalled" && state == "firing")
        .collect();
    assert!(others.is_empty(), "the agent fired {others:?}");
    assert_eq!(query(&prometheus, "linnet_source_ready").await, Some(1.0));
    assert_eq!(query(&prometheus, "linnet_leader").await, Some(1.0));
    let since = query(
        &prometheus,
        "time() - linnet_source_last_success_timestamp_seconds",
    )
    .await
    .expect("a last-success time once the source is Ready");
    assert!((0.0..120.0).contains(&since), "{since}");

    // Git fixes the port: the rollout goes on, its series goes, and the alert with it.
    f.spec["spec"]["template"]["template"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("ports");
    f.write();
    eventually(
        "LinnetRolloutStalled resolved",
        Duration::from_secs(60),
        || {
            let prometheus = &prometheus;
            async move {
                let all = alerts(prometheus).await;
                (!all
                    .iter()
                    .any(|(name, _, _)| name == "LinnetRolloutStalled"))
                .then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        query(&prometheus, "count(linnet_rollout_stalled)").await,
        None,
        "the fixed rollout still has a stalled series"
    );
}
