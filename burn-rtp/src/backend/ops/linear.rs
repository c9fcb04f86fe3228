//! Linear: the forward rotates the weight shards; the backward is one ring pass in which
//! the weight shard rotates (dX) while the gradient buffer `[dW_j, db_j]` travels with it.
//! How Burn's three backward calls come to share that pass is [`crate::backend::pairing`].
//! A pass the rank's strategy routes (`Routing`) moves the activations instead, with the same
//! arguments and results (`routed.rs`).

use super::route_choice::{decide, mean_rows, with_last, FromForward};
use super::weights::{
    broadcastable, gather_unit, local, mean_over_ranks, reduce_scatter_full, use_of, use_of_layout,
    WeightUse,
};
use super::{full_inner, unary, Float};
use crate::backend::pairing::{Agreed, Deferred, Forward, Guess, Identity, LinearCall, WorldDims};
use crate::backend::rank::RankCtx;
use crate::backend::strategy::LinearPass;
use crate::backend::tensor::RtpTensor;
use crate::comm::rotation::{ring_pass, rotate_columns, Pass};
use crate::state::accounting::transient;
use crate::state::accounting::Held;
use crate::state::accounting::{Category, Charge};
use crate::state::sharding::Layout;
use crate::state::sharding::ShardSpec;
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use burn_rtp_kernels as kernels;
use burn_rtp_kernels::RotationKernels;
use std::sync::Arc;

/// The shard spec of a bias that travels with a weight sharded by `spec` (split like its
/// columns), if the bias is sharded.
fn travelling_bias(bias: &Option<Layout>) -> Option<ShardSpec> {
    match bias {
        Some(Layout::Sharded(spec)) => Some(spec.clone()),
        _ => None,
    }
}

/// `x` packed once for every step of a pass that reads it as `use_` (where the backend packs),
/// with the ledger's charge for the packing, which the pass drops with it when its steps end.
fn pack_for_pass<B: RotationKernels>(
    ctx: &RankCtx<B>,
    x: &Float<B>,
    use_: kernels::XUse,
) -> (Option<kernels::PackedX>, Option<Arc<Charge>>) {
    let packed = kernels::pack_x::<B>(x, use_);
    let charge = packed
        .as_ref()
        .map(|p| ctx.comm.ledger.charge(Category::Local, p.bytes()));
    (packed, charge)
}

/// Every rank's input shape, which a pass `decide` routed has.
fn routed_world(agreed: Option<Agreed>) -> WorldDims {
    agreed
        .and_then(|a| a.world)
        .expect("a routed pass agreed every rank's input shape")
}

/// What one backward pass produced.
pub(super) struct Grads<B: Backend> {
    /// This rank's dX.
    pub(super) dx: Option<Float<B>>,
    /// This rank's shard of dW, averaged over ranks.
    pub(super) dw: Option<RtpTensor<B>>,
    /// This rank's shard of db, averaged over ranks.
    pub(super) db: Option<RtpTensor<B>>,
}

