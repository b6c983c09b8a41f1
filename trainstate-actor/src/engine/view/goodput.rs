//! The fleet's goodput: a compact summary of each retained run's `goodput`
//! (its times by bucket, its allocation, up to when it is counted), kept
//! beside the view's other indexes, and the sums over runs that
//! `GET /api/train/goodput` and the metrics answer.
//!
//! The rules of the sums:
//!
//! - A run's weight is its allocation: the sum of its workers' GPUs (a
//!   worker's `GPU` resource, else its visible GPU ids), or its workers when
//!   it has no GPU, or one when it has neither. Its times × its weight are
//!   GPU-ms.
//! - A live run is counted to the moment of the read: the time since its
//!   goodput's `as_of_ms` counts in the bucket of its status and health
//!   (`INITIALIZING`/`SCHEDULING`: waiting to start; `RESTARTING`/`RESIZING`:
//!   restarting; a STALLED run: stalled; else productive).
//! - A run that lies partly in the window counts with its share of its
//!   wall-clock span (from its start to its end, or to now) inside the
//!   window, every bucket scaled alike.
//! - By node: an attempt spans from its start to the next attempt's start
//!   (or the run's end, or now); its share of the run's span is spread over
//!   its nodes by their weight in it (the node ledger's). Time before the
//!   first attempt is on no node.
//! - A run without `goodput` (registered already ended, or from a head that
//!   does not count it) is not counted.

use std::collections::HashMap;

use serde::Deserialize;
use trainstate_schema::api::{GoodputBy, GoodputGroup, GoodputResponse, GoodputTotals};
use trainstate_schema::{Badput, GoodputBucket, HealthState, RunGoodput, RunStatus};

use crate::decisions::nodes::{NodeLedger, RunKey, worker_gpus};
use crate::decisions::record::RunRecord;

/// One run's goodput as the fleet's sums need it: 48 bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RunSummary {
    /// Seconds (rounded) per bucket, in [`GoodputBucket::ALL`] order.
    seconds: [u32; 7],
    /// The run's allocation: GPUs, or workers when it has none.
    weight: f32,
    /// Up to when the seconds are counted (Unix ms).
    as_of_ms: u64,
    /// For a live run, the bucket the time since `as_of_ms` counts in.
    open: Option<GoodputBucket>,
}

/// The bucket a live run's time counts in now, from its status and health.
pub(crate) fn open_bucket(status: RunStatus, health: Option<HealthState>) -> Option<GoodputBucket> {
    match status {
        RunStatus::Initializing | RunStatus::Scheduling => Some(GoodputBucket::WaitingToStart),
        RunStatus::Restarting | RunStatus::Resizing => Some(GoodputBucket::Restarting),
        RunStatus::Running if health == Some(HealthState::Stalled) => Some(GoodputBucket::Stalled),
        RunStatus::Running => Some(GoodputBucket::Productive),
        _ => None,
    }
}

#[derive(Deserialize)]
struct Facts {
    #[serde(default)]
    workers: Vec<FactWorker>,
    #[serde(default)]
    goodput: Option<FactGoodput>,
}

#[derive(Deserialize)]
struct FactWorker {
    #[serde(default)]
    gpu_ids: Vec<u32>,
    #[serde(default)]
    resources: FactResources,
}

#[derive(Deserialize, Default)]
struct FactResources {
    #[serde(default, rename = "GPU")]
    gpu: Option<f64>,
}

#[derive(Deserialize)]
struct FactGoodput {
    productive_ms: u64,
    badput: Badput,
    as_of_ms: u64,
}

/// Milliseconds as whole seconds, rounded to the nearest.
fn seconds(ms: u64) -> u32 {
    u32::try_from(ms.saturating_add(500) / 1000).unwrap_or(u32::MAX)
}

