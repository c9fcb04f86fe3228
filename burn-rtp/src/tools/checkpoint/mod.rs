//! Sharded checkpoints of any Burn module and its optimizer.
//!
//! Every rank writes only its own shards (`rank-NNNNN.model.mpk`, `rank-NNNNN.optim.mpk`,
//! Burn's named MessagePack records) and rank 0 a manifest: world size, strategy, step, the
//! shard map of every rank, each file's size and checksum, and whatever the caller adds. The
//! folder is written under a temporary name and renamed into place once every rank has
//! written, so a crash never leaves half a checkpoint behind.
//!
//! * [`save`] is a collective: every rank calls it with its model and optimizer.
//! * [`Checkpoint::open`] finds and verifies a checkpoint (every file's size and checksum)
//!   before anything is loaded.
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

mod recorder;
mod reshard;

pub use recorder::RankRecorder;

use crate::backend::device::RtpDevice;
use crate::error::RtpError;
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
    #[error("no checkpoint at {path} (expected {path}/{MANIFEST}, or a `latest` file naming a step folder)")]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// A file is shorter or longer than the manifest says: a copy or a write was cut short.
    #[error("checkpoint file {path} has {bytes} bytes, the manifest says {expected} (truncated or partly copied?)")]
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
    /// A collective (or the shard map) failed while saving or loading.
    #[error(transparent)]
    Rtp(#[from] RtpError),
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
        }
    }
}

/// FNV-1a 64: a cheap checksum that catches truncation and corruption.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Writes `bytes` to `path` under a temporary name first, so `path` is whole or absent.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
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
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))
    } else {
        Ok(())
    };
    agree(device, step, prepared)?;
    let written = write_rank_files(device, &tmp, model, optim);
    agree(device, step, written)?;
    let dest = step_dir(root, step);
    let finished = if rank == 0 {
        finish(device, &tmp, &dest, root, step, user)
    } else {
        Ok(())
    };
    agree(device, step, finished)?;
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
        std::fs::write(&path, &bytes).map_err(io(&path))?;
        files.push(FileEntry {
            name,
            bytes: bytes.len() as u64,
            fnv1a64: fnv1a64(&bytes),
        });
    }
    let summary = serde_json::to_vec(&RankFiles { shard_map, files }).expect("plain data");
    let path = tmp.join(format!("rank-{rank:05}.json"));
    std::fs::write(&path, summary).map_err(io(&path))
}

/// Rank 0: gathers the ranks' summaries into the manifest and moves the folder into place.
fn finish<I: Backend>(
    device: &RtpDevice<I>,
    tmp: &Path,
    dest: &Path,
    root: &Path,
    step: u64,
    user: &impl Serialize,
) -> Result<(), CheckpointError> {
    let user = serde_json::to_value(user).map_err(|e| CheckpointError::BadManifest {
        path: tmp.join(MANIFEST),
        reason: format!("the caller's fields do not serialise: {e}"),
    })?;
    let mut manifest = Manifest::of_world(device.config(), step, user);
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
    write_atomic(&tmp.join(MANIFEST), &text)?;
    let _ = std::fs::remove_dir_all(dest);
    std::fs::rename(tmp, dest).map_err(io(dest))?;
    let name = dest.file_name().expect("a step folder").to_string_lossy();
    write_atomic(&root.join("latest"), name.as_bytes())
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
    /// Finds the checkpoint at `path` (a step folder, or a root whose `latest` file names
    /// one) and checks every file's size and checksum against the manifest.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let checkpoint = Self::open_manifest(path)?;
        checkpoint.verify()?;
        Ok(checkpoint)
    }

    /// Finds the checkpoint at `path` and checks its manifest and the files' sizes, without
    /// reading the files; each file read later is checked against its checksum as it is read.
    pub fn open_manifest(path: &Path) -> Result<Self, CheckpointError> {
        let dir = if path.join(MANIFEST).exists() {
            path.to_path_buf()
        } else if let Ok(latest) = std::fs::read_to_string(path.join("latest")) {
            path.join(latest.trim())
        } else {
            return Err(CheckpointError::Missing {
                path: path.to_path_buf(),
            });
        };
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
        let expected: Vec<String> = (0..manifest.world_size)
            .flat_map(|r| [model_file(r), optim_file(r)])
            .collect();
        let listed: Vec<&String> = manifest.files.iter().map(|f| &f.name).collect();
        if manifest.world_size == 0
            || manifest.shard_maps.len() != manifest.world_size
            || listed != expected.iter().collect::<Vec<_>>()
        {
            return Err(bad(format!(
                "it must list the shard maps and the files of all {} ranks",
                manifest.world_size
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
        let model_record: M::Record =
            decode::<I, B, _>(device, map, model_bytes, self.dir.join(model_file(rank)))?;
        let optim_record: O::Record =
            decode::<I, B, _>(device, map, optim_bytes, self.dir.join(optim_file(rank)))?;
        Ok((
            model.load_record(model_record),
            optim.load_record(optim_record),
        ))
    }
}

/// Decodes a record of this rank's shards (its tensors become shards again by `map`).
fn decode<I, B, R>(
    device: &RtpDevice<I>,
    map: &ShardMap,
    bytes: Vec<u8>,
    path: PathBuf,
) -> Result<R, CheckpointError>
where
    I: Backend,
    B: Backend<Device = RtpDevice<I>>,
    R: Record<B>,
{
    device
        .load_shards(map, || Recorder::<B>::load(&Mpk::default(), bytes, device))
        .map_err(|e| CheckpointError::Record {
            path,
            reason: e.to_string(),
        })
}