/// A Linear's backward as one ring pass. With `weight` the weight shards rotate and dX is
/// accumulated; with `x` this rank's `xᵀ dy_j` travels to shard `j`'s home (dW); with
/// `bias` the column sums of `dy_j` travel with it (db). Any subset works; with nothing to
/// rotate or carry it is not called. A pass the strategy routes goes to `routed.rs` instead;
/// `peer_x`, the peers' inputs a routed forward of this `x` left here, spares it sending `x`,
/// and what the forward's ranks agreed decides the pass without agreeing again.
fn backward_pass<B: RotationKernels>(
    ctx: &Arc<RankCtx<B>>,
    spec: &ShardSpec,
    weight: Option<Float<B>>,
    x: Option<Float<B>>,
    dy: &Held<B>,
    bias: Option<ShardSpec>,
    from_forward: FromForward<B>,
) -> Grads<B> {
    let FromForward { peer_x, agreed } = from_forward;
    let peer_x = peer_x.filter(|_| x.is_some());
    let d_in = spec.full[0];
    let pass = LinearPass {
        rows: 0.0,
        d_in,
        d_out: spec.last(),
        backward: Some((weight.is_some(), x.is_some())),
        x_on_owners: peer_x.is_some(),
    };
    let (routes, agreed) = decide(ctx, pass, agreed, false, || {
        with_last(&dy.shape().to_vec(), d_in)
    });
    if routes {
        let world = routed_world(agreed);
        let x = x.map(|x| super::routed::Input { x, peer_x });
        return super::routed::backward_pass(ctx, spec, weight, x, dy, bias, &world);
    }
    let rotates = weight.is_some();
    let with_x = x.is_some();
    let with_bias = bias.is_some();
    let window = |j: usize| {
        let range = spec.range(j);
        kernels::Window::new(range.start, range.len)
    };
    let shapes = |tensors: &[&Float<B>]| -> Vec<Vec<usize>> {
        tensors.iter().map(|t| t.shape().to_vec()).collect()
    };
    // The dX accumulator, charged as local from its first contribution on.
    let mut acc: Option<Float<B>> = None;
    let mut acc_charge: Option<Arc<Charge>> = None;
    let pass = Pass {
        own: weight.into_iter().collect(),
        rot_shapes: |j: usize| vec![vec![d_in, spec.range(j).len]],
        compute: |j: usize, shard: &[Float<B>]| {
            if let Some(w_j) = shard.first() {
                let dy = dy.get();
                let sum = kernels::x_grad_step::<B>(acc.take(), w_j.clone(), dy.clone(), window(j))
                    .unwrap_or_else(|e| {
                        panic!(
                            "rank {}: `linear.backward_x` shard {j} (weight, dy {:?}): {e}",
                            ctx.comm.rank,
                            shapes(&[w_j, &dy])
                        )
                    });
                acc_charge.get_or_insert_with(|| {
                    transient::<B>(&ctx.comm.ledger, std::slice::from_ref(&sum))
                });
                acc = Some(sum);
            }
        },
        travel_shapes: |j: usize| {
            let len = spec.range(j).len;
            let mut shapes = Vec::new();
            if with_x {
                shapes.push(vec![d_in, len]);
            }
            if with_bias {
                shapes.push(vec![len]);
            }
            shapes
        },
    };
    let op = match (rotates, with_x) {
        (true, true) => "linear.backward",
        (true, false) => "linear.backward_x",
        (false, true) => "linear.backward_weight",
        (false, false) => "linear.backward_bias",
    };
    let (packed, packed_charge) = match &x {
        Some(x) => pack_for_pass(ctx, x, kernels::XUse::WeightGrad),
        None => (None, None),
    };
    let mut own = ring_pass(&ctx.comm, op, pass, |j| match &x {
        // dW_j and db_j from one step (one launch on cube backends).
        Some(x) => {
            let dy = dy.get();
            let (dw, db) = kernels::weight_grad_step::<B>(
                x.clone(),
                dy.clone(),
                window(j),
                with_bias,
                packed.as_ref(),
            )
            .unwrap_or_else(|e| {
                panic!(
                    "rank {}: `{op}` shard {j} (x, dy {:?}): {e}",
                    ctx.comm.rank,
                    shapes(&[x, &dy])
                )
            });
            std::iter::once(dw).chain(db).collect()
        }
        None if with_bias => {
            let w = window(j);
            let dy_j = kernels::column_slice::<B>(dy.get(), w.start, w.len);
            vec![B::linear_bias_backward(dy_j)]
        }
        None => Vec::new(),
    })
    .into_iter();
    drop((packed, packed_charge));
    let dx = acc;
    drop(acc_charge);
    let mut shard = |spec: ShardSpec| {
        let g = mean_over_ranks(ctx, own.next().expect("one buffer per gradient"));
        RtpTensor::new(ctx.clone(), g, Layout::Sharded(spec))
    };
    let dw = with_x.then(|| shard(spec.clone()));
    let db = bias.map(&mut shard);
    Grads { dx, dw, db }
}

