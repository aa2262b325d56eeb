//! The `Host` names the listeners for the cluster's own tools (`/metrics`, `/status`, the
//! dashboard) answer to: an IP address, `localhost`, or a name given with
//! `--allowed-host-name`. A page on another site that rebinds its own DNS name to the
//! agent's address (through a port-forward or a node port) sends that name, and is refused,
//! so it cannot read the rollouts, the status or the live event stream (issue 70).

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The names besides IP addresses and `localhost` a listener answers to.
#[derive(Clone, Debug, Default)]
pub struct HostNames {
    names: Arc<Vec<String>>,
}

impl HostNames {
    /// `names` (any case, a trailing dot or not).
    pub fn new(names: impl IntoIterator<Item = String>) -> HostNames {
        HostNames {
            names: Arc::new(names.into_iter().map(|n| canonical(&n)).collect()),
        }
    }

    /// Whether a request whose `Host` header is `host` may be answered. A request without
    /// one (HTTP/1.0) is: a browser always sends it.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let Some(host) = host else {
            return true;
        };
        // A Host is a name and a port: user information has no place in it.
        let Ok(authority) = host.parse::<axum::http::uri::Authority>() else {
            return false;
        };
        if authority.as_str().contains('@') {
            return false;
        }
        let name = authority.host();
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<std::net::IpAddr>().is_ok() {
            return true;
        }
        let name = canonical(name);
        name == "localhost" || self.names.contains(&name)
    }

    /// `router`, answering only requests whose `Host` this allows; the others get `403`
    /// saying what to set.
    pub fn guard(&self, router: Router) -> Router {
        let names = self.clone();
        router.layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let names = names.clone();
                async move { names.check(req, next).await }
            },
        ))
    }

    async fn check(self, req: Request, next: Next) -> Response {
        let host = req
            .headers()
            .get(axum::http::header::HOST)
            .map(|h| h.to_str().unwrap_or("\u{fffd}").to_string());
        if self.allows(host.as_deref()) {
            return next.run(req).await;
        }
        let host = crate::text::one_line(host.as_deref().unwrap_or_default(), 100);
        tracing::debug!(%host, "refused a request for a host name this listener is not served under");
        (
            StatusCode::FORBIDDEN,
            format!(
                "this listener answers to IP addresses, localhost and the names given with \
                 --allowed-host-name, not to {host:?}\n"
            ),
        )
            .into_response()
    }
}

fn canonical(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_localhost_and_named_hosts_are_answered() {
        // Issue 70: a page on evil.example rebinding its name to the agent read /status.
        let names = HostNames::new(["Linnet.Example.com.".to_string()]);
        for allowed in [
            "127.0.0.1:9090",
            "10.0.0.7",
            "[::1]:8090",
            "localhost:9090",
            "LOCALHOST",
            "linnet.example.com",
            "linnet.example.com.:443",
        ] {
            assert!(names.allows(Some(allowed)), "{allowed}");
        }
        for refused in [
            "evil.example",
            "evil.example:9090",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "linnet.example.com.evil.example",
            "user@localhost",
            "",
            "a b",
        ] {
            assert!(!names.allows(Some(refused)), "{refused}");
        }
        assert!(names.allows(None), "HTTP/1.0, no Host: not a browser");
    }
}
