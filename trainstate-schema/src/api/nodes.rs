//! The documents of the node ledger: which nodes sat under runs, how often
//! a rank on each failed first, and which of them are suspects
//! (`GET /api/train/nodes`, `GET /api/train/nodes/{node}`).

use serde::{Deserialize, Serialize};

use crate::limits::MAX_NODE_NAME_LEN;
use crate::{CauseClass, CauseKind, Rule, RunId, ValidationError};

/// The window the node routes count in when none is given: 14 days.
pub const DEFAULT_NODE_WINDOW_MS: u64 = 14 * 24 * 60 * 60 * 1000;

/// Query of `GET /api/train/nodes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct NodesQuery {
    /// Count only what happened at or after this time: Unix ms, or an RFC
    /// 3339 instant (`2026-12-01T00:00:00Z`). 14 days before now when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// `true`: only the suspects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspect: Option<bool>,
    /// Only the nodes of this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// `exclude`: the suspects' names as one line of text, comma-separated
    /// (`node1,node3`), for a scheduler's exclude list (Slurm's `--exclude`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<NodesFormat>,
}

/// How `GET /api/train/nodes` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum NodesFormat {
    /// A `NodeListResponse` (the default).
    Json,
    /// The suspects' names, comma-separated, as `text/plain`.
    Exclude,
}

/// Query of `GET /api/train/nodes/{node}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct NodeQuery {
    /// As for `GET /api/train/nodes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Only the node of this name in this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// Failures a node is blamed for, by class of their cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct FailureCounts {
    /// Class `INFRASTRUCTURE`.
    pub infrastructure: u32,
    /// Class `APPLICATION`.
    pub application: u32,
    /// Class `INTERRUPTED`.
    pub interrupted: u32,
    /// Class `NO_PROGRESS`.
    pub no_progress: u32,
}

impl FailureCounts {
    /// The count of `class`.
    pub fn of(&self, class: CauseClass) -> u32 {
        match class {
            CauseClass::Infrastructure => self.infrastructure,
            CauseClass::Application => self.application,
            CauseClass::Interrupted => self.interrupted,
            CauseClass::NoProgress => self.no_progress,
        }
    }

    /// Counts one more failure of `class`.
    pub fn add(&mut self, class: CauseClass) {
        let count = match class {
            CauseClass::Infrastructure => &mut self.infrastructure,
            CauseClass::Application => &mut self.application,
            CauseClass::Interrupted => &mut self.interrupted,
            CauseClass::NoProgress => &mut self.no_progress,
        };
        *count += 1;
    }

    /// Every failure, whatever its class.
    pub fn total(&self) -> u32 {
        self.infrastructure + self.application + self.interrupted + self.no_progress
    }
}

/// One node as the ledger counts it within the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct NodeSummary {
    /// The node: its workers' `node_name` where they have one, else their
    /// `node_id`.
    pub node: String,
    /// The cluster its runs belong to; absent for runs of no cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Attempts that had a rank on the node.
    pub attempts: u32,
    /// Failures where a rank on this node failed first, or the node was
    /// lost, by class of their cause.
    pub failures: FailureCounts,
    /// Times a rank on the node was named a culprit of a stall.
    pub stall_suspect: u32,
    /// Times a rank on the node was named a straggler.
    pub straggler: u32,
    /// The last time anything on the node was recorded (Unix ms); absent
    /// when nothing was within the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_ms: Option<u64>,
    /// The verdict: true when the node is a suspect (see `docs/nodes.md`).
    pub suspect: bool,
    /// Why it is a suspect, in words; absent when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The answer of `GET /api/train/nodes`: suspects first, then by failures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct NodeListResponse {
    /// The start of the window counted (Unix ms).
    pub since_ms: u64,
    /// The oldest event the ledger still holds (Unix ms); absent when it
    /// holds none. Runs are evicted by retention: nothing before it is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained_since_ms: Option<u64>,
    /// True when the window starts before `retained_since_ms`: the counts
    /// are of what is retained, not of the whole window.
    pub beyond_retention: bool,
    /// The rule a suspect is named by, in words.
    pub rule: String,
    /// The nodes.
    pub nodes: Vec<NodeSummary>,
}

/// One failure blamed on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct NodeFailure {
    /// The run.
    pub run_id: RunId,
    /// The cause's kind.
    pub kind: CauseKind,
    /// The cause's class.
    pub class: CauseClass,
    /// When (Unix ms).
    pub at_ms: u64,
}

