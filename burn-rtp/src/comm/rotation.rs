//! The rotation schedule: how shards and travelling gradients move around the ring.
//!
//! Ranks form a ring; every message goes to rank `r + 1` and comes from rank `r - 1`.
//!
//! * Rotation: at step `t` rank `r` holds shard `j = r - t` (a bundle of tensors, e.g. a
//!   weight shard and its bias shard) and runs `compute(j, bundle)`. After `N` steps every rank
//!   has seen every shard. Out-of-place mode exchanges the next shard while computing with the
//!   current one (double buffer); in-place mode computes, then swaps its bundle with the
//!   neighbours.
//! * The travelling gradient: at step `t` rank `r` adds its contribution to shard
//!   `j = r - 1 - t` to the buffer that arrived from `r - 1` and passes it on. After `N` steps
//!   the buffer of shard `j` is back home on rank `j` holding `Σ_r contribution_r(j)`.
//! * `ring_pass` does both in one trip (a Linear's backward: the weight shard and its
//!   gradient buffer leave in the same exchange); `rotate` and `reduce_scatter` are its two
//!   halves alone.
//!
//! Every exchange posts its receive before it starts its send (`crate::comm::p2p`), so the ring
//! cannot deadlock on a transport that does not buffer. Every rank issues the same messages
//! in the same order, and each message carries a [`Header`](crate::comm::transport::Header)
//! the receiver checks, so diverged programs fail loudly instead of mixing data.

use crate::comm::context::{Comm, Seq, Stamped};
use crate::comm::p2p::{exchange, fence, swap, Leg, Received};
use crate::comm::ring::Ring;
use crate::config::RotationMode;
use crate::state::accounting::{transient, Category, Charge};
use crate::state::accounting::{Float, Held};
use crate::state::sharding::ShardRange;
use crate::state::timeline::IntervalKind;
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use burn_rtp_kernels::ColumnError;
use std::sync::Arc;

/// Headers of the tensors of shard `j`'s bundle: one part number per tensor.
fn headers(seq: Seq, op: &'static str, j: usize, shapes: Vec<Vec<usize>>) -> Vec<Stamped> {
    let k = shapes.len();
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, shape)| seq.header(op, j * k + i, shape))
        .collect()
}

/// Runs one step's compute, recorded on the timeline.
fn timed<B: Backend, T>(ctx: &Comm<B>, f: impl FnOnce() -> T) -> T {
    let started = ctx.timeline.start();
    let out = f();
    ctx.timeline.finish(IntervalKind::Compute, started);
    out
}

/// What one ring pass moves: a rotating bundle (weight shards) and a travelling buffer
/// (gradient shards), either of which may be absent.
pub(crate) struct Pass<B: Backend, C, S, T> {
    /// This rank's own shard bundle; empty when nothing rotates.
    pub own: Vec<Float<B>>,
    /// Shapes of each tensor of rotating shard `j`, as this rank expects them.
    pub rot_shapes: S,
    /// Runs with shard `j` on hand (`compute(j, bundle)`).
    pub compute: C,
    /// Shapes of each tensor of travelling buffer `j`; empty when nothing travels.
    pub travel_shapes: T,
}

/// A bundle on hand: the tensors of the rotating shard, then those of the travelling buffer,
/// with the in-flight charges of the buffers that came from other ranks.
struct OnHand<B: Backend> {
    rotating: Vec<Float<B>>,
    travelling: Vec<Float<B>>,
    rotating_charges: Vec<Arc<Charge>>,
    travelling_charges: Vec<Arc<Charge>>,
}

impl<B: Backend> OnHand<B> {
    fn empty() -> Self {
        Self {
            rotating: Vec::new(),
            travelling: Vec::new(),
            rotating_charges: Vec::new(),
            travelling_charges: Vec::new(),
        }
    }
}

