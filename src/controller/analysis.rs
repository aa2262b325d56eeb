//! Taking measurements: the I/O half of analysis. Before each plan, a controller resolves the
//! rollout's templates from a watch-fed store ([`Templates`]), then takes the measurements the
//! records in status say are due ([`measure`]): a Prometheus instant query, a web request, or
//! a Job. It records each with [`crate::plan::analysis::record`]; deciding what they mean is
//! the planner's.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

use crate::api::{AnalysisRunStatus, AnalysisTemplate, RolloutAnalysis};
use crate::plan::analysis::{
    self, Builtins, Outcome, Resolved, ResolvedMetric, analysis_job, measuring,
};
use crate::plan::objects::RolloutRef;
use crate::watch::StoreReady;

/// The AnalysisTemplates of this agent's source, from one watch.
pub struct Templates {
    store: Store<AnalysisTemplate>,
    ready: StoreReady,
}

impl Templates {
    /// Starts the watch of the templates labelled `selector`, through `api`.
    pub fn watch(api: Api<AnalysisTemplate>, selector: &str) -> Templates {
        let (store, writer) = reflector::store();
        let stream = watcher(api, crate::watch::watch_config(selector))
            .backoff(crate::watch::backoff::watch_backoff())
            .modify(|t| t.metadata.managed_fields = None)
            .reflect(writer)
            .touched_objects();
        crate::liveness::spawn("AnalysisTemplate watch", async move {
            futures::pin_mut!(stream);
            use futures::StreamExt;
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "watching AnalysisTemplates failed; retrying (is deploy/crds/crds.yaml applied, and may linnet list analysistemplates?)");
                }
            }
        });
        Templates {
            ready: StoreReady::of(store.clone()),
            store,
        }
    }

    /// Resolves `analysis` of a rollout in `namespace`, once the store has listed.
    pub async fn resolve(
        &self,
        analysis: Option<&RolloutAnalysis>,
        namespace: &str,
        builtins: &Builtins,
    ) -> Resolved {
        if analysis.is_none() {
            return Resolved::default();
        }
        // A store that never lists (no CRD) must not hold the reconcile: then the templates
        // are reported missing.
        let _ = tokio::time::timeout(Duration::from_secs(10), self.ready.wait()).await;
        let lookup = |name: &str| {
            self.store
                .get(&ObjectRef::new(name).within(namespace))
                .map(|t| t.spec.clone())
        };
        analysis::resolve(analysis, &lookup, builtins)
    }
}

/// Why a measurement could not be taken; recorded as the measurement's Error (never a failed
/// reconcile), with a URL's credentials redacted.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// What the agent's flags do not allow: a file outside --analysis-files-dir, a URL under
    /// no --analysis-url-prefix, a token with no prefix set.
    #[error("{0}")]
    Refused(String),
    #[error("{field} {path}: {}", crate::error::io_reason(.source))]
    File {
        field: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] crate::net::CaFileError),
    #[error("{what}: {why}")]
    BadUrl { what: String, why: String },
    /// The request got no answer.
    #[error("{target}: {why}")]
    Unreachable { target: String, why: String },
    #[error("the answer is over {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
    #[error("cannot read {field} {}: {}", path.display(), crate::error::io_reason(.source))]
    Token {
        field: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An answer that holds no value: an error status, no JSON, no number, no match.
    #[error("{0}")]
    Answer(String),
}

/// What a template from Git may make the agent read and request (`--analysis-files-dir`,
/// `--analysis-url-prefix`).
#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub files_dir: Option<PathBuf>,
    pub url_prefixes: Vec<String>,
}

