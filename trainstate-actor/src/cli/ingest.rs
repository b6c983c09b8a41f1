//! `trainstate ingest ray-export`: Ray's export events, applied to a head.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use trainstate_client::ray_export::{IngestConfig, IngestError, ingest};
use trainstate_client::{RunQuery, StateHandle};
use trainstate_schema::RunStatus;

/// How long one write may take, retries to an unreachable head included,
/// before the ingester says so and sends it again (writes are idempotent).
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Subcommand)]
pub(super) enum IngestCommand {
    /// Follow Ray Train V2's export events (event_EXPORT_TRAIN_STATE.log) and
    /// apply each run and attempt to the head, in order, from a durable position.
    RayExport(RayExportArgs),
}

#[derive(Debug, Args)]
pub(super) struct RayExportArgs {
    /// Ray's export events directory, e.g. /tmp/ray/session_latest/logs/export_events
    /// (a session directory works too).
    dir: PathBuf,
    /// The head service.
    #[arg(long, env = "TRAINSTATE_URL", default_value = "http://127.0.0.1:8266")]
    url: String,
    /// File holding the bearer token the head needs for writes.
    #[arg(long, env = "TRAINSTATE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// PEM file of the CA(s) that signed the head's certificate, for an
    /// https:// --url: trusted instead of the system's roots.
    #[arg(long, env = "TRAINSTATE_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// Where the ingester keeps its position across restarts.
    #[arg(
        long,
        env = "TRAINSTATE_INGEST_POSITION_FILE",
        default_value = "trainstate-ray-export.position"
    )]
    position_file: PathBuf,
    /// Read to the end of the file, then exit (instead of following it).
    #[arg(long)]
    once: bool,
    /// How often to look for new events (e.g. 250ms, 2s).
    #[arg(long, env = "TRAINSTATE_INGEST_POLL_INTERVAL", default_value = "250ms", value_parser = super::duration::parse)]
    poll_interval: Duration,
    /// Log JSON lines instead of human-readable text.
    #[arg(long, env = "TRAINSTATE_LOG_JSON")]
    log_json: bool,
}

pub(super) fn run(command: IngestCommand) -> ExitCode {
    let IngestCommand::RayExport(args) = command;
    super::serve::init_logging(args.log_json);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => return fail(&format!("cannot start the runtime: {err}")),
    };
    match runtime.block_on(ray_export(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(&message),
    }
}

/// SIGHUP (the terminal it ran in closed, a log rotator's signal) does not
/// stop the ingester: it is logged and ignored. There is nothing to reopen:
/// the ingester looks for Ray's files afresh at every poll, and logs to
/// stderr, which whoever rotates its log holds.
fn ignore_hangups() -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup =
        signal(SignalKind::hangup()).map_err(|e| format!("cannot listen for SIGHUP: {e}"))?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            tracing::info!("SIGHUP: ignored; ingesting goes on (SIGINT or SIGTERM stops it)");
        }
    });
    Ok(())
}

fn fail(message: &str) -> ExitCode {
    eprintln!("trainstate: {message}");
    ExitCode::FAILURE
}

async fn ray_export(args: RayExportArgs) -> Result<(), String> {
    let shutdown = super::serve::shutdown_signals()?;
    ignore_hangups()?;
    let token = args.token_file.as_deref().map(super::read_token_file).transpose()?;
    let cas = super::read_ca_cert(args.ca_cert.as_deref())?;
    let handle = super::connect("--url", &args.url, token, args.ca_cert.as_deref(), cas.as_ref())?
        .with_timeout(CALL_TIMEOUT);
    let config = IngestConfig::new(&args.dir, &args.position_file)
        .with_once(args.once)
        .with_poll_interval(args.poll_interval);
    tracing::info!(
        dir = %config.events_dir().display(),
        head = %args.url,
        position_file = %args.position_file.display(),
        once = args.once,
        "ingesting Ray's export events"
    );
    // While it follows Ray's events, the ingester renews the leases of the
    // live V2 runs: Ray's controller writes only on a change, and the head
    // aborts a run nothing told about for longer than its lease.
    let report = tokio::select! {
        report = ingest(&handle, &config, shutdown) => report,
        () = renew_v2_leases(&handle) => unreachable!("the renewals never end"),
    };
    let report = report.map_err(|e| match e {
        IngestError::NotAHead { .. } => format!("--url: {e}"),
        e => e.to_string(),
    })?;
    for position in &report.positions {
        tracing::info!(
            file = %position.file.display(),
            offset = position.offset,
            line = position.line,
            "position"
        );
    }
    tracing::info!(
        applied = report.applied,
        rejected = report.rejected,
        stale = report.stale,
        malformed = report.malformed,
        other = report.other,
        deaths = report.deaths,
        ended = report.ended,
        line_bytes_read = report.line_bytes_read,
        "stopped"
    );
    Ok(())
}

/// Renews, three times a lease, the lease of every live run the head
/// keeps that Ray Train V2 writes (a run whose controller does not
/// heartbeat): the ingester tells the head they are still followed. A run
/// whose end the ingester never reads (it stopped, or Ray's events
/// stopped) is then aborted by the head once its lease passes. Never
/// returns; failures are logged and tried again at the next round.
async fn renew_v2_leases(handle: &StateHandle) {
    // Until a heartbeat's answer tells the head's lease, often enough for
    // the shortest lease a head takes (1 s).
    let mut every = Duration::from_millis(300);
    let live: Vec<RunStatus> = RunStatus::ALL.iter().copied().filter(|s| s.is_live()).collect();
    loop {
        let mut query = RunQuery::new().statuses(live.iter().copied()).limit(1_000);
        loop {
            let page = match handle.list(query.clone()).await {
                Ok(page) => page,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot list the live runs to renew their leases");
                    break;
                }
            };
            for document in &page.runs {
                let Ok(run) = document.parse() else { continue };
                if run.heartbeats() {
                    continue;
                }
                match handle.heartbeat(run.id().clone()).await {
                    Ok(lease) => every = (lease / 3).max(Duration::from_millis(250)),
                    Err(err) => tracing::debug!(run = %run.id(), error = %err, "lease not renewed"),
                }
            }
            match page.next_cursor {
                Some(cursor) => query = query.after(cursor),
                None => break,
            }
        }
        // A pace, not a synchronisation: the renewals go on at their period.
        tokio::time::sleep(every).await;
    }
}
