//! Resolution: the templates a rollout's analysis names, with its arguments and the rollout's
//! built-ins filled into each provider's strings (bounded), and durations parsed.

use super::*;

/// What `{{ rollout.FIELD }}` is replaced with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Builtins {
    pub name: String,
    pub namespace: String,
    pub canary_image: String,
    /// `None` until the status records it.
    pub stable_image: Option<String>,
    /// A label selector (`k=v,k=v`) of the canary's pods; `None` while what tells them apart
    /// is not known yet (a Partition canary's revision before the status records it).
    pub canary_selector: Option<String>,
    /// A label selector of the stable pods; `None` as the canary's.
    pub stable_selector: Option<String>,
    /// A label selector of the baseline's pods: a CanaryDeployment's with
    /// `strategy.baseline`, else the stable pods'.
    pub baseline_selector: Option<String>,
}

impl Builtins {
    /// `{{ rollout.field }}`: an error for a field there is none of, or one not known yet (the
    /// run waits: a selector filled in as empty would measure no pod, and pass).
    fn get(&self, field: &str) -> Result<&str, FillError> {
        fn known<'b>(value: &'b Option<String>, field: &str) -> Result<&'b str, FillError> {
            value
                .as_deref()
                .ok_or_else(|| FillError::NotYetKnown(field.to_string()))
        }
        Ok(match field {
            "name" => &self.name,
            "namespace" => &self.namespace,
            "canaryImage" => &self.canary_image,
            "stableImage" => known(&self.stable_image, field)?,
            "canarySelector" => known(&self.canary_selector, field)?,
            "stableSelector" => known(&self.stable_selector, field)?,
            "baselineSelector" => known(&self.baseline_selector, field)?,
            _ => return Err(FillError::UnknownBuiltin(field.to_string())),
        })
    }
}

/// A metric ready to measure: its provider's text filled in, its durations parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedMetric {
    pub template: String,
    pub metric: Metric,
    pub interval: Duration,
    pub initial_delay: Duration,
    pub timeout: Duration,
}

/// Why a run's metrics cannot be had; the run holds, and the status says what to fix in Git.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ResolveError {
    #[error(
        "AnalysisTemplate {name} is not in namespace {namespace}; add it to the repository or fix templateName"
    )]
    MissingTemplate { name: String, namespace: String },
    #[error("AnalysisTemplate {template}: metric {metric}: {field}: {problem}")]
    BadMetric {
        template: String,
        metric: String,
        field: String,
        problem: String,
    },
    #[error("metric {0} is in two templates of one analysis; rename one")]
    SharedName(String),
    #[error("AnalysisTemplate {template}: metric {metric}: {source}")]
    Fill {
        template: String,
        metric: String,
        #[source]
        source: FillError,
    },
    #[error(transparent)]
    Duration(#[from] DurationError),
    /// The templates cannot be read yet (the agent's watch has not listed them).
    #[error("{0}")]
    Unavailable(String),
    /// A provider that does not survive its own encoding (a bug, not Git's).
    #[error("AnalysisTemplate {template}: metric {metric}: {why}")]
    Encoding {
        template: String,
        metric: String,
        why: String,
    },
}

/// Why a placeholder cannot be filled in.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FillError {
    #[error("{{{{ without }}}} in {0:?}")]
    Unclosed(String),
    #[error("argument {0} has no value; set it in spec.analysis.args in Git")]
    NoValue(String),
    #[error("{{{{ args.{0} }}}} is not an argument of the template; add it to spec.args")]
    NotAnArgument(String),
    #[error(
        "{{{{ rollout.{0} }}}} is unknown; use name, namespace, canaryImage, stableImage, canarySelector, stableSelector or baselineSelector"
    )]
    UnknownBuiltin(String),
    /// Known once the rollout's status records it; the run starts then.
    #[error(
        "{{{{ rollout.{0} }}}} is not known yet; the run starts once the rollout's status records it"
    )]
    NotYetKnown(String),
    #[error("{{{{ {0} }}}} is unknown; use {{{{ args.NAME }}}} or {{{{ rollout.FIELD }}}}")]
    Unknown(String),
    #[error("longer than {MAX_FILLED_CHARS} characters once its arguments are filled in")]
    TooLong,
}

/// A duration that does not parse.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0:?} is not a duration; write e.g. 30s, 1m or 500ms")]
pub struct DurationError(pub String);

/// A rollout's analysis, resolved: each run's metrics, or why they cannot be had.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolved {
    pub runs: BTreeMap<String, Result<Vec<ResolvedMetric>, ResolveError>>,
    /// `spec.analysis.scoring`: the judged metrics of a run are scored together.
    pub scoring: Option<crate::api::Scoring>,
}

impl Resolved {
    pub fn has(&self, run: &str) -> bool {
        self.runs.contains_key(run)
    }
}

/// Resolves every run `analysis` asks for; `template` looks an AnalysisTemplate up by name in
/// the rollout's namespace.
pub fn resolve(
    analysis: Option<&RolloutAnalysis>,
    template: &dyn Fn(&str) -> Option<AnalysisTemplateSpec>,
    builtins: &Builtins,
) -> Resolved {
    let mut out = Resolved::default();
    let Some(analysis) = analysis else {
        return out;
    };
    out.scoring = analysis.scoring;
    if let Some(background) = &analysis.background {
        out.runs.insert(
            BACKGROUND.into(),
            resolve_run(background, &analysis.args, template, builtins),
        );
    }
    for gate in &analysis.gates {
        let run = AnalysisRef {
            templates: gate.templates.clone(),
            args: gate.args.clone(),
        };
        out.runs.insert(
            gate_run(gate.after),
            resolve_run(&run, &analysis.args, template, builtins),
        );
    }
    out
}

