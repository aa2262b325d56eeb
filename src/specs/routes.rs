//! Offline checks of `trafficRouting`: every HTTPRoute a rollout names that is in the
//! repository must have a rule whose only backend is the rollout's stable Service; a route
//! name absent from a namespace whose routes are in the repository is a typo. A namespace
//! with no HTTPRoute in the repository keeps its routes elsewhere: the agent checks those
//! against the cluster. A rollout that fails blocks its file, as a broken analysis does.

use std::collections::BTreeMap;

use super::{SpecError, SpecSet};
use crate::api::{
    CanaryDeployment, CanaryStatefulSet, TrafficRouting, canary_service_name, stable_service_name,
};
use crate::plan::traffic::route_rules;

impl SpecSet {
    pub(super) fn block_broken_routes(&mut self) {
        // The routes in the repository, by namespace and name: their rules.
        let mut routes: BTreeMap<String, BTreeMap<String, serde_json::Value>> = BTreeMap::new();
        for o in self.objects.values().filter(|o| o.key.kind == "HTTPRoute") {
            let rules = o
                .spec
                .to_json()
                .pointer("/spec/rules")
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            routes
                .entry(o.key.namespace.clone())
                .or_default()
                .insert(o.key.name.clone(), rules);
        }
        let mut broken: Vec<SpecError> = Vec::new();
        for object in self.objects.values() {
            // Most rollouts have no traffic routing; they go unparsed.
            if !object.spec.to_json_text_contains("\"trafficRouting\"") {
                continue;
            }
            let routing: Option<TrafficRouting> = match object.key.kind.as_str() {
                "CanaryStatefulSet" => object
                    .spec
                    .typed::<CanaryStatefulSet>()
                    .and_then(|o| o.spec.traffic_routing.map(|t| *t)),
                "CanaryDeployment" => object
                    .spec
                    .typed::<CanaryDeployment>()
                    .and_then(|o| o.spec.traffic_routing.map(|t| *t)),
                _ => None,
            };
            let Some(routing) = routing else { continue };
            let Some(in_repo) = routes.get(&object.key.namespace) else {
                continue;
            };
            let (stable, canary) = (
                stable_service_name(&object.key.name),
                canary_service_name(&object.key.name),
            );
            for name in &routing.gateway_api.http_routes {
                let problem = match in_repo.get(name) {
                    None => Some(format!(
                        "HTTPRoute {name} is not in the repository in namespace {} (its routes \
                         there are {}); fix the name in spec.trafficRouting.gatewayAPI.httpRoutes",
                        object.key.namespace,
                        in_repo.keys().cloned().collect::<Vec<_>>().join(", ")
                    )),
                    Some(rules) => {
                        route_rules(rules, &stable, &canary, routing.gateway_api.port, 0, None)
                            .err()
                            .map(|e| format!("HTTPRoute {name}: {e}"))
                    }
                };
                if let Some(message) = problem {
                    broken.push(SpecError {
                        location: object.location.clone(),
                        message: format!("{}: spec.trafficRouting: {message}", object.key),
                    });
                }
            }
        }
        self.block_files(broken);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::specs::SpecSet;
    use crate::specs::load::{LoadOptions, load_file};

    const WEB: &str = "\
apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryDeployment
metadata: {name: web, namespace: demo}
spec:
  replicas: 4
  image: web:1
  strategy: {type: Batches}
  batches: 2
  trafficRouting:
    gatewayAPI: {httpRoutes: [ROUTE], port: 8080}
  template:
    selector: {matchLabels: {app: web}}
    template:
      metadata: {labels: {app: web}}
      spec: {containers: [{name: web, image: web:1}]}
";

    fn route(backend: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: web, namespace: demo}}\n\
             spec:\n  parentRefs: [{{name: gw}}]\n  rules:\n  - backendRefs: [{{name: {backend}, port: 8080}}]\n"
        )
    }

    fn set(rollout_route: &str, route_file: Option<String>) -> SpecSet {
        let mut files = BTreeMap::new();
        let rollout = WEB.replace("ROUTE", rollout_route);
        files.insert(
            "apps/web.yaml".to_string(),
            load_file("apps/web.yaml", rollout.as_bytes(), &LoadOptions::default()),
        );
        if let Some(text) = route_file {
            files.insert(
                "apps/route.yaml".to_string(),
                load_file("apps/route.yaml", text.as_bytes(), &LoadOptions::default()),
            );
        }
        SpecSet::from_files(files)
    }

    #[test]
    fn a_route_in_the_repository_that_sends_to_the_stable_service_passes() {
        let s = set("web", Some(route("web-stable")));
        assert!(s.errors.is_empty(), "{:?}", s.errors);
    }

    #[test]
    fn a_mistyped_route_name_and_a_route_without_the_stable_service_block_the_rollout() {
        let s = set("wbe", Some(route("web-stable")));
        assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
        assert!(
            s.errors[0]
                .message
                .contains("HTTPRoute wbe is not in the repository"),
            "{}",
            s.errors[0].message
        );
        assert_eq!(&*s.errors[0].location.file, "apps/web.yaml");
        let s = set("web", Some(route("web")));
        assert!(
            s.errors[0]
                .message
                .contains("no rule sends traffic to Service web-stable"),
            "{}",
            s.errors[0].message
        );
    }

    #[test]
    fn routes_kept_elsewhere_are_left_to_the_agent() {
        let s = set("web", None);
        assert!(s.errors.is_empty(), "{:?}", s.errors);
    }
}
