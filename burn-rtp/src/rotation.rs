//! The rotation schedule: how shards and travelling gradients move around the ring.
//!
//! Ranks form a ring; every message goes to rank `r + 1` and comes from rank `r - 1`.
//!
//! * [`rotate`]: at step `t` rank `r` holds shard `j = r - t` (a bundle of tensors, e.g. a
//!   weight shard and its bias shard) and runs `compute(j, bundle)`. After `N` steps every rank
//!   has seen every shard. Out-of-place mode posts the receive of the next shard before
//!   computing with the current one (double buffer); in-place mode computes, then swaps its
//!   single buffer with the neighbours.
//! * [`reduce_scatter`]: the travelling gradient. At step `t` rank `r` adds its contribution
//!   to shard `j = r - 1 - t` to the buffer that arrived from `r - 1` and passes it on. After
//!   `N` steps the buffer of shard `j` is back home on rank `j` holding `Σ_r contribution_r(j)`.
//!
//! Every rank issues the same messages in the same order, and each message carries a
//! [`Header`] the receiver checks, so diverged programs fail loudly instead of mixing data.

use crate::accounting::{Category, Charge};
use crate::collectives::from_payload;
use crate::collectives::{adopt, fence, send};
use crate::config::RotationMode;
use crate::timeline::IntervalKind;
use crate::transport::{Header, RecvHandle};
use crate::world::RankCtx;
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use std::sync::Arc;

type Float<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

fn bytes_of(shapes: &[Vec<usize>], elem: usize) -> usize {
    shapes
        .iter()
        .map(|s| s.iter().product::<usize>() * elem)
        .sum()
}

/// A shard bundle in flight, with the memory it occupies on this rank.
struct Buffer<B: Backend> {
    tensors: Vec<Float<B>>,
    _charge: Option<Arc<Charge>>,
}

/// Posted receives of one bundle.
struct Posted<B: Backend> {
    handles: Vec<Box<dyn RecvHandle<Float<B>>>>,
    charge: Arc<Charge>,
    posted: Option<std::time::Instant>,
}

fn headers(seq: u64, op: &'static str, j: usize, shapes: Vec<Vec<usize>>) -> Vec<Header> {
    let k = shapes.len();
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, shape)| Header {
            seq,
            op: op.into(),
            part: j * k + i,
            shape,
        })
        .collect()
}

fn post<B: Backend>(ctx: &RankCtx<B>, from: usize, expect: Vec<Header>, elem: usize) -> Posted<B> {
    let shapes: Vec<Vec<usize>> = expect.iter().map(|h| h.shape.clone()).collect();
    let charge = ctx
        .ledger
        .charge(Category::InFlight, bytes_of(&shapes, elem));
    let posted = ctx.timeline.start();
    let handles = expect
        .into_iter()
        .map(|h| ctx.check(ctx.transport.irecv(from, h)))
        .collect();
    Posted {
        handles,
        charge,
        posted,
    }
}

fn complete<B: Backend>(ctx: &RankCtx<B>, posted: Posted<B>) -> Buffer<B> {
    let received = posted
        .handles
        .into_iter()
        .map(|h| from_payload(ctx, ctx.check(h.wait())))
        .collect();
    ctx.timeline.finish(IntervalKind::Transfer, posted.posted);
    let tensors = adopt(ctx, received);
    Buffer {
        tensors,
        _charge: Some(posted.charge),
    }
}

/// Charges inner tensors that an op holds only briefly (partial results) as local memory.
pub(crate) fn transient<B: Backend>(ctx: &RankCtx<B>, tensors: &[Float<B>]) -> Arc<Charge> {
    let bytes = tensors
        .iter()
        .map(|t| t.shape().num_elements() * t.dtype().size())
        .sum();
    ctx.ledger.charge(Category::Local, bytes)
}

/// Runs one step's compute, recorded on the timeline.
fn timed<B: Backend, T>(ctx: &RankCtx<B>, f: impl FnOnce() -> T) -> T {
    let started = ctx.timeline.start();
    let out = f();
    ctx.timeline.finish(IntervalKind::Compute, started);
    out
}

fn send_bundle<B: Backend>(
    ctx: &RankCtx<B>,
    to: usize,
    seq: u64,
    op: &'static str,
    j: usize,
    bundle: &[Float<B>],
) {
    let shapes = bundle.iter().map(|t| t.shape().to_vec()).collect();
    for (h, t) in headers(seq, op, j, shapes).into_iter().zip(bundle) {
        send(ctx, to, h, t.clone());
    }
}

