//! The data directory's lock: one head at a time serves from a SQLite
//! store, whether the other head is another process or this one, and a
//! store that an earlier head opened is never silently started empty.

use std::collections::HashSet;
use std::fs::Permissions;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};

use super::private::{owned_here, warn_open_to_others};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The lock file in the data directory: held (an OS file lock) while a
/// head serves from it, released when the process dies, however it dies.
pub(crate) const LOCK_FILE: &str = "trainstate.lock";

/// The store file of a data directory as the binary lays it out, whose
/// lock is [`LOCK_FILE`].
const STORE_FILE: &str = "trainstate.db";

/// The lock file of the store file `store`: [`LOCK_FILE`] beside the
/// binary's `trainstate.db`, `<name>.lock` beside any other, so that a
/// library may keep two stores in one directory, each with its own lock.
fn lock_file_of(store: &Path) -> String {
    match store.file_name().map(|name| name.to_string_lossy()) {
        Some(name) if name != STORE_FILE => format!("{name}.lock"),
        _ => LOCK_FILE.to_owned(),
    }
}

/// The line the lock file gains once its head has opened the store (after
/// the pid on the first line).
const STORE_OPENED: &str = "store opened";

/// The data directories the heads of this process hold. An OS file lock
/// refuses a second holder in another process; this set refuses one in
/// this process, and names it.
static HELD_HERE: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// A data directory held by this head until dropped.
#[derive(Debug)]
pub(crate) struct DataDirLock {
    file: File,
    dir: PathBuf,
}

impl DataDirLock {
    /// Takes the lock of the directory holding the store file `store`, or
    /// explains who holds it; then refuses a store file that is missing or
    /// empty where an earlier head opened one (unless `allow_empty`).
    pub(crate) fn take(store: &Path, allow_empty: bool) -> Result<Self, String> {
        let dir = store.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let lock_file = lock_file_of(store);
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned()).join(&lock_file);
        {
            let mut held = HELD_HERE.lock().unwrap_or_else(|e| e.into_inner());
            if !held.get_or_insert_with(HashSet::new).insert(key.clone()) {
                return Err(format!(
                    "another head of this process (pid {}) is using data directory {}; \
                     stop it or choose another data directory",
                    std::process::id(),
                    dir.display()
                ));
            }
        }
        let taken = (|| {
            // A lock file that says a head opened its store here: one has
            // served from here before (a head stopped before its store
            // existed has not).
            let used_before = store_was_opened(dir, &lock_file);
            let file = lock_data_dir(dir, &lock_file)?;
            check_store_not_lost(store, dir, &lock_file, used_before, allow_empty)?;
            Ok(file)
        })();
        match taken {
            Ok(file) => Ok(Self { file, dir: key }),
            Err(err) => {
                release(&key);
                Err(err)
            }
        }
    }

    /// Writes that the store was opened into the held lock file: from now
    /// on a missing store in this directory means a lost one.
    pub(crate) fn mark_store_opened(&self) {
        let mut lock = &self.file;
        let _ = lock.set_len(0);
        let _ = lock.rewind();
        let _ = write!(lock, "{}\n{STORE_OPENED}\n", std::process::id());
        let _ = lock.flush();
    }
}

impl Drop for DataDirLock {
    fn drop(&mut self) {
        release(&self.dir);
    }
}

fn release(dir: &Path) {
    let mut held = HELD_HERE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(held) = held.as_mut() {
        held.remove(dir);
    }
}

/// Takes the data directory's OS file lock, or explains who holds it.
fn lock_data_dir(dir: &Path, lock_file: &str) -> Result<File, String> {
    let path = dir.join(lock_file);
    // Never follow a symlink: opening one would create or truncate whatever
    // it points at. Checked before opening (a dangling link would create its
    // target) and again after, against the file actually opened, before a
    // byte is written.
    refuse_symlink(&path)?;
    // Created readable and writable by this user alone, like the store.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let opened = file.metadata().map_err(|e| format!("cannot inspect {}: {e}", path.display()))?;
    let named = refuse_symlink(&path)?;
    if named.is_none_or(|named| (named.dev(), named.ino()) != (opened.dev(), opened.ino())) {
        return Err(format!("{} changed while it was being opened; refusing it", path.display()));
    }
    // A lock file an earlier version left open to others is tightened
    // through the handle opened, never through a path that could change.
    if opened.mode() & 0o077 != 0 {
        if owned_here(&opened) {
            let _ = file.set_permissions(Permissions::from_mode(0o600));
        } else {
            warn_open_to_others(&path, opened.mode());
        }
    }
    if file.try_lock().is_err() {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.lines().next().unwrap_or_default().trim();
        let who = if holder.is_empty() { String::new() } else { format!(" (pid {holder})") };
        return Err(format!(
            "another trainstate serve{who} is using data directory {}; \
             stop it or choose another --data-dir",
            dir.display()
        ));
    }
    // The pid replaces the last head's; whether a store was opened here stays.
    let mut before = String::new();
    let _ = file.read_to_string(&mut before);
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = write!(file, "{}", std::process::id());
    if before.lines().any(|line| line.trim() == STORE_OPENED) {
        let _ = write!(file, "\n{STORE_OPENED}\n");
    }
    let _ = file.flush();
    Ok(file)
}

/// Whether the lock file in `dir` says that a head opened its store there.
fn store_was_opened(dir: &Path, lock_file: &str) -> bool {
    std::fs::read_to_string(dir.join(lock_file))
        .is_ok_and(|text| text.lines().any(|line| line.trim() == STORE_OPENED))
}

/// Refuses to start from a store file that is missing or empty (0 bytes) in
/// a data directory an earlier head served from: the store was truncated or
/// removed, and starting would silently begin with no runs. With
/// `allow_empty` (`--allow-empty-store`), warns and starts.
fn check_store_not_lost(
    path: &Path,
    dir: &Path,
    lock_file: &str,
    used_before: bool,
    allow_empty: bool,
) -> Result<(), String> {
    let state = match std::fs::metadata(path) {
        Ok(meta) if meta.len() == 0 => "is empty (0 bytes)",
        Ok(_) => return Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => "is missing",
        Err(err) => return Err(format!("cannot inspect {}: {err}", path.display())),
    };
    if !used_before {
        return Ok(());
    }
    let message = format!(
        "{} {state}, but {} was in use by an earlier head (it holds {lock_file}): the store \
         was truncated or removed, and starting would begin with no runs",
        path.display(),
        dir.display()
    );
    if allow_empty {
        tracing::warn!("{message}; --allow-empty-store: starting an empty store");
        return Ok(());
    }
    let file = path
        .file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    Err(format!(
        "{message}. Restore {file} (with its -wal file) from a backup, or start with \
         --allow-empty-store to begin an empty store deliberately"
    ))
}

/// Refuses `path` if it is a symlink (or anything but a regular file);
/// returns its metadata if it exists.
fn refuse_symlink(path: &Path) -> Result<Option<std::fs::Metadata>, String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(format!(
            "{} is a symlink; refusing to follow it (remove it: the head creates its own lock file)",
            path.display()
        )),
        Ok(meta) if !meta.is_file() => {
            Err(format!("{} is not a regular file; refusing it", path.display()))
        }
        Ok(meta) => Ok(Some(meta)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(format!("cannot inspect {}: {err}", path.display())),
    }
}
