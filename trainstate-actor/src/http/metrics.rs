//! `GET /metrics`: Prometheus text exposition of the head's counters.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use trainstate_schema::RunStatus;

use crate::StateService;

/// Upper bounds of the request latency histogram, in seconds.
const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Request counters, by route and status code, and their latency.
#[derive(Debug, Default)]
pub(crate) struct HttpMetrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_micros: AtomicU64,
}

impl HttpMetrics {
    pub(crate) fn record(&self, route: &str, status: u16, elapsed: Duration) {
        *self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((route.to_owned(), status))
            .or_default() += 1;
        let seconds = elapsed.as_secs_f64();
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_micros.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }

    pub(crate) fn render(&self, service: &StateService) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP trainstate_runs Retained runs by status.\n# TYPE trainstate_runs gauge\n",
        );
        for (status, count) in RunStatus::ALL.iter().zip(service.runs_by_status()) {
            let _ = writeln!(out, "trainstate_runs{{status=\"{status}\"}} {count}");
        }
        out.push_str(
            "# HELP trainstate_http_requests_total HTTP requests by route and status code.\n\
             # TYPE trainstate_http_requests_total counter\n",
        );
        for ((route, code), count) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter()
        {
            let _ = writeln!(
                out,
                "trainstate_http_requests_total{{route=\"{route}\",code=\"{code}\"}} {count}"
            );
        }
        out.push_str(
            "# HELP trainstate_http_request_duration_seconds Latency of HTTP requests.\n\
             # TYPE trainstate_http_request_duration_seconds histogram\n",
        );
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            let _ = writeln!(
                out,
                "trainstate_http_request_duration_seconds_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ =
            writeln!(out, "trainstate_http_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "trainstate_http_request_duration_seconds_sum {}",
            self.latency_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "trainstate_http_request_duration_seconds_count {count}");

        let stats = service.store_stats();
        let transactions = stats.transactions.load(Ordering::Relaxed);
        let writes = stats.writes.load(Ordering::Relaxed);
        let _ = write!(
            out,
            "# HELP trainstate_store_commits_total Store transactions committed.\n\
             # TYPE trainstate_store_commits_total counter\n\
             trainstate_store_commits_total {transactions}\n\
             # HELP trainstate_store_commit_seconds_total Time spent committing; divide by commits for the mean commit latency.\n\
             # TYPE trainstate_store_commit_seconds_total counter\n\
             trainstate_store_commit_seconds_total {}\n\
             # HELP trainstate_store_writes_total Writes committed; divide by commits for the mean batch size.\n\
             # TYPE trainstate_store_writes_total counter\n\
             trainstate_store_writes_total {writes}\n\
             # HELP trainstate_store_commit_failures_total Store commits that failed.\n\
             # TYPE trainstate_store_commit_failures_total counter\n\
             trainstate_store_commit_failures_total {}\n\
             # HELP trainstate_store_writes_in_flight Writes queued for the store, not yet answered.\n\
             # TYPE trainstate_store_writes_in_flight gauge\n\
             trainstate_store_writes_in_flight {}\n\
             # HELP trainstate_events_subscribers Live event subscribers.\n\
             # TYPE trainstate_events_subscribers gauge\n\
             trainstate_events_subscribers {}\n",
            stats.commit_micros.load(Ordering::Relaxed) as f64 / 1e6,
            stats.failures.load(Ordering::Relaxed),
            service.in_flight_writes(),
            service.subscribers(),
        );
        out
    }
}
