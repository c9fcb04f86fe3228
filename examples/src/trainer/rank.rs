//! One rank's run: the training loop with its checkpoints, stop requests and non-finite
//! checks, and what it hands back for the report.

use super::eval::{evaluate, sample};
use super::{Ad, Progress, StepEvent, TrainConfig, TrainError};
use crate::checkpoint;
use crate::data::{Corpus, Windows};
use crate::model::Gpt;
use crate::report::PeakBytes;
use crate::schedule::Schedule;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use burn_rtp::RotationKernels;
use burn_rtp::{RtpDevice, RtpOptimizer};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Instant;

pub(super) struct RankResult {
    pub(super) rank: usize,
    pub(super) losses: Vec<f32>,
    pub(super) step_ms: Vec<f64>,
    pub(super) initial_val: f32,
    pub(super) final_val: f32,
    pub(super) params: usize,
    /// Every rank's memory, gathered on every rank (each process knows only its own).
    pub(super) memory: Vec<RankMemory>,
    pub(super) sample: String,
    pub(super) checkpoint: Option<PathBuf>,
    pub(super) stopped_at: Option<usize>,
    /// The agreed non-finite error, with the last good step.
    pub(super) failure: Option<(burn_rtp::RtpError, usize)>,
}

/// One rank's peaks: the ledger's and the operating system's.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct RankMemory {
    pub(super) ledger: PeakBytes,
    pub(super) rss: u64,
    /// The transport's pacing (MPI only).
    pub(super) progress: Option<String>,
    /// Share of the recorded transfer time hidden behind compute.
    pub(super) hidden: Option<f64>,
}

pub(super) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The optimizer every rank runs: Burn's Adam, each parameter's step in one pass
/// ([`burn_rtp::FusedAdam`], whose records are Burn's Adam's), behind [`RtpOptimizer`].
pub(super) type Optim<I, C> = RtpOptimizer<
    burn::optim::adaptor::OptimizerAdaptor<burn_rtp::FusedAdam, Gpt<Ad<I, C>>, Ad<I, C>>,
>;

/// What a rank trains from: the model, its optimizer and the learning-rate schedule.
pub(super) type Start<I, C> = (Gpt<Ad<I, C>>, Optim<I, C>, Schedule);

/// What every rank of one run shares: the settings, the data and where training starts.
pub(super) struct RankJob<'a> {
    pub(super) cfg: &'a TrainConfig,
    pub(super) corpus: &'a Corpus,
    pub(super) resume: Option<&'a burn_rtp::checkpoint::Checkpoint>,
    pub(super) schedule: &'a Schedule,
    /// The steps of this run (a resumed run starts at the checkpoint's step).
    pub(super) steps: std::ops::Range<usize>,
    /// Sequences per rank and step.
    pub(super) per: usize,
    pub(super) progress: Option<&'a dyn Progress>,
}

/// What a rank has recorded so far.
#[derive(Default)]
pub(super) struct RankLog {
    pub(super) losses: Vec<f32>,
    pub(super) step_ms: Vec<f64>,
    pub(super) trained_s: f64,
    pub(super) val: f32,
    pub(super) checkpoint: Option<PathBuf>,
    pub(super) saved_at: Option<usize>,
    pub(super) stopped_at: Option<usize>,
    pub(super) failure: Option<(burn_rtp::RtpError, usize)>,
    /// Share of the transfer time of the last steps that fell during compute.
    pub(super) hidden: Option<f64>,
}

/// How many of a run's last steps the timeline records for the report's hidden share.
pub(super) const TIMELINE_STEPS: usize = 20;

impl RankJob<'_> {
    /// One rank's whole run: set up, train step by step, then evaluate, save and report.
    pub(super) fn run<I: RotationKernels, C: CheckpointStrategy>(
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
pub(super) fn check_grad_norm<I: RotationKernels, C: CheckpointStrategy>(
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
