//! The rules of the wire format, applied to drafts.
//!
//! Every check names the field by its path in the input document, so the
//! paths use the input's indexes (before workers are sorted by rank).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use crate::draft::TrainWorkerInfoDraft;
use crate::error::{Rule, ValidationError};
use crate::limits::{
    MAX_GPUS_PER_WORKER, MAX_NAME_LEN, MAX_PATH_LEN, MAX_RESOURCES_PER_WORKER,
    MAX_STATUS_DETAIL_LEN, MAX_WORKERS,
};
use crate::resources::Resources;
use crate::status::{CauseKind, RunCause};

/// Checks `text` against the rule of names and ids other than run ids
/// (`name`, `job_id`, `actor_id`, `node_id`, dataset names, resource names,
/// attempt ids...): non-empty, at most [`MAX_NAME_LEN`] characters, no
/// control characters. The error names `field`.
///
/// Use it to check a value before it goes into a draft, for example a
/// node id read from a file:
///
/// ```
/// use trainstate_schema::{Rule, validate_name};
///
/// assert!(validate_name("node_id", "4c4c4544-0042").is_ok());
/// let err = validate_name("node_id", "line\nbreak").unwrap_err();
/// assert_eq!(err.field(), "node_id");
/// assert_eq!(err.rule(), &Rule::ControlCharacter);
/// ```
pub fn validate_name(field: &str, text: &str) -> Result<(), ValidationError> {
    name(|| field.to_owned(), text)
}

/// Checks a name or non-run id: non-empty, at most [`MAX_NAME_LEN`]
/// characters, no control characters.
pub(crate) fn name(path: impl FnOnce() -> String, text: &str) -> Result<(), ValidationError> {
    bounded_text(path, text, MAX_NAME_LEN)
}

/// Checks a file path: non-empty, at most [`MAX_PATH_LEN`] characters, no
/// control characters.
pub(crate) fn file_path(path: impl FnOnce() -> String, text: &str) -> Result<(), ValidationError> {
    bounded_text(path, text, MAX_PATH_LEN)
}

fn bounded_text(
    path: impl FnOnce() -> String,
    text: &str,
    max: usize,
) -> Result<(), ValidationError> {
    let rule = if text.is_empty() {
        Some(Rule::Empty)
    } else if text.len() > max && text.chars().count() > max {
        Some(Rule::TooLong { max })
    } else if text.chars().any(char::is_control) {
        Some(Rule::ControlCharacter)
    } else {
        None
    };
    match rule {
        Some(rule) => Err(ValidationError::new(path(), rule)),
        None => Ok(()),
    }
}

/// Checks that a time (Unix ms) at `path` is plausible:
/// [`MIN_TIME_MS`](crate::limits::MIN_TIME_MS)..=[`MAX_TIME_MS`](crate::limits::MAX_TIME_MS).
pub fn validate_time(path: &str, time_ms: u64) -> Result<(), ValidationError> {
    if (crate::limits::MIN_TIME_MS..=crate::limits::MAX_TIME_MS).contains(&time_ms) {
        Ok(())
    } else {
        Err(ValidationError::new(path, Rule::ImplausibleTime))
    }
}

/// Checks a cause a client writes for a run of `workers` workers (none
/// known: 0) that ends `status`: only on `ERRORED` or `ABORTED`, never
/// `LOST_CONTROLLER`, and a `failed_world_rank` among the run's ranks.
pub fn validate_client_cause(
    path: &str,
    cause: Option<RunCause>,
    failed: bool,
    workers: usize,
) -> Result<(), ValidationError> {
    let Some(cause) = cause else { return Ok(()) };
    if !failed {
        return Err(ValidationError::new(path, Rule::CauseWithoutFailure));
    }
    if cause.kind == CauseKind::LostController {
        return Err(ValidationError::new(format!("{path}.kind"), Rule::CauseReservedForHead));
    }
    if let Some(report) = &cause.report
        && report.chars().count() > crate::limits::MAX_CAUSE_REPORT_LEN
    {
        return Err(ValidationError::new(
            format!("{path}.report"),
            Rule::TooLong { max: crate::limits::MAX_CAUSE_REPORT_LEN },
        ));
    }
    if let Some(rank) =
        cause.failed_world_rank.filter(|&rank| workers > 0 && rank as usize >= workers)
    {
        return Err(ValidationError::new(
            format!("{path}.failed_world_rank"),
            Rule::FailedRankOutOfRange { rank, workers },
        ));
    }
    Ok(())
}

/// Checks a `status_detail`: any text but NUL, at most
/// [`MAX_STATUS_DETAIL_LEN`] characters.
pub(crate) fn status_detail(text: &str) -> Result<(), ValidationError> {
    if text.contains('\0') {
        return Err(ValidationError::new("status_detail", Rule::NulCharacter));
    }
    if text.len() > MAX_STATUS_DETAIL_LEN && text.chars().count() > MAX_STATUS_DETAIL_LEN {
        return Err(ValidationError::new(
            "status_detail",
            Rule::TooLong { max: MAX_STATUS_DETAIL_LEN },
        ));
    }
    Ok(())
}

