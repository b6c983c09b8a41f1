//! Metric histories in the store: the rule that bounds a series, and what
//! every store shares to keep and read them.
//!
//! A rank's heartbeat carries its latest scalars; the connection that takes
//! it adds a point per metric to its rank board's pending points (memory,
//! bounded), and the writer thread hands what is pending to the store about
//! once a second ([`MetricBatch`], never one write per report). The store
//! keeps each series of a run's attempt bounded by [`SeriesState`]: at most
//! [`MAX_METRIC_POINTS`] points, decimated as it grows. Reads come from the
//! store on demand ([`MetricReader`]), on a connection of their own, so the
//! head keeps no history in memory and a restart keeps every point flushed
//! before it.
//!
//! A run's histories are bounded per run, across its attempts
//! ([`HistoryBound`]): together they keep at most what one attempt's may
//! (every name a run may report, each at [`MAX_METRIC_POINTS`]), and never
//! more than the retained bytes (`--max-retained-bytes`). When a flush
//! brings a run's histories past the bound, the histories of its attempts
//! older than the one whose points are flushed give way, whole, the oldest
//! first ([`attempts_giving_way`]); the attempt written to is never cut for
//! them. What a run's histories take ([`HISTORY_POINT_BYTES`] a point
//! kept) counts against the retained bytes, beside its JSON and its stack
//! captures, so evicting an ended run frees its histories too.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use trainstate_schema::RunId;
use trainstate_schema::api::{MetricPoint, MetricSeries, MetricsQuery};
use trainstate_schema::limits::{MAX_METRIC_NAMES_PER_RUN, MAX_METRIC_POINTS};

pub(crate) use crate::decisions::progress::MetricBatch;
use crate::store::stacks::{CaptureReader, MemoryCaptures, StoredCapture};

/// The bytes one point of a metric history is counted for against the
/// retained bytes: about what a row of it takes in SQLite (its series,
/// sequence number, rank, step and value, with the row's and the index's
/// overhead), rounded up.
pub const HISTORY_POINT_BYTES: u64 = 48;

/// The bound on one run's metric histories, all its attempts together, in
/// points kept: what one attempt's histories may hold (every name a run may
/// report, [`MAX_METRIC_NAMES_PER_RUN`], each at [`MAX_METRIC_POINTS`]),
/// and no more than `max_retained_bytes` take at [`HISTORY_POINT_BYTES`]
/// a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HistoryBound {
    pub(crate) points: u64,
}

impl HistoryBound {
    /// The bound on a run's histories of a head that keeps at most
    /// `max_retained_bytes` of runs.
    pub(crate) fn new(max_retained_bytes: u64) -> Self {
        let one_attempt = (MAX_METRIC_NAMES_PER_RUN * MAX_METRIC_POINTS) as u64;
        Self { points: one_attempt.min(max_retained_bytes / HISTORY_POINT_BYTES) }
    }
}

impl Default for HistoryBound {
    fn default() -> Self {
        Self::new(crate::decisions::retention::DEFAULT_MAX_RETAINED_BYTES)
    }
}

/// Which attempts' histories give way after a flush of attempt `writing`'s
/// points: `attempts` are a run's attempts with histories, the oldest
/// first (the order their first series were created in), each with the
/// points it keeps. While the run keeps more points than `bound`, the
/// oldest attempt older than `writing` gives way, whole. `writing` itself,
/// and any attempt newer than it (a late flush of an attempt already
/// replaced never removes its successor's points), is never cut: so the
/// newest attempt keeps every point it reported, up to its own series'
/// bounds. Returns the attempts to delete, oldest first.
pub(crate) fn attempts_giving_way<'a>(
    attempts: &'a [(String, u64)],
    writing: &str,
    bound: HistoryBound,
) -> Vec<&'a str> {
    let mut total: u64 = attempts.iter().map(|(_, kept)| kept).sum();
    let mut gone = Vec::new();
    for (attempt, kept) in attempts {
        if total <= bound.points || attempt == writing {
            break;
        }
        total -= kept;
        gone.push(attempt.as_str());
    }
    gone
}

