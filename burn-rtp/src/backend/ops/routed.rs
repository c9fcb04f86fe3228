//! A sharded Linear under activation routing (RTP with `Routing::Activations`, or a pass that
//! `Routing::Auto` routes): the weights stay with their owners, and the activations travel.
//!
//! * **Forward.** Each rank's `x` goes to every shard's owner (one all-to-all). Owner `j`
//!   computes its shard's columns of every rank's `y` with the same step kernel rotation uses,
//!   and sends each rank its block back (a second all-to-all); each rank joins the blocks in
//!   column order.
//! * **Backward.** Each rank sends owner `j` the columns `j` of its `dy` (and its `x`, when dW
//!   is wanted and the owner no longer holds it from the forward). The owner computes every
//!   rank's `x_rᵀ dy_r[:, j]` and sums them in the order the ring pass sums the travelling
//!   gradient (from rank `j + 1` round to `j`), so dW and db are the rotation's to the bit. It
//!   also computes every rank's partial `dy_r[:, j] W_jᵀ` and sends it back, where each rank
//!   adds the partials in the order rotation accumulates them (its own shard first, then
//!   `j - 1`, `j - 2`, ...). Rotation's step adds its product to the accumulator inside the GEMM;
//!   where the GEMM sums a shard's columns in one block, that is the same addition, and the two
//!   modes give the same bits (`tests/routing.rs`, on NdArray at N = 2, 3, 4, 8). Where a shard
//!   is wider than the GEMM's block of the sum, the accumulator joins the first block's partial
//!   sum, and dX may differ from rotation's in the last places (within the equivalence suite's
//!   bound).
//!
//! The owner keeps the peers' inputs the forward sent it, in the forward's record
//! (`backend::pairing`), so the backward computes dW from them and `x` travels once per step
//! (twice where activation checkpointing released it before the backward); a Linear fed the
//! same `x` as one routed before it (attention's query, key and value) sends none. Those inputs
//! are activations on the owner: `N - 1` peers' `x` for each routed input, released with the
//! rank's own.
//!
//! Ranks may pass the Linear different numbers of rows (an uneven last batch): before a pass
//! routes, the ranks agree every rank's input shape in one small all-gather ([`agree_dims`]),
//! so each expects its peers' own shapes. The forward's record keeps the agreement for the
//! backward and for Linears fed the same `x`; when a pass routes is `route_choice`'s to say.

use super::linear::Grads;
use super::route_choice::with_last;
use super::weights::mean_over_ranks;
use super::Float;
use crate::backend::pairing::{PeerInputs, WorldDims};
use crate::backend::rank::RankCtx;
use crate::backend::tensor::RtpTensor;
use crate::comm::collectives::all_gather_host;
use crate::comm::route::{all_to_all, Routed};
use crate::state::accounting::{transient, Category, Held};
use crate::state::sharding::{Layout, ShardSpec};
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use burn_rtp_kernels as kernels;
use burn_rtp_kernels::RotationKernels;
use std::sync::Arc;

/// Every rank's `dims` (its input to one Linear), in rank order, from one small all-gather:
/// what routing expects from each peer, and the rows `Auto` decides on, the same on every
/// rank. A shape of another rank that differs in anything but its rows is `RtpError::Desync`
/// in the exchanges that follow, naming both. The values travel as a tensor of the inner
/// backend, so on a GPU each agreement is a round trip to the device.
pub(super) fn agree_dims<B: Backend>(ctx: &RankCtx<B>, dims: &[usize]) -> WorldDims {
    // Floats carry integers exactly below 2^24, far above any one dimension of an input.
    let values = dims
        .iter()
        .map(|&d| {
            assert!(
                d < 1 << 24,
                "rank {}: `linear.agree_rows`: dimension {d} of {dims:?} is too large to agree",
                ctx.comm.rank
            );
            d as f32
        })
        .collect();
    let all = all_gather_host(&ctx.comm, "linear.agree_rows", values);
    Arc::new(
        all.into_iter()
            .map(|v| v.into_iter().map(|d| d as usize).collect())
            .collect(),
    )
}

/// Panics naming the rank, the op and the shapes, for a step kernel's refusal.
fn refused<B: RotationKernels>(
    ctx: &RankCtx<B>,
    op: &str,
    shapes: &[Vec<usize>],
    e: impl std::fmt::Display,
) -> ! {
    panic!("rank {}: `{op}` ({shapes:?}): {e}", ctx.comm.rank)
}

