//! Collectives built on [`crate::comm::p2p`] exchanges: gather a shard into the full tensor,
//! all-reduce (ring reduce-scatter + all-gather, or through the host for small vectors) and
//! the barrier. Every rank sums in rank order, so all ranks get bit-identical results, which
//! keeps replicated values replicated.

use crate::comm::context::{Comm, Stamped};
pub(crate) use crate::comm::p2p::read_host;
use crate::comm::p2p::{exchange, fence, Leg};
use crate::comm::rotation::{reduce_scatter, rotate};
use crate::state::accounting::{Category, Charge};
use crate::state::accounting::{Float, Held};
use crate::state::sharding::Layout;
use crate::state::sharding::ShardSpec;
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, TensorData, TensorMetadata};
use std::sync::Arc;

/// Every rank's tensor on every rank, in rank order: each rank posts a receive from every
/// other rank, then sends its own tensor (under `header(rank)`) to each. The received tensors
/// stay charged as in flight until the returned charges drop.
fn exchange_with_all<B: Backend>(
    ctx: &Comm<B>,
    header: impl Fn(usize) -> Stamped,
    own: B::FloatTensorPrimitive,
) -> (Vec<B::FloatTensorPrimitive>, Vec<Arc<Charge>>) {
    let (rank, n) = (ctx.rank, ctx.world_size);
    let peers: Vec<usize> = (0..n).filter(|&p| p != rank).collect();
    let elem = own.dtype().size();
    let own = [own];
    let receives = peers
        .iter()
        .map(|&src| Leg {
            peer: src,
            headers: vec![header(src)],
            tensors: &[],
            hold: Vec::new(),
        })
        .collect();
    let sends = peers
        .iter()
        .map(|&dst| Leg {
            peer: dst,
            headers: vec![header(rank)],
            tensors: &own,
            // The caller keeps `own` (and its charge) alive through the exchange.
            hold: Vec::new(),
        })
        .collect();
    let (_, received) = exchange(ctx, receives, sends, elem, || ());
    let [own] = own;
    let mut charges = Vec::with_capacity(received.len());
    let mut received = received.into_iter();
    let tensors = (0..n)
        .map(|p| {
            if p == rank {
                own.clone()
            } else {
                let mut got = received.next().expect("one message per peer");
                charges.append(&mut got.charges);
                got.tensors.remove(0)
            }
        })
        .collect();
    (tensors, charges)
}

/// The full tensor of `inner`, this rank's part of a tensor laid out as `layout`, identical
/// on every rank, charged to `cat` (the parts stay charged until the full tensor is). A tensor
/// that is not sharded is its own full tensor.
pub(crate) fn all_gather<B: Backend>(
    ctx: &Comm<B>,
    inner: &Float<B>,
    layout: &Layout,
    op: &'static str,
    cat: Category,
) -> Held<B> {
    let Layout::Sharded(spec) = layout else {
        return Held::new(&ctx.ledger, inner.clone(), cat);
    };
    if ctx.world_size == 1 {
        return Held::new(&ctx.ledger, inner.clone(), cat);
    }
    let seq = ctx.next_seq();
    let header = |part: usize| seq.header(op, part, spec.shard_shape(part).to_vec());
    let (parts, _received) = exchange_with_all(ctx, header, inner.clone());
    let last = spec.full.num_dims() - 1;
    let full = Held::new(
        &ctx.ledger,
        burn_rtp_kernels::assemble_columns::<B>(parts, last),
        cat,
    );
    fence(ctx);
    full
}

/// Every rank's host vector on every rank, in rank order (small vectors only).
pub(crate) fn all_gather_host<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    values: Vec<f32>,
) -> Vec<Vec<f32>> {
    if ctx.world_size == 1 {
        return vec![values];
    }
    let seq = ctx.next_seq();
    let len = values.len();
    let header = |part: usize| seq.header(op, part, vec![len]);
    let own = B::float_from_data(TensorData::new(values, [len]), &ctx.inner);
    exchange_with_all(ctx, header, own)
        .0
        .into_iter()
        .map(|t| {
            read_host::<B>(t)
                .convert::<f32>()
                .into_vec::<f32>()
                .unwrap()
        })
        .collect()
}

/// Sums a host vector over all ranks; every rank gets the same bits.
pub(crate) fn all_reduce_sum_host<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    values: Vec<f32>,
) -> Vec<f32> {
    sum_in_rank_order(all_gather_host(ctx, op, values))
}

