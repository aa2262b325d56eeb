//! Fencing: a replica writes to the cluster only while its Lease is surely still its own.
//!
//! The Lease manager renews the Lease `grace` before it expires. When renewals hang (etcd
//! frozen, the API server unreachable), the replica used to go on acting until it saw another
//! holder: in 3 of 3 runs with etcd frozen for 20 s the old leader sent a write 16 s after its
//! Lease had expired. The fence sits in the client: every successful write to the Lease
//! (a renewal) keeps writes open for the Lease's duration less half the grace, counted from
//! when the renewal was sent; past that, every other write is refused in the client, unsent,
//! until a renewal succeeds again. Reads go on. The fence is armed by the first successful
//! renewal: a replica that never held the Lease (or runs without leader election) is not
//! fenced. With `--shards`, writes to the shard Leases are fenced by the main Lease on the
//! replica that holds it; the other replicas' shard work is not fenced yet.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a request is to the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A write to the fenced Lease: how it is held.
    LeaseWrite,
    /// Any other write.
    Write,
    /// A read, or a review that writes nothing (access and token reviews).
    Read,
}

/// A write refused by the fence.
#[derive(Debug, thiserror::Error)]
#[error(
    "not written: this replica's Lease {lease} has not been renewed for {since:?} (renew deadline \
     {deadline:?}); writes resume when it is, or another replica takes over"
)]
pub struct Fenced {
    pub lease: String,
    pub since: Duration,
    pub deadline: Duration,
}

/// One Lease's fence.
#[derive(Debug)]
pub struct Fence {
    lease: String,
    lease_path: String,
    /// How long after a renewal was sent writes stay open.
    deadline: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When the last successful renewal was sent; `None`: not armed.
    renewed: Option<Instant>,
    /// Whether the log has said that writes stopped.
    said_closed: bool,
}

impl Fence {
    /// The fence of Lease `namespace/name`, held for `duration` and renewed `grace` before it
    /// runs out.
    pub fn new(namespace: &str, name: &str, duration: Duration, grace: Duration) -> Fence {
        Fence {
            lease: format!("{namespace}/{name}"),
            lease_path: format!(
                "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
            ),
            deadline: duration.saturating_sub(grace / 2),
            state: Mutex::new(State::default()),
        }
    }

    /// How the fence sees a request of `method` to `path`.
    pub fn kind(&self, method: &http::Method, path: &str) -> Kind {
        if matches!(
            *method,
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        ) {
            return Kind::Read;
        }
        if path == self.lease_path {
            return Kind::LeaseWrite;
        }
        // A Lease is created with a POST to the collection, named only in the body: never
        // held back, and no renewal (it may be a shard's); the first renewal arms the fence.
        if *method == http::Method::POST
            && path == self.lease_path.rsplit_once('/').map_or("", |(c, _)| c)
        {
            return Kind::Read;
        }
        if path.starts_with("/apis/authorization.k8s.io/")
            || path.starts_with("/apis/authentication.k8s.io/")
        {
            return Kind::Read;
        }
        Kind::Write
    }

    /// Whether a write may be sent at `now`.
    pub fn allows(&self, now: Instant) -> Result<(), Fenced> {
        let Ok(mut state) = self.state.lock() else {
            return Ok(());
        };
        let Some(renewed) = state.renewed else {
            return Ok(());
        };
        let since = now.saturating_duration_since(renewed);
        if since <= self.deadline {
            return Ok(());
        }
        if !state.said_closed {
            state.said_closed = true;
            tracing::warn!(lease = %self.lease, not_renewed_for = ?since, deadline = ?self.deadline, "the lease was not renewed in time: no writes until it is");
        }
        Err(Fenced {
            lease: self.lease.clone(),
            since,
            deadline: self.deadline,
        })
    }