impl RunSummary {
    /// The summary of `record`, or `None` when it has no goodput.
    pub(crate) fn of(record: &RunRecord) -> Option<Self> {
        let facts: Facts = serde_json::from_str(&record.json().text()).ok()?;
        let goodput = facts.goodput?;
        let gpus: f64 =
            facts.workers.iter().map(|w| worker_gpus(w.resources.gpu, w.gpu_ids.len())).sum();
        let weight = if gpus > 0.0 { gpus } else { facts.workers.len().max(1) as f64 };
        let seconds = GoodputBucket::ALL.map(|bucket| match bucket {
            GoodputBucket::Productive => seconds(goodput.productive_ms),
            other => seconds(goodput.badput.get(other)),
        });
        Some(Self {
            seconds,
            weight: weight as f32,
            as_of_ms: goodput.as_of_ms,
            open: open_bucket(record.status, record.health),
        })
    }

    /// The run's ms per bucket counted to `now_ms` (a live run's open
    /// interval in its current bucket), and up to when.
    pub(crate) fn counted(&self, now_ms: u64) -> ([f64; 7], u64) {
        let mut ms = self.seconds.map(|s| f64::from(s) * 1000.0);
        let mut until = self.as_of_ms;
        if let Some(bucket) = self.open
            && now_ms > self.as_of_ms
        {
            let i = bucket_index(bucket);
            ms[i] += (now_ms - self.as_of_ms) as f64;
            until = now_ms;
        }
        (ms, until)
    }

    /// The run's goodput counted to `now_ms`, as a run serves it (the
    /// times to the second, a live run's open interval to the ms).
    pub(crate) fn goodput_at(&self, now_ms: u64) -> RunGoodput {
        let (ms, until) = self.counted(now_ms);
        let mut goodput = RunGoodput::starting_at(until);
        for (bucket, ms) in GoodputBucket::ALL.iter().zip(ms) {
            goodput.add(*bucket, ms as u64);
        }
        goodput
    }

    /// True while the run is live.
    pub(crate) fn live(&self) -> bool {
        self.open.is_some()
    }
}

fn bucket_index(bucket: GoodputBucket) -> usize {
    GoodputBucket::ALL.iter().position(|b| *b == bucket).unwrap_or(0)
}

/// The share of `[start, until]` inside `[since, now]`: 0 to 1. A run of no
/// span counts whole when it lies in the window.
fn share(start: u64, until: u64, since: u64, now: u64) -> f64 {
    let (from, to) = (start.max(since), until.min(now));
    if until <= start {
        return if start >= since && start <= now { 1.0 } else { 0.0 };
    }
    if to <= from { 0.0 } else { (to - from) as f64 / (until - start) as f64 }
}

/// GPU-ms per bucket, summed in floating point and rounded when answered.
#[derive(Debug, Default, Clone)]
struct Sum {
    runs: u64,
    live: u64,
    ms: [f64; 7],
    /// The last run counted, so that a run counts once per group.
    last: Option<RunKey>,
}

impl Sum {
    fn add(&mut self, run: RunKey, live: bool, ms: &[f64; 7], factor: f64) {
        if self.last != Some(run) {
            self.runs += 1;
            self.live += u64::from(live);
            self.last = Some(run);
        }
        for (total, ms) in self.ms.iter_mut().zip(ms) {
            *total += ms * factor;
        }
    }

    fn totals(&self) -> GoodputTotals {
        let gpu_ms = self.ms.map(|ms| ms.round() as u64);
        let mut badput = Badput::default();
        for (bucket, ms) in GoodputBucket::ALL.iter().zip(gpu_ms) {
            if let Some(total) = badput.get_mut(*bucket) {
                *total = ms;
            }
        }
        let wall = gpu_ms.iter().sum::<u64>();
        let productive = gpu_ms[0];
        let mut totals = GoodputTotals::default();
        totals.runs = self.runs;
        totals.live = self.live;
        totals.wall_gpu_ms = wall;
        totals.productive_gpu_ms = productive;
        totals.badput_gpu_ms = badput;
        totals.ratio = trainstate_schema::goodput_ratio(productive, wall);
        totals
    }
}

/// The summaries of the retained runs, by the view's slot.
#[derive(Debug, Default)]
pub(crate) struct Summaries {
    by_slot: Vec<Option<RunSummary>>,
}

