//! The notification settings (`--notifications-file`, from a ConfigMap): who hears about
//! what. Each receiver's URL is in a file of its own, mounted from a Secret, and read on
//! every send, so a rotated Secret needs no restart and no URL is ever in the ConfigMap.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::events::Event;

/// The whole file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotificationsFile {
    pub receivers: Vec<Receiver>,
}

/// One place notifications go.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Receiver {
    /// Names it in logs and in `linnet_notifications_total{receiver}`.
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ReceiverKind,
    /// A file holding the webhook URL (a mounted Secret's key); not for `pullRequest`.
    #[serde(default)]
    pub url_file: Option<PathBuf>,
    /// `webhook`: a file holding the HMAC-SHA256 key the body is signed with.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// The events it gets; all when left out.
    #[serde(default)]
    pub events: Option<Vec<Event>>,
    /// `namespace/name` patterns (`*` matches any run of characters) of the rollouts it
    /// hears about; all when left out.
    #[serde(default)]
    pub rollouts: Option<Vec<String>>,
    /// The message, with `{event}`, `{kind}`, `{namespace}`, `{name}`, `{phase}`, `{image}`,
    /// `{message}`, `{revision}` filled in; a sentence per event when left out.
    #[serde(default)]
    pub template: Option<String>,
    /// The most notifications it is sent a minute; more wait their turn (default 20).
    #[serde(default = "default_per_minute")]
    pub per_minute: u32,
}

fn default_per_minute() -> u32 {
    20
}

/// What kind of endpoint a receiver is.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ReceiverKind {
    /// A Slack incoming webhook.
    Slack,
    /// A Microsoft Teams workflow (Power Automate) webhook: an Adaptive Card.
    Teams,
    /// A Discord webhook.
    Discord,
    /// Any HTTPS endpoint: linnet's JSON, signed with HMAC-SHA256.
    Webhook,
    /// A comment on the pull request that brought the rollout's commit in, through the
    /// `--commit-status-*` host and token.
    PullRequest,
}

impl ReceiverKind {
    pub fn label(self) -> &'static str {
        match self {
            ReceiverKind::Slack => "slack",
            ReceiverKind::Teams => "teams",
            ReceiverKind::Discord => "discord",
            ReceiverKind::Webhook => "webhook",
            ReceiverKind::PullRequest => "pullRequest",
        }
    }
}

/// A settings file that cannot be used: what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: {reason}")]
    Parse { path: String, reason: String },
    #[error("{path}: receiver {receiver}: {reason}")]
    Receiver {
        path: String,
        receiver: String,
        reason: String,
    },
}

/// The most a settings file may hold: it is a ConfigMap, at most 1 MiB.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Reads and checks `path`.
pub fn load(path: &Path) -> Result<NotificationsFile, ConfigError> {
    let shown = path.display().to_string();
    let read = std::fs::metadata(path)
        .and_then(|m| {
            if m.len() > MAX_FILE_BYTES {
                Err(std::io::Error::other("over 1 MiB"))
            } else {
                std::fs::read_to_string(path)
            }
        })
        .map_err(|e| ConfigError::Read {
            path: shown.clone(),
            reason: crate::error::io_reason(&e),
        })?;
    parse(&shown, &read)
}

/// Parses and checks the text of a settings file named `path`.
pub fn parse(path: &str, text: &str) -> Result<NotificationsFile, ConfigError> {
    let file: NotificationsFile = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_string(),
        reason: e.to_string(),
    })?;
    let mut names = std::collections::BTreeSet::new();
    for r in &file.receivers {
        let bad = |reason: &str| ConfigError::Receiver {
            path: path.to_string(),
            receiver: r.name.clone(),
            reason: reason.to_string(),
        };
        if !names.insert(r.name.as_str()) {
            return Err(bad("a second receiver of that name"));
        }
        match (r.kind, &r.url_file) {
            (ReceiverKind::PullRequest, Some(_)) => {
                return Err(bad(
                    "urlFile is not for pullRequest: it comments through the --commit-status-* host",
                ));
            }
            (ReceiverKind::PullRequest, None) => {}
            (_, None) => return Err(bad("urlFile is required: a file with the webhook's URL")),
            (_, Some(_)) => {}
        }
        if r.kind == ReceiverKind::Webhook && r.secret_file.is_none() {
            return Err(bad(
                "secretFile is required for a webhook: its body is signed with that key",
            ));
        }
        if r.per_minute == 0 {
            return Err(bad("perMinute must be at least 1"));
        }
    }
    Ok(file)
}

