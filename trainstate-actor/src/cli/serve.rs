//! `trainstate serve`: the head service.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use trainstate_actor::forward::ForwardConfig;
use trainstate_actor::http::{HttpConfig, ServerTls, TlsFileError};
use trainstate_actor::notify::{NotifyConfig, NotifyTarget};
use trainstate_actor::{Head, HeadConfig, Retention, StateConfig, Synchronous};
use trainstate_client::api::LinksResponse;

use super::ServeArgs;

const STORE_FILE: &str = "trainstate.db";

pub(crate) fn run(args: ServeArgs) -> ExitCode {
    init_logging(args.log_json);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => return fail(&format!("cannot start the runtime: {err}")),
    };
    match runtime.block_on(serve_until_signal(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(&message),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("trainstate: {message}");
    ExitCode::FAILURE
}

pub(super) fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn serve_until_signal(args: ServeArgs) -> Result<(), String> {
    let shutdown = shutdown_signals()?;
    let (head, tls) = head_config(&args).await?;
    reload_on_sighup(tls)?;
    let listening = Head::listen(head).await.map_err(|e| e.to_string())?;
    // A signal stops the head, loaded or not.
    tokio::spawn({
        let stopper = listening.stopper();
        async move {
            shutdown.await;
            stopper.stop();
        }
    });
    {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "listening on {}", listening.url());
        let _ = stdout.flush();
    }
    tracing::info!(data_dir = %args.data_dir.display(), "serving from the data directory");
    let Some(head) = listening.loaded().await.map_err(|e| e.to_string())? else {
        return Ok(());
    };
    if args.demo {
        super::demo::start(head.service().handle());
    }
    head.wait().await.map_err(|e| e.to_string())
}