impl Policy {
    /// `path` if it is a file inside the files directory (after resolving links).
    fn file(&self, field: &'static str, path: &str) -> Result<PathBuf, MeasureError> {
        let Some(dir) = &self.files_dir else {
            return Err(MeasureError::Refused(format!(
                "{field} {path} is refused: the agent allows no files (start it with --analysis-files-dir)"
            )));
        };
        let inside = std::fs::canonicalize(dir)
            .and_then(|dir| Ok((dir, std::fs::canonicalize(path)?)))
            .map(|(dir, file)| (file.starts_with(&dir), file));
        match inside {
            Ok((true, file)) => Ok(file),
            Ok((false, _)) => Err(MeasureError::Refused(format!(
                "{field} {path} is refused: it is not inside --analysis-files-dir {}",
                dir.display()
            ))),
            Err(source) => Err(MeasureError::File {
                field,
                path: path.to_string(),
                source,
            }),
        }
    }

    /// Whether `url` (parsed) is under a prefix: the same scheme, host and port, and a path
    /// that starts with the prefix's. Compared parsed, so `http://prom:9090` does not admit
    /// `http://prom.evil.example:9090/` or a `@` trick.
    fn url(&self, url: &reqwest::Url) -> Result<(), MeasureError> {
        let under = |prefix: &String| {
            reqwest::Url::parse(prefix).is_ok_and(|p| {
                p.scheme() == url.scheme()
                    && p.host_str() == url.host_str()
                    && p.port_or_known_default() == url.port_or_known_default()
                    && url.path().starts_with(p.path())
            })
        };
        if self.url_prefixes.is_empty() || self.url_prefixes.iter().any(under) {
            return Ok(());
        }
        Err(MeasureError::Refused(format!(
            "{} is refused: it is under none of --analysis-url-prefix {}",
            crate::text::redact_credentials(url.as_str()),
            self.url_prefixes.join(", ")
        )))
    }
}

/// HTTP clients by CA file (one of `--analysis-files-dir`'s, or none): building one reads
/// the platform's roots. A request's own timeout is the metric's.
#[derive(Default)]
pub struct HttpClients(Mutex<HashMap<Option<PathBuf>, reqwest::Client>>);

impl HttpClients {
    fn get(&self, ca_file: Option<&std::path::Path>) -> Result<reqwest::Client, MeasureError> {
        let key = ca_file.map(PathBuf::from);
        if let Ok(clients) = self.0.lock()
            && let Some(c) = clients.get(&key)
        {
            return Ok(c.clone());
        }
        let client = crate::net::http_client_no_redirects(key.as_deref(), analysis::MAX_TIMEOUT)?;
        if let Ok(mut clients) = self.0.lock() {
            clients.insert(key, client.clone());
        }
        Ok(client)
    }
}

/// The rollout a measurement is for.
pub struct Measured<'a> {
    pub reference: &'a RolloutRef,
    pub kind: &'a str,
    /// Whether the rollout is in a phase whose analysis runs (a canary under way).
    pub active: bool,
}

/// Takes every measurement due at `now` in `runs` and records it; reads the Jobs of `job`
/// measurements under way. Errors are measurements too (phase Error), never a failed reconcile.
pub async fn measure(
    ctx: &super::Context,
    rollout: Measured<'_>,
    runs: &mut [AnalysisRunStatus],
    resolved: &Resolved,
    now: jiff::Timestamp,
) {
    if !rollout.active {
        return;
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &rollout.reference.namespace);
    let budget = tokio::time::Instant::now() + analysis::MAX_TIMEOUT;
    for run in runs.iter_mut().filter(|r| measuring(r.phase)) {
        let Some(Ok(metrics)) = resolved.runs.get(&run.name) else {
            continue;
        };
        let due: Vec<String> = analysis::due(run, metrics, now)
            .into_iter()
            .map(|m| m.metric.name.clone())
            .collect();
        for m in metrics {
            let Some(index) = run.metrics.iter().position(|s| s.name == m.metric.name) else {
                continue;
            };
            let outcome = if let Some(job) = run.metrics[index].job.clone() {
                match job_outcome(&jobs, &job).await {
                    Some(outcome) => {
                        run.metrics[index].job = None;
                        outcome
                    }
                    None => continue,
                }
            } else if !due.contains(&m.metric.name) {
                continue;
            } else if m.metric.provider.job.is_some() {
                start_job(ctx, &jobs, &rollout, run, (m, index), now).await;
                continue;
            } else {
                // All of a reconcile's measurements together get one query's longest time,
                // so many metrics cannot hold a reconcile for their timeouts' sum.
                tokio::time::timeout_at(budget, measured(ctx, m))
                    .await
                    .unwrap_or_else(|_| {
                        Outcome::Error(format!(
                            "not measured: this reconcile's measurements took over {} s together; use fewer metrics or shorter timeouts",
                            analysis::MAX_TIMEOUT.as_secs()
                        ))
                    })
            };
            record_measurement(ctx, &rollout, run, (m, index), outcome, now);
        }
    }
}

