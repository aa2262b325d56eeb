use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::api::{AnalysisGate, TemplateRef};

fn t0() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

fn metric(value: Value) -> Metric {
    serde_json::from_value(value).unwrap()
}

fn error_rate() -> Metric {
    metric(json!({
        "name": "error-rate",
        "interval": "10s",
        "count": 3,
        "successCondition": "result < 0.05",
        "failureLimit": 1,
        "provider": {"prometheus": {
            "address": "http://prometheus:9090",
            "query": "sum(rate(errors{app=\"{{ args.app }}\"}[1m])) / sum(rate(requests{app=\"{{args.app}}\"}[1m]))"
        }}
    }))
}

fn template() -> AnalysisTemplateSpec {
    serde_json::from_value(json!({
        "args": [{"name": "app"}, {"name": "limit", "value": "0.05"}],
        "metrics": [error_rate()],
    }))
    .unwrap()
}

fn resolved_metric(m: Metric) -> ResolvedMetric {
    ResolvedMetric {
        template: "t".into(),
        interval: parse_duration(&m.interval).unwrap(),
        initial_delay: Duration::ZERO,
        timeout: DEFAULT_TIMEOUT,
        metric: m,
    }
}

fn analysis(app: Option<&str>) -> RolloutAnalysis {
    RolloutAnalysis {
        args: app
            .map(|a| AnalysisArg {
                name: "app".into(),
                value: a.into(),
            })
            .into_iter()
            .collect(),
        background: Some(AnalysisRef {
            templates: vec![TemplateRef {
                template_name: "error-rate".into(),
            }],
            args: Vec::new(),
        }),
        gates: vec![AnalysisGate {
            after: 2,
            templates: vec![TemplateRef {
                template_name: "missing".into(),
            }],
            args: Vec::new(),
        }],
        ..Default::default()
    }
}

fn lookup(name: &str) -> Option<AnalysisTemplateSpec> {
    (name == "error-rate").then(template)
}

#[test]
fn arguments_and_builtins_are_filled_into_the_provider() {
    let builtins = Builtins {
        namespace: "demo".into(),
        ..Builtins::default()
    };
    let r = resolve(Some(&analysis(Some("redis"))), &lookup, &builtins);
    let metrics = r.runs[BACKGROUND].as_ref().unwrap();
    let query = &metrics[0]
        .metric
        .provider
        .prometheus
        .as_ref()
        .unwrap()
        .query;
    assert_eq!(
        query,
        "sum(rate(errors{app=\"redis\"}[1m])) / sum(rate(requests{app=\"redis\"}[1m]))"
    );
    assert_eq!(metrics[0].interval, Duration::from_secs(10));
    let gate = r.runs[&gate_run(2)].as_ref().unwrap_err();
    assert!(
        gate.to_string()
            .contains("AnalysisTemplate missing is not in namespace demo"),
        "{gate}"
    );
}

#[test]
fn a_missing_argument_says_where_to_set_it() {
    let r = resolve(Some(&analysis(None)), &lookup, &Builtins::default());
    let e = r.runs[BACKGROUND].as_ref().unwrap_err();
    assert!(
        e.to_string()
            .contains("argument app has no value; set it in spec.analysis.args"),
        "{e}"
    );
}

#[test]
fn builtins_and_unknown_placeholders() {
    let b = Builtins {
        name: "redis".into(),
        canary_selector: Some("role=canary".into()),
        ..Builtins::default()
    };
    let args = BTreeMap::new();
    assert_eq!(
        fill("{{rollout.name}}/{{ rollout.canarySelector }}", &args, &b).unwrap(),
        "redis/role=canary"
    );
    assert!(fill("{{ rollout.pods }}", &args, &b).is_err());
    assert!(fill("{{ nope }}", &args, &b).is_err());
    assert!(fill("{{ args.x", &args, &b).is_err());
}

