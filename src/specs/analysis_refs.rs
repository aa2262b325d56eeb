//! The analysis a rollout references, checked across the repository's objects: each
//! AnalysisTemplate is there in the rollout's namespace, gets a value for each argument
//! without a default and no value for an argument it does not have, no metric name is in two
//! of one run's templates, each gate follows a step or batch the rollout has, and the least
//! evidence asked for has a background run to count.

use std::collections::BTreeMap;

use super::{LoadedObject, SpecError};
use crate::api::{AnalysisTemplate, CanaryDeployment, CanaryStatefulSet, RolloutAnalysis};

/// An error for each problem of each rollout's analysis, at the rollout.
pub(super) fn broken<'a>(
    objects: impl Iterator<Item = &'a LoadedObject> + Clone,
) -> Vec<SpecError> {
    let templates: BTreeMap<(String, String), AnalysisTemplate> = objects
        .clone()
        .filter(|o| o.key.kind == "AnalysisTemplate")
        .filter_map(|o| {
            let t: AnalysisTemplate = o.spec.typed()?;
            Some(((o.key.namespace.clone(), o.key.name.clone()), t))
        })
        .collect();
    let mut broken = Vec::new();
    for object in objects {
        let Some((analysis, points)) = analysis_of(object) else {
            continue;
        };
        let namespace = &object.key.namespace;
        for message in problems(&analysis, points, namespace, &templates) {
            broken.push(SpecError {
                location: object.location.clone(),
                message: format!("{}: {message}", object.key),
            });
        }
    }
    broken
}

/// What a rollout's gates can follow: how many, and what they are.
struct Points {
    count: i32,
    what: &'static str,
}

/// A rollout's analysis, if it has one, and what its gates can follow.
fn analysis_of(object: &LoadedObject) -> Option<(RolloutAnalysis, Points)> {
    // Parsing every rollout of a large repository on each change costs; most have none.
    if !object.spec.may_have_analysis() {
        return None;
    }
    let (analysis, count, what) = match object.key.kind.as_str() {
        "CanaryStatefulSet" => {
            let o = object.spec.typed::<CanaryStatefulSet>()?;
            let steps = o.spec.steps.map_or(1, |s| s.len().max(1) as i32);
            (o.spec.analysis, steps, "step")
        }
        "CanaryDeployment" => {
            let o = object.spec.typed::<CanaryDeployment>()?;
            // Gates follow batches; a Rolling update has none; blue-green has two stages.
            use crate::api::DeploymentStrategyType as S;
            match o.spec.strategy.type_ {
                S::Batches => (o.spec.analysis, o.spec.batches, "batch"),
                S::BlueGreen => (
                    o.spec.analysis,
                    2,
                    "blue-green stage (1: the preview, 2: after the switch)",
                ),
                S::Rolling | S::Rollback => (o.spec.analysis, 0, "batch"),
            }
        }
        _ => return None,
    };
    Some((*analysis?, Points { count, what }))
}

