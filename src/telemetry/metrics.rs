//! The agent's metrics: what `/metrics` serves, in the OpenMetrics text format, and the
//! few helpers that keep each family exact (phases, rollout problems, the source's state).

use super::labels::*;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The agent's metrics, served on `/metrics` in the OpenMetrics text format.
pub struct Metrics {
    pub registry: Registry,
    /// 1 for the revision last synced (the label carries it).
    pub synced_revision: Family<RevisionLabel, Gauge>,
    pub fetch_duration: Histogram,
    pub fetch_errors: Family<ReasonLabel, Counter>,
    pub webhook_requests: Family<WebhookLabels, Counter>,
    pub sync_duration: Histogram,
    pub objects_applied: Family<ActionLabel, Counter>,
    /// Rollouts by kind and phase.
    pub rollouts: Family<PhaseLabels, Gauge>,
    pub reconcile_duration: Family<KindLabel, Histogram>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub writeback_commits: Counter,
    pub writeback_push_retries: Counter,
    pub writeback_errors: Family<ReasonLabel, Counter>,
    pub commit_status_posts: Family<ResultLabel, Counter>,
    /// Revert commits (`onFailure.revert: commit`), by result: `committed`, `unchanged`
    /// (Git no longer asked for the failed image), or a write error's label.
    pub revert_commits: Family<ResultLabel, Counter>,
    /// Analysis measurements taken, by provider and measurement phase.
    pub analysis_measurements: Family<MeasurementLabels, Counter>,
    /// Waits for the agent's own write of a child that lapsed: the watch never showed it.
    pub own_write_wait_lapses: Counter,
    /// The agent's resident memory now and at its peak (VmRSS, VmHWM), read at each scrape:
    /// the hostile-input tests hold the peak under 128 MiB from this.
    pub resident_memory: Gauge,
    pub peak_resident_memory: Gauge,
    /// 1 while the source's last step left every object of its revision applied (the
    /// LinnetSource's Ready condition), else 0.
    pub source_ready: Family<SourceLabel, Gauge>,
    /// When a step of the source last ended Ready (Unix seconds).
    pub source_last_success: Family<SourceLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Spec errors at the synced revision (files not applied until fixed).
    pub source_spec_errors: Family<SourceLabel, Gauge>,
    /// Objects of the synced revision the cluster refused (retried).
    pub source_unapplied_objects: Family<SourceLabel, Gauge>,
    /// Failed steps of the source (a look at Git or a sync), by reason.
    pub sync_errors: Family<ReasonLabel, Counter>,
    /// 1 while this replica holds the main Lease (or runs without election).
    pub leader: Gauge,
    /// 1 for each stalled rollout in this replica's store.
    pub rollout_stalled: Family<RolloutReasonLabels, Gauge>,
    /// 1 for each failed or rolled-back rollout in this replica's store.
    pub rollout_failed: Family<RolloutReasonLabels, Gauge>,
    /// The canary's weight of each rollout with traffic routing in this replica's store.
    pub rollout_canary_weight: Family<RolloutLabels, Gauge>,
    /// Notifications by receiver and outcome (`sent`, or why not).
    pub notifications: Family<NotifyLabels, Counter>,
    /// The cluster, its fleet reads and the rollouts the fleet holds (`--fleet`).
    pub fleet: super::FleetMetrics,
    /// Each rollout's last phase, so the phase gauges stay exact.
    phases: std::sync::Mutex<Phases>,
    /// Held while the rollout problem series are refilled, so two scrapes do not interleave.
    pub(super) problems_refresh: std::sync::Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("linnet");
        let synced_revision = Family::<RevisionLabel, Gauge>::default();
        registry.register(
            "source_synced_revision",
            "The Git revision last synced to the cluster (value 1)",
            synced_revision.clone(),
        );
        let fetch_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "git_fetch_duration_seconds",
            "Time to ask the remote for the tip and, when it moved, fetch it",
            fetch_duration.clone(),
        );
        let fetch_errors = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "git_fetch_errors",
            "Failed polls and fetches, by reason",
            fetch_errors.clone(),
        );
        let webhook_requests = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "webhook_requests",
            "Webhook requests by Git host and result",
            webhook_requests.clone(),
        );
        let sync_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "sync_duration_seconds",
            "Time to sync specs to the cluster",
            sync_duration.clone(),
        );
        let objects_applied = Family::<ActionLabel, Counter>::default();
        registry.register(
            "objects_applied",
            "Objects written to the cluster, by action (create, update, prune)",
            objects_applied.clone(),
        );
        let rollouts = Family::<PhaseLabels, Gauge>::default();
        registry.register("rollouts", "Rollouts by kind and phase", rollouts.clone());
        let reconcile_duration = Family::<KindLabel, Histogram>::new_with_constructor(
            reconcile_buckets as fn() -> Histogram,
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time to reconcile one rollout, by kind",
            reconcile_duration.clone(),
        );
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed reconciles by kind and error",
            reconcile_errors.clone(),
        );
        let writeback_commits = Counter::default();
        registry.register(
            "writeback_commits",
            "Status commits pushed to Git",
            writeback_commits.clone(),
        );
        let writeback_push_retries = Counter::default();
        registry.register(
            "writeback_push_retries",
            "Pushes redone on a new tip because the branch moved",
            writeback_push_retries.clone(),
        );
        let writeback_errors = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "writeback_errors",
            "Failed status writes, by reason",
            writeback_errors.clone(),
        );
        let commit_status_posts = Family::<ResultLabel, Counter>::default();
        registry.register(
            "commit_status_posts",
            "Commit statuses sent to the Git host, by result",
            commit_status_posts.clone(),
        );
        let revert_commits = Family::<ResultLabel, Counter>::default();
        registry.register(
            "revert_commits",
            "Revert commits of rolled-back rollouts, by result",
            revert_commits.clone(),
        );
        let analysis_measurements = Family::<MeasurementLabels, Counter>::default();
        registry.register(
            "analysis_measurements",
            "Analysis measurements taken (queries, requests, Jobs), by provider and phase",
            analysis_measurements.clone(),
        );
        let own_write_wait_lapses = Counter::default();
        registry.register(
            "own_write_wait_lapses",
            "Waits for the watch to show the agent's own write of a child that lapsed after 15 s (0 when the watches work)",
            own_write_wait_lapses.clone(),
        );
        let resident_memory = Gauge::default();
        registry.register_with_unit(
            "resident_memory",
            "The agent's resident memory (VmRSS), read when scraped",
            prometheus_client::registry::Unit::Bytes,
            resident_memory.clone(),
        );
        let peak_resident_memory = Gauge::default();
        registry.register_with_unit(
            "peak_resident_memory",
            "The agent's peak resident memory since it started (VmHWM), read when scraped",
            prometheus_client::registry::Unit::Bytes,
            peak_resident_memory.clone(),
        );
        let source_ready = Family::<SourceLabel, Gauge>::default();
        registry.register(
            "source_ready",
            "1 while every object of the source's revision is applied (LinnetSource Ready), else 0",
            source_ready.clone(),
        );
        let source_last_success = Family::<SourceLabel, Gauge<f64, _>>::default();
        registry.register(
            "source_last_success_timestamp_seconds",
            "When a look at the source last ended with every object of its revision applied",
            source_last_success.clone(),
        );
        let source_spec_errors = Family::<SourceLabel, Gauge>::default();
        registry.register(
            "source_spec_errors",
            "Errors in the spec files at the synced revision (those files are not applied)",
            source_spec_errors.clone(),
        );
        let source_unapplied_objects = Family::<SourceLabel, Gauge>::default();
        registry.register(
            "source_unapplied_objects",
            "Objects of the synced revision the cluster refused (retried)",
            source_unapplied_objects.clone(),
        );
        let sync_errors = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "sync_errors",
            "Failed steps of the source (a look at Git or a sync), by reason",
            sync_errors.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the main Lease and syncs Git (or runs without election)",
            leader.clone(),
        );
        let rollout_stalled = Family::<RolloutReasonLabels, Gauge>::default();
        registry.register(
            "rollout_stalled",
            "1 for each rollout whose Stalled condition is True (only those have a series)",
            rollout_stalled.clone(),
        );
        let rollout_failed = Family::<RolloutReasonLabels, Gauge>::default();
        registry.register(
            "rollout_failed",
            "1 for each rollout in phase Failed, RolledBack or MigrationFailed (only those have a series)",
            rollout_failed.clone(),
        );
        let rollout_canary_weight = Family::<RolloutLabels, Gauge>::default();
        registry.register(
            "rollout_canary_weight",
            "The share of requests (0 to 100) each rollout with trafficRouting sends to its canary, as its status says (only those have a series)",
            rollout_canary_weight.clone(),
        );
        let notifications = Family::<NotifyLabels, Counter>::default();
        registry.register(
            "notifications",
            "Notifications by receiver and outcome: sent, or why not",
            notifications.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "build_info",
            "linnet's version and the commit it was built from (value 1)",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                // The image build passes it (Dockerfile); a plain `cargo build` does not.
                commit: option_env!("LINNET_GIT_COMMIT")
                    .unwrap_or("unknown")
                    .to_string(),
            })
            .set(1);
        let fleet = super::FleetMetrics::register(&mut registry);
        Metrics {
            fleet,
            registry,
            source_ready,
            source_last_success,
            source_spec_errors,
            source_unapplied_objects,
            sync_errors,
            leader,
            rollout_stalled,
            rollout_failed,
            rollout_canary_weight,
            notifications,
            problems_refresh: Default::default(),
            commit_status_posts,
            revert_commits,
            analysis_measurements,
            own_write_wait_lapses,
            resident_memory,
            peak_resident_memory,
            writeback_commits,
            writeback_push_retries,
            writeback_errors,
            rollouts,
            reconcile_duration,
            reconcile_errors,
            phases: Default::default(),
            synced_revision,
            fetch_duration,
            fetch_errors,
            webhook_requests,
            sync_duration,
            objects_applied,
        }
    }
}