#[test]
fn durations_parse_like_go() {
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
    for bad in ["", "s", "10", "1d", "-1s", "1.5s", "99999999999s"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn conditions_judge_as_argo_does() {
    let both = metric(json!({
        "name": "m", "successCondition": "result < 0.05", "failureCondition": "result > 0.2",
        "provider": {"web": {"url": "http://x"}}
    }));
    assert_eq!(judge(&both, &json!(0.01)).0, MeasurementPhase::Successful);
    assert_eq!(
        judge(&both, &json!(0.31)),
        (
            MeasurementPhase::Failed,
            Some("met failureCondition result > 0.2".into())
        )
    );
    assert_eq!(judge(&both, &json!(0.1)).0, MeasurementPhase::Inconclusive);
    assert_eq!(judge(&both, &json!("text")).0, MeasurementPhase::Error);
    let success_only = error_rate();
    assert_eq!(
        judge(&success_only, &json!(0.31)),
        (
            MeasurementPhase::Failed,
            Some("failed result < 0.05".into())
        )
    );
    let none = metric(json!({"name": "smoke", "provider": {"job": {"spec": {}}}}));
    assert_eq!(judge(&none, &json!(true)).0, MeasurementPhase::Successful);
    assert_eq!(judge(&none, &json!(false)).0, MeasurementPhase::Failed);
    let not_bool = metric(json!({"name": "m", "successCondition": "result + 1",
        "provider": {"web": {"url": "http://x"}}}));
    assert_eq!(judge(&not_bool, &json!(1)).0, MeasurementPhase::Error);
}

#[test]
fn metric_problems_name_the_field() {
    let bad = metric(json!({
        "name": "m", "interval": "10x", "successCondition": "result <",
        "provider": {"web": {"url": "http://x", "jsonPath": "$[["}, "job": {"spec": {}}}
    }));
    let fields: Vec<String> = metric_problems(&bad).into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        fields,
        [
            "provider",
            "interval",
            "successCondition",
            "provider.web.jsonPath"
        ]
    );
    assert!(metric_problems(&error_rate()).is_empty());
}

fn run_with(
    outcomes: &[Outcome],
    m: &ResolvedMetric,
    gate: bool,
) -> (Vec<AnalysisRunStatus>, Verdict) {
    let resolved = Resolved {
        runs: BTreeMap::from([(BACKGROUND.to_string(), Ok(vec![m.clone()]))]),
        ..Default::default()
    };
    let mut runs = Vec::new();
    let mut verdict = run_verdict(&mut runs, BACKGROUND, &resolved, gate, t0());
    for (i, o) in outcomes.iter().enumerate() {
        let now = t0() + Duration::from_secs(10 * (i as u64 + 1));
        let st = &mut runs[0].metrics[0];
        record(m, st, o.clone(), gate, now);
        verdict = run_verdict(&mut runs, BACKGROUND, &resolved, gate, now);
    }
    (runs, verdict)
}

#[test]
fn a_failure_past_the_limit_fails_the_run_and_names_the_metric() {
    let m = resolved_metric(error_rate());
    let v = |x: f64| Outcome::Value(json!(x));
    let (runs, verdict) = run_with(&[v(0.31), v(0.01)], &m, false);
    assert!(matches!(verdict, Verdict::Measuring(_)), "{verdict:?}");
    assert_eq!(runs[0].metrics[0].failed, 1);
    let (_, verdict) = run_with(&[v(0.31), v(0.32)], &m, false);
    assert_eq!(
        verdict,
        Verdict::Failed("error-rate 0.32 failed result < 0.05 (2 failed, failureLimit 1)".into())
    );
    let (_, verdict) = run_with(&[v(0.01), v(0.02), v(0.31)], &m, false);
    assert!(matches!(verdict, Verdict::Passed), "{verdict:?}");
}

#[test]
fn errors_hold_the_run_and_a_good_measurement_resumes_it() {
    let mut spec = error_rate();
    spec.consecutive_error_limit = 1;
    let m = resolved_metric(spec);
    let e = || Outcome::Error("connection refused".into());
    let (runs, verdict) = run_with(&[e(), e()], &m, false);
    assert_eq!(
        verdict,
        Verdict::Held(
            "error-rate could not be measured more than 1 times in a row (its measurements say why: linnet get)"
                .into()
        )
    );
    assert_eq!(runs[0].metrics[0].count, 0, "errors are not measurements");
    let (_, verdict) = run_with(&[e(), e(), Outcome::Value(json!(0.01))], &m, false);
    assert!(matches!(verdict, Verdict::Measuring(_)), "{verdict:?}");
}

#[test]
fn a_gate_without_count_measures_once() {
    let mut spec = error_rate();
    spec.count = None;
    let m = resolved_metric(spec);
    let (_, verdict) = run_with(&[Outcome::Value(json!(0.01))], &m, true);
    assert_eq!(verdict, Verdict::Passed);
    let (_, verdict) = run_with(&[Outcome::Value(json!(0.01))], &m, false);
    assert!(
        matches!(verdict, Verdict::Measuring(_)),
        "background runs on: {verdict:?}"
    );
}

#[test]
fn a_finished_gate_is_never_measured_again() {
    let m = resolved_metric(error_rate());
    let v = Outcome::Value(json!(0.01));
    let (mut runs, verdict) = run_with(&[v.clone(), v.clone(), v], &m, true);
    assert_eq!(verdict, Verdict::Passed);
    assert!(
        due(
            &runs[0],
            std::slice::from_ref(&m),
            t0() + Duration::from_secs(3600)
        )
        .is_empty()
    );
    // Stricter limits in Git later do not reopen it.
    let mut stricter = m.clone();
    stricter.metric.count = Some(10);
    let resolved = Resolved {
        runs: BTreeMap::from([(BACKGROUND.to_string(), Ok(vec![stricter]))]),
        ..Default::default()
    };
    assert_eq!(
        run_verdict(&mut runs, BACKGROUND, &resolved, true, t0()),
        Verdict::Passed
    );
}

#[test]
fn measurements_are_due_by_interval_and_initial_delay() {
    let mut m = resolved_metric(error_rate());
    m.initial_delay = Duration::from_secs(5);
    let resolved = Resolved {
        runs: BTreeMap::from([(BACKGROUND.to_string(), Ok(vec![m.clone()]))]),
        ..Default::default()
    };
    let mut runs = Vec::new();
    run_verdict(&mut runs, BACKGROUND, &resolved, false, t0());
    assert!(due(&runs[0], std::slice::from_ref(&m), t0()).is_empty());
    assert_eq!(
        next_due(&runs, &resolved, t0()),
        Some(Duration::from_secs(5))
    );
    let at = t0() + Duration::from_secs(5);
    assert_eq!(due(&runs[0], std::slice::from_ref(&m), at).len(), 1);
    record(
        &m,
        &mut runs[0].metrics[0],
        Outcome::Value(json!(0.0)),
        false,
        at,
    );
    assert_eq!(
        next_due(&runs, &resolved, at),
        Some(Duration::from_secs(10))
    );
    stop_runs(&mut runs);
    assert_eq!(next_due(&runs, &resolved, at), None);
}

#[test]
fn status_keeps_the_last_measurements_and_all_counts() {
    let mut spec = error_rate();
    spec.count = None;
    spec.failure_limit = 100;
    let m = resolved_metric(spec);
    let outcomes: Vec<Outcome> = (0..25)
        .map(|i| Outcome::Value(json!(i as f64 / 100.0)))
        .collect();
    let (runs, _) = run_with(&outcomes, &m, false);
    let st = &runs[0].metrics[0];
    assert_eq!(st.measurements.len(), MEASUREMENTS_KEPT);
    assert_eq!(st.count, 25);
    assert_eq!((st.successful, st.failed), (5, 20));
    assert_eq!(
        st.measurements.last().unwrap().value.as_deref(),
        Some("0.24")
    );
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        (0.0f64..0.1).prop_map(|x| Outcome::Value(json!(x))),
        (0.1f64..1.0).prop_map(|x| Outcome::Value(json!(x))),
        Just(Outcome::Value(json!("nan"))),
        Just(Outcome::Error("timeout".into())),
    ]
}

