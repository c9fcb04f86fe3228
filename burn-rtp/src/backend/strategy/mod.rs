//! One place per strategy. DDP, FSDP and RTP are each one type ([`ddp::Ddp`],
//! [`fsdp::Fsdp`], [`rtp::Rtp`]) behind two traits:
//!
//! * [`Rules`], free of Burn's `Backend`: what a rank holds (the placement policy), how a
//!   module op uses a weight, and the bytes the strategy keeps in flight (the planner's
//!   rule). The planner and checkpoint resharding read it without a backend.
//! * [`RankStrategy`], one per rank: what the strategy starts ahead of need on the rank's
//!   background worker and hands back later, namely DDP's gradient buckets and FSDP's
//!   prefetched gathers, and, for RTP, whether a Linear pass routes its activations instead
//!   of rotating the shards. RTP starts nothing ahead: it computes inside the op.
//!
//! Nothing outside this folder names a strategy to decide what to do: the ops `match` on a
//! [`WeightUse`], the optimizer calls the hooks, and a new strategy is a new file here.

pub(crate) mod ddp;
pub(crate) mod fsdp;
pub(crate) mod rtp;
#[cfg(test)]
mod tests;

use crate::comm::collectives::all_gather;
use crate::comm::context::Comm;
use crate::comm::p2p::fence;
use crate::config::{RtpConfig, Strategy};
use crate::state::accounting::{Category, Charge, Float, Held};
use crate::state::sharding::{is_sharded_param, Layout, ShardSpec};
use burn::tensor::backend::Backend;
use burn::tensor::Shape;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How a module op uses a weight.
pub(crate) enum WeightUse {
    /// Held whole on this rank (replicated, or a per-rank tensor): the inner op as it is.
    Whole,
    /// Sharded under FSDP: all-gathered for the op, the gradient reduce-scattered.
    Gathered(ShardSpec),
    /// Sharded under RTP: computed where the shards live, the shards rotating (the gradient
    /// travelling to its home) or the activations routed to them (`Routing`).
    Rotated(ShardSpec),
}

/// What a strategy decides without a backend: placement, weight use, bytes in flight.
pub(crate) trait Rules: Sync {
    /// Whether this strategy shards parameters at all (DDP replicates them).
    fn shards(&self) -> bool;

    /// How a module op uses a weight of `layout`; only the sharded case differs by strategy.
    fn weight_use(&self, layout: &Layout) -> WeightUse;

    /// Rank 0's in-flight bytes at the moments of a step that can make its peak, for a model
    /// of `model`'s shapes at `world` > 1 ranks (see `tools::plan`'s module docs).
    fn in_flight(&self, model: &ModelShapes<'_>, world: usize) -> Buffers;

    /// Where a parameter (or its gradient, or its optimizer state) of logical `shape` lives:
    /// its split over `world` ranks, or `None` when it is replicated. A sharding strategy
    /// shards the last dimension of every parameter of at least `threshold` elements that has
    /// a column for every rank.
    fn placement(&self, shape: &Shape, world: usize, threshold: usize) -> Option<ShardSpec> {
        (self.shards() && is_sharded_param(shape, world, threshold)).then(|| ShardSpec {
            full: shape.clone(),
            world,
        })
    }
}

/// The rules of `strategy`.
pub(crate) fn rules(strategy: Strategy) -> &'static dyn Rules {
    match strategy {
        Strategy::Ddp => &ddp::Ddp,
        Strategy::Fsdp => &fsdp::Fsdp,
        Strategy::Rtp => &rtp::Rtp,
    }
}

/// The placement policy: where a parameter (or its gradient, or its optimizer state) of
/// logical `shape` lives under `strategy`: its split over `world` ranks, or `None` when it is
/// replicated. DDP replicates everything; FSDP and RTP shard the last dimension of every
/// parameter of at least `threshold` elements that has a column for every rank.
///
/// Parameter creation, every op that produces a parameter's gradient, checkpoint resharding
/// and the memory planner ask this one function, so a gradient always has the layout of its
/// parameter and the plan counts what training holds.
pub fn placement(
    strategy: Strategy,
    shape: &Shape,
    world: usize,
    threshold: usize,
) -> Option<ShardSpec> {
    rules(strategy).placement(shape, world, threshold)
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

/// What the planner's in-flight rules read of a model: its parameter shapes in creation
/// order, the bytes of an element, and the settings that place and bucket them.
pub(crate) struct ModelShapes<'a> {
    /// Every parameter's logical shape, in the module's order.
    pub(crate) shapes: &'a [Shape],
    /// Bytes per element.
    pub(crate) elem: usize,
    /// The shard threshold (see [`Rules::placement`]).
    pub(crate) threshold: usize,
    /// DDP's bucket size in bytes (0: no buckets).
    pub(crate) bucket_bytes: usize,
    /// The weights whose backward runs as two passes (their input recomputed).
    pub(crate) split: &'a [Shape],
    /// The weights whose every pass routes its activations (RTP): none of them rotates.
    pub(crate) routed: &'a [Shape],
}

impl ModelShapes<'_> {
    /// Bytes of a whole parameter of `shape`.
    pub(crate) fn full(&self, shape: &Shape) -> u64 {
        (shape.num_elements() * self.elem) as u64
    }

    /// Bytes of rank 0's shard (the largest) of a parameter of `shape` over `world` ranks.
    pub(crate) fn shard(&self, shape: &Shape, world: usize) -> u64 {
        let spec = ShardSpec {
            full: shape.clone(),
            world,
        };
        (spec.shard_shape(0).num_elements() * self.elem) as u64
    }

    /// The largest bundle (a sharded weight of two or more dimensions and the sharded bias
    /// after it) among the weights `keep` accepts, each measured by `size`.
    pub(crate) fn largest_bundle(
        &self,
        rules: &dyn Rules,
        world: usize,
        size: &dyn Fn(&Shape) -> u64,
        keep: &dyn Fn(&Shape) -> bool,
    ) -> u64 {
        let sharded = |s: &Shape| rules.placement(s, world, self.threshold).is_some();
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
    }
}