/// The head the flags describe, every flag checked, and its TLS
/// certificate (reloaded on SIGHUP).
async fn head_config(args: &ServeArgs) -> Result<(HeadConfig, Option<Arc<ServerTls>>), String> {
    let token = read_token(args)?;
    // Every flag is checked before the head says it is listening.
    for (flag, template) in [("--logs-url", &args.logs_url), ("--metrics-url", &args.metrics_url)] {
        if let Some(template) = template {
            trainstate_client::links::check_template(template)
                .map_err(|e| format!("{flag}: {e}"))?;
        }
    }
    check_limits(args)?;
    let links = LinksResponse::new(args.logs_url.clone(), args.metrics_url.clone());
    let addr: SocketAddr = tokio::net::lookup_host(&args.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.listen))?
        .next()
        .ok_or_else(|| format!("--listen {}: no address", args.listen))?;
    if !addr.ip().is_loopback() && token.is_none() && !args.insecure {
        return Err(format!(
            "refusing to listen on {addr} without a token: anyone on the network could write. \
             Give --token-file FILE (or TRAINSTATE_TOKEN), or say --insecure if you mean it."
        ));
    }

    if let Some(cluster) = &args.cluster {
        trainstate_schema::validate_name("cluster", cluster)
            .map_err(|e| format!("--cluster: {e}"))?;
    }
    let forward = match (&args.forward_to, &args.cluster) {
        (Some(_), None) => {
            return Err(
                "--forward-to needs --cluster NAME, so the hub can tell this cluster's runs apart"
                    .into(),
            );
        }
        (Some(hub), Some(cluster)) => {
            let token = match &args.forward_token_file {
                Some(path) => Some(super::read_token_file(path)?),
                None => None,
            };
            // The hub's URL and CA are checked now, before `listening on`;
            // forwarding itself starts once the runs are loaded.
            let cas = super::read_ca_cert(args.ca_cert.as_deref())?;
            super::connect(
                "--forward-to",
                hub,
                token.clone(),
                args.ca_cert.as_deref(),
                cas.as_ref(),
            )?;
            Some(ForwardConfig::new(hub.clone(), cluster.clone()).with_token(token).with_cas(cas))
        }
        (None, _) => {
            if let Some(path) = &args.ca_cert {
                return Err(format!(
                    "--ca-cert {}: used only to reach a hub (--forward-to https://...), \
                     and there is no --forward-to",
                    path.display()
                ));
            }
            None
        }
    };
    let notify = notify_config(args)?;
    // Read before `listening on`, so that a bad file refuses to start.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(Arc::new(ServerTls::from_pem_files(cert, key).map_err(tls_file_error)?))
        }
        (None, None) => None,
        (Some(_), None) => return Err("--tls-cert needs --tls-key".into()),
        (None, Some(_)) => return Err("--tls-key needs --tls-cert".into()),
    };
    let postgres = match args.store.as_deref() {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            if args.in_memory {
                return Err("--store and --in-memory exclude each other".into());
            }
            Some(url.to_owned())
        }
        Some(other) => {
            return Err(format!(
                "--store {:?}: give a postgres:// URL (SQLite in --data-dir is the default)",
                other.split("://").next().unwrap_or(other)
            ));
        }
        None => None,
    };
    let mut config = if args.in_memory {
        StateConfig::in_memory()
    } else if let Some(url) = &postgres {
        StateConfig::postgres(url.clone())
    } else {
        private_data_dir(&args.data_dir)?;
        StateConfig::sqlite(args.data_dir.join(STORE_FILE))
    };
    config = config.with_cluster(args.cluster.clone());
    let mut retention = Retention::max_runs(args.max_runs)
        .with_max_bytes(args.max_retained_bytes)
        .with_max_live_runs(args.max_live_runs.unwrap_or(args.max_runs));
    if let Some(live_bytes) = args.max_live_bytes {
        retention = retention.with_max_live_bytes(live_bytes);
    }
    if let Some(age) = args.max_age {
        retention = retention.with_max_age(age);
    }
    config =
        config.with_lease(args.lease).with_retention(retention).with_stall_after(args.stall_after);
    config = config
        .with_event_backlog(args.event_backlog)
        .with_event_backlog_bytes(args.event_backlog_bytes);
    if args.sync_normal {
        config = config.with_synchronous(Synchronous::Normal);
    }
    config = config.with_quarantine_corrupt(args.quarantine_corrupt);
    #[cfg(feature = "fault-injection")]
    {
        config = config.with_faults(faults_from_env());
    }
    let http = HttpConfig::default()
        .with_token(token)
        .with_protected_reads(args.protect_reads)
        .with_max_body_bytes(args.max_body_bytes)
        .with_max_subscribers(args.max_subscribers)
        .with_header_read_timeout(args.header_read_timeout)
        .with_max_connections(args.max_connections)
        .with_max_connections_per_client(args.max_connections_per_client)
        .with_max_body_bytes_in_flight(args.max_body_bytes_in_flight)
        .with_body_read_timeout(args.body_read_timeout)
        .with_shutdown_grace(args.shutdown_grace)
        .with_max_answer_bytes(args.max_answer_bytes)
        .with_prometheus_rank_series(args.prometheus_rank_series)
        .with_any_host(args.insecure)
        .with_cors_origins(args.cors_origins.clone())
        .with_links(links)
        .with_tls(tls.clone());
    let head = HeadConfig::new(config, http)
        .with_address(addr)
        .with_allow_empty_store(args.allow_empty_store)
        .with_forward(forward)
        .with_notify(notify);
    Ok((head, tls))
}

/// The notification targets the flags give (`None`: none), checked: each
/// URL and its options, the names apart, the public URL, a store that
/// keeps positions. Every error names its flag.
fn notify_config(args: &ServeArgs) -> Result<Option<NotifyConfig>, String> {
    use trainstate_client::api::NotifyTargetKind;
    let given = [
        ("--notify-webhook", NotifyTargetKind::Webhook, &args.notify_webhook),
        ("--notify-slack", NotifyTargetKind::Slack, &args.notify_slack),
        ("--notify-alertmanager", NotifyTargetKind::Alertmanager, &args.notify_alertmanager),
    ];
    let mut targets = Vec::new();
    for (flag, kind, urls) in given {
        for url in urls.iter().map(|u| u.trim()).filter(|u| !u.is_empty()) {
            targets.push(NotifyTarget::parse(kind, url).map_err(|e| format!("{flag}: {e}"))?);
        }
    }
    if let Some(url) = &args.public_url {
        trainstate_actor::notify::check_public_url(url).map_err(|e| e.to_string())?;
    }
    if targets.is_empty() {
        return Ok(None);
    }
    if args.in_memory {
        return Err("--notify-webhook, --notify-slack and --notify-alertmanager need a store \
                    that keeps their positions; --in-memory keeps none"
            .into());
    }
    let config = NotifyConfig::new(targets)
        .and_then(|config| config.with_public_url(args.public_url.clone()))
        .map_err(|e| format!("--notify-*: {e}"))?;
    Ok(Some(config.with_backlog(args.notify_backlog)))
}

