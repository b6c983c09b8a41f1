//! The client commands of the `trainstate` binary: `runs list`, `runs show`,
//! `runs stacks`, `nodes [show NODE]`, `goodput` and `token create|list|revoke`, each a request to a head service over
//! HTTP, and the flags every command that reaches a head shares
//! ([`HeadArgs`], [`connect`]). The binary (in trainstate-actor) parses its
//! command line with these and runs them.
//!
//! Environment variables are read here only through clap's `env` flags: the
//! binary's edge.

mod goodput;
mod nodes;
mod runs;
mod stacks;
mod token;

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use crate::{StateError, StateHandle, TrustedCas};

pub use goodput::{By as GoodputByArg, GoodputArgs, goodput};
pub use nodes::{NodesArgs, NodesCommand, NodesList, nodes};
pub use runs::runs;
pub use token::{TokenCommand, token};

/// The head a command reaches, and how it prints.
#[derive(Debug, Args)]
pub struct HeadArgs {
    /// The head service.
    #[arg(long, env = "TRAINSTATE_URL", default_value = "http://127.0.0.1:8266")]
    pub url: String,
    /// File holding the bearer token (needed when reads are protected).
    #[arg(long, env = "TRAINSTATE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA(s) that signed the head's certificate, for an
    /// https:// --url: trusted instead of the system's roots.
    #[arg(long, env = "TRAINSTATE_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `trainstate runs …`: reading runs from a head.
#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first.
    List {
        /// The head.
        #[command(flatten)]
        head: HeadArgs,
        /// Only these statuses (comma-separated).
        #[arg(long, value_delimiter = ',')]
        status: Vec<String>,
        /// Only runs of this job.
        #[arg(long)]
        job: Option<String>,
        /// Only runs whose name contains this text.
        #[arg(long)]
        name: Option<String>,
        /// Only runs whose health is this state: STALLED (stalled now; not
        /// a run that ended while stalled) or PROGRESSING.
        #[arg(long, value_name = "STATE")]
        health: Option<String>,
        /// How many runs.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show one run: workers, datasets, attempts, status detail.
    Show {
        /// The head.
        #[command(flatten)]
        head: HeadArgs,
        /// The run id.
        id: String,
    },
    /// Where every rank of a run is stuck: its newest stack capture, the
    /// suspects first, then the groups of ranks stuck in the same place.
    Stacks {
        /// The head.
        #[command(flatten)]
        head: HeadArgs,
        /// The run id.
        id: String,
        /// Ask the run's ranks for their stacks now, wait for the capture
        /// to complete (at most 40 s) and print it.
        #[arg(long)]
        capture: bool,
        /// Print every rank's stack too.
        #[arg(long)]
        all: bool,
    },
}

/// The token in `path`, without surrounding whitespace; the error names
/// `--token-file`. A file that group or others may read is still taken,
/// with a warning on stderr naming it and its mode (see
/// [`token_file_warning`]).
pub fn read_token_file(path: &Path) -> Result<String, String> {
    let token = std::fs::read_to_string(path)
        .map(|token| token.trim().to_owned())
        .map_err(|e| format!("cannot read --token-file {}: {e}", path.display()))?;
    if let Some(warning) = token_file_warning(path) {
        eprintln!("trainstate: warning: {warning}");
    }
    Ok(token)
}

/// The warning a token file at `path` deserves: `Some` when group or
/// others may read it. Warned, not refused (as `ssh` refuses a key): a
/// token file shared on purpose (a group's read-only token on a shared
/// mount) and jobs started from files made before this check keep
/// working, and the warning says how to close it.
#[cfg(unix)]
pub fn token_file_warning(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;

    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o044 != 0).then(|| {
        format!(
            "--token-file {} is {mode:03o}: other local users can read the token; \
             make it readable by its owner alone (chmod 600 {})",
            path.display(),
            path.display()
        )
    })
}

/// The warning a token file at `path` deserves: none where file modes do
/// not say who may read it.
#[cfg(not(unix))]
pub fn token_file_warning(_path: &Path) -> Option<String> {
    None
}

/// The CAs in `--ca-cert`'s file, if one is given; the error names the flag.
pub fn read_ca_cert(path: Option<&Path>) -> Result<Option<TrustedCas>, String> {
    path.map(|path| TrustedCas::from_pem_file(path).map_err(|e| ca_cert_error(path, &e)))
        .transpose()
}

/// `err`, about the CA file at `path`, as the flag's error.
fn ca_cert_error(path: &Path, err: &StateError) -> String {
    match err {
        StateError::Invalid { message, .. } => {
            format!("--ca-cert {}: {message}", path.display())
        }
        other => format!("--ca-cert {}: {other}", path.display()),
    }
}

/// Connects to the head at `url` (named by `flag`), trusting `cas` for an
/// https:// URL; an error names the flag at fault.
pub fn connect(
    flag: &str,
    url: &str,
    token: Option<String>,
    ca_path: Option<&Path>,
    cas: Option<&TrustedCas>,
) -> Result<StateHandle, String> {
    StateHandle::connect_with_ca(url, token, cas).map_err(|err| match (&err, ca_path) {
        (StateError::Invalid { field, .. }, Some(path)) if field == "ca_cert" => {
            ca_cert_error(path, &err)
        }
        _ => format!("{flag} {url}: {err}"),
    })
}

/// Runs `command` on a runtime of its own: its output on stdout, or its
/// error on stderr and a failure.
fn block_on(
    command: impl std::future::Future<Output = Result<String, String>>,
) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("trainstate: cannot start the runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(command) {
        Ok(text) => {
            print!("{text}");
            std::process::ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("trainstate: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}
