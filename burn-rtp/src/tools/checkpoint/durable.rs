//! Writes that survive a crash: a file is whole or absent, flushed to the disk with the folder
//! entry that names it, and each step of a save is a point a test can kill the process at.

use super::{fault, io, CheckpointError};
use std::path::Path;

/// Writes `bytes` to a new file at `path` and flushes it to the disk. On a save, `rank` marks
/// the save points: one with the file half written, one once it is whole.
pub(super) fn write_synced(
    rank: Option<usize>,
    path: &Path,
    bytes: &[u8],
) -> Result<(), CheckpointError> {
    use std::io::Write;
    let mut file = std::fs::File::create(path).map_err(io(path))?;
    let half = bytes.len() / 2;
    file.write_all(&bytes[..half]).map_err(io(path))?;
    save_point(rank, "a file half written");
    file.write_all(&bytes[half..]).map_err(io(path))?;
    file.sync_all().map_err(io(path))?;
    save_point(rank, "a file written");
    Ok(())
}

/// Marks a point of the save protocol (see [`KILL_AT_SAVE_POINT`]); `None` outside a save.
pub(super) fn save_point(rank: Option<usize>, name: &str) {
    if let Some(rank) = rank {
        fault::point(rank, name);
    }
}

/// Flushes a folder's entries (a file created or renamed in it) to the disk. A file system
/// that cannot sync a folder (`EINVAL`) is taken at its word.
pub(super) fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    match std::fs::File::open(path).and_then(|dir| dir.sync_all()) {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
        other => other.map_err(io(path)),
    }
}

/// The folder holding `path` (`.` for a bare file name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes `bytes` to `path` under a temporary name first, so `path` is whole or absent, and
/// flushes both the file and the rename to the disk.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    write_atomic_at(None, path, bytes)
}

/// [`write_atomic`] with save points on `rank`.
pub(super) fn write_atomic_at(
    rank: Option<usize>,
    path: &Path,
    bytes: &[u8],
) -> Result<(), CheckpointError> {
    let tmp = path.with_extension("tmp");
    write_synced(rank, &tmp, bytes)?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    sync_dir(parent_of(path))?;
    save_point(rank, "a file renamed into place");
    Ok(())
}
