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
//! * **Routed activations** (RTP under [`Routing::Activations`], or where [`Routing::Auto`]
//!   routes; [`PlanConfig::with_routing`]): the probe notes every Linear forward of its last
//!   step, and each pass at `N` is decided as the ranks decide it. A routed forward's owner
//!   keeps its `N - 1` peers' inputs until the backward (added to the activations); a routed
//!   pass holds the column blocks or dX partials it computes for every rank and those it
//!   receives (added to the buffers); a weight whose every pass routes leaves rotation's
//!   buffers. `routing.rs` has the rules.
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
//! activation section, the same grid) the peak fell from 8.2% under to 4.7% over. With the
//! activations routed, `tests/plan.rs` holds the tests' MLP and LM at N = 2, 3 and 4 within
//! 10% under `Auto`; routing every pass, the LM's peak is over-predicted by up to 15% (the
//! largest routed backward's buffers are added to every activation alive at the backward's
//! start).
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

mod predict;
mod probe;
mod routing;

pub use routing::linear_routes;

use crate::backend::device::RtpDevice;
use crate::backend::strategy::{placement, rules, ModelShapes};
use crate::config::{
    ActivationCheckpointing, RotationMode, Routing, RtpConfig, Strategy, DEFAULT_SHARD_THRESHOLD,
};
use crate::state::accounting::{human_bytes, MemoryStats};
use crate::state::sharding::ShardSpec;
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
    /// What moves for a sharded Linear under RTP (as [`RtpConfig::with_routing`]).
    pub routing: Routing,
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            shard_threshold: DEFAULT_SHARD_THRESHOLD,
            optimizer_copies: 2,
            probe_batches: (1, 2),
            ddp_bucket_bytes: crate::config::DEFAULT_DDP_BUCKET_BYTES,
            routing: Routing::default(),
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

    /// Sets what moves for a sharded Linear in the planned RTP runs: routed activations add
    /// the inputs their owners keep, and a weight whose every pass routes leaves rotation's
    /// buffers (see the module docs).
    pub fn with_routing(mut self, routing: Routing) -> Self {
        self.routing = routing;
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

pub use crate::backend::strategy::Buffers;

/// One prediction: rank 0's peak bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    /// The strategy.
    pub strategy: Strategy,
    /// The rotation mode (RTP only).
    pub rotation: RotationMode,
    /// What moves for a sharded Linear (RTP only).
    pub routing: Routing,
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
    /// `rtp (out-of-place)`, `fsdp`, `ddp`, with `, balanced checkpointing` when it is on;
    /// RTP names its routing where it is not the default (`rtp (in-place, weights rotate)`).
    pub fn label(&self) -> String {
        let strategy = match (self.strategy, self.routing) {
            (Strategy::Rtp, Routing::Auto) => format!("rtp ({})", self.rotation),
            (Strategy::Rtp, Routing::Weights) => format!("rtp ({}, weights rotate)", self.rotation),
            (Strategy::Rtp, Routing::Activations) => {
                format!("rtp ({}, activations routed)", self.rotation)
            }
            (s, _) => s.to_string(),
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
    /// The Linear forwards of the probe's last step, for routing (`routing.rs`).
    calls: Vec<routing::ProbedCall>,
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