/// What the sums read of the view: a slot's run and its summary.
pub(crate) struct Fleet<'a> {
    pub(crate) summaries: &'a Summaries,
    pub(crate) slots: &'a [Option<std::sync::Arc<RunRecord>>],
    pub(crate) ledger: &'a NodeLedger,
    pub(crate) retained_since_ms: Option<u64>,
}

impl Summaries {
    /// The summaries of `slots`, each at its slot.
    pub(crate) fn of(slots: &[Option<std::sync::Arc<RunRecord>>]) -> Self {
        let mut by_slot = Vec::with_capacity(slots.len());
        by_slot.extend(slots.iter().map(|run| run.as_deref().and_then(RunSummary::of)));
        Self { by_slot }
    }

    /// Sets the summary of the run at `slot` (none: the run is gone).
    pub(crate) fn set(&mut self, slot: RunKey, record: Option<&RunRecord>) {
        let slot = slot as usize;
        if self.by_slot.len() <= slot {
            self.by_slot.resize(slot + 1, None);
        }
        self.by_slot[slot] = record.and_then(RunSummary::of);
    }

    /// The summary of the run at `slot`, if it has one.
    pub(crate) fn get(&self, slot: RunKey) -> Option<&RunSummary> {
        self.by_slot.get(slot as usize)?.as_ref()
    }

    /// The bytes the summaries hold (what they add to each retained run).
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.by_slot.capacity() * std::mem::size_of::<Option<RunSummary>>()
    }
}

