//! Per-rank checkpoint IO: records written while saving hold only this rank's shards, and
//! records read while loading become shards again, without any rank gathering anything.
//!
//! A saved shard carries only its own shape, so the save records which full shape each shard
//! shape stands for (a [`ShardMap`]); loading looks the shape up again. Ambiguities (two full
//! shapes with the same shard shape, or a replicated tensor shaped like a shard) are refused
//! at save time rather than risked at load time.

use crate::error::{RtpError, RtpResult};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::thread::ThreadId;

/// Which full shape each saved shard shape stands for, and which shapes were replicated.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardMap {
    /// (shard shape, full logical shape) pairs, sorted by shard shape.
    pub sharded: Vec<(Vec<usize>, Vec<usize>)>,
    /// Shapes of tensors saved whole and identical on every rank.
    pub replicated: BTreeSet<Vec<usize>>,
}

impl ShardMap {
    /// The full shape a saved shard of shape `shard` stands for.
    pub fn full_of(&self, shard: &[usize]) -> Option<&Vec<usize>> {
        self.sharded
            .binary_search_by(|(s, _)| s.as_slice().cmp(shard))
            .ok()
            .map(|i| &self.sharded[i].1)
    }

    /// Adds every entry of `other` (the map of another record saved by the same rank), or
    /// names the shapes the two maps disagree on.
    pub fn merge(&mut self, other: &ShardMap) -> Result<(), String> {
        for (shard, full) in &other.sharded {
            self.insert(shard.clone(), full.clone())?;
        }
        self.replicated.extend(other.replicated.iter().cloned());
        self.check()
    }

    /// Refuses a replicated tensor shaped like a shard: loading could not tell them apart.
    fn check(&self) -> Result<(), String> {
        match self.replicated.iter().find(|s| self.full_of(s).is_some()) {
            Some(shape) => Err(format!(
                "a replicated tensor has shape {shape:?}, which is also a shard shape"
            )),
            None => Ok(()),
        }
    }

    fn insert(&mut self, shard: Vec<usize>, full: Vec<usize>) -> Result<(), String> {
        match self.sharded.binary_search_by(|(s, _)| s.cmp(&shard)) {
            Ok(i) if self.sharded[i].1 != full => Err(format!(
                "shard shape {shard:?} stands for both {:?} and {full:?}",
                self.sharded[i].1
            )),
            Ok(_) => Ok(()),
            Err(i) => {
                self.sharded.insert(i, (shard, full));
                Ok(())
            }
        }
    }
}

/// What the shard IO of a rank is doing right now.
#[derive(Debug, Default)]
pub(crate) enum ShardIo {
    /// Ordinary IO: reads gather, loads shard by the placement policy.
    #[default]
    Off,
    /// Saving: reads return this rank's shard and are recorded here.
    Saving {
        map: ShardMap,
        conflicts: Vec<String>,
    },
    /// Loading: data with a recorded shape is taken as this rank's shard (or as replicated).
    Loading(ShardMap),
}

impl ShardIo {
    pub(crate) fn note_shard(&mut self, shard: Vec<usize>, full: Vec<usize>) {
        if let ShardIo::Saving { map, conflicts } = self {
            if let Err(conflict) = map.insert(shard, full) {
                conflicts.push(conflict);
            }
        }
    }

    pub(crate) fn note_replicated(&mut self, shape: Vec<usize>) {
        if let ShardIo::Saving { map, .. } = self {
            map.replicated.insert(shape);
        }
    }

    /// Finishes a save: the map, or the reason it cannot be loaded unambiguously.
    pub(crate) fn finish(self, rank: usize) -> RtpResult<ShardMap> {
        let ShardIo::Saving { map, mut conflicts } = self else {
            return Ok(ShardMap::default());
        };
        if let Err(conflict) = map.check() {
            conflicts.push(conflict);
        }
        if conflicts.is_empty() {
            Ok(map)
        } else {
            Err(RtpError::ShardMap {
                rank,
                op: "save_shards".into(),
                reason: format!(
                    "this checkpoint could not be reloaded unambiguously: {}",
                    conflicts.join("; ")
                ),
            })
        }
    }
}

/// The shard IO modes of one rank, one per thread: a record may be written or read on a thread
/// other than the rank's own (burn-train's checkpointer threads), while the rank's thread
/// keeps training with ordinary reads.
#[derive(Debug, Default)]
pub(crate) struct ShardIoByThread(Mutex<HashMap<ThreadId, ShardIo>>);

impl ShardIoByThread {
    /// Sets the calling thread's mode.
    pub(crate) fn set(&self, io: ShardIo) {
        let id = std::thread::current().id();
        let mut modes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match io {
            ShardIo::Off => modes.remove(&id),
            io => modes.insert(id, io),
        };
    }

    /// Takes the calling thread's mode, leaving it off.
    pub(crate) fn take(&self) -> ShardIo {
        let id = std::thread::current().id();
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id)
            .unwrap_or_default()
    }

    /// Runs `f` on the calling thread's mode.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut ShardIo) -> T) -> T {
        let id = std::thread::current().id();
        let mut modes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match modes.get_mut(&id) {
            Some(io) => f(io),
            None => f(&mut ShardIo::Off),
        }
    }
}
