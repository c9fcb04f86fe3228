//! The training loop, written once: every strategy runs it on every rank.

use crate::checkpoint::{self, CheckpointError, TrainerFields};
use crate::data::{Corpus, DataError, Windows};
use crate::model::{Gpt, GptConfig};
use crate::report::{PeakBytes, Report};
use crate::schedule::{LrSchedule, Schedule};
use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_rtp::{ActivationCheckpointing, MpiProgress, RotationKernels};
use burn_rtp::{
    MemoryStats, RotationMode, Rtp, RtpConfig, RtpDevice, RtpOptimizer, Strategy, TransportKind,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
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
    fn shared_settings(&self) -> Vec<(&'static str, String)> {
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
    fn fields(&self) -> TrainerFields {
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
    fn threshold(&self) -> usize {
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

/// What rank 0 reports after each step.
#[derive(Debug, Clone)]
pub struct StepEvent {
    /// Steps completed (including resumed ones).
    pub step: usize,
    /// Last step of this run.
    pub total: usize,
    /// Mean training loss of this step over all ranks.
    pub train_loss: f32,
    /// Learning rate of this step.
    pub lr: f64,
    /// Global gradient norm before clipping (when clipping is on).
    pub grad_norm: Option<f32>,
    /// Latest validation loss.
    pub val_loss: f32,
    /// Training tokens per second over all ranks.
    pub tokens_per_s: f64,
    /// Rank 0's peak memory so far.
    pub peak: MemoryStats,
}

/// Receives progress from rank 0.
pub trait Progress: Send + Sync {
    /// Called after every step.
    fn on_step(&self, event: &StepEvent);
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    /// The rank this outcome comes from: 0 in-process; this process's rank under MPI, where
    /// only rank 0 should print.
    pub rank: usize,
    /// The report (also what `--report` writes).
    pub report: Report,
    /// Validation loss before this run's first step.
    pub initial_val_loss: f64,
    /// Text generated by the trained model.
    pub sample: String,
    /// Where the last checkpoint was written.
    pub checkpoint: Option<PathBuf>,
    /// The step after which a stop request ended the run early (`None`: it ran to the end).
    pub stopped_at: Option<usize>,
    /// How many times the world failed and was restarted from a checkpoint; the report
    /// holds the last attempt's steps.
    pub restarts: usize,
}

/// The training backend: RTP over `I` under autodiff with checkpointing strategy `C`.
type Ad<I, C> = burn::backend::Autodiff<Rtp<I>, C>;

struct RankResult {
    rank: usize,
    losses: Vec<f32>,
    step_ms: Vec<f64>,
    initial_val: f32,
    final_val: f32,
    params: usize,
    /// Every rank's memory, gathered on every rank (each process knows only its own).
    memory: Vec<RankMemory>,
    sample: String,
    checkpoint: Option<PathBuf>,
    stopped_at: Option<usize>,
    /// The agreed non-finite error, with the last good step.
    failure: Option<(burn_rtp::RtpError, usize)>,
}

/// One rank's peaks: the ledger's and the operating system's.
#[derive(serde::Serialize, serde::Deserialize)]
struct RankMemory {
    ledger: PeakBytes,
    rss: u64,
    /// The transport's pacing (MPI only).
    progress: Option<String>,
    /// Share of the recorded transfer time hidden behind compute.
    hidden: Option<f64>,
}

/// Mean validation loss over `eval_batches` batches, split across ranks.
fn evaluate<I: RotationKernels>(
    model: &Gpt<Rtp<I>>,
    corpus: &Corpus,
    cfg: &TrainConfig,
    device: &RtpDevice<I>,
) -> f32 {
    let world = device.world_size();
    let per = cfg.batch / world;
    let total = cfg.batch * cfg.eval_batches;
    let mut sum = 0.0;
    for b in 0..cfg.eval_batches {
        let first = b * cfg.batch + device.rank() * per;
        let (x, y) = Windows::val(corpus, first..first + per, total, cfg.model.seq)
            .tensors::<Rtp<I>>(device);
        sum += model.loss(x, y).into_scalar().elem::<f32>();
    }
    device.all_reduce_mean(sum / cfg.eval_batches as f32)
}

/// Generates `n` bytes after `prompt`, sampling at temperature 0.8 with a seeded generator.
fn sample<I: RotationKernels>(
    model: &Gpt<Rtp<I>>,
    device: &RtpDevice<I>,
    prompt: &str,
    n: usize,
    seq: usize,
    seed: u64,
) -> String {
    let mut bytes: Vec<u8> = prompt.bytes().collect();
    let mut state = seed | 1;
    for _ in 0..n {
        let start = bytes.len().saturating_sub(seq);
        let window: Vec<i64> = bytes[start..].iter().map(|&b| i64::from(b)).collect();
        let len = window.len();
        let tokens = Tensor::<Rtp<I>, 2, Int>::from_data(TensorData::new(window, [1, len]), device);
        let logits = model.logits(tokens);
        let vocab = logits.dims()[2];
        let last = logits.slice([0..1, len - 1..len]).reshape([vocab]);
        let probs = softmax(last / 0.8, 0)
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap();
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut u = (state >> 11) as f32 / (1u64 << 53) as f32;
        let mut choice = vocab - 1;
        for (i, p) in probs.iter().enumerate() {
            if u < *p {
                choice = i;
                break;
            }
            u -= p;
        }
        bytes.push(choice as u8);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The optimizer every rank runs: Burn's Adam, each parameter's step in one pass
/// ([`burn_rtp::FusedAdam`], whose records are Burn's Adam's), behind [`RtpOptimizer`].
type Optim<I, C> = RtpOptimizer<
    burn::optim::adaptor::OptimizerAdaptor<burn_rtp::FusedAdam, Gpt<Ad<I, C>>, Ad<I, C>>,
>;

/// What a rank trains from: the model, its optimizer and the learning-rate schedule.
type Start<I, C> = (Gpt<Ad<I, C>>, Optim<I, C>, Schedule);

/// What every rank of one run shares: the settings, the data and where training starts.
struct RankJob<'a> {
    cfg: &'a TrainConfig,
    corpus: &'a Corpus,
    resume: Option<&'a burn_rtp::checkpoint::Checkpoint>,
    schedule: &'a Schedule,
    /// The steps of this run (a resumed run starts at the checkpoint's step).
    steps: std::ops::Range<usize>,
    /// Sequences per rank and step.
    per: usize,
    progress: Option<&'a dyn Progress>,
}

/// What a rank has recorded so far.
#[derive(Default)]
struct RankLog {
    losses: Vec<f32>,
    step_ms: Vec<f64>,
    trained_s: f64,
    val: f32,
    checkpoint: Option<PathBuf>,
    saved_at: Option<usize>,
    stopped_at: Option<usize>,
    failure: Option<(burn_rtp::RtpError, usize)>,
    /// Share of the transfer time of the last steps that fell during compute.
    hidden: Option<f64>,
}

/// How many of a run's last steps the timeline records for the report's hidden share.
const TIMELINE_STEPS: usize = 20;

impl RankJob<'_> {
    /// One rank's whole run: set up, train step by step, then evaluate, save and report.
    fn run<I: RotationKernels, C: CheckpointStrategy>(
        &self,
        device: RtpDevice<I>,
    ) -> Result<RankResult, TrainError> {
        let cfg = self.cfg;
        let (mut model, mut optim, mut schedule) = self.set_up(&device)?;
        let initial_val = evaluate(&model.valid(), self.corpus, cfg, &device);
        let mut log = RankLog {
            val: initial_val,
            ..RankLog::default()
        };
        let one_process_per_rank = burn_rtp::transport::mpi_launch().is_some();
        // The timeline records the last TIMELINE_STEPS steps, never the first (its one-off
        // costs, kernel compilation on a GPU, are not the run's overlap).
        let record_from = self
            .steps
            .end
            .saturating_sub(TIMELINE_STEPS)
            .max(self.steps.start + 1);
        for step in self.steps.clone() {
            if step == record_from {
                device.record_timeline(true);
            }
            let t0 = Instant::now();
            let done = step + 1;
            crate::restart::maybe_fail(device.rank(), done, one_process_per_rank);
            // The lines of an ordinary Burn training step: this rank's slice of the batch,
            // the loss, backward, and the update through `RtpOptimizer`.
            let (x, y) = Windows::train(
                self.corpus,
                cfg.seed,
                step,
                self.rows(device.rank()),
                cfg.model.seq,
            )
            .tensors::<Ad<I, C>>(&device);
            let loss = model.loss(x, y);
            let mean = match self.global_loss(&device, &loss, done) {
                Ok(mean) => mean,
                Err(e) => {
                    log.failure = Some((e, step));
                    break;
                }
            };
            let lr = schedule.next().expect("a schedule never ends");
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(lr, model, grads);
            if let Err(e) = check_grad_norm(&device, &optim, done) {
                log.failure = Some((e, step));
                break;
            }
            let dt = t0.elapsed().as_secs_f64();
            log.trained_s += dt;
            log.step_ms.push(dt * 1e3);
            log.losses.push(mean);
            self.after_step(&device, &model, &optim, done, lr, &mut log)?;
            // Ranks see a signal at different moments; they agree to stop after one step.
            if let Some(stop) = &cfg.stop {
                if done != self.steps.end && device.any_rank(stop.load(Ordering::SeqCst)) {
                    log.stopped_at = Some(done);
                    break;
                }
            }
        }
        let timeline = device.take_timeline();
        device.record_timeline(false);
        log.hidden = burn_rtp::timeline::hidden_transfer_fraction(&timeline);
        self.finish(&device, model, &optim, initial_val, log)
    }

    /// This rank's rows of each step's global batch.
    fn rows(&self, rank: usize) -> std::ops::Range<usize> {
        rank * self.per..(rank + 1) * self.per
    }

    /// Agrees on the settings, then builds the model and optimizer (loading the initial
    /// weights or the checkpoint to resume from) and the learning-rate schedule.
    fn set_up<I: RotationKernels, C: CheckpointStrategy>(
        &self,
        device: &RtpDevice<I>,
    ) -> Result<Start<I, C>, TrainError> {
        let cfg = self.cfg;
        device.agree(&cfg.shared_settings())?;
        Ad::<I, C>::seed(device, cfg.seed);
        device.reset_memory_peak();
        let mut model = cfg.model.init::<Ad<I, C>>(device);
        let mut optim: Optim<I, C> = RtpOptimizer::adam(&AdamConfig::new());
        if let Some(max) = cfg.clip_grad_norm {
            optim = optim.with_clip_grad_norm(max);
        }
        if let Some(path) = &cfg.init {
            model = checkpoint::load_full_into(path, model, device)?;
        }
        if let Some(ckpt) = self.resume {
            // Another world size, strategy or shard threshold loads through resharding: each
            // rank reads only the files holding its columns.
            (model, optim) = match ckpt.check_world(device) {
                Ok(()) => ckpt.load(device, model, optim)?,
                Err(_) => ckpt.load_resharded(device, model, optim)?,
            };
        }
        if device.rank() == 0 {
            // Which parameters the shard threshold left whole, before any step runs.
            let placed = burn_rtp::placement(&model);
            let whole: Vec<&str> = placed
                .params
                .iter()
                .filter(|p| matches!(p.layout, burn_rtp::Layout::Replicated))
                .map(|p| p.path.as_str())
                .collect();
            let names = match whole.len() {
                0 => String::new(),
                n if n <= 6 => format!(": {}", whole.join(", ")),
                n => format!(": {}, and {} more", whole[..6].join(", "), n - 6),
            };
            println!("placement on rank 0: {}{names}", placed.summary());
        }
        Ok((model, optim, self.schedule.clone()))
    }

    /// The mean of the ranks' losses; every rank learns of a bad loss on any rank here,
    /// before the update.
    fn global_loss<I: RotationKernels, C: CheckpointStrategy>(
        &self,
        device: &RtpDevice<I>,
        loss: &Tensor<Ad<I, C>, 1>,
        done: usize,
    ) -> Result<f32, burn_rtp::RtpError> {
        let mut local = loss.clone().into_scalar().elem::<f32>();
        if self.cfg.inject_non_finite_loss == Some((done, device.rank())) {
            local = f32::NAN;
        }
        device.check_finite(done as u64, "loss", local)
    }

    /// Evaluation, a periodic checkpoint and rank 0's progress, as the settings ask.
    fn after_step<I: RotationKernels, C: CheckpointStrategy>(
        &self,
        device: &RtpDevice<I>,
        model: &Gpt<Ad<I, C>>,
        optim: &Optim<I, C>,
        done: usize,
        lr: f64,
        log: &mut RankLog,
    ) -> Result<(), TrainError> {
        let cfg = self.cfg;
        let end = self.steps.end;
        if cfg.eval_every > 0 && done.is_multiple_of(cfg.eval_every) && done != end {
            log.val = evaluate(&model.valid(), self.corpus, cfg, device);
        }
        if let Some(root) = &cfg.checkpoint_dir {
            if cfg.checkpoint_every > 0 && done.is_multiple_of(cfg.checkpoint_every) && done != end
            {
                log.checkpoint = Some(checkpoint::save(
                    device,
                    root,
                    done,
                    &cfg.fields(),
                    model,
                    optim,
                    cfg.keep_last,
                )?);
                log.saved_at = Some(done);
            }
        }
        if let (0, Some(p)) = (device.rank(), self.progress) {
            p.on_step(&StepEvent {
                step: done,
                total: end,
                train_loss: *log.losses.last().expect("a step was recorded"),
                lr,
                grad_norm: optim.last_grad_norm().map(|n| n.norm),
                val_loss: log.val,
                tokens_per_s: (done - self.steps.start) as f64 * (cfg.batch * cfg.model.seq) as f64
                    / log.trained_s,
                peak: device.memory_peak(),
            });
        }
        Ok(())
    }

    /// The end of a rank's run: final evaluation and checkpoint, every rank's memory, and a
    /// sample (a failed run skips them and reports its failure).
    fn finish<I: RotationKernels, C: CheckpointStrategy>(
        &self,
        device: &RtpDevice<I>,
        model: Gpt<Ad<I, C>>,
        optim: &Optim<I, C>,
        initial_val: f32,
        mut log: RankLog,
    ) -> Result<RankResult, TrainError> {
        let cfg = self.cfg;
        let mut result = RankResult {
            rank: device.rank(),
            losses: std::mem::take(&mut log.losses),
            step_ms: std::mem::take(&mut log.step_ms),
            initial_val,
            final_val: f32::NAN,
            params: model.num_params(),
            memory: Vec::new(),
            sample: String::new(),
            checkpoint: log.checkpoint.take(),
            stopped_at: log.stopped_at,
            failure: log.failure.take(),
        };
        if result.failure.is_some() {
            return Ok(result);
        }
        result.final_val = evaluate(&model.valid(), self.corpus, cfg, device);
        let last = log.stopped_at.unwrap_or(self.steps.end);
        if let Some(root) = &cfg.checkpoint_dir {
            if log.saved_at != Some(last) {
                result.checkpoint = Some(checkpoint::save(
                    device,
                    root,
                    last,
                    &cfg.fields(),
                    &model,
                    optim,
                    cfg.keep_last,
                )?);
            }
        }
        let own = RankMemory {
            ledger: PeakBytes::from(device.memory_peak()),
            rss: burn_rtp::peak_rss_bytes().unwrap_or(0),
            progress: device.progress_policy(),
            hidden: log.hidden,
        };
        result.memory = device.all_gather_json(&own);
        // A stopped run was asked to end soon: it skips the sample.
        if cfg.sample_bytes > 0 && log.stopped_at.is_none() {
            result.sample = sample(
                &model.valid(),
                device,
                "CYNIC, n.",
                cfg.sample_bytes,
                cfg.model.seq,
                cfg.seed,
            );
        }
        Ok(result)
    }
}

/// A non-finite gradient norm (the optimizer skipped the update), traced to the rank it came
/// from.
fn check_grad_norm<I: RotationKernels, C: CheckpointStrategy>(
    device: &RtpDevice<I>,
    optim: &Optim<I, C>,
    done: usize,
) -> Result<(), burn_rtp::RtpError> {
    let Some(n) = optim.last_grad_norm().filter(|n| !n.norm.is_finite()) else {
        return Ok(());
    };
    Err(device
        .check_finite(done as u64, "gradient norm", n.local_sum_of_squares)
        .err()
        .unwrap_or(burn_rtp::RtpError::NonFinite {
            rank: device.rank(),
            step: done as u64,
            what: "gradient norm".into(),
            bad_rank: 0,
            value: n.norm.to_string(),
        }))
}

/// Trains a GPT under `cfg` on the inner backend `I` and returns the outcome. A world that
/// fails (a rank's error or panic, a peer lost) is started again from the newest complete
/// checkpoint under `cfg.checkpoint_dir`, up to `cfg.max_restarts` times, to the same last
/// step; each restart is told on stderr with its cause and step.
pub fn train<I: RotationKernels>(
    cfg: &TrainConfig,
    inner_device: impl Fn(usize) -> I::Device,
    progress: Option<&dyn Progress>,
) -> Result<TrainOutcome, TrainError> {
    cfg.validate()?;
    let first_step = match &cfg.resume {
        Some(path) => checkpoint::Checkpoint::open_manifest(path)?.manifest().step as usize,
        None => 0,
    };
    let end = first_step + cfg.steps;
    let mut attempt_cfg = cfg.clone();
    let mut restarts = 0;
    loop {
        crate::restart::set_attempt(restarts);
        let error = match train_once::<I>(&attempt_cfg, &inner_device, progress) {
            Ok(mut outcome) => {
                outcome.restarts = restarts;
                return Ok(outcome);
            }
            Err(error) if restarts < cfg.max_restarts && restartable(&error) => error,
            Err(error) => return Err(error),
        };
        restarts += 1;
        let root = cfg
            .checkpoint_dir
            .as_ref()
            .expect("validated with max_restarts");
        let (resume, from) = crate::restart::resume_point(root, cfg.resume.clone(), first_step);
        eprintln!(
            "restart {restarts} of {}: {error}; resuming from step {from} ({})",
            cfg.max_restarts,
            resume
                .as_ref()
                .map_or("the run's start".into(), |p| p.display().to_string())
        );
        attempt_cfg.resume = resume;
        attempt_cfg.steps = end - from;
    }
}

/// Whether a failed attempt is worth starting again: a rank or peer failed (also while a
/// checkpoint was being written). Bad settings, data or checkpoints, and a non-finite loss,
/// would fail the same way again.
fn restartable(error: &TrainError) -> bool {
    matches!(
        error,
        TrainError::Rtp(_)
            | TrainError::Checkpoint(CheckpointError::Rtp(_))
            | TrainError::Checkpoint(CheckpointError::OtherRankFailed { .. })
    )
}

/// One attempt of [`train`]: one world, from `cfg.resume` (or the start) to the last step.
fn train_once<I: RotationKernels>(
    cfg: &TrainConfig,
    inner_device: &impl Fn(usize) -> I::Device,
    progress: Option<&dyn Progress>,
) -> Result<TrainOutcome, TrainError> {
    let world = cfg.ranks;
    let corpus = Corpus::load(cfg.data.as_deref(), cfg.model.seq)?;
    let mut rtp = RtpConfig::new(world)
        .with_strategy(cfg.strategy)
        .with_rotation(cfg.rotation)
        .with_shard_threshold(cfg.threshold());
    let resume = match &cfg.resume {
        Some(path) => {
            let rank0 = burn_rtp::transport::mpi_launch().is_none_or(|job| job.rank == 0);
            Some(checkpoint::open_for(path, &rtp, &cfg.fields(), rank0)?)
        }
        None => None,
    };
    let start = resume.as_ref().map_or(0, |c| c.manifest().step as usize);
    let end = start + cfg.steps;
    // Built once here to refuse a bad schedule before any rank starts; each rank clones it.
    let mut schedule = Schedule::new(cfg.lr, cfg.warmup_steps, end, cfg.lr_schedule)
        .map_err(TrainError::Config)?;
    schedule.advance(start);
    let resumed_from = resume.as_ref().map(|c| c.dir().to_path_buf());
    let per = cfg.batch / world;
    rtp.transport = cfg.transport;
    let transport = rtp.transport_kind();
    if let Some(timeout) = cfg.peer_timeout {
        rtp = rtp.with_peer_timeout(timeout);
    }
    rtp = rtp
        .with_mpi_progress(cfg.mpi_progress)
        .with_one_malloc_arena(cfg.one_malloc_arena);
    if let Some(threads) = cfg.threads_per_rank {
        rtp = rtp.with_threads_per_rank(threads);
    }
    let threads_per_rank = rtp.threads_per_rank_here();
    let backend = I::name(&inner_device(0));
    let job = RankJob {
        cfg,
        corpus: &corpus,
        resume: resume.as_ref(),
        schedule: &schedule,
        steps: start..end,
        per,
        progress,
    };
    let results = burn_rtp::try_launch_on::<I, _, TrainError, _>(rtp, inner_device, |device| {
        match cfg.activation_checkpointing {
            ActivationCheckpointing::None => job.run::<I, NoCheckpointing>(device),
            ActivationCheckpointing::Balanced => job.run::<I, BalancedCheckpointing>(device),
        }
    })?;
    let first = &results[0];
    if let Some((error, last_good)) = &first.failure {
        return Err(TrainError::NonFinite {
            error: Box::new(error.clone()),
            last_good: *last_good,
            checkpoint: first.checkpoint.clone().or(resumed_from),
        });
    }
    let step_ms = median(&first.step_ms);
    let tokens = (cfg.batch * cfg.model.seq) as f64;
    let report = Report {
        strategy: cfg.strategy.to_string(),
        ranks: world,
        steps: first.losses.len(),
        params: first.params,
        tokens_per_s: if step_ms > 0.0 {
            tokens / (step_ms / 1e3)
        } else {
            0.0
        },
        step_time_ms_median: step_ms,
        final_train_loss: first.losses.last().copied().unwrap_or(f32::NAN) as f64,
        final_val_loss: first.final_val as f64,
        losses: first.losses.iter().map(|&l| l as f64).collect(),
        peak_bytes_per_rank: first.memory.iter().map(|m| m.ledger).collect(),
        peak_rss_bytes_per_rank: first.memory.iter().map(|m| m.rss).collect(),
        transport: transport.to_string(),
        mpi_progress_per_rank: first
            .memory
            .iter()
            .filter_map(|m| m.progress.clone())
            .collect(),
        ideal_model_state_bytes_per_rank: (first.params * 4 * 4 / world) as u64,
        kernels: I::kernel_path().to_string(),
        backend,
        threads_per_rank,
        activation_checkpointing: cfg.activation_checkpointing.to_string(),
        hidden_transfer_fraction_per_rank: first.memory.iter().map(|m| m.hidden).collect(),
    };
    Ok(TrainOutcome {
        rank: first.rank,
        report,
        initial_val_loss: first.initial_val as f64,
        sample: first.sample.clone(),
        checkpoint: first.checkpoint.clone(),
        stopped_at: first.stopped_at,
        restarts: 0,
    })
}
