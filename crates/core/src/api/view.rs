//! What a rollout shows, whatever its kind. Every output reads a rollout through
//! [`RolloutView`]: the status files and commit messages written to Git, the commit statuses,
//! `/status` and `linnet get`; so phase, replicas, images and message are taken from a status
//! in one place, and a new output cannot show them differently.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::{CanaryDeployment, CanaryStatefulSet, Condition};

/// What a rollout shows. `None` and empty answers mean it has no status yet.
pub trait RolloutView {
    /// The kind: `CanaryStatefulSet` or `CanaryDeployment`.
    const KIND: &'static str;
    /// The short name `kubectl get` takes: `csts` or `cdeploy`.
    const SHORT_NAME: &'static str;

    fn meta(&self) -> &ObjectMeta;
    /// The phase's wire name.
    fn phase_name(&self) -> Option<&'static str>;
    /// Replicas ready of those desired, as `kubectl get` shows them (`2/3`).
    fn ready(&self) -> Option<&str>;
    fn message(&self) -> Option<&str>;
    /// The trace of the sync that applied the spec, when the agent exports traces.
    fn trace_id(&self) -> Option<&str>;
    /// The image the rollout serves when settled.
    fn stable_image(&self) -> Option<&str>;
    /// The image being rolled out, while one is.
    fn canary_image(&self) -> Option<&str>;
    /// The image the spec asks for.
    fn spec_image(&self) -> &str;
    /// The Git commit that last set the spec.
    fn source_revision(&self) -> Option<&str>;
    /// Where the spec's image came from, when the image automation wrote it.
    fn image_source(&self) -> Option<&str>;
    fn phase_since(&self) -> Option<&Time>;
    fn conditions(&self) -> &[Condition];
    fn desired_replicas(&self) -> i32;
    /// Replicas ready (a StatefulSet's) or available (a Deployment's).
    fn ready_replicas(&self) -> i32;
    /// Canary replicas ready, for a kind that counts them apart.
    fn canary_ready_replicas(&self) -> Option<i32>;
    /// The step of a CanaryStatefulSet.
    fn step(&self) -> Option<i32>;
    /// The batch of a CanaryDeployment (`2/3`).
    fn batch(&self) -> Option<&str>;
    /// What each image serves (`2 on redis:7.2, 1 on redis:7.4`): never an image that no
    /// replica serves, such as a rolled-back canary's.
    fn serving(&self) -> String;
    /// Percent of the routes' requests the canary gets, with traffic routing.
    fn canary_weight(&self) -> Option<i32>;
    /// Whether the header route sends matching requests to the canary.
    fn header_routed(&self) -> bool;
    /// The traffic the routes give the canary, in words (`20% of requests to the canary,
    /// and those the header route matches`), with traffic routing.
    fn traffic(&self) -> Option<String> {
        let weight = self.canary_weight()?;
        let header = if self.header_routed() {
            ", and those the header route matches"
        } else {
            ""
        };
        Some(format!("{weight}% of requests to the canary{header}"))
    }

    /// The image a canary runs, or would: the canary's, else the spec's.
    fn rolling_out(&self) -> &str {
        self.canary_image().unwrap_or(self.spec_image())
    }
    /// One line: `default/redis CanaryActive (2 on redis:7.2, 1 on redis:7.4; 3/3 ready)`.
    fn summary(&self) -> Option<String> {
        let batch = self
            .batch()
            .map(|b| format!("batch {b}: "))
            .unwrap_or_default();
        let traffic = self.traffic().map(|t| format!("; {t}")).unwrap_or_default();
        Some(format!(
            "{}/{} {} ({batch}{}{traffic}; {} ready)",
            self.meta().namespace.as_deref()?,
            self.meta().name.as_deref()?,
            self.phase_name()?,
            self.serving(),
            self.ready().unwrap_or("-"),
        ))
    }
}