/// Shows every shard of a bundle to `compute`, in ring order; see the module docs.
///
/// `shapes_of(j)` is the shape of each tensor of shard `j`, as this rank expects it.
pub(crate) fn rotate<B: Backend>(
    ctx: &RankCtx<B>,
    op: &'static str,
    own: Vec<Float<B>>,
    shapes_of: impl Fn(usize) -> Vec<Vec<usize>>,
    mut compute: impl FnMut(usize, &[Float<B>]),
) {
    let (r, n) = (ctx.rank, ctx.world_size);
    let seq = ctx.next_seq();
    let elem = own.first().map(|t| t.dtype().size()).unwrap_or(4);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let mut cur = Buffer::<B> {
        tensors: own,
        _charge: None,
    };
    for t in 0..n {
        let j = (r + n - t) % n;
        let last = t + 1 == n;
        let incoming = (r + n - t - 1) % n;
        match ctx.config.rotation {
            RotationMode::OutOfPlace => {
                let posted = (!last).then(|| {
                    send_bundle(ctx, next, seq, op, j, &cur.tensors);
                    post(
                        ctx,
                        prev,
                        headers(seq, op, incoming, shapes_of(incoming)),
                        elem,
                    )
                });
                timed(ctx, || compute(j, &cur.tensors));
                if let Some(posted) = posted {
                    // The shard on hand is released below: its reads must be done first.
                    fence(ctx);
                    cur = complete(ctx, posted);
                }
            }
            RotationMode::InPlace => {
                timed(ctx, || compute(j, &cur.tensors));
                if !last {
                    send_bundle(ctx, next, seq, op, j, &cur.tensors);
                    drop(std::mem::take(&mut cur.tensors));
                    cur._charge = None;
                    let posted = post(
                        ctx,
                        prev,
                        headers(seq, op, incoming, shapes_of(incoming)),
                        elem,
                    );
                    cur = complete(ctx, posted);
                }
            }
        }
        verify_shapes(
            ctx,
            op,
            seq,
            prev,
            &cur.tensors,
            &shapes_of(if last { j } else { incoming }),
            last,
        );
    }
    fence(ctx);
}

fn verify_shapes<B: Backend>(
    ctx: &RankCtx<B>,
    op: &str,
    seq: u64,
    peer: usize,
    got: &[Float<B>],
    expected: &[Vec<usize>],
    skip: bool,
) {
    if skip {
        return;
    }
    let got: Vec<Vec<usize>> = got.iter().map(|t| t.shape().to_vec()).collect();
    if got != expected {
        crate::error::raise(crate::RtpError::Desync {
            rank: ctx.rank,
            peer,
            op: op.to_string(),
            seq,
            expected: format!("shapes {expected:?}"),
            got: format!("shapes {got:?}"),
        });
    }
}

/// Rotates `own` and builds a tensor from one column block per shard: `block(j, shard)` is
/// the block of shard `j`, and the blocks are concatenated in shard order along `dim`.
/// Blocks are charged as local memory while they wait to be assembled.
pub(crate) fn rotate_columns<B: Backend>(
    ctx: &RankCtx<B>,
    op: &'static str,
    own: Vec<Float<B>>,
    shapes_of: impl Fn(usize) -> Vec<Vec<usize>>,
    mut block: impl FnMut(usize, &[Float<B>]) -> Float<B>,
    dim: impl FnOnce(&Float<B>) -> usize,
) -> Float<B> {
    let n = ctx.world_size;
    let mut parts: Vec<Option<Float<B>>> = vec![None; n];
    let mut held: Vec<Arc<Charge>> = Vec::with_capacity(n);
    rotate(ctx, op, own, shapes_of, |j, shard| {
        let part = block(j, shard);
        held.push(transient::<B>(ctx, std::slice::from_ref(&part)));
        parts[j] = Some(part);
    });
    let parts: Vec<Float<B>> = parts
        .into_iter()
        .map(|p| p.unwrap_or_else(|| unreachable!("rank {}: `{op}` missed a shard", ctx.rank)))
        .collect();
    let dim = dim(&parts[0]);
    burn_rtp_kernels::assemble_columns::<B>(parts, dim)
}

/// Sums every rank's contribution to each shard and leaves shard `r` on rank `r`.
///
/// `contribution(j)` is this rank's part of shard `j` (a bundle); the result is this rank's
/// own shard summed over all ranks.
pub(crate) fn reduce_scatter<B: Backend>(
    ctx: &RankCtx<B>,
    op: &'static str,
    shapes_of: impl Fn(usize) -> Vec<Vec<usize>>,
    mut contribution: impl FnMut(usize) -> Vec<Float<B>>,
) -> Vec<Float<B>> {
    let (r, n) = (ctx.rank, ctx.world_size);
    let seq = ctx.next_seq();
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let out_of_place = ctx.config.rotation == RotationMode::OutOfPlace;
    let mut posted: Option<Posted<B>> = None;
    for t in 0..n {
        let j = (r + 2 * n - 1 - t) % n;
        let mine = timed(ctx, || contribution(j));
        let elem = mine.first().map(|t| t.dtype().size()).unwrap_or(4);
        // This rank's contribution is a temporary until it joins the travelling buffer.
        let _contribution = transient::<B>(ctx, &mine);
        let summed: Vec<Float<B>> = if t == 0 {
            mine
        } else {
            // Out-of-place posted this receive a step ago; in-place posts it only now.
            let p = posted
                .take()
                .unwrap_or_else(|| post(ctx, prev, headers(seq, op, j, shapes_of(j)), elem));
            let arrived = complete(ctx, p);
            verify_shapes(ctx, op, seq, prev, &arrived.tensors, &shapes_of(j), false);
            // The arrived buffer is this rank's own: accumulate into it, never into `mine`,
            // which may be a view of a larger tensor.
            arrived
                .tensors
                .into_iter()
                .zip(mine)
                .map(|(a, m)| B::float_add(a, m))
                .collect()
        };
        if t + 1 == n {
            return summed;
        }
        // Out-of-place posts the next receive before this buffer leaves, so both coexist.
        let next_j = (r + 2 * n - 2 - t) % n;
        if out_of_place {
            posted = Some(post(
                ctx,
                prev,
                headers(seq, op, next_j, shapes_of(next_j)),
                elem,
            ));
        }
        let bytes = summed.iter().map(|t| t.shape().num_elements() * elem).sum();
        let _travelling = ctx.ledger.charge(Category::InFlight, bytes);
        send_bundle(ctx, next, seq, op, j, &summed);
    }
    unreachable!("rank {r}: `{op}` ring of {n} ended without a result")
}
