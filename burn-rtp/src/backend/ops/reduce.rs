//! Reductions and scans along one dimension: shard-local unless they run along the sharded
//! (last) dimension, where the shards are all-reduced or gathered.

use super::{full_op, unary, Float};
use crate::backend::tensor::RtpTensor;
use crate::comm::collectives::all_reduce_sum;
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use burn::tensor::{Scalar, TensorMetadata};

pub(super) fn last_index(t: &RtpTensor<impl Backend>) -> usize {
    t.shape().num_dims() - 1
}

/// Sum or mean along `dim`: shard-local unless `dim` is the sharded one, where the shards'
/// partial sums are all-reduced (no gather); otherwise as [`reduce_dim_with`].
pub(super) fn reduce_dim<B: Backend>(
    t: RtpTensor<B>,
    dim: usize,
    op: &'static str,
    mean: bool,
) -> RtpTensor<B> {
    match t.layout.clone() {
        Layout::Sharded(spec) if dim == last_index(&t) => {
            let ctx = t.ctx.clone();
            let partial = B::float_sum_dim(t.inner.clone(), dim);
            let mut summed = all_reduce_sum(&ctx.comm, op, partial);
            if mean {
                summed = B::float_div_scalar(summed, Scalar::Float(spec.last() as f64));
            }
            RtpTensor::new(ctx, summed, Layout::Local)
        }
        _ => reduce_dim_with(t, dim, op, |x| {
            if mean {
                B::float_mean_dim(x, dim)
            } else {
                B::float_sum_dim(x, dim)
            }
        }),
    }
}

/// Cumulative op along `dim`: shard-local unless it runs along the sharded dimension.
pub(super) fn along<B: Backend>(
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
/// Reduction along `dim` by the inner op `f` (product, max, min): shard-local unless `dim` is
/// the sharded one, where the shard is gathered first (these have no all-reduce of ours).
pub(super) fn reduce_dim_with<B: Backend>(
    t: RtpTensor<B>,
    dim: usize,
    op: &'static str,
    f: impl FnOnce(Float<B>) -> Float<B>,
) -> RtpTensor<B> {
    let mut full = t.shape();
    full[dim] = 1;
    match t.layout.clone() {
        Layout::Sharded(spec) if dim != last_index(&t) => {
            let inner = f(t.inner.clone());
            t.derive(inner, Layout::Sharded(spec.with_full(full)))
        }
        Layout::Sharded(_) => full_op(t, op, f),
        layout => {
            let inner = f(t.inner.clone());
            t.derive(inner, layout)
        }
    }
}

/// The mean of every element: a shard's partial sums are all-reduced, then divided by the
/// logical element count; any other layout runs the inner backend's own mean.
pub(super) fn mean_all<B: Backend>(t: RtpTensor<B>) -> RtpTensor<B> {
    match t.layout.clone() {
        Layout::Sharded(_) => {
            let ctx = t.ctx.clone();
            let count = t.shape().num_elements();
            let partial = B::float_sum(t.inner.clone());
            let summed = all_reduce_sum(&ctx.comm, "float_mean", partial);
            let mean = B::float_div_scalar(summed, Scalar::Float(count as f64));
            RtpTensor::new(ctx, mean, Layout::Local)
        }
        layout => {
            let inner = B::float_mean(t.inner.clone());
            t.derive(inner, layout)
        }
    }
}
