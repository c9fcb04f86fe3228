//! Embedding: the forward gathers each shard's columns of the looked-up rows as the shards
//! rotate; the backward scatter-adds each column block into a gradient buffer that travels
//! to the shard's home.

use super::full_inner;
use super::weights::{gather_unit, local, mean_over_ranks, reduce_scatter_full, WeightUse};
use crate::rotation::{reduce_scatter, rotate_columns};
use crate::sharding::Layout;
use crate::tensor::RtpTensor;
use burn::tensor::backend::Backend;
use burn_rtp_kernels as kernels;

/// `embedding(weights, indices)`.
pub(super) fn forward<B: Backend>(
    weights: RtpTensor<B>,
    indices: B::IntTensorPrimitive,
) -> RtpTensor<B> {
    let ctx = weights.ctx.clone();
    match WeightUse::of(&weights) {
        WeightUse::Whole => {
            let w = full_inner(weights, "embedding");
            local(&ctx, B::embedding(w.get(), indices))
        }
        WeightUse::Gathered(_) => {
            let w = gather_unit(weights, "embedding.gather");
            local(&ctx, B::embedding(w.get(), indices))
        }
        WeightUse::Rotated(spec) => {
            let rows = spec.full[0];
            let y = rotate_columns(
                &ctx,
                "embedding.forward",
                vec![weights.inner.clone()],
                |j| vec![vec![rows, spec.range(j).len]],
                |_, shard| kernels::embedding_columns::<B>(shard[0].clone(), indices.clone()),
                |j| spec.range(j),
                spec.last(),
            );
            y.into_local(ctx)
        }
    }
}

/// The weight gradient of `embedding(weights, indices)`, laid out like `weights`.
pub(super) fn backward<B: Backend>(
    weights: RtpTensor<B>,
    output_grad: RtpTensor<B>,
    indices: B::IntTensorPrimitive,
) -> RtpTensor<B> {
    let ctx = weights.ctx.clone();
    let op = "embedding_backward";
    match WeightUse::of(&weights) {
        WeightUse::Whole => {
            let w = full_inner(weights, op);
            let dy = full_inner(output_grad, op);
            local(&ctx, B::embedding_backward(w.get(), dy.get(), indices))
        }
        WeightUse::Gathered(spec) => {
            let dy = full_inner(output_grad, op);
            let rows = spec.full[0];
            let full = kernels::accumulate_embedding_grad::<B>(None, rows, dy.get(), indices);
            reduce_scatter_full(&ctx, "embedding.reduce_scatter", spec, full)
        }
        WeightUse::Rotated(spec) => {
            let dy = full_inner(output_grad, op);
            let rows = spec.full[0];
            let mut own = reduce_scatter(
                &ctx,
                "embedding.backward",
                |j| vec![vec![rows, spec.range(j).len]],
                |j| {
                    let range = spec.range(j);
                    let dy_j = kernels::column_slice::<B>(dy.get(), range.start, range.len);
                    vec![kernels::accumulate_embedding_grad::<B>(
                        None,
                        rows,
                        dy_j,
                        indices.clone(),
                    )]
                },
            );
            let g = mean_over_ranks(&ctx, own.remove(0));
            RtpTensor::new(ctx, g, Layout::Sharded(spec))
        }
    }
}