/// Test builds only: faults asked for by `TRAINSTATE_FAULTS` (comma-separated;
/// `panic-on-every-write`), and `TRAINSTATE_HOLD_LOAD_UNTIL=PATH`: the load
/// of the stored runs waits until a file exists at PATH.
#[cfg(feature = "fault-injection")]
fn faults_from_env() -> Arc<trainstate_actor::Faults> {
    let faults = Arc::new(trainstate_actor::Faults::default());
    if let Some(path) = std::env::var_os("TRAINSTATE_HOLD_LOAD_UNTIL") {
        faults.hold_load_until_exists(path.into());
    }
    for fault in std::env::var("TRAINSTATE_FAULTS").unwrap_or_default().split(',') {
        match fault.trim() {
            "panic-on-every-write" => faults.panic_on_every_write(),
            "" => {}
            other => tracing::warn!(fault = other, "unknown fault in TRAINSTATE_FAULTS"),
        }
    }
    faults
}

use trainstate_schema::limits::{MAX_STALL_WINDOW_MS, MIN_STALL_WINDOW_MS};

/// The shortest `--lease`: below it a heartbeat's round trip and the sweep's
/// own period (a quarter of the lease) leave no room for a healthy run.
pub(crate) const MIN_LEASE: Duration = Duration::from_secs(1);
/// The longest `--lease`: 30 days. Longer ones overflow the sweep's timers.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The longest `--max-age`: 100 years, far inside what milliseconds in a u64 hold.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Checks the flags that the store, the sweep and the router would otherwise
/// take as they are (wrapped, panicking, or silently dropped).
fn check_limits(args: &ServeArgs) -> Result<(), String> {
    if args.lease < MIN_LEASE || args.lease > MAX_LEASE {
        return Err(format!(
            "--lease {:?}: must be between {MIN_LEASE:?} and {}h",
            args.lease,
            MAX_LEASE.as_secs() / 3600
        ));
    }
    let stall_after_ms = args.stall_after.as_millis();
    if !(u128::from(MIN_STALL_WINDOW_MS)..=u128::from(MAX_STALL_WINDOW_MS))
        .contains(&stall_after_ms)
    {
        return Err(format!(
            "--stall-after {:?}: must be between 1s and {}h (7 days)",
            args.stall_after,
            MAX_STALL_WINDOW_MS / 3_600_000
        ));
    }
    if let Some(age) = args.max_age
        && age > MAX_AGE
    {
        return Err(format!(
            "--max-age {age:?}: at most {}h (100 years)",
            MAX_AGE.as_secs() / 3600
        ));
    }
    for origin in &args.cors_origins {
        trainstate_actor::http::check_cors_origin(origin)
            .map_err(|e| format!("--cors-origin {origin:?}: {e}"))?;
    }
    for (flag, value) in [
        ("--max-body-bytes", args.max_body_bytes),
        ("--max-connections", args.max_connections),
        ("--max-connections-per-client", args.max_connections_per_client),
        ("--max-body-bytes-in-flight", args.max_body_bytes_in_flight),
        ("--event-backlog", args.event_backlog),
        ("--max-answer-bytes", args.max_answer_bytes),
        ("--notify-backlog", args.notify_backlog),
    ] {
        if value == 0 {
            return Err(format!("{flag} must be at least 1"));
        }
    }
    if let Some(live) = args.max_live_runs {
        if live == 0 {
            return Err("--max-live-runs must be at least 1".into());
        }
        if live > args.max_runs {
            return Err(format!(
                "--max-live-runs {live}: at most --max-runs ({}): live runs are never evicted, \
                 so more of them than --max-runs would keep more runs than it allows",
                args.max_runs
            ));
        }
    }
    if let Some(live) = args.max_live_bytes {
        if live == 0 {
            return Err("--max-live-bytes must be at least 1".into());
        }
        if live > args.max_retained_bytes {
            return Err(format!(
                "--max-live-bytes {live}: at most --max-retained-bytes ({}): live runs are never \
                 evicted, so more bytes of them would keep more than it allows",
                args.max_retained_bytes
            ));
        }
    }
    if args.max_answer_bytes > u32::MAX as usize {
        return Err(format!("--max-answer-bytes {}: at most {}", args.max_answer_bytes, u32::MAX));
    }
    if args.body_read_timeout.is_zero() {
        return Err("--body-read-timeout must be more than 0 (0 would cut off every body)".into());
    }
    for (flag, value) in [
        ("--header-read-timeout", args.header_read_timeout),
        ("--body-read-timeout", args.body_read_timeout),
        ("--shutdown-grace", args.shutdown_grace),
    ] {
        if value > MAX_LEASE {
            return Err(format!("{flag} {value:?}: at most {}h", MAX_LEASE.as_secs() / 3600));
        }
    }
    Ok(())
}

