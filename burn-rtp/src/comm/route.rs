//! The routing schedule: every rank sends a bundle of tensors to every other rank and
//! receives one from each, in one exchange (an all-to-all).
//!
//! Activation routing is built on it: a rank's activations go to each weight shard's owner,
//! which computes with its own shard and sends back that shard's part of the result. Two
//! all-to-alls make a pass, where rotating the weights takes `N - 1` exchanges with the ring
//! neighbours; each moves what the shapes at hand make smaller (see `backend::strategy::rtp`).
//!
//! Every rank posts all its receives before it starts its sends (`crate::comm::p2p`), so the
//! exchange cannot deadlock on a transport that does not buffer. A received tensor whose shape
//! is not the one the receiver expects is `RtpError::Desync`, naming both shapes.

use crate::comm::context::{Comm, Stamped};
use crate::comm::p2p::{exchange, Leg};
use crate::state::accounting::{Charge, Float};
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use std::sync::Arc;

/// What an all-to-all gave this rank: per rank, in rank order, the bundle it sent here (this
/// rank's own bundle for itself, as it was), and the in-flight charges of what arrived, which
/// stay charged while the caller holds them.
pub(crate) struct Routed<B: Backend> {
    /// One bundle per source rank.
    pub bundles: Vec<Vec<Float<B>>>,
    /// The received buffers' charges.
    pub charges: Vec<Arc<Charge>>,
}

/// Sends `outgoing[p]` to each rank `p` (keeping `outgoing[rank]`) and receives from each peer
/// `p` a bundle whose tensors have the shapes `expect(p)`, in one exchange. Every bundle has
/// the same number of tensors on every rank, of one element type.
pub(crate) fn all_to_all<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    outgoing: Vec<Vec<Float<B>>>,
    expect: impl Fn(usize) -> Vec<Vec<usize>>,
) -> Routed<B> {
    let (rank, n) = (ctx.rank, ctx.world_size);
    assert_eq!(
        outgoing.len(),
        n,
        "rank {rank}: `{op}`: one bundle per rank, got {} for {n} ranks",
        outgoing.len()
    );
    let k = outgoing[rank].len();
    let elem = outgoing
        .iter()
        .flatten()
        .next()
        .map(|t| t.dtype().size())
        .unwrap_or(4);
    let seq = ctx.next_seq();
    if n == 1 {
        // Nothing to exchange: the one bundle is this rank's own.
        return Routed {
            bundles: outgoing,
            charges: Vec::new(),
        };
    }
    // Part numbers tell the messages of one exchange apart: source, destination, tensor.
    let headers = |src: usize, dst: usize, shapes: Vec<Vec<usize>>| -> Vec<Stamped> {
        shapes
            .into_iter()
            .enumerate()
            .map(|(i, shape)| seq.header(op, (src * n + dst) * k + i, shape))
            .collect()
    };
    let peers: Vec<usize> = (0..n).filter(|&p| p != rank).collect();
    let receives = peers
        .iter()
        .map(|&src| Leg {
            peer: src,
            headers: headers(src, rank, expect(src)),
            tensors: &[],
            hold: Vec::new(),
        })
        .collect();
    let sends = peers
        .iter()
        .map(|&dst| {
            let shapes = outgoing[dst].iter().map(|t| t.shape().to_vec()).collect();
            Leg {
                peer: dst,
                headers: headers(rank, dst, shapes),
                tensors: &outgoing[dst],
                // The caller's tensors live until the exchange returns.
                hold: Vec::new(),
            }
        })
        .collect();
    let (_, received) = exchange(ctx, receives, sends, elem, || ());
    let mut received = received.into_iter();
    let mut charges = Vec::new();
    let mut outgoing = outgoing.into_iter();
    let bundles = (0..n)
        .map(|p| {
            let own = outgoing.next().expect("one bundle per rank");
            if p == rank {
                return own;
            }
            let got = received.next().expect("one message per peer");
            charges.extend(got.charges);
            got.tensors
        })
        .collect();
    Routed { bundles, charges }
}
