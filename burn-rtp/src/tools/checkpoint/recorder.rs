//! Sharded checkpoints written by a checkpointer that calls Burn's recorder itself:
//! burn-train's Learner (`SupervisedTraining::with_file_checkpointer`).
//!
//! burn-train saves each record (model, optimizer, scheduler) on a thread of its own, one per
//! record, and names the file `<its folder>/<record>-<epoch>`. [`RankRecorder`] turns that
//! into the checkpoint format of [`save`](super::save): each rank writes only its shards, into
//! the shared step folder of that epoch, and rank 0's model thread writes the manifest once
//! every rank's files of this run are there (it waits for them, with a time limit, instead of
//! joining a collective from a thread that is not the rank's). Loading
//! (a Learner resuming from an epoch) reads this rank's file, checks it against the manifest,
//! and makes its tensors this rank's shards again, on this rank's device whatever device
//! burn-train passes.

use super::{
    decode, fnv1a64, io, model_file, optim_file, step_dir, write_atomic, Checkpoint,
    CheckpointError, FileEntry, Manifest, Mpk, MANIFEST,
};
use crate::backend::device::RtpDevice;
use crate::state::shard_io::ShardMap;
use burn::record::{
    FileRecorder, FullPrecisionSettings, NamedMpkFileRecorder, Record, Recorder, RecorderError,
};
use burn::tensor::backend::Backend;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A Burn `FileRecorder` that writes and reads one rank's part of a sharded checkpoint; give
/// one per rank to burn-train's `with_file_checkpointer`.
///
/// The checkpoints it writes are ordinary burn-rtp checkpoints (one `step-NNNNNNNN` folder per
/// saved epoch under `root`, a manifest, `latest`), so [`Checkpoint::open`], resharding and
/// consolidation work on them. Every rank must save the same epochs: use a checkpointing
/// strategy that decides from the epoch alone (burn-train's `KeepLastNCheckpoints`), not one
/// that reads metrics.
#[derive(Clone, Debug)]
pub struct RankRecorder<I: Backend> {
    device: RtpDevice<I>,
    root: PathBuf,
    steps_per_epoch: u64,
    keep_last: Option<usize>,
    wait: Duration,
    /// The records every saved epoch has, model and optimizer first.
    records: Vec<String>,
    /// Names this run's summaries, so that rank 0 never takes a summary left in a step folder
    /// by an earlier run for one of this run.
    run: u64,
}

impl<I: Backend> Default for RankRecorder<I> {
    /// A recorder of a world of one rank under `checkpoint` (burn's `Recorder` requires
    /// `Default`; a Learner is given a recorder made with [`RankRecorder::new`]).
    fn default() -> Self {
        Self::with_run(RtpDevice::default(), "checkpoint".into(), 0)
    }
}

impl<I: Backend> RankRecorder<I> {
    /// The recorder of `device`'s rank, writing checkpoints under `root` (the same folder on
    /// every rank). A saved epoch `e` goes to the folder of step `e` (see
    /// [`RankRecorder::with_steps_per_epoch`]).
    ///
    /// A collective: every rank creates its recorder at the same point of its program (the
    /// ranks agree on an identifier of this run).
    pub fn new(device: RtpDevice<I>, root: impl Into<PathBuf>) -> Self {
        let own = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (u64::from(std::process::id()) << 32);
        let run = device.all_gather_json(&own)[0];
        Self::with_run(device, root.into(), run)
    }

    fn with_run(device: RtpDevice<I>, root: PathBuf, run: u64) -> Self {
        Self {
            device,
            root,
            steps_per_epoch: 1,
            keep_last: None,
            wait: Duration::from_secs(300),
            records: ["model", "optim", "scheduler"].map(String::from).to_vec(),
            run,
        }
    }

    /// The records a checkpointer saves each time besides `model` and `optim` (burn-train's
    /// Learner: `scheduler`, the default). The manifest is written once all are there.
    pub fn with_other_records(mut self, names: &[&str]) -> Self {
        self.records.truncate(2);
        self.records.extend(names.iter().map(|n| n.to_string()));
        self
    }

    /// Numbers checkpoints by training step: epoch `e` is saved as step `e * steps`.
    pub fn with_steps_per_epoch(mut self, steps: usize) -> Self {
        self.steps_per_epoch = steps.max(1) as u64;
        self
    }