proptest! {
    /// Over any history: a run with more failed measurements than failureLimit is Failed, a
    /// Failed run never turns into anything else, and a run that passed had at most
    /// failureLimit failures.
    #[test]
    fn a_failure_is_never_passed(
        history in proptest::collection::vec(outcome(), 0..40),
        failure_limit in 0i32..4,
        count in proptest::option::of(1i32..12),
        gate in any::<bool>(),
        both in any::<bool>(),
    ) {
        let mut spec = error_rate();
        spec.failure_limit = failure_limit;
        spec.count = count;
        spec.inconclusive_limit = 2;
        if both {
            spec.failure_condition = Some("result > 0.5".into());
        }
        let m = resolved_metric(spec);
        let resolved = Resolved {
            runs: BTreeMap::from([(BACKGROUND.to_string(), Ok(vec![m.clone()]))]),
            ..Default::default()
        };
        let mut runs = Vec::new();
        run_verdict(&mut runs, BACKGROUND, &resolved, gate, t0());
        let mut decided: Option<Verdict> = None;
        for (i, o) in history.into_iter().enumerate() {
            let now = t0() + Duration::from_secs(10 * (i as u64 + 1));
            // The controller measures only what is due.
            if due(&runs[0], std::slice::from_ref(&m), now).is_empty() {
                continue;
            }
            record(&m, &mut runs[0].metrics[0], o, gate, now);
            let verdict = run_verdict(&mut runs, BACKGROUND, &resolved, gate, now);
            let st = &runs[0].metrics[0];
            if let Some(Verdict::Failed(_) | Verdict::Passed) = &decided {
                prop_assert_eq!(&verdict, decided.as_ref().unwrap());
            }
            if st.failed > failure_limit {
                prop_assert!(matches!(verdict, Verdict::Failed(_)), "{:?}", verdict);
            }
            if verdict == Verdict::Passed {
                prop_assert!(st.failed <= failure_limit);
            }
            // Failed measurements never exceed the limit by more than the one that fails it.
            prop_assert!(st.failed <= failure_limit + 1);
            if matches!(verdict, Verdict::Failed(_) | Verdict::Passed) {
                decided = Some(verdict);
            }
        }
    }
}

