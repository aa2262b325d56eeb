//! The evidence in words (issue 75): what the status says a metric decides by and measures,
//! and the lines pull requests and notifications carry.

use super::*;

#[test]
fn a_run_says_what_decides_each_metric_what_it_asks_and_where_to_see_it() {
    let m = resolved_metric(error_rate());
    let v = |x: f64| Outcome::Value(json!(x));
    let (runs, _) = run_with(&[v(0.01), v(0.31), v(0.32)], &m, false);
    let st = &runs[0].metrics[0];
    assert_eq!(
        st.condition.as_deref(),
        Some("success when result < 0.05; failureLimit 1")
    );
    assert_eq!(
        st.query.as_deref(),
        Some(
            m.metric
                .provider
                .prometheus
                .as_ref()
                .unwrap()
                .query
                .as_str()
        )
    );
    assert_eq!(
        st.graph.as_deref(),
        Some(
            "http://prometheus:9090/graph?g0.expr=sum%28rate%28errors%7Bapp%3D%22%7B%7B%20args.app%20%7D%7D%22%7D%5B1m%5D%29%29%20%2F%20sum%28rate%28requests%7Bapp%3D%22%7B%7Bargs.app%7D%7D%22%7D%5B1m%5D%29%29&g0.tab=0"
        )
    );
    let lines = crate::plan::analysis::report::run_lines(&runs[0]);
    assert_eq!(
        lines.lines().collect::<Vec<_>>(),
        [
            "- analysis background: Failed (error-rate 0.32 failed result < 0.05 (2 failed, failureLimit 1))",
            &format!(
                "  - error-rate: Failed, 3 measurements (1 successful, 2 failed, 0 inconclusive), \
                 last 0.01, 0.31, 0.32; success when result < 0.05; failureLimit 1; query {} \
                 (graph: {})",
                st.query.as_deref().unwrap(),
                st.graph.as_deref().unwrap()
            ),
        ]
    );
}

#[test]
fn a_web_metric_shows_neither_its_credentials_nor_its_query_string() {
    let m = resolved_metric(metric(json!({
        "name": "health",
        "interval": "10s",
        "successCondition": "result == true",
        "provider": {"web": {
            "url": "https://bot:s3cret@status.example/v1/check?api_key=k3y",
            "headers": [{"key": "Authorization", "value": "Bearer t0ken"}],
        }}
    })));
    let (runs, _) = run_with(&[Outcome::Value(json!(true))], &m, false);
    let st = &runs[0].metrics[0];
    assert_eq!(
        st.query.as_deref(),
        Some("GET https://bot:***@status.example/v1/check")
    );
    assert_eq!(st.graph, None);
    let text = crate::plan::analysis::report::run_lines(&runs[0]);
    for secret in ["s3cret", "k3y", "t0ken"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
}

#[test]
fn a_metric_against_a_baseline_says_the_judges_rule_and_both_requests() {
    let m = resolved_metric(metric(json!({
        "name": "latency",
        "interval": "10s",
        "provider": {"prometheus": {"address": "http://p:9090", "query": "canary_q"}},
        "baseline": {"provider": {"prometheus": {"address": "http://p:9090", "query": "baseline_q"}},
            "worse": "Higher", "tolerancePercent": 10, "minSamples": 3}
    })));
    let (runs, _) = run_with(&[], &m, false);
    let st = &runs[0].metrics[0];
    assert_eq!(
        st.condition.as_deref(),
        Some(
            "judged against the baseline (Mann-Whitney U): higher is worse, 10 % tolerated, \
             95 % confidence, at least 3 samples a side"
        )
    );
    assert_eq!(
        st.query.as_deref(),
        Some("canary: canary_q; baseline: baseline_q")
    );
}

/// The words are the same at each measurement: only the values move, so a status that
/// carries them is not written again for them.
#[test]
fn the_rule_does_not_change_with_the_measurements() {
    let m = resolved_metric(error_rate());
    let v = |x: f64| Outcome::Value(json!(x));
    let (one, _) = run_with(&[v(0.01)], &m, false);
    let (two, _) = run_with(&[v(0.01), v(0.02)], &m, false);
    let rule = |r: &[AnalysisRunStatus]| {
        let st = &r[0].metrics[0];
        (st.condition.clone(), st.query.clone(), st.graph.clone())
    };
    assert_eq!(rule(&one), rule(&two));
}

/// Regression: the runs' text a pull request or a notification carries is bounded whatever the
/// number of metrics, cut at a line, and says where the rest is.
#[test]
fn the_runs_text_is_cut_at_a_line_and_says_where_the_rest_is() {
    let m = resolved_metric(error_rate());
    let (mut runs, _) = run_with(&[Outcome::Value(json!(0.01))], &m, false);
    let one = runs[0].metrics[0].clone();
    runs[0].metrics = (0..200)
        .map(|i| MetricStatus {
            name: format!("m{i}"),
            ..one.clone()
        })
        .collect();
    let whole = crate::plan::analysis::report::run_lines(&runs[0]);
    let text = crate::plan::analysis::report::runs_text(&runs, 4000);
    assert!(text.len() <= 4000, "{}", text.len());
    assert!(text.ends_with("\n- (more in the rollout's status: linnet get)"));
    let kept = text.lines().count() - 1;
    assert_eq!(
        text.lines().take(kept).collect::<Vec<_>>(),
        whole.lines().take(kept).collect::<Vec<_>>()
    );
    assert_eq!(
        crate::plan::analysis::report::runs_text(&runs[..0], 4000),
        ""
    );
}
