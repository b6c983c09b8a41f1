//! The store's files are its owner's alone: they hold every run and the
//! hashes of the head's tokens, so none is left readable by other local
//! users.

use std::fs::Permissions;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Whether this process's user owns the file `meta` describes (the owner
/// of `/proc/self` is this process's user).
pub(crate) fn owned_here(meta: &std::fs::Metadata) -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|me| me.uid() == meta.uid())
}

/// Makes the regular file at `path`, if it exists, readable and writable
/// by its owner alone (`0600`) when this process's user owns it; warns,
/// naming it, when another user owns a file that others may read.
pub(crate) fn owner_only(path: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return };
    if !meta.is_file() || meta.mode() & 0o077 == 0 {
        return;
    }
    if !(owned_here(&meta) && std::fs::set_permissions(path, Permissions::from_mode(0o600)).is_ok())
    {
        warn_open_to_others(path, meta.mode());
    }
}

/// Warns that the file at `path`, of `mode`, may be read by other users.
pub(crate) fn warn_open_to_others(path: &Path, mode: u32) {
    tracing::warn!(
        "{} is {:03o}: other local users may read it, and it is not this user's to tighten; \
         make it 0600 yourself",
        path.display(),
        mode & 0o777
    );
}
