//! Sharded checkpoints of any Burn module and its optimizer.
//!
//! Every rank writes only its own shards (`rank-NNNNN.model.mpk`, `rank-NNNNN.optim.mpk`,
//! Burn's named MessagePack records) and rank 0 a manifest: world size, strategy, step, the
//! shard map of every rank, each file's size and checksum, and whatever the caller adds. The
//! folder is written under a temporary name, every file flushed to the disk, and renamed into
//! place once every rank has written, so a crash never leaves half a checkpoint behind: a
//! `step-*` folder with a manifest is complete, whatever moment a process was killed at
//! (`tests/crash.rs` in the examples kills the trainer at every point of the protocol).
//!
//! * [`save`] is a collective: every rank calls it with its model and optimizer.
//! * [`Checkpoint::open`] finds and verifies a checkpoint (every file's size and checksum)
//!   before anything is loaded. Given a root, it takes the newest complete checkpoint under
//!   it ([`Checkpoint::newest`] also says which newer ones it skipped, and why).
//! * [`prune`] keeps the newest few checkpoints under a root and removes what killed saves
//!   left behind.
//! * [`Checkpoint::load`] resumes the same world exactly; it refuses another world size,
//!   strategy or shard threshold with [`CheckpointError::Mismatch`].
//! * [`Checkpoint::load_resharded`] loads into any world and strategy: each rank reads only
//!   the files that hold its columns and re-slices them on the host. No rank builds the full
//!   model.
//! * [`Checkpoint::consolidate`] writes the whole model as one ordinary Burn record
//!   (`NamedMpkFileRecorder`), assembled on the host, for single-device Burn, at the path
//!   that recorder reads ([`record_file`]: the extension becomes `.mpk`).
//! * [`RankRecorder`] writes the same checkpoints from burn-train's Learner
//!   (`with_file_checkpointer`), and reads them back when a Learner resumes.

mod fault;
mod recorder;
mod reshard;
mod validate;

pub use fault::KILL_AT_SAVE_POINT;
pub use recorder::RankRecorder;

use crate::backend::device::RtpDevice;
use crate::error::RtpError;
use crate::state::accounting::human_bytes;
use crate::state::shard_io::ShardMap;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Record, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Format version written into every manifest.
pub const FORMAT: u32 = 2;
const MANIFEST: &str = "manifest.json";

/// Why a checkpoint could not be written, read or used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A file or folder could not be read or written.
    #[error("checkpoint I/O on {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// No checkpoint was found where one was expected.
    #[error("no checkpoint at {path} (expected {path}/{MANIFEST}, or checkpoint folders in it)")]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// A file is shorter or longer than the manifest says: a copy or a write was cut short.
    #[error(
        "checkpoint file {path} holds {} where its manifest records {} (truncated, or partly \
         written or copied?)",
        human_sized(*bytes),
        human_sized(*expected)
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// The size the manifest records.
        expected: u64,
    },
    /// A file's content does not match the checksum the manifest records.
    #[error("checkpoint file {path} is corrupt: its checksum differs from the manifest's")]
    Checksum {
        /// The file.
        path: PathBuf,
    },
    /// The manifest cannot be read, or does not list every rank's files.
    #[error("checkpoint manifest {path} is unusable: {reason}")]
    BadManifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The checkpoint was written in another format version.
    #[error("checkpoint {path} has format {found}; this build reads format {expected}")]
    Format {
        /// The manifest.
        path: PathBuf,
        /// The format it records.
        found: u32,
        /// The format this build writes and reads.
        expected: u32,
    },
    /// A record could not be encoded or decoded: the model or optimizer has another structure.
    #[error("checkpoint record {path}: {reason}")]
    Record {
        /// The record file.
        path: PathBuf,
        /// The recorder's message.
        reason: String,
    },
    /// The checkpoint does not fit the run that wants to load it.
    #[error("checkpoint {what} is {checkpoint} but this run has {requested}")]
    Mismatch {
        /// The setting that differs.
        what: String,
        /// The checkpoint's value.
        checkpoint: String,
        /// The run's value.
        requested: String,
    },
    /// Another rank failed to write its part, so this save was abandoned on every rank.
    #[error(
        "rank {rank}: checkpoint of step {step} abandoned: another rank could not write its files"
    )]
    OtherRankFailed {
        /// The rank that reports it.
        rank: usize,
        /// The step being saved.
        step: u64,
    },
    /// A root holds checkpoints, but none of them is complete.
    #[error(
        "no complete checkpoint under {root}: {tried} tried; the newest ({newest_dir}): {newest}"
    )]
    NoneComplete {
        /// The root searched.
        root: PathBuf,
        /// How many checkpoint folders were tried.
        tried: usize,
        /// The newest of them.
        newest_dir: PathBuf,
        /// Why the newest one is not usable.
        newest: Box<CheckpointError>,
    },
    /// A collective (or the shard map) failed while saving or loading.
    #[error(transparent)]
    Rtp(#[from] RtpError),
}

