//! The command line: `serve`, `runs list|show|stacks`, `schema`,
//! `ingest ray-export`, `backup`, `token create|list|revoke`. The commands
//! that only talk to a head (`runs`, `token`) are trainstate-client's
//! (`trainstate_client::cli`); this composes them with the head's own.
//!
//! Environment variables are read here, at the edge, and nowhere else.

mod backup;
mod demo;
mod duration;
mod ingest;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use trainstate_client::cli::{RunsCommand, TokenCommand, connect, read_ca_cert, read_token_file};

/// Run-state tracking for distributed training.
#[derive(Debug, Parser)]
#[command(name = "trainstate", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the head service: the state actor, its store and the HTTP API.
    Serve(Box<ServeArgs>),
    /// Read runs from a head service.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// The node ledger: nodes seen under runs, their failures and the
    /// suspects (`nodes show NODE`: one node and the runs behind its counts).
    Nodes(trainstate_client::cli::NodesArgs),
    /// What the runs cost: their goodput and badput, in GPU-hours, summed
    /// by cluster, node or run name over a window.
    Goodput(trainstate_client::cli::GoodputArgs),
    /// Print the JSON Schema of a wire type (or list the types).
    Schema {
        /// The type, for example TrainRunInfo.
        r#type: Option<String>,
    },
    /// Copy a SQLite store consistently, while a head serves from it or not
    /// (restore: stop the head, put the copy in place as trainstate.db, and
    /// remove trainstate.db-wal and trainstate.db-shm).
    Backup(backup::BackupArgs),
    /// Create, list and revoke a head service's bearer tokens (needs a token
    /// with the scope admin in --token-file).
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Apply another system's record of its runs to a head service.
    Ingest {
        #[command(subcommand)]
        command: ingest::IngestCommand,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "TRAINSTATE_LISTEN", default_value = "127.0.0.1:8266")]
    listen: String,
    /// Directory of the store (created if missing).
    #[arg(long, env = "TRAINSTATE_DATA_DIR", default_value = "trainstate-data")]
    data_dir: PathBuf,
    /// Keep runs in memory only: nothing survives the process.
    #[arg(long, env = "TRAINSTATE_IN_MEMORY")]
    in_memory: bool,
    /// Keep runs in PostgreSQL instead of SQLite in --data-dir:
    /// postgres://user:password@host:port/database. Several heads may share it.
    #[arg(long, env = "TRAINSTATE_STORE", hide_env_values = true)]
    store: Option<String>,
    /// This head's cluster name, stamped on every run registered with it.
    #[arg(long, env = "TRAINSTATE_CLUSTER")]
    cluster: Option<String>,
    /// Forward every committed run to the hub at this URL (needs --cluster).
    #[arg(long, env = "TRAINSTATE_FORWARD_TO")]
    forward_to: Option<String>,
    /// File holding the bearer token of the hub's writes: best one bound to this
    /// head's cluster (`trainstate token create --scope write --cluster NAME` on the hub).
    #[arg(long, env = "TRAINSTATE_FORWARD_TOKEN_FILE")]
    forward_token_file: Option<PathBuf>,
    /// PEM file of the CA(s) that signed the hub's certificate, for
    /// --forward-to https://...: trusted instead of the system's roots.
    #[arg(long, env = "TRAINSTATE_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate chain (the server's certificate
    /// first); needs --tls-key. SIGHUP reads both files again.
    #[arg(long, env = "TRAINSTATE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "TRAINSTATE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How long a live run stays live without a heartbeat (e.g. 2s, 60s, 5m).
    #[arg(long, env = "TRAINSTATE_LEASE", default_value = "60s", value_parser = duration::parse)]
    lease: Duration,
    /// The longest stall window of a run whose ranks ask for no window of
    /// their own (e.g. 90s, 15m, 2h): such a run's window is 10 times its
    /// slowest recent step, at least a minute and at most this, and this
    /// until it has shown its pace; 1s to 7 days.
    #[arg(long, env = "TRAINSTATE_STALL_AFTER", default_value = "15m", value_parser = duration::parse)]
    stall_after: Duration,
    /// The most runs kept; the oldest ended runs are evicted first.
    #[arg(long, env = "TRAINSTATE_MAX_RUNS", default_value_t = trainstate_actor::DEFAULT_MAX_RUNS)]
    max_runs: usize,
    /// The most live (not ended) runs, of every source; a new live run past it is
    /// refused (503 overloaded) until one ends. Default: --max-runs; at most --max-runs.
    #[arg(long, env = "TRAINSTATE_MAX_LIVE_RUNS")]
    max_live_runs: Option<usize>,
    /// The most bytes of the runs kept (their JSON, stack captures and metric
    /// histories, in memory and in the store); the oldest ended runs are evicted
    /// first. Live runs are never evicted: see --max-live-bytes.
    #[arg(long, env = "TRAINSTATE_MAX_RETAINED_BYTES", default_value_t = trainstate_actor::DEFAULT_MAX_RETAINED_BYTES)]
    max_retained_bytes: u64,
    /// The most bytes the live (not ended) runs may take together; a write that
    /// would grow them past it is refused (503 unavailable) until a run ends.
    /// Default: --max-retained-bytes; at most --max-retained-bytes.
    #[arg(long, env = "TRAINSTATE_MAX_LIVE_BYTES")]
    max_live_bytes: Option<u64>,
    /// Evict ended runs older than this (e.g. 30d is not accepted; use 720h).
    #[arg(long, env = "TRAINSTATE_MAX_AGE", value_parser = duration::parse)]
    max_age: Option<Duration>,
    /// File holding the head's own bearer token, which has every scope (read,
    /// write, admin): with it, the head checks tokens (`trainstate token create`
    /// makes more, with fewer scopes).
    #[arg(long, env = "TRAINSTATE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// The bearer token itself (prefer --token-file: arguments are visible to other users).
    #[arg(long, env = "TRAINSTATE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Reads need the token too.
    #[arg(long, env = "TRAINSTATE_PROTECT_READS")]
    protect_reads: bool,
    /// Allow listening on a non-loopback address without a token, and serve any
    /// `Host` header without one (otherwise only loopback names and the listen address).
    #[arg(long, env = "TRAINSTATE_INSECURE")]
    insecure: bool,
    /// Origins allowed by CORS (repeat, or comma-separated).
    #[arg(long = "cors-origin", env = "TRAINSTATE_CORS_ORIGINS", value_delimiter = ',')]
    cors_origins: Vec<String>,
    /// URL template of a run's or a worker's logs, shown as links on the page and by
    /// `runs show`: placeholders {run_id}, {run_name}, {job_id}, {attempt_id},
    /// {start_ms}, {end_ms}, and per worker {rank}, {node_id}, {node_ip}, {pid}, in
    /// the path, query or fragment only (never the host or port), filled percent-encoded.
    #[arg(long, env = "TRAINSTATE_LOGS_URL")]
    logs_url: Option<String>,
    /// URL template of a run's or a worker's metrics dashboard (placeholders as --logs-url).
    #[arg(long, env = "TRAINSTATE_METRICS_URL")]
    metrics_url: Option<String>,
    /// Tell this webhook of each run that errors, is aborted, stalls (and
    /// recovers) or restarts: a JSON document per event, POSTed, with a
    /// stable event_id (at least once). Repeat for several (in the variable:
    /// separated by spaces). Options after '#' (never sent):
    /// events=errored,aborted,finished,stalled,restarting, cluster=A,B,
    /// run_name=PATTERN (* matches any text), target=NAME,
    /// classes=application,infrastructure,interrupted,no_progress,
    /// causes=KIND,... or causes=!KIND,... (see docs/notify.md).
    #[arg(
        long = "notify-webhook",
        env = "TRAINSTATE_NOTIFY_WEBHOOK",
        value_name = "URL",
        value_delimiter = ' ',
        hide_env_values = true
    )]
    notify_webhook: Vec<String>,
    /// Tell this Slack incoming webhook, as a Block Kit message (options as
    /// --notify-webhook). Its URL is a secret: prefer the variable.
    #[arg(
        long = "notify-slack",
        env = "TRAINSTATE_NOTIFY_SLACK",
        value_name = "URL",
        value_delimiter = ' ',
        hide_env_values = true
    )]
    notify_slack: Vec<String>,
    /// Tell this Alertmanager (its base URL; alerts go to /api/v2/alerts),
    /// an alert per run and condition, resolved when it clears (options as
    /// --notify-webhook, and resend=DURATION, 60s by default).
    #[arg(
        long = "notify-alertmanager",
        env = "TRAINSTATE_NOTIFY_ALERTMANAGER",
        value_name = "URL",
        value_delimiter = ' ',
        hide_env_values = true
    )]
    notify_alertmanager: Vec<String>,
    /// The most events a notification target holds to send; while it fails,
    /// the oldest past this are dropped (counted in trainstate_notify_dropped_total).
    #[arg(long, env = "TRAINSTATE_NOTIFY_BACKLOG", default_value_t = trainstate_actor::notify::DEFAULT_NOTIFY_BACKLOG)]
    notify_backlog: usize,
    /// This head's URL as people reach it (`https://trainstate.example`):
    /// notifications link each run's page under it.
    #[arg(long, env = "TRAINSTATE_PUBLIC_URL")]
    public_url: Option<String>,
    /// The largest request body, in bytes.
    #[arg(long, env = "TRAINSTATE_MAX_BODY_BYTES", default_value_t = trainstate_actor::http::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// The most concurrent event subscribers.
    #[arg(long, env = "TRAINSTATE_MAX_SUBSCRIBERS", default_value_t = trainstate_actor::http::DEFAULT_MAX_SUBSCRIBERS)]
    max_subscribers: usize,
    /// How long a client may take to send a request's headers; also how long a
    /// kept-alive connection may stay idle between requests.
    #[arg(long, env = "TRAINSTATE_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = duration::parse)]
    header_read_timeout: Duration,
    /// The most open connections; further clients wait until one closes.
    #[arg(long, env = "TRAINSTATE_MAX_CONNECTIONS", default_value_t = trainstate_actor::http::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// The most open connections from one client address (an IPv6 /64 counts
    /// as one); one more is closed at once. Behind a proxy every client is the
    /// proxy's address: raise it to --max-connections there.
    #[arg(long, env = "TRAINSTATE_MAX_CONNECTIONS_PER_CLIENT", default_value_t = trainstate_actor::http::DEFAULT_MAX_CONNECTIONS_PER_CLIENT)]
    max_connections_per_client: usize,
    /// The most bytes of request bodies received and being handled at once,
    /// counted as they arrive (each body's first 64 KiB aside); past it, a
    /// write gets 503 overloaded.
    #[arg(long, env = "TRAINSTATE_MAX_BODY_BYTES_IN_FLIGHT", default_value_t = trainstate_actor::http::DEFAULT_MAX_BODY_BYTES_IN_FLIGHT)]
    max_body_bytes_in_flight: usize,
    /// How long a request body may send nothing before it is cut off (408).
    #[arg(long, env = "TRAINSTATE_BODY_READ_TIMEOUT", default_value = "10s", value_parser = duration::parse)]
    body_read_timeout: Duration,
    /// The most recent events kept for subscribers that resume (and that live
    /// subscribers are served from).
    #[arg(long, env = "TRAINSTATE_EVENT_BACKLOG", default_value_t = trainstate_actor::DEFAULT_EVENT_BACKLOG)]
    event_backlog: usize,
    /// The most bytes of recent events kept (the runs' JSON they carry).
    #[arg(long, env = "TRAINSTATE_EVENT_BACKLOG_BYTES", default_value_t = trainstate_actor::DEFAULT_EVENT_BACKLOG_BYTES)]
    event_backlog_bytes: usize,
    /// The most bytes of listings and event snapshots held for clients that read
    /// slowly, in all; past it, listings get 503 overloaded.
    #[arg(long, env = "TRAINSTATE_MAX_ANSWER_BYTES", default_value_t = trainstate_actor::http::DEFAULT_MAX_ANSWER_BYTES)]
    max_answer_bytes: usize,
    /// The most ranks /metrics shows one by one (trainstate_rank_step and
    /// trainstate_rank_last_advance_timestamp_seconds, labelled run_id and rank);
    /// the rest are counted in trainstate_rank_series_omitted. 0: none.
    #[arg(long, env = "TRAINSTATE_PROMETHEUS_RANK_SERIES", default_value_t = trainstate_actor::http::DEFAULT_PROMETHEUS_RANK_SERIES)]
    prometheus_rank_series: usize,
    /// How long open connections get to finish on SIGTERM/SIGINT before they are closed.
    #[arg(long, env = "TRAINSTATE_SHUTDOWN_GRACE", default_value = "10s", value_parser = duration::parse)]
    shutdown_grace: Duration,
    /// SQLite synchronous=NORMAL instead of FULL (faster; the last commits may be lost on power loss).
    #[arg(long, env = "TRAINSTATE_SYNC_NORMAL")]
    sync_normal: bool,
    /// Move stored runs that do not load (a damaged row) aside into the store's
    /// quarantine table, logging each, and start without them.
    #[arg(long, env = "TRAINSTATE_QUARANTINE_CORRUPT")]
    quarantine_corrupt: bool,
    /// Start although the data directory was in use and its store file is now
    /// missing or empty (0 bytes): begins a new, empty store.
    #[arg(long, env = "TRAINSTATE_ALLOW_EMPTY_STORE")]
    allow_empty_store: bool,
    /// Drive a few simulated runs so there is something to look at.
    #[arg(long, env = "TRAINSTATE_DEMO")]
    demo: bool,
    /// Log JSON lines instead of human-readable text.
    #[arg(long, env = "TRAINSTATE_LOG_JSON")]
    log_json: bool,
}

