//! How a module op uses its weight: whole (replicated or local), gathered for the op (FSDP),
//! or computed shard by shard where the shards live (RTP: rotated around the ring, or with the
//! activations routed to them), as the rank's strategy rules
//! (`backend::strategy`). Linear and Embedding `match` on [`WeightUse`] once per op; the
//! helpers here are what those arms share.

use super::Float;
use crate::backend::rank::RankCtx;
pub(super) use crate::backend::strategy::WeightUse;
use crate::backend::tensor::RtpTensor;
use crate::comm::collectives::reduce_scatter_columns;
use crate::state::accounting::Held;
use crate::state::sharding::{Layout, ShardSpec};
use burn::tensor::backend::Backend;
use burn::tensor::{Scalar, Shape, TensorMetadata};
use std::sync::Arc;

/// The use of `weight` under its rank's strategy.
pub(super) fn use_of<B: Backend>(weight: &RtpTensor<B>) -> WeightUse {
    use_of_layout(&weight.layout, &weight.ctx)
}

/// The use of a weight of `layout` (as a forward record kept it) on `ctx`'s rank.
pub(super) fn use_of_layout<B: Backend>(layout: &Layout, ctx: &RankCtx<B>) -> WeightUse {
    ctx.rules().weight_use(layout)
}

/// A per-rank result.
pub(super) fn local<B: Backend>(ctx: &Arc<RankCtx<B>>, inner: Float<B>) -> RtpTensor<B> {
    RtpTensor::new(ctx.clone(), inner, Layout::Local)
}

/// Averages a reduced gradient over ranks: each rank's loss is a mean over its own batch,
/// so the data-parallel gradient is the mean of the per-rank gradients.
pub(super) fn mean_over_ranks<B: Backend>(ctx: &RankCtx<B>, g: Float<B>) -> Float<B> {
    if ctx.comm.world_size == 1 {
        g
    } else {
        B::float_mul_scalar(g, Scalar::Float(1.0 / ctx.comm.world_size as f64))
    }
}

/// FSDP's all-gather of a whole parameter, charged as in flight while it lives; a tensor
/// that is not sharded is taken as it is.
pub(super) fn gather_unit<B: Backend>(t: RtpTensor<B>, op: &'static str) -> Held<B> {
    match t.layout {
        Layout::Sharded(_) => t.gather_param(op),
        _ => t.held(),
    }
}

/// FSDP's gradient: the full local gradient is reduce-scattered; rank `r` keeps shard `r`.
pub(super) fn reduce_scatter_full<B: Backend>(
    ctx: &Arc<RankCtx<B>>,
    op: &'static str,
    spec: ShardSpec,
    full: Float<B>,
) -> RtpTensor<B> {
    let g = mean_over_ranks(ctx, reduce_scatter_columns(&ctx.comm, op, &spec, full));
    RtpTensor::new(ctx.clone(), g, Layout::Sharded(spec))
}

/// Reshapes a `[d]` vector so that it broadcasts over a tensor of `ndims` dimensions.
pub(super) fn broadcastable<B: Backend>(v: Float<B>, ndims: usize) -> Float<B> {
    let d = v.shape().num_elements();
    let mut dims = vec![1; ndims - 1];
    dims.push(d);
    B::float_reshape(v, Shape::from(dims))
}
