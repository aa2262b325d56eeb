//! The image automation's backoff per registry host (issue 74): a registry that answers 429,
//! 5xx or not at all is not asked again for a while, longer after each failure in a row, and
//! at least as long as it asked (`Retry-After`); its first answer ends the backoff.

use std::collections::BTreeMap;
use std::time::Duration;

/// Registries that failed or limited us, left alone for a while: longer after each failure in
/// a row (2 s up to 30 min, with jitter), and at least as long as a 429's `Retry-After`.
#[derive(Default)]
pub struct RegistryBackoff {
    by_host: BTreeMap<String, HostBackoff>,
}

struct HostBackoff {
    until: std::time::Instant,
    retries: crate::retry::Retries,
    why: String,
}

impl RegistryBackoff {
    /// Why `host` is not asked now, while it is backed off.
    pub fn waiting(&self, host: &str) -> Option<String> {
        // No time left in the text: a problem is logged again only when its text changes.
        let b = self.by_host.get(host)?;
        b.until.checked_duration_since(std::time::Instant::now())?;
        Some(format!(
            "registry {host} is left alone for a while (backing off) after: {}",
            b.why
        ))
    }

    /// A request's outcome: a registry fault backs the host off; any answer ends its backoff.
    pub fn record(&mut self, host: &str, error: Option<&crate::source::registry::RegistryError>) {
        let Some((e, asked)) = error.and_then(|e| e.registry_fault().map(|d| (e, d))) else {
            self.by_host.remove(host);
            return;
        };
        let b = self
            .by_host
            .entry(host.to_string())
            .or_insert_with(|| HostBackoff {
                until: std::time::Instant::now(),
                retries: crate::retry::Retries::new(
                    Duration::from_secs(2),
                    Duration::from_secs(30 * 60),
                ),
                why: String::new(),
            });
        let wait = b.retries.wait().max(asked);
        b.until = std::time::Instant::now() + wait;
        b.why = e.to_string();
        tracing::warn!(registry = %host, wait_secs = wait.as_secs(), error = %e, "registry failing or limiting; backing off");
    }
}