/// A byte count as a person reads it, exact below 1 KiB (`37 B`, `4.2 MiB (4404019 B)`).
fn human_sized(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else {
        format!("{} ({bytes} B)", human_bytes(bytes))
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One file of a checkpoint, with what it must contain.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileEntry {
    /// File name inside the checkpoint folder.
    pub name: String,
    /// Its size.
    pub bytes: u64,
    /// FNV-1a 64 hash of its content.
    pub fnv1a64: u64,
}

/// What a rank reports about the files it wrote.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RankFiles {
    shard_map: ShardMap,
    files: Vec<FileEntry>,
}

/// The manifest of a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// Format version.
    pub format: u32,
    /// Ranks that wrote it.
    pub world_size: usize,
    /// Strategy of the run (`rtp`, `fsdp`, `ddp`).
    pub strategy: String,
    /// Rotation mode of the run.
    pub rotation: String,
    /// Parameters below this many elements were replicated, not sharded.
    pub shard_threshold: usize,
    /// The step the caller saved at.
    pub step: u64,
    /// Per rank: which full shape each saved shard shape stands for.
    pub shard_maps: Vec<ShardMap>,
    /// Every file of the checkpoint, two per rank.
    pub files: Vec<FileEntry>,
    /// Further files, verified like the others (a Learner's scheduler records).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_files: Vec<FileEntry>,
    /// The caller's own fields (a trainer's model shape, batch, data seed).
    #[serde(default)]
    pub user: serde_json::Value,
    /// When the manifest was written, in nanoseconds since the Unix epoch: the newest
    /// complete checkpoint under a root is the one written last (0 in older checkpoints,
    /// which are then ordered by step).
    #[serde(default)]
    pub written_unix_ns: u64,
    /// The kind of each model parameter, in record order (`f` float, `i` int, `b` bool), so
    /// that a model record whose tensors are of other kinds is refused also where no model
    /// is at hand (resharding, consolidation). Empty in checkpoints that predate it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model_kinds: String,
}

impl Manifest {
    /// The manifest of a checkpoint of `step` written by the world of `config`, before the
    /// ranks' shard maps and files are added.
    fn of_world(config: &crate::RtpConfig, step: u64, user: serde_json::Value) -> Self {
        Self {
            format: FORMAT,
            world_size: config.world_size,
            strategy: config.strategy.to_string(),
            rotation: config.rotation.to_string(),
            shard_threshold: config.shard_threshold,
            step,
            shard_maps: Vec::new(),
            files: Vec::new(),
            extra_files: Vec::new(),
            user,
            written_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            model_kinds: String::new(),
        }
    }
}

/// FNV-1a 64: a cheap checksum that catches truncation and corruption.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Writes `bytes` to a new file at `path` and flushes it to the disk. On a save, `rank` marks
/// the save points: one with the file half written, one once it is whole.
fn write_synced(rank: Option<usize>, path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
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
fn save_point(rank: Option<usize>, name: &str) {
    if let Some(rank) = rank {
        fault::point(rank, name);
    }
}

/// Flushes a folder's entries (a file created or renamed in it) to the disk. A file system
/// that cannot sync a folder (`EINVAL`) is taken at its word.
fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    match std::fs::File::open(path).and_then(|dir| dir.sync_all()) {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
        other => other.map_err(io(path)),
    }
}

