//! Expectations for the agent's own writes of a rollout's children, as controller-runtime and
//! kube-runtime users keep them: after linnet applies a StatefulSet or a Deployment, the
//! rollout's next reconcile waits until the child's watch has shown that write, instead of
//! planning from the store's older copy and applying the same thing again. The watch clears
//! an expectation when it delivers the written resourceVersion or any later one (or lists
//! afresh): the write's own event and a later one (the StatefulSet controller's status) can
//! both arrive before the write's response. Resource versions are compared as Kubernetes
//! defines it since KEP-5504 (decimal integers: the longer is newer, then by digits); a
//! version that is not such a number meets only the exact one. One never cleared lapses
//! after [`EXPECTATION_TTL`], a last resort counted in `linnet_own_write_wait_lapses`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a reconcile waits at most for the watch to show a write.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(15);

/// Children written and not yet seen by their watch, by rollout.
#[derive(Debug, Default)]
pub struct OwnChildWrites {
    inner: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    /// rollout key -> child key -> (written resourceVersion, when).
    by_rollout: HashMap<String, HashMap<String, (String, Instant)>>,
    /// child key -> rollout key.
    rollout_of: HashMap<String, String>,
    /// child key -> the newest resourceVersion its watch delivered: the event of a write (and
    /// later ones) can come in before the write's own response, and must not be waited for.
    last_seen: HashMap<String, String>,
}

/// The key of an object (a child, or a rollout): its kind, namespace and name.
pub fn child_key(kind: &str, namespace: &str, name: &str) -> String {
    format!("{kind}/{namespace}/{name}")
}

impl OwnChildWrites {
    /// Records that `rollout` wrote `child`, which is now at `resource_version`.
    pub fn expect(&self, rollout: &str, child: &str, resource_version: &str, now: Instant) {
        let Ok(mut p) = self.inner.lock() else { return };
        if p.last_seen
            .get(child)
            .is_some_and(|seen| at_least(seen, resource_version))
        {
            return;
        }
        p.by_rollout
            .entry(rollout.to_string())
            .or_default()
            .insert(child.to_string(), (resource_version.to_string(), now));
        p.rollout_of.insert(child.to_string(), rollout.to_string());
    }

    /// The watch delivered `child` at `resource_version`: a write of that version, or of an
    /// older one, is seen.
    pub fn seen(&self, child: &str, resource_version: &str) {
        let Ok(mut p) = self.inner.lock() else { return };
        // The newest: an older version delivered again (a relist) does not take it back.
        let newer = p
            .last_seen
            .get(child)
            .is_none_or(|seen| !at_least(seen, resource_version) || seen == resource_version);
        if newer {
            p.last_seen
                .insert(child.to_string(), resource_version.to_string());
        }
        let Some(rollout) = p.rollout_of.get(child).cloned() else {
            return;
        };
        let Some(children) = p.by_rollout.get_mut(&rollout) else {
            return;
        };
        if children
            .get(child)
            .is_some_and(|(written, _)| at_least(resource_version, written))
        {
            children.remove(child);
            if children.is_empty() {
                p.by_rollout.remove(&rollout);
            }
            p.rollout_of.remove(child);
        }
    }

    /// The watch delivered `child`'s deletion.
    pub fn deleted(&self, child: &str) {
        if let Ok(mut p) = self.inner.lock() {
            p.last_seen.remove(child);
        }
    }

    /// The watch listed afresh: what it holds now is at least every write made before, so
    /// every expectation of `kind` is met.
    pub fn relisted(&self, kind: &str) {
        let Ok(mut p) = self.inner.lock() else { return };
        let prefix = format!("{kind}/");
        p.rollout_of.retain(|child, _| !child.starts_with(&prefix));
        for children in p.by_rollout.values_mut() {
            children.retain(|child, _| !child.starts_with(&prefix));
        }
        p.by_rollout.retain(|_, children| !children.is_empty());
    }

    /// How long `rollout`'s reconcile should still wait for its own writes to show, if at all,
    /// and how many expectations lapsed now (dropped: the caller counts them).
    pub fn wait_for(&self, rollout: &str, now: Instant) -> Wait {
        let Ok(mut p) = self.inner.lock() else {
            return Wait::default();
        };
        let Some(children) = p.by_rollout.get_mut(rollout) else {
            return Wait::default();
        };
        let mut lapsed = Vec::new();
        let mut longest = Duration::ZERO;
        for (child, (_, at)) in children.iter() {
            match (*at + EXPECTATION_TTL).checked_duration_since(now) {
                Some(left) if !left.is_zero() => longest = longest.max(left),
                _ => lapsed.push(child.clone()),
            }
        }
        for child in &lapsed {
            children.remove(child);
        }
        if children.is_empty() {
            p.by_rollout.remove(rollout);
        }
        for child in &lapsed {
            p.rollout_of.remove(child);
        }
        Wait {
            left: (!longest.is_zero()).then_some(longest),
            lapsed: lapsed.len(),
        }
    }
}

