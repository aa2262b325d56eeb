//! A CanaryDeployment's Deployments, down to what its planner reads.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ResourceRequirements;

use super::normalized_selector;
use crate::api::CHILD_HASH_ANNOTATION;

/// A Deployment of the rollout, as the planner needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeploymentView {
    pub name: String,
    pub replicas: i32,
    pub image: Option<String>,
    pub resources: Option<ResourceRequirements>,
    pub available: i32,
    pub updated: i32,
    /// `status.replicas`: pods of every revision.
    pub pods: i32,
    pub status_fresh: bool,
    pub applied_hash: Option<String>,
    /// `spec.selector`, normalized; the API server never lets it change.
    pub selector: Option<serde_json::Value>,
}

/// A Deployment as the controller's store keeps it: only what [`DeploymentView`] reads,
/// deserialized straight from the watch (serde skips the rest), as [`super::StoredSet`] does
/// for sets. The controller reads a rollout's Deployments from this store, not with a list
/// per reconcile.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredDeployment {
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(default)]
    pub spec: StoredDeploymentSpec,
    #[serde(default)]
    pub status: StoredDeploymentStatus,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredDeploymentSpec {
    pub replicas: Option<i32>,
    #[serde(default)]
    pub selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    #[serde(default)]
    pub template: StoredDeploymentTemplate,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredDeploymentTemplate {
    #[serde(default)]
    pub spec: StoredDeploymentPod,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredDeploymentPod {
    #[serde(default)]
    pub containers: Vec<StoredDeploymentContainer>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct StoredDeploymentContainer {
    pub name: String,
    pub image: Option<String>,
    pub resources: Option<ResourceRequirements>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredDeploymentStatus {
    pub observed_generation: Option<i64>,
    pub available_replicas: Option<i32>,
    pub updated_replicas: Option<i32>,
    pub replicas: Option<i32>,
}

impl k8s_openapi::Resource for StoredDeployment {
    const API_VERSION: &'static str = <Deployment as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Deployment as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Deployment as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Deployment as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Deployment as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for StoredDeployment {
    type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn metadata(&self) -> &Self::Ty {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut Self::Ty {
        &mut self.metadata
    }
}

impl DeploymentView {
    /// The view of a whole Deployment, as the store would keep it (the simulations apply
    /// whole Deployments).
    #[cfg(test)]
    pub(crate) fn from_object(d: &Deployment, container: Option<&str>) -> DeploymentView {
        let stored = serde_json::to_value(d)
            .and_then(serde_json::from_value::<StoredDeployment>)
            .unwrap_or_default();
        DeploymentView::from_stored(&stored, container)
    }

    /// Asked for at most `replicas`, and seen with at most that many pods not being deleted
    /// (`status.replicas` leaves out stopping pods, as `maxSurge` does).
    pub fn shrunk_to(&self, replicas: i32) -> bool {
        self.status_fresh && self.replicas <= replicas && self.pods <= replicas
    }

    /// Every replica runs the current template and is available.
    pub fn complete(&self, n: i32) -> bool {
        self.status_fresh && self.updated == n && self.available == n && self.pods == n
    }

    /// The planner's view of a Deployment, from the controller's store.
    pub fn from_stored(d: &StoredDeployment, container: Option<&str>) -> DeploymentView {
        let containers = &d.spec.template.spec.containers;
        let chosen = match container {
            Some(name) => containers.iter().find(|c| c.name == name),
            None => containers.first(),
        };
        let status = &d.status;
        DeploymentView {
            name: d.metadata.name.clone().unwrap_or_default(),
            replicas: d.spec.replicas.unwrap_or(1),
            image: chosen.and_then(|c| c.image.clone()),
            resources: chosen.and_then(|c| c.resources.clone()),
            available: status.available_replicas.unwrap_or(0),
            updated: status.updated_replicas.unwrap_or(0),
            pods: status.replicas.unwrap_or(0),
            status_fresh: status.observed_generation.is_some()
                && status.observed_generation == d.metadata.generation,
            applied_hash: d
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CHILD_HASH_ANNOTATION).cloned()),
            selector: normalized_selector(&d.spec.selector),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_deployment_reads_as_the_whole_object_does() {
        let object: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1a2b3c4d", "generation": 3,
                         "annotations": {CHILD_HASH_ANNOTATION: "h1"}},
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"spec": {"containers": [
                        {"name": "side", "image": "envoy:1"},
                        {"name": "app", "image": "web:2",
                         "resources": {"limits": {"cpu": "1"}}}]}}},
            "status": {"observedGeneration": 3, "availableReplicas": 3,
                       "updatedReplicas": 4, "replicas": 5}
        }))
        .unwrap_or_default();
        let stored: StoredDeployment =
            serde_json::from_value(serde_json::to_value(&object).unwrap_or_default())
                .unwrap_or_default();
        let view = DeploymentView::from_stored(&stored, Some("app"));
        assert_eq!(
            view,
            DeploymentView {
                name: "web-1a2b3c4d".into(),
                replicas: 4,
                image: Some("web:2".into()),
                resources: serde_json::from_value(serde_json::json!({"limits": {"cpu": "1"}})).ok(),
                available: 3,
                updated: 4,
                pods: 5,
                status_fresh: true,
                applied_hash: Some("h1".into()),
                selector: Some(serde_json::json!({"matchLabels": {"app": "web"}})),
            }
        );
        assert_eq!(
            DeploymentView::from_stored(&stored, None).image.as_deref(),
            Some("envoy:1"),
            "without a container name, the first"
        );
    }
}
