//! One gate through a provider's four answers (issue 75: "every provider: a passing, a
//! failing, an erroring and a timing-out query"), for the providers tested against stand-ins
//! of their documented APIs. The stand-in answers query `pass` with 0.01, `fail` with 0.3,
//! `refused` with the API's error, and `slow` after 3 s.

use std::time::Duration;

use linnet::api::{AnalysisPhase, AnalysisTemplate, CanaryDeployment, DeploymentPhase};
use serde_json::{Value, json};

use super::{
    completed_on, deploy_phase, first_gate_metric_once_completed, run, support, template, web,
};
use support::rollout::Fixture;

/// A provider under test.
pub struct Provider<'a> {
    /// The test namespace's prefix.
    pub prefix: &'static str,
    /// The stand-in's port on 127.0.0.1, allowed by `--analysis-url-prefix`.
    pub port: u16,
    /// `http` or `https`, as the server on `port` speaks.
    pub scheme: &'static str,
    /// The key files (name, content), written to the agent's `--analysis-files-dir`.
    pub key_files: &'a [(&'a str, &'a str)],
    /// The `provider` of a metric querying `query` (the first argument) with the key files in
    /// the directory (the second), with a 1 s timeout.
    pub provider: &'a dyn Fn(&str, &str) -> Value,
    /// How status shows the `pass` query's provider: the start of `metric.query`.
    pub query_shown: &'static str,
    /// What a measurement of the `refused` query says.
    pub refusal: &'static str,
}

/// Passing, failing, refused and timed-out queries through a gate: the gate passes, rolls
/// back naming the value, and holds while the query errs, naming the error; it goes on by
/// itself once the query answers again.
pub async fn passes_fails_errs_and_times_out(p: Provider<'_>) {
    let patch = json!({"pause": "None", "analysis": {
        "gates": [{"after": 1, "templates": [{"templateName": "gate"}]}],
    }});
    let mut f = Fixture::prepare(p.prefix, |ns| web(ns, patch)).await;
    let ns = f.ns.name.clone();
    let port = p.port;
    let keys = tempfile::tempdir().unwrap();
    for (name, content) in p.key_files {
        std::fs::write(keys.path().join(name), content).unwrap();
    }
    let keys_dir = keys.path().display().to_string();
    let gate_template = |query: &str| {
        template(
            &ns,
            "gate",
            json!({"name": "errors", "interval": "1s", "count": 2,
                "successCondition": "result < 0.05", "consecutiveErrorLimit": 0,
                "provider": (p.provider)(query, &keys_dir)}),
        )
    };
    f.write_file("templates.yaml", &[gate_template("pass")]);
    f.start_agent_with(&[
        format!("--analysis-url-prefix={}://127.0.0.1:{port}/", p.scheme),
        format!("--analysis-files-dir={keys_dir}"),
    ])
    .await;
    f.wait_for("Completed on nginx:1.27", 120, |d: &CanaryDeployment| {
        completed_on(d, "nginx:1.27")
    })
    .await;

    // Passing: the gate's two measurements are the last point, 0.01.
    f.patch_spec(json!({"image": "nginx:1.28"}));
    let metric = first_gate_metric_once_completed(&f, "nginx:1.28").await;
    assert_eq!(metric.successful, 2, "{metric:#?}");
    assert_eq!(metric.measurements[0].value.as_deref(), Some("0.01"));
    assert!(
        metric
            .query
            .as_deref()
            .is_some_and(|q| q.starts_with(p.query_shown)),
        "{metric:#?}"
    );

    // Failing: 0.3, rolled back with the value and the condition.
    let templates = f.api::<AnalysisTemplate>();
    let with = |query: &'static str| {
        let api = templates.clone();
        let want = (p.provider)(query, &keys_dir);
        async move {
            support::eventually(
                &format!("the {query} template in the cluster"),
                Duration::from_secs(60),
                || {
                    let (api, want) = (api.clone(), want.clone());
                    async move {
                        let t = api.get("gate").await.ok()?;
                        let provider = serde_json::to_value(&t.spec.metrics[0].provider).ok()?;
                        (provider == want).then_some(())
                    }
                },
            )
            .await
        }
    };
    f.write_file("templates.yaml", &[gate_template("fail")]);
    with("fail").await;
    f.patch_spec(json!({"image": "nginx:1.29"}));
    let back = f
        .wait_for("RolledBack from 1.29", 120, |d: &CanaryDeployment| {
            deploy_phase(d) == Some(DeploymentPhase::RolledBack)
        })
        .await;
    let gate = run(&back.status.as_ref().unwrap().analysis, "after-1").clone();
    assert_eq!(gate.phase, AnalysisPhase::Failed, "{gate:#?}");
    let message = gate.message.unwrap_or_default();
    assert!(
        message.starts_with("errors 0.3 failed result < 0.05"),
        "{message}"
    );

    // Refused by the API (400): the gate holds, the measurement naming the answer.
    f.write_file("templates.yaml", &[gate_template("refused")]);
    with("refused").await;
    f.patch_spec(json!({"image": "nginx:1.30"}));
    let erring = |what: &'static str| {
        move |d: &CanaryDeployment| {
            d.status.as_ref().is_some_and(|s| {
                s.analysis.iter().any(|r| {
                    r.name == "after-1"
                        && r.phase == AnalysisPhase::Error
                        && r.metrics[0]
                            .measurements
                            .last()
                            .and_then(|m| m.message.as_deref())
                            .is_some_and(|m| m.contains(what))
                })
            })
        }
    };
    let held = f
        .wait_for("the gate erring on a refused query", 120, erring(p.refusal))
        .await;
    assert_eq!(
        held.status.unwrap().stable_image.as_deref(),
        Some("nginx:1.28")
    );

    // Timing out (the answer after 3 s, the metric's timeout 1 s): still held, said so.
    f.write_file("templates.yaml", &[gate_template("slow")]);
    with("slow").await;
    f.wait_for(
        "the gate erring on a timeout",
        120,
        erring("no answer within the metric's timeout"),
    )
    .await;

    // Answering again: the held gate goes on by itself and the canary completes.
    f.write_file("templates.yaml", &[gate_template("pass")]);
    f.wait_for("Completed on nginx:1.30", 120, |d: &CanaryDeployment| {
        completed_on(d, "nginx:1.30")
    })
    .await;
}