/// Checks a shard map read from a manifest against the world that wrote it, so that loading
/// never meets a shape it cannot split: each full shape has a dimension, each shard shape is
/// its full shape with the last dimension cut to `rank`'s range, the entries are sorted by
/// shard shape (loading searches them), and no replicated shape is also a shard shape.
fn check_shard_map(map: &ShardMap, world: usize, rank: usize) -> Result<(), String> {
    for (i, (shard, full)) in map.sharded.iter().enumerate() {
        let Some((&last, prefix)) = full.split_last() else {
            return Err("a full shape has no dimension".into());
        };
        let own = crate::state::sharding::shard_range(last, world, rank).len;
        if shard.split_last() != Some((&own, prefix)) {
            return Err(format!(
                "shard shape {shard:?} is not rank {rank}'s shard of {full:?} in a world of {world}"
            ));
        }
        if i > 0 && map.sharded[i - 1].0 >= *shard {
            return Err("its shard shapes are not sorted and distinct".into());
        }
    }
    match map.replicated.iter().find(|s| map.full_of(s).is_some()) {
        Some(shape) => Err(format!("{shape:?} is both replicated and a shard shape")),
        None => Ok(()),
    }
}

/// Whether `name` names a file directly inside a folder (no separator, not `.` or `..`), so
/// that a manifest cannot point a read outside its checkpoint.
fn is_plain_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(n)), None) if n == std::ffi::OsStr::new(name)
    )
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
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    write_atomic_at(None, path, bytes)
}

/// [`write_atomic`] with save points on `rank`.
fn write_atomic_at(rank: Option<usize>, path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let tmp = path.with_extension("tmp");
    write_synced(rank, &tmp, bytes)?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    sync_dir(parent_of(path))?;
    save_point(rank, "a file renamed into place");
    Ok(())
}

fn model_file(rank: usize) -> String {
    format!("rank-{rank:05}.model.mpk")
}

fn optim_file(rank: usize) -> String {
    format!("rank-{rank:05}.optim.mpk")
}

/// The file Burn's `NamedMpkFileRecorder` reads and writes for `path`: `path` with its
/// extension set to `mpk` (Burn's file recorders call `PathBuf::set_extension`, which
/// replaces the last extension: `model` and `model.mpk` name `model.mpk`, and so does
/// `model.v2`). [`Checkpoint::consolidate`] writes there.
pub fn record_file(path: &Path) -> PathBuf {
    let mut file = path.to_path_buf();
    file.set_extension("mpk");
    file
}

/// The folder of step `step` under a checkpoint root.
pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step:08}"))
}

type Mpk = NamedMpkBytesRecorder<FullPrecisionSettings>;

/// Writes a checkpoint of `step` under `root` and returns its folder. A collective: every
/// rank calls it with its own model and optimizer; each writes only its shards, and the
/// folder appears (and `root/latest` names it) only once every rank has written. `user` is
/// stored in the manifest as JSON.
pub fn save<I, B, M, O>(
    device: &RtpDevice<I>,
    root: &Path,
    step: u64,
    model: &M,
    optim: &O,
    user: &impl Serialize,
) -> Result<PathBuf, CheckpointError>
where
    I: Backend,
    B: AutodiffBackend<Device = RtpDevice<I>>,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let rank = device.rank();
    let tmp = root.join(format!(".tmp-step-{step:08}"));
    let prepared = if rank == 0 {
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)
            .map_err(io(&tmp))
            .and_then(|()| sync_dir(root))
            .inspect(|()| save_point(Some(rank), "the temporary folder created"))
    } else {
        Ok(())
    };
    let dest = step_dir(root, step);
    let saved = (|| {
        agree(device, step, prepared)?;
        let written = write_rank_files(device, &tmp, model, optim);
        agree(device, step, written)?;
        let kinds: String = param_kinds::<B, M>(model)
            .into_iter()
            .map(validate::Kind::letter)
            .collect();
        let finished = if rank == 0 {
            finish(device, &tmp, &dest, root, step, user, kinds)
        } else {
            Ok(())
        };
        agree(device, step, finished)
    })();
    if saved.is_err() && rank == 0 {
        // A save that failed (a full disk, say) gives its space back; the checkpoints before
        // it are untouched.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    saved?;
    save_point(Some(rank), "the save returned");
    Ok(dest)
}