#[test]
fn a_finished_run_keeps_its_verdict_when_its_template_is_gone() {
    let m = resolved_metric(error_rate());
    let v = Outcome::Value(json!(0.01));
    let (mut runs, verdict) = run_with(&[v.clone(), v.clone(), v], &m, true);
    assert_eq!(verdict, Verdict::Passed);
    let gone = Resolved {
        runs: BTreeMap::from([(
            BACKGROUND.to_string(),
            Err(ResolveError::Unavailable("not listed yet".into())),
        )]),
        ..Default::default()
    };
    assert_eq!(
        run_verdict(&mut runs, BACKGROUND, &gone, true, t0()),
        Verdict::Passed
    );
    let unresolved = run_verdict(&mut Vec::new(), BACKGROUND, &gone, true, t0());
    assert!(matches!(unresolved, Verdict::Held(_)), "{unresolved:?}");
}

#[test]
fn nested_list_macros_are_refused_and_one_is_fine() {
    assert!(compile("result.all(x, x < 0.05)").is_ok());
    assert!(compile("result.all(x, x < 0.05) && result.exists(y, y == 0.0)").is_ok());
    for nested in [
        "result.all(x, result.all(y, result.all(z, x + y + z > 0.0)))",
        "result.map(x, result.filter(y, y < x)).size() > 0",
        "{'a': result.all(x, result.exists(y, y == x))}.a",
    ] {
        let e = compile(nested).unwrap_err();
        assert!(e.to_string().contains("nests list macros"), "{nested}: {e}");
    }
}

#[test]
fn a_long_argument_repeated_is_refused_not_built() {
    let long = "x".repeat(20_000);
    let args = BTreeMap::from([("a", Some(long.as_str()))]);
    let e = fill(
        "{{args.a}}{{args.a}}{{args.a}}{{args.a}}",
        &args,
        &Builtins::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("once its arguments are filled in"),
        "{e}"
    );
    assert_eq!(
        fill("{{args.a}}", &args, &Builtins::default())
            .unwrap()
            .len(),
        20_000
    );
}

/// Regression (issue 71): a Partition canary's selector was filled in as
/// `controller-revision-hash=` before its revision was recorded: it selected no pod, and an
/// analysis of no pod passed. Now the run waits until the selector is known.
#[test]
fn a_selector_not_known_yet_holds_the_run_instead_of_selecting_no_pod() {
    let b = Builtins {
        name: "redis".into(),
        ..Builtins::default()
    };
    let args = BTreeMap::new();
    let e = fill("up{ {{rollout.canarySelector}} }", &args, &b).unwrap_err();
    assert_eq!(e, FillError::NotYetKnown("canarySelector".into()));
    assert!(e.to_string().contains("not known yet"), "{e}");
    let e = fill("{{ rollout.stableImage }}", &args, &b).unwrap_err();
    assert_eq!(e, FillError::NotYetKnown("stableImage".into()));
}

mod comparisons;
mod report;
mod scoring;