pub(super) fn resolve_run(
    run: &AnalysisRef,
    shared: &[AnalysisArg],
    template: &dyn Fn(&str) -> Option<AnalysisTemplateSpec>,
    builtins: &Builtins,
) -> Result<Vec<ResolvedMetric>, ResolveError> {
    let mut metrics: Vec<ResolvedMetric> = Vec::new();
    for t in &run.templates {
        let name = &t.template_name;
        let spec = template(name).ok_or_else(|| ResolveError::MissingTemplate {
            name: name.clone(),
            namespace: builtins.namespace.clone(),
        })?;
        let mut args: BTreeMap<&str, Option<&str>> = spec
            .args
            .iter()
            .map(|a| (a.name.as_str(), a.value.as_deref()))
            .collect();
        for a in shared.iter().chain(&run.args) {
            if let Some(slot) = args.get_mut(a.name.as_str()) {
                *slot = Some(a.value.as_str());
            }
        }
        for m in &spec.metrics {
            if let Some((path, problem)) = metric_problems(m).into_iter().next() {
                return Err(ResolveError::BadMetric {
                    template: name.clone(),
                    metric: m.name.clone(),
                    field: path,
                    problem,
                });
            }
            if metrics.iter().any(|r| r.metric.name == m.name) {
                return Err(ResolveError::SharedName(m.name.clone()));
            }
            let encoding = |e: serde_json::Error| ResolveError::Encoding {
                template: name.clone(),
                metric: m.name.clone(),
                why: e.to_string(),
            };
            let provider = serde_json::to_value(&m.provider).map_err(encoding)?;
            let provider =
                fill_strings(provider, &|text| fill(text, &args, builtins)).map_err(|source| {
                    ResolveError::Fill {
                        template: name.clone(),
                        metric: m.name.clone(),
                        source,
                    }
                })?;
            let mut metric = m.clone();
            metric.provider = serde_json::from_value(provider).map_err(encoding)?;
            if let Some(b) = metric.baseline.as_mut() {
                let filled = fill_strings(
                    serde_json::to_value(&b.provider).map_err(encoding)?,
                    &|text| fill(text, &args, builtins),
                )
                .map_err(|source| ResolveError::Fill {
                    template: name.clone(),
                    metric: m.name.clone(),
                    source,
                })?;
                b.provider = serde_json::from_value(filled).map_err(encoding)?;
            }
            metrics.push(timed(name, metric)?);
        }
    }
    Ok(metrics)
}

/// A metric of template `template` with its arguments filled, with its interval, initial
/// delay and timeout (the provider's, at most [`MAX_TIMEOUT`]) read.
fn timed(template: &str, metric: Metric) -> Result<ResolvedMetric, ResolveError> {
    let timeout = metric
        .provider
        .timeout()
        .map(|(_, t)| t)
        .map(parse_duration)
        .transpose()?
        .unwrap_or(DEFAULT_TIMEOUT)
        .min(MAX_TIMEOUT);
    Ok(ResolvedMetric {
        template: template.to_string(),
        interval: parse_duration(&metric.interval)?,
        initial_delay: metric
            .initial_delay
            .as_deref()
            .map(parse_duration)
            .transpose()?
            .unwrap_or_default(),
        timeout,
        metric,
    })
}

pub(super) fn fill_strings(
    value: Value,
    f: &dyn Fn(&str) -> Result<String, FillError>,
) -> Result<Value, FillError> {
    Ok(match value {
        Value::String(s) => Value::String(f(&s)?),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| fill_strings(v, f))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| Ok((k, fill_strings(v, f)?)))
                .collect::<Result<_, FillError>>()?,
        ),
        other => other,
    })
}

/// Replaces `{{ args.NAME }}` and `{{ rollout.FIELD }}` in `text`.
pub(super) fn fill(
    text: &str,
    args: &BTreeMap<&str, Option<&str>>,
    builtins: &Builtins,
) -> Result<String, FillError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| FillError::Unclosed(text.to_string()))?;
        let key = after[..close].trim();
        let value = if let Some(arg) = key.strip_prefix("args.") {
            match args.get(arg) {
                Some(Some(v)) => *v,
                Some(None) => {
                    return Err(FillError::NoValue(arg.to_string()));
                }
                None => {
                    return Err(FillError::NotAnArgument(arg.to_string()));
                }
            }
        } else if let Some(field) = key.strip_prefix("rollout.") {
            builtins.get(field)?
        } else {
            return Err(FillError::Unknown(key.to_string()));
        };
        // A long argument used many times would make a string of any size.
        if out.len() + value.len() + rest.len() > MAX_FILLED_CHARS {
            return Err(FillError::TooLong);
        }
        out.push_str(value);
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Parses `30s`, `1m30s`, `500ms`, `2h`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError(text.to_string());
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 || digits > 9 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else {
            return Err(bad());
        };
        total += unit * u32::try_from(n).map_err(|_| bad())?;
        rest = &rest[len..];
    }
    Ok(total)
}
