//! Module ops: where parameters meet activations. Linear (`linear.rs`) and embedding rotate
//! their shards (see [`crate::rotation`]); every other module op gathers sharded operands and
//! forwards.

use super::{full_inner, Float};
use crate::accounting::Category;
use crate::accounting::Held;
use crate::backend::Rtp;
use crate::collectives::{all_gather, reduce_scatter_columns};
use crate::config::Strategy;
use crate::rotation::{reduce_scatter, rotate_columns};
use crate::sharding::Layout;
use crate::sharding::ShardSpec;
use crate::tensor::RtpTensor;
use crate::world::RankCtx;
use burn::tensor::backend::Backend;
use burn::tensor::ops::*;
use burn::tensor::{Scalar, Shape, TensorMetadata};
use burn_rtp_kernels as kernels;
use std::sync::Arc;

pub(super) fn local<B: Backend>(ctx: &Arc<RankCtx<B>>, inner: Float<B>) -> RtpTensor<B> {
    RtpTensor::new(ctx.clone(), inner, Layout::Local)
}

pub(super) fn opt_full<B: Backend>(t: Option<RtpTensor<B>>, op: &'static str) -> Option<Held<B>> {
    t.map(|t| full_inner(t, op))
}

pub(super) fn opt_get<B: Backend>(t: &Option<Held<B>>) -> Option<Float<B>> {
    t.as_ref().map(Held::get)
}

/// Averages a reduced gradient over ranks: each rank's loss is a mean over its own batch,
/// so the data-parallel gradient is the mean of the per-rank gradients.
pub(super) fn mean_over_ranks<B: Backend>(ctx: &RankCtx<B>, g: Float<B>) -> Float<B> {
    if ctx.world_size == 1 {
        g
    } else {
        B::float_mul_scalar(g, Scalar::Float(1.0 / ctx.world_size as f64))
    }
}

