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

mod durable;
mod error;
mod fault;
mod find;
mod load;
mod manifest;
mod recorder;
mod reshard;
mod save;
mod validate;

pub use error::CheckpointError;
pub use fault::KILL_AT_SAVE_POINT;
pub use find::{prune, Newest, Skipped};
pub use manifest::{fnv1a64, record_file, step_dir, FileEntry, Manifest, FORMAT};
pub use recorder::RankRecorder;
pub use save::save;

// For the sibling modules (`super::…`).
use durable::write_atomic;
use error::io;
use load::{decode, param_kinds, Target};
use manifest::{check_shard_map, is_plain_name, model_file, optim_file, RankFiles, MANIFEST};
use save::Mpk;

use std::path::PathBuf;

/// A verified checkpoint on disk: its manifest and folder.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    manifest: Manifest,
    dir: PathBuf,
}