/// Starts the Job that takes metric `m` (at `index` in `run`); a Job that cannot be
/// created is a measurement in error.
async fn start_job(
    ctx: &super::Context,
    jobs: &Api<Job>,
    rollout: &Measured<'_>,
    run: &mut AnalysisRunStatus,
    (m, index): (&ResolvedMetric, usize),
    now: jiff::Timestamp,
) {
    let st = &run.metrics[index];
    let ordinal = st.count + st.errors + 1;
    let Some(job) = analysis_job(rollout.reference, rollout.kind, run, m, ordinal) else {
        return;
    };
    let name = job.metadata.name.clone().unwrap_or_default();
    let params = crate::kube_client::post_as(crate::api::field_managers::ANALYSIS);
    match jobs.create(&params, &job).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => {
            let why = format!(
                "cannot create Job {name}: {}",
                crate::error::kube_message(&e)
            );
            count(ctx, "job", "Error");
            let gate = run.name != analysis::BACKGROUND;
            analysis::record(m, &mut run.metrics[index], Outcome::Error(why), gate, now);
            return;
        }
    }
    let reference = rollout.reference;
    tracing::info!(rollout = %format!("{}/{}", reference.namespace, reference.name), run = %run.name, metric = %m.metric.name, job = %name, "analysis Job created");
    run.metrics[index].job = Some(name);
}

/// Records a measurement of metric `m` (at `index` in `run`), counts it and logs it.
fn record_measurement(
    ctx: &super::Context,
    rollout: &Measured<'_>,
    run: &mut AnalysisRunStatus,
    (m, index): (&ResolvedMetric, usize),
    outcome: Outcome,
    now: jiff::Timestamp,
) {
    let gate = run.name != analysis::BACKGROUND;
    let st = &mut run.metrics[index];
    analysis::record(m, st, outcome, gate, now);
    let last = st.measurements.last();
    let phase = last.map(|x| x.phase.as_str()).unwrap_or_default();
    count(ctx, provider_name(m), phase);
    let reference = rollout.reference;
    tracing::info!(
        rollout = %format!("{}/{}", reference.namespace, reference.name),
        run = %run.name,
        metric = %m.metric.name,
        value = last.and_then(|x| x.value.as_deref()).unwrap_or(""),
        phase = ?last.map(|x| x.phase),
        message = last.and_then(|x| x.message.as_deref()).unwrap_or(""),
        "measured"
    );
}

fn provider_name(m: &ResolvedMetric) -> &'static str {
    let p = &m.metric.provider;
    if p.prometheus.is_some() {
        "prometheus"
    } else if p.web.is_some() {
        "web"
    } else {
        "job"
    }
}

fn count(ctx: &super::Context, provider: &str, phase: &str) {
    ctx.metrics
        .analysis_measurements
        .get_or_create(&crate::telemetry::MeasurementLabels {
            provider: provider.to_string(),
            phase: phase.to_string(),
        })
        .inc();
}

/// A finished Job's result: `true` when it completed, `false` when it failed; `None` while
/// it runs.
async fn job_outcome(jobs: &Api<Job>, name: &str) -> Option<Outcome> {
    match jobs.get_opt(name).await {
        Ok(Some(job)) => {
            let view = crate::plan::observed::JobView::from_object(&job);
            if view.succeeded {
                Some(Outcome::Value(Value::Bool(true)))
            } else if view.failed {
                Some(Outcome::Value(Value::Bool(false)))
            } else {
                None
            }
        }
        Ok(None) => Some(Outcome::Error(format!(
            "Job {name} is gone before it finished"
        ))),
        Err(e) => {
            tracing::warn!(job = name, error = %crate::error::kube_message(&e), "cannot read an analysis Job; trying again at the next reconcile");
            None
        }
    }
}

