//! Ports for the servers a test starts in another process (the agent, Gitea, Prometheus, a
//! gateway, sshd).
//!
//! A port found free by binding port 0 comes from the kernel's ephemeral range, which is also
//! where every outgoing connection takes its local port. Between the probe and the child's own
//! bind, a client connection (the agent's to the API server, say) could take it: the child then
//! failed with "Address already in use" (`partition_canary_promotion_and_broken_rollback`, CI
//! of 2026-11-29). These ports come from below that range, so only a listener can hold one,
//! and each is handed out once per test process.

use std::sync::atomic::{AtomicU32, Ordering};

/// Below the ephemeral range (32768 up on Linux) and above the local control plane's own ports
/// (tests/cluster/env.sh: 16443, 23791, 23801), which an API server restart frees for a moment.
const FIRST: u32 = 24_000;
const LAST: u32 = 32_000;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A port no listener holds now, and not among the last 8,000 this process was given. Test
/// binaries start at different offsets (by process id), so two running at once rarely probe
/// the same ports, and when they do, the bind probe tells them apart.
pub fn free_port() -> u16 {
    let span = LAST - FIRST;
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = (FIRST + offset) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {FIRST} and {LAST}")
}
