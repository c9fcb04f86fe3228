//! RTP: each rank holds 1/N of every sharded parameter, and a module op rotates the shards
//! around the ring while it computes on them; each gradient shard travels to its home in the
//! same pass. Under [`Routing::Activations`] a Linear routes each rank's activations to the
//! shards' owners instead. Nothing is started ahead of the op.

use super::{Buffers, ModelShapes, RankStrategy, Rules, WeightUse};
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
        let bundle = model.largest_bundle(self, world, &shard, &|_| true);
        let whole = model.largest_bundle(self, world, &shard, &|s| !is_split(s));
        let halves = model.largest_bundle(self, world, &shard, &is_split);
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

/// One rank's RTP: what moves for a sharded Linear.
pub(crate) struct RtpRank {
    /// The weights (rotation) or the activations.
    pub(crate) routing: Routing,
}

impl<B: Backend> RankStrategy<B> for RtpRank {
    fn rules(&self) -> &'static dyn Rules {
        &Rtp
    }

    fn routes_activations(&self) -> bool {
        self.routing == Routing::Activations
    }
}