/// Every rank learns whether any rank failed; a rank that did returns its own error, the
/// others [`CheckpointError::OtherRankFailed`], so no rank waits for a file never written.
fn agree<I: Backend>(
    device: &RtpDevice<I>,
    step: u64,
    result: Result<(), CheckpointError>,
) -> Result<(), CheckpointError> {
    let failed = device.any_rank(result.is_err());
    result?;
    if failed {
        return Err(CheckpointError::OtherRankFailed {
            rank: device.rank(),
            step,
        });
    }
    Ok(())
}

fn write_rank_files<I, B, M, O>(
    device: &RtpDevice<I>,
    tmp: &Path,
    model: &M,
    optim: &O,
) -> Result<(), CheckpointError>
where
    I: Backend,
    B: AutodiffBackend<Device = RtpDevice<I>>,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let rank = device.rank();
    let recorder = Mpk::default();
    let ((model_bytes, optim_bytes), shard_map) = device.save_shards(|| {
        let model_bytes = Recorder::<B>::record(&recorder, model.clone().into_record(), ());
        let optim_bytes = Recorder::<B>::record(&recorder, optim.to_record(), ());
        (model_bytes, optim_bytes)
    })?;
    let mut files = Vec::new();
    for (name, bytes) in [
        (model_file(rank), model_bytes),
        (optim_file(rank), optim_bytes),
    ] {
        let path = tmp.join(&name);
        let bytes = bytes.map_err(|e| CheckpointError::Record {
            path: path.clone(),
            reason: format!("encoding failed: {e}"),
        })?;
        write_synced(Some(rank), &path, &bytes)?;
        files.push(FileEntry {
            name,
            bytes: bytes.len() as u64,
            fnv1a64: fnv1a64(&bytes),
        });
    }
    let summary = serde_json::to_vec(&RankFiles { shard_map, files }).expect("plain data");
    let path = tmp.join(format!("rank-{rank:05}.json"));
    write_synced(Some(rank), &path, &summary)
}

