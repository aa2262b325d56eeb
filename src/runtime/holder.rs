//! One live agent per source name. The source name is in the label on everything a source
//! applies, cluster-wide: two agents with one name (two repositories, both with the default)
//! took over each other's objects, posted commit statuses on each other's commits, and pruned
//! each other's objects through one inventory (issues 45 and 70). Every agent holds a claim on
//! its source name, a Lease of its own namespace ([`super::claim`]); this module decides, from
//! the claims seen, whether this agent may hold it. Pure: claims and `now` in, a verdict out.

use std::time::Duration;

use jiff::Timestamp;

/// Who an agent is, as far as a source is concerned: every replica of one installation (one
/// Lease name in one namespace) is the same holder; without leader election, each pod is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installation {
    pub namespace: String,
    /// `lease/<lease name>` with leader election, `replica/<pod name or host>` without.
    pub identity: String,
    /// A namespace-scoped install (`--watch-namespace`) may read Leases in its own namespace
    /// only, so it looks for other claims there.
    pub own_namespace_only: bool,
}

/// A source claim seen in the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct SeenClaim {
    pub namespace: String,
    /// Empty once released.
    pub holder: String,
    pub acquired: Option<Timestamp>,
    pub renewed: Option<Timestamp>,
    pub duration: Duration,
    pub url: String,
    pub branch: String,
}

impl SeenClaim {
    fn is_mine(&self, me: &Installation) -> bool {
        self.namespace == me.namespace && self.holder == me.identity
    }

    /// Held and renewed within its duration (a clock ahead of ours counts as live).
    pub fn is_live(&self, now: Timestamp) -> bool {
        if self.holder.is_empty() {
            return false;
        }
        match self.renewed {
            Some(renewed) => {
                renewed > now || now.duration_since(renewed).unsigned_abs() < self.duration
            }
            None => false,
        }
    }

    /// When it lapses unless renewed again.
    pub fn lapses_at(&self) -> Option<Timestamp> {
        let duration = jiff::SignedDuration::try_from(self.duration).ok()?;
        self.renewed?.checked_add(duration).ok()
    }
}

/// Another installation's live claim on `source`, if any: the one this agent must not run
/// beside. Claims of this installation (its own Lease, a restarted pod of it) never count.
pub fn live_other<'a>(
    me: &Installation,
    claims: &'a [SeenClaim],
    now: Timestamp,
) -> Option<&'a SeenClaim> {
    claims.iter().find(|c| !c.is_mine(me) && c.is_live(now))
}

/// How long a claim's write may take, and how long after stamping it the agent waits before
/// it looks at the others' claims. Acquisition times are stamped before the write, so a write
/// that lingered could land after an earlier-stamped agent had looked and found nobody: then
/// both ran (the CI failure of `of_two_agents_of_one_source_started_together_one_runs`). A
/// write must be answered within this time (else it is stamped and written again), and the
/// look comes no sooner than this time after the stamp: every claim stamped earlier is then
/// in the cluster when the later agent looks, and the later one yields. This holds while the
/// agents' clocks agree to within this time.
pub fn settle_time(duration: Duration) -> Duration {
    (duration / 4).clamp(Duration::from_millis(500), Duration::from_secs(2))
}

/// Whether a claim stamped at `stamped` and answered at `answered` was written in time to be
/// ordered by its stamp (see [`settle_time`]).
pub fn written_in_time(stamped: Timestamp, answered: Timestamp, settle: Duration) -> bool {
    answered.duration_since(stamped).unsigned_abs() < settle
}

/// After writing its own claim: whether another live claim came first, so that of two agents
/// that started at the same moment in two namespaces (each seeing no other before it wrote)
/// exactly one runs. Earlier acquisition wins; a tie goes to the namespace first in order.
pub fn came_first<'a>(
    me: &Installation,
    mine_acquired: Timestamp,
    claims: &'a [SeenClaim],
    now: Timestamp,
) -> Option<&'a SeenClaim> {
    claims.iter().find(|c| {
        !c.is_mine(me)
            && c.is_live(now)
            && match c.acquired {
                Some(theirs) => {
                    theirs < mine_acquired
                        || (theirs == mine_acquired && c.namespace < me.namespace)
                }
                // A claim written without a time is older than any this agent writes.
                None => true,
            }
    })
}

/// Why this agent may not take `source`, naming the agent that holds it.
pub fn refusal(source: &str, holder: &SeenClaim) -> String {
    let who = match holder.holder.split_once('/') {
        Some(("lease", lease)) => format!(" (Lease {lease})"),
        Some(("replica", pod)) => format!(" (replica {pod}, leader election off)"),
        _ => String::new(),
    };
    format!(
        "source name {source:?} is already used by the agent in namespace {ns}{who}, \
         following {url} branch {branch}: two agents with one source name take over each \
         other's objects, prune through one inventory and post on each other's commits. Give \
         this agent another --source-name; if that agent is gone, its claim lapses {duration}s \
         after its last renewal (kubectl get lease -n {ns} {lease_name})",
        ns = holder.namespace,
        url = if holder.url.is_empty() {
            "?"
        } else {
            &holder.url
        },
        branch = if holder.branch.is_empty() {
            "?"
        } else {
            &holder.branch
        },
        duration = holder.duration.as_secs(),
        lease_name = claim_name(source),
    )
}

