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
use kube::api::PostParams;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::Value;

use super::StoreReady;
use crate::api::{
    AnalysisRunStatus, AnalysisTemplate, PrometheusMetric, RolloutAnalysis, WebMethod, WebMetric,
};
use crate::plan::analysis::{
    self, Builtins, Outcome, Resolved, ResolvedMetric, analysis_job, measuring,
};
use crate::plan::objects::RolloutRef;

/// The most of an answer read; a metric's answer is a number or a small JSON document.
const MAX_ANSWER_BYTES: usize = 256 * 1024;
/// The most of a bearer token file read.
const MAX_TOKEN_BYTES: u64 = 16 * 1024;

/// The AnalysisTemplates of this agent's source, from one watch.
pub struct Templates {
    store: Store<AnalysisTemplate>,
    ready: StoreReady,
}

impl Templates {
    /// Starts the watch of the templates labelled `selector`.
    pub fn watch(client: Client, selector: &str) -> Templates {
        let (store, writer) = reflector::store();
        let stream = watcher(
            Api::<AnalysisTemplate>::all(client),
            super::watch_config(selector),
        )
        .backoff(crate::controller::backoff::watch_backoff())
        .modify(|t| t.metadata.managed_fields = None)
        .reflect(writer)
        .touched_objects();
        tokio::spawn(async move {
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
    #[error("{field} {path}: {source}")]
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
    #[error("cannot read bearerTokenFile {}: {source}", path.display())]
    Token {
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
    let ns = &rollout.reference.namespace;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let budget = tokio::time::Instant::now() + analysis::MAX_TIMEOUT;
    for run in runs.iter_mut().filter(|r| measuring(r.phase)) {
        let Some(Ok(metrics)) = resolved.runs.get(&run.name) else {
            continue;
        };
        let gate = run.name != analysis::BACKGROUND;
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
            } else if due.contains(&m.metric.name) {
                if m.metric.provider.job.is_some() {
                    let st = &run.metrics[index];
                    let ordinal = st.count + st.errors + 1;
                    match analysis_job(rollout.reference, rollout.kind, run, m, ordinal) {
                        Some(job) => {
                            let name = job.metadata.name.clone().unwrap_or_default();
                            match jobs.create(&PostParams::default(), &job).await {
                                Ok(_) => {}
                                Err(kube::Error::Api(s)) if s.code == 409 => {}
                                Err(e) => {
                                    let why = format!(
                                        "cannot create Job {name}: {}",
                                        crate::error::kube_message(&e)
                                    );
                                    count(ctx, "job", "Error");
                                    analysis::record(
                                        m,
                                        &mut run.metrics[index],
                                        Outcome::Error(why),
                                        gate,
                                        now,
                                    );
                                    continue;
                                }
                            }
                            tracing::info!(rollout = %format!("{ns}/{}", rollout.reference.name), run = %run.name, metric = %m.metric.name, job = %name, "analysis Job created");
                            run.metrics[index].job = Some(name);
                            continue;
                        }
                        None => continue,
                    }
                }
                // All of a reconcile's measurements together get one query's longest time,
                // so many metrics cannot hold a reconcile for their timeouts' sum.
                tokio::time::timeout_at(budget, query(ctx, m))
                    .await
                    .unwrap_or_else(|_| {
                        Outcome::Error(format!(
                            "not measured: this reconcile's measurements took over {} s together; use fewer metrics or shorter timeouts",
                            analysis::MAX_TIMEOUT.as_secs()
                        ))
                    })
            } else {
                continue;
            };
            let provider = provider_name(m);
            let st = &mut run.metrics[index];
            analysis::record(m, st, outcome, gate, now);
            let last = st.measurements.last();
            count(
                ctx,
                provider,
                &last.map(|x| format!("{:?}", x.phase)).unwrap_or_default(),
            );
            tracing::info!(
                rollout = %format!("{ns}/{}", rollout.reference.name),
                run = %run.name,
                metric = %m.metric.name,
                value = last.and_then(|x| x.value.as_deref()).unwrap_or(""),
                phase = ?last.map(|x| x.phase),
                message = last.and_then(|x| x.message.as_deref()).unwrap_or(""),
                "measured"
            );
        }
    }
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

async fn query(ctx: &super::Context, m: &ResolvedMetric) -> Outcome {
    let p = &m.metric.provider;
    let result = if let Some(prom) = &p.prometheus {
        prometheus(ctx, prom, m.timeout).await
    } else if let Some(web) = &p.web {
        web_request(ctx, web, m.timeout).await
    } else {
        Err(MeasureError::Answer("the metric has no provider".into()))
    };
    match result {
        Ok(v) => Outcome::Value(v),
        // A URL in Git may carry a password; the error is kept in status.
        Err(e) => Outcome::Error(crate::text::redact_credentials(&e.to_string())),
    }
}

/// Reads at most [`MAX_ANSWER_BYTES`] of a body; more is an error.
async fn body(mut r: reqwest::Response, target: &str) -> Result<Vec<u8>, MeasureError> {
    let mut out = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| MeasureError::Unreachable {
        target: target.to_string(),
        why: crate::net::explain_http(&e).1,
    })? {
        if out.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(MeasureError::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn read_token(path: &std::path::Path) -> Result<String, MeasureError> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_BYTES).read_to_string(&mut text))
        .map_err(|source| MeasureError::Token {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(text.trim().to_string())
}

async fn prometheus(
    ctx: &super::Context,
    p: &PrometheusMetric,
    timeout: Duration,
) -> Result<Value, MeasureError> {
    let ca_file = match &p.ca_file {
        Some(f) => Some(ctx.analysis.file("caFile", f)?),
        None => None,
    };
    let client = ctx.http.get(ca_file.as_deref())?;
    let url = reqwest::Url::parse_with_params(
        &format!("{}/api/v1/query", p.address.trim_end_matches('/')),
        &[("query", p.query.as_str())],
    )
    .map_err(|e| MeasureError::BadUrl {
        what: format!("Prometheus address {:?}", p.address),
        why: e.to_string(),
    })?;
    // The URL as it will be requested (parsed and normalised), not as written.
    ctx.analysis.url(&url)?;
    let mut request = client.get(url).timeout(timeout);
    if let Some(file) = &p.bearer_token_file {
        // A token goes only where the operator said queries may go.
        if ctx.analysis.url_prefixes.is_empty() {
            return Err(MeasureError::Refused(
                "bearerTokenFile is refused: the agent sends tokens only under --analysis-url-prefix, and none is set"
                    .into(),
            ));
        }
        let file = ctx.analysis.file("bearerTokenFile", file)?;
        request = request.bearer_auth(read_token(&file)?);
    }
    let target = format!("Prometheus {}", p.address);
    let answer = request
        .send()
        .await
        .map_err(|e| MeasureError::Unreachable {
            target: target.clone(),
            why: crate::net::explain_http(&e).1,
        })?;
    let status = answer.status();
    let bytes = body(answer, &target).await?;
    let doc: Value = serde_json::from_slice(&bytes)
        .map_err(|_| MeasureError::Answer(format!("{target} answered {status} with no JSON")))?;
    prometheus_result(&doc)
}

/// `result` from a Prometheus query answer.
pub fn prometheus_result(doc: &Value) -> Result<Value, MeasureError> {
    let answer = |text: String| MeasureError::Answer(text);
    if doc["status"] != "success" {
        return Err(answer(format!(
            "the query failed: {} {}",
            doc["errorType"].as_str().unwrap_or(""),
            doc["error"].as_str().unwrap_or("")
        )));
    }
    let number = |sample: &Value| -> Result<Value, MeasureError> {
        let text = sample[1].as_str().unwrap_or("");
        let x: f64 = text
            .parse()
            .map_err(|_| answer(format!("the query gave {text:?}, not a number")))?;
        serde_json::Number::from_f64(x)
            .map(Value::Number)
            .ok_or_else(|| answer(format!("the query gave {text} (no traffic yet?)")))
    };
    let data = &doc["data"];
    match data["resultType"].as_str() {
        Some("scalar") => number(&data["result"]),
        Some("vector") => {
            let samples = data["result"].as_array().cloned().unwrap_or_default();
            match samples.as_slice() {
                [] => Err(answer("the query returned no samples".into())),
                [one] => number(&one["value"]),
                many => many
                    .iter()
                    .map(|s| number(&s["value"]))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::Array),
            }
        }
        other => Err(answer(format!(
            "the query gave a {}, not a scalar or an instant vector",
            other.unwrap_or("nothing")
        ))),
    }
}

async fn web_request(
    ctx: &super::Context,
    w: &WebMetric,
    timeout: Duration,
) -> Result<Value, MeasureError> {
    let url = reqwest::Url::parse(&w.url).map_err(|e| MeasureError::BadUrl {
        what: format!("url {:?}", w.url),
        why: e.to_string(),
    })?;
    ctx.analysis.url(&url)?;
    let ca_file = match &w.ca_file {
        Some(f) => Some(ctx.analysis.file("caFile", f)?),
        None => None,
    };
    let client = ctx.http.get(ca_file.as_deref())?;
    let mut request = match w.method {
        WebMethod::Get => client.get(url),
        WebMethod::Post => client.post(url).body(w.body.clone().unwrap_or_default()),
    }
    .timeout(timeout);
    for h in &w.headers {
        request = request.header(&h.key, &h.value);
    }
    let answer = request
        .send()
        .await
        .map_err(|e| MeasureError::Unreachable {
            target: w.url.clone(),
            why: crate::net::explain_http(&e).1,
        })?;
    let status = answer.status();
    let bytes = body(answer, &w.url).await?;
    if !status.is_success() {
        return Err(MeasureError::Answer(format!("{} answered {status}", w.url)));
    }
    let doc: Value = serde_json::from_slice(&bytes)
        .map_err(|e| MeasureError::Answer(format!("{} answered no JSON: {e}", w.url)))?;
    match &w.json_path {
        None => Ok(doc),
        Some(path) => {
            use jsonpath_rust::JsonPath;
            let found = doc
                .query(path)
                .map_err(|e| MeasureError::Answer(format!("jsonPath {path}: {e}")))?;
            match found.as_slice() {
                [] => Err(MeasureError::Answer(format!(
                    "jsonPath {path} matched nothing in the answer"
                ))),
                [one] => Ok((*one).clone()),
                many => Ok(Value::Array(many.iter().map(|v| (*v).clone()).collect())),
            }
        }
    }
}

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
