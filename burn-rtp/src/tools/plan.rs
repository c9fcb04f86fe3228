//! The memory planner: each rank's peak bytes under DDP, FSDP and RTP at any world size,
//! predicted before training from the parameter shapes, the placement policy and a probe
//! that runs a few training steps on one rank.
//!
//! # The model, and what it assumes
//! For strategy `s` at `N` ranks with `b` samples per rank, rank 0 (which holds the largest
//! shards, since the first ranks take the remainder of an uneven split) holds at its peak:
//!
//! * **Model state**, exact: every parameter as the placement policy places it (a shard of
//!   the last dimension, or the whole tensor when it is replicated), once as the parameter,
//!   once as its gradient and `optimizer_copies` times as optimizer state (Adam: 2).
//! * **Activations and temporaries** (the ledger's `local`): measured by the probe at N = 1,
//!   at two per-rank batches (best the planned one and half of it, see
//!   [`PlanConfig::with_batch`]), and extended along the line through them. This assumes that
//!   they grow linearly with the per-rank batch and do not depend on N: true of activations,
//!   which each rank holds for its own samples whole; the weight-sized temporaries among
//!   them (a replicated parameter's gradient, a gathered copy) are counted at their N = 1
//!   size, which over-states them for sharded strategies.
//! * **In-flight buffers**, from the shapes: RTP holds a received bundle (a weight shard and
//!   its bias shard) and the next one being received, and in the backward pass the
//!   travelling gradient of each, so 4 bundles of the largest layer (3 at N = 2, where the
//!   first is the rank's own). A layer whose input autodiff recomputes (activation
//!   checkpointing) runs its backward as two passes, the bundles rotating for dX and then the
//!   gradients travelling for dW, and holds 2 at a time; the probe records which layers did.
//!   FSDP holds a layer's gathered weight and bias while it computes, and in the backward
//!   pass while the next parts arrive, `(2 - 1/N)` full bundles, plus the next weight
//!   gathered ahead in a model of three weights or more. DDP with buckets starts the step
//!   with every bucketed gradient's sum beside the gradient, and `1/N` of the last bucket in
//!   flight; without buckets it all-reduces one gradient at a time in chunks of `1/N`, one
//!   chunk in flight, into a full-size sum.
//! * **The peak of the sum**, phase by phase. The probe records what the highest peak of
//!   the forward and backward passes, and of the optimizer's update, were made of at N = 1
//!   ([`RtpOptimizer`](crate::RtpOptimizer) marks the phases): model state in parameter
//!   sets (3.0 for parameters and Adam's moments, more while gradients or update
//!   temporaries are alive) and local bytes. At N, the state part scales with the rank's
//!   parameter bytes, the local part with the batch, and the in-flight buffers are added in
//!   full; the predicted peak is the larger phase.
//!
//! # How close it comes, measured
//! The prediction can fall on either side of the peak, so plan with a margin. The scaling
//! report (`benches/report/report.md`, "Memory planner") sets it beside the ledger's peak of
//! a two-step run at 48 points (12 configurations of the bench's GPT, d_model 64 to 768 and
//! 1 to 6 layers, at N = 2, 3, 4 or 8, under DDP, FSDP and RTP in both rotation modes, 4
//! sequences per rank): model state was predicted exactly at all 48, and the peak from 4.8%
//! under to 4.6% over, under at 36 of the 48. That is the claim the measurements support:
//! within about 5% of the ledger's peak, either side, on that grid; a model, batch or world
//! outside it can fall further. With balanced activation checkpointing (the report's
//! activation section, the same grid) the peak fell from 8.2% under to 4.7% over.
//!
//! The prediction is of bytes alive; allocator overhead (the resident set) is not modelled.
//! The operating system's figure for a process (its peak resident set) adds the program's
//! own pages, the transport library's buffers and whatever freed memory the allocator keeps:
//! glibc's default raises its mmap threshold after each freed mapping and then keeps freed
//! tensors resident in its heap, which a plan made from shapes cannot know;
//! `MALLOC_MMAP_THRESHOLD_=131072` fixes the threshold so that freed tensors leave the
//! resident set. The MPI scaling report (`benches/report/mpi/report.md`, "Memory planner
//! against the resident set") measures both at 9 points (N = 2 to 4): the prediction fell
//! short of the growth of the peak resident set at every one, by 4.3% to 14.6% of it with
//! the threshold fixed and by 13.8% to 25.4% with glibc's default. To budget a process's
//! memory rather than the ledger's, add that much.
//!
//! # Activation checkpointing
//! [`Planner::with_checkpointed_probe`] probes the same model trained on
//! `Autodiff<Rtp<I>, BalancedCheckpointing>`, whose backward pass recomputes memory-bound
//! ops: its local bytes come from that probe, by the same rules. [`Planner::predict_with`]
//! plans either setting, [`Planner::table`] lists both, and [`Planner::recommend`] turns
//! checkpointing on only where it is what makes a budget fit at the smallest world (it costs
//! recomputation, and under RTP an extra pass for each Linear whose input is recomputed).
//!
//! Gradient accumulation, mixed precision and optimizers whose state is not a whole number
//! of parameter copies are outside the model.