fn read_token(args: &ServeArgs) -> Result<Option<String>, String> {
    let token = match (&args.token_file, &args.token) {
        (Some(path), _) => Some(super::read_token_file(path)?),
        (None, Some(token)) => Some(token.trim().to_owned()),
        (None, None) => None,
    };
    match token {
        Some(token) if token.is_empty() => Err("the token is empty".into()),
        other => Ok(other),
    }
}

/// `err` as the error of the flag whose file it is about.
fn tls_file_error(err: TlsFileError) -> String {
    match &err {
        TlsFileError::Certificate { .. } => format!("--tls-cert {err}"),
        TlsFileError::Key { .. } => format!("--tls-key {err}"),
        _ => format!("--tls-cert and --tls-key: {err}"),
    }
}

/// On SIGHUP, reads `--tls-cert` and `--tls-key` again: new handshakes use
/// the new certificate, open connections go on; a reload that fails keeps
/// the current certificate and logs why. Without TLS, SIGHUP is logged and
/// otherwise ignored: it never stops the head. Listened to from before
/// `listening on`.
fn reload_on_sighup(tls: Option<Arc<ServerTls>>) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup =
        signal(SignalKind::hangup()).map_err(|e| format!("cannot listen for SIGHUP: {e}"))?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            let Some(tls) = &tls else {
                tracing::info!("SIGHUP: nothing to reload (no --tls-cert)");
                continue;
            };
            match tls.reload() {
                Ok(()) => tracing::info!(
                    cert = %tls.cert_path().display(),
                    key = %tls.key_path().display(),
                    "SIGHUP: TLS certificate reloaded; new connections use it"
                ),
                Err(err) => tracing::error!(
                    "SIGHUP: TLS certificate not reloaded, the current one stays: {}",
                    tls_file_error(err)
                ),
            }
        }
    });
    Ok(())
}

/// SIGINT and SIGTERM, listened to from before the head is ready: a signal
/// that arrives right after `listening on` must shut down cleanly too.
pub(super) fn shutdown_signals() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot listen for SIGINT: {e}"))?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot listen for SIGTERM: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        }
    })
}

/// Creates the data directory `dir` readable by its owner alone (`0700`):
/// its store holds every run and the hashes of the head's tokens. An
/// existing directory that group or others may enter is tightened to
/// `0700` when this process's user owns it; one owned by another user is
/// left as it is, with a warning naming it and its mode.
fn private_data_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};

    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create data directory {}: {e}", dir.display()))?;
    let meta = std::fs::metadata(dir)
        .map_err(|e| format!("cannot inspect data directory {}: {e}", dir.display()))?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    // The owner of `/proc/self` is this process's user.
    let ours = std::fs::metadata("/proc/self").is_ok_and(|me| me.uid() == meta.uid());
    let tightened = ours
        && std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o700)).is_ok();
    if tightened {
        tracing::info!(
            data_dir = %dir.display(),
            "the data directory was {mode:03o}, open to other users; it is now {:03o}",
            mode & 0o700
        );
    } else {
        tracing::warn!(
            data_dir = %dir.display(),
            "the data directory {} is {mode:03o}: other local users may read its store \
             (every run and the token hashes); it is not this user's to tighten, so make it \
             0700 yourself",
            dir.display()
        );
    }
    Ok(())
}