mod providers;

pub use providers::prometheus_result;
use providers::{MAX_ANSWER_BYTES, measured};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_template_names_only_files_inside_the_files_dir_and_allowed_urls() {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        std::fs::create_dir(&allowed).unwrap();
        std::fs::write(allowed.join("token"), "t").unwrap();
        std::fs::write(dir.path().join("git-token"), "secret").unwrap();
        std::os::unix::fs::symlink(dir.path().join("git-token"), allowed.join("link")).unwrap();
        let none = Policy::default();
        let e = none.file("bearerTokenFile", "/etc/hostname").unwrap_err();
        assert!(e.to_string().contains("--analysis-files-dir"), "{e}");
        let policy = Policy {
            files_dir: Some(allowed.clone()),
            url_prefixes: vec!["http://prometheus.monitoring:9090/".into()],
        };
        let token = allowed.join("token");
        assert!(
            policy
                .file("bearerTokenFile", token.to_str().unwrap())
                .is_ok()
        );
        for escape in [
            dir.path().join("git-token"),
            allowed.join("../git-token"),
            allowed.join("link"),
        ] {
            let e = policy
                .file("bearerTokenFile", escape.to_str().unwrap())
                .unwrap_err();
            assert!(e.to_string().contains("not inside"), "{e}");
        }
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(
            policy
                .url(&url("http://prometheus.monitoring:9090/api/v1/query"))
                .is_ok()
        );
        for refused in [
            "http://prometheus.monitoring:9090@evil/",
            "http://prometheus.monitoring.evil.example:9090/",
            "https://prometheus.monitoring:9090/",
            "http://prometheus.monitoring:9091/",
            "http://10.0.0.1/",
        ] {
            let e = policy.url(&url(refused)).unwrap_err();
            assert!(
                e.to_string().contains("--analysis-url-prefix"),
                "{refused}: {e}"
            );
        }
        let no_slash = Policy {
            files_dir: None,
            url_prefixes: vec!["http://prometheus.monitoring:9090".into()],
        };
        assert!(
            no_slash
                .url(&url("http://prometheus.monitoring:9090/api/v1/query"))
                .is_ok()
        );
        assert!(
            no_slash
                .url(&url("http://prometheus.monitoring:9091/"))
                .is_err()
        );
        assert!(none.url(&url("http://anything/")).is_ok());
    }

    #[test]
    fn prometheus_answers_become_results() {
        let prometheus_result_text =
            |doc: &Value| prometheus_result(doc).map_err(|e| e.to_string());
        let vector = |samples: Value| json!({"status": "success", "data": {"resultType": "vector", "result": samples}});
        assert_eq!(
            prometheus_result_text(&vector(json!([{"metric": {}, "value": [1.0, "0.31"]}]))),
            Ok(json!(0.31))
        );
        assert_eq!(
            prometheus_result_text(&vector(
                json!([{"value": [1.0, "1"]}, {"value": [1.0, "2"]}])
            )),
            Ok(json!([1.0, 2.0]))
        );
        assert!(
            prometheus_result_text(&vector(json!([])))
                .unwrap_err()
                .contains("no samples")
        );
        assert!(
            prometheus_result_text(&vector(json!([{"value": [1.0, "NaN"]}])))
                .unwrap_err()
                .contains("NaN")
        );
        assert_eq!(
            prometheus_result_text(
                &json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "2.5"]}})
            ),
            Ok(json!(2.5))
        );
        let bad = json!({"status": "error", "errorType": "bad_data", "error": "parse error"});
        assert_eq!(
            prometheus_result_text(&bad),
            Err("the query failed: bad_data parse error".into())
        );
    }
}