use crate::backend::device::RtpDevice;
use crate::config::{
    ActivationCheckpointing, RotationMode, RtpConfig, Strategy, DEFAULT_SHARD_THRESHOLD,
};
use crate::state::accounting::{human_bytes, MemoryStats};
use crate::state::sharding::{placement, ShardSpec};
use crate::RtpResult;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, Tensor};
use thiserror::Error;

/// Settings of a plan.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// Parameters with fewer elements are replicated (as [`RtpConfig::with_shard_threshold`]).
    pub shard_threshold: usize,
    /// Copies of each parameter the optimizer keeps (Adam, AdamW: 2; SGD with momentum: 1).
    pub optimizer_copies: usize,
    /// The two per-rank batches the probe runs at.
    pub probe_batches: (usize, usize),
    /// DDP's gradient bucket size (as [`RtpConfig::with_ddp_bucket_bytes`]; 0: no buckets).
    pub ddp_bucket_bytes: usize,
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            shard_threshold: DEFAULT_SHARD_THRESHOLD,
            optimizer_copies: 2,
            probe_batches: (1, 2),
            ddp_bucket_bytes: crate::config::DEFAULT_DDP_BUCKET_BYTES,
        }
    }
}

impl PlanConfig {
    /// Sets the shard threshold the planned runs will use.
    pub fn with_shard_threshold(mut self, elements: usize) -> Self {
        self.shard_threshold = elements;
        self
    }

    /// Sets DDP's gradient bucket size the planned runs will use.
    pub fn with_ddp_bucket_bytes(mut self, bytes: usize) -> Self {
        self.ddp_bucket_bytes = bytes;
        self
    }

    /// Sets the optimizer's copies of each parameter.
    pub fn with_optimizer_copies(mut self, copies: usize) -> Self {
        self.optimizer_copies = copies;
        self
    }

    /// Probes at the per-rank batch `batch` that the plan is for, and at half of it: the
    /// make-up of a step's local peak changes with the batch (at a batch of one or two it is
    /// the gradients at the end of the backward pass, at larger ones the activations at its
    /// start), so the line through two tiny batches would miss the activations' growth.
    pub fn with_batch(self, batch: usize) -> Self {
        self.with_probe_batches((batch / 2).max(1), batch.max(2))
    }

    /// Sets the two per-rank batches of the probe (two different values).
    pub fn with_probe_batches(mut self, small: usize, large: usize) -> Self {
        self.probe_batches = (small, large);
        self
    }
}

/// `fixed + per_sample · batch`, through two measured points.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PerSample {
    /// Bytes at a batch of zero.
    pub fixed: f64,
    /// Bytes per sample.
    pub per_sample: f64,
}

impl PerSample {
    fn through((b1, y1): (usize, u64), (b2, y2): (usize, u64)) -> Self {
        let per_sample = if b2 == b1 {
            0.0
        } else {
            (y2 as f64 - y1 as f64) / (b2 as f64 - b1 as f64)
        };
        Self {
            fixed: y1 as f64 - per_sample * b1 as f64,
            per_sample,
        }
    }
}

/// What the probe measured for one strategy at N = 1.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Probe {
    /// The ledger's local peak (activations and temporaries).
    pub local_peak: PerSample,
    /// The peak of the forward and backward passes.
    pub compute: PhaseMakeUp,
    /// The peak of the optimizer's update.
    pub update: PhaseMakeUp,
}

