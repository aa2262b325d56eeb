//! The CanaryDeployment state machine: `plan(rollout, observed, now) -> DeployPlan`.
//!
//! - `Rolling`: one Deployment, `<name>`, kept on the spec's image, replicas and resources;
//!   drift made by hand is put back.
//! - `Batches`: the old and new versions run as two Deployments named
//!   `<name>-<hash of the pod template>`, each selecting its own pods by the label
//!   `rollouts.linnet.dev/version` (both still match the application's Service). Each batch
//!   scales the new one to its target ([`super::batch`]) and the old one to
//!   `total - new.available`; the last batch deletes the old one.
//! - `BlueGreen`: two such Deployments, the new one at full size beside the old one, and
//!   every request switched at once ([`blue_green`]).
//! - `Rollback`: back to the previous image: the old Deployment is scaled back up and the new
//!   one drained and deleted, or, with one Deployment, its image is set back.
//!
//! The batch, its start time and the images live in status, so a restarted agent carries on
//! from the recorded batch; every write is derived from the spec and the observed
//! Deployments, so nothing is scaled twice.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::actions::Action;
use super::analysis::{self, BACKGROUND, Resolved, Verdict};
use super::batch;
use super::machine::{
    self, Finished, Machine, Next, Standing, annotation_acts, elapsed, go, go_quietly, go_warning,
};
use super::objects::{RolloutRef, stamp};
pub use super::observed::DeploymentView;
use super::observed::{Observed, normalized_selector};
use super::traffic::Want;
use crate::api::{
    BatchState, BatchStatus, CHILD_HASH_ANNOTATION, CanaryDeploymentSpec, CanaryDeploymentStatus,
    DeploymentPhase as Phase, DeploymentStrategyType as Strategy, ImageReplicas, PauseMode,
    ROLLOUT_LABEL, RollbackStatus, VersionConfig,
};
use crate::hash::content_hash;

pub use crate::api::VERSION_LABEL;

/// What a refused selector change says; the Failed phase it causes ends once it is put back.
const SELECTOR_REFUSED: &str = "cannot change it on the live Deployment";

/// The rollout as the planner sees it.
#[derive(Clone, Debug)]
pub struct DeployRollout<'a> {
    pub reference: RolloutRef,
    pub generation: Option<i64>,
    pub spec: &'a CanaryDeploymentSpec,
    pub source_revision: Option<String>,
    /// Where the spec's image came from, when the image automation wrote it
    /// ([`super::image_tags::ImageOrigins`]); `None` when not known now.
    pub image_source: Option<String>,
    /// The `rollouts.linnet.dev/source-path` annotation: the rollout's file in Git.
    pub source_path: Option<String>,
    /// The `rollouts.linnet.dev/abort` annotation: `"true"` (set after the rollout started)
    /// or the image being rolled out ends the rollout and rolls it back.
    pub abort: Option<String>,
    /// The status as last written, with the measurements taken for this reconcile.
    pub status: CanaryDeploymentStatus,
    /// The analysis runs `spec.analysis` asks for, resolved by the controller.
    pub analysis: Resolved,
    /// Why a fleet holds this cluster from starting the spec's new image
    /// ([`super::fleet::gate`]); `None` when nothing holds it.
    pub fleet_hold: Option<String>,
}

/// What to do now: the status, the actions, the events and the progress deadline.
pub type DeployPlan = super::actions::Planned<CanaryDeploymentStatus, Phase>;

/// How much of a rollout's name a version Deployment's name keeps.
pub const VERSION_PREFIX_CHARS: usize = 50;

/// The name of the Deployment for a pod template: `<name>-<8 hex digits>`.
pub fn version_name(rollout: &str, template_hash: &str) -> String {
    let prefix: String = rollout.chars().take(VERSION_PREFIX_CHARS).collect();
    format!("{prefix}-{}", &template_hash[..8.min(template_hash.len())])
}