/// The problems of one rollout's analysis in `namespace`.
fn problems(
    analysis: &RolloutAnalysis,
    points: Points,
    namespace: &str,
    templates: &BTreeMap<(String, String), AnalysisTemplate>,
) -> Vec<String> {
    let Points { count, what } = points;
    let mut problems = Vec::new();
    for gate in analysis.gates.iter().filter(|g| g.after > count) {
        problems.push(if count == 0 {
            "spec.analysis.gates: a rolling update has no batches to follow; use strategy \
             Batches, or analysis.background"
                .to_string()
        } else {
            format!(
                "spec.analysis.gates: after {} is past the last {what} ({count})",
                gate.after
            )
        });
    }
    let wants_evidence = analysis.min_measurements.is_some() || analysis.min_duration.is_some();
    if wants_evidence && analysis.background.is_none() {
        problems.push(
            "spec.analysis: minMeasurements and minDuration count the background analysis; add \
             analysis.background"
                .to_string(),
        );
    }
    if let Some(Err(e)) = analysis
        .min_duration
        .as_deref()
        .map(crate::plan::analysis::parse_duration)
    {
        problems.push(format!("spec.analysis.minDuration: {e}"));
    }
    if let Some(s) = &analysis.scoring
        && s.marginal > s.pass
    {
        problems.push(format!(
            "spec.analysis.scoring: marginal {} is above pass {}; a score between them holds \
             the canary, so marginal must be at most pass",
            s.marginal, s.pass
        ));
    }
    let runs = analysis
        .background
        .iter()
        .map(|b| ("background".to_string(), &b.templates, &b.args))
        .chain(analysis.gates.iter().map(|g| {
            let run = format!("gate after {what} {}", g.after);
            (run, &g.templates, &g.args)
        }));
    // Every argument the rollout's templates declare; a value for another one is a typo that
    // would leave the template's default in place without a word.
    let mut declared_anywhere: Vec<&str> = Vec::new();
    let mut all_found = true;
    for (run, refs, args) in runs {
        let run = Run {
            name: &run,
            analysis,
            args,
            namespace,
        };
        let checked = run.check(refs, templates, &mut problems);
        all_found &= checked.all_found;
        declared_anywhere.extend(checked.declared);
    }
    for a in analysis
        .args
        .iter()
        .filter(|a| all_found && !declared_anywhere.contains(&a.name.as_str()))
    {
        problems.push(format!(
            "spec.analysis.args: argument {} is not an argument of any template the rollout uses",
            a.name
        ));
    }
    problems
}

/// One analysis run of a rollout: the background one, or a gate's.
struct Run<'a> {
    name: &'a str,
    analysis: &'a RolloutAnalysis,
    args: &'a [crate::api::AnalysisArg],
    namespace: &'a str,
}

/// What checking a run found besides its problems.
struct Checked<'t> {
    /// Whether every template it references is in the repository.
    all_found: bool,
    /// The arguments its templates declare.
    declared: Vec<&'t str>,
}

impl Run<'_> {
    fn check<'t>(
        &self,
        refs: &[crate::api::TemplateRef],
        templates: &'t BTreeMap<(String, String), AnalysisTemplate>,
        problems: &mut Vec<String>,
    ) -> Checked<'t> {
        let run = self.name;
        let mut checked = Checked {
            all_found: true,
            declared: Vec::new(),
        };
        let mut metric_names: Vec<&str> = Vec::new();
        for r in refs {
            let key = (self.namespace.to_string(), r.template_name.clone());
            let Some(template) = templates.get(&key) else {
                checked.all_found = false;
                problems.push(format!(
                    "spec.analysis ({run}): AnalysisTemplate {} is not in the repository in \
                     namespace {}; add it or fix templateName",
                    r.template_name, self.namespace
                ));
                continue;
            };
            for m in &template.spec.metrics {
                if metric_names.contains(&m.name.as_str()) {
                    problems.push(format!(
                        "spec.analysis ({run}): metric {} is in two of its templates; rename one",
                        m.name
                    ));
                }
                metric_names.push(&m.name);
            }
            checked
                .declared
                .extend(template.spec.args.iter().map(|a| a.name.as_str()));
            for arg in template.spec.args.iter().filter(|a| a.value.is_none()) {
                let given = self
                    .analysis
                    .args
                    .iter()
                    .chain(self.args.iter())
                    .any(|a| a.name == arg.name);
                if !given {
                    problems.push(format!(
                        "spec.analysis ({run}): AnalysisTemplate {} needs argument {}; set it \
                         in spec.analysis.args",
                        r.template_name, arg.name
                    ));
                }
            }
        }
        for a in self
            .args
            .iter()
            .filter(|a| !checked.declared.contains(&a.name.as_str()))
        {
            problems.push(format!(
                "spec.analysis ({run}): argument {} is not an argument of its templates",
                a.name
            ));
        }
        checked
    }
}
