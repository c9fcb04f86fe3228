use super::{binary, full_inner, full_layout, full_op, gathered, reshaped, unary, Float};
use crate::backend::device::RtpDevice;
use crate::backend::rtp::Rtp;
use crate::backend::tensor::RtpTensor;
use crate::comm::collectives::all_reduce_sum;
use crate::error::{raise, RtpError};
use crate::state::shard_io::ShardIo;
use crate::state::sharding::Layout;
use crate::state::sharding::{flyweight_random, shard_range, slice_last_dim, ShardSpec};
use burn::tensor::backend::{Backend, ExecutionError};
use burn::tensor::ops::{BoolTensor, FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{
    BoolDType, Distribution, FloatDType, IntDType, Scalar, Shape, Slice, TensorData, TensorMetadata,
};
use burn_rtp_kernels::RotationKernels;
use std::sync::Arc;

/// How a tensor created on `device` is placed: a parameter (inside persistent allocation) is
/// sharded or replicated by the placement policy; anything else is local.
enum Creation {
    Local,
    Replicated,
    Sharded(ShardSpec),
}

fn creation<B: Backend>(device: &RtpDevice<B>, shape: &Shape) -> Creation {
    let ctx = &device.ctx;
    if !ctx.persistent() {
        return Creation::Local;
    }
    match ctx.param_spec(shape) {
        Some(spec) => Creation::Sharded(spec),
        None => Creation::Replicated,
    }
}

/// Creates a tensor: `make(shape)` builds an inner tensor of the given (shard) shape.
fn create<B: Backend>(
    device: &RtpDevice<B>,
    shape: Shape,
    make: impl FnOnce(Shape) -> Float<B>,
) -> RtpTensor<B> {
    let ctx = device.ctx.clone();
    match creation(device, &shape) {
        Creation::Local => RtpTensor::new(ctx, make(shape), Layout::Local),
        Creation::Replicated => RtpTensor::new(ctx, make(shape), Layout::Replicated),
        Creation::Sharded(spec) => {
            let inner = make(spec.shard_shape(ctx.comm.rank));
            RtpTensor::new(ctx, inner, Layout::Sharded(spec))
        }
    }
}

/// While loading shards, data shaped like a saved shard becomes this rank's shard again.
fn load_saved_shard<B: Backend>(device: &RtpDevice<B>, data: &TensorData) -> Option<RtpTensor<B>> {
    let ctx = &device.ctx;
    let shape = data.shape.to_vec();
    let layout = ctx.shard_io.with(|io| {
        let ShardIo::Loading(map) = io else {
            return Ok(None);
        };
        if let Some(full) = map.full_of(&shape) {
            let spec = ShardSpec {
                full: Shape::from(full.clone()),
                world: ctx.comm.world_size,
            };
            if spec.shard_shape(ctx.comm.rank).to_vec() != shape {
                return Err(RtpError::ShardMap {
                    rank: ctx.comm.rank,
                    op: "load_shards".into(),
                    reason: format!(
                        "the checkpoint has a shard of shape {shape:?} of {full:?}, but this \
                         rank's shard of {full:?} in a world of {} is {:?}",
                        ctx.comm.world_size,
                        spec.shard_shape(ctx.comm.rank).to_vec()
                    ),
                });
            }
            Ok(Some(Layout::Sharded(spec)))
        } else if map.replicated.contains(&shape) {
            Ok(Some(Layout::Replicated))
        } else {
            Ok(None)
        }
    });
    let layout = layout.unwrap_or_else(|e| raise(e))?;
    let inner = B::float_from_data(data.clone(), &ctx.comm.inner);
    Some(RtpTensor::new(ctx.clone(), inner, layout))
}

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

fn last_index(t: &RtpTensor<impl Backend>) -> usize {
    t.shape().num_dims() - 1
}

/// Reduction along `dim`: shard-local unless `dim` is the sharded one, which is all-reduced.
fn reduce_dim<B: Backend>(
    t: RtpTensor<B>,
    dim: usize,
    op: &'static str,
    mean: bool,
) -> RtpTensor<B> {
    let mut full = t.shape();
    full[dim] = 1;
    match t.layout.clone() {
        Layout::Sharded(spec) if dim != last_index(&t) => {
            let inner = if mean {
                B::float_mean_dim(t.inner.clone(), dim)
            } else {
                B::float_sum_dim(t.inner.clone(), dim)
            };
            t.derive(inner, Layout::Sharded(spec.with_full(full)))
        }
        Layout::Sharded(spec) => {
            let ctx = t.ctx.clone();
            let partial = B::float_sum_dim(t.inner.clone(), dim);
            let mut summed = all_reduce_sum(&ctx.comm, op, partial);
            if mean {
                summed = B::float_div_scalar(summed, Scalar::Float(spec.last() as f64));
            }
            RtpTensor::new(ctx, summed, Layout::Local)
        }
        layout => {
            let inner = if mean {
                B::float_mean_dim(t.inner.clone(), dim)
            } else {
                B::float_sum_dim(t.inner.clone(), dim)
            };
            t.derive(inner, layout)
        }
    }
}

/// Cumulative op along `dim`: shard-local unless it runs along the sharded dimension.
fn along<B: Backend>(
    t: RtpTensor<B>,
    dim: usize,
    op: &'static str,
    f: impl FnOnce(Float<B>) -> Float<B>,
) -> RtpTensor<B> {
    if matches!(t.layout, Layout::Sharded(_)) && dim == last_index(&t) {
        full_op(t, op, f)
    } else {
        unary(t, f)
    }
}

macro_rules! unary_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
            unary(tensor, B::$name)
        })*
    };
}

macro_rules! scalar_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Self>, rhs: Scalar) -> FloatTensor<Self> {
            unary(lhs, |t| B::$name(t, rhs))
        })*
    };
}

macro_rules! binary_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
            binary(stringify!($name), lhs, rhs, B::$name)
        })*
    };
}

macro_rules! compare_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>, out_dtype: BoolDType) -> BoolTensor<Self> {
            let l = full_inner(lhs, stringify!($name));
            let r = full_inner(rhs, stringify!($name));
            B::$name(l.get(), r.get(), out_dtype)
        })*
    };
}

macro_rules! compare_elem_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Self>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Self> {
            full_inner(lhs, stringify!($name)).consume(|l| B::$name(l, rhs, out_dtype))
        })*
    };
}

macro_rules! along_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
            along(tensor, dim, stringify!($name), |t| B::$name(t, dim))
        })*
    };
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
        create(device, shape, |s| B::float_zeros(s, &inner, dtype))
    }

    fn float_ones(shape: Shape, device: &RtpDevice<B>, dtype: FloatDType) -> FloatTensor<Self> {
        let inner = device.ctx.comm.inner.clone();
        create(device, shape, |s| B::float_ones(s, &inner, dtype))
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
        create(device, shape, |s| B::float_empty(s, &inner, dtype))
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
        full_binary("float_matmul", lhs, rhs, B::float_matmul)
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
        float_lower_equal
    );

    compare_elem_ops!(
        float_equal_elem,
        float_greater_elem,
        float_greater_equal_elem,
        float_lower_elem,
        float_lower_equal_elem,
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
}
