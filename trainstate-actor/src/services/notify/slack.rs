//! A Slack incoming webhook's message for an event (pure): Block Kit
//! `blocks` (a header, a section with the run's fields and the detail, a
//! button to the run's page) and the `text` Slack shows where blocks are
//! not shown (notifications, screen readers).
//!
//! Slack's limits are kept: a header's text at most 150 characters, a
//! section's text 3,000, each field 2,000, a button's text 75 and its URL
//! 3,000.
//!
//! Every text the head did not write itself (a run's name, its job id and
//! cluster, the detail and the cause's report, node names, the frames of
//! a stall's suspects) can neither link, mention nor style, two ways:
//!
//! - In the blocks it is only ever in `plain_text` objects (the header,
//!   the section, its fields): Slack documents that markup is applied to a
//!   text object only when its type is `mrkdwn`.
//! - Everywhere (the blocks and the fallback `text`, which Slack always
//!   reads as `mrkdwn`), it is made inert ([`inert`]): `&`, `<` and `>` are
//!   escaped as Slack documents, so it makes no link or mention, and a
//!   word joiner (U+2060, invisible, no break) goes after the `:` of each
//!   `://` and on both sides of each `*`, `_`, `~` and `` ` ``, so that
//!   Slack finds neither a bare URL to link nor the word boundaries its
//!   styles need. Slack documents no escape for these; the word joiner is
//!   the character that keeps the text as it reads and as it wraps.

use serde_json::{Value, json};
use trainstate_schema::api::NotifyEventKind;

use super::events::{Notice, goodput_line, suspect_lines, truncated};
use trainstate_schema::text::one_line;

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
    if event.restart_loop {
        fields.push(field("Restart loop", "yes"));
    }
    let goodput = event.goodput.as_ref().and_then(goodput_line);
    if let Some(line) = &goodput {
        fields.push(field("Goodput", line));
    }
    let mut blocks = vec![
        json!({
            "type": "header",
            "text": {"type": "plain_text", "text": truncated(&inert(&headline), MAX_HEADER_CHARS), "emoji": false},
        }),
        json!({
            "type": "section",
            "text": {
                "type": "plain_text",
                "text": truncated(&format!("{} ({})\n{}", inert(&event.name), inert(&event.run_id), inert(&event.detail)), MAX_SECTION_CHARS),
                "emoji": false,
            },
            "fields": fields,
        }),
    ];
    let suspects = suspect_lines(event);
    if !suspects.is_empty() {
        blocks.push(json!({
            "type": "section",
            "text": {
                "type": "plain_text",
                "text": truncated(&format!("Suspects:\n{}", inert(&suspects.join("\n"))), MAX_SECTION_CHARS),
                "emoji": false,
            },
        }));
    }
    let fits = |url: &&str| url.chars().count() <= MAX_URL_CHARS;
    let link = event.link.as_deref().filter(fits);
    let stacks = event.stacks_url.as_deref().filter(fits);
    let buttons: Vec<Value> = [(link, "Open the run"), (stacks, "Open the stacks")]
        .into_iter()
        .filter_map(|(url, label)| {
            Some(json!({"type": "button", "text": {"type": "plain_text", "text": label}, "url": url?}))
        })
        .collect();
    if !buttons.is_empty() {
        blocks.push(json!({"type": "actions", "elements": buttons}));
    }
    let mut text = format!("{}: {}", inert(&headline), inert(&event.detail));
    if let Some(line) = &goodput {
        text = format!("{text} {}.", inert(line));
    }
    if !event.suspects.is_empty() {
        let named: Vec<String> = event
            .suspects
            .iter()
            .map(|s| match &s.node {
                Some(node) => {
                    format!("rank {} on {}: {}", s.rank, verbatim(node), verbatim(&s.innermost))
                }
                None => format!("rank {}: {}", s.rank, verbatim(&s.innermost)),
            })
            .collect();
        text = format!("{text} Suspects: {}", named.join("; "));
        if event.suspects_left_out > 0 {
            text = format!("{text}; and {} more.", event.suspects_left_out);
        }
    }
    if let Some(link) = link {
        text = format!("{text} <{link}|Open the run>");
    }
    if let Some(stacks) = stacks {
        text = format!("{text} <{stacks}|Open the stacks>");
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

/// A section field: its label, its value under it, as plain text.
fn field(label: &str, value: &str) -> Value {
    json!({"type": "plain_text", "text": truncated(&format!("{label}\n{}", inert(value)), MAX_FIELD_CHARS), "emoji": false})
}

/// The word joiner (U+2060): invisible, and no place to break a line.
const JOINER: char = '\u{2060}';

/// Untrusted `text` made inert for Slack (see the module's comment): `&`,
/// `<` and `>` escaped, a word joiner after the `:` of each `://` and on
/// both sides of each `*`, `_`, `~` and `` ` ``.
fn inert(text: &str) -> String {
    let escaped = text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let mut out = String::with_capacity(escaped.len() + 8);
    let mut rest = escaped.as_str();
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        match c {
            '*' | '_' | '~' | '`' => {
                out.push(JOINER);
                out.push(c);
                out.push(JOINER);
            }
            ':' if rest.starts_with("//") => {
                out.push(c);
                out.push(JOINER);
            }
            c => out.push(c),
        }
    }
    out
}