/// One trip around the ring; see the module docs. At step `t` rank `r` holds rotating shard
/// `r - t` and runs `compute` with it, and adds `contribution(r - 1 - t)` to the travelling
/// buffer that arrived from `r - 1`. The rotating shard and the travelling buffer leave for
/// `r + 1` in the same exchange, so the whole pass synchronises with the neighbours `N - 1`
/// times. Returns this rank's own travelling buffer, summed over all ranks (empty when
/// nothing travels).
///
/// Out-of-place mode moves the next shard and buffer while it computes with the current
/// shard and the next contribution; in-place mode computes, then swaps its one bundle with
/// the neighbours.
pub(crate) fn ring_pass<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    pass: Pass<
        B,
        impl FnMut(usize, &[Float<B>]),
        impl Fn(usize) -> Vec<Vec<usize>>,
        impl Fn(usize) -> Vec<Vec<usize>>,
    >,
    mut contribution: impl FnMut(usize) -> Vec<Float<B>>,
) -> Vec<Float<B>> {
    let Pass {
        own,
        rot_shapes,
        mut compute,
        travel_shapes,
    } = pass;
    let ring = Ring::new(ctx.rank, ctx.world_size);
    let rotates = !own.is_empty();
    let travels = !travel_shapes(ring.rank).is_empty();
    let (rot_seq, travel_seq) = (ctx.next_seq(), ctx.next_seq());
    let out_of_place = ctx.config.rotation == RotationMode::OutOfPlace;
    let mut elem = own.first().map(|t| t.dtype().size());
    let rot_shapes = |j: usize| if rotates { rot_shapes(j) } else { Vec::new() };
    let headers_at = |t: usize| {
        let mut h = headers(rot_seq, op, ring.held(t), rot_shapes(ring.held(t)));
        if travels {
            let j = ring.travelling(t);
            h.extend(headers(travel_seq, op, j, travel_shapes(j)));
        }
        h
    };
    let mut on_hand = OnHand::<B> {
        rotating: own,
        ..OnHand::empty()
    };
    let mut contribute = |j: usize, elem: &mut Option<usize>| -> Vec<Float<B>> {
        if !travels {
            return Vec::new();
        }
        let mine = timed(ctx, || contribution(j));
        elem.get_or_insert_with(|| mine.first().map(|t| t.dtype().size()).unwrap_or(4));
        mine
    };
    // Out-of-place: this rank's next contribution, computed while the last exchange moved.
    let mut ahead: Option<Vec<Float<B>>> = None;
    for t in 0..ring.n {
        let j = ring.held(t);
        let mine = match ahead.take() {
            Some(mine) => mine,
            None => contribute(ring.travelling(t), &mut elem),
        };
        // The contribution is a temporary until it joins the travelling buffer.
        let _contribution = transient::<B>(&ctx.ledger, &mine);
        let summed: Vec<Float<B>> = if t == 0 {
            mine
        } else {
            std::mem::take(&mut on_hand.travelling)
                .into_iter()
                .zip(mine)
                .map(|(a, m)| B::float_add(a, m))
                .collect()
        };
        // The arrived buffer became `summed` (charged below).
        on_hand.travelling_charges.clear();
        if t + 1 == ring.n {
            timed(ctx, || compute(j, &on_hand.rotating));
            fence(ctx);
            return summed;
        }
        let summed_charge = ctx.ledger.charge(
            Category::InFlight,
            summed
                .iter()
                .map(|t| t.shape().num_elements() * t.dtype().size())
                .sum(),
        );
        drop(_contribution);
        let elem_size = elem.unwrap_or(4);
        let incoming = headers_at(t + 1);
        let outgoing = headers_at(t);
        let k = on_hand.rotating.len();
        let got = if out_of_place {
            let mut outgoing_tensors = on_hand.rotating.clone();
            outgoing_tensors.extend(summed.iter().cloned());
            let mut hold = on_hand.rotating_charges.clone();
            hold.push(summed_charge.clone());
            let recv = Leg {
                peer: ring.prev(),
                headers: incoming,
                tensors: &[],
                hold: Vec::new(),
            };
            let send = Leg {
                peer: ring.next(),
                headers: outgoing,
                tensors: &outgoing_tensors,
                hold,
            };
            let next = ring.travelling(t + 1);
            let (next_mine, mut received) =
                exchange(ctx, vec![recv], vec![send], elem_size, || {
                    timed(ctx, || compute(j, &on_hand.rotating));
                    contribute(next, &mut elem)
                });
            ahead = Some(next_mine);
            // The shard on hand is released below: its reads must be done first.
            fence(ctx);
            drop(summed_charge);
            received.remove(0)
        } else {
            timed(ctx, || compute(j, &on_hand.rotating));
            // The bundle on hand leaves now: its reads must be done first.
            fence(ctx);
            let OnHand {
                rotating,
                rotating_charges: mut charges,
                ..
            } = std::mem::replace(&mut on_hand, OnHand::empty());
            charges.push(summed_charge);
            let mut bundle = rotating;
            bundle.extend(summed);
            swap(
                ctx,
                ring.prev(),
                incoming,
                ring.next(),
                outgoing,
                bundle,
                charges,
                elem_size,
            )
        };
        let Received {
            mut tensors,
            mut charges,
        } = got;
        let travelling = tensors.split_off(k);
        let travelling_charges = charges.split_off(k);
        on_hand = OnHand {
            rotating: tensors,
            travelling,
            rotating_charges: charges,
            travelling_charges,
        };
    }
    unreachable!(
        "rank {}: `{op}` ring of {} ended without a result",
        ring.rank, ring.n
    )
}

