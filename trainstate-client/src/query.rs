//! Listing runs: filters, keyset paging and the page that comes back.

use std::fmt::Write as _;

use trainstate_schema::{RunId, RunStatus};

use crate::error::StateError;
use crate::protocol::RunDocument;

/// The largest page a list request may ask for.
pub const MAX_PAGE_LIMIT: usize = 1_000;

/// Which runs to list, and which page. Runs are ordered by
/// (`start_time_ms` desc, `id` desc).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunQuery {
    /// Only runs with one of these statuses; empty means any.
    pub statuses: Vec<RunStatus>,
    /// Only runs of this job.
    pub job_id: Option<String>,
    /// Only runs whose name contains this text.
    pub name_contains: Option<String>,
    /// Only runs that had a worker (in any attempt) on this node id.
    pub node_id: Option<String>,
    /// Only runs that had a worker (in any attempt) on this node IP.
    pub node_ip: Option<String>,
    /// Page size, 1..=[`MAX_PAGE_LIMIT`]; `None` lists every matching run
    /// in one page (Ray's unpaged route).
    pub limit: Option<usize>,
    /// Continue after this position (from the previous page's `next_cursor`).
    pub cursor: Option<Cursor>,
}

impl Default for RunQuery {
    fn default() -> Self {
        Self {
            statuses: Vec::new(),
            job_id: None,
            name_contains: None,
            node_id: None,
            node_ip: None,
            limit: Some(100),
            cursor: None,
        }
    }
}

impl RunQuery {
    /// The first page of 100 runs, unfiltered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every run, unpaged.
    pub fn all() -> Self {
        Self { limit: None, ..Self::default() }
    }

    /// Sets the page size.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Continues after `cursor`.
    pub fn after(mut self, cursor: Cursor) -> Self {
        self.cursor = Some(cursor);
        self
    }

    /// Keeps only runs with one of `statuses`.
    pub fn statuses(mut self, statuses: impl IntoIterator<Item = RunStatus>) -> Self {
        self.statuses = statuses.into_iter().collect();
        self
    }

    /// Keeps only runs of `job_id`.
    pub fn job_id(mut self, job_id: impl Into<String>) -> Self {
        self.job_id = Some(job_id.into());
        self
    }

    /// Keeps only runs whose name contains `text`.
    pub fn name_contains(mut self, text: impl Into<String>) -> Self {
        self.name_contains = Some(text.into());
        self
    }

    /// Keeps only runs that had a worker on `node_id`.
    pub fn node_id(mut self, node_id: impl Into<String>) -> Self {
        self.node_id = Some(node_id.into());
        self
    }

    /// Keeps only runs that had a worker on `node_ip`.
    pub fn node_ip(mut self, node_ip: impl Into<String>) -> Self {
        self.node_ip = Some(node_ip.into());
        self
    }

    /// Checks the page size.
    pub fn check(&self) -> Result<(), StateError> {
        match self.limit {
            Some(limit) if limit == 0 || limit > MAX_PAGE_LIMIT => {
                Err(StateError::invalid("limit", format!("must be between 1 and {MAX_PAGE_LIMIT}")))
            }
            _ => Ok(()),
        }
    }
}

/// A position in the listing order: the last (`start_time_ms`, `id`) of a
/// page. Opaque on the wire.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    /// `start_time_ms` of the last run of the page.
    pub start_time_ms: u64,
    /// `id` of the last run of the page.
    pub id: RunId,
}

impl Cursor {
    /// The cursor after the run started at `start_time_ms` with `id`.
    pub fn new(start_time_ms: u64, id: RunId) -> Self {
        Self { start_time_ms, id }
    }

    /// The opaque text form.
    pub fn encode(&self) -> String {
        let plain = format!("{}.{}", self.start_time_ms, self.id);
        let mut out = String::with_capacity(plain.len() * 2);
        for byte in plain.bytes() {
            let _ = write!(out, "{byte:02x}");
        }
        out
    }

    /// Reads the opaque text form.
    pub fn decode(text: &str) -> Result<Self, StateError> {
        let bad = || StateError::invalid("cursor", "must be a next_cursor returned by a listing");
        if !text.len().is_multiple_of(2) || text.len() > 600 {
            return Err(bad());
        }
        let bytes: Vec<u8> = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(text.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        let plain = String::from_utf8(bytes).map_err(|_| bad())?;
        let (start, id) = plain.split_once('.').ok_or_else(bad)?;
        Ok(Self {
            start_time_ms: start.parse().map_err(|_| bad())?,
            id: RunId::parse(id).map_err(|_| bad())?,
        })
    }
}

/// One page of a listing.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunPage {
    /// The runs of the page, newest first.
    pub runs: Vec<RunDocument>,
    /// The cursor of the next page; `None` on the last page.
    pub next_cursor: Option<Cursor>,
    /// How many runs matched the filters in all.
    pub total: usize,
}

impl RunPage {
    /// A page.
    pub fn new(runs: Vec<RunDocument>, next_cursor: Option<Cursor>, total: usize) -> Self {
        Self { runs, next_cursor, total }
    }
}
