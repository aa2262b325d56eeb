//! The one reconcile of both controllers, after each has observed its rollout: resolve and
//! take the analysis measurements due, ask the kind's phase machine for a plan, write the
//! status (before acting: a crash in between only means doing the actions again), execute
//! the actions, publish the events, and requeue only for a real timer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::controller::Action as Requeue;
use kube::{Resource, ResourceExt};

use super::analysis::{Measured, measure};
use super::execute::execute;
pub(crate) use super::rollout_kind::RolloutKind;
use super::{Context, Doing, ReconcileError, StatusWrite, show_action_failure, write_status};
use crate::api::{SOURCE_LABEL, SPEC_HASH_ANNOTATION};
use crate::plan::actions::Planned;
use crate::plan::objects::RolloutRef;
use crate::plan::{Observed, RolloutStatus};

/// The rollout as the plans name it.
pub(crate) fn reference(rollout: &impl Resource, ns: &str) -> RolloutRef {
    RolloutRef {
        name: rollout.name_any(),
        namespace: ns.to_string(),
        uid: rollout.uid().unwrap_or_default(),
        source: rollout.labels().get(SOURCE_LABEL).cloned(),
    }
}

/// Plans and acts on `rollout` in `ns` from what `observe` reads (with the pods or without).
pub(crate) async fn plan_and_act<K, Read>(
    ctx: &Context,
    rollout: &K,
    ns: &str,
    observe: impl Fn(bool) -> Read,
) -> Result<Requeue, ReconcileError>
where
    K: RolloutKind,
    Read: std::future::Future<Output = Result<Observed, ReconcileError>>,
{
    let started = Instant::now();
    let name = rollout.name_any();
    if let Some(wait) = wait_for_own_write(ctx, K::KIND, ns, &name, started) {
        return Ok(wait);
    }
    if refused_as_edited(ctx, rollout, ns).await {
        return Ok(Requeue::await_change());
    }
    let now = jiff::Timestamp::now();
    let (mut planned, observed, reference) = match plan(ctx, rollout, ns, observe, now).await? {
        Ok(planned) => planned,
        Err(wait) => return Ok(wait),
    };
    ctx.metrics.rollout_phase(
        K::KIND,
        &format!("{ns}/{name}"),
        planned.status.phase().map(crate::api::WireName::wire_name),
    );
    // The push's trace, from the traceparent the sync wrote with this spec (issue 71).
    if let Some(parent) =
        crate::telemetry::trace::Parent::of_annotations(rollout.meta().annotations.as_ref())
    {
        planned.status.set_trace_id(parent.trace_id());
    }
    let written = write_first_status(ctx, rollout, ns, &mut planned, now).await?;
    for action in &planned.actions {
        tracing::info!(rollout = %format!("{ns}/{name}"), action = %action.describe(), "acting");
        let span = tracing::info_span!("action", action = %action.describe());
        if let Err(e) =
            tracing::Instrument::instrument(execute(action, ctx, ns, &name, &observed), span).await
        {
            let status = &planned.status;
            return Err(show_action_failure(ctx, rollout, K::KIND, status, action, e, now).await);
        }
    }
    // A status written or deferred announced its events; an unchanged one may repeat a
    // warning (a claim made again), which the Recorder counts up in a series.
    let object = rollout.object_ref(&());
    for e in planned
        .events
        .iter()
        .filter(|_| written == StatusWrite::Unchanged)
    {
        tracing::info!(rollout = %format!("{ns}/{name}"), reason = e.reason, "{}", e.message);
        ctx.publish(&object, e.warning, e.reason, &e.message).await;
    }
    let versioned = rollout.config_template().is_some();
    if versioned && planned.status.phase().is_some_and(K::settled) {
        super::config_copies::collect(ctx, &reference, K::recorded_config(&planned.status)).await?;
    }
    tracing::debug!(rollout = %format!("{ns}/{name}"), phase = ?planned.status.phase(), took = ?started.elapsed(), "reconciled");
    Ok(match planned.requeue_after {
        Some(after) => Requeue::requeue(after),
        None => Requeue::await_change(),
    })
}