/// FSDP's all-gather of a whole parameter, charged as in flight while it lives; a tensor
/// that is not sharded is taken as it is.
pub(super) fn gather_unit<B: Backend>(t: RtpTensor<B>, op: &'static str) -> Held<B> {
    match t.layout {
        Layout::Sharded(_) => all_gather(&t, op, Category::InFlight),
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
    let g = mean_over_ranks(ctx, reduce_scatter_columns(ctx, op, &spec, full));
    RtpTensor::new(ctx.clone(), g, Layout::Sharded(spec))
}

pub(super) fn is_fsdp<B: Backend>(ctx: &RankCtx<B>) -> bool {
    ctx.config.strategy == Strategy::Fsdp
}

/// Reshapes a `[d]` vector so that it broadcasts over a tensor of `ndims` dimensions.
pub(super) fn broadcastable<B: Backend>(v: Float<B>, ndims: usize) -> Float<B> {
    let d = v.shape().num_elements();
    let mut dims = vec![1; ndims - 1];
    dims.push(d);
    B::float_reshape(v, Shape::from(dims))
}

impl<B: Backend> ModuleOps<Self> for Rtp<B> {
    fn embedding(weights: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        let ctx = weights.ctx.clone();
        let Layout::Sharded(spec) = weights.layout.clone() else {
            let w = full_inner(weights, "embedding");
            return local(&ctx, B::embedding(w.get(), indices));
        };
        if is_fsdp(&ctx) {
            let w = gather_unit(weights, "embedding.gather");
            return local(&ctx, B::embedding(w.get(), indices));
        }
        let rows = spec.full[0];
        let y = rotate_columns(
            &ctx,
            "embedding.forward",
            vec![weights.inner.clone()],
            |j| vec![vec![rows, spec.range(j).len]],
            |_, shard| kernels::embedding_columns::<B>(shard[0].clone(), indices.clone()),
            |part| part.shape().num_dims() - 1,
        );
        y.into_local(ctx)
    }

    fn embedding_backward(
        weights: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let ctx = weights.ctx.clone();
        let Layout::Sharded(spec) = weights.layout.clone() else {
            let w = full_inner(weights, "embedding_backward");
            let dy = full_inner(output_grad, "embedding_backward");
            return local(&ctx, B::embedding_backward(w.get(), dy.get(), indices));
        };
        let rows = spec.full[0];
        let dy = full_inner(output_grad, "embedding_backward");
        if is_fsdp(&ctx) {
            let full = kernels::accumulate_embedding_grad::<B>(None, rows, dy.get(), indices);
            return reduce_scatter_full(&ctx, "embedding.reduce_scatter", spec, full);
        }
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

    fn linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        super::linear::forward(x, weight, bias)
    }

    fn linear_x_backward(
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::linear::x_backward(weight, output_grad)
    }

    fn linear_weight_backward(
        x: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::linear::weight_backward(x, output_grad)
    }

    fn linear_bias_backward(output_grad: FloatTensor<Self>) -> FloatTensor<Self> {
        super::linear::bias_backward(output_grad)
    }

    fn conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let x_held = full_inner(x, "conv2d");
        let weight_held = full_inner(weight, "conv2d");
        let bias_held = opt_full(bias, "conv2d");
        let out = B::conv2d(
            x_held.get(),
            weight_held.get(),
            opt_get(&bias_held),
            options,
        );
        local(&ctx, out)
    }

    fn deform_conv2d(
        x: FloatTensor<Self>,
        offset: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mask: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        options: DeformConvOptions<2>,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let op = "deform_conv2d";
        let x_held = full_inner(x, op);
        let offset_held = full_inner(offset, op);
        let weight_held = full_inner(weight, op);
        let mask_held = opt_full(mask, op);
        let bias_held = opt_full(bias, op);
        let out = B::deform_conv2d(
            x_held.get(),
            offset_held.get(),
            weight_held.get(),
            opt_get(&mask_held),
            opt_get(&bias_held),
            options,
        );
        local(&ctx, out)
    }

    fn deform_conv2d_backward(
        x: FloatTensor<Self>,
        offset: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mask: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        output_grad: FloatTensor<Self>,
        options: DeformConvOptions<2>,
    ) -> DeformConv2dBackward<Self> {
        let ctx = x.ctx.clone();
        let op = "deform_conv2d_backward";
        let x_held = full_inner(x, op);
        let offset_held = full_inner(offset, op);
        let weight_held = full_inner(weight, op);
        let mask_held = opt_full(mask, op);
        let bias_held = opt_full(bias, op);
        let output_grad_held = full_inner(output_grad, op);
        let g = B::deform_conv2d_backward(
            x_held.get(),
            offset_held.get(),
            weight_held.get(),
            opt_get(&mask_held),
            opt_get(&bias_held),
            output_grad_held.get(),
            options,
        );
        DeformConv2dBackward::new(
            local(&ctx, g.x_grad),
            local(&ctx, g.offset_grad),
            local(&ctx, g.weight_grad),
            g.mask_grad.map(|t| local(&ctx, t)),
            g.bias_grad.map(|t| local(&ctx, t)),
        )
    }

    fn conv3d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<3>,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let x_held = full_inner(x, "conv3d");
        let weight_held = full_inner(weight, "conv3d");
        let bias_held = opt_full(bias, "conv3d");
        let out = B::conv3d(
            x_held.get(),
            weight_held.get(),
            opt_get(&bias_held),
            options,
        );
        local(&ctx, out)
    }

    fn conv_transpose2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvTransposeOptions<2>,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let op = "conv_transpose2d";
        let x_held = full_inner(x, op);
        let weight_held = full_inner(weight, op);
        let bias_held = opt_full(bias, op);
        let out = B::conv_transpose2d(
            x_held.get(),
            weight_held.get(),
            opt_get(&bias_held),
            options,
        );
        local(&ctx, out)
    }

    fn conv_transpose3d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvTransposeOptions<3>,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let op = "conv_transpose3d";
        let x_held = full_inner(x, op);
        let weight_held = full_inner(weight, op);
        let bias_held = opt_full(bias, op);
        let out = B::conv_transpose3d(
            x_held.get(),
            weight_held.get(),
            opt_get(&bias_held),
            options,
        );
        local(&ctx, out)
    }

    fn avg_pool2d(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let x_held = full_inner(x, "avg_pool2d");
        let x = x_held.get();
        local(
            &ctx,
            B::avg_pool2d(
                x,
                kernel_size,
                stride,
                padding,
                count_include_pad,
                ceil_mode,
            ),
        )
    }

    fn avg_pool2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let op = "avg_pool2d_backward";
        let x_held = full_inner(x, op);
        let grad_held = full_inner(grad, op);
        let (x, g) = (x_held.get(), grad_held.get());
        local(
            &ctx,
            B::avg_pool2d_backward(
                x,
                g,
                kernel_size,
                stride,
                padding,
                count_include_pad,
                ceil_mode,
            ),
        )
    }

    fn adaptive_avg_pool2d(x: FloatTensor<Self>, output_size: [usize; 2]) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let x_held = full_inner(x, "adaptive_avg_pool2d");
        local(&ctx, B::adaptive_avg_pool2d(x_held.get(), output_size))
    }

    fn adaptive_avg_pool2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let op = "adaptive_avg_pool2d_backward";
        let x_held = full_inner(x, op);
        let grad_held = full_inner(grad, op);
        local(
            &ctx,
            B::adaptive_avg_pool2d_backward(x_held.get(), grad_held.get()),
        )
    }

    fn max_pool2d(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let x_held = full_inner(x, "max_pool2d");
        let x = x_held.get();
        local(
            &ctx,
            B::max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode),
        )
    }

    fn max_pool2d_with_indices(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> MaxPool2dWithIndices<Self> {
        let ctx = x.ctx.clone();
        let x_held = full_inner(x, "max_pool2d_with_indices");
        let x = x_held.get();
        let out = B::max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode);
        MaxPool2dWithIndices::new(local(&ctx, out.output), out.indices)
    }

    fn max_pool2d_with_indices_backward(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
        output_grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> MaxPool2dBackward<Self> {
        let ctx = x.ctx.clone();
        let op = "max_pool2d_with_indices_backward";
        let x_held = full_inner(x, op);
        let output_grad_held = full_inner(output_grad, op);
        let out = B::max_pool2d_with_indices_backward(
            x_held.get(),
            kernel_size,
            stride,
            padding,
            dilation,
            ceil_mode,
            output_grad_held.get(),
            indices,
        );
        MaxPool2dBackward::new(local(&ctx, out.x_grad))
    }

    fn interpolate(
        x: FloatTensor<Self>,
        output_size: [usize; 2],
        options: InterpolateOptions,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let x_held = full_inner(x, "interpolate");
        local(&ctx, B::interpolate(x_held.get(), output_size, options))
    }

    fn interpolate_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        output_size: [usize; 2],
        options: InterpolateOptions,
    ) -> FloatTensor<Self> {
        let ctx = x.ctx.clone();
        let op = "interpolate_backward";
        let x_held = full_inner(x, op);
        let grad_held = full_inner(grad, op);
        local(
            &ctx,
            B::interpolate_backward(x_held.get(), grad_held.get(), output_size, options),
        )
    }

    fn attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        mask: Option<BoolTensor<Self>>,
        attn_bias: Option<FloatTensor<Self>>,
        options: AttentionModuleOptions,
    ) -> FloatTensor<Self> {
        let ctx = query.ctx.clone();
        let op = "attention";
        let query_held = full_inner(query, op);
        let key_held = full_inner(key, op);
        let value_held = full_inner(value, op);
        let attn_bias_held = opt_full(attn_bias, op);
        let out = B::attention(
            query_held.get(),
            key_held.get(),
            value_held.get(),
            mask,
            opt_get(&attn_bias_held),
            options,
        );
        local(&ctx, out)
    }

    fn rfft(
        signal: FloatTensor<Self>,
        dim: usize,
        n: Option<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let ctx = signal.ctx.clone();
        let signal = full_inner(signal, "rfft");
        let (re, im) = B::rfft(signal.get(), dim, n);
        (local(&ctx, re), local(&ctx, im))
    }

    fn irfft(
        spectrum_re: FloatTensor<Self>,
        spectrum_im: FloatTensor<Self>,
        dim: usize,
        n: Option<usize>,
    ) -> FloatTensor<Self> {
        let ctx = spectrum_re.ctx.clone();
        let op = "irfft";
        let spectrum_re_held = full_inner(spectrum_re, op);
        let spectrum_im_held = full_inner(spectrum_im, op);
        local(
            &ctx,
            B::irfft(spectrum_re_held.get(), spectrum_im_held.get(), dim, n),
        )
    }
}