/// The accessors both kinds answer the same way, from fields of the same names.
macro_rules! same_in_both_kinds {
    () => {
        fn meta(&self) -> &ObjectMeta {
            &self.metadata
        }
        fn phase_name(&self) -> Option<&'static str> {
            Some(self.status.as_ref()?.phase?.as_str())
        }
        fn ready(&self) -> Option<&str> {
            self.status.as_ref()?.ready.as_deref()
        }
        fn message(&self) -> Option<&str> {
            self.status.as_ref()?.message.as_deref()
        }
        fn trace_id(&self) -> Option<&str> {
            self.status.as_ref()?.trace_id.as_deref()
        }
        fn stable_image(&self) -> Option<&str> {
            self.status.as_ref()?.stable_image.as_deref()
        }
        fn canary_image(&self) -> Option<&str> {
            self.status.as_ref()?.canary_image.as_deref()
        }
        fn spec_image(&self) -> &str {
            &self.spec.image
        }
        fn source_revision(&self) -> Option<&str> {
            self.status.as_ref()?.source_revision.as_deref()
        }
        fn image_source(&self) -> Option<&str> {
            self.status.as_ref()?.image_source.as_deref()
        }
        fn phase_since(&self) -> Option<&Time> {
            self.status.as_ref()?.phase_since.as_ref()
        }
        fn conditions(&self) -> &[Condition] {
            self.status.as_ref().map_or(&[], |s| &s.conditions)
        }
        fn desired_replicas(&self) -> i32 {
            self.spec.replicas
        }
        fn canary_weight(&self) -> Option<i32> {
            self.status.as_ref()?.canary_weight
        }
        fn header_routed(&self) -> bool {
            self.status.as_ref().is_some_and(|s| s.header_routed)
        }
    };
}

impl RolloutView for CanaryStatefulSet {
    const KIND: &'static str = "CanaryStatefulSet";
    const SHORT_NAME: &'static str = "csts";

    same_in_both_kinds!();

    fn ready_replicas(&self) -> i32 {
        self.status.as_ref().map_or(0, |s| s.ready_replicas)
    }
    fn canary_ready_replicas(&self) -> Option<i32> {
        let s = self.status.as_ref()?;
        s.canary_image.as_ref().map(|_| s.canary_ready_replicas)
    }
    fn step(&self) -> Option<i32> {
        self.status.as_ref()?.current_step
    }
    fn batch(&self) -> Option<&str> {
        None
    }
    fn serving(&self) -> String {
        let Some(s) = self.status.as_ref() else {
            return String::new();
        };
        if !s.ready_by_image.is_empty() {
            // Stable's image first, then the others by name.
            let mut by_image: Vec<&super::ImageReplicas> = s.ready_by_image.iter().collect();
            by_image.sort_by_key(|r| {
                (
                    Some(r.image.as_str()) != s.stable_image.as_deref(),
                    &r.image,
                )
            });
            return by_image
                .iter()
                .map(|r| format!("{} on {}", r.replicas, r.image))
                .collect::<Vec<_>>()
                .join(", ");
        }
        let stable_ready = s.ready_replicas - s.canary_ready_replicas;
        let mut serving = vec![format!(
            "{stable_ready} on {}",
            s.stable_image.as_deref().unwrap_or("-")
        )];
        if let Some(canary) = s
            .canary_image
            .as_deref()
            .filter(|_| s.canary_ready_replicas > 0)
        {
            serving.push(format!("{} on {canary}", s.canary_ready_replicas));
        }
        serving.join(", ")
    }
}

impl RolloutView for CanaryDeployment {
    const KIND: &'static str = "CanaryDeployment";
    const SHORT_NAME: &'static str = "cdeploy";

    same_in_both_kinds!();

    fn ready_replicas(&self) -> i32 {
        self.status.as_ref().map_or(0, |s| s.available_replicas)
    }
    fn canary_ready_replicas(&self) -> Option<i32> {
        None
    }
    fn step(&self) -> Option<i32> {
        None
    }
    fn batch(&self) -> Option<&str> {
        self.status.as_ref()?.batch.as_deref()
    }
    fn serving(&self) -> String {
        let serving: Vec<String> = self
            .status
            .iter()
            .flat_map(|s| &s.available_by_image)
            .map(|r| format!("{} on {}", r.replicas, r.image))
            .collect();
        if serving.is_empty() {
            "none available".to_string()
        } else {
            serving.join(", ")
        }
    }
}