/// `linear(x, weight, bias)`, leaving a record for the backward.
pub(super) fn forward<B: RotationKernels>(
    x: RtpTensor<B>,
    weight: RtpTensor<B>,
    bias: Option<RtpTensor<B>>,
) -> RtpTensor<B> {
    let ctx = x.ctx.clone();
    let use_ = use_of(&weight);
    let rotates = matches!(use_, WeightUse::Rotated(_));
    ctx.record_forward(Forward::new(&x, &weight, bias.as_ref(), rotates));
    let ids = (x.identity(), weight.identity());
    let op = "linear";
    match use_ {
        WeightUse::Whole => {
            let (x, w) = (full_inner(x, op), full_inner(weight, op));
            let b = bias.map(|b| full_inner(b, op));
            let b = b.as_ref().map(Held::get);
            local(&ctx, kernels::forward_whole::<B>(x.get(), w.get(), b))
        }
        WeightUse::Gathered(_) => {
            let x = full_inner(x, op);
            let w = gather_unit(weight, "linear.gather");
            let b = bias.map(|b| gather_unit(b, "linear.gather_bias"));
            let b = b.as_ref().map(Held::get);
            local(&ctx, kernels::forward_whole::<B>(x.get(), w.get(), b))
        }
        WeightUse::Rotated(spec) => {
            rotated_forward(&ctx, full_inner(x, op), ids, weight, bias, spec)
        }
    }
}

/// RTP's forward: the weight shards (with a bias split like them) rotate, and each step
/// writes its block of output columns. `ids` are `x`'s and the weight's identities, under
/// which a routed forward leaves the peers' inputs for the backward.
fn rotated_forward<B: RotationKernels>(
    ctx: &Arc<RankCtx<B>>,
    x: Held<B>,
    ids: (Identity, Identity),
    weight: RtpTensor<B>,
    bias: Option<RtpTensor<B>>,
    spec: ShardSpec,
) -> RtpTensor<B> {
    let ndims = x.shape().num_dims();
    let d_in = spec.full[0];
    // A bias split like the weight travels with it; any other bias is added at the end.
    let (bundle, late_bias) = match bias {
        Some(b) if matches!(&b.layout, Layout::Sharded(bs) if bs.last() == spec.last()) => {
            (vec![weight.inner.clone(), b.inner.clone()], None)
        }
        Some(b) => (vec![weight.inner.clone()], Some(full_inner(b, "linear"))),
        None => (vec![weight.inner.clone()], None),
    };
    let with_bias = bundle.len() == 2;
    let (x_id, weight_id) = ids;
    ctx.linear.note(|| LinearCall {
        rows: x.shape().num_elements() / d_in.max(1),
        d_in,
        d_out: spec.last(),
        shares_x: ctx.linear.pairing.lock().unwrap().x_seen_before(&x_id),
    });
    let (kept, known) = if ctx.may_route() {
        let mut pairing = ctx.linear.pairing.lock().unwrap();
        (pairing.peer_x_of(&x_id), pairing.world_of(&x_id))
    } else {
        (None, None)
    };
    let known = known.map(|world| Agreed {
        rows: mean_rows(&world),
        world: Some(world),
    });
    let pass = LinearPass {
        rows: 0.0,
        d_in,
        d_out: spec.last(),
        backward: None,
        x_on_owners: kept.is_some(),
    };
    let (routes, agreed) = decide(ctx, pass, known, true, || x.shape().to_vec());
    // The record keeps what was agreed, for the backward and for Linears fed this `x`.
    let keep = |agreed, peer_x| {
        let mut pairing = ctx.linear.pairing.lock().unwrap();
        pairing.keep_routing(&x_id, &weight_id, agreed, peer_x);
    };
    if routes {
        let world = routed_world(agreed.clone());
        let (y, peer_x) = super::routed::forward(ctx, &x, kept, bundle, &spec, &world);
        keep(agreed.expect("a routed pass agreed"), Some(peer_x));
        return add_late_bias(y.into_local(ctx.clone()), late_bias, ndims);
    }
    if let Some(agreed) = agreed {
        keep(agreed, None);
    }
    let y = kernels::output_for_columns::<B>(&x.get(), spec.last());
    let (packed, packed_charge) = pack_for_pass(ctx, &x.get(), kernels::XUse::Forward);
    let y = rotate_columns(
        &ctx.comm,
        "linear.forward",
        bundle,
        |j| {
            let len = spec.range(j).len;
            let mut shapes = vec![vec![d_in, len]];
            if with_bias {
                shapes.push(vec![len]);
            }
            shapes
        },
        y,
        !B::kernel_path().linear_in_place(),
        |y, j, shard| {
            let start = spec.range(j).start;
            let (w_j, b_j) = (shard[0].clone(), shard.get(1).cloned());
            kernels::forward_step::<B>(y, x.get(), w_j, b_j, start, packed.as_ref())
        },
        |j| spec.range(j),
    );
    drop((packed, packed_charge));
    add_late_bias(y.into_local(ctx.clone()), late_bias, ndims)
}