/// Rank 0: gathers the ranks' summaries into the manifest and moves the folder into place.
fn finish<I: Backend>(
    device: &RtpDevice<I>,
    tmp: &Path,
    dest: &Path,
    root: &Path,
    step: u64,
    user: &impl Serialize,
    model_kinds: String,
) -> Result<(), CheckpointError> {
    let user = serde_json::to_value(user).map_err(|e| CheckpointError::BadManifest {
        path: tmp.join(MANIFEST),
        reason: format!("the caller's fields do not serialise: {e}"),
    })?;
    let mut manifest = Manifest::of_world(device.config(), step, user);
    manifest.model_kinds = model_kinds;
    for r in 0..device.world_size() {
        let path = tmp.join(format!("rank-{r:05}.json"));
        let text = std::fs::read(&path).map_err(io(&path))?;
        let part: RankFiles =
            serde_json::from_slice(&text).map_err(|e| CheckpointError::BadManifest {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        manifest.shard_maps.push(part.shard_map);
        manifest.files.extend(part.files);
        std::fs::remove_file(&path).map_err(io(&path))?;
    }
    let text = serde_json::to_vec_pretty(&manifest).expect("plain data");
    let rank = Some(device.rank());
    write_atomic_at(rank, &tmp.join(MANIFEST), &text)?;
    // A checkpoint of this step already there (a run resumed from an older one) is moved
    // aside, not deleted, until the new one is in place: a kill in between leaves the older
    // complete checkpoints, never a `latest` that names nothing readable.
    let name = dest.file_name().expect("a step folder").to_string_lossy();
    let aside = root.join(format!(".replaced-{name}"));
    let replaced = dest.exists();
    if replaced {
        let _ = std::fs::remove_dir_all(&aside);
        std::fs::rename(dest, &aside).map_err(io(dest))?;
        save_point(rank, "the old folder of this step moved aside");
    }
    std::fs::rename(tmp, dest).map_err(io(dest))?;
    sync_dir(root)?;
    save_point(rank, "the folder renamed into place");
    if replaced {
        std::fs::remove_dir_all(&aside).map_err(io(&aside))?;
    }
    write_atomic_at(rank, &root.join("latest"), name.as_bytes())
}

/// Removes all but the newest `keep` (at least one) complete checkpoints under `root`, in the
/// order they were written, never the one `latest` names, and the folders killed saves left
/// behind (`.tmp-step-*`, `.replaced-step-*`). Folders whose manifest cannot be read are left
/// for a person to look at. Call it between saves (rank 0 after [`save`] returns, say): a save
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

/// A verified checkpoint on disk: its manifest and folder.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    manifest: Manifest,
    dir: PathBuf,
}

/// The world a checkpoint is loaded into, as [`Checkpoint::load_resharded`] needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub rank: usize,
    pub world: usize,
    pub strategy: crate::config::Strategy,
    pub threshold: usize,
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

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The step folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The caller's fields, as saved.
    pub fn user<T: DeserializeOwned>(&self) -> Result<T, CheckpointError> {
        serde_json::from_value(self.manifest.user.clone()).map_err(|e| {
            CheckpointError::BadManifest {
                path: self.dir.join(MANIFEST),
                reason: format!("the caller's fields do not match: {e}"),
            }
        })
    }

    /// Refuses a world whose size, strategy or shard threshold differs from the checkpoint's.
    pub fn check_world<I: Backend>(&self, device: &RtpDevice<I>) -> Result<(), CheckpointError> {
        self.check_config(device.config())
    }

    /// [`Checkpoint::check_world`] before any rank exists: checks the world's configuration.
    pub fn check_config(&self, config: &crate::RtpConfig) -> Result<(), CheckpointError> {
        let m = &self.manifest;
        let pairs = [
            (
                "world size",
                m.world_size.to_string(),
                config.world_size.to_string(),
            ),
            ("strategy", m.strategy.clone(), config.strategy.to_string()),
            (
                "shard threshold",
                m.shard_threshold.to_string(),
                config.shard_threshold.to_string(),
            ),
        ];
        for (what, checkpoint, requested) in pairs {
            if checkpoint != requested {
                return Err(CheckpointError::Mismatch {
                    what: what.into(),
                    checkpoint,
                    requested,
                });
            }
        }
        Ok(())
    }

    /// Loads this rank's shards into `model` and `optim` in the world that saved them,
    /// exactly (training resumes bit for bit). Another world size, strategy or shard
    /// threshold is refused before anything is loaded; see [`Checkpoint::load_resharded`].
    pub fn load<I, B, M, O>(
        &self,
        device: &RtpDevice<I>,
        model: M,
        optim: O,
    ) -> Result<(M, O), CheckpointError>
    where
        I: Backend,
        B: AutodiffBackend<Device = RtpDevice<I>>,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.check_world(device)?;
        let rank = device.rank();
        let map = &self.manifest.shard_maps[rank];
        let model_bytes = self.read(&model_file(rank))?;
        let optim_bytes = self.read(&optim_file(rank))?;
        self.load_records(device, map, (model, optim), (model_bytes, optim_bytes))
    }

    /// Loads the checkpoint into this world, whatever world and strategy saved it: each rank
    /// reads only the files holding its columns and re-slices them on the host, so no rank
    /// ever holds the full model. Training continues as it would have in the old world.
    pub fn load_resharded<I, B, M, O>(
        &self,
        device: &RtpDevice<I>,
        model: M,
        optim: O,
    ) -> Result<(M, O), CheckpointError>
    where
        I: Backend,
        B: AutodiffBackend<Device = RtpDevice<I>>,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let config = device.config();
        let target = Target {
            rank: device.rank(),
            world: device.world_size(),
            strategy: config.strategy,
            threshold: config.shard_threshold,
        };
        let out = reshard::reshard(self, target)?;
        self.load_records(device, &out.map, (model, optim), (out.model, out.optim))
    }

    /// Writes the whole model as one ordinary Burn record (named MessagePack), assembled on
    /// the host from the ranks' files, and returns the path it wrote.
    ///
    /// The file is the one `NamedMpkFileRecorder` reads for `out`: [`record_file`]`(out)`,
    /// `out` with its extension set to `mpk` as Burn's file recorders set it. So `"model"`
    /// and `"model.mpk"` both write `model.mpk`, and either path loads it back:
    ///
    /// ```no_run
    /// # use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
    /// # fn f(ckpt: burn_rtp::checkpoint::Checkpoint) -> Result<(), Box<dyn std::error::Error>> {
    /// # type B = burn::backend::NdArray;
    /// # type MyModel = burn::nn::Linear<B>;
    /// let written = ckpt.consolidate("model".as_ref())?; // writes model.mpk
    /// let record = NamedMpkFileRecorder::<FullPrecisionSettings>::new()
    ///     .load("model".into(), &Default::default())?; // reads model.mpk
    /// # let _: <MyModel as burn::module::Module<B>>::Record = record;
    /// # let _ = written;
    /// # Ok(()) }
    /// ```
    pub fn consolidate(&self, out: &Path) -> Result<PathBuf, CheckpointError> {
        let path = record_file(out);
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        write_atomic(&path, &self.consolidated_records()?.0)?;
        Ok(path)
    }

    /// The model and optimizer records of the whole model, as single-device Burn loads them
    /// (named MessagePack bytes), assembled on the host: the checkpoint resharded for a world
    /// of one rank that replicates everything.
    pub fn consolidated_records(&self) -> Result<(Vec<u8>, Vec<u8>), CheckpointError> {
        let single = Target {
            rank: 0,
            world: 1,
            strategy: crate::config::Strategy::Ddp,
            threshold: 0,
        };
        let whole = reshard::reshard(self, single)?;
        Ok((whole.model, whole.optim))
    }

    /// Reads one file of the checkpoint and checks it against the manifest's entry.
    fn read(&self, name: &str) -> Result<Vec<u8>, CheckpointError> {
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

    /// Decodes this rank's records (by `map`) and loads them into `model` and `optim`.
    fn load_records<I, B, M, O>(
        &self,
        device: &RtpDevice<I>,
        map: &ShardMap,
        (model, optim): (M, O),
        (model_bytes, optim_bytes): (Vec<u8>, Vec<u8>),
    ) -> Result<(M, O), CheckpointError>
    where
        I: Backend,
        B: AutodiffBackend<Device = RtpDevice<I>>,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let rank = device.rank();
        let path = self.dir.join(model_file(rank));
        // The record's tensors, in order, must be of the kinds of the model's parameters.
        let kinds: String = param_kinds::<B, M>(&model)
            .into_iter()
            .map(validate::Kind::letter)
            .collect();
        let model_record: M::Record =
            decode::<I, B, _>(device, map, model_bytes, path.clone(), Some(&kinds))?;
        let optim_path = self.dir.join(optim_file(rank));
        let optim_record: O::Record =
            decode::<I, B, _>(device, map, optim_bytes, optim_path, None)?;
        // Burn's `load_record` takes a tensor of any shape: a record whose shapes are not the
        // model's is refused here rather than trained on.
        let expected = param_shapes::<B, M>(&model);
        let model = model.load_record(model_record);
        let got = param_shapes::<B, M>(&model);
        if let Some(i) = (0..expected.len().max(got.len())).find(|&i| expected.get(i) != got.get(i))
        {
            return Err(CheckpointError::Record {
                path,
                reason: format!(
                    "parameter {i} has shape {:?} in the checkpoint, but {:?} in the model",
                    got.get(i),
                    expected.get(i)
                ),
            });
        }
        Ok((model, optim.load_record(optim_record)))
    }
}