/// What one rank's strategy does beside the ops: the work it starts ahead of need on the
/// background worker and the results it hands back. Every hook has the default of a strategy
/// that starts nothing ahead; each rank holds one, chosen by [`for_rank`].
pub(crate) trait RankStrategy<B: Backend>: Send + Sync {
    /// The strategy's backend-free rules.
    fn rules(&self) -> &'static dyn Rules;

    /// A replicated weight's gradient, identified by `charge`, that the backward just made.
    fn on_gradient(&self, _comm: &Arc<Comm<B>>, _charge: &Arc<Charge>, _grad: &Float<B>) {}

    /// The backward is over and the optimizer is about to synchronise gradients.
    fn before_sync(&self, _comm: &Arc<Comm<B>>) {}

    /// The reduced sum of the gradient identified by `charge`, if it was computed ahead.
    fn claim_reduced(&self, _comm: &Comm<B>, _charge: &Arc<Charge>) -> Option<Float<B>> {
        None
    }

    /// The gradients are synchronised: wait for every job in flight, so that none outlives
    /// the step, and forget the sums computed ahead and not claimed (FSDP's prefetched
    /// gathers stay until [`RankStrategy::release_params`]).
    fn after_sync(&self, comm: &Comm<B>) {
        comm.wait_background();
    }

    /// Whether the optimizer registers the module's parameters before each step (callers
    /// skip collecting them otherwise).
    fn wants_params(&self) -> bool {
        false
    }

    /// The parameters of the next step, in the module's order.
    fn register_params(&self, _params: Vec<Param<B>>) {}

    /// Lets go of the registered parameters before the optimizer replaces them.
    fn release_params(&self) {}

    /// The whole of a sharded parameter for a module op, as a strategy that gathers does.
    fn gather_param(
        &self,
        comm: &Arc<Comm<B>>,
        _charge: &Arc<Charge>,
        inner: &Float<B>,
        layout: &Layout,
        op: &'static str,
    ) -> Held<B> {
        all_gather(comm, inner, layout, op, Category::InFlight)
    }

    /// Whether `pass` of a Linear with a sharded weight routes the activations to the shards'
    /// owners instead of rotating the shards (RTP under
    /// [`Routing::Activations`](crate::config::Routing), or `Auto` where they weigh less).
    fn routes_activations(&self, _pass: &LinearPass) -> bool {
        false
    }

    /// Whether some pass may route its activations: if not, a forward need not look for the
    /// peers' inputs an earlier routed forward left.
    fn may_route(&self) -> bool {
        false
    }

    /// Jobs started ahead so far, and results taken: `(started, taken)`.
    fn ahead(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// What one pass of a Linear computes, on which shapes: what decides whether weights or
/// activations move.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LinearPass {
    /// Rows per rank (tokens): the mean over every rank's input where the ranks agreed their
    /// shapes, so that every rank decides alike; else this rank's own.
    pub(crate) rows: f64,
    /// The weight's input features.
    pub(crate) d_in: usize,
    /// The weight's output features.
    pub(crate) d_out: usize,
    /// `None` for the forward; for the backward, whether it computes dX and dW.
    pub(crate) backward: Option<(bool, bool)>,
    /// Whether every owner already holds this rank's input, from a routed forward of the same
    /// `x` (`backend::pairing`'s routed inputs): routing then sends no `x`.
    pub(crate) x_on_owners: bool,
}

/// A parameter as the optimizer registers it: its identity, its shard and its layout.
pub(crate) type Param<B> = (Arc<Charge>, Float<B>, Layout);

/// The strategy of one rank of a world of `config`.
pub(crate) fn for_rank<B: Backend>(config: &RtpConfig) -> Box<dyn RankStrategy<B>> {
    let n = config.world_size;
    match config.strategy {
        Strategy::Ddp => Box::new(ddp::DdpRank::new(config.ddp_bucket_bytes, n)),
        Strategy::Fsdp => Box::new(fsdp::FsdpRank::new(n)),
        Strategy::Rtp => Box::new(rtp::RtpRank {
            routing: config.routing,
            world: n,
        }),
    }
}

/// Hands `job` to the rank's background worker once this rank's queued device work is done:
/// the worker runs on a stream of its own (each thread's, on wgpu and CUDA), and its jobs
/// read tensors this rank's last kernels wrote (fresh gradients, weights the step just
/// updated). A no-op fence on synchronous backends such as NdArray.
fn run_in_background<B: Backend>(comm: &Comm<B>, job: impl FnOnce() + Send + 'static) {
    fence(comm);
    comm.background.submit(comm.rank, Box::new(job));
}

/// What a strategy started ahead of need on the background worker (DDP's bucket
/// all-reduces, FSDP's gathers), and how many of those results were taken.
#[derive(Default)]
struct AheadCounts {
    /// Jobs started.
    started: AtomicU64,
    /// Results taken (a bucketed sum the optimizer claimed, a prefetched gather used).
    taken: AtomicU64,
}

impl AheadCounts {
    /// Both counts so far: `(started, taken)`.
    fn get(&self) -> (u64, u64) {
        (
            self.started.load(Ordering::Relaxed),
            self.taken.load(Ordering::Relaxed),
        )
    }
}
