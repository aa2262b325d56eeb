//! Writing a plan: server-side apply and deletes, a bounded number at once, each failure located
//! in its file, and drift announced as an event.

use super::*;

/// One write's outcome: the uid the API server answered (for an apply).
type WriteResult = Result<Option<String>, ObjectError>;

impl Syncer {
    /// Executes a plan; one object's failure does not stop the others. What other objects
    /// may need goes first, one at a time ([`prerequisites_first`]); the rest go
    /// [`APPLY_CONCURRENCY`] at a time (one at a time, a first sync of 1,000 rollouts spent
    /// 25 s waiting on single requests).
    pub async fn apply(&self, plan: &[PlannedChange]) -> SyncReport {
        self.apply_recording(plan).await.0
    }

    /// [`Syncer::apply`], with the uid the API server answered for each object written.
    pub(super) async fn apply_recording(
        &self,
        plan: &[PlannedChange],
    ) -> (SyncReport, BTreeMap<ObjectKey, String>) {
        let mut report = SyncReport::default();
        let mut written = BTreeMap::new();
        let (first, rest) = prerequisites_first(plan);
        let (rollouts, config, rest) = rollouts_then_config(rest);
        let done_first = futures::stream::iter(first).then(|c| self.execute(c));
        let done_rollouts = futures::stream::iter(rollouts)
            .map(|c| self.execute(c))
            .buffered(APPLY_CONCURRENCY);
        let done_config = futures::stream::iter(config)
            .map(|c| self.execute(c))
            .buffered(APPLY_CONCURRENCY);
        let done_rest = futures::stream::iter(rest)
            .map(|c| self.execute(c))
            .buffered(APPLY_CONCURRENCY);
        let done: Vec<(&PlannedChange, Option<WriteResult>)> = done_first
            .chain(done_rollouts)
            .chain(done_config)
            .chain(done_rest)
            .collect()
            .await;
        for (change, result) in done {
            let key = &change.key;
            let Some(result) = result else {
                match change.change {
                    Change::KeepVolume => {
                        tracing::info!(object = %key, "not pruning: linnet never deletes volumes");
                        report.kept_volumes.push(key.clone());
                    }
                    _ => report.unchanged += 1,
                }
                continue;
            };
            if let Ok(Some(uid)) = &result {
                written.insert(key.clone(), uid.clone());
            }
            match (result, change.change) {
                (Ok(_), Change::Create) => {
                    tracing::info!(object = %key, "created");
                    report.created.push(key.clone())
                }
                (Ok(_), Change::Update) => {
                    let drifted = match (&change.desired, &change.live) {
                        (Some(d), Some(live)) => drifted_fields(d, live),
                        _ => Vec::new(),
                    };
                    if drifted.is_empty() {
                        tracing::info!(object = %key, "updated");
                    } else {
                        tracing::warn!(object = %key, fields = %drifted.join(", "), "reverted changes made outside Git");
                        self.announce_drift(change, &drifted).await;
                        report.drift_reverted.push((key.clone(), drifted));
                    }
                    report.updated.push(key.clone())
                }
                (Ok(_), _) => {
                    tracing::info!(object = %key, "pruned: no longer in Git");
                    report.pruned.push(key.clone())
                }
                (Err(e), _) => {
                    // The source loop logs it when it starts or changes, not at every retry.
                    tracing::debug!(object = %key, error = %e, "sync failed for object");
                    report.errors.push((key.clone(), e.to_string()))
                }
            }
        }
        (report, written)
    }

    /// A `DriftReverted` event on an object put back to what Git says.
    pub(super) async fn announce_drift(&self, change: &PlannedChange, fields: &[String]) {
        let key = &change.key;
        let uid = change
            .live
            .as_ref()
            .and_then(|l| l.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map(String::from);
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(key.api_version.clone()),
            kind: Some(key.kind.clone()),
            namespace: Some(key.namespace.clone()).filter(|n| !n.is_empty()),
            name: Some(key.name.clone()),
            uid,
            ..Default::default()
        };
        let note: String = format!(
            "put back to what Git says; changed outside Git: {}",
            fields.join(", ")
        )
        .chars()
        .take(1000)
        .collect();
        let event = Event {
            type_: EventType::Warning,
            reason: "DriftReverted".into(),
            action: crate::events::event_action(&note),
            note: Some(note),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::debug!(object = %key, error = %e, "could not publish the drift event");
        }
    }

