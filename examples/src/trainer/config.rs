//! What a training run is asked to do, checked before any rank starts, and how it can fail.

use crate::checkpoint::{CheckpointError, TrainerFields};
use crate::data::DataError;
use crate::model::GptConfig;
use crate::schedule::LrSchedule;
use burn_rtp::{ActivationCheckpointing, MpiProgress};
use burn_rtp::{RotationMode, Routing, Strategy, TransportKind};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// Everything a training run needs.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Strategy (single-device training is `Ddp` on one rank).
    pub strategy: Strategy,
    /// Ranks.
    pub ranks: usize,
    /// Rotation mode (RTP only).
    pub rotation: RotationMode,
    /// What moves for a sharded Linear (RTP only): the weights or the activations.
    pub routing: Routing,
    /// Steps to train in this run.
    pub steps: usize,
    /// Global batch: sequences per step over all ranks.
    pub batch: usize,
    /// Model shape.
    pub model: GptConfig,
    /// Adam learning rate (the peak, when a schedule is set).
    pub lr: f64,
    /// Steps of linear warm-up to `lr`, counted from the first step of the first run.
    pub warmup_steps: usize,
    /// What the rate does after the warm-up.
    pub lr_schedule: LrSchedule,
    /// Clip the global gradient norm (over all ranks' shards) to this value.
    pub clip_grad_norm: Option<f32>,
    /// When this flag is raised (by a signal handler, say), every rank finishes its current
    /// step, a checkpoint is written (if `checkpoint_dir` is set) and the run ends early.
    pub stop: Option<Arc<AtomicBool>>,
    /// Makes the loss of step `.0` (counted from 1) NaN on rank `.1`: a fault to test the
    /// non-finite guard with.
    pub inject_non_finite_loss: Option<(usize, usize)>,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Training text instead of the shipped corpus.
    pub data: Option<PathBuf>,
    /// Where to write checkpoints.
    pub checkpoint_dir: Option<PathBuf>,
    /// Write a checkpoint every this many steps (0: only at the end).
    pub checkpoint_every: usize,
    /// Keep this many newest checkpoints under `checkpoint_dir` (0: keep every one).
    pub keep_last: usize,
    /// Restart a failed world from its newest checkpoint under `checkpoint_dir` up to this
    /// many times (in-process; under MPI, `gpt supervise` restarts the job).
    pub max_restarts: usize,
    /// Checkpoint to resume from.
    pub resume: Option<PathBuf>,
    /// Full-model record (e.g. a consolidated checkpoint) to start from; each rank keeps
    /// only its slice.
    pub init: Option<PathBuf>,
    /// Evaluate the validation loss every this many steps (0: only at start and end).
    pub eval_every: usize,
    /// Validation batches (of `batch` sequences) per evaluation.
    pub eval_batches: usize,
    /// Bytes to generate at the end (0: none).
    pub sample_bytes: usize,
    /// In-process ranks or one MPI process per rank (`None`: as the environment says).
    pub transport: Option<TransportKind>,
    /// How long a rank waits for a silent peer before failing (`None`: the decorator's default).
    pub peer_timeout: Option<Duration>,
    /// Under MPI, how each process's communication thread paces its tests of transfers in
    /// flight.
    pub mpi_progress: MpiProgress,
    /// Under MPI, whether glibc is asked for one malloc arena per process
    /// ([`burn_rtp::RtpConfig::with_one_malloc_arena`]).
    pub one_malloc_arena: bool,
    /// Parameters below this many elements are replicated, not sharded (`None`: the
    /// library's default, [`burn_rtp::DEFAULT_SHARD_THRESHOLD`]).
    pub shard_threshold: Option<usize>,
    /// Recompute memory-bound activations in the backward pass
    /// (`Autodiff<Rtp<I>, BalancedCheckpointing>`) instead of keeping them. The numbers are
    /// the same, so a run may resume under either setting.
    pub activation_checkpointing: ActivationCheckpointing,
    /// Threads each rank computes with (`None`: the host's cores divided by the ranks on it;
    /// [`burn_rtp::RtpConfig::with_threads_per_rank`]).
    pub threads_per_rank: Option<usize>,
}

impl TrainConfig {
    /// The defaults of the example's command line.
    pub fn new(strategy: Strategy, ranks: usize) -> Self {
        Self {
            strategy,
            ranks,
            rotation: RotationMode::OutOfPlace,
            routing: Routing::Auto,
            steps: 500,
            batch: 32,
            model: GptConfig::new(64, 96, 2, 4),
            lr: 3e-3,
            warmup_steps: 0,
            lr_schedule: LrSchedule::Constant,
            clip_grad_norm: None,
            stop: None,
            inject_non_finite_loss: None,
            seed: 42,
            data: None,
            checkpoint_dir: None,
            checkpoint_every: 0,
            keep_last: 3,
            max_restarts: 0,
            resume: None,
            init: None,
            eval_every: 50,
            eval_batches: 2,
            sample_bytes: 0,
            transport: None,
            peer_timeout: None,
            mpi_progress: MpiProgress::Auto,
            one_malloc_arena: true,
            shard_threshold: None,
            activation_checkpointing: ActivationCheckpointing::None,
            threads_per_rank: None,
        }
    }