/// `y` plus a bias that did not travel with the weight shards (one not split like them).
fn add_late_bias<B: RotationKernels>(
    y: RtpTensor<B>,
    bias: Option<Held<B>>,
    ndims: usize,
) -> RtpTensor<B> {
    match bias {
        Some(b) => unary(y, |y| B::float_add(y, broadcastable::<B>(b.get(), ndims))),
        None => y,
    }
}

/// dX. With a rotating weight it runs the Linear's whole backward pass when it can find the
/// forward's `x`, and leaves dW and db for the calls that follow.
pub(super) fn x_backward<B: RotationKernels>(
    weight: RtpTensor<B>,
    dy: RtpTensor<B>,
) -> RtpTensor<B> {
    let ctx = weight.ctx.clone();
    let op = "linear_x_backward";
    let use_ = use_of(&weight);
    let guess = ctx.linear.pairing.lock().unwrap().guess_x(&weight, &dy);
    // The weight's call, which comes next with this `dy`, learns the forward's layouts here:
    // by `x` it cannot find the record once autodiff has recomputed `x` (activation
    // checkpointing), and without them it would keep a whole per-rank dW.
    let leave_layouts = |dy_id, guess: Guess<B>| {
        let deferred = Deferred::layouts(dy_id, guess);
        ctx.linear.pairing.lock().unwrap().defer(deferred);
    };
    match use_ {
        WeightUse::Whole | WeightUse::Gathered(_) => {
            let dy_id = dy.identity();
            let dy = full_inner(dy, op);
            let w = match use_ {
                WeightUse::Whole => full_inner(weight, op),
                _ => gather_unit(weight, "linear.gather_backward"),
            };
            let dx = local(&ctx, kernels::x_grad_whole::<B>(w.get(), dy.get()));
            if let Some(guess) = guess {
                leave_layouts(dy_id, guess);
            }
            dx
        }
        WeightUse::Rotated(spec) => {
            let dy_id = dy.identity();
            let dy = full_inner(dy, op);
            let w = Some(weight.inner.clone());
            let Some(guess) = guess else {
                let g = backward_pass(&ctx, &spec, w, None, &dy, None, FromForward::none());
                return local(&ctx, g.dx.expect("the weight rotated"));
            };
            let Some((x_id, x)) = guess.x.clone() else {
                // A released input (recomputed by autodiff for the weight's call): dX now,
                // and the layouts for the weight's call, which sends dW around on its own.
                let routing = FromForward {
                    peer_x: None,
                    agreed: guess.agreed.clone(),
                };
                let g = backward_pass(&ctx, &spec, w, None, &dy, None, routing);
                leave_layouts(dy_id, guess);
                let mut split = ctx.linear.split_passes.lock().unwrap();
                if !split.contains(&spec.full.to_vec()) {
                    split.push(spec.full.to_vec());
                }
                drop(split);
                return local(&ctx, g.dx.expect("the weight rotated"));
            };
            let bias_layout = guess.bias_layout;
            let bias = travelling_bias(&bias_layout);
            let routing = FromForward {
                peer_x: guess.peer_x,
                agreed: guess.agreed,
            };
            let g = backward_pass(&ctx, &spec, w, Some(x), &dy, bias, routing);
            let mut deferred = Deferred::new(x_id, dy_id, bias_layout);
            deferred.dw = g.dw.map(RtpTensor::into_placed);
            deferred.db = g.db.map(RtpTensor::into_placed);
            ctx.linear
                .pairing
                .lock()
                .unwrap()
                .defer_guessed(deferred, &weight);
            local(&ctx, g.dx.expect("the weight rotated"))
        }
    }
}

