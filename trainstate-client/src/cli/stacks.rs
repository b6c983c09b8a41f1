//! `trainstate runs stacks RUN_ID [--capture] [--all]`: where every rank of
//! a run is stuck, from its newest stack capture: the suspects first, then
//! the groups of ranks stuck in the same place, then (with `--all`) every
//! rank's stack.

use std::time::Duration;

use trainstate_schema::RunId;
use trainstate_schema::api::{CaptureState, StackCapture, StacksRequest};
use trainstate_schema::text::escape_control;

use super::HeadArgs;
use super::runs::{table, unreachable_head};
use crate::{StateError, StateHandle};

/// How long `--capture` waits for its capture to complete: twice the
/// head's own deadline for the ranks' answers, so a capture the head
/// completes at its deadline is still printed complete.
const CAPTURE_WAIT: Duration = Duration::from_secs(40);

/// How often `--capture` looks whether its capture is complete.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// What `runs stacks` prints: the run's newest capture, or with `capture`
/// one it opens and waits for.
pub(super) async fn stacks(
    state: &StateHandle,
    head: &HeadArgs,
    id: &RunId,
    capture: bool,
    all: bool,
) -> Result<String, String> {
    let failed = |err: StateError| match err {
        // A refusal is the head's own words: one pending, too soon, ended.
        StateError::Conflict { reason, .. } | StateError::IllegalTransition { reason, .. } => {
            cell(&reason)
        }
        other => unreachable_head(&head.url, other),
    };
    let mut waited_out = false;
    let answer = if capture {
        let opened = state.post_stacks(id, StacksRequest::capture(None)).await.map_err(failed)?;
        let deadline = tokio::time::Instant::now() + CAPTURE_WAIT;
        loop {
            let mut answer = state.run_stacks(id).await.map_err(failed)?;
            // Print the capture asked for, whatever else the head keeps.
            answer.captures.retain(|c| c.capture_id == opened.capture_id);
            let complete =
                answer.captures.first().is_some_and(|c| c.state == CaptureState::Complete);
            if complete || tokio::time::Instant::now() + POLL_INTERVAL > deadline {
                waited_out = !complete;
                if answer.captures.is_empty() {
                    answer.captures.push(opened);
                }
                break answer;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    } else {
        state.run_stacks(id).await.map_err(failed)?
    };
    if head.json {
        return Ok(format!("{}\n", serde_json::to_string(&answer).expect("serializes")));
    }
    let Some(newest) = answer.captures.first() else {
        return Ok(format!(
            "no capture of run {id} yet; `trainstate runs stacks {id} --capture` asks for one\n"
        ));
    };
    let mut out = show(newest, all);
    if waited_out {
        out.push_str(&format!(
            "\nthe capture is still pending after {} s: shown as it stands\n",
            CAPTURE_WAIT.as_secs()
        ));
    }
    Ok(out)
}

/// One capture, for a person: when and why, the suspects, the groups,
/// and with `all` every rank's stack.
fn show(capture: &StackCapture, all: bool) -> String {
    let mut out = String::new();
    let line = |out: &mut String, key: &str, value: &str| {
        out.push_str(&format!("{key:<10}{}\n", cell(value)));
    };
    line(&mut out, "capture", &format!("{} (attempt {})", capture.capture_id, capture.attempt_id));
    line(&mut out, "when", &rfc3339(capture.at_ms));
    let trigger = serde_json::to_value(capture.trigger)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let why = match capture.reason.as_str() {
        "" => trigger,
        reason => format!("{trigger}: {reason}"),
    };
    line(&mut out, "why", &why);
    let answered = capture.ranks.iter().filter(|r| r.answered).count();
    let state = match capture.state {
        CaptureState::Pending => "PENDING",
        CaptureState::Complete => "COMPLETE",
        _ => "UNKNOWN",
    };
    line(
        &mut out,
        "state",
        &format!("{state} ({answered} of {} ranks answered)", capture.ranks.len()),
    );

    if capture.suspects.is_empty() {
        out.push_str("\nsuspects: none\n");
    } else {
        out.push_str("\nsuspects\n");
        let mut rows = vec![["RANK", "NODE", "INNERMOST FRAME"].map(String::from).to_vec()];
        for suspect in &capture.suspects {
            rows.push(vec![
                suspect.rank.to_string(),
                suspect.node.as_deref().map_or_else(|| "-".to_owned(), cell),
                cell(&suspect.innermost),
            ]);
        }
        out.push_str(&table(&rows));
    }

    if !capture.groups.is_empty() {
        out.push_str("\ngroups\n");
        let mut rows = vec![["GROUP", "RANKS", "INNERMOST FRAME"].map(String::from).to_vec()];
        for (index, group) in capture.groups.iter().enumerate() {
            let ranks: Vec<String> = group.ranks.iter().map(u32::to_string).collect();
            rows.push(vec![index.to_string(), ranks.join(","), cell(&group.innermost)]);
        }
        out.push_str(&table(&rows));
    }

    if all {
        for rank in &capture.ranks {
            let node = rank.node.as_deref().map(|n| format!(" on {}", cell(n))).unwrap_or_default();
            let source =
                rank.source.as_deref().map(|s| format!(", {}", cell(s))).unwrap_or_default();
            let truncated = if rank.truncated { ", truncated" } else { "" };
            out.push_str(&format!("\nrank {}{node}{source}{truncated}\n", rank.rank));
            if rank.answered {
                let stack = escape_control(&rank.stack);
                out.push_str(&stack);
                if !stack.ends_with('\n') {
                    out.push('\n');
                }
            } else {
                let note = rank.note.as_deref().map_or_else(|| "no answer".to_owned(), cell);
                out.push_str(&format!("no stack: {note}\n"));
            }
            if rank.answered
                && let Some(note) = &rank.note
            {
                out.push_str(&format!("note: {}\n", cell(note)));
            }
        }
    }
    out
}

/// `text` on one line of a table: control characters escaped, newlines
/// and tabs too.
fn cell(text: &str) -> String {
    escape_control(text).replace('\n', "\\n").replace('\t', "\\t")
}

/// `2025-10-09T08:53:20.000Z` from Unix milliseconds.
fn rfc3339(ms: u64) -> String {
    let civil = super::runs::utc(ms).replacen(' ', "T", 1);
    format!("{civil}.{:03}Z", ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainstate_schema::api::{CaptureTrigger, RankStack, StackGroup, StackSuspect};

    #[test]
    fn times_are_rfc_3339_in_utc() {
        assert_eq!(rfc3339(1_760_000_000_123), "2025-10-09T08:53:20.123Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn a_capture_prints_its_suspects_before_its_groups_and_escapes_stack_text() {
        let mut ranks: Vec<RankStack> =
            (0..3).map(|r| RankStack::unanswered(r, Some(format!("node-{r}")))).collect();
        ranks[0] = ranks[0].clone().with_report(
            trainstate_schema::api::RankStackReport::new(0, "py-spy", "a\u{1b}[31m\n\tb\n"),
            1,
        );
        let mut capture =
            StackCapture::new(4, "0", 1_760_000_000_000, CaptureTrigger::Requested, "", 0, ranks);
        capture.state = CaptureState::Complete;
        capture.groups = vec![StackGroup::new(vec![0], vec![], "f (x.py:1)".into())];
        capture.suspects = vec![StackSuspect::new(2, None, "no answer".into())];
        let text = show(&capture, true);
        let suspects = text.find("\nsuspects\n").unwrap();
        let groups = text.find("\ngroups\n").unwrap();
        assert!(suspects < groups, "{text}");
        assert!(text.contains("why       REQUESTED\n"), "{text}");
        assert!(text.contains("COMPLETE (1 of 3 ranks answered)"), "{text}");
        assert!(text.contains("a\\u{1b}[31m\n\tb\n"), "newline and tab kept, ESC escaped: {text}");
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(text.contains("rank 1 on node-1\nno stack: no answer\n"), "{text}");

        capture.suspects.clear();
        assert!(show(&capture, false).contains("\nsuspects: none\n"));
    }
}