/// What the peak of one phase was made of at N = 1.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PhaseMakeUp {
    /// Model-state bytes then alive, in parameter sets (3.0: parameters and Adam's two
    /// moments; more while gradients or update temporaries are alive).
    pub state: f64,
    /// Local bytes then alive.
    pub local: PerSample,
}

/// In-flight bytes at the moments of a step that can make its peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Buffers {
    /// During the forward pass.
    pub forward: u64,
    /// During the backward pass.
    pub backward: u64,
    /// During the update.
    pub update: u64,
}

/// One prediction: rank 0's peak bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    /// The strategy.
    pub strategy: Strategy,
    /// The rotation mode (RTP only).
    pub rotation: RotationMode,
    /// Whether activations are recomputed in the backward pass.
    pub activation_checkpointing: ActivationCheckpointing,
    /// Ranks.
    pub world: usize,
    /// Samples per rank.
    pub batch: usize,
    /// Parameters, gradients and optimizer state: exact.
    pub model_state: u64,
    /// Peak activations and temporaries.
    pub activations: u64,
    /// Peak rotation or gather buffers.
    pub in_flight: u64,
    /// Peak of the sum.
    pub total: u64,
}

impl Prediction {
    /// `rtp (out-of-place)`, `fsdp`, `ddp`, with `, balanced checkpointing` when it is on.
    pub fn label(&self) -> String {
        let strategy = match self.strategy {
            Strategy::Rtp => format!("rtp ({})", self.rotation),
            s => s.to_string(),
        };
        match self.activation_checkpointing {
            ActivationCheckpointing::None => strategy,
            ac => format!("{strategy}, {ac} checkpointing"),
        }
    }
}

/// Why no plan fits.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum PlanError {
    /// Nothing fits the budget up to the largest world allowed.
    #[error("nothing fits in {} per rank up to {max_world} ranks: the smallest peak, {} with {} on {max_world} ranks, is {} over the budget", human_bytes(*budget), human_bytes(best.total), best.label(), human_bytes(best.total - budget))]
    NothingFits {
        /// The per-rank budget in bytes.
        budget: u64,
        /// The largest world tried.
        max_world: usize,
        /// The smallest prediction at `max_world`.
        best: Prediction,
    },
    /// The settings cannot be planned.
    #[error("invalid plan settings: {0}")]
    Config(String),
    /// A probe's steps failed.
    #[error("the probe failed: {0}")]
    Probe(#[from] crate::RtpError),
}

/// Predicts peak memory per rank; built by [`Planner::probe`].
#[derive(Debug, Clone)]
pub struct Planner {
    shapes: Vec<Shape>,
    elem: usize,
    config: PlanConfig,
    probes: Probes,
    /// The weights whose backward the probe saw run as two passes (see [`Self::buffers`]).
    split: Vec<Shape>,
    /// The probes under balanced activation checkpointing, once taken, and their split
    /// weights.
    checkpointed: Option<(Probes, Vec<Shape>)>,
}

/// What the probe measured, per strategy.
type Probes = [(Strategy, Probe); 3];

/// The strategies and rotation modes a plan covers, in the order [`Planner::recommend`]
/// prefers them at equal world size: DDP moves no weights, RTP hides its transfers behind
/// compute, FSDP waits for its gathers.
pub const PLANNED: [(Strategy, RotationMode); 4] = [
    (Strategy::Ddp, RotationMode::OutOfPlace),
    (Strategy::Rtp, RotationMode::OutOfPlace),
    (Strategy::Rtp, RotationMode::InPlace),
    (Strategy::Fsdp, RotationMode::OutOfPlace),
];

/// One probe run's figures.
struct Measured {
    batch: usize,
    peak: MemoryStats,
    compute: MemoryStats,
    update: MemoryStats,
}

struct Shapes {
    shapes: Vec<Shape>,
    elem: usize,
}

impl<B: Backend> ModuleVisitor<B> for Shapes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val();
        self.elem = t.dtype().size();
        self.shapes.push(t.shape());
    }
}

