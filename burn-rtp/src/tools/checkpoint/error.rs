//! What can go wrong with a checkpoint, as a caller can act on it.

use super::MANIFEST;
use crate::error::RtpError;
use crate::state::accounting::human_bytes;
use std::path::{Path, PathBuf};
use thiserror::Error;

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

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}
