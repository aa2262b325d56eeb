//! The rollout `linnet get` reads, either kind, and what every output takes from it: kind,
//! name, and the object as JSON.

use kube::ResourceExt;

use crate::api::{CanaryDeployment, CanaryStatefulSet};

/// The rollout, either kind.
#[derive(Clone, Debug)]
pub enum RolloutObject {
    StatefulSet(Box<CanaryStatefulSet>),
    Deployment(Box<CanaryDeployment>),
}

impl RolloutObject {
    /// Its kind, as events name it.
    pub fn kind(&self) -> &'static str {
        match self {
            RolloutObject::StatefulSet(_) => "CanaryStatefulSet",
            RolloutObject::Deployment(_) => "CanaryDeployment",
        }
    }

    /// The object as JSON, with its apiVersion and kind, as `kubectl get -o json` shows it.
    pub fn to_json(&self) -> crate::Result<serde_json::Value> {
        let value = match self {
            RolloutObject::StatefulSet(r) => serde_json::to_value(r),
            RolloutObject::Deployment(r) => serde_json::to_value(r),
        };
        let mut value = value?;
        if let Some(object) = value.as_object_mut() {
            object.insert("apiVersion".into(), crate::api::API_VERSION.into());
            object.insert("kind".into(), self.kind().into());
        }
        Ok(value)
    }

    /// Its name.
    pub fn name(&self) -> String {
        match self {
            RolloutObject::StatefulSet(r) => r.name_any(),
            RolloutObject::Deployment(r) => r.name_any(),
        }
    }
}