/// The last progress a run's ranks reported before their board went away:
/// the attempt it is of, and `rank_progress` as served, in JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LastProgress {
    pub(crate) attempt_id: String,
    pub(crate) json: String,
}

/// Reads metric histories from the store, on a connection of its own (never
/// the writer's): callable from any thread, blocking. The same connection
/// reads stack captures ([`CaptureReader`]).
pub(crate) trait MetricReader: CaptureReader + Send + Sync {
    /// The series of run `run`'s attempt `attempt` that `query` selects, by
    /// name, each in the order its points were reported.
    fn read(
        &self,
        run: &RunId,
        attempt: &str,
        query: &MetricsQuery,
    ) -> Result<Vec<MetricSeries>, String>;

    /// The last progress of run `run`'s ranks kept when their board went
    /// away, if any.
    fn last_progress(&self, run: &RunId) -> Result<Option<LastProgress>, String>;

    /// The bytes of histories each run keeps, all its attempts together
    /// ([`HISTORY_POINT_BYTES`] a point): what a head that loads the store
    /// counts against the retained bytes.
    fn history_bytes(&self) -> Result<Vec<(RunId, u64)>, String>;
}

/// Where one series stands: how many points it was offered, which it keeps.
///
/// The `seq`-th point offered (from 0) is kept while `seq` is a multiple of
/// `stride`. When a point would make [`MAX_METRIC_POINTS`], the stride
/// doubles and the points whose `seq` is not a multiple of the new stride
/// are deleted: half of them. So a series spans its whole attempt, at a
/// grain that halves each time it fills, and the points kept are a
/// function of the points offered alone (the same after a restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeriesState {
    pub(crate) stride: u64,
    pub(crate) seen: u64,
    pub(crate) kept: u64,
}

impl Default for SeriesState {
    fn default() -> Self {
        Self { stride: 1, seen: 0, kept: 0 }
    }
}

/// What the store does with one point offered to a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    /// First delete the series' points whose `seq` is not a multiple of this.
    pub(crate) thin_to: Option<u64>,
    /// Then insert the point at this `seq` (`None`: it is not kept).
    pub(crate) insert: Option<u64>,
}

impl SeriesState {
    /// Offers the series its next point; says what to change.
    pub(crate) fn offer(&mut self) -> Offer {
        self.stride = self.stride.max(1);
        let seq = self.seen;
        self.seen += 1;
        if !seq.is_multiple_of(self.stride) {
            return Offer { thin_to: None, insert: None };
        }
        let mut thin_to = None;
        if self.kept >= MAX_METRIC_POINTS as u64 {
            self.stride *= 2;
            // The multiples of the new stride below `seq` are what is left.
            self.kept = seq.div_ceil(self.stride);
            thin_to = Some(self.stride);
        }
        let insert = seq.is_multiple_of(self.stride).then(|| {
            self.kept += 1;
            seq
        });
        Offer { thin_to, insert }
    }
}

/// The metric histories of the memory-only store, shared with its reader.
#[derive(Default, Clone)]
pub(crate) struct MemoryHistories {
    /// Each attempt's series, with the order its first series was created
    /// in (what "oldest" means for [`attempts_giving_way`]).
    series: Arc<Mutex<BTreeMap<AttemptKey, (u64, AttemptSeries)>>>,
    created: Arc<std::sync::atomic::AtomicU64>,
    last: Arc<Mutex<BTreeMap<RunId, LastProgress>>>,
    /// The stack captures, read by the same reader.
    pub(crate) captures: MemoryCaptures,
}

/// A run's attempt: its run id and attempt id.
type AttemptKey = (RunId, Box<str>);

/// The series of one run's attempt, by name: each one's state and points.
type AttemptSeries = BTreeMap<Arc<str>, (SeriesState, Vec<(u64, MetricPoint)>)>;