/// A child this agent just wrote is not in the store yet: planning now would write it
/// again. How long to wait for the watch to show it, if it must.
fn wait_for_own_write(
    ctx: &Context,
    kind: &str,
    ns: &str,
    name: &str,
    started: Instant,
) -> Option<Requeue> {
    let key = super::own_writes::child_key(kind, ns, name);
    let wait = ctx.own_child_writes.wait_for(&key, started);
    if wait.lapsed > 0 {
        // A last resort: the watch never showed the write (nor anything after it).
        tracing::warn!(rollout = %format!("{ns}/{name}"), lapsed = wait.lapsed, "the watch never showed this agent's write of a child; planning from the store as it is");
        ctx.metrics.own_write_wait_lapses.inc_by(wait.lapsed as u64);
    }
    let left = wait.left?;
    tracing::debug!(rollout = %format!("{ns}/{name}"), wait = ?left, "waiting for the watch to show this agent's last write of a child");
    Some(Requeue::requeue(left))
}

/// Issue 44: a spec edited in the cluster (`kubectl edit`, `patch`) is never acted on. The
/// sync is told at once and puts Git's spec back; that change wakes this rollout again.
async fn refused_as_edited<K: RolloutKind>(ctx: &Context, rollout: &K, ns: &str) -> bool {
    let annotations = rollout.annotations();
    let stamp = annotations.get(SPEC_HASH_ANNOTATION).map(String::as_str);
    if crate::plan::spec_is_gits(
        stamp,
        annotations.contains_key(crate::sync::desired::APPLIED_HASH_ANNOTATION),
        &rollout.spec_stamp(crate::api::stamp_counts_replicas(stamp)),
    ) {
        return false;
    }
    let name = rollout.name_any();
    let message = format!(
        "the spec of {} {ns}/{name} differs from the one linnet applied from Git (edited in \
         the cluster?); it is not acted on, and Git's spec is being put back: change it in Git",
        K::KIND
    );
    tracing::warn!(rollout = %format!("{ns}/{name}"), "{message}");
    ctx.publish(&rollout.object_ref(&()), true, "SpecDrift", &message)
        .await;
    ctx.edited.found(crate::specs::ObjectKey::new(
        crate::api::API_VERSION.to_string(),
        K::KIND.to_string(),
        ns.to_string(),
        name,
    ));
    true
}

/// A plan, what it was made from, and the rollout as it names it.
type PlannedFrom<K> = (
    Planned<<K as RolloutKind>::Status, <K as RolloutKind>::Phase>,
    Observed,
    RolloutRef,
);

/// Observes, reads the config copies, takes the measurements due and plans; `Err` a wait
/// for the watch to show a newer spec first.
async fn plan<K, Read>(
    ctx: &Context,
    rollout: &K,
    ns: &str,
    observe: impl Fn(bool) -> Read,
    now: jiff::Timestamp,
) -> Result<Result<PlannedFrom<K>, Requeue>, ReconcileError>
where
    K: RolloutKind,
    Read: std::future::Future<Output = Result<Observed, ReconcileError>>,
{
    let stored_phase = rollout.status().and_then(|s| s.phase());
    let mut observed = observe(K::reads_pods(stored_phase)).await?;
    let mut status = rollout.status().cloned().unwrap_or_default();
    let reference = reference(rollout, ns);
    let (config, newer_config) = super::config_copies::read(
        ctx,
        K::KIND,
        &reference,
        rollout.config_template(),
        crate::plan::config::applied_at(rollout.meta().managed_fields.as_deref()),
        K::recorded_config(&status),
    )
    .await?;
    // Only then: a tuple of the two read the rollout on every reconcile (issue 51: 6.8
    // reads a rollout in a first sync of 1,000).
    if newer_config && let Some(wait) = spec_behind(ctx, rollout, ns).await? {
        return Ok(Err(wait));
    }
    observed.config = config.clone();
    let builtins = rollout.builtins(ns, &status);
    let name = rollout.name_any();
    let analysis = ctx.fleet.analysis(
        (K::KIND, ns, &name),
        rollout.analysis(),
        rollout.last_gate(),
    );
    let resolved = ctx
        .templates
        .resolve(analysis.as_deref(), ns, &builtins)
        .await;
    let measured = Measured {
        reference: &reference,
        kind: K::KIND,
        active: status.phase().is_some_and(K::measures_in)
            && !super::status_write_pending(ctx, K::KIND, rollout),
    };
    measure(ctx, measured, status.analysis_runs(), &resolved, now).await;
    let analysis = resolved.clone();
    let hold = ctx
        .fleet
        .hold((K::KIND, ns, &name), rollout.spec_image(), now);
    let outside = super::rollout_kind::Outside {
        fleet_hold: hold.as_ref().map(|h| h.message.clone()),
        image_source: ctx
            .image_origins
            .read()
            .ok()
            .and_then(|o| o.of(rollout.spec_image()).map(str::to_string)),
    };
    let mut planned = rollout.plan(
        reference.clone(),
        status.clone(),
        analysis,
        &observed,
        now,
        outside.clone(),
    );
    if K::plans_again_with_pods(stored_phase, planned.status.phase()) {
        // The plan left a phase that goes by the sets alone: plan again with the pods (and
        // a fresh read of the rest, once per canary start).
        observed = observe(true).await?;
        observed.config = config;
        planned = rollout.plan(reference.clone(), status, resolved, &observed, now, outside);
    }
    fleet_held(ctx, rollout, (ns, &name), hold, &mut planned, now);
    Ok(Ok((planned, observed, reference)))
}