/// What [`OwnChildWrites::wait_for`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// How long to wait still, if at all.
    pub left: Option<Duration>,
    /// Expectations that lapsed, never met by the watch.
    pub lapsed: usize,
}

/// Whether resource version `seen` is `written` or newer. KEP-5504 made resource versions
/// comparable: decimal integers without leading zeros, the longer one newer, then by digits.
/// A version that is not of that form is only ever equal to itself.
pub fn at_least(seen: &str, written: &str) -> bool {
    let decimal = |v: &str| {
        !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && (v == "0" || !v.starts_with('0'))
    };
    if seen == written {
        return true;
    }
    if !(decimal(seen) && decimal(written)) {
        return false;
    }
    (seen.len(), seen) > (written.len(), written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reconcile_waits_until_the_watch_shows_its_own_write() {
        // Issue 25: a reconcile woken before the set's watch event applied the set again.
        let w = OwnChildWrites::default();
        let t0 = Instant::now();
        let set = child_key("StatefulSet", "ns", "redis-stable");
        w.expect("CanaryStatefulSet/ns/redis", &set, "41", t0);
        assert!(w.wait_for("CanaryStatefulSet/ns/redis", t0).left.is_some());
        assert!(w.wait_for("CanaryStatefulSet/ns/other", t0).left.is_none());
        w.seen(&set, "40"); // an older version: still waiting
        assert!(w.wait_for("CanaryStatefulSet/ns/redis", t0).left.is_some());
        w.seen(&set, "41");
        assert_eq!(
            w.wait_for("CanaryStatefulSet/ns/redis", t0),
            Wait::default()
        );
    }

    #[test]
    fn a_write_whose_event_came_before_its_response_is_not_waited_for() {
        let w = OwnChildWrites::default();
        let set = child_key("StatefulSet", "ns", "redis-stable");
        w.seen(&set, "41");
        w.expect("r", &set, "41", Instant::now());
        assert_eq!(w.wait_for("r", Instant::now()), Wait::default());
    }

    #[test]
    fn a_write_whose_event_and_a_later_one_came_before_its_response_is_not_waited_for() {
        // Issue 44: the write's event and then the StatefulSet controller's status came in
        // before the write's answer; the wait matched only the exact version, and lapsed
        // after 15 s.
        let w = OwnChildWrites::default();
        let set = child_key("StatefulSet", "ns", "redis-stable");
        w.seen(&set, "41");
        w.seen(&set, "42");
        w.expect("r", &set, "41", Instant::now());
        assert_eq!(w.wait_for("r", Instant::now()), Wait::default());
    }

    #[test]
    fn a_later_version_meets_a_wait_already_recorded() {
        let w = OwnChildWrites::default();
        let t0 = Instant::now();
        let set = child_key("StatefulSet", "ns", "redis-stable");
        w.expect("r", &set, "99", t0);
        w.seen(&set, "100"); // longer: newer
        assert_eq!(w.wait_for("r", t0), Wait::default());
    }

    #[test]
    fn resource_versions_compare_as_kep_5504_defines() {
        assert!(at_least("41", "41"));
        assert!(at_least("42", "41"));
        assert!(at_least("100", "99"));
        assert!(!at_least("99", "100"));
        assert!(!at_least("41", "42"));
        // Not decimal: only the exact version counts.
        assert!(!at_least("b", "a"));
        assert!(!at_least("042", "41"));
        assert!(at_least("opaque", "opaque"));
    }

    #[test]
    fn a_write_never_seen_lapses_and_a_relist_meets_every_expectation() {
        let w = OwnChildWrites::default();
        let t0 = Instant::now();
        w.expect("r", &child_key("StatefulSet", "ns", "a"), "1", t0);
        assert_eq!(
            w.wait_for("r", t0 + Duration::from_secs(5)).left,
            Some(EXPECTATION_TTL - Duration::from_secs(5))
        );
        assert_eq!(
            w.wait_for("r", t0 + EXPECTATION_TTL),
            Wait {
                left: None,
                lapsed: 1
            }
        );
        w.expect("r", &child_key("StatefulSet", "ns", "a"), "2", t0);
        w.expect("r", &child_key("Deployment", "ns", "b"), "3", t0);
        w.relisted("StatefulSet");
        assert!(
            w.wait_for("r", t0).left.is_some(),
            "the Deployment is still due"
        );
        w.relisted("Deployment");
        assert_eq!(w.wait_for("r", t0), Wait::default());
    }
}