/// Shows every shard of a bundle to `compute`, in ring order; see the module docs.
///
/// `shapes_of(j)` is the shape of each tensor of shard `j`, as this rank expects it.
pub(crate) fn rotate<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    own: Vec<Float<B>>,
    shapes_of: impl Fn(usize) -> Vec<Vec<usize>>,
    compute: impl FnMut(usize, &[Float<B>]),
) {
    let pass = Pass {
        own,
        rot_shapes: shapes_of,
        compute,
        travel_shapes: |_| Vec::new(),
    };
    ring_pass(ctx, op, pass, |_| Vec::new());
}

/// Rotates `own` and fills `out` (allocated once by the caller, charged here as local
/// memory) one column window per shard: `write(y, j, shard)` writes shard `j`'s columns
/// `window(j)` of `y` where they lie and returns `y`. With `via_block`, a write first builds
/// the window's block (the generic kernels do) and that block is charged while it lives. A
/// window that does not fit is a panic naming the rank, the op and the shapes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rotate_columns<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    own: Vec<Float<B>>,
    shapes_of: impl Fn(usize) -> Vec<Vec<usize>>,
    out: Float<B>,
    via_block: bool,
    mut write: impl FnMut(Float<B>, usize, &[Float<B>]) -> Result<Float<B>, ColumnError>,
    window: impl Fn(usize) -> ShardRange,
) -> Held<B> {
    let dims = out.shape().to_vec();
    let columns = dims[dims.len() - 1];
    let bytes_per_column = dims[..dims.len() - 1].iter().product::<usize>() * out.dtype().size();
    let mut out = Some(Held::new(&ctx.ledger, out, Category::Local));
    let mut written = 0;
    rotate(ctx, op, own, shapes_of, |j, shard| {
        let _block = via_block.then(|| {
            ctx.ledger
                .charge(Category::Local, bytes_per_column * window(j).len)
        });
        let target: Held<B> = out.take().expect("the output is back after each step");
        let shapes: Vec<Vec<usize>> = std::iter::once(target.shape().to_vec())
            .chain(shard.iter().map(|t| t.shape().to_vec()))
            .collect();
        out = Some(target.map(|y| {
            write(y, j, shard).unwrap_or_else(|e| {
                panic!(
                    "rank {}: `{op}` shard {j} (output, shard tensors {shapes:?}): {e}",
                    ctx.rank
                )
            })
        }));
        written += window(j).len;
    });
    assert_eq!(
        written, columns,
        "rank {}: `{op}` wrote {written} of {columns} columns",
        ctx.rank
    );
    out.unwrap_or_else(|| unreachable!("rank {}: `{op}` has no shard", ctx.rank))
}

/// Sums every rank's contribution to each shard and leaves shard `r` on rank `r`.
///
/// `contribution(j)` is this rank's part of shard `j` (a bundle); the result is this rank's
/// own shard summed over all ranks.
pub(crate) fn reduce_scatter<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    shapes_of: impl Fn(usize) -> Vec<Vec<usize>>,
    contribution: impl FnMut(usize) -> Vec<Float<B>>,
) -> Vec<Float<B>> {
    let pass = Pass {
        own: Vec::new(),
        rot_shapes: |_| Vec::new(),
        compute: |_, _: &[Float<B>]| {},
        travel_shapes: shapes_of,
    };
    ring_pass(ctx, op, pass, contribution)
}
