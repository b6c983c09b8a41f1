//! The configuration of the state actor: a value, never the environment.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use trainstate_client::DEFAULT_STATE_ACTOR_NAME;

use crate::decisions::clock::{Clock, SystemClock};
pub use crate::decisions::retention::{DEFAULT_MAX_RETAINED_BYTES, DEFAULT_MAX_RUNS, Retention};
pub use crate::store::config::{PostgresConfig, StoreConfig, Synchronous};
pub use crate::store::metrics::HISTORY_POINT_BYTES;

/// The schema version of the SQLite store this build writes.
pub const STORE_SCHEMA_VERSION: u32 = crate::store::sqlite::SCHEMA_VERSION;

/// The default lease of a live run: without a heartbeat for this long, the
/// run is aborted as "lost controller".
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// The default bound on writes in flight (queued for the store, not yet
/// committed). Past it, writes are refused as overloaded.
pub const DEFAULT_MAX_IN_FLIGHT_WRITES: usize = 16_384;

/// The default number of recent events kept so a subscriber can resume
/// (and from which live subscribers are served): as many as one group
/// commit can publish at once.
pub const DEFAULT_EVENT_BACKLOG: usize = 4_096;

/// The default bound on the bytes of the recent events kept (the runs'
/// JSON they carry): 64 MiB.
pub const DEFAULT_EVENT_BACKLOG_BYTES: usize = 64 * 1024 * 1024;

/// The default `--stall-after`: the longest stall window a run's pace
/// gives it, and its window until it has shown its pace (15 minutes).
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(15 * 60);

/// How often, by default, the head decides the health of the runs whose
/// health may change now: a stall and its end are seen within about a
/// second, whatever the lease sweep's period.
pub const DEFAULT_HEALTH_TICK: Duration = Duration::from_secs(1);

/// How the state actor is configured.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StateConfig {
    /// The registry name of the actor (its supervisor is `<name>.supervisor`).
    pub name: String,
    /// Where runs are kept.
    pub store: StoreConfig,
    /// How long a live run stays live without a heartbeat.
    pub lease: Duration,
    /// How many ended runs are kept, and for how long.
    pub retention: Retention,
    /// Writes in flight past which new writes are refused as overloaded.
    pub max_in_flight_writes: usize,
    /// How often the liveness sweep runs; `None` picks a quarter of the lease.
    pub sweep_interval: Option<Duration>,
    /// The longest stall window of a run whose joins ask for no window of
    /// their own (`stall_after_ms`): its window follows its pace up to
    /// this, and is this until it has shown its pace (`docs/health.md`,
    /// "How long a stall window is"). 15 minutes by default.
    pub stall_after: Duration,
    /// How often the health of the runs whose health may change now (a
    /// stall a rank's advance ended, a stall window just passed) is
    /// decided; `None`: every second ([`DEFAULT_HEALTH_TICK`]). The lease
    /// sweep decides every run's health besides.
    pub health_tick: Option<Duration>,
    /// How many recent events are kept for subscribers that resume.
    pub event_backlog: usize,
    /// How many bytes of recent events (the runs' JSON they carry) are
    /// kept, at most; the newest event is kept whatever its size.
    pub event_backlog_bytes: usize,
    /// The clock that leases, end times and retention ages are read from.
    pub clock: Arc<dyn Clock>,
    /// The name of this head's cluster, stamped on every run registered
    /// with it. Runs of other clusters (forwarded to this head as a hub)
    /// change only through forwarding and are never aborted by its sweep.
    pub cluster: Option<String>,
    /// Runs whose stored form does not load are moved aside (SQLite: the
    /// table `quarantined_runs`; PostgreSQL: `trainstate_quarantined_runs`),
    /// logged one by one, and the store starts without them; otherwise such
    /// a run refuses the store, naming the run.
    pub quarantine_corrupt: bool,
    /// Test-only fault hooks.
    #[cfg(feature = "fault-injection")]
    pub faults: Arc<crate::engine::faults::Faults>,
}

impl StateConfig {
    /// A durable store in the SQLite file at `path` (created if missing).
    pub fn sqlite(path: impl Into<PathBuf>) -> Self {
        Self::with_store(StoreConfig::Sqlite { path: path.into(), synchronous: Synchronous::Full })
    }