    /// Keeps only the newest `n` checkpoints: rank 0 removes older step folders once a new
    /// manifest is written (burn-train's own deletions name files this recorder never
    /// writes, so they find nothing).
    pub fn with_keep_last(mut self, n: usize) -> Self {
        self.keep_last = Some(n.max(1));
        self
    }

    /// How long rank 0 waits for the other ranks' files before it gives up on a checkpoint.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The checkpoint root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The record and epoch a checkpointer's path names (`…/model-3` is the model of epoch 3).
    fn locate(&self, path: &Path) -> Result<(String, u64), RecorderError> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let parsed = name.as_deref().and_then(|n| {
            let (kind, epoch) = n.rsplit_once('-')?;
            Some((kind.to_string(), epoch.parse::<u64>().ok()?))
        });
        parsed.ok_or_else(|| {
            RecorderError::Unknown(format!(
                "rank {}: RankRecorder expects a checkpointer path `<record>-<epoch>`, got {}",
                self.device.rank(),
                path.display()
            ))
        })
    }

    fn file_of(kind: &str, rank: usize) -> String {
        match kind {
            "model" => model_file(rank),
            "optim" => optim_file(rank),
            other => format!("rank-{rank:05}.{other}.mpk"),
        }
    }

    fn part_of(kind: &str, rank: usize) -> String {
        format!("rank-{rank:05}.{kind}.json")
    }

    /// Writes this rank's file of `kind` and the summary rank 0 assembles the manifest from.
    fn write<B>(
        &self,
        kind: &str,
        epoch: u64,
        record: impl Record<B>,
    ) -> Result<(), CheckpointError>
    where
        B: Backend<Device = RtpDevice<I>>,
    {
        let rank = self.device.rank();
        let step = epoch * self.steps_per_epoch;
        let dir = step_dir(&self.root, step);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let name = Self::file_of(kind, rank);
        let path = dir.join(&name);
        let (bytes, shard_map) = self
            .device
            .save_shards(|| Recorder::<B>::record(&Mpk::default(), record, ()))?;
        let bytes = bytes.map_err(|e| CheckpointError::Record {
            path: path.clone(),
            reason: format!("encoding failed: {e}"),
        })?;
        write_atomic(&path, &bytes)?;
        let part = Part {
            run: self.run,
            shard_map,
            file: FileEntry {
                name,
                bytes: bytes.len() as u64,
                fnv1a64: fnv1a64(&bytes),
            },
        };
        let text = serde_json::to_vec(&part).expect("plain data");
        write_atomic(&dir.join(Self::part_of(kind, rank)), &text)?;
        if rank == 0 && kind == "model" {
            self.assemble(&dir, step, epoch)?;
        }
        Ok(())
    }

    /// Rank 0: waits until every rank's model, optimizer and other records of this epoch are
    /// written and match their summaries, then writes the manifest and `latest`.
    fn assemble(&self, dir: &Path, step: u64, epoch: u64) -> Result<(), CheckpointError> {
        let world = self.device.world_size();
        let deadline = Instant::now() + self.wait;
        let parts = loop {
            match self.complete(dir, world) {
                Some(parts) => break parts,
                None if Instant::now() > deadline => {
                    return Err(CheckpointError::BadManifest {
                        path: dir.join(MANIFEST),
                        reason: format!(
                            "not every rank wrote its files of epoch {epoch} within {:?}",
                            self.wait
                        ),
                    })
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let user = serde_json::json!({ "epoch": epoch, "written_by": "burn-train Learner" });
        let mut manifest = Manifest::of_world(self.device.config(), step, user);
        for (rank, kinds) in parts.into_iter().enumerate() {
            let mut map = ShardMap::default();
            for (kind, part) in kinds {
                map.merge(&part.shard_map)
                    .map_err(|reason| CheckpointError::BadManifest {
                        path: dir.join(Self::part_of(&kind, rank)),
                        reason,
                    })?;
                match kind.as_str() {
                    "model" | "optim" => manifest.files.push(part.file),
                    _ => manifest.extra_files.push(part.file),
                }
                let _ = std::fs::remove_file(dir.join(Self::part_of(&kind, rank)));
            }
            manifest.shard_maps.push(map);
        }
        let text = serde_json::to_vec_pretty(&manifest).expect("plain data");
        write_atomic(&dir.join(MANIFEST), &text)?;
        let name = dir.file_name().expect("a step folder").to_string_lossy();
        write_atomic(&self.root.join("latest"), name.as_bytes())?;
        self.prune(step);
        Ok(())
    }

    /// Every rank's summaries of this run, in the order of `records`, once all are there and
    /// each file has the size its summary gives (a file is renamed into place before its
    /// summary is written); `None` while any is missing. Nothing is read but the summaries.
    fn complete(&self, dir: &Path, world: usize) -> Option<Vec<Vec<(String, Part)>>> {
        let kinds = &self.records;
        let mut out = Vec::with_capacity(world);
        for rank in 0..world {
            let mut parts = Vec::with_capacity(kinds.len());
            for kind in kinds {
                let part: Part = read_json(&dir.join(Self::part_of(kind, rank)))?;
                let bytes = std::fs::metadata(dir.join(&part.file.name)).ok()?.len();
                if part.run != self.run || bytes != part.file.bytes {
                    return None;
                }
                parts.push((kind.clone(), part));
            }
            out.push(parts);
        }
        Some(out)
    }

    /// Removes step folders older than the newest `keep_last` (rank 0, after a manifest).
    fn prune(&self, newest: u64) {
        let Some(keep) = self.keep_last else { return };
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        let mut steps: Vec<u64> = entries
            .filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().into_owned();
                name.strip_prefix("step-")?.parse().ok()
            })
            .filter(|&s| s <= newest)
            .collect();
        steps.sort_unstable();
        let old = steps.len().saturating_sub(keep);
        for step in &steps[..old] {
            let _ = std::fs::remove_dir_all(step_dir(&self.root, *step));
        }
    }

    /// Reads this rank's record of `kind` saved at `epoch`, checked against the manifest.
    fn read<B, R>(&self, kind: &str, epoch: u64) -> Result<R, CheckpointError>
    where
        B: Backend<Device = RtpDevice<I>>,
        R: Record<B>,
    {
        let dir = step_dir(&self.root, epoch * self.steps_per_epoch);
        let checkpoint = Checkpoint::open_manifest(&dir)?;
        checkpoint.check_world(&self.device)?;
        let rank = self.device.rank();
        let name = Self::file_of(kind, rank);
        let bytes = checkpoint.read(&name)?;
        let map = &checkpoint.manifest().shard_maps[rank];
        decode::<I, B, R>(&self.device, map, bytes, dir.join(name), None)
    }
}