    /// A write to the Lease sent at `sent` succeeded.
    pub fn renewed(&self, sent: Instant) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if state.said_closed {
            tracing::info!(lease = %self.lease, "the lease is renewed: writes resume");
            state.said_closed = false;
        }
        state.renewed = Some(state.renewed.map_or(sent, |r| r.max(sent)));
    }
}

/// The fence as a layer of the client's stack.
#[derive(Clone)]
pub struct FenceLayer(pub std::sync::Arc<Fence>);

impl<S> tower::Layer<S> for FenceLayer {
    type Service = FenceService<S>;
    fn layer(&self, inner: S) -> FenceService<S> {
        FenceService {
            inner,
            fence: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct FenceService<S> {
    inner: S,
    fence: std::sync::Arc<Fence>,
}

impl<S, B, R> tower::Service<http::Request<B>> for FenceService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = tower::BoxError;
    type Future = futures::future::BoxFuture<'static, Result<http::Response<R>, tower::BoxError>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let kind = self.fence.kind(request.method(), request.uri().path());
        let sent = Instant::now();
        if kind == Kind::Write
            && let Err(fenced) = self.fence.allows(sent)
        {
            return Box::pin(std::future::ready(Err(fenced.into())));
        }
        let answer = self.inner.call(request);
        let fence = self.fence.clone();
        Box::pin(async move {
            let response = answer.await.map_err(Into::into)?;
            if kind == Kind::LeaseWrite && response.status().is_success() {
                fence.renewed(sent);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn fence() -> Fence {
        Fence::new(
            "linnet-system",
            "linnet",
            Duration::from_secs(15),
            Duration::from_secs(5),
        )
    }

    #[test]
    fn writes_stop_at_the_renew_deadline_and_resume_with_a_renewal() {
        let f = fence();
        let t0 = Instant::now();
        assert!(
            f.allows(t0 + Duration::from_secs(3600)).is_ok(),
            "not armed"
        );
        f.renewed(t0);
        assert!(f.allows(t0 + Duration::from_millis(12_500)).is_ok());
        let e = f.allows(t0 + Duration::from_millis(12_600)).unwrap_err();
        assert_eq!(e.deadline, Duration::from_millis(12_500));
        assert!(e.to_string().contains("linnet-system/linnet"), "{e}");
        // A renewal sent earlier that answers late does not move the fence back.
        f.renewed(t0 + Duration::from_secs(20));
        f.renewed(t0 + Duration::from_secs(10));
        assert!(f.allows(t0 + Duration::from_secs(32)).is_ok());
        assert!(f.allows(t0 + Duration::from_secs(33)).is_err());
    }

    #[test]
    fn only_writes_to_the_lease_renew_it_and_reads_and_reviews_pass() {
        let f = fence();
        let lease = "/apis/coordination.k8s.io/v1/namespaces/linnet-system/leases/linnet";
        assert_eq!(f.kind(&Method::PATCH, lease), Kind::LeaseWrite);
        assert_eq!(f.kind(&Method::PUT, lease), Kind::LeaseWrite);
        // A create names its Lease in the body only (it may be a shard's): let through.
        assert_eq!(
            f.kind(
                &Method::POST,
                "/apis/coordination.k8s.io/v1/namespaces/linnet-system/leases"
            ),
            Kind::Read
        );
        assert_eq!(f.kind(&Method::GET, lease), Kind::Read);
        assert_eq!(
            f.kind(
                &Method::PATCH,
                "/apis/coordination.k8s.io/v1/namespaces/linnet-system/leases/linnet-shard-1"
            ),
            Kind::Write
        );
        assert_eq!(
            f.kind(
                &Method::PATCH,
                "/apis/apps/v1/namespaces/shop/statefulsets/redis"
            ),
            Kind::Write
        );
        assert_eq!(
            f.kind(&Method::DELETE, "/api/v1/namespaces/shop/pods/redis-0"),
            Kind::Write
        );
        assert_eq!(
            f.kind(
                &Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
            ),
            Kind::Read
        );
    }
}