/// The runs behind a node's counts, newest first, at most
/// `MAX_NODE_RUNS_LISTED` each.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct NodeRuns {
    /// Runs with an attempt on the node.
    pub attempts: Vec<RunId>,
    /// The failures blamed on it.
    pub failures: Vec<NodeFailure>,
    /// Runs where a rank on it was named a culprit of a stall.
    pub stall_suspect: Vec<RunId>,
    /// Runs where a rank on it was named a straggler.
    pub straggler: Vec<RunId>,
}

/// One node with the runs behind its counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct NodeDetail {
    /// Its counts and verdict.
    #[serde(flatten)]
    pub summary: NodeSummary,
    /// The runs behind them.
    pub runs: NodeRuns,
}

/// The answer of `GET /api/train/nodes/{node}`: the node of that name in
/// each cluster it was seen in (one on a head of one cluster).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct NodeDetailResponse {
    /// The start of the window counted (Unix ms).
    pub since_ms: u64,
    /// As in `NodeListResponse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained_since_ms: Option<u64>,
    /// As in `NodeListResponse`.
    pub beyond_retention: bool,
    /// The node in each of its clusters.
    pub nodes: Vec<NodeDetail>,
}

/// Checks a node name a route was given: non-empty, at most
/// [`MAX_NODE_NAME_LEN`] characters, no control characters.
pub fn validate_node_name(field: &str, text: &str) -> Result<(), ValidationError> {
    if text.is_empty() {
        return Err(ValidationError::new(field, Rule::Empty));
    }
    if text.chars().count() > MAX_NODE_NAME_LEN {
        return Err(ValidationError::new(field, Rule::TooLong { max: MAX_NODE_NAME_LEN }));
    }
    if text.chars().any(char::is_control) {
        return Err(ValidationError::new(field, Rule::ControlCharacter));
    }
    Ok(())
}

/// Reads a time a route takes: Unix ms (digits), or an RFC 3339 instant
/// (`2026-12-01T00:00:00Z`, `2026-12-01T02:00:00.5+02:00`). The error says
/// what was expected.
pub fn parse_time_ms(text: &str) -> Result<u64, String> {
    const EXPECTED: &str =
        "expected Unix ms (digits) or an RFC 3339 instant such as 2026-12-01T00:00:00Z";
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u64>().map_err(|_| format!("{text:?} is too large; {EXPECTED}"));
    }
    rfc3339_ms(text).ok_or_else(|| format!("{text:?} is not a time; {EXPECTED}"))
}

/// An RFC 3339 instant as Unix ms; `None` when it is not one (or before 1970).
fn rfc3339_ms(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let len = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 {
            return None;
        }
        let padded: String = fraction[..len].chars().chain("000".chars()).take(3).collect();
        millis = padded.parse().ok()?;
        rest = &fraction[len..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            let hours: i64 = rest[1..3].parse().ok()?;
            let minutes: i64 = rest[4..6].parse().ok()?;
            sign * (hours * 60 + minutes)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    u64::try_from(seconds * 1_000 + millis).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_as_ms_or_rfc_3339() {
        assert_eq!(parse_time_ms("1764547200000"), Ok(1_764_547_200_000));
        assert_eq!(parse_time_ms("2025-12-01T00:00:00Z"), Ok(1_764_547_200_000));
        assert_eq!(parse_time_ms("2025-12-01T02:00:00.5+02:00"), Ok(1_764_547_200_500));
        assert_eq!(parse_time_ms("1970-01-01T00:00:00Z"), Ok(0));
        for bad in
            ["", "yesterday", "2025-13-01T00:00:00Z", "2025-12-01", "-5", "2025-12-01T00:00:00"]
        {
            let err = parse_time_ms(bad).unwrap_err();
            assert!(err.contains("RFC 3339"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn node_names_are_bounded_and_printable() {
        assert!(validate_node_name("node", "gpu-17").is_ok());
        let long = "n".repeat(MAX_NODE_NAME_LEN + 1);
        let err = validate_node_name("node", &long).unwrap_err();
        assert_eq!(err.rule(), &Rule::TooLong { max: MAX_NODE_NAME_LEN });
        assert_eq!(
            validate_node_name("node", "a\u{7}b").unwrap_err().rule(),
            &Rule::ControlCharacter
        );
        assert_eq!(validate_node_name("node", "").unwrap_err().rule(), &Rule::Empty);
    }
}
