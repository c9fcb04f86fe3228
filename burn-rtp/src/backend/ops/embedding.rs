//! Embedding: the forward gathers each shard's columns of the looked-up rows as the shards
//! rotate; the backward scatter-adds each column block into a gradient buffer that travels
//! to the shard's home.

use super::full_inner;
use super::weights::{gather_unit, local, mean_over_ranks, reduce_scatter_full, use_of, WeightUse};
use crate::backend::tensor::RtpTensor;
use crate::comm::rotation::{reduce_scatter, rotate_columns};
use crate::state::sharding::Layout;
use burn::tensor::{Shape, TensorMetadata};
use burn_rtp_kernels as kernels;
use burn_rtp_kernels::RotationKernels;

/// `embedding(weights, indices)`.
pub(super) fn forward<B: RotationKernels>(
    weights: RtpTensor<B>,
    indices: B::IntTensorPrimitive,
) -> RtpTensor<B> {
    let ctx = weights.ctx.clone();
    match use_of(&weights) {
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
            let w = &weights.inner;
            let mut dims = indices.shape().to_vec();
            dims.push(spec.last());
            let y = B::filled(
                Shape::from(dims),
                0.0,
                &B::float_device(w),
                w.dtype().into(),
            );
            let y = rotate_columns(
                &ctx.comm,
                "embedding.forward",
                vec![weights.inner.clone()],
                |j| vec![vec![rows, spec.range(j).len]],
                y,
                !B::kernel_path().embedding_in_place(),
                |y, j, shard| {
                    let start = spec.range(j).start;
                    kernels::embedding_step::<B>(y, shard[0].clone(), indices.clone(), start)
                },
                |j| spec.range(j),
            );
            y.into_local(ctx)
        }
    }
}

/// The weight gradient of `embedding(weights, indices)`, laid out like `weights`.
pub(super) fn backward<B: RotationKernels>(
    weights: RtpTensor<B>,
    output_grad: RtpTensor<B>,
    indices: B::IntTensorPrimitive,
) -> RtpTensor<B> {
    let ctx = weights.ctx.clone();
    let op = "embedding_backward";
    match use_of(&weights) {
        WeightUse::Whole => {
            let replicated = weights.layout == Layout::Replicated;
            let w = full_inner(weights, op);
            let dy = full_inner(output_grad, op);
            let dw = local(&ctx, B::embedding_backward(w.get(), dy.get(), indices));
            if replicated {
                dw.offer_gradient();
            }
            dw
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
                &ctx.comm,
                "embedding.backward",
                |j| vec![vec![rows, spec.range(j).len]],
                |j| {
                    let range = spec.range(j);
                    let window = kernels::Window::new(range.start, range.len);
                    let dy = dy.get();
                    let dy_shape = dy.shape().to_vec();
                    let g = kernels::embedding_grad_step::<B>(rows, dy, indices.clone(), window)
                        .unwrap_or_else(|e| {
                            panic!(
                                "rank {}: `embedding.backward` shard {j} (dy {dy_shape:?}): {e}",
                                ctx.comm.rank
                            )
                        });
                    vec![g]
                },
            );
            let g = mean_over_ranks(&ctx, own.remove(0));
            RtpTensor::new(ctx, g, Layout::Sharded(spec))
        }
    }
}
