//! Collectives built on [`crate::p2p`] exchanges: gather a shard into the full tensor,
//! all-reduce (ring reduce-scatter + all-gather, or through the host for small vectors) and
//! the barrier. Every rank sums in rank order, so all ranks get bit-identical results, which
//! keeps replicated values replicated.

use crate::p2p::{exchange, fence, read_host, Leg};
use crate::rotation::{reduce_scatter, rotate_columns};
use crate::sharding::ShardSpec;
use crate::tensor::{Layout, RtpTensor};
use crate::transport::Header;
use crate::world::RankCtx;
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, TensorData, TensorMetadata};
use std::sync::Arc;

/// The full tensor of a sharded one, identical on every rank.
pub(crate) fn all_gather<B: Backend>(
    t: &RtpTensor<B>,
    op: &'static str,
) -> B::FloatTensorPrimitive {
    let Layout::Sharded(spec) = &t.layout else {
        return t.inner.clone();
    };
    let ctx = &t.ctx;
    let seq = ctx.next_seq();
    let (rank, n) = (ctx.rank, ctx.world_size);
    if n == 1 {
        return t.inner.clone();
    }
    let header = |part: usize| Header {
        seq,
        op: op.into(),
        part,
        shape: spec.shard_shape(part).to_vec(),
    };
    // Every rank posts a receive from every other rank, then sends its shard to each.
    let peers: Vec<usize> = (1..n).map(|step| (rank + n - step) % n).collect();
    let own = [t.inner.clone()];
    let receives = peers
        .iter()
        .map(|&src| Leg {
            peer: src,
            headers: vec![header(src)],
            tensors: &[],
        })
        .collect();
    let sends = (1..n)
        .map(|step| Leg {
            peer: (rank + step) % n,
            headers: vec![header(rank)],
            tensors: &own,
        })
        .collect();
    let elem = t.inner.dtype().size();
    let (_, received) = exchange(ctx, receives, sends, elem, || ());
    let mut parts: Vec<Option<B::FloatTensorPrimitive>> = vec![None; n];
    parts[rank] = Some(t.inner.clone());
    for (src, mut got) in peers.into_iter().zip(received) {
        parts[src] = Some(got.tensors.remove(0));
    }
    let parts: Vec<_> = parts
        .into_iter()
        .map(|p| p.expect("one part per rank"))
        .collect();
    let last = spec.full.num_dims() - 1;
    let full = burn_rtp_kernels::assemble_columns::<B>(parts, last);
    fence(ctx);
    full
}

/// Sums a host vector over all ranks; every rank gets the same bits.
pub(crate) fn all_reduce_sum_host<B: Backend>(
    ctx: &RankCtx<B>,
    op: &'static str,
    values: Vec<f32>,
) -> Vec<f32> {
    let (rank, n) = (ctx.rank, ctx.world_size);
    if n == 1 {
        return values;
    }
    let seq = ctx.next_seq();
    let len = values.len();
    let header = |part: usize| Header {
        seq,
        op: op.into(),
        part,
        shape: vec![len],
    };
    let peers: Vec<usize> = (1..n).map(|step| (rank + n - step) % n).collect();
    let own = [B::float_from_data(
        TensorData::new(values.clone(), [len]),
        &ctx.inner,
    )];
    let receives = peers
        .iter()
        .map(|&src| Leg {
            peer: src,
            headers: vec![header(src)],
            tensors: &[],
        })
        .collect();
    let sends = (1..n)
        .map(|step| Leg {
            peer: (rank + step) % n,
            headers: vec![header(rank)],
            tensors: &own,
        })
        .collect();
    let (_, received) = exchange(ctx, receives, sends, 4, || ());
    let mut contributions: Vec<Option<Vec<f32>>> = vec![None; n];
    contributions[rank] = Some(values);
    for (src, mut got) in peers.into_iter().zip(received) {
        let data = read_host::<B>(got.tensors.remove(0));
        contributions[src] = Some(data.convert::<f32>().into_vec::<f32>().unwrap());
    }
    // Summed in rank order on every rank, so every rank gets the same bits.
    let mut sum = vec![0f32; len];
    for c in contributions
        .into_iter()
        .map(|c| c.expect("one part per rank"))
    {
        for (s, v) in sum.iter_mut().zip(c) {
            *s += v;
        }
    }
    sum
}

/// Sums an inner tensor over all ranks (through the host; used for small tensors only).
pub(crate) fn all_reduce_sum<B: Backend>(
    ctx: &Arc<RankCtx<B>>,
    op: &'static str,
    t: B::FloatTensorPrimitive,
) -> B::FloatTensorPrimitive {
    if ctx.world_size == 1 {
        return t;
    }
    let dtype = t.dtype();
    let shape = t.shape();
    let values = read_host::<B>(t)
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap();
    let sum = all_reduce_sum_host(ctx, op, values);
    B::float_from_data(TensorData::new(sum, shape).convert_dtype(dtype), &ctx.inner)
}

/// Blocks until every rank reaches the same barrier.
pub(crate) fn barrier<B: Backend>(ctx: &RankCtx<B>) {
    all_reduce_sum_host(ctx, "barrier", Vec::new());
}

/// Sums an inner tensor over all ranks around the ring: a reduce-scatter of `N` chunks, then
/// an all-gather of the reduced chunks. Each chunk is reduced once, on its home rank, so every
/// rank ends with the same bits.
pub(crate) fn all_reduce_ring<B: Backend>(
    ctx: &Arc<RankCtx<B>>,
    op: &'static str,
    t: B::FloatTensorPrimitive,
) -> B::FloatTensorPrimitive {
    let n = ctx.world_size;
    let shape = t.shape();
    let numel = shape.num_elements();
    if n == 1 {
        return t;
    }
    if numel < n {
        return all_reduce_sum(ctx, op, t);
    }
    let flat = B::float_reshape(t, Shape::new([numel]));
    let spec = ShardSpec {
        full: Shape::new([numel]),
        world: n,
    };
    let chunk = |j: usize| vec![vec![spec.range(j).len]];
    let own = reduce_scatter(ctx, op, chunk, |j| {
        let r = spec.range(j);
        vec![burn_rtp_kernels::column_slice::<B>(
            flat.clone(),
            r.start,
            r.len,
        )]
    })
    .remove(0);
    let full = rotate_columns(
        ctx,
        "all_reduce.all_gather",
        vec![own],
        chunk,
        |_, chunk| chunk[0].clone(),
        |_| 0,
    );
    fence(ctx);
    B::float_reshape(full, shape)
}
