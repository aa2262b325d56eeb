//! Traffic routing's I/O: reads a rollout's two Services, their EndpointSlices and its
//! HTTPRoutes and GRPCRoutes into a [`TrafficView`], and writes what the plan asks ([`apply_service`],
//! [`update_route`]). The decisions are in [`crate::plan::traffic`].

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::{Doing, ReconcileError};
use crate::api::ROLLOUT_LABEL;
use crate::api::VERSION_LABEL;
use crate::api::{
    CHILD_HASH_ANNOTATION, RouteKind, TRAFFIC_ANNOTATION, TrafficRouting, canary_service_name,
    stable_service_name,
};
use crate::plan::traffic::service_switch::pod_version;
use crate::plan::traffic::{RouteView, ServiceView, TrafficView};
use crate::sync::FIELD_MANAGER;

/// The label the EndpointSlice controller puts on each slice: its Service's name.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// `gateway.networking.k8s.io/v1` HTTPRoute or GRPCRoute.
pub fn route_resource(kind: RouteKind) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", kind.kind()),
        kind.plural(),
    )
}

/// Reads what [`crate::plan::traffic::traffic_step`] (with `routing`) and
/// [`crate::plan::traffic::service_switch`] (the user's Services in `switched`) decide from.
pub async fn observe_traffic(
    client: &Client,
    ns: &str,
    rollout: &str,
    routing: Option<&TrafficRouting>,
    with_baseline: bool,
    switched: &[String],
) -> Result<TrafficView, ReconcileError> {
    let mut names = Vec::new();
    if routing.is_some() {
        names.extend([stable_service_name(rollout), canary_service_name(rollout)]);
        // The baseline's Service too, for a CanaryDeployment with `strategy.baseline`.
        if with_baseline {
            names.push(crate::api::baseline_service_name(rollout));
        }
    }
    let services = Api::<Service>::namespaced(client.clone(), ns);
    let all: Vec<&String> = names.iter().chain(switched).collect();
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!(
            "{SERVICE_NAME_LABEL} in ({})",
            all.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(",")
        )))
        .await
        .doing(|| format!("listing the EndpointSlices of {ns}/{rollout}'s Services"))?;
    let mut view = TrafficView::default();
    for name in &names {
        let Some(svc) = services
            .get_metadata_opt(name)
            .await
            .doing(|| format!("reading Service {ns}/{name}"))?
        else {
            continue;
        };
        let (ready_endpoints, endpoint_versions) = endpoints(&slices.items, name, rollout);
        view.services.push(ServiceView {
            name: name.clone(),
            applied_hash: svc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CHILD_HASH_ANNOTATION).cloned()),
            ready_endpoints,
            endpoint_versions,
            ..ServiceView::default()
        });
    }
    for name in switched {
        if let Some(view_of) = switched_view(&services, &slices.items, name, rollout).await? {
            view.services.push(view_of);
        }
    }
    for (kind, name) in routing.into_iter().flat_map(|r| r.gateway_api.routes()) {
        let routes =
            Api::<DynamicObject>::namespaced_with(client.clone(), ns, &route_resource(kind));
        match routes.get_opt(name).await {
            Ok(Some(route)) => view.routes.push(route_view(kind, &route)),
            Ok(None) => {}
            // No Gateway API in the cluster: the plan says the route is not found.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => Err(e).doing(|| format!("reading {} {ns}/{name}", kind.kind()))?,
        }
    }
    Ok(view)
}