impl Fleet<'_> {
    /// The fleet's goodput from `since_ms` to `now_ms`, by `by`, of
    /// `cluster`'s runs (every run's when `None`).
    pub(crate) fn goodput(
        &self,
        since_ms: u64,
        now_ms: u64,
        by: GoodputBy,
        cluster: Option<&str>,
    ) -> GoodputResponse {
        let mut total = Sum::default();
        let mut groups: HashMap<(Option<&str>, Option<&str>), Sum> = HashMap::new();
        for (slot, run) in (0u32..).zip(self.slots) {
            let Some(record) = run.as_deref() else { continue };
            let Some(summary) = self.summaries.get(slot) else { continue };
            if cluster.is_some_and(|want| record.cluster.as_deref() != Some(want)) {
                continue;
            }
            let (ms, until) = summary.counted(now_ms);
            let factor = share(record.start_time_ms, until, since_ms, now_ms);
            if factor <= 0.0 {
                continue;
            }
            let weighted = f64::from(summary.weight) * factor;
            total.add(slot, summary.live(), &ms, weighted);
            let key = match by {
                GoodputBy::Name => (Some(&*record.name), record.cluster.as_deref()),
                GoodputBy::Node => continue,
                _ => (record.cluster.as_deref(), None),
            };
            groups.entry(key).or_default().add(slot, summary.live(), &ms, weighted);
        }
        if by == GoodputBy::Node {
            self.by_node(since_ms, now_ms, cluster, &mut groups);
        }
        let mut groups: Vec<GoodputGroup> = groups
            .into_iter()
            .map(|((key, cluster), sum)| {
                GoodputGroup::new(key.map(str::to_owned), cluster.map(str::to_owned), sum.totals())
            })
            .collect();
        groups.sort_by(|a, b| {
            b.lost_gpu_ms()
                .cmp(&a.lost_gpu_ms())
                .then_with(|| a.key.cmp(&b.key))
                .then_with(|| a.cluster.cmp(&b.cluster))
        });
        GoodputResponse::new(by, since_ms, now_ms, self.retained_since_ms, total.totals(), groups)
    }

    /// The node groups: each attempt's share of its run, spread over its
    /// nodes by their weight in it.
    fn by_node<'a>(
        &'a self,
        since_ms: u64,
        now_ms: u64,
        cluster: Option<&str>,
        groups: &mut HashMap<(Option<&'a str>, Option<&'a str>), Sum>,
    ) {
        // Every attempt on every node, ordered by run then start, so that
        // each run's attempts come together and in order; each names its
        // node (in its cluster) by its place in `entries`, so the sort moves
        // 24 bytes an attempt and the sums are found without hashing names.
        let mut entries: Vec<(&'a str, Option<&'a str>)> = Vec::new();
        let mut attempts: Vec<(RunKey, u64, u16, u32)> = Vec::new();
        for (node, c, run, start, weight) in self.ledger.attempts() {
            if cluster.is_some_and(|want| c != Some(want)) {
                continue;
            }
            // The ledger yields one entry's attempts together: a new entry
            // is a new node name or cluster (compared by address).
            let same = entries.last().is_some_and(|(n, last)| {
                std::ptr::eq(*n, node) && last.map(str::as_ptr) == c.map(str::as_ptr)
            });
            if !same {
                entries.push((node, c));
            }
            attempts.push((run, start, weight, (entries.len() - 1) as u32));
        }
        attempts.sort_unstable_by_key(|(run, start, ..)| (*run, *start));
        let mut sums: Vec<Sum> = vec![Sum::default(); entries.len()];
        for one_run in attempts.chunk_by(|a, b| a.0 == b.0) {
            let slot = one_run[0].0;
            let Some(summary) = self.summaries.get(slot) else { continue };
            let Some(record) = self.slots.get(slot as usize).and_then(|r| r.as_deref()) else {
                continue;
            };
            let (ms, until) = summary.counted(now_ms);
            let span = until.saturating_sub(record.start_time_ms);
            let attempts: Vec<&[_]> = one_run.chunk_by(|a, b| a.1 == b.1).collect();
            for (i, nodes) in attempts.iter().enumerate() {
                let start = nodes[0].1.max(record.start_time_ms);
                let end = attempts.get(i + 1).map_or(until, |next| next[0].1).min(until);
                let inside = start.max(since_ms)..end.min(now_ms);
                let share = if span == 0 {
                    if i == 0 { share(record.start_time_ms, until, since_ms, now_ms) } else { 0.0 }
                } else if inside.end <= inside.start {
                    0.0
                } else {
                    (inside.end - inside.start) as f64 / span as f64
                };
                if share <= 0.0 {
                    continue;
                }
                let weights: f64 = nodes.iter().map(|n| f64::from(n.2)).sum();
                for &(_, _, weight, entry) in nodes.iter() {
                    let of_node = if weights > 0.0 {
                        f64::from(weight) / weights
                    } else {
                        1.0 / nodes.len() as f64
                    };
                    let factor = f64::from(summary.weight) * share * of_node;
                    sums[entry as usize].add(slot, summary.live(), &ms, factor);
                }
            }
        }
        for ((node, c), sum) in entries.into_iter().zip(sums) {
            if sum.runs > 0 {
                groups.insert((Some(node), c), sum);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_takes_at_most_48_bytes_per_run() {
        assert_eq!(std::mem::size_of::<Option<RunSummary>>(), 48);
    }

    #[test]
    fn a_run_counts_with_its_share_of_its_span_inside_the_window() {
        assert_eq!(share(0, 100, 50, 200), 0.5);
        assert_eq!(share(0, 100, 0, 200), 1.0);
        assert_eq!(share(0, 100, 100, 200), 0.0);
        assert_eq!(share(10, 10, 0, 20), 1.0);
        assert_eq!(share(10, 10, 11, 20), 0.0);
    }

    #[test]
    fn a_live_run_counts_its_open_interval_in_its_current_bucket() {
        let summary = RunSummary {
            seconds: [60, 10, 0, 0, 0, 0, 0],
            weight: 8.0,
            as_of_ms: 1_000,
            open: open_bucket(RunStatus::Running, Some(HealthState::Stalled)),
        };
        let (ms, until) = summary.counted(31_000);
        assert_eq!(until, 31_000);
        assert_eq!(ms[bucket_index(GoodputBucket::Stalled)], 30_000.0);
        assert_eq!(ms[0], 60_000.0);
    }
}
