//! Checkpoints: one file pair per rank holding only that rank's shards (model and optimizer
//! state), plus a small manifest. A checkpoint is written under a temporary name and renamed
//! into place once every rank has written, so a crash never leaves a half checkpoint behind.

use crate::model::{Gpt, GptConfig};
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_rtp::{RtpDevice, ShardMap};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Format version written into every manifest.
pub const FORMAT: u32 = 1;
const MANIFEST: &str = "manifest.json";

/// Why a checkpoint could not be written, read or used.
#[derive(Debug, Error)]
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
    #[error("no checkpoint at {path} (expected {path}/{MANIFEST} or step-*/{MANIFEST} below it)")]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// A file is truncated, corrupt, or not a checkpoint of this format.
    #[error("corrupt checkpoint file {path}: {reason}")]
    Corrupt {
        /// The bad file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The checkpoint does not fit the run that wants to resume from it.
    #[error("checkpoint {what} is {checkpoint} but this run has {requested}")]
    Mismatch {
        /// The setting that differs.
        what: String,
        /// The checkpoint's value.
        checkpoint: String,
        /// The run's value.
        requested: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One file of a checkpoint, with what it must contain.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version.
    pub format: u32,
    /// Ranks that wrote it.
    pub world_size: usize,
    /// Strategy of the run.
    pub strategy: String,
    /// Rotation mode of the run.
    pub rotation: String,
    /// Steps completed.
    pub step: usize,
    /// Model shape.
    pub model: GptConfig,
    /// Global batch.
    pub batch: usize,
    /// Learning rate.
    pub lr: f64,
    /// Data seed.
    pub seed: u64,
    /// Parameters below this many elements were replicated, not sharded (0 in checkpoints
    /// written before the threshold existed, when every parameter was sharded).
    #[serde(default)]
    pub shard_threshold: usize,
    /// Per rank: which full shape each saved shard shape stands for.
    pub shard_maps: Vec<ShardMap>,
    /// Every file of the checkpoint.
    pub files: Vec<FileEntry>,
}

/// FNV-1a 64: a cheap checksum that catches truncation and corruption.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

fn model_file(rank: usize) -> String {
    format!("rank-{rank:05}.model.bin")
}

fn optim_file(rank: usize) -> String {
    format!("rank-{rank:05}.optim.bin")
}

fn step_dir(root: &Path, step: usize) -> PathBuf {
    root.join(format!("step-{step:08}"))
}

/// Settings of the run a checkpoint belongs to.
pub struct RunInfo<'a> {
    /// Strategy name.
    pub strategy: String,
    /// Rotation mode name.
    pub rotation: String,
    /// Model shape.
    pub model: &'a GptConfig,
    /// Global batch.
    pub batch: usize,
    /// Learning rate.
    pub lr: f64,
    /// Data seed.
    pub seed: u64,
    /// Parameters below this many elements were replicated, not sharded.
    pub shard_threshold: usize,
}

