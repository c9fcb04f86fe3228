//! Finding checkpoints: the newest complete one under a root, each verified against its
//! manifest before anything is loaded, and pruning the old ones and what killed saves left.

use super::fnv1a64;
use super::{
    check_shard_map, io, is_plain_name, model_file, optim_file, Checkpoint, CheckpointError,
    Manifest, FORMAT, MANIFEST,
};
use std::path::{Path, PathBuf};

/// Removes all but the newest `keep` (at least one) complete checkpoints under `root`, in the
/// order they were written, never the one `latest` names, and the folders killed saves left
/// behind (`.tmp-step-*`, `.replaced-step-*`). Folders whose manifest cannot be read are left
/// for a person to look at. Call it between saves (rank 0 after [`save`](super::save) returns, say): a save
/// in progress under the same root would lose its temporary folder. Returns what it removed.
pub fn prune(root: &Path, keep: usize) -> Result<Vec<PathBuf>, CheckpointError> {
    let latest = std::fs::read_to_string(root.join("latest"))
        .ok()
        .map(|name| root.join(name.trim()));
    let (mut complete, _) = Checkpoint::candidates(root)?;
    sort_newest_first(&mut complete);
    let mut removed = Vec::new();
    for old in complete.iter().skip(keep.max(1)) {
        if Some(&old.dir) != latest.as_ref() {
            std::fs::remove_dir_all(&old.dir).map_err(io(&old.dir))?;
            removed.push(old.dir.clone());
        }
    }
    for entry in std::fs::read_dir(root).map_err(io(root))? {
        let path = entry.map_err(io(root))?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let left_behind =
            name.is_some_and(|n| n.starts_with(".tmp-") || n.starts_with(".replaced-"));
        if left_behind && path.is_dir() {
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// When a checkpoint folder's manifest says it was written, and its step, read leniently
/// from a manifest that may not parse as a whole ((0, 0) when unreadable).
fn written_and_step(dir: &Path) -> (u64, u64) {
    let value: Option<serde_json::Value> = std::fs::read(dir.join(MANIFEST))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok());
    let field = |name: &str| {
        value
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    (field("written_unix_ns"), field("step"))
}

/// Newest first: by write time, then step.
fn sort_newest_first(checkpoints: &mut [Checkpoint]) {
    checkpoints.sort_by_key(|c| std::cmp::Reverse((c.manifest.written_unix_ns, c.manifest.step)));
}

/// A checkpoint folder under a root that was not used, and why.
#[derive(Debug)]
pub struct Skipped {
    /// The folder.
    pub dir: PathBuf,
    /// What is wrong with it.
    pub error: CheckpointError,
}

/// The newest complete checkpoint under a root, and the folders passed over to find it.
#[derive(Debug)]
pub struct Newest {
    /// The checkpoint, verified.
    pub checkpoint: Checkpoint,
    /// Newer checkpoints that failed verification, then folders whose manifest could not be
    /// read (whatever their age).
    pub skipped: Vec<Skipped>,
}

impl Checkpoint {
    /// Finds the checkpoint at `path` and checks every file's size and checksum against the
    /// manifest. `path` is a checkpoint folder, or a root: then the newest complete checkpoint
    /// under it ([`Checkpoint::newest`]; the folders it passes over are logged as warnings).
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        if path.join(MANIFEST).exists() {
            let checkpoint = Self::open_dir(path)?;
            checkpoint.verify()?;
            return Ok(checkpoint);
        }
        let newest = Self::newest(path)?;
        for skipped in &newest.skipped {
            tracing::warn!(dir = %skipped.dir.display(), "skipped checkpoint: {}", skipped.error);
        }
        Ok(newest.checkpoint)
    }

    /// Finds the checkpoint at `path` and checks its manifest and the files' sizes, without
    /// reading the files; each file read later is checked against its checksum as it is read.
    /// Given a root, it takes the newest checkpoint under it whose manifest and sizes check.
    pub fn open_manifest(path: &Path) -> Result<Self, CheckpointError> {
        if path.join(MANIFEST).exists() {
            return Self::open_dir(path);
        }
        let (mut complete, broken) = Self::candidates(path)?;
        sort_newest_first(&mut complete);
        match (complete.into_iter().next(), broken.into_iter().next()) {
            (Some(checkpoint), _) => Ok(checkpoint),
            (None, Some(first)) => Err(first.error),
            (None, None) => Err(CheckpointError::Missing {
                path: path.to_path_buf(),
            }),
        }
    }

    /// The newest complete checkpoint under `root`, by the time its manifest was written:
    /// each candidate is verified in turn, newest first, and the first whole one is taken.
    /// A root with no checkpoint folder is [`CheckpointError::Missing`]; one whose folders
    /// all fail is [`CheckpointError::NoneComplete`], naming the newest one's fault.
    pub fn newest(root: &Path) -> Result<Newest, CheckpointError> {
        let (mut candidates, broken) = Self::candidates(root)?;
        sort_newest_first(&mut candidates);
        let tried = candidates.len() + broken.len();
        let mut skipped = Vec::new();
        for checkpoint in candidates {
            match checkpoint.verify() {
                Ok(()) => {
                    skipped.extend(broken);
                    return Ok(Newest {
                        checkpoint,
                        skipped,
                    });
                }
                Err(error) => skipped.push(Skipped {
                    dir: checkpoint.dir,
                    error,
                }),
            }
        }
        skipped.extend(broken);
        let Some(first) = skipped.into_iter().next() else {
            return Err(CheckpointError::Missing {
                path: root.to_path_buf(),
            });
        };
        Err(CheckpointError::NoneComplete {
            root: root.to_path_buf(),
            tried,
            newest_dir: first.dir,
            newest: Box::new(first.error),
        })
    }

    /// The checkpoint folders directly under `root` (those holding a manifest, not hidden):
    /// those whose manifest and sizes check, and the others with their fault.
    fn candidates(root: &Path) -> Result<(Vec<Self>, Vec<Skipped>), CheckpointError> {
        let entries = std::fs::read_dir(root).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::Missing {
                path: root.to_path_buf(),
            },
            _ => CheckpointError::Io {
                path: root.to_path_buf(),
                source,
            },
        })?;
        let (mut good, mut bad) = (Vec::new(), Vec::new());
        for entry in entries {
            let dir = entry.map_err(io(root))?.path();
            let hidden = dir
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if hidden || !dir.join(MANIFEST).exists() {
                continue;
            }
            match Self::open_dir(&dir) {
                Ok(checkpoint) => good.push(checkpoint),
                Err(error) => bad.push(Skipped { dir, error }),
            }
        }
        // Broken ones too are told newest first, as far as their manifests say when.
        bad.sort_by_cached_key(|s| std::cmp::Reverse(written_and_step(&s.dir)));
        Ok((good, bad))
    }

    /// Reads the manifest of the checkpoint folder `dir` and checks the files' sizes.
    fn open_dir(dir: &Path) -> Result<Self, CheckpointError> {
        let dir = dir.to_path_buf();
        let path = &dir;
        let mpath = dir.join(MANIFEST);
        let text = std::fs::read(&mpath).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::Missing {
                path: path.to_path_buf(),
            },
            _ => CheckpointError::Io {
                path: mpath.clone(),
                source,
            },
        })?;
        let bad = |reason: String| CheckpointError::BadManifest {
            path: mpath.clone(),
            reason,
        };
        let format = serde_json::from_slice::<serde_json::Value>(&text)
            .map_err(|e| bad(e.to_string()))?
            .get("format")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad("no format version".into()))?;
        if format != u64::from(FORMAT) {
            return Err(CheckpointError::Format {
                path: mpath,
                found: format as u32,
                expected: FORMAT,
            });
        }
        let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        // The lists come from the file, so their lengths are bounded by its size; the world
        // size is checked against them before anything is sized by it.
        let world = manifest.world_size;
        let listed = world > 0
            && manifest.shard_maps.len() == world
            && manifest.files.len() == 2 * world
            && (0..world).all(|r| {
                manifest.files[2 * r].name == model_file(r)
                    && manifest.files[2 * r + 1].name == optim_file(r)
            });
        if !listed {
            return Err(bad(format!(
                "it must list the shard maps and the files of all {world} ranks"
            )));
        }
        for (rank, map) in manifest.shard_maps.iter().enumerate() {
            check_shard_map(map, world, rank).map_err(|reason| {
                bad(format!(
                    "the shard map of rank {rank} is not one a save writes: {reason}"
                ))
            })?;
        }
        if let Some(file) = manifest
            .extra_files
            .iter()
            .find(|f| !is_plain_name(&f.name))
        {
            return Err(bad(format!(
                "file name {:?} is not a plain name inside the checkpoint folder",
                file.name
            )));
        }
        for file in manifest.files.iter().chain(&manifest.extra_files) {
            let fpath = dir.join(&file.name);
            let bytes = std::fs::metadata(&fpath).map_err(io(&fpath))?.len();
            if bytes != file.bytes {
                return Err(CheckpointError::Truncated {
                    path: fpath,
                    bytes,
                    expected: file.bytes,
                });
            }
        }
        Ok(Self { manifest, dir })
    }

    /// Reads every file and checks its size and checksum against the manifest.
    pub fn verify(&self) -> Result<(), CheckpointError> {
        for file in self.manifest.files.iter().chain(&self.manifest.extra_files) {
            self.read(&file.name)?;
        }
        Ok(())
    }

    /// Reads one file of the checkpoint and checks it against the manifest's entry.
    pub(super) fn read(&self, name: &str) -> Result<Vec<u8>, CheckpointError> {
        let path = self.dir.join(name);
        let m = &self.manifest;
        let entry = m
            .files
            .iter()
            .chain(&m.extra_files)
            .find(|f| f.name == name);
        let entry = entry.ok_or_else(|| CheckpointError::BadManifest {
            path: self.dir.join(MANIFEST),
            reason: format!("it does not list {name}"),
        })?;
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        if bytes.len() as u64 != entry.bytes {
            return Err(CheckpointError::Truncated {
                path,
                bytes: bytes.len() as u64,
                expected: entry.bytes,
            });
        }
        if fnv1a64(&bytes) != entry.fnv1a64 {
            return Err(CheckpointError::Checksum { path });
        }
        Ok(bytes)
    }
}