/// What a fleet's hold means beyond the plan: the held-rollout metric, and a requeue when
/// the hold ends by itself.
fn fleet_held<K: RolloutKind>(
    ctx: &Context,
    rollout: &K,
    (ns, name): (&str, &str),
    hold: Option<crate::plan::fleet::Hold>,
    planned: &mut Planned<K::Status, K::Phase>,
    now: jiff::Timestamp,
) {
    // Held: at rest on another image than the spec's, by the fleet's word.
    let held = hold.as_ref().filter(|_| {
        planned.status.phase().is_some_and(K::settled)
            && K::stable_image(&planned.status) != Some(rollout.spec_image())
    });
    ctx.metrics.fleet.hold(
        (K::KIND, ns, name),
        held.map(|h| (h.wave.as_str(), h.reason.as_str())),
    );
    // A bake ending or a deadline passing changes the fleet's answer with no new Git.
    if let Some(at) = hold.and_then(|h| h.recheck_at) {
        let wait =
            Duration::try_from(at.duration_since(now)).unwrap_or_default() + Duration::from_secs(1);
        planned.requeue_after = Some(planned.requeue_after.map_or(wait, |r| r.min(wait)));
    }
}

/// Writes the planned status, unless it is a new rollout's first, which waits for its
/// children to be ready (longer when many start at once).
async fn write_first_status<K: RolloutKind>(
    ctx: &Context,
    rollout: &K,
    ns: &str,
    planned: &mut Planned<K::Status, K::Phase>,
    now: jiff::Timestamp,
) -> Result<StatusWrite, ReconcileError> {
    let name = rollout.name_any();
    let never_written = rollout.status().and_then(RolloutStatus::phase).is_none();
    let key = super::own_writes::child_key(K::KIND, ns, &name);
    let first_status_wait = crate::plan::first_status::first_status_wait(
        rollout.status(),
        planned,
        rollout.meta().creation_timestamp.as_ref().map(|t| t.0),
        now,
        match never_written {
            true => ctx.first_status_wait_of(&key),
            false => ctx.first_status_wait,
        },
    );
    if never_written && first_status_wait.is_none() {
        ctx.first_status_done(&key);
    }
    Ok(match first_status_wait {
        Some(wait) => {
            tracing::debug!(rollout = %format!("{ns}/{name}"), ?wait, "new rollout initializing; its first status waits for its children to be ready");
            planned.requeue_after = Some(planned.requeue_after.map_or(wait, |r| r.min(wait)));
            let old = rollout.status();
            super::status_write::announce_once(ctx, rollout, old, &planned.events).await;
            StatusWrite::Deferred
        }
        None => {
            let (old, events) = (rollout.status(), &planned.events);
            write_status(ctx, rollout, K::KIND, old, &planned.status, events).await?
        }
    })
}

/// Config applied after the rollout's spec: a change of the config alone, or a newer spec this
/// store has not seen yet (watches of two kinds keep no order between them). In the second
/// case the stable pods would take the canary's config: wait for the watch to show it.
async fn spec_behind<K: RolloutKind>(
    ctx: &Context,
    rollout: &K,
    ns: &str,
) -> Result<Option<Requeue>, ReconcileError> {
    let name = rollout.name_any();
    let live = kube::Api::<K>::namespaced(ctx.client.clone(), ns)
        .get_metadata(&name)
        .await
        .doing(|| format!("reading {} {ns}/{name}", K::KIND))?;
    Ok((live.metadata.generation > rollout.meta().generation).then(|| {
        tracing::debug!(rollout = %format!("{ns}/{name}"), "its config changed with a spec this agent has not seen yet; waiting for it");
        Requeue::requeue(Duration::from_secs(1))
    }))
}

