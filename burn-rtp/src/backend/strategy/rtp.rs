//! RTP: each rank holds 1/N of every sharded parameter, and a module op rotates the shards
//! around the ring while it computes on them; each gradient shard travels to its home in the
//! same pass. Under [`Routing::Activations`] a Linear routes each rank's activations to the
//! shards' owners instead. Nothing is started ahead of the op.

use super::{Buffers, LinearPass, ModelShapes, RankStrategy, Rules, WeightUse};
use crate::config::Routing;
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use burn::tensor::Shape;

/// RTP's rules: sharded weights rotate.
pub(crate) struct Rtp;

impl Rules for Rtp {
    fn shards(&self) -> bool {
        true
    }

    fn weight_use(&self, layout: &Layout) -> WeightUse {
        match layout {
            Layout::Sharded(spec) => WeightUse::Rotated(spec.clone()),
            _ => WeightUse::Whole,
        }
    }

    fn in_flight(&self, model: &ModelShapes<'_>, world: usize) -> Buffers {
        let shard = |s: &Shape| model.shard(s, world);
        let is_split = |s: &Shape| model.split.contains(s);
        // Weights whose every pass routes its activations stay home.
        let rotates = |s: &Shape| !model.routed.contains(s);
        let bundle = model.largest_bundle(self, world, &shard, &rotates);
        let whole = model.largest_bundle(self, world, &shard, &|s| rotates(s) && !is_split(s));
        let halves = model.largest_bundle(self, world, &shard, &|s| rotates(s) && is_split(s));
        // Forward: the bundle computed on and the next one arriving. Backward: those two, the
        // travelling gradient and the next one; at N = 2 the first bundle on hand is the
        // rank's own (model state). With rendezvous sends (the in-process default, and MPI's
        // protocol for large messages) no sent bundle outlives its exchange; buffered
        // in-process sends let a rank run ahead and keep several, as many as the scheduling
        // allows, which this rule does not model. A layer whose backward runs as two passes
        // (its input recomputed under activation checkpointing) holds two at a time: the
        // rotating bundles for dX, then the travelling gradients for dW.
        Buffers {
            forward: 2 * bundle,
            backward: (if world == 2 { 3 } else { 4 } * whole).max(2 * halves),
            update: 0,
        }
    }
}

/// How much less than rotation routing must move before `Auto` routes: rotation's transfers
/// hide behind its compute, routing's do not.
const AUTO_MARGIN: f64 = 1.25;

/// Elements one rank sends in `pass` over `world` ranks: `(rotating the weight, routing the
/// activations)`. Rotation sends `(N-1)/N` of the weight per pass (and as much again for
/// the travelling dW); routing sends `x` to `N - 1` owners and gets `(N-1)/N` of `y` back, in
/// the backward `dy`'s columns out, `x` again for dW and the dX partials back. Where the
/// owners kept `x` from a routed forward, no `x` goes out.
pub(crate) fn elements_moved(pass: &LinearPass, world: usize) -> (f64, f64) {
    let n = world as f64;
    let (rows, d_in, d_out) = (pass.rows, pass.d_in as f64, pass.d_out as f64);
    let share = (n - 1.0) / n;
    let weight = share * d_in * d_out;
    let x = (n - 1.0) * rows * d_in;
    let x_out = if pass.x_on_owners { 0.0 } else { x };
    let y = share * rows * d_out;
    let count = |b: bool| f64::from(u8::from(b));
    match pass.backward {
        None => (weight, x_out + y),
        Some((dx, dw)) => {
            let rotate = weight * (count(dx) + count(dw));
            // dX's partials come back whole; dW needs `x` on the owners.
            let route = y + x * count(dx) + x_out * count(dw);
            (rotate, route)
        }
    }
}

/// Whether `pass` routes its activations under `routing` over `world` ranks.
pub(crate) fn routes(routing: Routing, pass: &LinearPass, world: usize) -> bool {
    match routing {
        Routing::Weights => false,
        Routing::Activations => true,
        Routing::Auto => {
            let (rotate, route) = elements_moved(pass, world);
            route * AUTO_MARGIN < rotate
        }
    }
}

/// One rank's RTP: what moves for a sharded Linear.
pub(crate) struct RtpRank {
    /// The weights (rotation), the activations, or per pass whichever weighs less.
    pub(crate) routing: Routing,
    /// Ranks in the world.
    pub(crate) world: usize,
}

impl<B: Backend> RankStrategy<B> for RtpRank {
    fn rules(&self) -> &'static dyn Rules {
        &Rtp
    }

    fn may_route(&self) -> bool {
        self.routing != Routing::Weights
    }

    fn routes_activations(&self, pass: &LinearPass) -> bool {
        routes(self.routing, pass, self.world)
    }
}
