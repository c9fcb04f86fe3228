//! The backend traits of [`Rtp`](crate::Rtp), split by op family like `burn-autodiff`.
//!
//! Forwarding is uniform: an op runs on the inner tensors and keeps the layout when it has a
//! shard-wise rule ([`unary`], [`binary`], [`reshaped`]), and otherwise gathers its sharded
//! operands first ([`gathered`]). The cleverness (rotation) lives in `linear.rs`,
//! `embedding.rs` and [`crate::comm::rotation`]; how each strategy uses a weight, in `weights.rs`.

/// Implements each listed method by calling `B`'s method of the same name with the same
/// arguments. Only for methods without a device or float operand, whose types are B's own
/// (int, bool and quantized tensors pass through); defined before the op modules use it.
macro_rules! forward {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;)*) => {
        $(fn $name($($arg: $ty),*) -> $ret {
            B::$name($($arg),*)
        })*
    };
}

// Before the modules that expand its macros (textual scope).
#[macro_use]
mod float_macros;

mod activation;
mod bool;
mod creation;
mod embedding;
mod float;
mod int;
mod linear;
mod module;
mod qtensor;
mod reduce;
mod route_choice;
mod routed;
mod transaction;
mod weights;

use crate::backend::gathers::small;
use crate::backend::rank::RankCtx;
use crate::backend::tensor::RtpTensor;
use crate::comm::collectives::all_gather;
use crate::error::{raise, RtpError};
use crate::state::accounting::Category;
use crate::state::accounting::Held;
use crate::state::sharding::Layout;
use crate::state::sharding::ShardRange;
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, TensorMetadata};
use std::sync::Arc;

pub(crate) use crate::state::accounting::Float;

/// The full inner tensor of `t`, still charged: gathered (a counted fallback, charged as
/// local memory) if it is sharded, else taken out of its wrapper with the wrapper's charge.
/// The flag says whether the tensor is replicated.
pub(crate) fn gathered<B: Backend>(t: RtpTensor<B>, op: &'static str) -> (Held<B>, bool) {
    match &t.layout {
        Layout::Sharded(_) => {
            t.ctx.note_fallback(op, &[t.dims()]);
            let ctx = t.ctx.clone();
            let layout = t.layout.clone();
            let source = t.held();
            if let Some(full) = ctx.fallback.kept.lock().unwrap().find(&source, &layout) {
                return (full, false);
            }
            let full = all_gather(&ctx.comm, &source, &layout, op, Category::Local);
            ctx.fallback
                .kept
                .lock()
                .unwrap()
                .keep(&source, &layout, &full);
            (full, false)
        }
        Layout::Replicated => (t.held(), true),
        Layout::Local => (t.held(), false),
    }
}

/// Layout of a result computed from full operands: replicated only if all inputs were.
pub(crate) fn full_layout(all_replicated: bool) -> Layout {
    if all_replicated {
        Layout::Replicated
    } else {
        Layout::Local
    }
}

/// Runs a shape-preserving elementwise op on the inner tensor; any layout is kept.
pub(crate) fn unary<B: Backend>(
    t: RtpTensor<B>,
    f: impl FnOnce(Float<B>) -> Float<B>,
) -> RtpTensor<B> {
    let layout = t.layout.clone();
    let (inner, rest) = t.take();
    rest.derive(f(inner), layout)
}

/// Runs an op that needs full operands: sharded inputs are gathered, the result is full.
pub(crate) fn full_op<B: Backend>(
    t: RtpTensor<B>,
    op: &'static str,
    f: impl FnOnce(Float<B>) -> Float<B>,
) -> RtpTensor<B> {
    let ctx = t.ctx.clone();
    let (full, replicated) = gathered(t, op);
    full.consume(|x| RtpTensor::new(ctx, f(x), full_layout(replicated)))
}

/// The full inner tensor of `t` for an op that reads it, charged while the `Held` lives.
pub(crate) fn full_inner<B: Backend>(t: RtpTensor<B>, op: &'static str) -> Held<B> {
    gathered(t, op).0
}

