//! What a checkpoint holds, as its manifest lists it, and the names of its files: the one
//! description that saving writes and every reader checks before it trusts a byte.

use crate::state::shard_io::ShardMap;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Format version written into every manifest.
pub const FORMAT: u32 = 2;
pub(super) const MANIFEST: &str = "manifest.json";

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
pub(super) struct RankFiles {
    pub(super) shard_map: ShardMap,
    pub(super) files: Vec<FileEntry>,
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
    pub(super) fn of_world(config: &crate::RtpConfig, step: u64, user: serde_json::Value) -> Self {
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

/// Checks a shard map read from a manifest against the world that wrote it, so that loading
/// never meets a shape it cannot split: each full shape has a dimension, each shard shape is
/// its full shape with the last dimension cut to `rank`'s range, the entries are sorted by
/// shard shape (loading searches them), and no replicated shape is also a shard shape.
pub(super) fn check_shard_map(map: &ShardMap, world: usize, rank: usize) -> Result<(), String> {
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
pub(super) fn is_plain_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(n)), None) if n == std::ffi::OsStr::new(name)
    )
}

pub(super) fn model_file(rank: usize) -> String {
    format!("rank-{rank:05}.model.mpk")
}

pub(super) fn optim_file(rank: usize) -> String {
    format!("rank-{rank:05}.optim.mpk")
}

/// The file Burn's `NamedMpkFileRecorder` reads and writes for `path`: `path` with its
/// extension set to `mpk` (Burn's file recorders call `PathBuf::set_extension`, which
/// replaces the last extension: `model` and `model.mpk` name `model.mpk`, and so does
/// `model.v2`). [`Checkpoint::consolidate`](super::Checkpoint::consolidate) writes there.
pub fn record_file(path: &Path) -> PathBuf {
    let mut file = path.to_path_buf();
    file.set_extension("mpk");
    file
}

/// The folder of step `step` under a checkpoint root.
pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step:08}"))
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