impl Receiver {
    /// Whether this receiver hears about `event` of rollout `namespace/name`.
    pub fn wants(&self, event: Event, namespace: &str, name: &str) -> bool {
        let key = format!("{namespace}/{name}");
        self.events.as_ref().is_none_or(|e| e.contains(&event))
            && self
                .rollouts
                .as_ref()
                .is_none_or(|patterns| patterns.iter().any(|p| glob_matches(p, &key)))
    }

    /// The wait between two sends that keeps to `per_minute`.
    pub fn spacing(&self) -> Duration {
        Duration::from_secs(60) / self.per_minute.max(1)
    }
}

/// `*` matches any run of characters (a `/` too); everything else matches itself.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "receivers:
- name: oncall
  type: slack
  urlFile: /etc/linnet/notify/slack
  events: [AnalysisFailed, RolledBack]
  rollouts: ['shop/*']
- name: audit
  type: webhook
  urlFile: /etc/linnet/notify/audit
  secretFile: /etc/linnet/notify/audit-key
  perMinute: 60
- name: pr
  type: pullRequest
";

    #[test]
    fn receivers_are_routed_by_event_and_rollout() {
        let file = parse("n.yaml", GOOD).unwrap();
        let oncall = &file.receivers[0];
        assert!(oncall.wants(Event::RolledBack, "shop", "redis"));
        assert!(!oncall.wants(Event::CanaryStarted, "shop", "redis"));
        assert!(!oncall.wants(Event::RolledBack, "payments", "redis"));
        assert!(file.receivers[2].wants(Event::Promoted, "any", "thing"));
        assert_eq!(file.receivers[1].spacing(), Duration::from_secs(1));
        assert_eq!(file.receivers[0].spacing(), Duration::from_secs(3));
    }

    #[test]
    fn a_bad_file_says_which_receiver_and_what_to_do() {
        let no_url = "receivers:\n- name: x\n  type: discord\n";
        let e = parse("n.yaml", no_url).unwrap_err().to_string();
        assert!(
            e.contains("receiver x") && e.contains("urlFile is required"),
            "{e}"
        );
        let unsigned = "receivers:\n- name: y\n  type: webhook\n  urlFile: /u\n";
        let e = parse("n.yaml", unsigned).unwrap_err().to_string();
        assert!(e.contains("secretFile is required"), "{e}");
        let unknown = "receivers:\n- name: z\n  type: slack\n  url: https://hooks.slack.com/x\n";
        let e = parse("n.yaml", unknown).unwrap_err().to_string();
        assert!(e.starts_with("n.yaml:") && e.contains("url"), "{e}");
        let event = "receivers:\n- name: z\n  type: slack\n  urlFile: /u\n  events: [Exploded]\n";
        let e = parse("n.yaml", event).unwrap_err().to_string();
        assert!(e.contains("Exploded"), "{e}");
    }

    #[test]
    fn globs_match_whole_keys() {
        assert!(glob_matches("shop/*", "shop/redis"));
        assert!(glob_matches("*/redis", "shop/redis"));
        assert!(glob_matches("*", "a/b"));
        assert!(glob_matches("s*p/re*s", "shop/redis"));
        assert!(!glob_matches("shop/*", "shopping/redis"));
        assert!(!glob_matches("shop/redis", "shop/redis-2"));
        assert!(!glob_matches("a*a", "a"));
    }
}