/// Broadcast output shape of two logical shapes (right-aligned, like Burn).
fn broadcast(a: &Shape, b: &Shape) -> Shape {
    let n = a.num_dims().max(b.num_dims());
    let pad = |s: &Shape| -> Vec<usize> {
        let mut v = vec![1; n - s.num_dims()];
        v.extend_from_slice(s.as_slice());
        v
    };
    let (a, b) = (pad(a), pad(b));
    Shape::from(a.iter().zip(&b).map(|(x, y)| *x.max(y)).collect::<Vec<_>>())
}

fn last_dim(s: &Shape) -> usize {
    s.last().copied().unwrap_or(1)
}

fn slice_columns<B: Backend>(t: Float<B>, range: ShardRange) -> Float<B> {
    burn_rtp_kernels::column_slice::<B>(t, range.start, range.len)
}

const MIX_HINT: &str = "If it is a gradient, the optimizer must be wrapped with \
`burn_rtp::RtpOptimizer`, which averages such gradients over ranks and shards them; \
if it is data, reshape it so that it broadcasts against the parameter.";

fn ambiguous<B: Backend>(ctx: &RankCtx<B>, op: &str, layout: &Layout, shape: &Shape) -> ! {
    raise(RtpError::AmbiguousMix {
        rank: ctx.comm.rank,
        op: op.to_string(),
        layout: layout.name().to_string(),
        shape: shape.to_vec(),
        hint: MIX_HINT.to_string(),
    })
}

pub(crate) fn check_same_rank<B: Backend>(op: &str, a: &Arc<RankCtx<B>>, b: &Arc<RankCtx<B>>) {
    if !Arc::ptr_eq(a, b) {
        raise(RtpError::MixedRanks {
            rank: a.comm.rank,
            op: op.to_string(),
            other: b.comm.rank,
            other_world: b.comm.world_id,
        });
    }
}

/// Elementwise binary op with broadcasting; the layout rules of the decorator:
///
/// * local or replicated with each other: computed as is (replicated only if both are);
/// * two shards of the same split: shard-local;
/// * a shard with a replicated tensor that broadcasts along the last dimension: shard-local;
/// * a shard with a replicated tensor: the replicated one is sliced to the shard;
/// * a shard or replicated tensor with a same-shape local tensor: an error, because that is
///   what an un-averaged gradient meeting its parameter looks like (a sum of a shard and a
///   same-shape local tensor is gathered instead: see `sharded_with_full`);
/// * otherwise the shard is gathered (a counted fallback).
pub(crate) fn binary<B: Backend>(
    op: &'static str,
    lhs: RtpTensor<B>,
    rhs: RtpTensor<B>,
    f: impl FnOnce(Float<B>, Float<B>) -> Float<B>,
) -> RtpTensor<B> {
    check_same_rank(op, &lhs.ctx, &rhs.ctx);
    let (ls, rs) = (lhs.shape(), rhs.shape());
    let out = broadcast(&ls, &rs);
    match (&lhs.layout, &rhs.layout) {
        (Layout::Local, Layout::Local) | (Layout::Replicated, Layout::Replicated) => {
            let layout = lhs.layout.clone();
            let (inner, rest) = lhs.take();
            rest.derive(f(inner, rhs.inner), layout)
        }
        (Layout::Replicated, Layout::Local) | (Layout::Local, Layout::Replicated) => {
            if ls == rs {
                let layout = if lhs.layout == Layout::Local {
                    &rhs.layout
                } else {
                    &lhs.layout
                };
                ambiguous(&lhs.ctx, op, layout, &ls);
            }
            let (inner, rest) = lhs.take();
            rest.derive(f(inner, rhs.inner), Layout::Local)
        }
        (Layout::Sharded(a), Layout::Sharded(b)) if a.world == b.world && a.last() == b.last() => {
            let spec = a.with_full(out);
            let (inner, rest) = lhs.take();
            rest.derive(f(inner, rhs.inner), Layout::Sharded(spec))
        }
        (Layout::Sharded(_), Layout::Sharded(_)) => {
            let ctx = lhs.ctx.clone();
            ctx.note_fallback(op, &[ls.to_vec(), rs.to_vec()]);
            let (l, _) = gathered(lhs, op);
            let (r, _) = gathered(rhs, op);
            l.consume(|l| r.consume(|r| RtpTensor::new(ctx, f(l, r), Layout::Local)))
        }
        (Layout::Sharded(spec), _) => {
            let spec = spec.clone();
            sharded_with_full(op, lhs, rhs, spec, out, f)
        }
        (_, Layout::Sharded(spec)) => {
            let spec = spec.clone();
            sharded_with_full(op, rhs, lhs, spec, out, |s, o| f(o, s))
        }
    }
}