/// The kind of every parameter of `module`, in visit order (the order its record holds them).
fn param_kinds<B: Backend, M: burn::module::Module<B>>(module: &M) -> Vec<validate::Kind> {
    use burn::module::{ModuleVisitor, Param};
    use burn::tensor::{Bool, Int, Tensor};
    use validate::Kind;
    struct Kinds(Vec<Kind>);
    impl<B: Backend> ModuleVisitor<B> for Kinds {
        fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<B, D>>) {
            self.0.push(Kind::Float);
        }
        fn visit_int<const D: usize>(&mut self, _: &Param<Tensor<B, D, Int>>) {
            self.0.push(Kind::Int);
        }
        fn visit_bool<const D: usize>(&mut self, _: &Param<Tensor<B, D, Bool>>) {
            self.0.push(Kind::Bool);
        }
    }
    let mut kinds = Kinds(Vec::new());
    module.visit(&mut kinds);
    kinds.0
}

/// The logical shape of every parameter of `module`, in visit order.
fn param_shapes<B: Backend, M: burn::module::Module<B>>(module: &M) -> Vec<Vec<usize>> {
    use burn::module::{ModuleVisitor, Param};
    use burn::tensor::{Bool, Int, Tensor};
    struct Shapes(Vec<Vec<usize>>);
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().dims().to_vec());
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            self.0.push(param.val().dims().to_vec());
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
            self.0.push(param.val().dims().to_vec());
        }
    }
    let mut shapes = Shapes(Vec::new());
    module.visit(&mut shapes);
    shapes.0
}