/// The element-wise sum of every rank's vector, added in rank order, so every rank that
/// holds the same vectors gets the same bits.
pub(crate) fn sum_in_rank_order(contributions: Vec<Vec<f32>>) -> Vec<f32> {
    let len = contributions.first().map_or(0, Vec::len);
    let mut sum = vec![0f32; len];
    for c in contributions {
        for (s, v) in sum.iter_mut().zip(c) {
            *s += v;
        }
    }
    sum
}

/// Sums an inner tensor over all ranks (through the host; used for small tensors only).
pub(crate) fn all_reduce_sum<B: Backend>(
    ctx: &Comm<B>,
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

/// Every rank's bytes on every rank, in rank order (small host messages: lengths first, then
/// the bytes, each byte carried exactly by one float so that any transport can move them).
pub(crate) fn all_gather_bytes<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    bytes: &[u8],
) -> Vec<Vec<u8>> {
    if ctx.world_size == 1 {
        return vec![bytes.to_vec()];
    }
    // A float holds integers exactly up to 2^24.
    assert!(
        bytes.len() < 1 << 24,
        "rank {}: `{op}` gathers {} bytes; small host messages only",
        ctx.rank,
        bytes.len()
    );
    let floats = |values: Vec<f32>| {
        let len = values.len();
        B::float_from_data(TensorData::new(values, [len]), &ctx.inner)
    };
    let host = |t| {
        read_host::<B>(t)
            .convert::<f32>()
            .into_vec::<f32>()
            .unwrap()
    };
    let seq = ctx.next_seq();
    let lengths: Vec<usize> = exchange_with_all(
        ctx,
        |part| seq.header(op, part, vec![1]),
        floats(vec![bytes.len() as f32]),
    )
    .0
    .into_iter()
    .map(|t| host(t)[0] as usize)
    .collect();
    let seq = ctx.next_seq();
    // Empty messages are sent as one padding byte, so that no tensor has a zero dimension.
    let padded = |len: usize| len.max(1);
    let mut own: Vec<f32> = bytes.iter().map(|&b| f32::from(b)).collect();
    own.resize(padded(bytes.len()), 0.0);
    exchange_with_all(
        ctx,
        |part| seq.header(op, part, vec![padded(lengths[part])]),
        floats(own),
    )
    .0
    .into_iter()
    .zip(&lengths)
    .map(|(t, &len)| host(t)[..len].iter().map(|&v| v as u8).collect())
    .collect()
}

/// Checks that every rank passes the same `(name, value)` settings; a mismatch is a
/// [`RtpError::Disagreement`](crate::RtpError) on every rank, naming the setting and the
/// first rank that differs.
pub(crate) fn agree<B: Backend>(
    ctx: &Comm<B>,
    settings: &[(&str, String)],
) -> crate::RtpResult<()> {
    let own = serde_json::to_vec(settings).expect("strings serialise");
    let all = all_gather_bytes(ctx, "agree", &own);
    // Every rank sees every rank's bytes, so this test gives every rank the same verdict;
    // the loop below only describes the first difference.
    if all.iter().all(|b| *b == own) {
        return Ok(());
    }
    for (peer, theirs) in all.iter().enumerate() {
        let theirs: Vec<(String, String)> =
            serde_json::from_slice(theirs).map_err(|e| crate::RtpError::Transport {
                rank: ctx.rank,
                op: "agree".into(),
                reason: format!("rank {peer} sent unreadable settings: {e}"),
            })?;
        let mismatch = |field: &str, ours: &str, theirs: &str| crate::RtpError::Disagreement {
            rank: ctx.rank,
            peer,
            field: field.to_string(),
            ours: ours.to_string(),
            theirs: theirs.to_string(),
        };
        for (name, ours) in settings {
            let value = theirs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str());
            match value {
                Some(v) if v == ours => {}
                Some(v) => return Err(mismatch(name, ours, v)),
                None => return Err(mismatch(name, ours, "(not set)")),
            }
        }
        if let Some((name, v)) = theirs
            .iter()
            .find(|(n, _)| !settings.iter().any(|(s, _)| s == n))
        {
            return Err(mismatch(name, "(not set)", v));
        }
        if all[peer] != own {
            return Err(mismatch(
                "settings",
                &String::from_utf8_lossy(&own),
                &String::from_utf8_lossy(&all[peer]),
            ));
        }
    }
    unreachable!("some rank's settings differ from this rank's")
}

/// Blocks until every rank reaches the same barrier.
pub(crate) fn barrier<B: Backend>(ctx: &Comm<B>) {
    all_reduce_sum_host(ctx, "barrier", Vec::new());
}