/// A Service of the user's that a blue-green rollout switches, as the planner reads it.
async fn switched_view(
    services: &Api<Service>,
    slices: &[EndpointSlice],
    name: &str,
    rollout: &str,
) -> Result<Option<ServiceView>, ReconcileError> {
    let ns = services.namespace().unwrap_or_default().to_string();
    let Some(svc) = services
        .get_opt(name)
        .await
        .doing(|| format!("reading Service {ns}/{name}"))?
    else {
        return Ok(None);
    };
    let (ready_endpoints, endpoint_versions) = endpoints(slices, name, rollout);
    let selector = svc.spec.as_ref().and_then(|s| s.selector.as_ref());
    let labels = svc.metadata.labels.as_ref();
    Ok(Some(ServiceView {
        name: name.to_string(),
        ready_endpoints,
        endpoint_versions,
        selector_version: selector.and_then(|s| s.get(VERSION_LABEL).cloned()),
        selector: selector.cloned(),
        switched_by: svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TRAFFIC_ANNOTATION).cloned()),
        labelled: labels
            .and_then(|l| l.get(ROLLOUT_LABEL))
            .is_some_and(|r| r == rollout),
        ..ServiceView::default()
    }))
}

/// Service `name`'s ready endpoints in `slices`: how many, and how many of each version of
/// `rollout`'s pods (by their name).
fn endpoints(
    slices: &[EndpointSlice],
    name: &str,
    rollout: &str,
) -> (i32, std::collections::BTreeMap<String, i32>) {
    let mut versions = std::collections::BTreeMap::new();
    let ready = slices
        .iter()
        .filter(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .is_some_and(|n| n == name)
        })
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false));
    let mut count = 0;
    for e in ready {
        let n = e.addresses.len() as i32;
        count += n;
        let pod = e
            .target_ref
            .as_ref()
            .and_then(|r| r.name.as_deref())
            .unwrap_or("");
        *versions
            .entry(pod_version(rollout, pod).to_string())
            .or_insert(0) += n;
    }
    (count, versions)
}

/// Points a Service of the user's at `version` by its selector (JSON merge patch: the rest of
/// the selector and the Service stay the user's), labelled with the rollout so that its
/// EndpointSlices wake it; with no version, takes both out again.
pub async fn switch_service(
    client: &Client,
    ns: &str,
    (rollout, name): (&str, &str),
    version: Option<&str>,
    owner: &str,
    what: &impl Fn() -> String,
) -> Result<(), ReconcileError> {
    let patch = json!({
        "metadata": {
            "labels": {ROLLOUT_LABEL: version.map(|_| rollout)},
            "annotations": {TRAFFIC_ANNOTATION: version.map(|_| owner)},
        },
        "spec": {"selector": {VERSION_LABEL: version}},
    });
    let services = Api::<Service>::namespaced(client.clone(), ns);
    merge_as_traffic(&services, name, patch, what).await
}

/// A JSON merge patch of `name` by traffic routing's own field manager (the sync's drift
/// check leaves the fields it owns alone).
async fn merge_as_traffic<K>(
    api: &Api<K>,
    name: &str,
    patch: Value,
    what: &impl Fn() -> String,
) -> Result<(), ReconcileError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &crate::kube_client::patch_as(crate::api::field_managers::TRAFFIC),
        &Patch::Merge(patch),
    )
    .await
    .map(|_| ())
    .doing(what)
}