/// Starts running `rollout` if this replica runs it (its shard's Lease is this replica's):
/// the shard is not given up until the returned guard drops. Else this one does nothing for
/// it, and drops the phase it may have shown for it while it ran it.
pub(crate) fn run_here<'a, K: RolloutKind>(
    ctx: &'a Context,
    rollout: &K,
) -> Option<super::shards::Running<'a>> {
    let ns = rollout.namespace().unwrap_or_default();
    let name = rollout.name_any();
    if let Some(running) = ctx.shards.run(&ns, &name) {
        return Some(running);
    }
    let key = super::own_writes::child_key(K::KIND, &ns, &name);
    ctx.first_status_done(&key);
    ctx.error_runs.succeeded(&key);
    ctx.metrics
        .rollout_phase(K::KIND, &format!("{ns}/{name}"), None);
    None
}

/// Times a reconcile, counts its error by label, and puts a failed API request on the
/// rollout as a `ReconcileFailed` event.
pub(crate) async fn measured<K: RolloutKind>(
    ctx: &Context,
    rollout: &K,
    reconcile: impl std::future::Future<Output = Result<Requeue, ReconcileError>>,
) -> Result<Requeue, ReconcileError> {
    let key = super::own_writes::child_key(
        K::KIND,
        &rollout.namespace().unwrap_or_default(),
        &rollout.name_any(),
    );
    let running = ctx.reconciles.begin(key.clone());
    crate::liveness::hang_if_asked("reconcile").await;
    // Joins the trace of the sync that applied this spec (issue 71), so that one push's trace
    // reaches the actions it causes; without one, the span stands alone.
    let span = tracing::info_span!("reconcile", kind = K::KIND, rollout = %key, generation = rollout.meta().generation);
    if let Some(parent) =
        crate::telemetry::trace::Parent::of_annotations(rollout.meta().annotations.as_ref())
    {
        parent.adopt(&span);
    }
    let result = ctx
        .measured(K::KIND, tracing::Instrument::instrument(reconcile, span))
        .await;
    drop(running);
    if result.is_ok() && ctx.error_runs.succeeded(&key) {
        tracing::info!(rollout = %key, "reconciled again after failures");
    }
    if let Err(e @ (ReconcileError::Kube { .. } | ReconcileError::KubeAsSource { .. })) = &result {
        ctx.publish(
            &rollout.object_ref(&()),
            true,
            "ReconcileFailed",
            &e.to_string(),
        )
        .await;
    }
    result
}

/// What both controllers' shared state gives the error policy.
pub(crate) trait HasContext {
    fn context(&self) -> &Context;
}

/// When a failed reconcile is tried again: a deletion waiting for children is woken by
/// them (this is a safety net); anything else later and later
/// ([`super::backoff::ErrorRuns`]), slower for a refusal, with a log line only when the
/// error changes.
pub(crate) fn error_policy<K: RolloutKind, S: HasContext>(
    rollout: Arc<K>,
    error: &ReconcileError,
    shared: Arc<S>,
) -> Requeue {
    let key = format!(
        "{}/{}",
        rollout.namespace().unwrap_or_default(),
        rollout.name_any()
    );
    match error {
        ReconcileError::Waiting(what) => {
            tracing::info!(rollout = %key, "deleting: waiting for {what}");
            Requeue::requeue(Duration::from_secs(30))
        }
        e => {
            let class = match e {
                ReconcileError::Kube {
                    source: kube::Error::Api(s),
                    ..
                } => format!("{}:{}", e.metric_label(), s.code),
                other => other.metric_label().to_string(),
            };
            let retry = shared.context().error_runs.failed(
                &format!("{}/{key}", K::KIND), // child_key's form: KIND/ns/name
                &class,
                e.permanent(),
                Instant::now(),
            );
            if retry.changed {
                tracing::warn!(rollout = %key, error = %e, retry_in = ?retry.after, "reconcile failed; retrying later and later until it succeeds");
            } else {
                tracing::debug!(rollout = %key, failures = retry.failures, retry_in = ?retry.after, "reconcile failed again with the same error");
            }
            Requeue::requeue(retry.after)
        }
    }
}