/// Sums a full per-rank tensor over all ranks and keeps this rank's column shard of the sum
/// (a ring reduce-scatter split like `spec`): each rank receives only its shard's share.
pub(crate) fn reduce_scatter_columns<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    spec: &ShardSpec,
    full: B::FloatTensorPrimitive,
) -> B::FloatTensorPrimitive {
    // The full per-rank tensor exists until the reduce-scatter has taken it apart.
    let _full = crate::state::accounting::transient::<B>(&ctx.ledger, std::slice::from_ref(&full));
    let prefix: Vec<usize> = spec.full[..spec.full.num_dims() - 1].to_vec();
    reduce_scatter(
        ctx,
        op,
        |j| {
            let mut s = prefix.clone();
            s.push(spec.range(j).len);
            vec![s]
        },
        |j| {
            let range = spec.range(j);
            vec![burn_rtp_kernels::column_slice::<B>(
                full.clone(),
                range.start,
                range.len,
            )]
        },
    )
    .remove(0)
}

/// Sums an inner tensor over all ranks around the ring (see [`all_reduce_bucket`]).
pub(crate) fn all_reduce_ring<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    t: B::FloatTensorPrimitive,
) -> B::FloatTensorPrimitive {
    if ctx.world_size > 1 && t.shape().num_elements() < ctx.world_size {
        return all_reduce_sum(ctx, op, t);
    }
    all_reduce_bucket(ctx, op, vec![t]).remove(0).consume(|t| t)
}

/// Sums each of `tensors` over all ranks in one trip around the ring: a reduce-scatter of `N`
/// chunks, then an all-gather of the reduced chunks, where chunk `j` of the bucket is chunk
/// `j` of every tensor (flattened), so each message carries a slice of each and no tensor is
/// copied into a bucket buffer first. Each chunk is reduced once, on its home rank, so every
/// rank ends with the same bits, and a tensor gets the same bits in any bucket.
///
/// The sums are charged to this rank as local memory. Every tensor needs at least `N`
/// elements (a chunk is never empty); a smaller one is a panic naming the rank and the op.
pub(crate) fn all_reduce_bucket<B: Backend>(
    ctx: &Comm<B>,
    op: &'static str,
    tensors: Vec<B::FloatTensorPrimitive>,
) -> Vec<Held<B>> {
    let n = ctx.world_size;
    if n == 1 {
        return tensors
            .into_iter()
            .map(|t| Held::new(&ctx.ledger, t, Category::Local))
            .collect();
    }
    let shapes: Vec<Shape> = tensors.iter().map(|t| t.shape()).collect();
    if let Some(small) = shapes.iter().find(|s| s.num_elements() < n) {
        panic!(
            "rank {}: `{op}` cannot split a tensor of shape {:?} into {n} chunks",
            ctx.rank,
            small.to_vec()
        );
    }
    let specs: Vec<ShardSpec> = shapes
        .iter()
        .map(|s| ShardSpec {
            full: Shape::new([s.num_elements()]),
            world: n,
        })
        .collect();
    let flat: Vec<B::FloatTensorPrimitive> = tensors
        .into_iter()
        .zip(&specs)
        .map(|(t, spec)| B::float_reshape(t, spec.full.clone()))
        .collect();
    let chunk = |j: usize| -> Vec<Vec<usize>> {
        specs.iter().map(|spec| vec![spec.range(j).len]).collect()
    };
    let own = reduce_scatter(ctx, op, chunk, |j| {
        flat.iter()
            .zip(&specs)
            .map(|(t, spec)| {
                let r = spec.range(j);
                burn_rtp_kernels::column_slice::<B>(t.clone(), r.start, r.len)
            })
            .collect()
    });
    drop(flat);
    // Each tensor's reduced chunks, in chunk order, joined once all are here: one copy into a
    // buffer that is never zero-filled first (a preallocated output would be).
    // Each chunk stays alive, and charged, until its tensor is joined.
    let mut parts: Vec<Vec<Option<Held<B>>>> = specs
        .iter()
        .map(|_| (0..n).map(|_| None).collect())
        .collect();
    rotate(ctx, "all_reduce.all_gather", own, chunk, |j, chunks| {
        for (slots, piece) in parts.iter_mut().zip(chunks) {
            slots[j] = Some(Held::new(&ctx.ledger, piece.clone(), Category::Local));
        }
    });
    let sums = parts
        .into_iter()
        .zip(shapes)
        .map(|(slots, shape)| {
            let slots: Vec<Held<B>> = slots
                .into_iter()
                .map(|p| p.expect("the ring showed every chunk"))
                .collect();
            let joined =
                burn_rtp_kernels::assemble_columns::<B>(slots.iter().map(Held::get).collect(), 0);
            // Charged before the chunks' charges drop with `slots`.
            Held::new(
                &ctx.ledger,
                B::float_reshape(joined, shape),
                Category::Local,
            )
        })
        .collect();
    fence(ctx);
    sums
}
