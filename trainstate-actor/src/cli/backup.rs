//! `trainstate backup`: a consistent copy of a SQLite store, taken while the
//! head serves from it (or not).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use rusqlite::{Connection, OpenFlags};

/// The store file in a data directory (as `serve` names it).
const STORE_FILE: &str = "trainstate.db";

#[derive(Debug, Args)]
pub(crate) struct BackupArgs {
    /// The data directory of the store to copy.
    #[arg(long, env = "TRAINSTATE_DATA_DIR", default_value = "trainstate-data")]
    data_dir: PathBuf,
    /// The file to write the copy to; it must not exist.
    to: PathBuf,
}

pub(crate) fn run(args: BackupArgs) -> ExitCode {
    match backup(&args.data_dir.join(STORE_FILE), &args.to) {
        Ok(runs) => {
            println!("backed up {runs} runs to {}", args.to.display());
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("trainstate: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Copies the store at `from` into a new file `to` with SQLite's
/// `VACUUM INTO`: one read transaction, so the copy is one consistent
/// moment of the store, including what is still in its WAL, while a head
/// goes on writing. Then checks the copy. Returns how many runs it holds.
fn backup(from: &Path, to: &Path) -> Result<u64, String> {
    match std::fs::metadata(from) {
        Ok(meta) if meta.is_file() && meta.len() > 0 => {}
        Ok(_) => return Err(format!("{} is not a store (empty, or not a file)", from.display())),
        Err(err) => return Err(format!("cannot read {}: {err}", from.display())),
    }
    if to.exists() {
        return Err(format!("{} exists; refusing to overwrite it", to.display()));
    }
    let target = to.to_str().ok_or_else(|| format!("{}: not a UTF-8 path", to.display()))?;
    // Read-write, never create: a WAL store's readers share its -shm file.
    let conn = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("cannot open {}: {e}", from.display()))?;
    conn.busy_timeout(Duration::from_secs(30)).map_err(|e| e.to_string())?;
    conn.execute("VACUUM INTO ?1", [target])
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
    let copy = Connection::open_with_flags(to, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("cannot open the copy {}: {e}", to.display()))?;
    let check: String = copy
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .map_err(|e| format!("cannot check the copy {}: {e}", to.display()))?;
    if check != "ok" {
        return Err(format!("the copy {} fails SQLite's integrity check: {check}", to.display()));
    }
    copy.query_row("SELECT count(*) FROM runs", [], |row| row.get::<_, i64>(0))
        .map(|n| n as u64)
        .map_err(|e| format!("the copy {} holds no runs table: {e}", to.display()))
}