/// Decodes a record of this rank's shards (its tensors become shards again by `map`), once
/// its tensors are checked (and, with `kinds`, checked to be of those parameter kinds). A
/// record that makes Burn's decoder or the shard loading panic anyway is
/// [`CheckpointError::Record`], not a panic of the rank.
fn decode<I, B, R>(
    device: &RtpDevice<I>,
    map: &ShardMap,
    bytes: Vec<u8>,
    path: PathBuf,
    kinds: Option<&str>,
) -> Result<R, CheckpointError>
where
    I: Backend,
    B: Backend<Device = RtpDevice<I>>,
    R: Record<B>,
{
    let record = |reason: String| CheckpointError::Record {
        path: path.clone(),
        reason,
    };
    let dtypes = validate::tensor_dtypes(&bytes).map_err(record)?;
    if let Some(kinds) = kinds {
        validate::check_kinds(&dtypes, kinds).map_err(record)?;
    }
    let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        device.load_shards(map, || Recorder::<B>::load(&Mpk::default(), bytes, device))
    }));
    match loaded {
        Ok(result) => result.map_err(|e| record(e.to_string())),
        Err(payload) => {
            let reason = payload
                .downcast_ref::<RtpError>()
                .map(ToString::to_string)
                .or_else(|| crate::error::panic_message(payload.as_ref()))
                .unwrap_or_else(|| "the decoder panicked".into());
            Err(record(format!("it does not decode: {reason}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(sharded: &[(&[usize], &[usize])], replicated: &[&[usize]]) -> ShardMap {
        ShardMap {
            sharded: sharded
                .iter()
                .map(|(s, f)| (s.to_vec(), f.to_vec()))
                .collect(),
            replicated: replicated.iter().map(|s| s.to_vec()).collect(),
        }
    }

    /// A manifest's shard maps are checked against the world before loading splits anything
    /// by them (a full shape without a dimension made `ShardSpec::last` panic).
    #[test]
    fn shard_maps_a_save_cannot_write_are_refused() {
        // 10 columns over 3 ranks: 4, 3, 3.
        assert!(check_shard_map(&map(&[(&[5, 4], &[5, 10])], &[&[7]]), 3, 0).is_ok());
        assert!(check_shard_map(&map(&[(&[5, 3], &[5, 10])], &[]), 3, 1).is_ok());
        assert!(check_shard_map(&map(&[(&[5, 4], &[5, 10])], &[]), 3, 1).is_err());
        assert!(check_shard_map(&map(&[(&[], &[])], &[]), 3, 0).is_err());
        assert!(check_shard_map(&map(&[(&[4], &[5, 10])], &[]), 3, 0).is_err());
        assert!(check_shard_map(&map(&[(&[6, 4], &[5, 10])], &[]), 3, 0).is_err());
        let unsorted = map(&[(&[5, 4], &[5, 10]), (&[2, 4], &[2, 10])], &[]);
        assert!(check_shard_map(&unsorted, 3, 0).is_err());
        assert!(check_shard_map(&map(&[(&[5, 4], &[5, 10])], &[&[5, 4]]), 3, 0).is_err());
    }

    #[test]
    fn only_plain_names_stay_inside_the_folder() {
        assert!(is_plain_name("rank-00000.model.mpk"));
        for bad in ["", ".", "..", "../x", "a/b", "/etc/passwd"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }
}
