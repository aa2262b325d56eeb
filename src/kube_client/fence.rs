//! Fencing: a replica writes to the cluster only while its Lease is surely still its own.
//!
//! The Lease manager renews the Lease `grace` before it expires. When renewals hang (etcd
//! frozen, the API server unreachable), the replica used to go on acting until it saw another
//! holder: in 3 of 3 runs with etcd frozen for 20 s the old leader sent a write 16 s after its
//! Lease had expired. The fence sits in the client: while this replica holds the Lease (the
//! Lease watch says so: [`Fence::hold`]), every successful write to the Lease (a renewal)
//! keeps writes open for the Lease's duration less a quarter of the grace (at least 250 ms),
//! counted from when the renewal was sent; past that, every other write is refused in the
//! client, unsent, until a renewal succeeds again. Reads go on. Once the Lease is lost
//! ([`Fence::lost`]) every write is refused until the agent stops. A replica that never held
//! the Lease (a standby's force-release of an expired Lease succeeds too, and is no renewal),
//! or runs without leader election, is not fenced. With `--shards`, writes to the shard
//! Leases are fenced by the main Lease on the replica that holds it; the other replicas'
//! shard work is not fenced yet.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The Lease's duration and how long before it runs out the holder renews it, from
/// `--lease-duration`: what the Lease manager and the fence both use.
pub fn lease_timing(duration: Duration) -> (Duration, Duration) {
    let duration = duration.as_secs().max(2);
    let grace = (duration / 3).clamp(1, 5);
    (Duration::from_secs(duration), Duration::from_secs(grace))
}

/// The agent's fence, once it has one (set at start by the agent's command).
static CURRENT: OnceLock<Arc<Fence>> = OnceLock::new();

/// Makes `fence` the process's fence; the first call wins.
pub fn install(fence: Arc<Fence>) {
    let _ = CURRENT.set(fence);
}

/// The process's fence, if leader election is on.
pub fn current() -> Option<&'static Arc<Fence>> {
    CURRENT.get()
}

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
    /// Whether the Lease watch says this replica holds the Lease.
    holding: bool,
    /// The Lease was lost: nothing more is written.
    lost: bool,
    /// When the last successful write to the Lease was sent (by anyone in this process).
    last_write: Option<Instant>,
    /// When the last renewal of the held Lease was sent; `None`: not armed.
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
            deadline: duration.saturating_sub((grace / 4).max(Duration::from_millis(250))),
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
        if path.ends_with(&self.lease_path) {
            return Kind::LeaseWrite;
        }
        // A Lease is created with a POST to the collection, named only in the body: never
        // held back, and no renewal (it may be a shard's); the first renewal arms the fence.
        if *method == http::Method::POST
            && path.ends_with(self.lease_path.rsplit_once('/').map_or("", |(c, _)| c))
        {
            return Kind::Read;
        }
        if path.contains("/apis/authorization.k8s.io/")
            || path.contains("/apis/authentication.k8s.io/")
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
        if state.lost {
            return Err(Fenced {
                lease: self.lease.clone(),
                since: state
                    .renewed
                    .map_or(Duration::ZERO, |r| now.saturating_duration_since(r)),
                deadline: self.deadline,
            });
        }
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

    /// A write to the Lease sent at `sent` succeeded: a renewal while this replica holds it.
    pub fn renewed(&self, sent: Instant) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        state.last_write = Some(state.last_write.map_or(sent, |r| r.max(sent)));
        if !state.holding || state.lost {
            return;
        }
        if state.said_closed {
            tracing::info!(lease = %self.lease, "the lease is renewed: writes resume");
            state.said_closed = false;
        }
        state.renewed = Some(state.renewed.map_or(sent, |r| r.max(sent)));
    }

    /// The Lease watch says this replica holds the Lease, taken by the write to it that went
    /// through last: from then on writes need renewals.
    pub fn hold(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.holding = true;
            state.renewed = state.last_write;
        }
    }

    /// The Lease is lost: every write is refused from now on (the agent is stopping).
    pub fn lost(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.lost = true;
            state.holding = false;
        }
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
        f.renewed(t0);
        assert!(
            f.allows(t0 + Duration::from_secs(3600)).is_ok(),
            "a write to the Lease by a replica that does not hold it arms nothing"
        );
        f.hold();
        assert!(f.allows(t0 + Duration::from_millis(13_750)).is_ok());
        let e = f.allows(t0 + Duration::from_millis(13_800)).unwrap_err();
        assert_eq!(e.deadline, Duration::from_millis(13_750));
        assert!(e.to_string().contains("linnet-system/linnet"), "{e}");
        // A renewal sent earlier that answers late does not move the fence back.
        f.renewed(t0 + Duration::from_secs(20));
        f.renewed(t0 + Duration::from_secs(10));
        assert!(f.allows(t0 + Duration::from_secs(33)).is_ok());
        assert!(f.allows(t0 + Duration::from_secs(34)).is_err());
        // Lost: nothing more, whatever is renewed.
        f.lost();
        f.renewed(t0 + Duration::from_secs(40));
        assert!(f.allows(t0 + Duration::from_secs(41)).is_err());
    }

    #[test]
    fn a_short_lease_keeps_a_quarter_second_at_least() {
        let (d, g) = lease_timing(Duration::from_secs(4));
        assert_eq!((d, g), (Duration::from_secs(4), Duration::from_secs(1)));
        let f = Fence::new("ns", "l", d, g);
        assert_eq!(f.deadline, Duration::from_millis(3_750));
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
        // Behind a proxy whose URL has a path.
        assert_eq!(
            f.kind(&Method::PATCH, &format!("/k8s/clusters/c-x{lease}")),
            Kind::LeaseWrite
        );
    }
}