impl Planner {
    /// Measures what the plan needs: `step(device, batch)` builds the model on `device`,
    /// trains it for a few steps (two, so that the optimizer state exists during one) at
    /// `batch` samples, and returns it. It runs on one in-process rank, once per strategy
    /// and per probe batch, never at a larger world.
    ///
    /// ```
    /// use burn::backend::{Autodiff, NdArray};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    /// use burn::tensor::Tensor;
    /// use burn_rtp::{PlanConfig, Planner, Rtp, RtpOptimizer, Strategy};
    ///
    /// type B = Autodiff<Rtp<NdArray>>;
    /// let config = PlanConfig::default().with_shard_threshold(0).with_batch(8);
    /// let planner = Planner::probe::<NdArray, B, _, _>(config, |device, batch| {
    ///     let mut model: Linear<B> = LinearConfig::new(64, 64).init(device);
    ///     let mut optim = RtpOptimizer::new(AdamConfig::new().init::<B, Linear<B>>());
    ///     for _ in 0..2 {
    ///         let x = Tensor::<B, 2>::ones([batch, 64], device);
    ///         let loss = model.forward(x).powi_scalar(2).mean();
    ///         let grads = GradientsParams::from_grads(loss.backward(), &model);
    ///         model = optim.step(1e-3, model, grads);
    ///     }
    ///     model
    /// })?;
    /// // Exact: 16 of the 64 columns of the weight and the bias per rank at N = 4, held as
    /// // parameter, gradient and Adam's two moments, in f32.
    /// assert_eq!(planner.model_state(Strategy::Rtp, 4), (64 * 16 + 16) * 4 * 4);
    /// let fit = planner.recommend(1 << 30, 8, 8)?;
    /// assert_eq!((fit.world, fit.strategy), (1, Strategy::Ddp));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn probe<I, B, M, F>(config: PlanConfig, step: F) -> RtpResult<Self>
    where
        I: Backend,
        B: Backend<Device = RtpDevice<I>>,
        M: Module<B>,
        F: Fn(&RtpDevice<I>, usize) -> M + Send + Sync,
    {
        let (shapes, elem, probes, split) = measure::<I, B, M, F>(&config, step)?;
        Ok(Self {
            shapes,
            elem,
            config,
            probes,
            split,
            checkpointed: None,
        })
    }

    /// Adds the probes of the same model trained with balanced activation checkpointing:
    /// `step` is [`Planner::probe`]'s step on `Autodiff<Rtp<I>, BalancedCheckpointing>`. It
    /// must build the same parameters.
    ///
    /// ```
    /// use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    /// use burn::backend::{Autodiff, NdArray};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    /// use burn::tensor::backend::AutodiffBackend;
    /// use burn::tensor::Tensor;
    /// use burn_rtp::{ActivationCheckpointing, PlanConfig, Planner, Rtp, RtpDevice, RtpOptimizer};
    /// use burn_rtp::{RotationMode, Strategy};
    ///
    /// // Four blocks of two Linears with a GELU between them, whose output checkpointing
    /// // recomputes in the backward pass instead of keeping it.
    /// fn step<B>(device: &B::Device, batch: usize) -> Vec<Linear<B>>
    /// where
    ///     B: AutodiffBackend<Device = RtpDevice<NdArray>, InnerBackend = Rtp<NdArray>>,
    /// {
    ///     let mut model: Vec<Linear<B>> = (0..8)
    ///         .map(|i| match i % 2 {
    ///             0 => LinearConfig::new(64, 256).init(device),
    ///             _ => LinearConfig::new(256, 64).init(device),
    ///         })
    ///         .collect();
    ///     let mut optim = RtpOptimizer::new(AdamConfig::new().init::<B, Vec<Linear<B>>>());
    ///     for _ in 0..2 {
    ///         let mut h = Tensor::<B, 2>::ones([batch, 64], device);
    ///         for pair in model.chunks(2) {
    ///             h = pair[1].forward(burn::tensor::activation::gelu(pair[0].forward(h)));
    ///         }
    ///         let loss = h.powi_scalar(2).mean();
    ///         let grads = GradientsParams::from_grads(loss.backward(), &model);
    ///         model = optim.step(1e-3, model, grads);
    ///     }
    ///     model
    /// }
    /// type Plain = Autodiff<Rtp<NdArray>>;
    /// type Balanced = Autodiff<Rtp<NdArray>, BalancedCheckpointing>;
    /// let config = PlanConfig::default().with_shard_threshold(0).with_batch(256);
    /// let planner = Planner::probe::<NdArray, Plain, _, _>(config, step::<Plain>)?
    ///     .with_checkpointed_probe::<NdArray, Balanced, _, _>(step::<Balanced>)?;
    /// let (rtp, oop) = (Strategy::Rtp, RotationMode::OutOfPlace);
    /// let plain = planner.predict_with(ActivationCheckpointing::None, rtp, oop, 4, 256);
    /// let balanced = planner.predict_with(ActivationCheckpointing::Balanced, rtp, oop, 4, 256);
    /// // The GELU's output is recomputed instead of kept: less activation memory.
    /// assert!(balanced.activations < plain.activations);
    /// assert_eq!(balanced.model_state, plain.model_state);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_checkpointed_probe<I, B, M, F>(mut self, step: F) -> Result<Self, PlanError>
    where
        I: Backend,
        B: Backend<Device = RtpDevice<I>>,
        M: Module<B>,
        F: Fn(&RtpDevice<I>, usize) -> M + Send + Sync,
    {
        let (shapes, _, probes, split) = measure::<I, B, M, F>(&self.config, step)?;
        if shapes != self.shapes {
            return Err(PlanError::Config(format!(
                "the checkpointed probe built other parameters ({} shapes) than the first \
                 probe ({} shapes): both must train the same model",
                shapes.len(),
                self.shapes.len()
            )));
        }
        self.checkpointed = Some((probes, split));
        Ok(self)
    }

