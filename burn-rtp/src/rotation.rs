//! The rotation schedule: how shards and travelling gradients move around the ring.
//!
//! Ranks form a ring; every message goes to rank `r + 1` and comes from rank `r - 1`.
//!
//! * `rotate`: at step `t` rank `r` holds shard `j = r - t` (a bundle of tensors, e.g. a
//!   weight shard and its bias shard) and runs `compute(j, bundle)`. After `N` steps every rank
//!   has seen every shard. Out-of-place mode exchanges the next shard while computing with the
//!   current one (double buffer); in-place mode computes, then swaps its single buffer with the
//!   neighbours.
//! * `reduce_scatter`: the travelling gradient. At step `t` rank `r` adds its contribution
//!   to shard `j = r - 1 - t` to the buffer that arrived from `r - 1` and passes it on. After
//!   `N` steps the buffer of shard `j` is back home on rank `j` holding `Σ_r contribution_r(j)`.
//!
//! Every exchange posts its receive before it starts its send (`crate::p2p`), so the ring
//! cannot deadlock on a transport that does not buffer. Every rank issues the same messages
//! in the same order, and each message carries a [`Header`] the receiver checks, so diverged
//! programs fail loudly instead of mixing data.

use crate::accounting::{Category, Charge};
use crate::config::RotationMode;
use crate::p2p::{
    complete, exchange, fence, finish, post, start, swap, Leg, Posted, Received, Started,
};
use crate::tensor::{Float, Held};
use crate::timeline::IntervalKind;
use crate::transport::Header;
use crate::world::RankCtx;
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use std::sync::Arc;

/// The ring's index arithmetic, in one place: who this rank talks to and which shard it holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ring {
    /// This rank.
    pub rank: usize,
    /// Ranks in the ring.
    pub n: usize,
}

impl Ring {
    /// The ring of `ctx`'s world.
    pub(crate) fn of<B: Backend>(ctx: &RankCtx<B>) -> Self {
        Self {
            rank: ctx.rank,
            n: ctx.world_size,
        }
    }

    /// Where every message goes.
    pub(crate) fn next(self) -> usize {
        (self.rank + 1) % self.n
    }

    /// Where every message comes from.
    pub(crate) fn prev(self) -> usize {
        (self.rank + self.n - 1) % self.n
    }

    /// The shard a rotation holds at step `t`: `r - t`.
    pub(crate) fn held(self, t: usize) -> usize {
        (self.rank + self.n - t % self.n) % self.n
    }

    /// The travelling gradient buffer a reduce-scatter adds to at step `t`: `r - 1 - t`.
    pub(crate) fn travelling(self, t: usize) -> usize {
        (self.rank + 2 * self.n - 1 - t % self.n) % self.n
    }
}

/// Headers of the tensors of shard `j`'s bundle: one part number per tensor.
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

/// A shard bundle on hand, with the in-flight charge of its buffers (none for the own shard).
struct Bundle<B: Backend> {
    tensors: Vec<Float<B>>,
    _charge: Option<Arc<Charge>>,
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
    let ring = Ring::of(ctx);
    let seq = ctx.next_seq();
    let elem = own.first().map(|t| t.dtype().size()).unwrap_or(4);
    let mut cur = Bundle::<B> {
        tensors: own,
        _charge: None,
    };
    for t in 0..ring.n {
        let j = ring.held(t);
        if t + 1 == ring.n {
            timed(ctx, || compute(j, &cur.tensors));
            break;
        }
        let incoming = ring.held(t + 1);
        let incoming_headers = headers(seq, op, incoming, shapes_of(incoming));
        let outgoing_headers = headers(seq, op, j, shapes_of(j));
        let got = match ctx.config.rotation {
            RotationMode::OutOfPlace => {
                let recv = Leg {
                    peer: ring.prev(),
                    headers: incoming_headers,
                    tensors: &[],
                };
                let send = Leg {
                    peer: ring.next(),
                    headers: outgoing_headers,
                    tensors: &cur.tensors,
                };
                let (_, mut received) = exchange(ctx, vec![recv], vec![send], elem, || {
                    timed(ctx, || compute(j, &cur.tensors))
                });
                // The shard on hand is released below: its reads must be done first.
                fence(ctx);
                received.remove(0)
            }
            RotationMode::InPlace => {
                timed(ctx, || compute(j, &cur.tensors));
                // The shard on hand leaves now: its reads must be done first.
                fence(ctx);
                let Bundle { tensors, _charge } = std::mem::replace(
                    &mut cur,
                    Bundle {
                        tensors: Vec::new(),
                        _charge: None,
                    },
                );
                swap(
                    ctx,
                    ring.prev(),
                    incoming_headers,
                    ring.next(),
                    outgoing_headers,
                    tensors,
                    _charge,
                    elem,
                )
            }
        };
        cur = Bundle {
            tensors: got.tensors,
            _charge: Some(got.charge),
        };
    }
    fence(ctx);
}