    /// One change's request, if it needs one.
    pub(super) async fn execute<'c>(
        &self,
        change: &'c PlannedChange,
    ) -> (
        &'c PlannedChange,
        Option<Result<Option<String>, ObjectError>>,
    ) {
        let result = match change.change {
            Change::Unchanged | Change::KeepVolume => None,
            Change::Create | Change::Update => Some(self.apply_one(change).await),
            Change::Prune => Some(
                self.delete_one(&change.key, change.uid.as_deref())
                    .await
                    .map(|()| None),
            ),
        };
        (change, result)
    }

    /// Applies one object; its uid, as the API server answered.
    pub(super) async fn apply_one(
        &self,
        change: &PlannedChange,
    ) -> Result<Option<String>, ObjectError> {
        let Some(desired) = &change.desired else {
            return Ok(None);
        };
        let key = &desired.key;
        let (ar, caps) = self.resource(&key.api_version, &key.kind).await?;
        // Every apply carries the finalizer, not only the create: an apply without a field
        // this manager applied before would remove it.
        let object = super::super::ownership::to_apply(desired, change.live.as_ref());
        let mut object = if self.rollout_finalizer && has_cleanup(key) {
            with_finalizer(&object, FINALIZER)
        } else {
            object
        };
        // The trace this sync is part of, for the rollout's reconciles to join (issue 71). Like
        // the finalizer, added after the hash: it changes no object's hash.
        if is_rollout(key)
            && let Some(traceparent) =
                crate::telemetry::trace::Parent::current().and_then(|p| p.traceparent())
            && let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut())
        {
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| serde_json::json!({}));
            if let Some(annotations) = annotations.as_object_mut() {
                annotations.insert(
                    crate::telemetry::trace::TRACEPARENT_ANNOTATION.into(),
                    traceparent.into(),
                );
            }
        }
        self.writer_api(&ar, &caps, &key.namespace)?
            .patch(
                &key.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .map(|o| o.metadata.uid)
            .map_err(|e| self.write_error("apply", "patch", &e, &ar, scoped(&caps, &key.namespace)))
    }

    /// A request the source's account made that failed; a 403 names the account and how to
    /// grant it. `what` is `apply`, `delete` or `read`.
    pub(super) fn write_error(
        &self,
        what: &'static str,
        verb: &str,
        e: &kube::Error,
        ar: &ApiResource,
        namespace: &str,
    ) -> ObjectError {
        let as_source = self.apply_as.user_for(namespace).is_some();
        let refused = as_source && matches!(e, kube::Error::Api(s) if s.code == 403);
        let text = if as_source {
            kube_message_hinted(e, &self.forbidden_hint(verb, ar, namespace))
        } else {
            kube_message(e)
        };
        ObjectError::Request {
            what,
            refused,
            text,
        }
    }

    /// Deletes one object, only if it is still the one with `uid` (a precondition: an object
    /// made again under the same name since is not this source's).
    pub(super) async fn delete_one(
        &self,
        key: &ObjectKey,
        uid: Option<&str>,
    ) -> Result<(), ObjectError> {
        let (ar, caps) = self.resource(&key.api_version, &key.kind).await?;
        let mut params = DeleteParams::background();
        if let Some(uid) = uid {
            params = params.preconditions(kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            });
        }
        match self
            .writer_api(&ar, &caps, &key.namespace)?
            .delete(&key.name, &params)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => {
                Err(self.write_error("delete", "delete", &e, &ar, scoped(&caps, &key.namespace)))
            }
        }
    }
}

/// Of what `prerequisites_first` left, in the order they are written: the rollouts, then the
/// ConfigMaps and Secrets, then the rest. Plain workloads find their new config in place
/// (Flux's and kustomize's order); a rollout with `versionedConfig` sees its new image before
/// the config that came with it, so that the config goes to its canary, and sees a revert's
/// image before its config, which its stable pods must not take.
/// A CanaryStatefulSet or CanaryDeployment.
fn is_rollout(key: &crate::specs::ObjectKey) -> bool {
    matches!(key.kind.as_str(), "CanaryStatefulSet" | "CanaryDeployment")
        && key
            .api_version
            .split_once('/')
            .is_some_and(|(group, _)| group == crate::api::GROUP)
}

fn rollouts_then_config(
    rest: Vec<&PlannedChange>,
) -> (
    Vec<&PlannedChange>,
    Vec<&PlannedChange>,
    Vec<&PlannedChange>,
) {
    let writes = |c: &PlannedChange| matches!(c.change, Change::Create | Change::Update);
    let (rollouts, rest): (Vec<_>, Vec<_>) = rest.into_iter().partition(|c| {
        writes(c)
            && c.key.api_version == crate::api::API_VERSION
            && matches!(
                c.key.kind.as_str(),
                "CanaryStatefulSet" | "CanaryDeployment"
            )
    });
    let (config, rest) = rest.into_iter().partition(|c| {
        writes(c)
            && c.key.api_version == "v1"
            && matches!(c.key.kind.as_str(), "ConfigMap" | "Secret")
    });
    (rollouts, config, rest)
}
