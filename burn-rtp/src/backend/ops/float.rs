//! Float ops: each runs on the inner tensors with the layout rules of `ops/mod.rs`. Every op
//! of Burn's `FloatTensorOps` that the inner backend may implement is forwarded to it, so
//! that none falls back to Burn's default composition (slower, and for `prod` inexact: it is
//! `exp(sum(log x))`); `tests/forwarding.rs` keeps that list complete.

use super::creation::{create, creation, load_saved_shard, Creation};
use super::reduce::{along, last_index, mean_all, reduce_dim, reduce_dim_with};
use super::{binary, check_same_rank, full_inner, full_layout, full_op, gathered, reshaped};
use super::{unary, Float};
use crate::backend::device::RtpDevice;
use crate::backend::rtp::Rtp;
use crate::backend::tensor::RtpTensor;
use crate::comm::collectives::all_reduce_sum;
use crate::error::{raise, RtpError};
use crate::state::shard_io::ShardIo;
use crate::state::sharding::Layout;
use crate::state::sharding::{flyweight_random, shard_range, slice_last_dim};
use burn::tensor::backend::{Backend, ExecutionError};
use burn::tensor::ops::GridSampleOptions;
use burn::tensor::ops::{BoolTensor, FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{
    BoolDType, Distribution, FloatDType, IndexingUpdateOp, IntDType, Scalar, Shape, Slice,
    TensorData, TensorMetadata,
};
use burn_rtp_kernels::RotationKernels;
use std::sync::Arc;

fn full_binary<B: Backend>(
    op: &'static str,
    lhs: RtpTensor<B>,
    rhs: RtpTensor<B>,
    f: impl FnOnce(Float<B>, Float<B>) -> Float<B>,
) -> RtpTensor<B> {
    let ctx = lhs.ctx.clone();
    let (l, lr) = gathered(lhs, op);
    let (r, rr) = gathered(rhs, op);
    let layout = full_layout(lr && rr);
    l.consume(|l| r.consume(|r| RtpTensor::new(ctx, f(l, r), layout)))
}

impl<B: RotationKernels> FloatTensorOps<Self> for Rtp<B> {
    fn float_from_data(data: TensorData, device: &RtpDevice<B>) -> FloatTensor<Self> {
        let shape = data.shape.clone();
        let ctx = device.ctx.clone();
        if let Some(tensor) = load_saved_shard(device, &data) {
            return tensor;
        }
        match creation(device, &shape) {
            Creation::Local => RtpTensor::new(
                ctx.clone(),
                B::float_from_data(data, &ctx.comm.inner),
                Layout::Local,
            ),
            Creation::Replicated => RtpTensor::new(
                ctx.clone(),
                B::float_from_data(data, &ctx.comm.inner),
                Layout::Replicated,
            ),
            Creation::Sharded(spec) => {
                // Slice on the host before upload: the full tensor never reaches the device.
                let part = slice_last_dim(&data, spec.range(ctx.comm.rank));
                drop(data);
                RtpTensor::new(
                    ctx.clone(),
                    B::float_from_data(part, &ctx.comm.inner),
                    Layout::Sharded(spec),
                )
            }
        }
    }

    fn float_random(
        shape: Shape,
        distribution: Distribution,
        device: &RtpDevice<B>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        let ctx = device.ctx.clone();
        let creation = creation(device, &shape);
        if matches!(creation, Creation::Local) {
            let inner = B::float_random(shape, distribution, &ctx.comm.inner, dtype);
            return RtpTensor::new(ctx, inner, Layout::Local);
        }
        // Flyweight init: draw only this rank's elements, from a stream every rank agrees on.
        let stream = ctx.next_param_stream();
        let last = shape[shape.num_dims() - 1];
        let (range, layout) = match creation {
            Creation::Sharded(spec) => (spec.range(ctx.comm.rank), Layout::Sharded(spec)),
            _ => (shard_range(last, 1, 0), Layout::Replicated),
        };
        let data = flyweight_random(
            &shape,
            range,
            distribution,
            ctx.seed(),
            stream,
            dtype.into(),
        );
        RtpTensor::new(
            ctx.clone(),
            B::float_from_data(data, &ctx.comm.inner),
            layout,
        )
    }

    fn float_zeros(shape: Shape, device: &RtpDevice<B>, dtype: FloatDType) -> FloatTensor<Self> {
        let inner = device.ctx.comm.inner.clone();
        create(device, shape, |s| B::filled(s, 0.0, &inner, dtype))
    }

    fn float_ones(shape: Shape, device: &RtpDevice<B>, dtype: FloatDType) -> FloatTensor<Self> {
        let inner = device.ctx.comm.inner.clone();
        create(device, shape, |s| B::filled(s, 1.0, &inner, dtype))
    }

    fn float_full(
        shape: Shape,
        fill_value: Scalar,
        device: &RtpDevice<B>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        let inner = device.ctx.comm.inner.clone();
        create(device, shape, |s| {
            B::float_full(s, fill_value, &inner, dtype)
        })
    }

    fn float_empty(shape: Shape, device: &RtpDevice<B>, dtype: FloatDType) -> FloatTensor<Self> {
        let inner = device.ctx.comm.inner.clone();
        create(device, shape, |s| B::filled(s, 0.0, &inner, dtype))
    }

    async fn float_into_data(tensor: FloatTensor<Self>) -> Result<TensorData, ExecutionError> {
        let saving = tensor.ctx.shard_io.with(|io| match &tensor.layout {
            Layout::Sharded(spec) if matches!(io, ShardIo::Saving { .. }) => {
                io.note_shard(tensor.inner.shape().to_vec(), spec.full.to_vec());
                true
            }
            Layout::Replicated => {
                io.note_replicated(tensor.inner.shape().to_vec());
                false
            }
            _ => false,
        });
        let data = if saving {
            tensor.inner
        } else {
            full_inner(tensor, "float_into_data").release()
        };
        B::float_into_data(data).await
    }

    fn float_device(tensor: &FloatTensor<Self>) -> RtpDevice<B> {
        RtpDevice {
            ctx: tensor.ctx.clone(),
        }
    }

    fn float_to_device(tensor: FloatTensor<Self>, device: &RtpDevice<B>) -> FloatTensor<Self> {
        if !Arc::ptr_eq(&tensor.ctx, &device.ctx) {
            raise(RtpError::CrossRank {
                rank: tensor.ctx.comm.rank,
                target: format!("{device:?}"),
            });
        }
        let inner = device.ctx.comm.inner.clone();
        unary(tensor, |t| B::float_to_device(t, &inner))
    }

    fn float_into_int(tensor: FloatTensor<Self>, out_dtype: IntDType) -> IntTensor<Self> {
        full_inner(tensor, "float_into_int").consume(|t| B::float_into_int(t, out_dtype))
    }

    binary_ops!(
        float_add,
        float_sub,
        float_mul,
        float_div,
        float_remainder,
        float_powf,
        float_atan2
    );

    scalar_ops!(
        float_add_scalar,
        float_sub_scalar,
        float_mul_scalar,
        float_div_scalar,
        float_remainder_scalar,
        float_powf_scalar_impl,
        float_powf_scalar,
        float_powi_scalar,
        float_powi_scalar_impl,
    );

    unary_ops!(
        float_recip,
        float_exp,
        float_log,
        float_log1p,
        float_sqrt,
        float_abs,
        float_cos,
        float_sin,
        float_tan,
        float_cosh,
        float_sinh,
        float_tanh,
        float_acos,
        float_acosh,
        float_asin,
        float_asinh,
        float_atan,
        float_atanh,
        float_round,
        float_floor,
        float_ceil,
        float_trunc,
        float_erf,
        float_sign,
    );

    fn float_clamp(tensor: FloatTensor<Self>, min: Scalar, max: Scalar) -> FloatTensor<Self> {
        unary(tensor, |t| B::float_clamp(t, min, max))
    }

    fn float_clamp_min(tensor: FloatTensor<Self>, min: Scalar) -> FloatTensor<Self> {
        unary(tensor, |t| B::float_clamp_min(t, min))
    }

    fn float_clamp_max(tensor: FloatTensor<Self>, max: Scalar) -> FloatTensor<Self> {
        unary(tensor, |t| B::float_clamp_max(t, max))
    }

    fn float_neg(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        unary(tensor, B::float_neg)
    }

    fn float_cast(tensor: FloatTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        unary(tensor, |t| B::float_cast(t, dtype))
    }

    fn float_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        full_binary("float_matmul", lhs, rhs, B::fused_matmul)
    }

    fn float_cross(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        dim: usize,
    ) -> FloatTensor<Self> {
        full_binary("float_cross", lhs, rhs, |l, r| B::float_cross(l, r, dim))
    }

    fn float_swap_dims(tensor: FloatTensor<Self>, dim1: usize, dim2: usize) -> FloatTensor<Self> {
        let last = last_index(&tensor);
        let mut shape = tensor.shape();
        shape.swap(dim1, dim2);
        let keeps = dim1 == dim2 || (dim1 != last && dim2 != last);
        reshaped(tensor, "float_swap_dims", shape, keeps, |t, _| {
            B::float_swap_dims(t, dim1, dim2)
        })
    }

    fn float_permute(tensor: FloatTensor<Self>, axes: &[usize]) -> FloatTensor<Self> {
        let last = last_index(&tensor);
        let old = tensor.shape();
        let shape = Shape::from(axes.iter().map(|&a| old[a]).collect::<Vec<_>>());
        let keeps = axes[last] == last;
        reshaped(tensor, "float_permute", shape, keeps, |t, _| {
            B::float_permute(t, axes)
        })
    }

    fn float_flip(tensor: FloatTensor<Self>, axes: &[usize]) -> FloatTensor<Self> {
        let last = last_index(&tensor);
        let shape = tensor.shape();
        let keeps = !axes.contains(&last);
        reshaped(tensor, "float_flip", shape, keeps, |t, _| {
            B::float_flip(t, axes)
        })
    }

    fn float_reshape(tensor: FloatTensor<Self>, shape: Shape) -> FloatTensor<Self> {
        reshaped(tensor, "float_reshape", shape.clone(), true, |t, shard| {
            B::float_reshape(t, shard.unwrap_or(shape))
        })
    }

    fn float_expand(tensor: FloatTensor<Self>, shape: Shape) -> FloatTensor<Self> {
        reshaped(tensor, "float_expand", shape.clone(), true, |t, shard| {
            B::float_expand(t, shard.unwrap_or(shape))
        })
    }

    fn float_gather(
        dim: usize,
        tensor: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        full_op(tensor, "float_gather", |t| B::float_gather(dim, t, indices))
    }

    fn float_scatter_add(
        dim: usize,
        tensor: FloatTensor<Self>,
        indices: IntTensor<Self>,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        full_binary("float_scatter_add", tensor, value, |t, v| {
            B::float_scatter_add(dim, t, indices, v)
        })
    }

    fn float_select(
        tensor: FloatTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        full_op(tensor, "float_select", |t| B::float_select(t, dim, indices))
    }

    fn float_select_add(
        tensor: FloatTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        full_binary("float_select_add", tensor, value, |t, v| {
            B::float_select_add(t, dim, indices, v)
        })
    }

    fn float_slice(tensor: FloatTensor<Self>, slices: &[Slice]) -> FloatTensor<Self> {
        full_op(tensor, "float_slice", |t| B::float_slice(t, slices))
    }

    fn float_slice_assign(
        tensor: FloatTensor<Self>,
        slices: &[Slice],
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        full_binary("float_slice_assign", tensor, value, |t, v| {
            B::float_slice_assign(t, slices, v)
        })
    }

    fn float_mask_where(
        tensor: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        full_binary("float_mask_where", tensor, value, |t, v| {
            B::float_mask_where(t, mask, v)
        })
    }

    fn float_mask_fill(
        tensor: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        value: Scalar,
    ) -> FloatTensor<Self> {
        full_op(tensor, "float_mask_fill", |t| {
            B::float_mask_fill(t, mask, value)
        })
    }

    compare_ops!(
        float_equal,
        float_greater,
        float_greater_equal,
        float_lower,
        float_lower_equal,
        float_not_equal,
    );

    compare_elem_ops!(
        float_equal_elem,
        float_greater_elem,
        float_greater_equal_elem,
        float_lower_elem,
        float_lower_equal_elem,
        float_not_equal_elem,
    );

    fn float_sum(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        match tensor.layout.clone() {
            Layout::Sharded(_) => {
                let ctx = tensor.ctx.clone();
                let partial = B::float_sum(tensor.inner.clone());
                RtpTensor::new(
                    ctx.clone(),
                    all_reduce_sum(&ctx.comm, "float_sum", partial),
                    Layout::Local,
                )
            }
            layout => {
                let inner = B::float_sum(tensor.inner.clone());
                tensor.derive(inner, layout)
            }
        }
    }

    fn float_sum_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        reduce_dim(tensor, dim, "float_sum_dim", false)
    }

    fn float_mean_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        reduce_dim(tensor, dim, "float_mean_dim", true)
    }

    along_ops!(float_cumsum, float_cumprod, float_cummin, float_cummax);

    fn float_argmax(tensor: FloatTensor<Self>, dim: usize, out_dtype: IntDType) -> IntTensor<Self> {
        full_inner(tensor, "float_argmax").consume(|t| B::float_argmax(t, dim, out_dtype))
    }

    fn float_argtopk(
        tensor: FloatTensor<Self>,
        dim: usize,
        k: usize,
        out_dtype: IntDType,
    ) -> IntTensor<Self> {
        full_inner(tensor, "float_argtopk").consume(|t| B::float_argtopk(t, dim, k, out_dtype))
    }

    fn float_argmin(tensor: FloatTensor<Self>, dim: usize, out_dtype: IntDType) -> IntTensor<Self> {
        full_inner(tensor, "float_argmin").consume(|t| B::float_argmin(t, dim, out_dtype))
    }

    fn float_unfold(
        tensor: FloatTensor<Self>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> FloatTensor<Self> {
        full_op(tensor, "float_unfold", |t| {
            B::float_unfold(t, dim, size, step)
        })
    }

    fn float_mean(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        mean_all(tensor)
    }

    whole_ops!(float_prod, float_max, float_min, float_max_abs);

    reduce_dim_ops!(
        float_prod_dim,
        float_max_dim,
        float_min_dim,
        float_max_abs_dim
    );

    to_bool_ops!(
        float_any(out_dtype: BoolDType),
        float_any_dim(dim: usize, out_dtype: BoolDType),
        float_all(out_dtype: BoolDType),
        float_all_dim(dim: usize, out_dtype: BoolDType),
        float_is_nan(out_dtype: BoolDType),
        float_is_inf(out_dtype: BoolDType),
    );

    // The indices are an int tensor, which has no layout: the operand is whole.
    fn float_max_dim_with_indices(
        tensor: FloatTensor<Self>,
        dim: usize,
        indices_dtype: IntDType,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        with_indices(tensor, "float_max_dim_with_indices", |t| {
            B::float_max_dim_with_indices(t, dim, indices_dtype)
        })
    }

    fn float_min_dim_with_indices(
        tensor: FloatTensor<Self>,
        dim: usize,
        indices_dtype: IntDType,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        with_indices(tensor, "float_min_dim_with_indices", |t| {
            B::float_min_dim_with_indices(t, dim, indices_dtype)
        })
    }

    fn float_sort_with_indices(
        tensor: FloatTensor<Self>,
        dim: usize,
        descending: bool,
        indices_dtype: IntDType,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        with_indices(tensor, "float_sort_with_indices", |t| {
            B::float_sort_with_indices(t, dim, descending, indices_dtype)
        })
    }

    fn float_sort(tensor: FloatTensor<Self>, dim: usize, descending: bool) -> FloatTensor<Self> {
        full_op(tensor, "float_sort", |t| B::float_sort(t, dim, descending))
    }

    fn float_argsort(
        tensor: FloatTensor<Self>,
        dim: usize,
        descending: bool,
        out_dtype: IntDType,
    ) -> IntTensor<Self> {
        full_inner(tensor, "float_argsort")
            .consume(|t| B::float_argsort(t, dim, descending, out_dtype))
    }

    fn float_topk(tensor: FloatTensor<Self>, dim: usize, k: usize) -> FloatTensor<Self> {
        full_op(tensor, "float_topk", |t| B::float_topk(t, dim, k))
    }

    fn float_powi(lhs: FloatTensor<Self>, rhs: IntTensor<Self>) -> FloatTensor<Self> {
        full_op(lhs, "float_powi", |t| B::float_powi(t, rhs))
    }

    fn float_transpose(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        let dims = tensor.shape().num_dims();
        if dims < 2 {
            return tensor;
        }
        Self::float_swap_dims(tensor, dims - 2, dims - 1)
    }

    fn float_repeat_dim(tensor: FloatTensor<Self>, dim: usize, times: usize) -> FloatTensor<Self> {
        let keeps = dim != last_index(&tensor);
        let mut shape = tensor.shape();
        shape[dim] *= times;
        reshaped(tensor, "float_repeat_dim", shape, keeps, |t, _| {
            B::float_repeat_dim(t, dim, times)
        })
    }

    // Burn's default is one slice-assign per input into an empty tensor; the inner backend's
    // concatenation is one pass (DDP's gradient buckets are assembled with it).
    fn float_cat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        let ctx = tensors[0].ctx.clone();
        for t in &tensors[1..] {
            check_same_rank("float_cat", &ctx, &t.ctx);
        }
        let held: Vec<_> = tensors
            .into_iter()
            .map(|t| gathered(t, "float_cat"))
            .collect();
        let replicated = held.iter().all(|(_, r)| *r);
        let out = B::float_cat(held.iter().map(|(h, _)| h.get()).collect(), dim);
        drop(held);
        RtpTensor::new(ctx, out, full_layout(replicated))
    }

    fn float_gather_nd(data: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        full_op(data, "float_gather_nd", |t| B::float_gather_nd(t, indices))
    }

    fn float_scatter_nd(
        data: FloatTensor<Self>,
        indices: IntTensor<Self>,
        values: FloatTensor<Self>,
        reduction: IndexingUpdateOp,
    ) -> FloatTensor<Self> {
        full_binary("float_scatter_nd", data, values, |d, v| {
            B::float_scatter_nd(d, indices, v, reduction)
        })
    }

    fn float_grid_sample_2d(
        tensor: FloatTensor<Self>,
        grid: FloatTensor<Self>,
        options: GridSampleOptions,
    ) -> FloatTensor<Self> {
        full_binary("float_grid_sample_2d", tensor, grid, |t, g| {
            B::float_grid_sample_2d(t, g, options)
        })
    }

    // Autodiff sits above the decorator: below it nothing tracks gradients, so Burn's
    // defaults (identity, and `false`) are right for `float_detach`,
    // `float_set_require_grad` and `float_is_require_grad`.
}

/// An op whose result comes with int indices (which have no layout): the operand is whole,
/// gathered if it is a shard, and the values are per-rank (or replicated, if it was).
fn with_indices<B: RotationKernels>(
    tensor: RtpTensor<B>,
    op: &'static str,
    f: impl FnOnce(Float<B>) -> (Float<B>, burn::tensor::ops::IntTensor<B>),
) -> (RtpTensor<B>, burn::tensor::ops::IntTensor<B>) {
    let ctx = tensor.ctx.clone();
    let (full, replicated) = gathered(tensor, op);
    let (values, indices) = full.consume(f);
    (
        RtpTensor::new(ctx, values, full_layout(replicated)),
        indices,
    )
}