/// The pod template of `image`: the spec's, with the image (and resources) on its container,
/// naming the config copies `versions` gives the image.
fn pod_template(
    spec: &CanaryDeploymentSpec,
    versions: &[VersionConfig],
    image: &str,
) -> k8s_openapi::api::core::v1::PodTemplateSpec {
    let mut template = spec.template.get().template;
    if let Some(pod) = template.spec.as_mut() {
        super::config::rewrite(pod, super::config::copies_for(versions, image));
        let index = match spec.container.as_deref() {
            Some(c) => pod.containers.iter().position(|x| x.name == c),
            None => (!pod.containers.is_empty()).then_some(0),
        };
        if let Some(i) = index {
            pod.containers[i].image = Some(image.to_string());
            if let Some(r) = &spec.resources {
                pod.containers[i].resources = Some(r.clone());
            }
        }
    }
    template
}

/// The hash that names `image`'s version: its pod template without the config copies, so a
/// config change updates the version in place instead of making another.
fn template_hash(spec: &CanaryDeploymentSpec, image: &str) -> String {
    content_hash(&serde_json::to_value(pod_template(spec, &[], image)).unwrap_or_default())
}

/// What an analysis template's `{{ rollout.FIELD }}` means for a CanaryDeployment: batched,
/// each version's pods carry [`VERSION_LABEL`]; rolling, both selectors are all its pods.
pub fn analysis_builtins(
    name: &str,
    namespace: &str,
    spec: &CanaryDeploymentSpec,
    status: &CanaryDeploymentStatus,
) -> super::analysis::Builtins {
    let canary = status
        .canary_image
        .clone()
        .unwrap_or_else(|| spec.image.clone());
    let stable = status.stable_image.clone();
    let selector = |image: &str| {
        let mut s = format!("{ROLLOUT_LABEL}={name}");
        if spec.strategy.type_.versioned() {
            let hash = template_hash(spec, image);
            s.push_str(&format!(",{VERSION_LABEL}={}", &hash[..8.min(hash.len())]));
        }
        s
    };
    let stable_selector = stable.as_deref().map(selector);
    let baseline_selector = if baseline_wanted(spec) {
        Some(format!(
            "{ROLLOUT_LABEL}={name},{VERSION_LABEL}={BASELINE_VERSION}"
        ))
    } else {
        stable_selector.clone()
    };
    super::analysis::Builtins {
        name: name.to_string(),
        namespace: namespace.to_string(),
        canary_selector: Some(selector(&canary)),
        stable_selector,
        baseline_selector,
        canary_image: canary,
        stable_image: stable,
    }
}

/// The CanaryDeployment planner: the shared [`machine::Planner`] with this kind's rollout and
/// status.
type Planner<'a> = machine::Planner<'a, DeployRollout<'a>, CanaryDeploymentStatus>;

/// Plans one reconcile of a CanaryDeployment from its managed Deployments.
pub fn plan(rollout: &DeployRollout<'_>, observed: &Observed, now: Timestamp) -> DeployPlan {
    let mut planner = Planner::new(rollout, observed, &rollout.status, now);
    let status = &rollout.status;
    let stable = status
        .stable_image
        .as_deref()
        .unwrap_or(&rollout.spec.image);
    let rollback = status.rollback.as_ref();
    let keep: Vec<&str> = [
        status.canary_image.as_deref(),
        status.previous_image.as_deref(),
        rollback.map(|r| r.from_image.as_str()),
        rollback.map(|r| r.to_image.as_str()),
    ]
    .into_iter()
    .flatten()
    .collect();
    planner.st.version_config = super::config::versions(
        &status.version_config,
        &observed.config,
        &rollout.spec.image,
        stable,
        &keep,
    );
    machine::plan(planner, &rollout.status)
}

impl Machine for Planner<'_> {
    type Status = CanaryDeploymentStatus;

    fn step(&mut self, phase: Phase) -> Next<Phase> {
        Planner::step(self, phase)
    }

    /// Deletions are a phase's last step; everything else is redone by the next phase.
    fn moved_on(&mut self, mark: usize, _keep: bool) {
        let kept: Vec<Action> = self
            .actions
            .drain(mark..)
            .filter(|a| matches!(a, Action::DeleteDeployment { .. }))
            .collect();
        self.actions.extend(kept);
        self.want = None;
    }

    fn finish(mut self, message: String) -> Finished<Self::Status> {
        let mut versions = std::mem::take(&mut self.st.version_config);
        let st = &self.st;
        // At rest, a finished rollout's or rollback's images run nowhere any more.
        let moving = !matches!(st.phase, Some(Phase::Completed | Phase::RolledBack));
        let rollback = st.rollback.as_ref().filter(|_| moving);
        let keep: Vec<&str> = [Some(self.r.spec.image.as_str())]
            .into_iter()
            .chain([
                st.stable_image.as_deref(),
                st.canary_image.as_deref().filter(|_| moving),
                st.previous_image.as_deref(),
                rollback.map(|r| r.from_image.as_str()),
                rollback.map(|r| r.to_image.as_str()),
            ])
            .flatten()
            .collect();
        super::config::retain(&mut versions, &keep);
        self.st.version_config = versions;
        Planner::finish(self, message)
    }
}