    /// Whether [`Planner::with_checkpointed_probe`] ran, so that checkpointed plans exist.
    pub fn plans_checkpointing(&self) -> bool {
        self.checkpointed.is_some()
    }

    /// The parameter shapes the probe found, in the model's visiting order.
    pub fn shapes(&self) -> &[Shape] {
        &self.shapes
    }

    /// What the probe measured for `strategy` (without checkpointing).
    pub fn probe_of(&self, strategy: Strategy) -> Probe {
        pick(&self.probes, strategy)
    }

    /// What the probe measured for `strategy` under `checkpointing`, if that was probed.
    pub fn probe_with(
        &self,
        checkpointing: ActivationCheckpointing,
        strategy: Strategy,
    ) -> Option<Probe> {
        match checkpointing {
            ActivationCheckpointing::None => Some(pick(&self.probes, strategy)),
            ActivationCheckpointing::Balanced => {
                self.checkpointed.as_ref().map(|(p, _)| pick(p, strategy))
            }
        }
    }

    /// The settings a plan covers: without checkpointing, and with it once probed.
    fn checkpointings(&self) -> Vec<ActivationCheckpointing> {
        let mut all = vec![ActivationCheckpointing::None];
        if self.plans_checkpointing() {
            all.push(ActivationCheckpointing::Balanced);
        }
        all
    }

    /// Rank 0's parameter bytes under `strategy` at `world` ranks (one copy: the parameter).
    pub fn param_bytes(&self, strategy: Strategy, world: usize) -> u64 {
        param_bytes(
            &self.shapes,
            self.elem,
            strategy,
            world,
            self.config.shard_threshold,
        )
    }

    /// Rank 0's model state: parameters, gradients and optimizer state, to the byte.
    pub fn model_state(&self, strategy: Strategy, world: usize) -> u64 {
        self.param_bytes(strategy, world) * (2 + self.config.optimizer_copies as u64)
    }

    /// Rank 0's peak in-flight bytes: the largest of [`Self::buffers`]'s three moments.
    pub fn in_flight(&self, strategy: Strategy, world: usize) -> u64 {
        let b = self.buffers(strategy, world);
        b.forward.max(b.backward).max(b.update)
    }

    /// Rank 0's in-flight bytes at the two moments that can make the peak (see the module
    /// docs for the rule of each strategy), without activation checkpointing.
    pub fn buffers(&self, strategy: Strategy, world: usize) -> Buffers {
        self.buffers_of(strategy, world, &self.split)
    }