    /// The settings every rank must share, checked before the first step.
    pub(super) fn shared_settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("model configuration", format!("{:?}", self.model)),
            ("seed", self.seed.to_string()),
            ("global batch", self.batch.to_string()),
            ("learning rate", self.lr.to_string()),
            ("warm-up steps", self.warmup_steps.to_string()),
            ("learning-rate schedule", self.lr_schedule.to_string()),
            ("gradient clipping", format!("{:?}", self.clip_grad_norm)),
            ("steps", self.steps.to_string()),
            ("corpus", format!("{:?}", self.data)),
            ("resumed checkpoint", format!("{:?}", self.resume)),
            ("initial weights", format!("{:?}", self.init)),
            // Not a number changes with it, but the Linears' backward passes do: a rank
            // recomputing an input exchanges with its peers in a different order.
            (
                "activation checkpointing",
                self.activation_checkpointing.to_string(),
            ),
        ]
    }

    /// The trainer's fields of a checkpoint, which a resumed run must share.
    pub(super) fn fields(&self) -> TrainerFields {
        TrainerFields {
            model: self.model.clone(),
            batch: self.batch,
            lr: self.lr,
            seed: self.seed,
        }
    }

    /// Checks every setting that needs no file or rank, so that a bad value is refused before
    /// anything is built. `train` calls it too.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |msg: String| Err(TrainError::Config(msg));
        self.model.validate().map_err(TrainError::Config)?;
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!(
                "--lr must be a positive finite number, not {}",
                self.lr
            ));
        }
        if self.lr_schedule != LrSchedule::Constant || self.warmup_steps > 1 {
            // Burn's schedulers, which build the schedule, take rates in (0, 1].
            if self.lr > 1.0 {
                return bad(format!(
                    "--lr {} is above 1, which a warm-up or cosine schedule does not take",
                    self.lr
                ));
            }
        }
        if let Some(c) = self.clip_grad_norm {
            if !(c.is_finite() && c > 0.0) {
                return bad(format!(
                    "--clip-grad-norm must be a positive finite number, not {c}"
                ));
            }
        }
        if self.max_restarts > 0 && self.checkpoint_dir.is_none() {
            return bad(format!(
                "--max-restarts {} needs --checkpoint-dir: a restart resumes from the newest \
                 checkpoint there",
                self.max_restarts
            ));
        }
        if self.resume.is_none() && self.warmup_steps > self.steps {
            return bad(format!(
                "--warmup-steps {} is more than the {} --steps of the run",
                self.warmup_steps, self.steps
            ));
        }
        let world = self.ranks;
        if world == 0 {
            return bad("--ranks must be at least 1".into());
        }
        if self.batch == 0 || !self.batch.is_multiple_of(world) {
            return bad(format!(
                "--batch {} (the global batch) must be a positive multiple of the {world} ranks",
                self.batch
            ));
        }
        if self.eval_batches == 0 {
            return bad("at least one validation batch is needed".into());
        }
        Ok(())
    }

    /// The shard threshold this run uses.
    pub(super) fn threshold(&self) -> usize {
        self.shard_threshold
            .unwrap_or(burn_rtp::DEFAULT_SHARD_THRESHOLD)
    }
}

/// Why a run failed.
#[derive(Debug, Error)]
pub enum TrainError {
    /// The settings are inconsistent.
    #[error("invalid settings: {0}")]
    Config(String),
    /// The corpus is unusable.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A checkpoint is unusable or could not be written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A rank failed.
    #[error(transparent)]
    Rtp(#[from] burn_rtp::RtpError),
    /// A loss or gradient norm became NaN or infinite; every rank stopped before applying
    /// the step, and no checkpoint was written after it.
    #[error("{error}; stopped before updating the model, and no checkpoint was written after step {last_good}; {}", match checkpoint { Some(p) => format!("the last good checkpoint is {}", p.display()), None => "no checkpoint of a good step exists".into() })]
    NonFinite {
        /// The agreed error (step and first bad rank).
        error: Box<burn_rtp::RtpError>,
        /// The last step whose update was applied.
        last_good: usize,
        /// The last checkpoint written, or the one the run resumed from.
        checkpoint: Option<PathBuf>,
    },
}