/// What a rank reports about one record file it wrote.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Part {
    run: u64,
    shard_map: ShardMap,
    file: FileEntry,
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn recorder_error(rank: usize, e: CheckpointError) -> RecorderError {
    RecorderError::Unknown(format!("rank {rank}: {e}"))
}

impl<I, B> Recorder<B> for RankRecorder<I>
where
    I: Backend,
    B: Backend<Device = RtpDevice<I>>,
{
    type Settings = FullPrecisionSettings;
    type RecordArgs = PathBuf;
    type RecordOutput = ();
    type LoadArgs = PathBuf;

    fn record<R: Record<B>>(&self, record: R, path: PathBuf) -> Result<(), RecorderError> {
        let (kind, epoch) = self.locate(&path)?;
        self.write::<B>(&kind, epoch, record)
            .map_err(|e| recorder_error(self.device.rank(), e))
    }

    fn load<R: Record<B>>(&self, path: PathBuf, _device: &B::Device) -> Result<R, RecorderError> {
        // burn-train passes `Default::default()` (a solo device); the record belongs to this
        // rank's device.
        let (kind, epoch) = self.locate(&path)?;
        self.read::<B, R>(&kind, epoch)
            .map_err(|e| recorder_error(self.device.rank(), e))
    }

    fn save_item<T: Serialize>(&self, item: T, path: PathBuf) -> Result<(), RecorderError> {
        Recorder::<B>::save_item(
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            item,
            path,
        )
    }

    fn load_item<T: DeserializeOwned>(&self, path: &mut PathBuf) -> Result<T, RecorderError> {
        Recorder::<B>::load_item(&NamedMpkFileRecorder::<FullPrecisionSettings>::new(), path)
    }
}

impl<I, B> FileRecorder<B> for RankRecorder<I>
where
    I: Backend,
    B: Backend<Device = RtpDevice<I>>,
{
    fn file_extension() -> &'static str {
        "mpk"
    }
}