/// Rotates `own` and builds a tensor from one column block per shard: `block(j, shard)` is
/// the block of shard `j`, and the blocks are concatenated in shard order along `dim`.
/// Blocks are charged as local memory while they wait to be assembled, and the joined
/// result (charged as local too) is charged before they are released: both exist at once.
pub(crate) fn rotate_columns<B: Backend>(
    ctx: &RankCtx<B>,
    op: &'static str,
    own: Vec<Float<B>>,
    shapes_of: impl Fn(usize) -> Vec<Vec<usize>>,
    mut block: impl FnMut(usize, &[Float<B>]) -> Float<B>,
    dim: impl FnOnce(&Float<B>) -> usize,
) -> Held<B> {
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
    let joined = Held::new(
        ctx,
        burn_rtp_kernels::assemble_columns::<B>(parts, dim),
        Category::Local,
    );
    drop(held);
    joined
}

/// Sums every rank's contribution to each shard and leaves shard `r` on rank `r`.
///
/// `contribution(j)` is this rank's part of shard `j` (a bundle); the result is this rank's
/// own shard summed over all ranks. Out-of-place mode posts the receive of the next buffer
/// before the current one leaves and lets the send complete behind the next contribution;
/// in-place mode swaps its one buffer with the neighbours at the end of each step.
pub(crate) fn reduce_scatter<B: Backend>(
    ctx: &RankCtx<B>,
    op: &'static str,
    shapes_of: impl Fn(usize) -> Vec<Vec<usize>>,
    mut contribution: impl FnMut(usize) -> Vec<Float<B>>,
) -> Vec<Float<B>> {
    let ring = Ring::of(ctx);
    let seq = ctx.next_seq();
    let out_of_place = ctx.config.rotation == RotationMode::OutOfPlace;
    // Out-of-place: the receive of the buffer the next step adds to, posted a step ahead.
    let mut posted: Option<Posted<B>> = None;
    // In-place: the buffer the last exchange brought.
    let mut arrived: Option<Received<B>> = None;
    // Out-of-place: a send still completing, with the buffer it reads and its charge.
    let mut sending: Option<(Started, Vec<Float<B>>, Arc<Charge>)> = None;
    for t in 0..ring.n {
        let j = ring.travelling(t);
        let mine = timed(ctx, || contribution(j));
        let elem = mine.first().map(|t| t.dtype().size()).unwrap_or(4);
        if let Some((started, _buffer, _charge)) = sending.take() {
            finish(ctx, started);
        }
        // This rank's contribution is a temporary until it joins the travelling buffer.
        let _contribution = transient::<B>(ctx, &mine);
        let summed: Vec<Float<B>> = if t == 0 {
            mine
        } else {
            let buffer = match (arrived.take(), posted.take()) {
                (Some(buffer), _) => buffer,
                (None, Some(p)) => complete(ctx, p),
                (None, None) => unreachable!("rank {}: `{op}` lost its buffer", ring.rank),
            };
            buffer
                .tensors
                .into_iter()
                .zip(mine)
                .map(|(a, m)| B::float_add(a, m))
                .collect()
        };
        if t + 1 == ring.n {
            return summed;
        }
        let next_j = ring.travelling(t + 1);
        let incoming = headers(seq, op, next_j, shapes_of(next_j));
        let shapes = summed.iter().map(|t| t.shape().to_vec()).collect();
        let outgoing = headers(seq, op, j, shapes);
        let bytes = summed.iter().map(|t| t.shape().num_elements() * elem).sum();
        let charge = ctx.ledger.charge(Category::InFlight, bytes);
        if out_of_place {
            posted = Some(post(ctx, ring.prev(), incoming, elem));
            let started = start(ctx, ring.next(), outgoing, &summed);
            sending = Some((started, summed, charge));
        } else {
            arrived = Some(swap(
                ctx,
                ring.prev(),
                incoming,
                ring.next(),
                outgoing,
                summed,
                Some(charge),
                elem,
            ));
        }
    }
    unreachable!(
        "rank {}: `{op}` ring of {} ended without a result",
        ring.rank, ring.n
    )
}
