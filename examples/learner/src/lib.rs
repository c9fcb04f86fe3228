//! The GPT trained by burn-train's `Learner`, one Learner per rank.
//!
//! Each rank runs an ordinary Burn `Learner` (`SupervisedTraining::launch`) on its own device
//! (`ExecutionStrategy::SingleDevice`), on the rank's own thread, with [`RtpOptimizer`] as its
//! optimizer: Burn's training loop, metrics, validation and progress, unchanged.
//!
//! * **Data.** The dataset is the list of step indices. A batch of one index becomes this
//!   rank's slice of that step's global batch, cut exactly as the hand-written loop
//!   ([`burn_rtp_gpt::train`]) cuts it, so both train on the same data in the same order and give
//!   the same losses.
//! * **Global loss.** The train and validation steps put the mean of the ranks' losses into
//!   their output (one scalar all-reduce, on the rank's thread), so the metrics report the
//!   global loss, not rank 0's.
//! * **Display.** Rank 0 gets a renderer that prints; the other ranks a silent one.
//! * **Checkpoints.** The Learner's own checkpointer writes them, through
//!   [`RankRecorder`]: after each epoch every rank writes only its shards of the model and the
//!   optimizer into the epoch's step folder under `<dir>/checkpoint`, and rank 0 writes the
//!   manifest once all are there (the format of [`burn_rtp::checkpoint`], so it can be opened,
//!   resharded and consolidated like any other). `resume_epoch` resumes through the Learner
//!   (`SupervisedTraining::checkpoint`), and the batcher continues from that epoch's first step,
//!   so training continues bit for bit.
#![warn(missing_docs)]

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn::train::checkpoint::KeepLastNCheckpoints;
use burn::train::metric::{LossMetric, MetricDefinition, MetricEntry};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use burn::train::{ExecutionStrategy, Learner, SupervisedTraining};
use burn_rtp::checkpoint::RankRecorder;
use burn_rtp::{RotationKernels, Rtp, RtpConfig, RtpDevice, RtpOptimizer};
use burn_rtp_gpt::data::{Corpus, Windows};
use burn_rtp_gpt::learner_steps::{GptBatch, LearnerBackend};
use burn_rtp_gpt::model::{Gpt, GptConfig};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The CPU inner backend every rank of a Learner run computes on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InnerBackend {
    /// burn-ndarray, with burn-rtp-kernels' native GEMM steps.
    #[default]
    Ndarray,
    /// Flex, Burn 0.21's pure-Rust CPU backend.
    Flex,
}

/// Builds this rank's slice of a step's global batch (training) or of a validation batch.
#[derive(Clone)]
struct SliceBatcher<I> {
    corpus: Arc<Corpus>,
    seed: u64,
    batch: usize,
    seq: usize,
    /// Validation batches in all (training batches take none).
    val_batches: Option<usize>,
    /// The next training step: the loader repeats its items every epoch, so the step a
    /// training batch belongs to is counted here (batches are built in order, on the rank's
    /// thread).
    next_step: Arc<AtomicUsize>,
    /// The inner backend, whose rank devices the batches are built on.
    inner: PhantomData<fn() -> I>,
}

impl<I, B> Batcher<B, usize, GptBatch<B>> for SliceBatcher<I>
where
    I: RotationKernels,
    B: Backend<Device = RtpDevice<I>>,
{
    fn batch(&self, items: Vec<usize>, device: &RtpDevice<I>) -> GptBatch<B> {
        let [index] = items[..] else {
            panic!("rank {}: one step per batch, got {items:?}", device.rank());
        };
        let per = self.batch / device.world_size();
        let rows = device.rank() * per..(device.rank() + 1) * per;
        let windows = match self.val_batches {
            None => {
                let step = self.next_step.fetch_add(1, Ordering::Relaxed);
                Windows::train(&self.corpus, self.seed, step, rows, self.seq)
            }
            Some(n) => {
                let first = index * self.batch + rows.start;
                Windows::val(&self.corpus, first..first + per, self.batch * n, self.seq)
            }
        };
        let (tokens, targets) = windows.tensors::<B>(device);
        GptBatch { tokens, targets }
    }
}

