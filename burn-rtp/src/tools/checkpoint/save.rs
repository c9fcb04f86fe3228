//! Saving: every rank writes its own shards into a temporary folder, rank 0 writes the
//! manifest and renames the folder into place once all have written.

use super::durable::{save_point, sync_dir, write_atomic_at, write_synced};
use super::{
    fnv1a64, io, model_file, optim_file, param_kinds, step_dir, validate, CheckpointError,
    FileEntry, Manifest, RankFiles, MANIFEST,
};
use crate::backend::device::RtpDevice;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::Serialize;
use std::path::{Path, PathBuf};

pub(super) type Mpk = NamedMpkBytesRecorder<FullPrecisionSettings>;

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
