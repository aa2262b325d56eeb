//! What every reconcile shares: the client, the event reporter, and the source whose rollouts
//! this agent runs.

use kube::Client;

/// The image automation's [`crate::plan::image_tags::ImageOrigins`], read by the reconciles.
pub type SharedImageOrigins =
    std::sync::Arc<std::sync::RwLock<crate::plan::image_tags::ImageOrigins>>;

/// Shared by all reconciles of all controllers, as an `Arc`.
pub struct Context {
    pub client: Client,
    /// Every namespace, or the one a namespace-scoped install watches (`--watch-namespace`).
    pub scope: crate::watch::WatchScope,
    /// Events, each through the Recorder of its object's bucket (`crate::events`).
    pub recorder: crate::events::EventRecorders,
    /// The `rollouts.linnet.dev/source` label value this agent syncs; it runs only the
    /// rollouts (and watches only the children) that carry it.
    pub source: String,
    pub metrics: std::sync::Arc<crate::telemetry::Metrics>,
    /// Reconciles in flight at once per controller; 0 means no limit.
    pub max_concurrent_reconciles: u16,
    /// The last status written to each rollout, so that a reconcile ahead of its watch does
    /// not write it again.
    pub own_status_writes: super::OwnStatusWrites,
    /// Children written and not yet shown by their watch: a reconcile waits for them.
    pub own_child_writes: super::own_writes::OwnChildWrites,
    /// Each failing rollout's run of errors, for its retry's backoff and its log lines.
    pub error_runs: super::backoff::ErrorRuns,
    /// The reconciles under way, for `/healthz`: one that runs past the liveness deadline
    /// is a hang.
    pub reconciles: std::sync::Arc<crate::liveness::Work>,
    /// Rollouts whose spec in the cluster is not the one Git applied: the source loop puts
    /// Git's back at once, not at its next drift tick.
    pub edited: std::sync::Arc<crate::sync::EditedRollouts>,
    /// The AnalysisTemplates of this source, from a watch.
    pub templates: super::analysis::Templates,
    /// HTTP clients of the analysis providers.
    pub http: super::analysis::HttpClients,
    /// What analysis from Git may reach.
    pub analysis: super::analysis::Policy,
    /// The shards of rollouts this replica runs (all of them, unsharded).
    pub shards: std::sync::Arc<super::shards::ShardSet>,
    /// What each rollout's config copies were when last collected (`versionedConfig`).
    pub config_collected: super::config_copies::Collected,
    /// The source's account, which reads and copies Secrets (`versionedConfig`).
    pub source_account: super::source_account::SourceAccount,
    /// How long a new rollout's first status waits for its children to be ready
    /// ([`crate::plan::first_status`]).
    pub first_status_wait: std::time::Duration,
    /// The new rollouts whose first status waits, which lengthen each other's wait.
    pub first_status_waiting: std::sync::Mutex<crate::plan::first_status::WaitingFirstStatus>,
    /// Whether a fleet lets this cluster start a rollout's new image (`--fleet`).
    pub fleet: std::sync::Arc<super::fleet::FleetGates>,
    /// Where the images the image automation committed came from (it fills this in).
    pub image_origins: SharedImageOrigins,
}

impl Context {
    pub fn new(
        client: Client,
        source: &str,
        metrics: std::sync::Arc<crate::telemetry::Metrics>,
        max_concurrent_reconciles: u16,
        analysis: super::analysis::Policy,
        scope: crate::watch::WatchScope,
    ) -> Context {
        let reporter = crate::events::reporter();
        Context {
            recorder: crate::events::EventRecorders::new(client.clone(), reporter),
            templates: super::analysis::Templates::watch(
                scope.api(&client),
                &format!("{}={source}", crate::api::SOURCE_LABEL),
            ),
            scope,
            http: Default::default(),
            analysis,
            client,
            source: source.to_string(),
            metrics,
            max_concurrent_reconciles,
            own_status_writes: Default::default(),
            own_child_writes: Default::default(),
            error_runs: Default::default(),
            reconciles: crate::liveness::process().register_work("reconcile"),
            edited: Default::default(),
            shards: std::sync::Arc::new(super::shards::ShardSet::unsharded()),
            config_collected: Default::default(),
            source_account: super::source_account::SourceAccount::agent(),
            first_status_wait: crate::plan::first_status::FIRST_STATUS_WAIT,
            first_status_waiting: Default::default(),
            fleet: std::sync::Arc::new(super::fleet::FleetGates::off(Default::default())),
            image_origins: Default::default(),
        }
    }

