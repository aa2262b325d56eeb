//! The series of each rollout in the agent's store (stalled, failed, its canary's weight):
//! made at each scrape from the store, so a fixed or deleted rollout's series goes with it.

use super::labels::*;
use super::metrics::Metrics;

impl Metrics {
    /// The OpenMetrics text of every metric, with the per-rollout series replaced by
    /// `problems` (kind, namespace, name, series): the shared store's view at this scrape, so
    /// a fixed rollout's series goes with it. Filled and encoded under one lock, so two
    /// scrapes at once (the metrics and the admin port) never see each other's empty families.
    pub fn encode_with_rollouts<'a>(
        &self,
        problems: impl IntoIterator<Item = (&'static str, &'a str, &'a str, RolloutSeries)>,
    ) -> String {
        let _refreshing = self
            .problems_refresh
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.rollout_stalled.clear();
        self.rollout_failed.clear();
        self.rollout_canary_weight.clear();
        for (kind, namespace, name, problem) in problems {
            let (family, reason) = match problem {
                RolloutSeries::Stalled(reason) => (&self.rollout_stalled, reason),
                RolloutSeries::Failed(phase) => (&self.rollout_failed, phase),
                RolloutSeries::CanaryWeight(weight) => {
                    self.rollout_canary_weight
                        .get_or_create(&RolloutLabels {
                            kind: kind.to_string(),
                            namespace: namespace.to_string(),
                            name: name.to_string(),
                        })
                        .set(i64::from(weight));
                    continue;
                }
            };
            family
                .get_or_create(&RolloutReasonLabels {
                    kind: kind.to_string(),
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    reason,
                })
                .set(1);
        }
        self.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_rollouts_problem_series_goes_at_the_next_scrape() {
        let m = Metrics::default();
        let text = m.encode_with_rollouts([
            (
                "CanaryStatefulSet",
                "a",
                "redis",
                RolloutSeries::Stalled("ActionFailed".into()),
            ),
            (
                "CanaryDeployment",
                "b",
                "web",
                RolloutSeries::Failed("RolledBack".into()),
            ),
            (
                "CanaryDeployment",
                "b",
                "shop",
                RolloutSeries::CanaryWeight(30),
            ),
        ]);
        for series in [
            r#"linnet_rollout_stalled{kind="CanaryStatefulSet",namespace="a",name="redis",reason="ActionFailed"} 1"#,
            r#"linnet_rollout_failed{kind="CanaryDeployment",namespace="b",name="web",reason="RolledBack"} 1"#,
            r#"linnet_rollout_canary_weight{kind="CanaryDeployment",namespace="b",name="shop"} 30"#,
        ] {
            assert!(text.contains(series), "no {series} in:\n{text}");
        }
        let text = m.encode_with_rollouts([]);
        assert!(!text.contains("namespace=\"a\""), "{text}");
        assert!(!text.contains("namespace=\"b\""), "{text}");
    }
}
