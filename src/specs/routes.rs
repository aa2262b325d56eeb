//! Offline checks of `trafficRouting`: every HTTPRoute and GRPCRoute a rollout names that is
//! in the repository must have a rule whose only backend is the rollout's stable Service; a
//! route name absent from a namespace whose routes of that kind are in the repository is a
//! typo. A namespace with no route of a kind in the repository keeps those routes elsewhere:
//! the agent checks them against the cluster. A rollout that fails blocks its file, as a broken analysis does.

use std::collections::BTreeMap;

use super::{SpecError, SpecSet};
use crate::api::{
    CanaryDeployment, CanaryStatefulSet, RouteKind, TrafficRouting, canary_service_name,
    stable_service_name,
};
use crate::plan::traffic::route_rules;

impl SpecSet {
    pub(super) fn block_broken_routes(&mut self) {
        // The routes in the repository, by namespace and kind, then name: their rules.
        type Rules = BTreeMap<String, serde_json::Value>;
        let mut routes: BTreeMap<(String, RouteKind), Rules> = BTreeMap::new();
        for o in self.objects.values() {
            let kind = match o.key.kind.as_str() {
                "HTTPRoute" => RouteKind::Http,
                "GRPCRoute" => RouteKind::Grpc,
                _ => continue,
            };
            let rules = o
                .spec
                .to_json()
                .pointer("/spec/rules")
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            routes
                .entry((o.key.namespace.clone(), kind))
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
            let (stable, canary) = (
                stable_service_name(&object.key.name),
                canary_service_name(&object.key.name),
            );
            for (kind, name) in routing.gateway_api.routes() {
                let Some(in_repo) = routes.get(&(object.key.namespace.clone(), kind)) else {
                    continue;
                };
                let sides = (stable.as_str(), canary.as_str());
                let problem = match in_repo.get(name) {
                    None => Some(format!(
                        "{} {name} is not in the repository in namespace {} (its {}s there are \
                         {}); fix the name in spec.trafficRouting.gatewayAPI.{}",
                        kind.kind(),
                        object.key.namespace,
                        kind.kind(),
                        in_repo.keys().cloned().collect::<Vec<_>>().join(", "),
                        kind.field(),
                    )),
                    Some(rules) => {
                        route_rules(rules, kind, sides, routing.gateway_api.port, 0, None)
                            .err()
                            .map(|e| format!("{} {name}: {e}", kind.kind()))
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

    #[test]
    fn a_grpc_route_is_checked_against_the_grpc_routes_in_the_repository() {
        let grpc_route =
            |backend: &str| route(backend).replace("kind: HTTPRoute", "kind: GRPCRoute");
        let rollout = |routes: &str| {
            let text = WEB.replace("httpRoutes: [ROUTE]", routes);
            load_file("apps/web.yaml", text.as_bytes(), &LoadOptions::default())
        };
        let with = |routes: &str, route_file: String| {
            let mut files = BTreeMap::new();
            files.insert("apps/web.yaml".to_string(), rollout(routes));
            files.insert(
                "apps/route.yaml".to_string(),
                load_file(
                    "apps/route.yaml",
                    route_file.as_bytes(),
                    &LoadOptions::default(),
                ),
            );
            SpecSet::from_files(files)
        };
        let s = with("grpcRoutes: [web]", grpc_route("web-stable"));
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        let s = with("grpcRoutes: [wbe]", grpc_route("web-stable"));
        assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
        let m = &s.errors[0].message;
        assert!(m.contains("GRPCRoute wbe is not in the repository"), "{m}");
        assert!(m.contains("gatewayAPI.grpcRoutes"), "{m}");
        let s = with("grpcRoutes: [web]", grpc_route("web"));
        let m = &s.errors[0].message;
        assert!(m.contains("GRPCRoute web: no rule sends traffic"), "{m}");
        // An HTTPRoute of the name does not stand in for the GRPCRoute, nor the other way.
        let s = with("grpcRoutes: [web], httpRoutes: [web]", route("web-stable"));
        assert!(
            s.errors.is_empty(),
            "the GRPCRoutes are kept elsewhere: {:?}",
            s.errors
        );
    }
}
