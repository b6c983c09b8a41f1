//! A Slack incoming webhook's message for an event (pure): Block Kit
//! `blocks` (a header, a section with the run's fields and the detail, a
//! button to the run's page) and the `text` Slack shows where blocks are
//! not shown (notifications, screen readers).
//!
//! Slack's limits are kept: a header's text at most 150 characters, a
//! section's text 3,000, each field 2,000, a button's text 75 and its URL
//! 3,000. Text in `mrkdwn` has `&`, `<` and `>` escaped, so a run's name
//! cannot make a link or a mention.

use serde_json::{Value, json};
use trainstate_schema::api::NotifyEventKind;

use super::events::{Notice, truncated};

const MAX_HEADER_CHARS: usize = 150;
const MAX_SECTION_CHARS: usize = 3_000;
const MAX_FIELD_CHARS: usize = 2_000;
const MAX_URL_CHARS: usize = 3_000;

/// The message for `notice`.
pub(crate) fn message(notice: &Notice) -> Value {
    let event = &notice.event;
    let headline = headline(notice);
    let mut fields = vec![field("Status", &event.status.to_string()), field("Job", &event.job_id)];
    if let Some(cluster) = &event.cluster {
        fields.push(field("Cluster", cluster));
    }
    if let Some(health) = event.health {
        fields.push(field("Health", health.as_str()));
    }
    if let Some(cause) = &event.cause {
        fields.push(field("Cause", &format!("{} ({})", cause.kind, cause.class)));
    }
    if !event.ranks.is_empty() {
        let ranks: Vec<String> = event.ranks.iter().map(u32::to_string).collect();
        let mut text = ranks.join(", ");
        if let Some(node) = &event.node {
            text = format!("{text} (node {})", node.node_ip);
        }
        let label = if event.ranks.len() == 1 { "Rank" } else { "Ranks" };
        fields.push(field(label, &text));
    }
    if let Some(attempt) = &event.attempt_id {
        fields.push(field("Attempt", attempt));
    }
    let mut blocks = vec![
        json!({
            "type": "header",
            "text": {"type": "plain_text", "text": truncated(&headline, MAX_HEADER_CHARS), "emoji": true},
        }),
        json!({
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": truncated(&format!("*{}* `{}`\n{}", escape(&event.name), event.run_id, escape(&event.detail)), MAX_SECTION_CHARS),
            },
            "fields": fields,
        }),
    ];
    let link = event.link.as_deref().filter(|link| link.chars().count() <= MAX_URL_CHARS);
    if let Some(link) = link {
        blocks.push(json!({
            "type": "actions",
            "elements": [{
                "type": "button",
                "text": {"type": "plain_text", "text": "Open the run"},
                "url": link,
            }],
        }));
    }
    let mut text = format!("{}: {}", escape(&headline), escape(&event.detail));
    if let Some(link) = link {
        text = format!("{text} <{link}|Open the run>");
    }
    json!({ "text": text, "blocks": blocks })
}

/// `Run bert errored`, `Run bert stalled`: what happened, in a line.
fn headline(notice: &Notice) -> String {
    let event = &notice.event;
    let what = match event.event {
        NotifyEventKind::Errored => "errored",
        NotifyEventKind::Aborted => "was aborted",
        NotifyEventKind::Finished => "finished",
        NotifyEventKind::Stalled => "stalled",
        NotifyEventKind::Recovered => "advances again",
        NotifyEventKind::Restarting => "restarts",
        _ => "changed",
    };
    match &event.cluster {
        Some(cluster) => format!("Run {} {what} on {cluster}", event.name),
        None => format!("Run {} {what}", event.name),
    }
}

/// A section field: its label in bold, its value under it.
fn field(label: &str, value: &str) -> Value {
    json!({"type": "mrkdwn", "text": truncated(&format!("*{label}*\n{}", escape(value)), MAX_FIELD_CHARS)})
}

/// `text` with Slack's control characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use trainstate_schema::api::NotifyEvent;
    use trainstate_schema::{CauseKind, RunCause, RunStatus};

    use super::*;

    #[test]
    fn a_message_has_a_header_a_section_a_button_and_a_fallback_text() {
        let mut event = NotifyEvent::new(
            "r1:ERRORED",
            NotifyEventKind::Errored,
            "r1",
            "<!channel> bert",
            "j1",
            RunStatus::Errored,
            1,
        );
        event.detail = "rank 1 raised ValueError".into();
        event.ranks = vec![1];
        event.cause = Some(RunCause::new(CauseKind::Oom, Some(1)));
        event.link = Some("https://ts.example/runs/r1".into());
        let message = message(&Notice { event, ends_stall: None });
        let blocks = message["blocks"].as_array().unwrap();
        assert_eq!(blocks[0]["type"], "header");
        assert_eq!(blocks[0]["text"]["type"], "plain_text");
        let section = blocks[1]["text"]["text"].as_str().unwrap();
        assert!(section.contains("&lt;!channel&gt; bert"), "no mention from a run name: {section}");
        let fields = blocks[1]["fields"].as_array().unwrap();
        assert!(
            fields.iter().any(|f| f["text"] == "*Cause*\nOOM (INFRASTRUCTURE)"),
            "the cause's kind and class: {fields:?}"
        );
        assert_eq!(blocks[2]["elements"][0]["url"], "https://ts.example/runs/r1");
        let text = message["text"].as_str().unwrap();
        assert!(text.starts_with("Run &lt;!channel&gt; bert errored: rank 1 raised"), "{text}");
    }
}