/// The forward of a Linear whose weight is sharded by `spec`: `own` is this rank's bundle,
/// its weight shard and, when split like it, its bias shard. `kept` are the peers' inputs a
/// routed forward of this same `x` left here (then no `x` travels); `world` is every rank's
/// shape of `x`. Returns `y` and the peers' inputs, for the record.
pub(super) fn forward<B: RotationKernels>(
    ctx: &Arc<RankCtx<B>>,
    x: &Held<B>,
    kept: Option<PeerInputs<B>>,
    own: Vec<Float<B>>,
    spec: &ShardSpec,
    world: &WorldDims,
) -> (Held<B>, PeerInputs<B>) {
    let (rank, n) = (ctx.comm.rank, ctx.comm.world_size);
    let x_dims = x.shape().to_vec();
    let peer_x = kept.unwrap_or_else(|| {
        let outgoing = (0..n).map(|_| vec![x.get()]).collect();
        let Routed { bundles, charges } = all_to_all(&ctx.comm, "linear.route_x", outgoing, |p| {
            vec![world[p].clone()]
        });
        // From here the peers' inputs are activations the record holds, not buffers in flight.
        drop(charges);
        let inputs = bundles.into_iter().enumerate().map(|(p, mut bundle)| {
            let x_p = bundle.remove(0);
            (p != rank).then(|| Held::new(&ctx.comm.ledger, x_p, Category::Local))
        });
        Arc::new(inputs.collect())
    });
    let len = spec.range(rank).len;
    let (w, b) = (own[0].clone(), own.get(1).cloned());
    let blocks: Vec<Vec<Float<B>>> = (peer_x.iter())
        .map(|kept| {
            let x_s = kept.as_ref().map_or_else(|| x.get(), Held::get);
            let y = kernels::output_for_columns::<B>(&x_s, len);
            let shapes = [x_s.shape().to_vec(), w.shape().to_vec()];
            let block = kernels::forward_step::<B>(y, x_s, w.clone(), b.clone(), 0, None)
                .unwrap_or_else(|e| refused(ctx, "linear.route_forward", &shapes, e));
            vec![block]
        })
        .collect();
    let blocks_charge = transient::<B>(&ctx.comm.ledger, &blocks.concat());
    let ys = all_to_all(&ctx.comm, "linear.route_y", blocks, |j| {
        vec![with_last(&x_dims, spec.range(j).len)]
    });
    // The blocks sent are gone; those received stay charged until they are joined.
    drop(blocks_charge);
    let parts = ys.bundles.into_iter().map(|mut b| b.remove(0)).collect();
    let y = kernels::assemble_columns::<B>(parts, x_dims.len() - 1);
    (Held::new(&ctx.comm.ledger, y, Category::Local), peer_x)
}

/// This rank's input to a routed backward that computes dW: `x`, and the peers' inputs when
/// a routed forward left them here (then `x` does not travel again).
pub(super) struct Input<B: burn::tensor::backend::Backend> {
    /// This rank's `x`.
    pub(super) x: Float<B>,
    /// Every peer's `x`, on this rank as their shards' owner.
    pub(super) peer_x: Option<PeerInputs<B>>,
}