    /// [`Self::buffers`] where the weights of shapes `split` run their backward as two
    /// passes (dX with the weight rotating, then dW travelling on its own), as the probe saw.
    fn buffers_of(&self, strategy: Strategy, world: usize, split: &[Shape]) -> Buffers {
        if world == 1 {
            return Buffers::default();
        }
        let t = self.config.shard_threshold;
        let sharded = |s: &Shape| placement(strategy, s, world, t).is_some();
        let full = |s: &Shape| (s.num_elements() * self.elem) as u64;
        let shard = |s: &Shape| rank0_shard_bytes(s, world, self.elem);
        // A layer's bundle: a weight of two or more dimensions and the bias after it; the
        // largest among the layers `keep` accepts.
        let largest = |size: &dyn Fn(&Shape) -> u64, keep: &dyn Fn(&Shape) -> bool| -> u64 {
            let mut best = 0;
            for (i, s) in self.shapes.iter().enumerate() {
                if s.num_dims() < 2 || !sharded(s) || !keep(s) {
                    continue;
                }
                let mut bytes = size(s);
                if let Some(bias) = self.shapes.get(i + 1) {
                    let last = s[s.num_dims() - 1];
                    if bias.num_dims() == 1 && bias[0] == last && sharded(bias) {
                        bytes += size(bias);
                    }
                }
                best = best.max(bytes);
            }
            best
        };
        let bundles = |size: &dyn Fn(&Shape) -> u64| largest(size, &|_| true);
        match strategy {
            Strategy::Rtp => {
                let bundle = bundles(&shard);
                let is_split = |s: &Shape| split.contains(s);
                let whole = largest(&shard, &|s| !is_split(s));
                let halves = largest(&shard, &is_split);
                // Forward: the bundle computed on and the next one arriving. Backward: those
                // two, the travelling gradient and the next one; at N = 2 the first bundle on
                // hand is the rank's own (model state). With rendezvous sends (the in-process
                // default, and MPI's protocol for large messages) no sent bundle outlives its
                // exchange; buffered in-process sends let a rank run ahead and keep several,
                // as many as the scheduling allows, which this rule does not model. A layer
                // whose backward runs as two passes (its input recomputed under activation
                // checkpointing) holds two at a time: the rotating bundles for dX, then the
                // travelling gradients for dW.
                Buffers {
                    forward: 2 * bundle,
                    backward: (if world == 2 { 3 } else { 4 } * whole).max(2 * halves),
                    update: 0,
                }
            }
            Strategy::Fsdp => {
                // Forward: a layer's gathered weight and bias while it computes (the next
                // layer's, gathered ahead, replaces it as the last layer's output becomes the
                // activations' peak). Backward: those, while the parts of the next gather (or
                // the chunks of the gradient's reduce-scatter) arrive, and the next weight
                // gathered ahead. The backward gathers a weight for dX in every layer but the
                // first (whose input is the data), so it has a next weight to gather ahead
                // only in a model of three weights or more.
                let full = bundles(&full);
                let weights = self
                    .shapes
                    .iter()
                    .filter(|s| s.num_dims() >= 2 && sharded(s))
                    .count();
                let ahead = if weights >= 3 { full } else { 0 };
                Buffers {
                    forward: full,
                    backward: (full as f64 * (2.0 - 1.0 / world as f64)).round() as u64 + ahead,
                    update: 0,
                }
            }
            Strategy::Ddp if self.config.ddp_bucket_bytes > 0 => {
                // With buckets, the step starts with the sum of every bucketed gradient beside
                // the gradient itself (each one at least N elements; the few others, such as
                // LayerNorm gains, are counted too, a slight overestimate), while the last
                // bucket's chunks arrive.
                let bucketed: u64 = self
                    .shapes
                    .iter()
                    .filter(|s| s.num_elements() >= world)
                    .map(full)
                    .sum();
                let last = bucketed.min(self.config.ddp_bucket_bytes as u64);
                Buffers {
                    forward: 0,
                    backward: 0,
                    update: bucketed + last.div_ceil(world as u64),
                }
            }
            Strategy::Ddp => {
                // The update all-reduces each gradient in chunks of 1/N, one in flight at a
                // time (a received chunk is copied into its window of the sum, not into a
                // block of its own), and assembles its sum in a full-size buffer.
                let largest = self.shapes.iter().map(full).max().unwrap_or(0);
                Buffers {
                    forward: 0,
                    backward: 0,
                    update: largest.div_ceil(world as u64) + largest,
                }
            }
        }
    }