/// Writes a checkpoint of `step` under `root` (a collective: every rank calls it).
pub fn save<B, I, O>(
    device: &RtpDevice<I>,
    root: &Path,
    step: usize,
    info: &RunInfo,
    model: &Gpt<B>,
    optim: &O,
) -> Result<PathBuf, CheckpointError>
where
    I: Backend,
    B: AutodiffBackend<InnerBackend = burn_rtp::Rtp<I>, Device = RtpDevice<I>>,
    O: Optimizer<Gpt<B>, B>,
{
    let rank = device.rank();
    let tmp = root.join(format!(".tmp-step-{step:08}"));
    if rank == 0 {
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    }
    device.barrier();
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let shards = device.save_shards(|| {
        let model_bytes = recorder.record(model.clone().into_record(), ());
        let optim_bytes = recorder.record(optim.to_record(), ());
        (model_bytes, optim_bytes)
    });
    let ((model_bytes, optim_bytes), shard_map) = shards.map_err(|e| CheckpointError::Corrupt {
        path: tmp.clone(),
        reason: e.to_string(),
    })?;
    let encode = |r: Result<Vec<u8>, burn::record::RecorderError>| {
        r.map_err(|e| CheckpointError::Corrupt {
            path: tmp.clone(),
            reason: format!("encoding failed: {e}"),
        })
    };
    let mut files = Vec::new();
    for (name, bytes) in [
        (model_file(rank), encode(model_bytes)?),
        (optim_file(rank), encode(optim_bytes)?),
    ] {
        let path = tmp.join(&name);
        std::fs::write(&path, &bytes).map_err(io(&path))?;
        files.push(FileEntry {
            name,
            bytes: bytes.len() as u64,
            fnv1a64: fnv1a64(&bytes),
        });
    }
    let summary = serde_json::to_vec(&RankFiles { shard_map, files }).expect("serialisable");
    let summary_path = tmp.join(format!("rank-{rank:05}.json"));
    std::fs::write(&summary_path, summary).map_err(io(&summary_path))?;
    device.barrier();
    let dest = step_dir(root, step);
    if rank == 0 {
        let mut manifest = Manifest {
            format: FORMAT,
            world_size: device.world_size(),
            strategy: info.strategy.clone(),
            rotation: info.rotation.clone(),
            step,
            model: info.model.clone(),
            batch: info.batch,
            lr: info.lr,
            seed: info.seed,
            shard_threshold: info.shard_threshold,
            shard_maps: Vec::new(),
            files: Vec::new(),
        };
        for r in 0..device.world_size() {
            let path = tmp.join(format!("rank-{r:05}.json"));
            let text = std::fs::read(&path).map_err(io(&path))?;
            let part: RankFiles =
                serde_json::from_slice(&text).map_err(|e| CheckpointError::Corrupt {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            manifest.shard_maps.push(part.shard_map);
            manifest.files.extend(part.files);
            std::fs::remove_file(&path).map_err(io(&path))?;
        }
        let text = serde_json::to_vec_pretty(&manifest).expect("serialisable");
        write_atomic(&tmp.join(MANIFEST), &text)?;
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::rename(&tmp, &dest).map_err(io(&dest))?;
        write_atomic(
            &root.join("latest"),
            dest.file_name().unwrap().to_string_lossy().as_bytes(),
        )?;
    }
    device.barrier();
    Ok(dest)
}

impl Manifest {
    /// Reads and verifies the checkpoint at `path`: a step folder, or a checkpoint root whose
    /// latest step is taken. Every file's size and checksum is checked.
    pub fn open(path: &Path) -> Result<(Self, PathBuf), CheckpointError> {
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
        let manifest: Manifest =
            serde_json::from_slice(&text).map_err(|e| CheckpointError::Corrupt {
                path: mpath.clone(),
                reason: e.to_string(),
            })?;
        if manifest.format != FORMAT {
            return Err(CheckpointError::Corrupt {
                path: mpath,
                reason: format!("format {} is not {FORMAT}", manifest.format),
            });
        }
        if manifest.shard_maps.len() != manifest.world_size
            || manifest.files.len() != 2 * manifest.world_size
        {
            return Err(CheckpointError::Corrupt {
                path: mpath,
                reason: "the manifest does not list every rank's files".into(),
            });
        }
        for file in &manifest.files {
            let fpath = dir.join(&file.name);
            let bytes = std::fs::read(&fpath).map_err(io(&fpath))?;
            if bytes.len() as u64 != file.bytes {
                return Err(CheckpointError::Corrupt {
                    path: fpath,
                    reason: format!(
                        "{} bytes, expected {} (truncated?)",
                        bytes.len(),
                        file.bytes
                    ),
                });
            }
            if fnv1a64(&bytes) != file.fnv1a64 {
                return Err(CheckpointError::Corrupt {
                    path: fpath,
                    reason: "checksum mismatch".into(),
                });
            }
        }
        Ok((manifest, dir))
    }

    /// Refuses to resume a run whose shape differs from the checkpoint's.
    pub fn check_compatible(
        &self,
        world_size: usize,
        info: &RunInfo,
    ) -> Result<(), CheckpointError> {
        let mismatch = |what: &str, c: String, r: String| CheckpointError::Mismatch {
            what: what.into(),
            checkpoint: c,
            requested: r,
        };
        if self.world_size != world_size {
            return Err(mismatch(
                "world size",
                self.world_size.to_string(),
                world_size.to_string(),
            ));
        }
        if self.strategy != info.strategy {
            return Err(mismatch(
                "strategy",
                self.strategy.clone(),
                info.strategy.to_string(),
            ));
        }
        if &self.model != info.model {
            return Err(mismatch(
                "model config",
                format!("{:?}", self.model),
                format!("{:?}", info.model),
            ));
        }
        if self.shard_threshold != info.shard_threshold {
            return Err(mismatch(
                "shard threshold",
                self.shard_threshold.to_string(),
                info.shard_threshold.to_string(),
            ));
        }
        if self.batch != info.batch {
            return Err(mismatch(
                "global batch",
                self.batch.to_string(),
                info.batch.to_string(),
            ));
        }
        Ok(())
    }

    /// Loads rank `device.rank()`'s shards into `model` and `optim`.
    pub fn load_rank<B, I, O>(
        &self,
        dir: &Path,
        device: &RtpDevice<I>,
        model: Gpt<B>,
        optim: O,
    ) -> Result<(Gpt<B>, O), CheckpointError>
    where
        I: Backend,
        B: AutodiffBackend<InnerBackend = burn_rtp::Rtp<I>, Device = RtpDevice<I>>,
        O: Optimizer<Gpt<B>, B>,
    {
        let rank = device.rank();
        let map = &self.shard_maps[rank];
        let model = model.load_record(load_shard_file(device, dir.join(model_file(rank)), map)?);
        let optim = optim.load_record(load_shard_file(device, dir.join(optim_file(rank)), map)?);
        Ok((model, optim))
    }
}

/// Reads one record of this rank's shards.
fn load_shard_file<B, I, R>(
    device: &RtpDevice<I>,
    path: PathBuf,
    map: &ShardMap,
) -> Result<R, CheckpointError>
where
    I: Backend,
    B: Backend<Device = RtpDevice<I>>,
    R: burn::record::Record<B>,
{
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    device
        .load_shards(map, || recorder.load(bytes, device))
        .map_err(|e| CheckpointError::Corrupt {
            path,
            reason: e.to_string(),
        })
}

/// Gathers the checkpoint at `checkpoint` into one ordinary Burn record of the whole model at
/// `out`, which single-device Burn loads with [`load_consolidated`].
pub fn consolidate_checkpoint<I: Backend>(
    checkpoint: &Path,
    out: &Path,
) -> Result<Manifest, CheckpointError> {
    type B<I> = burn::backend::Autodiff<burn_rtp::Rtp<I>>;
    let (manifest, dir) = Manifest::open(checkpoint)?;
    let strategy = manifest
        .strategy
        .parse::<crate::trainer::StrategyName>()
        .map_err(|e| CheckpointError::Corrupt {
            path: dir.join(MANIFEST),
            reason: e,
        })?;
    let config = strategy
        .rtp_config(manifest.world_size, burn_rtp::RotationMode::OutOfPlace)
        .with_shard_threshold(manifest.shard_threshold);
    let result = burn_rtp::try_launch::<I, _, CheckpointError, _>(config, |device| {
        let model = manifest.model.init::<B<I>>(&device);
        let optim =
            burn_rtp::RtpOptimizer::new(burn::optim::AdamConfig::new().init::<B<I>, Gpt<B<I>>>());
        let (model, _) = manifest.load_rank(&dir, &device, model, optim)?;
        let full = burn_rtp::gather_module(model);
        if device.rank() == 0 {
            save_full(full, out)?;
        }
        Ok(())
    });
    result.map_err(|e| CheckpointError::Corrupt {
        path: dir.clone(),
        reason: e.to_string(),
    })?;
    Ok(manifest)
}

/// Loads a full-model record file (as [`consolidate_checkpoint`] writes) into `model`. Under
/// RTP every rank keeps only its slice of each parameter.
pub fn load_full_into<B: Backend>(
    path: &Path,
    model: Gpt<B>,
    device: &B::Device,
) -> Result<Gpt<B>, CheckpointError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let record = BinBytesRecorder::<FullPrecisionSettings>::default()
        .load(bytes, device)
        .map_err(|e| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    Ok(model.load_record(record))
}

/// Writes a single-device model as a full-model record file.
pub fn save_full<B: Backend>(model: Gpt<B>, path: &Path) -> Result<(), CheckpointError> {
    let bytes = BinBytesRecorder::<FullPrecisionSettings>::default()
        .record(model.into_record(), ())
        .map_err(|e| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    write_atomic(path, &bytes)
}

/// Loads a consolidated model file into a single-device model.
pub fn load_consolidated<B: Backend>(
    path: &Path,
    config: &GptConfig,
    device: &B::Device,
) -> Result<Gpt<B>, CheckpointError> {
    load_full_into(path, config.init::<B>(device), device)
}