/// A Learner run.
#[derive(Debug, Clone)]
pub struct LearnerConfig {
    /// Model shape.
    pub model: GptConfig,
    /// Ranks.
    pub ranks: usize,
    /// Global batch (sequences per step, over all ranks).
    pub batch: usize,
    /// Epochs.
    pub epochs: usize,
    /// Steps per epoch.
    pub steps_per_epoch: usize,
    /// Validation batches after each epoch.
    pub val_batches: usize,
    /// Learning rate (constant).
    pub lr: f64,
    /// Seed of the weights and the data order.
    pub seed: u64,
    /// Parameters below this many elements are replicated (`None`: the library's default).
    pub shard_threshold: Option<usize>,
    /// Where burn-train writes its logs (one folder per rank) and the checkpoints
    /// (`<dir>/checkpoint`, shared by the ranks).
    pub dir: PathBuf,
    /// Write a sharded checkpoint after every epoch (keeping the newest two).
    pub checkpoints: bool,
    /// Resume from the checkpoint of this epoch (written by an earlier run with the same
    /// settings and `dir`); training continues with the next epoch.
    pub resume_epoch: Option<usize>,
    /// Whether rank 0 prints its progress.
    pub verbose: bool,
    /// The inner backend of every rank.
    pub backend: InnerBackend,
}

/// What the Learners did: per-step and per-epoch global losses, as the metrics saw them.
#[derive(Debug, Clone, Default)]
pub struct LearnerOutcome {
    /// Global training loss of every step, in order.
    pub train_losses: Vec<f64>,
    /// Global validation loss after each epoch (as the renderer gathers them: one value per
    /// validation batch, until the run ends).
    pub val_losses: Vec<f64>,
}

/// Why a Learner run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// The corpus could not be loaded.
    #[error("corpus: {0}")]
    Corpus(String),
    /// The checkpoint to resume from is missing, corrupt or of another world.
    #[error("resume from epoch {epoch}: {source}")]
    Resume {
        /// The epoch asked for.
        epoch: usize,
        /// Why it cannot be used.
        source: burn_rtp::checkpoint::CheckpointError,
    },
    /// A rank failed.
    #[error(transparent)]
    Rtp(#[from] burn_rtp::RtpError),
}

/// Trains under `cfg` with one Learner per rank and returns rank 0's record of the losses.
pub fn train_with_learner(cfg: &LearnerConfig) -> Result<LearnerOutcome, LearnerError> {
    match cfg.backend {
        InnerBackend::Ndarray => train_on::<burn::backend::NdArray>(cfg),
        InnerBackend::Flex => train_on::<burn::backend::Flex>(cfg),
    }
}

/// [`train_with_learner`] on the inner backend `I`.
fn train_on<I: RotationKernels>(cfg: &LearnerConfig) -> Result<LearnerOutcome, LearnerError> {
    let corpus = Arc::new(
        Corpus::load(None, cfg.model.seq).map_err(|e| LearnerError::Corpus(e.to_string()))?,
    );
    let world = RtpConfig::new(cfg.ranks).with_shard_threshold(
        cfg.shard_threshold
            .unwrap_or(burn_rtp::DEFAULT_SHARD_THRESHOLD),
    );
    if let Some(epoch) = cfg.resume_epoch {
        // Refused here, before any rank starts, rather than as a panic inside the Learner.
        let step = (epoch * cfg.steps_per_epoch) as u64;
        let dir = burn_rtp::checkpoint::step_dir(&checkpoint_root(&cfg.dir), step);
        burn_rtp::checkpoint::Checkpoint::open(&dir)
            .and_then(|c| c.check_config(&world))
            .map_err(|source| LearnerError::Resume { epoch, source })?;
    }
    let first_step = cfg.resume_epoch.unwrap_or(0) * cfg.steps_per_epoch;
    let outcomes = burn_rtp::launch(world, |device: RtpDevice<I>| {
        LearnerBackend::<I>::seed(&device, cfg.seed);
        let batcher = |val_batches| SliceBatcher {
            corpus: corpus.clone(),
            seed: cfg.seed,
            batch: cfg.batch,
            seq: cfg.model.seq,
            val_batches,
            next_step: Arc::new(AtomicUsize::new(first_step)),
            inner: PhantomData,
        };
        // Each epoch walks `steps_per_epoch` items; the batcher numbers the steps.
        let train = DataLoaderBuilder::<LearnerBackend<I>, _, _>::new(batcher(None))
            .batch_size(1)
            .set_device(device.clone())
            .build(InMemDataset::new(
                (0..cfg.steps_per_epoch).collect::<Vec<usize>>(),
            ));
        let valid = DataLoaderBuilder::<Rtp<I>, _, _>::new(batcher(Some(cfg.val_batches)))
            .batch_size(1)
            .set_device(device.clone())
            .build(InMemDataset::new(
                (0..cfg.val_batches).collect::<Vec<usize>>(),
            ));
        let record = Record::default();
        let renderer = LossRenderer {
            record: record.clone(),
            names: HashMap::new(),
            print: cfg.verbose && device.rank() == 0,
            steps_per_epoch: cfg.steps_per_epoch,
            first_step,
        };
        let mut training = SupervisedTraining::new(
            cfg.dir.join(format!("rank-{}", device.rank())),
            train,
            valid,
        )
        .with_training_strategy(ExecutionStrategy::SingleDevice(device.clone()).into())
        .metric_train_numeric(LossMetric::<I>::new())
        .metric_valid_numeric(LossMetric::<I>::new())
        .num_epochs(cfg.epochs)
        .with_application_logger(None)
        .renderer(renderer);
        if cfg.checkpoints || cfg.resume_epoch.is_some() {
            // Every rank saves the same epochs: the strategy decides from the epoch alone.
            training = training
                .with_file_checkpointer(
                    RankRecorder::new(device.clone(), checkpoint_root(&cfg.dir))
                        .with_steps_per_epoch(cfg.steps_per_epoch)
                        .with_keep_last(2),
                )
                .with_checkpointing_strategy(KeepLastNCheckpoints::new(2));
        }
        if let Some(epoch) = cfg.resume_epoch {
            training = training.checkpoint(epoch);
        }
        let model = cfg.model.init::<LearnerBackend<I>>(&device);
        let optim = RtpOptimizer::<
            burn::optim::adaptor::OptimizerAdaptor<
                burn_rtp::FusedAdam,
                Gpt<LearnerBackend<I>>,
                LearnerBackend<I>,
            >,
        >::adam(&AdamConfig::new());
        let _result = training.launch(Learner::new(model, optim, cfg.lr));
        let seen = record.lock().unwrap();
        // The renderer sees one value per validation batch; an epoch's loss is their mean
        // (every batch has the same size).
        LearnerOutcome {
            train_losses: seen.train_losses.clone(),
            val_losses: seen
                .val_losses
                .chunks(cfg.val_batches.max(1))
                .map(|batches| batches.iter().sum::<f64>() / batches.len() as f64)
                .collect(),
        }
    })?;
    Ok(outcomes.into_iter().next().unwrap_or_default())
}

