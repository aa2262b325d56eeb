//! The agent's Kubernetes client against the real API server: it authenticates as linnet's
//! identity and multiplexes requests in flight over one HTTP/2 connection. (Its own test
//! binary, so the socket count is this process's alone.)

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Service;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Config};

mod support;

/// The inodes of this process's open sockets.
fn open_sockets() -> BTreeSet<String> {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| target.starts_with("socket:"))
        .collect()
}

/// Once a connection is up, requests in flight share it. (Requests sent before the first
/// connection has negotiated HTTP/2 may open their own: the protocol is chosen by ALPN, as
/// client-go chooses it, so the pool cannot know in advance that one will do.)
#[tokio::test]
async fn fifty_requests_in_flight_share_one_connection() {
    support::install_linnet(&support::admin_client().await).await;
    let path = support::linnet_kubeconfig();
    let kubeconfig = Kubeconfig::read_from(&path).expect("linnet's kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a config from linnet's kubeconfig");
    let client = linnet::kube_client::from_config(config).expect("build the agent's client");
    // linnet's ClusterRole lets it read Services.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let before = open_sockets();
    services
        .get("kubernetes")
        .await
        .expect("read Service default/kubernetes as linnet");
    let connected = open_sockets();
    assert_eq!(
        connected.difference(&before).count(),
        1,
        "the first request opens one connection"
    );

    let reads = join_all((0..50).map(|_| {
        let services = services.clone();
        async move { services.get("kubernetes").await }
    }))
    .await;
    for read in reads {
        let service = read.expect("read Service default/kubernetes as linnet");
        assert_eq!(service.metadata.name.as_deref(), Some("kubernetes"));
    }

    let opened: Vec<String> = open_sockets().difference(&connected).cloned().collect();
    assert!(
        opened.is_empty(),
        "HTTP/1.1 would open a connection per request in flight; opened {opened:?}"
    );
}
