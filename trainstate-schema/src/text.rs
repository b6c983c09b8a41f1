//! Text helpers shared by every writer and display of runs.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::limits::MAX_TRACE_LEN;

/// The last `max_chars` characters of `text`, cut on a character boundary.
///
/// Characters are Unicode scalar values, as Python (and so Ray) counts them;
/// a multi-byte character is never split.
pub fn last_chars(text: &str, max_chars: usize) -> &str {
    if text.len() <= max_chars {
        return text;
    }
    match text.char_indices().rev().nth(max_chars.saturating_sub(1)) {
        Some((start, _)) if max_chars > 0 => &text[start..],
        Some(_) => "",
        None => text,
    }
}

/// The first `max_chars` characters of `text`, cut on a character boundary
/// (characters counted as [`last_chars`] counts them).
pub fn first_chars(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// The `status_detail` of an `ERRORED` run, in Ray's form.
///
/// With the failing rank: `Rank {rank} worker raised an error. \n{trace}`;
/// without one, the trace alone. The trace is cut to its last
/// [`MAX_TRACE_LEN`] characters, and NUL characters are dropped, so the
/// result always fits the `status_detail` rule.
pub fn errored_status_detail(rank: Option<u32>, trace: &str) -> String {
    let trace = last_chars(trace, MAX_TRACE_LEN);
    let mut detail = String::with_capacity(trace.len() + 40);
    if let Some(rank) = rank {
        let _ = writeln!(detail, "Rank {rank} worker raised an error. ");
    }
    detail.extend(trace.chars().filter(|&c| c != '\0'));
    detail
}

/// `text` with every control character but newline and tab escaped
/// (`\u{1b}` for ESC), for displays that must not let a status detail drive
/// the terminal or break a layout.
pub fn escape_control(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` in one line: its first non-empty line and, when it has more, its
/// last (where a Python traceback says what was raised), each trimmed,
/// joined by ` … `, then cut to [`MAX_CAUSE_REPORT_LEN`] characters.
///
/// [`MAX_CAUSE_REPORT_LEN`]: crate::limits::MAX_CAUSE_REPORT_LEN
pub fn one_line(text: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(first) = lines.next() else { return String::new() };
    let line = match lines.next_back() {
        Some(last) => format!("{first} … {last}"),
        None => first.to_owned(),
    };
    first_chars(&line, crate::limits::MAX_CAUSE_REPORT_LEN).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_chars_never_splits_a_character() {
        assert_eq!(first_chars("héllo", 2), "hé");
        assert_eq!(first_chars("héllo", 9), "héllo");
        assert_eq!(first_chars("héllo", 0), "");
    }

    #[test]
    fn last_chars_never_splits_a_character() {
        assert_eq!(last_chars("héllo", 4), "éllo");
        assert_eq!(last_chars("日本語", 2), "本語");
        assert_eq!(last_chars("abc", 0), "");
        assert_eq!(last_chars("abc", 10), "abc");
        assert_eq!(last_chars("ab日", 1), "日");
    }

    #[test]
    fn errored_detail_has_rays_prefix_and_cut_trace() {
        let detail = errored_status_detail(Some(3), "boom");
        assert_eq!(detail, "Rank 3 worker raised an error. \nboom");
        let long = "é".repeat(MAX_TRACE_LEN + 10);
        let detail = errored_status_detail(None, &long);
        assert_eq!(detail.chars().count(), MAX_TRACE_LEN);
    }

    #[test]
    fn escape_control_keeps_newlines_and_escapes_escape() {
        assert_eq!(escape_control("a\nb"), "a\nb");
        assert_eq!(escape_control("a\u{1b}[31m"), "a\\u{1b}[31m");
    }
}