impl MemoryHistories {
    /// Adds the points of `batches`, each series and each run's histories
    /// bounded as a store bounds them; answers the bytes of histories each
    /// run written to keeps now.
    pub(crate) fn append(&self, batches: &[MetricBatch], bound: HistoryBound) -> Vec<(RunId, u64)> {
        let mut all = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept_by_run = BTreeMap::new();
        for batch in batches {
            if let Some(json) = &batch.last_progress {
                let last = LastProgress {
                    attempt_id: batch.attempt_id.to_string(),
                    json: json.to_string(),
                };
                self.last
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(batch.run_id.clone(), last);
            }
            let created = &self.created;
            let (_, run) = all
                .entry((batch.run_id.clone(), batch.attempt_id.clone()))
                .or_insert_with(|| (created.fetch_add(1, Ordering::Relaxed), BTreeMap::new()));
            for named in &batch.points {
                let (state, points) = run.entry(named.name.clone()).or_default();
                let offer = state.offer();
                if let Some(stride) = offer.thin_to {
                    points.retain(|(seq, _)| seq.is_multiple_of(stride));
                }
                if let Some(seq) = offer.insert {
                    points.push((seq, named.point));
                }
            }
            // The run's histories, all attempts together, within the bound.
            let mut attempts: Vec<(u64, String, u64)> = all
                .iter()
                .filter(|((run, _), _)| *run == batch.run_id)
                .map(|((_, attempt), (order, series))| {
                    let kept = series.values().map(|(state, _)| state.kept).sum();
                    (*order, attempt.to_string(), kept)
                })
                .collect();
            attempts.sort();
            let kept: Vec<(String, u64)> =
                attempts.into_iter().map(|(_, attempt, kept)| (attempt, kept)).collect();
            let gone = attempts_giving_way(&kept, &batch.attempt_id, bound);
            for old in &gone {
                all.remove(&(batch.run_id.clone(), Box::from(*old)));
            }
            let left = kept.iter().filter(|(a, _)| !gone.contains(&a.as_str())).map(|(_, k)| k);
            kept_by_run.insert(batch.run_id.clone(), left.sum::<u64>() * HISTORY_POINT_BYTES);
        }
        kept_by_run.into_iter().collect()
    }

    /// Forgets every series of run `id`.
    pub(crate) fn delete(&self, id: &RunId) {
        self.series.lock().unwrap_or_else(|e| e.into_inner()).retain(|(run, _), _| run != id);
        self.last.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        self.captures.delete(id);
    }
}

impl CaptureReader for MemoryHistories {
    fn captures(&self, run: &RunId) -> Result<Vec<trainstate_schema::api::StackCapture>, String> {
        self.captures.captures(run)
    }

    fn capture_index(&self) -> Result<Vec<StoredCapture>, String> {
        self.captures.capture_index()
    }
}

impl MetricReader for MemoryHistories {
    fn read(
        &self,
        run: &RunId,
        attempt: &str,
        query: &MetricsQuery,
    ) -> Result<Vec<MetricSeries>, String> {
        let all = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, series)) = all.get(&(run.clone(), attempt.into())) else {
            return Ok(Vec::new());
        };
        Ok(series
            .iter()
            .filter(|(name, _)| query.name.as_deref().is_none_or(|n| n == &***name))
            .map(|(name, (_, points))| {
                let kept = points.iter().map(|(_, p)| *p).filter(|p| selects(query, p)).collect();
                MetricSeries::new(name.to_string(), kept)
            })
            .collect())
    }

    fn last_progress(&self, run: &RunId) -> Result<Option<LastProgress>, String> {
        Ok(self.last.lock().unwrap_or_else(|e| e.into_inner()).get(run).cloned())
    }

    fn history_bytes(&self) -> Result<Vec<(RunId, u64)>, String> {
        let all = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let mut bytes: BTreeMap<RunId, u64> = BTreeMap::new();
        for ((run, _), (_, series)) in all.iter() {
            let kept: u64 = series.values().map(|(state, _)| state.kept).sum();
            *bytes.entry(run.clone()).or_default() += kept * HISTORY_POINT_BYTES;
        }
        Ok(bytes.into_iter().collect())
    }
}