/// Where a Learner run under `dir` writes its sharded checkpoints.
pub fn checkpoint_root(dir: &std::path::Path) -> PathBuf {
    dir.join("checkpoint")
}

/// The losses the renderer saw.
type Record = Arc<Mutex<LearnerOutcome>>;

/// The renderer of every rank: it records the loss metric's values, and on rank 0 prints them.
struct LossRenderer {
    record: Record,
    names: HashMap<String, String>,
    print: bool,
    steps_per_epoch: usize,
    /// Steps trained before this run (a resumed run continues their numbering).
    first_step: usize,
}

impl LossRenderer {
    /// The value of `state` if it is the loss metric.
    fn loss(&self, state: &MetricState) -> Option<f64> {
        let MetricState::Numeric(entry, value) = state else {
            return None;
        };
        let name = self.names.get(&id_of(entry))?;
        (name == "Loss").then(|| value.current())
    }
}

fn id_of(entry: &MetricEntry) -> String {
    format!("{:?}", entry.metric_id)
}

impl MetricsRendererTraining for LossRenderer {
    fn update_train(&mut self, state: MetricState) {
        if let Some(loss) = self.loss(&state) {
            let mut record = self.record.lock().unwrap();
            record.train_losses.push(loss);
            let step = self.first_step + record.train_losses.len();
            if self.print {
                let epoch = (step - 1) / self.steps_per_epoch.max(1) + 1;
                println!("epoch {epoch} step {step:4}: loss {loss:.4} (mean over ranks)");
            }
        }
    }

    fn update_valid(&mut self, state: MetricState) {
        if let Some(loss) = self.loss(&state) {
            let mut record = self.record.lock().unwrap();
            record.val_losses.push(loss);
        }
    }

    fn render_train(&mut self, _item: TrainingProgress, _progress: Vec<ProgressType>) {}

    fn render_valid(&mut self, _item: TrainingProgress, _progress: Vec<ProgressType>) {}

    fn on_train_end(
        &mut self,
        _summary: Option<burn::train::LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl MetricsRendererEvaluation for LossRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}

    fn render_test(&mut self, _item: EvaluationProgress, _progress: Vec<ProgressType>) {}
}

impl MetricsRenderer for LossRenderer {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names
            .insert(format!("{:?}", definition.metric_id), definition.name);
    }
}