/// The name of `source`'s claim Lease in an agent's namespace.
pub fn claim_name(source: &str) -> String {
    format!("linnet-source-{source}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn me(ns: &str) -> Installation {
        Installation {
            namespace: ns.into(),
            identity: "lease/linnet-default".into(),
            own_namespace_only: false,
        }
    }

    fn claim(ns: &str, holder: &str, acquired: Timestamp, renewed: Timestamp) -> SeenClaim {
        SeenClaim {
            namespace: ns.into(),
            holder: holder.into(),
            acquired: Some(acquired),
            renewed: Some(renewed),
            duration: 15 * SECOND,
            url: "https://git.example/a.git".into(),
            branch: "main".into(),
        }
    }

    #[test]
    fn a_second_agent_with_a_live_holders_source_name_is_refused_naming_it() {
        // Issue 45: two agents with the default source name deleted each other's objects.
        let now = Timestamp::now();
        let claims = [claim("team-a", "lease/linnet-default", now, now)];
        let other = live_other(&me("team-b"), &claims, now).unwrap();
        let why = refusal("default", other);
        assert!(
            why.contains("namespace team-a")
                && why.contains("Lease linnet-default")
                && why.contains("https://git.example/a.git")
                && why.contains("--source-name")
                && why.contains("linnet-source-default"),
            "{why}"
        );
    }

    #[test]
    fn a_second_agent_in_the_same_namespace_without_leader_election_is_refused() {
        // Issue 70: the check skipped its own namespace, and leader election off took no Lease.
        let now = Timestamp::now();
        let claims = [claim("team-a", "lease/linnet-default", now, now)];
        let unelected = Installation {
            namespace: "team-a".into(),
            identity: "replica/linnet-2".into(),
            own_namespace_only: false,
        };
        assert!(live_other(&unelected, &claims, now).is_some());
        // Another --lease-name in the same namespace is another installation too.
        let other_lease = Installation {
            namespace: "team-a".into(),
            identity: "lease/other".into(),
            own_namespace_only: false,
        };
        assert!(live_other(&other_lease, &claims, now).is_some());
        // The same installation (a standby, a restarted pod) is not refused.
        assert!(live_other(&me("team-a"), &claims, now).is_none());
    }

    #[test]
    fn a_claim_lapsed_or_released_is_free() {
        let now = Timestamp::now();
        let old = now - jiff::SignedDuration::from_secs(16);
        assert!(live_other(&me("b"), &[claim("a", "lease/x", old, old)], now).is_none());
        assert!(live_other(&me("b"), &[claim("a", "", now, now)], now).is_none());
        assert!(live_other(&me("b"), &[], now).is_none());
        let fresh = claim("a", "lease/x", old, now);
        assert_eq!(
            fresh.lapses_at(),
            Some(now + jiff::SignedDuration::from_secs(15))
        );
    }

    #[test]
    fn of_two_agents_started_together_exactly_one_runs() {
        // Issue 70: two agents of one source started in the same second in two namespaces
        // both ran; each had looked before the other wrote its claim.
        let now = Timestamp::now();
        let earlier = now - jiff::SignedDuration::from_millis(300);
        let claims = [
            claim("ns-a", "lease/linnet-default", earlier, now),
            claim("ns-b", "lease/linnet-default", now, now),
        ];
        assert!(came_first(&me("ns-a"), earlier, &claims, now).is_none());
        assert_eq!(
            came_first(&me("ns-b"), now, &claims, now).map(|c| c.namespace.as_str()),
            Some("ns-a")
        );
        // A tie goes to the namespace first in order, the same answer on both sides.
        let tied = [
            claim("ns-a", "lease/linnet-default", now, now),
            claim("ns-b", "lease/linnet-default", now, now),
        ];
        assert!(came_first(&me("ns-a"), now, &tied, now).is_none());
        assert!(came_first(&me("ns-b"), now, &tied, now).is_some());
    }

    #[test]
    fn a_claim_whose_write_lingered_is_stamped_again() {
        // Regression: B stamped its claim before A did, but B's write landed after A had
        // looked and found nobody; A ran (nobody came first), and B ran (A came later). A
        // write answered after the settle time is stamped and written again.
        let settle = settle_time(4 * SECOND);
        assert_eq!(settle, SECOND);
        let stamped = Timestamp::now();
        let prompt = stamped + jiff::SignedDuration::from_millis(300);
        let lingered = stamped + jiff::SignedDuration::from_millis(1200);
        assert!(written_in_time(stamped, prompt, settle));
        assert!(!written_in_time(stamped, lingered, settle));
        assert_eq!(settle_time(15 * SECOND), 2 * SECOND);
        assert_eq!(settle_time(SECOND), Duration::from_millis(500));
    }
}