    /// This context with the image automation's origins (`--image-automation`).
    pub fn with_image_origins(mut self, origins: SharedImageOrigins) -> Context {
        self.image_origins = origins;
        self
    }

    /// This context with a fleet's gates (`--fleet`).
    pub fn with_fleet(mut self, fleet: super::fleet::FleetGates) -> Context {
        self.fleet = std::sync::Arc::new(fleet);
        self
    }

    /// This context with `wait` for a new rollout's first status (0 writes it at once).
    pub fn with_first_status_wait(mut self, wait: std::time::Duration) -> Context {
        self.first_status_wait = wait;
        self
    }

    /// How long the first status of `rollout` (a kind/namespace/name key) may wait, counting
    /// it among the waiting until [`Context::first_status_done`].
    pub fn first_status_wait_of(&self, rollout: &str) -> std::time::Duration {
        let mut waiting =
            (self.first_status_waiting.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        waiting.wait(rollout, self.first_status_wait)
    }

    /// `rollout`'s first status was written, or it is deleted or runs elsewhere.
    pub fn first_status_done(&self, rollout: &str) {
        (self.first_status_waiting.lock())
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .done(rollout);
    }

    /// This context acting as `account` where the source's rights are wanted.
    pub fn with_source_account(mut self, account: super::source_account::SourceAccount) -> Context {
        self.source_account = account;
        self
    }

    /// This context running only the rollouts of the shards `shards` holds.
    pub fn with_shards(mut self, shards: std::sync::Arc<super::shards::ShardSet>) -> Context {
        self.shards = shards;
        self
    }

    /// The controller settings every controller shares.
    pub fn controller_config(&self) -> kube::runtime::controller::Config {
        kube::runtime::controller::Config::default().concurrency(self.max_concurrent_reconciles)
    }

    /// The label selector of this agent's rollouts (objects applied from its source).
    pub fn selector(&self) -> String {
        source_selector(&self.source)
    }

    /// The label selector of the children this agent's rollouts created.
    pub fn child_selector(&self) -> String {
        format!("{}={}", crate::api::ROLLOUT_SOURCE_LABEL, self.source)
    }

    /// Publishes an event on `object`; a failure to publish is logged, never fatal.
    pub async fn publish(
        &self,
        object: &k8s_openapi::api::core::v1::ObjectReference,
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        self.recorder
            .publish_note(object, warning, reason, message)
            .await;
    }
}

/// The label selector of the rollouts (objects applied) of `source`.
pub fn source_selector(source: &str) -> String {
    format!("{}={source}", crate::api::SOURCE_LABEL)
}

impl Context {
    /// Times a reconcile of `kind` and counts its error, if any, by its stable label.
    pub async fn measured<T>(
        &self,
        kind: &str,
        reconcile: impl std::future::Future<Output = Result<T, super::ReconcileError>>,
    ) -> Result<T, super::ReconcileError> {
        use crate::telemetry::{ErrorLabels, KindLabel};
        let started = std::time::Instant::now();
        let result = reconcile.await;
        self.metrics
            .reconcile_duration
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &result
            && !matches!(e, super::ReconcileError::Waiting(_))
        {
            self.metrics
                .reconcile_errors
                .get_or_create(&ErrorLabels {
                    kind: kind.to_string(),
                    error: e.metric_label().to_string(),
                })
                .inc();
        }
        result
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn events_with_new_text_are_not_folded_into_a_stale_series() {
        // Issue 18: `CanaryStarted (x4) canary of redis:7.4.1` when the canary was redis:7.5.
        let first = crate::events::event_action("canary of redis:7.4.1");
        assert_eq!(first, crate::events::event_action("canary of redis:7.4.1"));
        assert_ne!(first, crate::events::event_action("canary of redis:7.5"));
        assert!(first.len() <= 128, "the API's limit on action");
    }
}