/// A Linear's backward under activation routing, with the arguments and results of the ring
/// pass it replaces (`linear::backward_pass`): with `weight` (this rank's shard) dX, with `x`
/// dW, with `bias` db; any subset. `world` is every rank's shape of the forward's `x`.
pub(super) fn backward_pass<B: RotationKernels>(
    ctx: &Arc<RankCtx<B>>,
    spec: &ShardSpec,
    weight: Option<Float<B>>,
    input: Option<Input<B>>,
    dy: &Held<B>,
    bias: Option<ShardSpec>,
    world: &WorldDims,
) -> Grads<B> {
    let (rank, n) = (ctx.comm.rank, ctx.comm.world_size);
    let with_bias = bias.is_some();
    let with_x = input.is_some();
    let dy = dy.get();
    let dy_dims = dy.shape().to_vec();
    let (x, peer_x) = match input {
        Some(Input { x, peer_x }) => (Some(x), peer_x),
        None => (None, None),
    };
    // The peers' inputs kept here make `x` stay home; otherwise it travels with `dy`.
    let (own_x, x) = match peer_x {
        Some(_) => (x, None),
        None => (None, x),
    };
    let x_travels = x.is_some();
    // To owner `j`: the columns `j` of `dy`, and `x` when dW is wanted and `j` lacks it.
    let outgoing = (0..n)
        .map(|j| {
            let range = spec.range(j);
            let mut bundle = vec![kernels::column_slice::<B>(
                dy.clone(),
                range.start,
                range.len,
            )];
            bundle.extend(x.clone());
            bundle
        })
        .collect();
    let len = spec.range(rank).len;
    // From rank `s`: its rows of `dy`'s columns here, and its `x` if that travels.
    let incoming = all_to_all(&ctx.comm, "linear.route_dy", outgoing, |s| {
        std::iter::once(with_last(&world[s], len))
            .chain(x_travels.then(|| world[s].clone()))
            .collect()
    });
    let window = kernels::Window::new(0, len);
    let shapes = |bundle: &[Float<B>]| -> Vec<Vec<usize>> {
        bundle.iter().map(|t| t.shape().to_vec()).collect()
    };
    // Every rank's dX partial, sent back below.
    let partials: Vec<Vec<Float<B>>> = match &weight {
        Some(w) => (incoming.bundles.iter())
            .map(|bundle| {
                let p = kernels::x_grad_step::<B>(None, w.clone(), bundle[0].clone(), window)
                    .unwrap_or_else(|e| {
                        refused(ctx, "linear.route_backward_x", &shapes(bundle), e)
                    });
                vec![p]
            })
            .collect(),
        None => Vec::new(),
    };
    let partials_charge = transient::<B>(&ctx.comm.ledger, &partials.concat());
    // dW and db: each rank's contribution, added as it is made, in the ring pass's order (the
    // buffer of shard `j` starts on rank `j + 1` and ends at home), so that at most the sum
    // and one contribution live at a time.
    let contribution = |s: usize, bundle: &[Float<B>]| -> Vec<Float<B>> {
        let dy_s = bundle[0].clone();
        let kept = peer_x.as_ref().map(|peers| match &peers[s] {
            Some(x_s) => x_s.get(),
            None => own_x.clone().expect("this rank's own input"),
        });
        match bundle.get(1).cloned().or(kept) {
            Some(x_s) => {
                // The kept `x` is not in the bundle: name both operands.
                let operands = [x_s.shape().to_vec(), dy_s.shape().to_vec()];
                let (dw, db) = kernels::weight_grad_step::<B>(x_s, dy_s, window, with_bias, None)
                    .unwrap_or_else(|e| refused(ctx, "linear.route_backward_weight", &operands, e));
                std::iter::once(dw).chain(db).collect()
            }
            None if with_bias => vec![B::linear_bias_backward(dy_s)],
            None => Vec::new(),
        }
    };
    let mut own: Vec<Float<B>> = Vec::new();
    for t in 1..=n {
        let s = (rank + t) % n;
        let mine = contribution(s, &incoming.bundles[s]);
        let _mine = transient::<B>(&ctx.comm.ledger, &mine);
        own = if t == 1 {
            mine
        } else {
            own.into_iter()
                .zip(mine)
                .map(|(a, m)| B::float_add(a, m))
                .collect()
        };
    }
    drop(incoming);
    let dx = (!partials.is_empty()).then(|| {
        let dx_dims = with_last(&dy_dims, spec.full[0]);
        let back = all_to_all(&ctx.comm, "linear.route_dx", partials, |_| {
            vec![dx_dims.clone()]
        });
        // The partials sent are gone; those received stay charged until they are added.
        drop(partials_charge);
        let Routed {
            mut bundles,
            charges: _received,
        } = back;
        // Rotation's order: this rank's own shard first, then `rank - 1`, `rank - 2`, ...
        let mut acc = bundles[rank].remove(0);
        for t in 1..n {
            let j = (rank + n - t) % n;
            acc = B::float_add(acc, bundles[j].remove(0));
        }
        acc
    });
    let mut own = own.into_iter();
    let mut shard = |spec: ShardSpec| {
        let g = mean_over_ranks(ctx, own.next().expect("one sum per gradient"));
        RtpTensor::new(ctx.clone(), g, Layout::Sharded(spec))
    };
    let dw = with_x.then(|| shard(spec.clone()));
    let db = bias.map(&mut shard);
    Grads { dx, dw, db }
}