/// An HTTPRoute or GRPCRoute as the planner reads it: its rules, and the oldest generation its
/// parents (Gateways) have accepted.
pub fn route_view(kind: RouteKind, route: &DynamicObject) -> RouteView {
    let parents = route
        .data
        .pointer("/status/parents")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    // Only the parents the route names now: an entry a removed or renamed Gateway left
    // behind would otherwise hold every change for good.
    let named: Vec<&str> = route
        .data
        .pointer("/spec/parentRefs")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(|r| r.get("name").and_then(Value::as_str))
        .collect();
    let accepted = parents
        .iter()
        .filter(|p| {
            named.is_empty()
                || p.pointer("/parentRef/name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| named.contains(&n))
        })
        .map(|p| {
            p.get("conditions")
                .and_then(Value::as_array)
                .and_then(|cs| {
                    cs.iter().find(|c| {
                        c.get("type").and_then(Value::as_str) == Some("Accepted")
                            && c.get("status").and_then(Value::as_str) == Some("True")
                    })
                })
                .and_then(|c| c.get("observedGeneration").and_then(Value::as_i64))
        })
        .collect::<Option<Vec<i64>>>()
        .and_then(|gens| gens.into_iter().min());
    RouteView {
        kind,
        name: route.metadata.name.clone().unwrap_or_default(),
        rules: route
            .data
            .pointer("/spec/rules")
            .cloned()
            .unwrap_or_else(|| json!([])),
        generation: route.metadata.generation.unwrap_or(0),
        accepted_generation: accepted,
        resource_version: route.metadata.resource_version.clone(),
    }
}

/// Applies one of the rollout's Services, unless a Service of that name is someone else's.
pub async fn apply_service(
    client: &Client,
    ns: &str,
    service: &Service,
    what: &impl Fn() -> String,
) -> Result<(), ReconcileError> {
    let name = service.metadata.name.clone().unwrap_or_default();
    let services = Api::<Service>::namespaced(client.clone(), ns);
    let live = services.get_metadata_opt(&name).await.doing(what)?;
    if let Some(why) = super::foreign_child(live.as_ref().map(|l| &l.metadata), &service.metadata) {
        return Err(ReconcileError::NotOurs { doing: what(), why });
    }
    services
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(service),
        )
        .await
        .map(|_| ())
        .doing(what)
}

/// Writes what a plan asks of a route or a switched Service ([`update_route`],
/// [`switch_service`]).
pub async fn write_route(
    client: &Client,
    ns: &str,
    rollout: &str,
    action: &crate::plan::Action,
    what: &impl Fn() -> String,
) -> Result<(), ReconcileError> {
    use crate::plan::Action;
    match action {
        Action::UpdateRoute {
            kind,
            name,
            rules,
            resource_version,
            owner,
        } => {
            let version = resource_version.as_deref();
            update_route(client, ns, (*kind, name), rules, version, owner, what).await
        }
        Action::SwitchService {
            name,
            version,
            owner,
        } => switch_service(client, ns, (rollout, name), version.as_deref(), owner, what).await,
        _ => Ok(()),
    }
}

/// Replaces a route's rules; with `resource_version`, only if nobody changed it since it was
/// read (a conflict is retried from a fresh read).
pub async fn update_route(
    client: &Client,
    ns: &str,
    (kind, name): (RouteKind, &str),
    rules: &Value,
    resource_version: Option<&str>,
    owner: &str,
    what: &impl Fn() -> String,
) -> Result<(), ReconcileError> {
    let routes = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &route_resource(kind));
    let mut patch = json!({
        "metadata": {"annotations": {TRAFFIC_ANNOTATION: owner}},
        "spec": {"rules": rules},
    });
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = json!(rv);
    }
    merge_as_traffic(&routes, name, patch, what).await
}

/// The route watches' backoff: as every watch's, but up to a minute, since it also waits
/// for a Gateway API that is not installed yet.
fn route_watch_backoff() -> kube::runtime::watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(crate::watch::backoff::WATCH_BACKOFF_MIN)
        .with_max_delay(std::time::Duration::from_secs(60))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// Says in the log when the cluster does not serve HTTPRoutes (the Gateway API CRDs are not
/// installed): rollouts with traffic routing then wait for their routes.
pub async fn say_if_routes_are_not_served(client: &Client) {
    match client
        .list_api_group_resources("gateway.networking.k8s.io/v1")
        .await
    {
        Ok(list) if list.resources.iter().any(|r| r.name == "httproutes") => {
            if !list.resources.iter().any(|r| r.name == "grpcroutes") {
                tracing::info!(
                    "the cluster serves HTTPRoutes but no gateway.networking.k8s.io/v1 GRPCRoutes (a Gateway API before v1.1); rollouts with trafficRouting.gatewayAPI.grpcRoutes wait for them"
                );
            }
        }
        Ok(_) | Err(kube::Error::Api(_)) => tracing::info!(
            "no Gateway API (gateway.networking.k8s.io/v1 HTTPRoutes) in the cluster yet; rollouts with trafficRouting wait for their HTTPRoutes, and the agent looks again at most a minute apart"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            "cannot tell whether the cluster serves HTTPRoutes; the agent looks again at most a minute apart"
        ),
    }
}