    /// A durable store in the PostgreSQL database at `url`, which other
    /// heads may share (see [`PostgresConfig`]).
    pub fn postgres(url: impl Into<String>) -> Self {
        Self::with_store(StoreConfig::Postgres(PostgresConfig::new(url)))
    }

    /// An ephemeral store: runs live in memory only and are lost when the
    /// process ends.
    pub fn in_memory() -> Self {
        Self::with_store(StoreConfig::InMemory)
    }

    fn with_store(store: StoreConfig) -> Self {
        Self {
            name: DEFAULT_STATE_ACTOR_NAME.to_owned(),
            store,
            lease: DEFAULT_LEASE,
            retention: Retention::default(),
            max_in_flight_writes: DEFAULT_MAX_IN_FLIGHT_WRITES,
            sweep_interval: None,
            stall_after: DEFAULT_STALL_AFTER,
            health_tick: None,
            event_backlog: DEFAULT_EVENT_BACKLOG,
            event_backlog_bytes: DEFAULT_EVENT_BACKLOG_BYTES,
            clock: Arc::new(SystemClock),
            cluster: None,
            quarantine_corrupt: false,
            #[cfg(feature = "fault-injection")]
            faults: Arc::default(),
        }
    }

    /// Registers the actor under `name` instead of the default.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the lease of live runs.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the stall window of runs that ask for none.
    pub fn with_stall_after(mut self, stall_after: Duration) -> Self {
        self.stall_after = stall_after;
        self
    }

    /// Sets how often the health of the runs whose health may change now
    /// is decided (tests that drive it themselves make it rare).
    pub fn with_health_tick(mut self, every: Duration) -> Self {
        self.health_tick = Some(every);
        self
    }

    /// How often the health tick runs.
    pub(crate) fn health_every(&self) -> Duration {
        self.health_tick.unwrap_or(DEFAULT_HEALTH_TICK).max(Duration::from_millis(10))
    }

    /// The stall window of runs that ask for none, in ms.
    pub(crate) fn stall_after_ms(&self) -> u64 {
        u64::try_from(self.stall_after.as_millis()).unwrap_or(u64::MAX)
    }

    /// Sets the retention policy.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Sets the bound on writes in flight.
    pub fn with_max_in_flight_writes(mut self, max: usize) -> Self {
        self.max_in_flight_writes = max;
        self
    }

    /// Sets how often the liveness sweep runs.
    pub fn with_sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = Some(interval);
        self
    }

    /// Sets how many recent events are kept for subscribers that resume.
    pub fn with_event_backlog(mut self, events: usize) -> Self {
        self.event_backlog = events;
        self
    }

    /// Sets how many bytes of recent events are kept, at most.
    pub fn with_event_backlog_bytes(mut self, bytes: usize) -> Self {
        self.event_backlog_bytes = bytes;
        self
    }

    /// Reads time from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Names this head's cluster (see [`StateConfig::cluster`]). The name
    /// follows [`trainstate_schema::validate_name`]'s rule.
    pub fn with_cluster(mut self, cluster: Option<String>) -> Self {
        self.cluster = cluster;
        self
    }

    /// Sets SQLite's `synchronous` level (durable stores only).
    pub fn with_synchronous(mut self, level: Synchronous) -> Self {
        if let StoreConfig::Sqlite { synchronous, .. } = &mut self.store {
            *synchronous = level;
        }
        self
    }

    /// Moves runs that do not load aside instead of refusing the store (see
    /// [`StateConfig::quarantine_corrupt`]).
    pub fn with_quarantine_corrupt(mut self, quarantine: bool) -> Self {
        self.quarantine_corrupt = quarantine;
        self
    }

    /// Installs test-only fault hooks.
    #[cfg(feature = "fault-injection")]
    pub fn with_faults(mut self, faults: Arc<crate::engine::faults::Faults>) -> Self {
        self.faults = faults;
        self
    }

    pub(crate) fn sweep_every(&self) -> Duration {
        self.sweep_interval.unwrap_or(self.lease / 4).max(Duration::from_millis(10))
    }
}
