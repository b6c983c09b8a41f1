//! Listing runs: filters, keyset paging and the page that comes back.

pub use trainstate_schema::api::Cursor;
use trainstate_schema::api::{ListQuery, StatusFilter};
use trainstate_schema::{HealthState, RunStatus};

use crate::document::RunDocument;
use crate::error::StateError;

/// The largest page a list request may ask for.
pub use trainstate_schema::limits::MAX_PAGE_LIMIT;

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
    /// Only runs of this cluster.
    pub cluster: Option<String>,
    /// Only runs whose `health` is this state.
    pub health: Option<HealthState>,
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
            cluster: None,
            health: None,
            limit: Some(trainstate_schema::limits::DEFAULT_PAGE_LIMIT),
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

    /// Keeps only runs of `cluster`.
    pub fn cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = Some(cluster.into());
        self
    }

    /// Keeps only runs whose `health` is `state`.
    pub fn health(mut self, state: HealthState) -> Self {
        self.health = Some(state);
        self
    }

    /// The query of `GET /api/train/runs` that asks for this page, or
    /// `None` for an unpaged listing (Ray's route, which takes no filters).
    pub fn to_list_query(&self) -> Option<ListQuery> {
        let limit = self.limit?;
        let mut query = ListQuery::default();
        query.status = (!self.statuses.is_empty()).then(|| StatusFilter(self.statuses.clone()));
        query.job_id.clone_from(&self.job_id);
        query.name.clone_from(&self.name_contains);
        query.node_id.clone_from(&self.node_id);
        query.node_ip.clone_from(&self.node_ip);
        query.cluster.clone_from(&self.cluster);
        query.health = self.health;
        query.limit = Some(u32::try_from(limit).unwrap_or(u32::MAX));
        query.cursor.clone_from(&self.cursor);
        Some(query)
    }

    /// True when the query filters runs.
    pub fn has_filters(&self) -> bool {
        !self.statuses.is_empty()
            || self.job_id.is_some()
            || self.name_contains.is_some()
            || self.node_id.is_some()
            || self.node_ip.is_some()
            || self.cluster.is_some()
            || self.health.is_some()
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

impl TryFrom<ListQuery> for RunQuery {
    type Error = StateError;

    /// The page a `GET /api/train/runs` query asks for; a page size out of
    /// range is an error naming `limit`.
    fn try_from(query: ListQuery) -> Result<Self, StateError> {
        let defaults = RunQuery::new();
        let run_query = RunQuery {
            statuses: query.status.map(|s| s.0).unwrap_or_default(),
            job_id: query.job_id,
            name_contains: query.name,
            node_id: query.node_id,
            node_ip: query.node_ip,
            cluster: query.cluster,
            health: query.health,
            limit: query.limit.map_or(defaults.limit, |l| Some(l as usize)),
            cursor: query.cursor,
        };
        run_query.check()?;
        Ok(run_query)
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