/// True when `query` selects `point` (its rank and range of steps).
pub(crate) fn selects(query: &MetricsQuery, point: &MetricPoint) -> bool {
    query.rank.is_none_or(|rank| point.rank == rank)
        && query.from_step.is_none_or(|from| point.step >= from)
        && query.to_step.is_none_or(|to| point.step <= to)
}

/// Groups rows `(name, point)` in name order into series (rows come sorted
/// by name, then by `seq`).
pub(crate) fn into_series(
    rows: impl IntoIterator<Item = (String, MetricPoint)>,
) -> Vec<MetricSeries> {
    let mut series: Vec<MetricSeries> = Vec::new();
    for (name, point) in rows {
        match series.last_mut() {
            Some(last) if last.name == name => last.points.push(point),
            _ => series.push(MetricSeries::new(name, vec![point])),
        }
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_after(offers: u64) -> (SeriesState, Vec<u64>) {
        let mut state = SeriesState::default();
        let mut kept = Vec::new();
        for _ in 0..offers {
            let offer = state.offer();
            if let Some(stride) = offer.thin_to {
                kept.retain(|seq: &u64| seq.is_multiple_of(stride));
            }
            kept.extend(offer.insert);
        }
        (state, kept)
    }

    #[test]
    fn a_series_keeps_every_point_until_it_is_full() {
        let (state, kept) = kept_after(MAX_METRIC_POINTS as u64);
        assert_eq!(kept, (0..MAX_METRIC_POINTS as u64).collect::<Vec<_>>());
        assert_eq!(state, SeriesState { stride: 1, seen: 1_000, kept: 1_000 });
    }

    #[test]
    fn a_full_series_halves_and_spans_every_point_offered() {
        for offers in [1_001, 1_999, 2_000, 2_001, 10_000, 123_457] {
            let (state, kept) = kept_after(offers);
            assert!(kept.len() <= MAX_METRIC_POINTS, "{offers}: {}", kept.len());
            assert!(kept.len() > MAX_METRIC_POINTS / 2, "{offers}: {}", kept.len());
            assert_eq!(state.kept, kept.len() as u64, "{offers}");
            assert_eq!(kept[0], 0);
            assert!(offers - 1 - kept.last().unwrap() < state.stride, "{offers}");
            assert!(kept.iter().all(|seq| seq.is_multiple_of(state.stride)), "{offers}");
            assert!(kept.windows(2).all(|w| w[1] - w[0] == state.stride), "{offers}");
        }
    }

    #[test]
    fn the_oldest_attempts_give_way_and_the_one_written_never_does() {
        let bound = HistoryBound { points: 2_000 };
        let attempts: Vec<(String, u64)> =
            [("0", 800), ("1", 800), ("2", 800)].map(|(a, k)| (a.to_owned(), k)).into();
        assert_eq!(attempts_giving_way(&attempts, "2", bound), ["0"]);
        assert!(attempts_giving_way(&attempts[..2], "1", bound).is_empty(), "within the bound");
        // A late flush of attempt 0 removes nothing newer than it.
        assert!(attempts_giving_way(&attempts, "0", bound).is_empty());
        // An attempt past the bound on its own keeps every point.
        let alone = [("0".to_owned(), 500), ("1".to_owned(), 3_000)];
        assert_eq!(attempts_giving_way(&alone, "1", bound), ["0"]);
        assert_eq!(HistoryBound::new(96_000).points, 2_000);
        assert_eq!(HistoryBound::default().points, 64_000, "one attempt's, under 1 GiB");
    }

    #[test]
    fn rows_become_series_by_name() {
        let rows = [
            ("a".to_owned(), MetricPoint::new(0, 1, 1.0)),
            ("a".to_owned(), MetricPoint::new(1, 1, 2.0)),
            ("b".to_owned(), MetricPoint::new(0, 1, 3.0)),
        ];
        let series = into_series(rows);
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].points.len(), 2);
        assert_eq!(series[1].name, "b");
    }
}
