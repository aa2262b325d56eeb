//! Each receiver's message, as its service documents it (pure): the text from the template,
//! and the body for Slack, Microsoft Teams, Discord or linnet's signed webhook.
//!
//! What a rollout says comes partly from Git (names, images, messages quoting commits), so
//! it is treated as text, never as markup: Slack's control characters are escaped (no
//! `<!channel>`, no hidden link), Discord is told to ping no one, and every text is cut to
//! what each service takes.

use serde_json::{Value, json};

use super::config::{Receiver, ReceiverKind};
use super::events::{Event, Notice};

/// The longest text sent: Discord takes 2,000 characters; the others are cut here too.
const MAX_TEXT_CHARS: usize = 2000;

/// The header carrying a webhook body's signature: `sha256=` and the hex HMAC-SHA256 of the
/// body with the receiver's key, as GitHub signs its webhooks.
pub const SIGNATURE_HEADER: &str = "x-linnet-signature-256";
/// The header naming the event.
pub const EVENT_HEADER: &str = "x-linnet-event";

fn default_template(event: Event) -> &'static str {
    match event {
        Event::CanaryStarted => "{namespace}/{name}: canary of {image} started ({kind})",
        Event::AwaitingApproval => {
            "{namespace}/{name}: canary of {image} waits for approval. {message}"
        }
        Event::AnalysisFailed => "{namespace}/{name}: {message} (canary of {image})",
        Event::RolledBack => "{namespace}/{name}: rolled back to {image}. {message}",
        Event::Promoted => "{namespace}/{name}: {image} promoted",
    }
}

/// The receiver's template (or the event's sentence) with the notice's fields filled in.
pub fn text(receiver: &Receiver, n: &Notice) -> String {
    let template = receiver
        .template
        .as_deref()
        .unwrap_or(default_template(n.event));
    let mut out = String::new();
    let mut rest = template;
    // One pass, left to right: a field's value is never read as a placeholder again.
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let value = after.find('}').and_then(|close| {
            let field = match &after[..close] {
                "event" => n.event.as_str(),
                "kind" => n.kind,
                "namespace" => &n.namespace,
                "name" => &n.name,
                "phase" => &n.phase,
                "image" => &n.image,
                "message" => &n.message,
                "revision" => n.revision.as_deref().unwrap_or(""),
                "imageSource" => n.image_source.as_deref().unwrap_or(""),
                "evidence" => n.evidence.as_deref().unwrap_or(""),
                _ => return None,
            };
            Some((field, close))
        });
        match value {
            Some((field, close)) => {
                out.push_str(field);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    // The default sentence of a canary the image automation started says where it came from.
    if let (None, Event::CanaryStarted, Some(source)) =
        (&receiver.template, n.event, &n.image_source)
    {
        out.push_str(&format!("; written by the image automation: {source}"));
    }
    cut(out.trim())
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_TEXT_CHARS - 1) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// Slack's control characters, escaped as Slack documents.
fn slack_escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The JSON body for `receiver`, for every kind but `pullRequest` (whose comment is `text`).
pub fn body(receiver: &Receiver, n: &Notice, text: &str) -> Value {
    match receiver.kind {
        ReceiverKind::Slack => {
            let escaped = slack_escaped(text);
            json!({
                "text": escaped,
                "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": escaped}}],
            })
        }
        ReceiverKind::Teams => json!({
            "type": "message",
            "attachments": [{
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": null,
                "content": {
                    "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                    "type": "AdaptiveCard",
                    "version": "1.4",
                    "body": [
                        {"type": "TextBlock", "text": format!("linnet: {}", n.event.as_str()),
                         "weight": "Bolder", "wrap": true},
                        {"type": "TextBlock", "text": text, "wrap": true},
                        {"type": "FactSet", "facts": [
                            {"title": "Rollout", "value": format!("{} {}/{}", n.kind, n.namespace, n.name)},
                            {"title": "Phase", "value": n.phase},
                            {"title": "Image", "value": n.image},
                        ]},
                    ],
                },
            }],
        }),
        ReceiverKind::Discord => json!({
            "content": text,
            "allowed_mentions": {"parse": []},
        }),
        ReceiverKind::Webhook | ReceiverKind::PullRequest => json!({
            "event": n.event.as_str(),
            "kind": n.kind,
            "namespace": n.namespace,
            "name": n.name,
            "phase": n.phase,
            "image": n.image,
            "message": n.message,
            "revision": n.revision,
            "imageSource": n.image_source,
            "evidence": n.evidence,
            "text": text,
        }),
    }
}

