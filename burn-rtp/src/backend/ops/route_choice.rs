//! Which way a sharded Linear's pass goes (the weights rotate, or the activations are routed
//! to the shards' owners), decided alike on every rank.
//!
//! Ranks may pass a Linear different numbers of rows (an uneven last batch), and each pass's
//! schedule must be the same on every rank, so a pass decides only from what every rank
//! knows alike:
//!
//! * **the forward's record**: the backward, and Linears fed the same `x` (attention's query,
//!   key and value), decide from what their forward agreed;
//! * **the rows the ranks last agreed**, for a forward that this decides to rotate, for up to
//!   [`DECIDE_FROM_LAST`](crate::backend::pairing::DECIDE_FROM_LAST) forwards: rotation needs no peer's shape and is right whatever the
//!   rows, so a stale figure costs at most a better choice;
//! * **an agreement now** ([`routed::agree_dims`](super::routed::agree_dims)): one small
//!   all-gather of every rank's input shape, which every pass that routes needs.
//!
//! Every rank runs the same graph, so every rank takes each of these at the same passes. The
//! records are found by the identity of `x`, so this assumes that an op makes a new tensor,
//! or not, alike on every rank: an op that returned its input unchanged on some ranks only
//! (a slice covering the whole of one rank's rows) would make those ranks find a record the
//! others do not, and their next exchanges would fail with a typed error (a `Desync` naming
//! both messages, or the peer timeout) rather than mix data.

use crate::backend::pairing::{Agreed, PeerInputs, WorldDims};
use crate::backend::rank::RankCtx;
use crate::backend::strategy::LinearPass;
use burn::tensor::backend::Backend;

/// What a forward that may have routed left for its backward pass.
pub(super) struct FromForward<B: Backend> {
    /// The peers' inputs on this rank as their owner, where the forward routed and kept them.
    pub(super) peer_x: Option<PeerInputs<B>>,
    /// What the ranks agreed for the forward.
    pub(super) agreed: Option<Agreed>,
}

impl<B: Backend> FromForward<B> {
    /// Nothing known from a forward: a pass that may route agrees the shapes itself.
    pub(super) fn none() -> Self {
        Self {
            peer_x: None,
            agreed: None,
        }
    }
}

/// `dims` with its last dimension replaced by `last`.
pub(super) fn with_last(dims: &[usize], last: usize) -> Vec<usize> {
    let mut dims = dims.to_vec();
    let n = dims.len();
    dims[n - 1] = last;
    dims
}

/// Rows per rank: the mean over every rank's input shape.
pub(super) fn mean_rows(world: &WorldDims) -> f64 {
    let rows = |d: &Vec<usize>| d[..d.len() - 1].iter().product::<usize>();
    world.iter().map(rows).sum::<usize>() as f64 / world.len().max(1) as f64
}

/// Whether `pass` routes (its `rows` are filled in here), and what that was decided on, for
/// the record: `known` from the forward, else (for a forward: `recent`) the rows the ranks
/// last agreed where they decide to rotate, else an agreement now of every rank's input
/// shape, this rank's being `own()`. `(false, None)` where the strategy never routes.
pub(super) fn decide<B: Backend>(
    ctx: &RankCtx<B>,
    mut pass: LinearPass,
    known: Option<Agreed>,
    recent: bool,
    own: impl FnOnce() -> Vec<usize>,
) -> (bool, Option<Agreed>) {
    if !ctx.may_route() {
        return (false, None);
    }
    let mut routes = |rows: f64| {
        pass.rows = rows;
        ctx.routes_activations(&pass)
    };
    let known = known.or_else(|| {
        let rows = recent.then(|| ctx.linear.recent_rows()).flatten()?;
        Some(Agreed { world: None, rows })
    });
    if let Some(agreed) = known {
        let route = routes(agreed.rows);
        // Rotation is right whatever the rows; routing needs every rank's shape.
        if !route || agreed.world.is_some() {
            return (route, Some(agreed));
        }
    }
    let world = super::routed::agree_dims(ctx, &own());
    let rows = mean_rows(&world);
    ctx.linear.agreed_rows(rows);
    let agreed = Agreed {
        world: Some(world),
        rows,
    };
    (routes(rows), Some(agreed))
}