/// Untrusted `text` (a frame of a rank's stack) in `mrkdwn` as inline
/// code, in one line and inert: no link, mention or style comes of it
/// (a backquote, which would end the code, becomes a quote).
fn verbatim(text: &str) -> String {
    format!("`{}`", inert(&one_line(text).replace('`', "'")))
}

#[cfg(test)]
mod tests {
    use trainstate_schema::api::{NotifyEvent, StackSuspect};
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
        let message = message(&Notice { event, ends_stall: None, awaits_capture: false });
        let blocks = message["blocks"].as_array().unwrap();
        assert_eq!(blocks[0]["type"], "header");
        assert_eq!(blocks[0]["text"]["type"], "plain_text");
        let section = blocks[1]["text"]["text"].as_str().unwrap();
        assert!(section.contains("&lt;!channel&gt; bert"), "no mention from a run name: {section}");
        let fields = blocks[1]["fields"].as_array().unwrap();
        assert!(
            fields.iter().any(|f| f["text"] == "Cause\nOOM (INFRASTRUCTURE)"),
            "the cause's kind and class: {fields:?}"
        );
        assert_eq!(blocks[2]["elements"][0]["url"], "https://ts.example/runs/r1");
        let text = message["text"].as_str().unwrap();
        assert!(text.starts_with("Run &lt;!channel&gt; bert errored: rank 1 raised"), "{text}");
    }

    #[test]
    fn a_stalls_suspects_are_plain_text_and_its_capture_is_linked() {
        let mut event = NotifyEvent::new(
            "r1:STALLED:1",
            NotifyEventKind::Stalled,
            "r1",
            "bert",
            "j1",
            RunStatus::Running,
            1,
        );
        event.detail = "No rank has advanced for 1 min.".into();
        event.suspects = vec![
            StackSuspect::new(2, Some("node-a".into()), "rank_two_is_stuck (train.py:41)".into()),
            StackSuspect::new(3, Some("<!channel>".into()), "<http://x|y> *bold* _it_ `x`".into()),
        ];
        event.suspects_left_out = 4;
        event.link = Some("https://ts.example/runs/r1".into());
        event.stacks_url = Some("https://ts.example/api/train/runs/r1/stacks".into());
        let message = message(&Notice { event, ends_stall: None, awaits_capture: false });

        let text = message["text"].as_str().unwrap();
        assert!(
            text.contains(
                "Suspects: rank 2 on `node-a`: `rank\u{2060}_\u{2060}two\u{2060}_\u{2060}is\u{2060}_\u{2060}stuck (train.py:41)`; \
                 rank 3 on `&lt;!channel&gt;`: `&lt;http:\u{2060}//x|y&gt; \u{2060}*\u{2060}bold\u{2060}*\u{2060} \
                 \u{2060}_\u{2060}it\u{2060}_\u{2060} 'x'`; and 4 more."
            ),
            "frames as code, escaped: {text}"
        );
        assert!(!text.contains("<http://x") && !text.contains("<!channel>"), "{text}");
        assert!(
            text.ends_with(
                " <https://ts.example/runs/r1|Open the run> \
                 <https://ts.example/api/train/runs/r1/stacks|Open the stacks>"
            ),
            "{text}"
        );

        let blocks = message["blocks"].as_array().unwrap();
        let suspects = blocks
            .iter()
            .find(|b| b["text"]["text"].as_str().is_some_and(|t| t.starts_with("Suspects:")))
            .expect("a section of suspects");
        assert_eq!(suspects["text"]["type"], "plain_text", "no markup at all: {suspects}");
        assert_eq!(
            suspects["text"]["text"],
            "Suspects:\nrank 2 on node-a: rank\u{2060}_\u{2060}two\u{2060}_\u{2060}is\u{2060}_\u{2060}stuck \
             (train.py:41)\nrank 3 on &lt;!channel&gt;: &lt;http:\u{2060}//x|y&gt; \u{2060}*\u{2060}bold\u{2060}*\u{2060} \
             \u{2060}_\u{2060}it\u{2060}_\u{2060} \u{2060}`\u{2060}x\u{2060}`\u{2060}\nand 4 more (see the capture)"
        );
        let buttons = blocks.last().unwrap()["elements"].as_array().unwrap();
        assert_eq!(buttons[1]["url"], "https://ts.example/api/train/runs/r1/stacks");
        assert_eq!(buttons[1]["text"]["text"], "Open the stacks");
    }

    /// Every string of `value` but the buttons' `url`s, which are the
    /// head's own links, and the objects' `type`s.
    fn texts(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(text) => out.push(text.clone()),
            Value::Array(items) => items.iter().for_each(|v| texts(v, out)),
            Value::Object(map) => map
                .iter()
                .filter(|(k, _)| !["url", "type"].contains(&k.as_str()))
                .for_each(|(_, v)| texts(v, out)),
            _ => {}
        }
    }

    /// Round three: bare URLs and `*`, `_`, `~` in a run's name (and in
    /// the other texts the head passes on) became links and styles in a
    /// Slack alert.
    #[test]
    fn regression_slack_links_and_styles_from_a_runs_texts_are_inert() {
        let name = "*bold*_it_~s~ https://evil.example/x";
        let mut event = NotifyEvent::new(
            "r1:STALLED:1",
            NotifyEventKind::Stalled,
            "r1",
            name,
            "*job*",
            RunStatus::Running,
            1,
        );
        event.cluster = Some("_gpu_ http://c.example".into());
        event.detail = "see ~https://evil.example/d~ `now`".into();
        event.attempt_id = Some("*a*".into());
        event.ranks = vec![2];
        event.node = Some(trainstate_schema::api::NotifyNode::new(2, "*n*", "_10.0.0.2_"));
        event.suspects =
            vec![StackSuspect::new(2, Some("~node~".into()), "f (https://x.example/y)".into())];
        event.link = Some("https://ts.example/runs/r1".into());
        let message = message(&Notice { event, ends_stall: None, awaits_capture: false });

        // Slack applies markup only to `mrkdwn` text objects: none is sent.
        let json = message.to_string();
        assert!(!json.contains("\"mrkdwn\""), "no mrkdwn text object: {json}");
        let mut all = Vec::new();
        texts(&message, &mut all);
        for text in &all {
            // No bare URL for Slack to link: each `://` is broken by a word joiner.
            for at in text.match_indices("://").map(|(at, _)| at) {
                let before = &text[..at];
                let own = before.ends_with("<https") && text[at..].starts_with("://ts.example/");
                assert!(own, "a bare URL in {text:?}");
            }
            // No style: each `*`, `_`, `~` and `` ` `` has a word joiner on both sides.
            let chars: Vec<char> = text.chars().collect();
            for (i, c) in chars.iter().enumerate() {
                if matches!(c, '*' | '_' | '~' | '`') && !(text == &message["text"] && *c == '`') {
                    let joined =
                        i > 0 && chars[i - 1] == JOINER && chars.get(i + 1) == Some(&JOINER);
                    assert!(joined, "a bare {c:?} in {text:?}");
                }
            }
        }
        let header = message["blocks"][0]["text"]["text"].as_str().unwrap();
        assert_eq!(
            header.replace(JOINER, ""),
            format!("Run {name} stalled on _gpu_ http://c.example"),
            "the name still reads as it is"
        );
        let text = message["text"].as_str().unwrap();
        assert!(text.contains("https:\u{2060}//evil.example/x"), "{text}");
        assert!(
            text.ends_with(" <https://ts.example/runs/r1|Open the run>"),
            "the head's own link: {text}"
        );
    }
}