/// The pull request comment: the text, with the rollout's identity beneath, then the
/// analysis that decided (each metric's values, condition and query).
pub fn comment(n: &Notice, text: &str) -> String {
    let evidence = n
        .evidence
        .as_deref()
        .map(|e| format!("\n\nThe analysis:\n\n{e}"))
        .unwrap_or_default();
    format!(
        "**linnet: {}** {}\n\n`{} {}/{}`, phase `{}`{evidence}",
        n.event.as_str(),
        text,
        n.kind,
        n.namespace,
        n.name,
        n.phase
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receiver(kind: ReceiverKind, template: Option<&str>) -> Receiver {
        Receiver {
            name: "r".into(),
            kind,
            url_file: None,
            secret_file: None,
            events: None,
            rollouts: None,
            template: template.map(str::to_string),
            per_minute: 20,
        }
    }

    fn notice(message: &str) -> Notice {
        Notice {
            event: Event::RolledBack,
            kind: "CanaryStatefulSet",
            namespace: "shop".into(),
            name: "redis".into(),
            phase: "RolledBack".into(),
            image: "redis:7.2".into(),
            message: message.into(),
            revision: Some("abc".into()),
            image_source: Some("r.example/web:1.1.0 from ImagePolicy web, commit 1a2b".into()),
            evidence: None,
        }
    }

    #[test]
    fn a_template_is_filled_once_and_unknown_braces_stay() {
        let r = receiver(
            ReceiverKind::Slack,
            Some("{event} {namespace}/{name} @ {revision} {nope} {message}"),
        );
        // A message with a placeholder in it is not filled again.
        let t = text(&r, &notice("it said {name}"));
        assert_eq!(t, "RolledBack shop/redis @ abc {nope} it said {name}");
        let plain = text(
            &receiver(ReceiverKind::Slack, None),
            &notice("analysis failed"),
        );
        assert_eq!(
            plain,
            "shop/redis: rolled back to redis:7.2. analysis failed"
        );
        let long = text(
            &receiver(ReceiverKind::Discord, None),
            &notice(&"x".repeat(5000)),
        );
        assert_eq!(long.chars().count(), MAX_TEXT_CHARS);
    }

    #[test]
    fn text_from_git_cannot_ping_or_link() {
        let n = notice("<!channel> see <https://evil|here> & @everyone");
        let r = receiver(ReceiverKind::Slack, Some("{message}"));
        let slack = body(&r, &n, &text(&r, &n));
        assert_eq!(
            slack["text"],
            "&lt;!channel&gt; see &lt;https://evil|here&gt; &amp; @everyone"
        );
        assert_eq!(slack["blocks"][0]["text"]["text"], slack["text"]);
        let r = receiver(ReceiverKind::Discord, Some("{message}"));
        let discord = body(&r, &n, &text(&r, &n));
        assert_eq!(discord["allowed_mentions"]["parse"], json!([]));
    }

    #[test]
    fn teams_gets_an_adaptive_card_and_a_webhook_gets_every_field() {
        let n = notice("m");
        let teams = body(&receiver(ReceiverKind::Teams, None), &n, "t");
        let card = &teams["attachments"][0];
        assert_eq!(
            card["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(card["content"]["type"], "AdaptiveCard");
        assert_eq!(card["content"]["body"][1]["text"], "t");
        let hook = body(&receiver(ReceiverKind::Webhook, None), &n, "t");
        assert_eq!(hook["event"], "RolledBack");
        assert_eq!(hook["namespace"], "shop");
        assert_eq!(hook["revision"], "abc");
        assert_eq!(
            hook["imageSource"],
            "r.example/web:1.1.0 from ImagePolicy web, commit 1a2b"
        );
        assert_eq!(hook["text"], "t");
    }

    #[test]
    fn the_evidence_goes_in_a_template_a_webhook_and_a_pull_request_comment() {
        let mut n = notice("m");
        let evidence = "- analysis background: Failed\n  - error-rate: Failed, last 0.31";
        n.evidence = Some(evidence.into());
        let r = receiver(ReceiverKind::Slack, Some("{name}: {evidence}"));
        assert_eq!(text(&r, &n), format!("redis: {evidence}"));
        let hook = body(&receiver(ReceiverKind::Webhook, None), &n, "t");
        assert_eq!(hook["evidence"], evidence);
        assert!(
            comment(&n, "t").ends_with(&format!("\n\nThe analysis:\n\n{evidence}")),
            "{}",
            comment(&n, "t")
        );
        n.evidence = None;
        assert!(!comment(&n, "t").contains("The analysis"));
    }
}
