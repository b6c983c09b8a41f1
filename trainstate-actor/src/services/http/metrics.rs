//! `GET /metrics`: the head's counters in the Prometheus text exposition
//! format (version 0.0.4), encoded by `prometheus-client`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use trainstate_schema::api::{GoodputBy, GoodputQuery};
use trainstate_schema::{CauseClass, GoodputBucket, HealthState, RunStatus};

use crate::engine::supervisor::StateService;

/// The `Content-Type` of what [`HttpMetrics::render`] writes.
pub(crate) const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The prefix of every metric name.
const PREFIX: &str = "trainstate";

/// Upper bounds of the request latency histogram, in seconds.
const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    code: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

#[cfg(feature = "notify")]
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TargetLabels {
    target: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HealthLabels {
    health: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NodeLabels {
    node: String,
    cluster: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NodeClassLabels {
    node: String,
    cluster: String,
    class: &'static str,
}

/// The most nodes shown one by one: the suspects and the most failing
/// first (the ledger's order).
pub(crate) const MAX_NODE_SERIES: usize = 1_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RunGoodputLabels {
    run_id: String,
    name: String,
    cluster: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RunBucketLabels {
    run_id: String,
    bucket: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClusterBucketLabels {
    cluster: String,
    bucket: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RankLabels {
    run_id: String,
    rank: u32,
}

/// Request counters, by route and status code, and their latency; the
/// rest is read from the service at each scrape.
#[derive(Debug)]
pub(crate) struct HttpMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Histogram,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Histogram::new(LATENCY_BUCKETS);
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register(
            "http_requests",
            "HTTP requests by route and status code",
            requests.clone(),
        );
        registry.register_with_unit(
            "http_request_duration",
            "Latency of HTTP requests",
            Unit::Seconds,
            latency.clone(),
        );
        Self { registry, requests, latency }
    }
}

impl HttpMetrics {
    pub(crate) fn record(&self, route: &str, status: u16, elapsed: Duration) {
        self.requests.get_or_create(&RequestLabels { route: route.to_owned(), code: status }).inc();
        self.latency.observe(elapsed.as_secs_f64());
    }

    /// Every metric, as [`CONTENT_TYPE`] text, with what the HTTP layer
    /// holds now; at most `rank_series` ranks are shown one by one.
    pub(crate) fn render(
        &self,
        service: &StateService,
        load: &HttpLoad,
        rank_series: usize,
    ) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        let _ = prometheus_text::encode(&mut out, &Self::readings(service, load, rank_series));
        out
    }

    /// What the service reports at this instant.
    fn readings(service: &StateService, load: &HttpLoad, rank_series: usize) -> Registry {
        let &HttpLoad { streams, answer_bytes, request_bodies, budgeted_body_bytes } = load;
        let mut registry = Registry::with_prefix(PREFIX);
        Self::ranks(&mut registry, service, rank_series);
        Self::nodes(&mut registry, service, MAX_NODE_SERIES);
        Self::goodput(&mut registry, service);
        let runs = Family::<StatusLabels, Gauge>::default();
        for (status, count) in RunStatus::ALL.iter().zip(service.runs_by_status()) {
            runs.get_or_create(&StatusLabels { status: status.as_str() }).set(count as i64);
        }
        registry.register("runs", "Retained runs by status", runs);
        let by_health = service.runs_by_health();
        let runs = Family::<HealthLabels, Gauge>::default();
        for (state, count) in HealthState::ALL.iter().zip(by_health) {
            runs.get_or_create(&HealthLabels { health: state.as_str() }).set(count as i64);
        }
        registry.register("runs_by_health", "Retained runs by health", runs);
        let stalled = by_health
            [HealthState::ALL.iter().position(|s| *s == HealthState::Stalled).unwrap_or(0)];
        registry.register(
            "runs_stalled",
            "Retained runs whose health is STALLED",
            ConstGauge::new(stalled as i64),
        );

        let stats = service.store_stats();
        registry.register(
            "store_commits",
            "Store transactions committed",
            ConstCounter::new(stats.transactions.load(Ordering::Relaxed)),
        );
        registry.register_with_unit(
            "store_commit",
            "Time spent committing; divide by commits for the mean commit latency",
            Unit::Seconds,
            ConstCounter::new(stats.commit_micros.load(Ordering::Relaxed) as f64 / 1e6),
        );
        registry.register(
            "store_writes",
            "Writes committed; divide by commits for the mean batch size",
            ConstCounter::new(stats.writes.load(Ordering::Relaxed)),
        );
        registry.register(
            "store_commit_failures",
            "Store commits that failed",
            ConstCounter::new(stats.failures.load(Ordering::Relaxed)),
        );
        registry.register(
            "metric_flushes",
            "Transactions that added reported metric points to their histories (about one a second)",
            ConstCounter::new(stats.metric_flushes.load(Ordering::Relaxed)),
        );
        registry.register_with_unit(
            "metric_flush",
            "Time spent adding metric points to their histories",
            Unit::Seconds,
            ConstCounter::new(stats.metric_flush_micros.load(Ordering::Relaxed) as f64 / 1e6),
        );
        registry.register(
            "metric_points",
            "Metric points handed to the store (each series keeps them by its stride)",
            ConstCounter::new(stats.metric_points.load(Ordering::Relaxed)),
        );
        registry.register(
            "metric_points_dropped",
            "Metric points lost: a board's pending points were full, or their flush failed",
            ConstCounter::new(stats.metric_points_dropped.load(Ordering::Relaxed)),
        );
        registry.register(
            "store_writable",
            "1 while the store commits; 0 from a failed commit until one succeeds (writes get 503 meanwhile)",
            ConstGauge::new(i64::from(service.store_writable())),
        );
        registry.register(
            "state_actor_restarts",
            "Restarts of the state actor by its supervisor",
            ConstCounter::new(service.actor_restarts()),
        );
        registry.register(
            "store_writes_in_flight",
            "Writes queued for the store, not yet answered",
            ConstGauge::new(service.in_flight_writes() as i64),
        );
        registry.register(
            "events_subscribers",
            "Live event subscribers: open event streams and in-process subscriptions",
            ConstGauge::new((streams + service.subscribers()) as i64),
        );
        let (events, bytes) = service.event_backlog();
        registry.register(
            "events_backlog",
            "Recent events kept for subscribers that resume",
            ConstGauge::new(events as i64),
        );
        registry.register_with_unit(
            "events_backlog",
            "Bytes of the recent events kept (the runs' JSON they carry)",
            Unit::Bytes,
            ConstGauge::new(bytes as i64),
        );
        registry.register_with_unit(
            "answer_in_flight",
            "Bytes of listings and event-stream snapshots produced and not yet taken by clients' sockets",
            Unit::Bytes,
            ConstGauge::new(answer_bytes as i64),
        );
        registry.register(
            "http_request_bodies",
            "Request bodies being received or handled",
            ConstGauge::new(request_bodies as i64),
        );
        registry.register_with_unit(
            "http_request_body_budget",
            "Bytes of request bodies received and charged to --max-body-bytes-in-flight \
             (each body's first 64 KiB aside), in whole KiB",
            Unit::Bytes,
            ConstGauge::new(budgeted_body_bytes as i64),
        );
        #[cfg(feature = "forward")]
        Self::forwarding(&mut registry, service);
        #[cfg(feature = "notify")]
        Self::notifications(&mut registry, service);
        registry
    }

    /// Each rank's step and last advance, one series each for at most
    /// `max` ranks (by run id, then rank), and how many ranks were left
    /// out: a run of 10,000 ranks is 20,000 series, which a scraper is not
    /// sent unless the operator asks (`--prometheus-rank-series`).
    fn ranks(registry: &mut Registry, service: &StateService, max: usize) {
        let steps = Family::<RankLabels, Gauge>::default();
        let advances = Family::<RankLabels, Gauge<f64, AtomicU64>>::default();
        let (mut shown, mut omitted) = (0usize, 0usize);
        for (id, positions) in service.rank_positions() {
            for (rank, step, last_advance_ms) in positions {
                if shown >= max {
                    omitted += 1;
                    continue;
                }
                shown += 1;
                let labels = RankLabels { run_id: id.to_string(), rank };
                steps.get_or_create(&labels).set(i64::try_from(step).unwrap_or(i64::MAX));
                advances.get_or_create(&labels).set(last_advance_ms as f64 / 1000.0);
            }
        }
        registry.register(
            "rank_step",
            "Each rank's latest step, by run and world rank (at most --prometheus-rank-series ranks)",
            steps,
        );
        registry.register_with_unit(
            "rank_last_advance_timestamp",
            "When each rank's step last grew, in Unix seconds, by run and world rank (at most \
             --prometheus-rank-series ranks)",
            Unit::Seconds,
            advances,
        );
        registry.register(
            "rank_series_omitted",
            "Ranks with a reported step left out of trainstate_rank_step and \
             trainstate_rank_last_advance_timestamp_seconds, past --prometheus-rank-series",
            ConstGauge::new(omitted as i64),
        );
    }

    /// The node ledger over its default window: each node's verdict and
    /// failures by class, for at most `max` nodes (suspects and the most
    /// failing first), and how many were left out.
    fn nodes(registry: &mut Registry, service: &StateService, max: usize) {
        let since_ms =
            service.now_ms().saturating_sub(trainstate_schema::api::DEFAULT_NODE_WINDOW_MS);
        let nodes = service.nodes(since_ms, None).nodes;
        let suspect = Family::<NodeLabels, Gauge>::default();
        let failures = Family::<NodeClassLabels, Gauge>::default();
        for node in nodes.iter().take(max) {
            let cluster = node.cluster.clone().unwrap_or_default();
            let labels = NodeLabels { node: node.node.clone(), cluster: cluster.clone() };
            suspect.get_or_create(&labels).set(i64::from(node.suspect));
            for class in CauseClass::ALL {
                let labels = NodeClassLabels {
                    node: node.node.clone(),
                    cluster: cluster.clone(),
                    class: class.as_str(),
                };
                failures.get_or_create(&labels).set(i64::from(node.failures.of(class)));
            }
        }
        registry.register(
            "node_suspect",
            "1 for a node the ledger calls a suspect over the last 14 days, else 0, by node and \
             cluster (at most 1,000 nodes: the suspects and the most failing first)",
            suspect,
        );
        registry.register(
            "node_failures",
            "Failures blamed on a node over the last 14 days (a rank on it failed first, or it \
             was lost), by node, cluster and class of cause (the nodes of trainstate_node_suspect)",
            failures,
        );
        registry.register(
            "node_series_omitted",
            "Nodes of the ledger left out of trainstate_node_suspect and \
             trainstate_node_failures, past 1,000",
            ConstGauge::new(nodes.len().saturating_sub(max) as i64),
        );
    }

    /// Each live run's goodput (as many series as live runs, which the
    /// head bounds), and each cluster's over the retained runs of the
    /// default window (7 days), weighted by the runs' GPUs.
    fn goodput(registry: &mut Registry, service: &StateService) {
        let ratio = Family::<RunGoodputLabels, Gauge<f64, AtomicU64>>::default();
        let badput = Family::<RunBucketLabels, Gauge<f64, AtomicU64>>::default();
        for run in service.live_goodput() {
            let (run_id, goodput) = (run.id.to_string(), run.goodput);
            if let Some(r) = goodput.ratio {
                let labels = RunGoodputLabels {
                    run_id: run_id.clone(),
                    name: run.name.into(),
                    cluster: run.cluster.map(String::from).unwrap_or_default(),
                };
                ratio.get_or_create(&labels).set(r);
            }
            for bucket in GoodputBucket::ALL.into_iter().skip(1) {
                let labels = RunBucketLabels { run_id: run_id.clone(), bucket: bucket.as_str() };
                badput.get_or_create(&labels).set(goodput.ms(bucket) as f64 / 1000.0);
            }
        }
        registry.register(
            "run_goodput_ratio",
            "Each live run's goodput: the share of its wall-clock time that went into progress \
             that was kept, counted to now, by run, name and cluster",
            ratio,
        );
        registry.register_with_unit(
            "run_badput",
            "Each live run's wall-clock time that went into no kept progress, counted to now, by \
             run and bucket (waiting_to_start, restarting, stalled, checkpointing, progress_lost, \
             slower_than_pace)",
            Unit::Seconds,
            badput,
        );
        let mut query = GoodputQuery::default();
        query.by = Some(GoodputBy::Cluster);
        // The default window and no cluster: nothing to refuse.
        let Ok(fleet) = service.goodput(&query) else { return };
        let ratio = Family::<ClusterLabels, Gauge<f64, AtomicU64>>::default();
        let badput = Family::<ClusterBucketLabels, Gauge<f64, AtomicU64>>::default();
        for group in &fleet.groups {
            let cluster = group.key.clone().unwrap_or_default();
            if let Some(r) = group.totals.ratio {
                ratio.get_or_create(&ClusterLabels { cluster: cluster.clone() }).set(r);
            }
            for bucket in GoodputBucket::ALL.into_iter().skip(1) {
                let labels =
                    ClusterBucketLabels { cluster: cluster.clone(), bucket: bucket.as_str() };
                let gpu_ms = group.totals.badput_gpu_ms.get(bucket);
                badput.get_or_create(&labels).set(gpu_ms as f64 / 1000.0);
            }
        }
        registry.register(
            "cluster_goodput_ratio",
            "Each cluster's goodput over the last 7 days: the share of the GPU time its retained \
             runs held that went into progress that was kept, by cluster (empty: runs of no cluster)",
            ratio,
        );
        registry.register(
            "cluster_badput_gpu_seconds",
            "GPU time each cluster's retained runs held over the last 7 days that went into no \
             kept progress, in GPU-seconds (each run's time times its GPUs, or workers when it \
             has none), by cluster and bucket",
            badput,
        );
    }

    /// Each notification target's delivery, when the head notifies.
    #[cfg(feature = "notify")]
    fn notifications(registry: &mut Registry, service: &StateService) {
        let targets = service.notify_targets();
        if targets.is_empty() {
            return;
        }
        let pending = Family::<TargetLabels, Gauge>::default();
        let sent = Family::<TargetLabels, Counter>::default();
        let failures = Family::<TargetLabels, Counter>::default();
        let dropped = Family::<TargetLabels, Counter>::default();
        let position = Family::<TargetLabels, Gauge>::default();
        let oldest = Family::<TargetLabels, Gauge<f64, AtomicU64>>::default();
        let read = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        let now_ms = service.now_ms();
        for stats in &targets {
            let labels = TargetLabels { target: stats.name().to_owned() };
            pending.get_or_create(&labels).set(read(&stats.pending) as i64);
            let since_ms = read(&stats.oldest_pending_ms);
            let age_ms = if since_ms == 0 { 0 } else { now_ms.saturating_sub(since_ms) };
            oldest.get_or_create(&labels).set(age_ms as f64 / 1000.0);
            sent.get_or_create(&labels).inc_by(read(&stats.sent));
            failures.get_or_create(&labels).inc_by(read(&stats.failures));
            dropped.get_or_create(&labels).inc_by(read(&stats.dropped));
            position.get_or_create(&labels).set(read(&stats.position) as i64);
        }
        registry.register(
            "notify_pending",
            "Notification events read and not yet delivered, by target (at most the backlog bound)",
            pending,
        );
        registry.register(
            "notify_oldest_pending_seconds",
            "How long the oldest notification event not yet delivered to a target has waited \
             since it was read to be sent, by target (0: none pending); a slow or failing \
             receiver shows here",
            oldest,
        );
        registry.register("notify_sent", "Notification events delivered, by target", sent);
        registry.register(
            "notify_failures",
            "Tries to deliver notifications that failed, by target; each is tried again",
            failures,
        );
        registry.register(
            "notify_dropped",
            "Notification events dropped, by target: the oldest past the backlog bound while the target fails, or refused by it for good",
            dropped,
        );
        registry.register(
            "notify_position",
            "The sequence number of the store's commit up to which a target's events were delivered or dropped",
            position,
        );
    }

    /// Forwarding to a hub, when this head forwards (`--forward-to`).
    #[cfg(feature = "forward")]
    fn forwarding(registry: &mut Registry, service: &StateService) {
        let Some(stats) = service.forwarding_stats() else {
            return;
        };
        let read = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        registry.register(
            "forward_pending",
            "Runs with a change not yet accepted by the hub, read or still in the store behind \
             the batch being sent; each run counted once however often it changed, since it is \
             sent once, as it is now",
            ConstGauge::new(read(&stats.pending) as i64),
        );
        registry.register(
            "forward_sent",
            "Runs the hub accepted",
            ConstCounter::new(read(&stats.forwarded)),
        );
        registry.register(
            "forward_refused",
            "Runs the hub refused for good (conflicting or invalid); skipped",
            ConstCounter::new(read(&stats.refused)),
        );
        registry.register(
            "forward_failures",
            "Sends that found the hub unreachable, busy or misaddressed; each is tried again",
            ConstCounter::new(read(&stats.retries)),
        );
        registry.register(
            "forward_position",
            "The sequence number of the store's commit forwarded up to",
            ConstGauge::new(read(&stats.position) as i64),
        );
        registry.register_with_unit(
            "forward_last_success_timestamp",
            "When the hub last accepted a run, in Unix seconds; 0 until it first does",
            Unit::Seconds,
            ConstGauge::new(read(&stats.last_success_ms) as f64 / 1000.0),
        );
    }
}

/// What the HTTP layer holds now, read for `/metrics`.
pub(crate) struct HttpLoad {
    /// Open event streams.
    pub(crate) streams: usize,
    /// Bytes of answers not yet taken by slow clients.
    pub(crate) answer_bytes: usize,
    /// Request bodies being received or handled.
    pub(crate) request_bodies: usize,
    /// Bytes charged to the body budget.
    pub(crate) budgeted_body_bytes: usize,
}