/// Checks the rules of one worker on its own.
pub(crate) fn worker(prefix: &str, w: &TrainWorkerInfoDraft) -> Result<(), ValidationError> {
    name(|| format!("{prefix}actor_id"), &w.actor_id)?;
    name(|| format!("{prefix}node_id"), &w.node_id)?;
    if w.node_ip.parse::<IpAddr>().is_err() {
        return Err(ValidationError::new(format!("{prefix}node_ip"), Rule::IpAddress));
    }
    if w.pid == 0 {
        return Err(ValidationError::new(format!("{prefix}pid"), Rule::PidZero));
    }
    if w.gpu_ids.len() > MAX_GPUS_PER_WORKER {
        return Err(ValidationError::new(
            format!("{prefix}gpu_ids"),
            Rule::TooMany { max: MAX_GPUS_PER_WORKER },
        ));
    }
    let mut seen = HashSet::with_capacity(w.gpu_ids.len());
    for (j, &gpu_id) in w.gpu_ids.iter().enumerate() {
        if !seen.insert(gpu_id) {
            return Err(ValidationError::new(
                format!("{prefix}gpu_ids[{j}]"),
                Rule::DuplicateGpuId { gpu_id },
            ));
        }
    }
    resources(&format!("{prefix}resources"), &w.resources)?;
    if let Some(log) = &w.worker_log_file_path {
        file_path(|| format!("{prefix}worker_log_file_path"), log)?;
    }
    if let Some(node_name) = &w.node_name {
        name(|| format!("{prefix}node_name"), node_name)?;
    }
    Ok(())
}

fn resources(path: &str, resources: &Resources) -> Result<(), ValidationError> {
    if resources.len() > MAX_RESOURCES_PER_WORKER {
        return Err(ValidationError::new(path, Rule::TooMany { max: MAX_RESOURCES_PER_WORKER }));
    }
    for (key, amount) in resources.iter() {
        name(|| format!("{path}.{key}"), key)?;
        if !amount.is_finite() {
            return Err(ValidationError::new(format!("{path}.{key}"), Rule::NotFinite));
        }
        if amount < 0.0 {
            return Err(ValidationError::new(format!("{path}.{key}"), Rule::Negative));
        }
    }
    Ok(())
}

/// What the rules across workers read of each worker: a draft or a
/// validated worker.
pub(crate) trait Placement {
    fn world_rank(&self) -> u32;
    fn local_rank(&self) -> u32;
    fn node_rank(&self) -> u32;
    fn node_id(&self) -> &str;
}

impl Placement for TrainWorkerInfoDraft {
    fn world_rank(&self) -> u32 {
        self.world_rank
    }
    fn local_rank(&self) -> u32 {
        self.local_rank
    }
    fn node_rank(&self) -> u32 {
        self.node_rank
    }
    fn node_id(&self) -> &str {
        &self.node_id
    }
}

/// Checks a list of workers (the run's, or an attempt's) and returns their
/// input indexes in world-rank order. `each` checks the rules of worker `i`
/// on its own, before its world rank.
///
/// Rules: each worker on its own; world ranks are exactly 0..n-1; on each
/// node, local ranks are unique and one node rank is used; distinct nodes
/// have distinct node ranks.
pub(crate) fn workers<W: Placement>(
    prefix: &str,
    workers: &[W],
    mut each: impl FnMut(usize, &W) -> Result<(), ValidationError>,
) -> Result<Vec<usize>, ValidationError> {
    let n = workers.len();
    if n > MAX_WORKERS {
        return Err(ValidationError::new(prefix, Rule::TooMany { max: MAX_WORKERS }));
    }
    let mut by_rank: Vec<Option<usize>> = vec![None; n];
    for (i, w) in workers.iter().enumerate() {
        each(i, w)?;
        let rank = w.world_rank();
        let slot = by_rank.get_mut(rank as usize).ok_or_else(|| {
            ValidationError::new(
                format!("{prefix}[{i}].world_rank"),
                Rule::WorldRankOutOfRange { rank, workers: n },
            )
        })?;
        if slot.is_some() {
            return Err(ValidationError::new(
                format!("{prefix}[{i}].world_rank"),
                Rule::DuplicateWorldRank { rank },
            ));
        }
        *slot = Some(i);
    }

    struct Node {
        node_rank: u32,
        local_ranks: HashSet<u32>,
    }
    let mut nodes: HashMap<&str, Node> = HashMap::new();
    let mut node_of_rank: HashMap<u32, &str> = HashMap::new();
    for (i, w) in workers.iter().enumerate() {
        let node = nodes
            .entry(w.node_id())
            .or_insert_with(|| Node { node_rank: w.node_rank(), local_ranks: HashSet::new() });
        if node.node_rank != w.node_rank() {
            return Err(ValidationError::new(
                format!("{prefix}[{i}].node_rank"),
                Rule::InconsistentNodeRank { expected: node.node_rank },
            ));
        }
        if !node.local_ranks.insert(w.local_rank()) {
            return Err(ValidationError::new(
                format!("{prefix}[{i}].local_rank"),
                Rule::DuplicateLocalRank { rank: w.local_rank() },
            ));
        }
        let owner = node_of_rank.entry(w.node_rank()).or_insert(w.node_id());
        if *owner != w.node_id() {
            return Err(ValidationError::new(
                format!("{prefix}[{i}].node_rank"),
                Rule::NodeRankShared { rank: w.node_rank() },
            ));
        }
    }

    // Every slot is filled: n workers, n distinct ranks below n.
    Ok(by_rank.into_iter().flatten().collect())
}