fn reconcile_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// Each rollout's phase, by `kind/namespace/name`; the few phase names are held once (the
/// map holds an entry for every rollout: 10,000 at the scale bench).
#[derive(Debug, Default)]
struct Phases {
    by_rollout: std::collections::HashMap<Box<str>, std::sync::Arc<str>>,
    names: Vec<std::sync::Arc<str>>,
}

impl Phases {
    fn name(&mut self, phase: &str) -> std::sync::Arc<str> {
        if let Some(name) = self.names.iter().find(|n| ***n == *phase) {
            return name.clone();
        }
        let name: std::sync::Arc<str> = phase.into();
        self.names.push(name.clone());
        name
    }
}

impl Metrics {
    /// Records that rollout `name` (namespace/name) of `kind` is in `phase`, or gone (`None`).
    pub fn rollout_phase(&self, kind: &str, name: &str, phase: Option<&str>) {
        let Ok(mut phases) = self.phases.lock() else {
            return;
        };
        let key: Box<str> = format!("{kind}/{name}").into();
        let old = match phase {
            Some(p) => {
                let p = phases.name(p);
                phases.by_rollout.insert(key, p)
            }
            None => phases.by_rollout.remove(&key),
        };
        if old.as_deref() == phase {
            return;
        }
        let gauge = |phase: &str| {
            self.rollouts.get_or_create(&PhaseLabels {
                kind: kind.to_string(),
                phase: phase.to_string(),
            })
        };
        if let Some(old) = old {
            gauge(&old).dec();
        }
        if let Some(p) = phase {
            gauge(p).inc();
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            for (field, gauge) in [
                ("VmRSS:", &self.resident_memory),
                ("VmHWM:", &self.peak_resident_memory),
            ] {
                let kib = status
                    .lines()
                    .find(|l| l.starts_with(field))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<i64>().ok());
                if let Some(kib) = kib {
                    gauge.set(kib * 1024);
                }
            }
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Records the source's state after a step: whether it is Ready, its error counts, and
    /// (when Ready) `now` as its last success.
    pub fn source_state(
        &self,
        source: &str,
        ready: bool,
        spec_errors: usize,
        unapplied: usize,
        now: f64,
    ) {
        let label = SourceLabel {
            source: source.to_string(),
        };
        self.source_ready
            .get_or_create(&label)
            .set(i64::from(ready));
        self.source_spec_errors
            .get_or_create(&label)
            .set(spec_errors as i64);
        self.source_unapplied_objects
            .get_or_create(&label)
            .set(unapplied as i64);
        // No series before the first success: a 0 would read as "last synced in 1970".
        if ready {
            self.source_last_success.get_or_create(&label).set(now);
        }
    }

    /// Counts one webhook request.
    pub fn webhook(&self, host: &str, result: &str) {
        self.webhook_requests
            .get_or_create(&WebhookLabels {
                host: host.to_string(),
                result: result.to_string(),
            })
            .inc();
    }
}

/// The labels each error counter starts with, at 0, so that a rate or an alert on it has a
/// series before the first error. The modules that own the errors name them; the agent's
/// wiring hands them over, so this module imports none of those modules.
#[derive(Clone, Debug, Default)]
pub struct ErrorSeries {
    /// Git fetches: network failures and Git errors.
    pub fetch: Vec<&'static str>,
    /// Status writes to Git.
    pub writeback: Vec<&'static str>,
    /// Commit statuses posted to the Git host.
    pub commit_status: Vec<&'static str>,
    /// Reconcile errors, for each rollout kind.
    pub reconcile: Vec<&'static str>,
    /// Failed steps of the source (`linnet_sync_errors_total`).
    pub sync: Vec<&'static str>,
}

impl Metrics {
    /// Creates every series of `labels` at 0.
    pub fn start_error_series(&self, labels: &ErrorSeries) {
        for reason in labels.fetch.iter().chain(&["busy", "panic"]) {
            let _ = self.fetch_errors.get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            });
        }
        for reason in labels.writeback.iter().chain(&["panic"]) {
            let _ = self.writeback_errors.get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            });
        }
        for result in labels.commit_status.iter().chain(&["posted"]) {
            let _ = self.commit_status_posts.get_or_create(&ResultLabel {
                result: result.to_string(),
            });
        }
        for reason in labels.sync.iter().chain(&["panic"]) {
            let _ = self.sync_errors.get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            });
        }
        for kind in ["CanaryStatefulSet", "CanaryDeployment"] {
            for error in &labels.reconcile {
                let _ = self.reconcile_errors.get_or_create(&ErrorLabels {
                    kind: kind.to_string(),
                    error: error.to_string(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_and_every_error_counter_exist_before_the_first_error() {
        let m = Metrics::default();
        m.start_error_series(&ErrorSeries {
            fetch: vec!["timeout", "certificate"],
            writeback: vec!["kept_moving"],
            commit_status: vec!["refused"],
            reconcile: vec!["kube_api"],
            sync: vec!["no_specs"],
        });
        let text = m.encode();
        assert!(
            text.contains(&format!(
                r#"linnet_build_info{{version="{}",commit="#,
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        for series in [
            r#"linnet_git_fetch_errors_total{reason="timeout"} 0"#,
            r#"linnet_git_fetch_errors_total{reason="certificate"} 0"#,
            r#"linnet_writeback_errors_total{reason="kept_moving"} 0"#,
            r#"linnet_commit_status_posts_total{result="refused"} 0"#,
            r#"linnet_reconcile_errors_total{kind="CanaryDeployment",error="kube_api"} 0"#,
            r#"linnet_sync_errors_total{reason="no_specs"} 0"#,
        ] {
            assert!(text.contains(series), "no {series} in:\n{text}");
        }
    }

    #[test]
    fn the_last_success_moves_only_while_the_source_is_ready() {
        let m = Metrics::default();
        m.source_state("default", true, 0, 0, 100.0);
        m.source_state("default", false, 2, 1, 200.0);
        let text = m.encode();
        for series in [
            r#"linnet_source_ready{source="default"} 0"#,
            r#"linnet_source_last_success_timestamp_seconds{source="default"} 100.0"#,
            r#"linnet_source_spec_errors{source="default"} 2"#,
            r#"linnet_source_unapplied_objects{source="default"} 1"#,
        ] {
            assert!(text.contains(series), "no {series} in:\n{text}");
        }
    }

    #[test]
    fn phase_gauges_follow_each_rollout() {
        let m = Metrics::default();
        m.rollout_phase("CanaryStatefulSet", "a/redis", Some("Stable"));
        m.rollout_phase("CanaryStatefulSet", "b/redis", Some("Stable"));
        m.rollout_phase("CanaryStatefulSet", "a/redis", Some("CanaryActive"));
        m.rollout_phase("CanaryStatefulSet", "a/redis", Some("CanaryActive"));
        m.rollout_phase("CanaryStatefulSet", "b/redis", None);
        let text = m.encode();
        assert!(
            text.contains(r#"linnet_rollouts{kind="CanaryStatefulSet",phase="Stable"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"linnet_rollouts{kind="CanaryStatefulSet",phase="CanaryActive"} 1"#),
            "{text}"
        );
    }
}