    /// Rank 0's predicted peak under `strategy` at `world` ranks with `batch` samples per rank,
    /// without activation checkpointing.
    pub fn predict(
        &self,
        strategy: Strategy,
        rotation: RotationMode,
        world: usize,
        batch: usize,
    ) -> Prediction {
        self.predict_with(
            ActivationCheckpointing::None,
            strategy,
            rotation,
            world,
            batch,
        )
    }

    /// [`Planner::predict`] under `checkpointing`.
    ///
    /// # Panics
    /// If `checkpointing` is on and [`Planner::with_checkpointed_probe`] did not run (see
    /// [`Planner::plans_checkpointing`]).
    pub fn predict_with(
        &self,
        checkpointing: ActivationCheckpointing,
        strategy: Strategy,
        rotation: RotationMode,
        world: usize,
        batch: usize,
    ) -> Prediction {
        assert!(world > 0, "a world has at least one rank");
        let probe = self.probe_with(checkpointing, strategy).unwrap_or_else(|| {
            panic!(
                "planning {strategy} at N={world} with {checkpointing} activation checkpointing: \
                 that was not probed (Planner::with_checkpointed_probe)"
            )
        });
        let params = self.param_bytes(strategy, world) as f64;
        let split = match (checkpointing, &self.checkpointed) {
            (ActivationCheckpointing::Balanced, Some((_, split))) => split,
            _ => &self.split,
        };
        let buffers = self.buffers_of(strategy, world, split);
        let share = params / self.param_bytes(Strategy::Ddp, 1).max(1) as f64;
        // The probe's local bytes at a batch of zero are weight-sized temporaries (gradient
        // contributions, gathered copies), which shrink with the rank's share of the model.
        let local = |line: &PerSample| {
            (line.fixed * share + line.per_sample * batch as f64)
                .max(0.0)
                .round() as u64
        };
        let resident = (params * (1 + self.config.optimizer_copies) as f64).round() as u64;
        let activations = local(&probe.local_peak);
        let per_sample = (probe.local_peak.per_sample * batch as f64)
            .max(0.0)
            .round() as u64;
        // The three moments that can make the peak: the end of the forward pass (all
        // activations, the last layer's buffers), the start of the backward pass (the
        // activations without the weight-sized temporaries, the backward's buffers), and
        // the update (what the probe saw then, scaled).
        let forward = resident + activations + buffers.forward;
        let backward = resident + per_sample + buffers.backward;
        let update = (probe.update.state * params).round() as u64
            + local(&probe.update.local)
            + buffers.update;
        Prediction {
            strategy,
            rotation,
            activation_checkpointing: checkpointing,
            world,
            batch,
            model_state: self.model_state(strategy, world),
            activations,
            in_flight: buffers.forward.max(buffers.backward).max(buffers.update),
            total: forward.max(backward).max(update),
        }
    }

    /// Every planned strategy at every world size in `worlds`, without checkpointing and,
    /// once probed, with it.
    pub fn table(&self, worlds: &[usize], batch: usize) -> Vec<Prediction> {
        worlds
            .iter()
            .flat_map(|&n| {
                self.checkpointings()
                    .into_iter()
                    .flat_map(move |ac| PLANNED.map(|(s, r)| self.predict_with(ac, s, r, n, batch)))
            })
            .collect()
    }

    /// The smallest world, up to `max_world`, at which some strategy's predicted peak fits
    /// `budget` bytes per rank, with that strategy (the first to fit in [`PLANNED`] order).
    /// Activation checkpointing, when probed, is chosen only where nothing fits at that world
    /// without it.
    pub fn recommend(
        &self,
        budget: u64,
        batch: usize,
        max_world: usize,
    ) -> Result<Prediction, PlanError> {
        if max_world == 0 {
            return Err(PlanError::Config(
                "the largest world must be at least 1".into(),
            ));
        }
        let at = |world: usize| {
            self.checkpointings().into_iter().flat_map(move |ac| {
                PLANNED
                    .iter()
                    .map(move |&(s, r)| self.predict_with(ac, s, r, world, batch))
            })
        };
        for world in 1..=max_world {
            if let Some(p) = at(world).find(|p| p.total <= budget) {
                return Ok(p);
            }
        }
        let best = at(max_world)
            .min_by_key(|p| p.total)
            .expect("strategies are planned");
        Err(PlanError::NothingFits {
            budget,
            max_world,
            best,
        })
    }
}

