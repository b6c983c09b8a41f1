//! The documents of the fleet's goodput: every retained run's time, summed
//! per cluster, per node or per run name (`GET /api/train/goodput`).
//!
//! A run's own goodput is its `goodput` member ([`RunGoodput`](crate::RunGoodput)).
//! Summed over runs, each run's times are weighted by its allocation: its
//! GPUs, or its workers when it has none, so a group's figures are GPU-ms
//! and its ratio is the share of the GPU time it held that went into kept
//! progress.

use serde::{Deserialize, Serialize};

use crate::Badput;

/// The window `GET /api/train/goodput` counts in when none is given: 7 days.
pub const DEFAULT_GOODPUT_WINDOW_MS: u64 = 7 * 24 * 60 * 60 * 1000;

/// Query of `GET /api/train/goodput`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct GoodputQuery {
    /// Count only the time at or after this: Unix ms, or an RFC 3339
    /// instant (`2026-12-01T00:00:00Z`). 7 days before now when absent. A
    /// run that lies partly in the window counts with its share of its
    /// wall-clock time inside it, every bucket scaled alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// What to sum by: `cluster` (the default), `node` or `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<GoodputBy>,
    /// Only the runs of this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// What `GET /api/train/goodput` sums by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum GoodputBy {
    /// The run's cluster (runs of no cluster are one group with no key).
    #[default]
    Cluster,
    /// The nodes the run's attempts ran on: each attempt's share of the
    /// run's time, spread over its nodes by their GPUs (workers when none).
    Node,
    /// The run's name: the runs of one training job, launch after launch.
    Name,
}

impl GoodputBy {
    /// The wire name, for example `node`.
    pub fn as_str(self) -> &'static str {
        match self {
            GoodputBy::Cluster => "cluster",
            GoodputBy::Node => "node",
            GoodputBy::Name => "name",
        }
    }
}

/// Summed times of some runs, each weighted by its allocation (GPU-ms).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct GoodputTotals {
    /// The runs counted (a run in several groups counts in each).
    pub runs: u64,
    /// The live runs among them.
    pub live: u64,
    /// Wall-clock time × allocation, in GPU-ms.
    pub wall_gpu_ms: u64,
    /// Productive time × allocation, in GPU-ms.
    pub productive_gpu_ms: u64,
    /// The badput × allocation, by bucket, in GPU-ms.
    pub badput_gpu_ms: Badput,
    /// `productive_gpu_ms / wall_gpu_ms`; absent while nothing was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

/// One group of `GET /api/train/goodput`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct GoodputGroup {
    /// The cluster, node or run name summed by; absent for the runs of no
    /// cluster when summing by cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// For `by=node` and `by=name`: the cluster of the group's runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The group's totals.
    #[serde(flatten)]
    pub totals: GoodputTotals,
}

impl GoodputGroup {
    /// The group of `key` (of `cluster`, for `by=node` and `by=name`).
    pub fn new(key: Option<String>, cluster: Option<String>, totals: GoodputTotals) -> Self {
        Self { key, cluster, totals }
    }

    /// The GPU time the group's runs lost: wall minus productive, in GPU-ms.
    pub fn lost_gpu_ms(&self) -> u64 {
        self.totals.wall_gpu_ms.saturating_sub(self.totals.productive_gpu_ms)
    }
}

/// The answer of `GET /api/train/goodput`: the groups, most GPU time lost
/// first, and the total over every run counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct GoodputResponse {
    /// What the groups sum by.
    pub by: GoodputBy,
    /// The start of the window counted (Unix ms).
    pub since_ms: u64,
    /// Until when (Unix ms, the head's clock when it answered).
    pub until_ms: u64,
    /// The start of the oldest retained run (Unix ms); absent when none is
    /// retained. Runs are evicted by retention: nothing before it is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained_since_ms: Option<u64>,
    /// True when the window starts before `retained_since_ms`: the figures
    /// are of what is retained, not of the whole window.
    pub beyond_retention: bool,
    /// Every run counted.
    pub total: GoodputTotals,
    /// The groups.
    pub groups: Vec<GoodputGroup>,
}

impl GoodputResponse {
    /// The answer for the window `[since_ms, until_ms]` by `by`; beyond
    /// retention when the window starts before `retained_since_ms`.
    pub fn new(
        by: GoodputBy,
        since_ms: u64,
        until_ms: u64,
        retained_since_ms: Option<u64>,
        total: GoodputTotals,
        groups: Vec<GoodputGroup>,
    ) -> Self {
        let beyond_retention = retained_since_ms.is_some_and(|oldest| since_ms < oldest);
        Self { by, since_ms, until_ms, retained_since_ms, beyond_retention, total, groups }
    }
}