/// Reconciles of rollouts with traffic routing that their Services' EndpointSlices (which
/// carry the rollout's label, copied from the Service) and their HTTPRoutes and GRPCRoutes
/// (edited by hand, or accepted by the gateway) ask for. Only rollouts in `store` (this
/// agent's) are woken.
pub fn traffic_wakes<K>(
    client: Client,
    scope: &crate::watch::WatchScope,
    store: kube::runtime::reflector::Store<K>,
    routing: fn(&K) -> Option<&TrafficRouting>,
) -> impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<K>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    use futures::StreamExt;
    use kube::core::PartialObjectMeta;
    use kube::runtime::reflector::ObjectRef;
    use kube::runtime::{WatchStreamExt, watcher};

    let ours = store.clone();
    let slices = watcher(
        scope.api::<PartialObjectMeta<EndpointSlice>>(&client),
        crate::watch::watch_config(crate::api::ROLLOUT_LABEL),
    )
    .backoff(crate::watch::backoff::watch_backoff())
    .touched_objects()
    .filter_map(move |slice| {
        let woken = slice.ok().and_then(|s| {
            let rollout = s.metadata.labels.as_ref()?.get(crate::api::ROLLOUT_LABEL)?;
            let r = ObjectRef::<K>::new(rollout).within(s.metadata.namespace.as_deref()?);
            ours.get(&r).is_some().then_some(r)
        });
        std::future::ready(woken)
    })
    .boxed();
    let routes = futures::stream::select(
        route_wakes(&client, scope, RouteKind::Http, store.clone(), routing),
        route_wakes(&client, scope, RouteKind::Grpc, store, routing),
    );
    futures::stream::select(slices, routes).boxed()
}

/// Reconciles of the rollouts in `store` that name a route of `kind` that changed.
fn route_wakes<K>(
    client: &Client,
    scope: &crate::watch::WatchScope,
    kind: RouteKind,
    store: kube::runtime::reflector::Store<K>,
    routing: fn(&K) -> Option<&TrafficRouting>,
) -> impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<K>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    use futures::StreamExt;
    use kube::core::PartialObjectMeta;
    use kube::runtime::reflector::ObjectRef;
    use kube::runtime::{WatchStreamExt, watcher};

    // Watched whether or not the cluster serves the kind now: a Gateway API installed after
    // the agent started is picked up at the next retry (at most a minute apart, so a cluster
    // without it costs one cheap 404 a minute).
    crate::watch::backoff::hold_init(watcher(
        scope.api_with::<PartialObjectMeta<DynamicObject>>(client, &route_resource(kind)),
        kube::runtime::watcher::Config::default(),
    ))
    .backoff(route_watch_backoff())
    .touched_objects()
    .flat_map(move |route| {
        let woken: Vec<ObjectRef<K>> = match route {
            Ok(route) => {
                let (ns, name) = (route.metadata.namespace, route.metadata.name);
                store
                    .state()
                    .iter()
                    .filter(|k| k.meta().namespace == ns)
                    .filter(|k| {
                        routing(k).is_some_and(|r| {
                            r.gateway_api
                                .routes()
                                .any(|(of, n)| of == kind && Some(n) == name.as_ref())
                        })
                    })
                    .map(|k| ObjectRef::from_obj(k.as_ref()))
                    .collect()
            }
            Err(_) => Vec::new(),
        };
        futures::stream::iter(woken)
    })
}
