//! The GPT trainer of burn-rtp: a decoder-only GPT written once with `burn::nn`, trained under
//! `single`, `ddp`, `fsdp` or `rtp` on the same transport and inner backend, with per-rank
//! checkpoints and a JSON report.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod data;
pub mod generate;
#[cfg(feature = "learner")]
pub mod learner_steps;
pub mod model;
pub mod plan;
pub mod report;
pub mod restart;
pub mod schedule;
pub mod signals;
pub mod trainer;

pub use burn_rtp::Strategy;
pub use checkpoint::{consolidate_checkpoint, CheckpointError, Manifest};
pub use data::{Corpus, DataError};
pub use generate::{generate, Decoder, Sampler};
pub use model::{Gpt, GptCache, GptConfig};
pub use report::{PeakBytes, Report};
pub use schedule::{LrSchedule, Schedule};
pub use signals::stop_on_signals;
pub use trainer::{train, Progress, TrainConfig, TrainError, TrainOutcome};