/// The probe of `strategy` among `probes`.
fn pick(probes: &Probes, strategy: Strategy) -> Probe {
    probes
        .iter()
        .find(|(s, _)| *s == strategy)
        .map(|(_, p)| *p)
        .expect("every strategy is probed")
}

/// Runs the probe's steps for every strategy at both probe batches (see [`Planner::probe`]):
/// the parameter shapes, their element size and each strategy's figures.
#[allow(clippy::type_complexity)]
fn measure<I, B, M, F>(
    config: &PlanConfig,
    step: F,
) -> RtpResult<(Vec<Shape>, usize, Probes, Vec<Shape>)>
where
    I: Backend,
    B: Backend<Device = RtpDevice<I>>,
    M: Module<B>,
    F: Fn(&RtpDevice<I>, usize) -> M + Send + Sync,
{
    let (b1, b2) = config.probe_batches;
    let mut shapes = None;
    let mut split: Vec<Shape> = Vec::new();
    let mut probes = [Strategy::Rtp, Strategy::Fsdp, Strategy::Ddp].map(|s| (s, Probe::default()));
    for (strategy, probe) in probes.iter_mut() {
        let mut at = Vec::new();
        for batch in [b1, b2] {
            let rtp = RtpConfig::new(1)
                .with_strategy(*strategy)
                .with_shard_threshold(config.shard_threshold)
                .with_transport(crate::TransportKind::InProcess);
            let step = &step;
            let mut out = crate::runtime::launch::launch::<I, _, _>(rtp, move |device| {
                device.reset_memory_peak();
                let model = step(&device, batch);
                let mut visitor = Shapes {
                    shapes: Vec::new(),
                    elem: 4,
                };
                model.visit(&mut visitor);
                let peak = device.memory_peak();
                let (mut compute, update) = device.memory_phase_peaks();
                if compute.total == 0 {
                    // No RtpOptimizer marked the phases: the whole step is one.
                    compute = device.memory_at_peak();
                }
                let measured = Measured {
                    batch,
                    peak,
                    compute,
                    update,
                };
                let halves = device.ctx.split_passes.lock().unwrap().clone();
                (visitor.shapes, visitor.elem, measured, halves)
            })?;
            let (s, elem, measured, halves) = out.remove(0);
            for h in halves {
                let h = Shape::from(h);
                if !split.contains(&h) {
                    split.push(h);
                }
            }
            shapes.get_or_insert((s, elem));
            at.push(measured);
        }
        let (shapes, elem) = shapes.as_ref().expect("probed");
        let params = param_bytes(shapes, *elem, Strategy::Ddp, 1, 0).max(1) as f64;
        let line = |f: &dyn Fn(&Measured) -> u64| {
            PerSample::through((at[0].batch, f(&at[0])), (at[1].batch, f(&at[1])))
        };
        let phase = |pick: fn(&Measured) -> MemoryStats| PhaseMakeUp {
            state: pick(&at[1]).sharded as f64 / params,
            local: line(&|m| pick(m).local),
        };
        *probe = Probe {
            local_peak: line(&|m| m.peak.local),
            compute: phase(|m| m.compute),
            update: phase(|m| m.update),
        };
    }
    let (shapes, elem) = shapes.expect("probed");
    Ok((shapes, elem, probes, split))
}

/// Rank 0's bytes of one copy of every parameter.
fn param_bytes(
    shapes: &[Shape],
    elem: usize,
    strategy: Strategy,
    world: usize,
    threshold: usize,
) -> u64 {
    shapes
        .iter()
        .map(|s| {
            let n = s.num_elements();
            if placement(strategy, s, world, threshold).is_some() {
                rank0_shard_bytes(s, world, elem)
            } else {
                (n * elem) as u64
            }
        })
        .sum()
}

/// Bytes of rank 0's shard (the largest) of a parameter of `shape` split over `world` ranks.
fn rank0_shard_bytes(shape: &Shape, world: usize, elem: usize) -> u64 {
    let spec = ShardSpec {
        full: shape.clone(),
        world,
    };
    (spec.shard_shape(0).num_elements() * elem) as u64
}