pub(crate) fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Runs { command } => trainstate_client::cli::runs(command),
        Command::Nodes(args) => trainstate_client::cli::nodes(args),
        Command::Goodput(args) => trainstate_client::cli::goodput(args),
        Command::Schema { r#type } => schema(r#type.as_deref()),
        Command::Ingest { command } => ingest::run(command),
        Command::Backup(args) => backup::run(args),
        Command::Token { command } => trainstate_client::cli::token(command),
    }
}

/// `trainstate schema`: the JSON Schema of a wire type, or the list of them.
fn schema(name: Option<&str>) -> ExitCode {
    let schemas = trainstate_schema::openapi::wire_schemas();
    match name {
        None => {
            for (name, _) in &schemas {
                println!("{name}");
            }
            ExitCode::SUCCESS
        }
        Some(name) => match schemas.iter().find(|(n, _)| *n == name) {
            Some((_, schema)) => {
                println!("{}", serde_json::to_string_pretty(schema.as_value()).unwrap_or_default());
                ExitCode::SUCCESS
            }
            None => {
                let known: Vec<&str> = schemas.iter().map(|(n, _)| *n).collect();
                eprintln!("trainstate: no wire type named {name:?}; known: {}", known.join(", "));
                ExitCode::FAILURE
            }
        },
    }
}