impl<'a> Planner<'a> {
    fn spec(&self) -> &CanaryDeploymentSpec {
        self.r.spec
    }

    fn total(&self) -> i32 {
        self.spec().replicas.max(0)
    }

    fn name(&self) -> &str {
        &self.r.reference.name
    }

    fn batched(&self) -> bool {
        self.spec().strategy.type_.versioned()
    }

    fn stable_image(&self) -> String {
        self.st
            .stable_image
            .clone()
            .unwrap_or_else(|| self.spec().image.clone())
    }

    fn canary_image(&self) -> String {
        self.st
            .canary_image
            .clone()
            .unwrap_or_else(|| self.spec().image.clone())
    }

    fn batches(&self) -> i32 {
        if self.blue_green() {
            2
        } else {
            self.spec().batches.max(1)
        }
    }

    fn current_batch(&self) -> i32 {
        self.st.current_batch.unwrap_or(1).clamp(1, self.batches())
    }

    /// The observed Deployment `name`, the baseline's included.
    fn find(&self, name: &str) -> Option<&'a DeploymentView> {
        self.o
            .deployments
            .iter()
            .chain(self.o.baseline.as_ref())
            .find(|d| d.name == name)
    }

    /// The pod template for `image`, with the spec's resources on the rolled-out container.
    fn pod_template(&self, image: &str) -> k8s_openapi::api::core::v1::PodTemplateSpec {
        pod_template(self.spec(), &self.st.version_config, image)
    }

    /// The Deployment a batched rollout runs `image` in.
    fn version_for(&self, image: &str) -> String {
        version_name(self.name(), &template_hash(self.spec(), image))
    }

    /// The Deployment `name` running `image` with `replicas`.
    fn deployment(&self, name: &str, image: &str, replicas: i32) -> Deployment {
        let rollout = &self.r.reference;
        let mut spec = self.spec().template.get();
        spec.replicas = Some(replicas);
        spec.template = self.pod_template(image);
        let mut pod_labels = spec.selector.match_labels.clone().unwrap_or_default();
        pod_labels.insert(ROLLOUT_LABEL.into(), rollout.name.clone());
        if let Some(version) = name.strip_prefix(&format!("{}-", rollout.name)) {
            pod_labels.insert(VERSION_LABEL.into(), version.to_string());
        }
        spec.selector = LabelSelector {
            match_labels: Some(pod_labels.clone()),
            match_expressions: spec.selector.match_expressions.clone(),
        };
        spec.template
            .metadata
            .get_or_insert_with(ObjectMeta::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .extend(pod_labels);
        let mut d = Deployment {
            metadata: rollout.meta(name, "CanaryDeployment", rollout.labels()),
            spec: Some(spec),
            status: None,
        };
        stamp(&mut d.metadata, &d.spec);
        d
    }

    /// Applies Deployment `name` unless it already is what it should be: linnet's last apply,
    /// and no drift in image, replicas, cpu or memory since.
    fn ensure(&mut self, name: &str, image: &str, replicas: i32) -> Option<&'a DeploymentView> {
        let desired = self.deployment(name, image, replicas);
        let hash = desired
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CHILD_HASH_ANNOTATION).cloned());
        let observed = self.find(name);
        let same = observed.is_some_and(|o| {
            o.applied_hash == hash
                && o.replicas == replicas
                && o.image.as_deref() == Some(image)
                && (self.spec().resources.is_none() || o.resources == self.spec().resources)
        });
        if same {
            observed
        } else {
            self.actions
                .push(Action::ApplyDeployment(Box::new(desired)));
            None
        }
    }

    /// The Deployment currently serving the stable version: not `except`, most replicas.
    fn stable_deployment(&self, except: &str) -> Option<&'a DeploymentView> {
        self.o
            .deployments
            .iter()
            .filter(|d| d.name != except)
            .max_by_key(|d| (d.replicas, d.available))
    }

    /// The Deployment that serves `image`: that version's own, else any on that image, else
    /// the biggest.
    fn serving(&self, image: &str) -> Option<&'a DeploymentView> {
        let home = self.home(image);
        self.find(&home)
            .or_else(|| {
                self.o
                    .deployments
                    .iter()
                    .filter(|d| d.image.as_deref() == Some(image))
                    .max_by_key(|d| (d.replicas, d.available))
            })
            .or_else(|| self.stable_deployment(""))
    }

    /// Deletes every Deployment but `keep`, the one asking for most replicas first: a crash
    /// between two deletions leaves the smallest surge.
    fn delete_others(&mut self, keep: &str) {
        let mut others: Vec<_> = self
            .o
            .deployments
            .iter()
            .filter(|d| d.name != keep)
            .collect();
        others.sort_by_key(|d| (std::cmp::Reverse(d.replicas), d.name.clone()));
        for d in others {
            let delete = Action::DeleteDeployment {
                name: d.name.clone(),
            };
            if !self.actions.contains(&delete) {
                self.actions.push(delete);
            }
        }
    }

    fn step(&mut self, phase: Phase) -> Next<Phase> {
        match (self.selector_change(), phase) {
            (Some(problem), Phase::Failed) => return Next::Stay(problem),
            (Some(problem), _) => return go_warning(Phase::Failed, "UnsafeChange", problem),
            (None, Phase::Failed)
                if self
                    .st
                    .message
                    .as_deref()
                    .is_some_and(|m| m.contains(SELECTOR_REFUSED)) =>
            {
                return go(
                    Phase::Completed,
                    "SpecFixed",
                    "the selector is back as the live Deployments have it; carrying on".into(),
                );
            }
            _ => {}
        }
        match phase {
            Phase::Initializing => self.initializing(),
            Phase::Completed => self.completed(),
            Phase::Progressing | Phase::Paused => {
                if self.blue_green() {
                    self.blue_green_step(phase)
                } else if self.batched() || self.st.current_batch.is_some() {
                    self.batch_step(phase)
                } else {
                    self.rolling_step()
                }
            }
            Phase::RollingBack => self.rolling_back(),
            Phase::RolledBack => self.rolled_back(),
            Phase::Failed => self.failed(),
        }
    }

    /// A selector change the live Deployments cannot take (the API server refuses it).
    fn selector_change(&self) -> Option<String> {
        let live = self.o.deployments.iter().find(|d| {
            let desired = self.deployment(&d.name, "", 0);
            let want = desired
                .spec
                .as_ref()
                .and_then(|s| normalized_selector(&s.selector));
            d.selector.is_some() && d.selector != want
        })?;
        let at = self
            .r
            .source_path
            .as_deref()
            .map_or(String::new(), |p| format!("{p}: "));
        Some(format!(
            "{at}spec.template.selector changed, but Kubernetes {SELECTOR_REFUSED} {}; \
             put it back in Git, or delete the rollout and create it again",
            live.name
        ))
    }

    fn home(&self, image: &str) -> String {
        if self.batched() {
            self.version_for(image)
        } else {
            self.name().to_string()
        }
    }
}

/// Whether a rollout in `phase` acts on the abort annotation: the phases whose step begins
/// with `interrupted` (a rollout under way, or one that failed).
pub fn reads_abort(phase: Phase) -> bool {
    matches!(phase, Phase::Progressing | Phase::Paused | Phase::Failed)
}

/// Whether batch `n` may start without a person's approval in Git: the pause mode lets it,
/// or `spec.currentBatch` has reached it.
pub fn batch_allowed(spec: &CanaryDeploymentSpec, n: i32) -> bool {
    match spec.pause {
        PauseMode::Never => true,
        PauseMode::First => n > 2 || spec.current_batch >= n,
        PauseMode::All => spec.current_batch >= n,
    }
}

mod baseline;
pub use baseline::{BASELINE_VERSION, baseline_name, baseline_wanted};
mod batches;
mod blue_green;
mod rollback;
mod starting;
mod status;
mod traffic;

#[cfg(test)]
mod tests;