fn sharded_with_full<B: Backend>(
    op: &'static str,
    shard: RtpTensor<B>,
    other: RtpTensor<B>,
    spec: crate::state::sharding::ShardSpec,
    out: Shape,
    f: impl FnOnce(Float<B>, Float<B>) -> Float<B>,
) -> RtpTensor<B> {
    let ctx = shard.ctx.clone();
    let os = other.shape();
    let out_spec = spec.with_full(out.clone());
    // Broadcasting along the columns keeps a shard a shard only if the other operand is the
    // same on every rank: a local one (per-rank data) would make the "shard" differ by rank.
    if last_dim(&os) == 1 && last_dim(&out) == spec.last() && other.layout == Layout::Replicated {
        let (inner, rest) = shard.take();
        return rest.derive(f(inner, other.inner), Layout::Sharded(out_spec));
    }
    if other.layout == Layout::Replicated && last_dim(&os) == spec.last() {
        let part = slice_columns::<B>(other.inner, spec.range(ctx.comm.rank));
        let (inner, rest) = shard.take();
        return rest.derive(f(inner, part), Layout::Sharded(out_spec));
    }
    // A same-shape local tensor meeting a shard is what an un-averaged gradient meeting its
    // parameter looks like, which is an error; except in a sum, where the gathered result is
    // right either way: for per-rank data it is the per-rank value, and for two gradient
    // contributions of one parameter (a tied embedding's rotated and gathered uses) its mean
    // over ranks, which RtpOptimizer takes, is the sum of the two averaged contributions.
    if os == shard.shape() && op != "float_add" {
        ambiguous(&ctx, op, &shard.layout, &os);
    }
    let (full, _) = gathered(shard, op);
    let other = other.held();
    full.consume(|s| other.consume(|o| RtpTensor::new(ctx, f(s, o), Layout::Local)))
}

/// Shape-changing op that keeps the last dimension (reshape, expand, moving other axes):
/// a shard stays a shard with the new logical shape.
pub(crate) fn reshaped<B: Backend>(
    t: RtpTensor<B>,
    op: &'static str,
    new_full: Shape,
    keeps_last: bool,
    f: impl FnOnce(Float<B>, Option<Shape>) -> Float<B>,
) -> RtpTensor<B> {
    match t.layout.clone() {
        Layout::Sharded(spec) if keeps_last && last_dim(&new_full) == spec.last() => {
            let new_spec = spec.with_full(new_full);
            let shard_shape = new_spec.shard_shape(t.ctx.comm.rank);
            let inner = f(t.inner.clone(), Some(shard_shape));
            if small(&t.layout, t.dtype().size()) {
                // A small parameter's reshapes share its identity, so that a kept gather of
                // it is found again (see `backend::gathers`).
                return t.view(inner, Layout::Sharded(new_spec));
            }
            t.derive(inner, Layout::Sharded(new_spec))
        }
        Layout::Sharded(_) => full_op(t, op, |x| f(x, None)),
        layout => {
            let (inner, rest) = t.take();
            rest.derive(f(inner, None), layout)
        }
    }
}