/// dW: computed ahead by the dX pass from these very tensors, or now, by the layout of the
/// weight the forward used.
pub(super) fn weight_backward<B: RotationKernels>(
    x: RtpTensor<B>,
    dy: RtpTensor<B>,
) -> RtpTensor<B> {
    let ctx = x.ctx.clone();
    let op = "linear_weight_backward";
    let mut pairing = ctx.linear.pairing.lock().unwrap();
    if let Some(dw) = pairing.claim_weight(&x, &dy) {
        drop(pairing);
        return RtpTensor::from_placed(ctx, dw);
    }
    let (layouts, routing) = match pairing.claim_layouts(&dy) {
        Some((weight, bias, agreed)) => {
            let routing = FromForward {
                peer_x: None,
                agreed,
            };
            (Some((weight, bias)), routing)
        }
        None => match pairing.take_forward(&x, &dy) {
            Some(f) => {
                let routing = FromForward {
                    peer_x: f.peer_x(),
                    agreed: f.agreed(),
                };
                (Some((f.weight_layout, f.bias_layout)), routing)
            }
            None => (None, FromForward::none()),
        },
    };
    drop(pairing);
    let (x_id, dy_id) = (x.identity(), dy.identity());
    let x = full_inner(x, op);
    let dy = full_inner(dy, op);
    // No record: the weight was not used by a Linear forward of this rank that is still
    // alive. A per-rank gradient is right for any layout (RtpOptimizer averages it).
    let (weight_layout, bias_layout) = layouts.unwrap_or((Layout::Local, None));
    let mut deferred = Deferred::new(x_id, dy_id, bias_layout);
    let dw = match use_of_layout(&weight_layout, &ctx) {
        WeightUse::Whole => {
            let dw = local(&ctx, kernels::weight_grad_whole::<B>(x.get(), dy.get()));
            if weight_layout == Layout::Replicated {
                dw.offer_gradient();
            }
            dw
        }
        WeightUse::Gathered(spec) => {
            let full = kernels::weight_grad_whole::<B>(x.get(), dy.get());
            reduce_scatter_full(&ctx, "linear.reduce_scatter_weight", spec, full)
        }
        WeightUse::Rotated(spec) => {
            let bias = travelling_bias(&deferred.bias_layout);
            let g = backward_pass(&ctx, &spec, None, Some(x.get()), &dy, bias, routing);
            deferred.db = g.db.map(RtpTensor::into_placed);
            g.dw.expect("x travelled")
        }
    };
    // The bias call that follows learns its layout (and finds db) here.
    ctx.linear.pairing.lock().unwrap().defer(deferred);
    dw
}

/// db: computed ahead by the pass of this `dy`, or now, by the layout of the forward's bias.
pub(super) fn bias_backward<B: RotationKernels>(dy: RtpTensor<B>) -> RtpTensor<B> {
    let ctx = dy.ctx.clone();
    let (db, layout) = ctx.linear.pairing.lock().unwrap().claim_bias(&dy);
    if let Some(db) = db {
        return RtpTensor::from_placed(ctx, db);
    }
    let dy = full_inner(dy, "linear_bias_backward");
    // Not known (no forward record): a per-rank gradient, which RtpOptimizer averages.
    let layout = layout.unwrap_or(Layout::Local);
    match use_of_layout(&layout, &ctx) {
        WeightUse::Whole => {
            let db = local(&ctx, B::linear_bias_backward(dy.get()));
            if layout == Layout::Replicated {
                db.offer_gradient();
            }
            db
        }
        WeightUse::Gathered(spec) => {
            let full = B::linear_bias_backward(dy.get());
            reduce_scatter_full(&ctx, "linear.reduce_scatter_bias", spec, full)
        }
        // The bias is split like the weight's columns, so its own spec gives the columns.
        WeightUse::Rotated(spec) => backward_pass(
            &ctx,
            &spec.clone(),
            None,
            None,
            &dy,
            Some(spec),
            FromForward::none(),
        )
        .db
        .expect("the bias travelled"),
    }
}
