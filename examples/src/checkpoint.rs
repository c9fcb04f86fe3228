//! The trainer's checkpoints: `burn_rtp::checkpoint` (per-rank shards, a manifest, atomic
//! writes, verification, resharding, consolidation) plus the trainer's own manifest fields,
//! which a resumed run must share: the model's shape, the global batch, the learning rate and
//! the data seed.

use crate::model::{Gpt, GptConfig};
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
pub use burn_rtp::checkpoint::{Checkpoint, CheckpointError, Manifest};
use burn_rtp::RotationKernels;
use burn_rtp::{RtpConfig, RtpDevice};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The trainer's fields of a checkpoint's manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerFields {
    /// Model shape.
    pub model: GptConfig,
    /// Global batch.
    pub batch: usize,
    /// Learning rate.
    pub lr: f64,
    /// Data seed.
    pub seed: u64,
}

/// Writes a checkpoint of `step` under `root` (a collective: every rank calls it); then rank
/// 0 keeps the newest `keep_last` checkpoints there (0: all) and removes what killed saves
/// left behind.
pub fn save<B, I, O>(
    device: &RtpDevice<I>,
    root: &Path,
    step: usize,
    fields: &TrainerFields,
    model: &Gpt<B>,
    optim: &O,
    keep_last: usize,
) -> Result<PathBuf, CheckpointError>
where
    I: RotationKernels,
    B: AutodiffBackend<Device = RtpDevice<I>>,
    O: Optimizer<Gpt<B>, B>,
{
    let dir = burn_rtp::checkpoint::save(device, root, step as u64, model, optim, fields)?;
    if device.rank() == 0 && keep_last > 0 {
        burn_rtp::checkpoint::prune(root, keep_last)?;
    }
    Ok(dir)
}

/// Opens and verifies the checkpoint at `path`, and refuses it unless it was written with the
/// same trainer fields (model shape, global batch). A checkpoint of another world size,
/// strategy or shard threshold is taken too, to be loaded through resharding, and said so
/// (when `tell`).
///
/// `path` is a checkpoint folder or a root; under a root the newest complete checkpoint is
/// taken, and each newer folder passed over is told on stderr with its fault (when `tell`).
/// A broken folder named directly is refused, with a line naming the newest complete
/// checkpoint beside it when there is one.
pub fn open_for(
    path: &Path,
    world: &RtpConfig,
    fields: &TrainerFields,
    tell: bool,
) -> Result<Checkpoint, CheckpointError> {
    let ckpt = if path.join("manifest.json").exists() {
        Checkpoint::open(path).inspect_err(|_| {
            let newest = path.parent().and_then(|root| Checkpoint::newest(root).ok());
            if let (true, Some(newest)) = (tell, newest) {
                eprintln!(
                    "resume: the newest complete checkpoint beside it is step {} ({}); \
                     resume from it with --resume {}",
                    newest.checkpoint.manifest().step,
                    newest.checkpoint.dir().display(),
                    path.parent().unwrap_or(path).display()
                );
            }
        })?
    } else {
        let newest = Checkpoint::newest(path)?;
        if tell {
            for skipped in &newest.skipped {
                eprintln!(
                    "resume: skipped {}: {}",
                    skipped.dir.display(),
                    skipped.error
                );
            }
        }
        newest.checkpoint
    };
    if let (Err(_), true) = (ckpt.check_config(world), tell) {
        let m = ckpt.manifest();
        eprintln!(
            "resume: resharding the checkpoint of step {} from {} rank(s) ({}, shard threshold \
             {}) into {} rank(s) ({}, shard threshold {})",
            m.step,
            m.world_size,
            m.strategy,
            m.shard_threshold,
            world.world_size,
            world.strategy,
            world.shard_threshold
        );
    }
    let saved: TrainerFields = ckpt.user()?;
    let mismatch = |what: &str, c: String, r: String| CheckpointError::Mismatch {
        what: what.into(),
        checkpoint: c,
        requested: r,
    };
    if saved.model != fields.model {
        return Err(mismatch(
            "model config",
            format!("{:?}", saved.model),
            format!("{:?}", fields.model),
        ));
    }
    if saved.batch != fields.batch {
        return Err(mismatch(
            "global batch",
            saved.batch.to_string(),
            fields.batch.to_string(),
        ));
    }
    Ok(ckpt)
}

/// Writes the checkpoint at `checkpoint` as one ordinary Burn record of the whole model at
/// `out` with the extension `.mpk` (named MessagePack, assembled on the host; the file
/// `NamedMpkFileRecorder` reads for `out`), which single-device Burn loads with [`load_consolidated`].
pub fn consolidate_checkpoint(checkpoint: &Path, out: &Path) -> Result<Manifest, CheckpointError> {
    let ckpt = Checkpoint::open(checkpoint)?;
    ckpt.consolidate(out)?;
    Ok(ckpt.manifest().clone())
}

/// Loads a full-model record file (as [`consolidate_checkpoint`] writes) into `model`. Under
/// RTP every rank keeps only its slice of each parameter.
pub fn load_full_into<B: Backend>(
    path: &Path,
    model: Gpt<B>,
    device: &B::Device,
) -> Result<Gpt<B>, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let record = NamedMpkBytesRecorder::<FullPrecisionSettings>::default()
        .load(bytes, device)
        .map_err(|e| CheckpointError::Record {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    Ok(model.load_record(record))
}

/// Writes a single-device model as a full-model record file.
pub fn save_full<B: Backend>(model: Gpt<B>, path: &Path) -> Result<(), CheckpointError> {
    let bytes = NamedMpkBytesRecorder::<FullPrecisionSettings>::default()
        .record(model.into_record(), ())
        .map_err(|e| CheckpointError::Record {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    std::fs::write(path, bytes).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Loads a consolidated model file into a single-device model.
pub fn load_consolidated<B: Backend>(
    path: &Path,
    config: &GptConfig,
    device: &B::Device,
) -> Result<Gpt<B>, CheckpointError> {
    load_full_into(path, config.init::<B>(device), device)
}
