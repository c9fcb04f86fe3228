//! Collectives built from the transport's point-to-point sends: gather a shard into the full
//! tensor, and all-reduce small host vectors. Every rank sums in rank order, so all ranks get
//! bit-identical results, which keeps replicated values replicated.

use crate::rotation::{reduce_scatter, rotate_columns};
use crate::sharding::ShardSpec;
use crate::tensor::{Layout, RtpTensor};
use crate::transport::{BufferKind, Header, Payload};
use crate::world::RankCtx;
use burn::tensor::backend::Backend;
use burn::tensor::{try_read_sync, Shape, TensorData, TensorMetadata};
use std::sync::Arc;

/// Reads an inner tensor to the host.
pub(crate) fn read_host<B: Backend>(t: B::FloatTensorPrimitive) -> TensorData {
    try_read_sync(B::float_into_data(t))
        .expect("blocking reads are supported on native targets")
        .expect("reading a tensor from the inner backend failed")
}

/// Wraps an inner tensor as a payload for this transport.
pub(crate) fn to_payload<B: Backend>(
    ctx: &RankCtx<B>,
    t: B::FloatTensorPrimitive,
) -> Payload<B::FloatTensorPrimitive> {
    match ctx.transport.buffer_kind() {
        BufferKind::Device => Payload::Device(t),
        BufferKind::Host => Payload::Host(read_host::<B>(t)),
    }
}

/// Turns a received payload into an inner tensor on this rank's device.
pub(crate) fn from_payload<B: Backend>(
    ctx: &RankCtx<B>,
    p: Payload<B::FloatTensorPrimitive>,
) -> B::FloatTensorPrimitive {
    match p {
        Payload::Device(t) => t,
        Payload::Host(data) => B::float_from_data(data, &ctx.inner),
    }
}

/// Waits until this rank's queued device work is done.
///
/// Handing a tensor to another rank's thread is only safe once the work that wrote it is
/// complete, and dropping a received tensor only once the work that read it is: an
/// asynchronous backend (wgpu, CUDA) runs each thread's work on its own stream, and the owner
/// may otherwise overwrite a shard in place while a peer's read is still queued. A no-op on
/// synchronous backends such as NdArray.
pub(crate) fn fence<B: Backend>(ctx: &RankCtx<B>) {
    if let Err(e) = B::sync(&ctx.inner) {
        crate::error::raise(crate::RtpError::Transport {
            rank: ctx.rank,
            op: "sync".into(),
            reason: e.to_string(),
        });
    }
}

/// Takes ownership of received tensors: on backends that run ranks on separate streams, each
/// one is copied into a buffer of this rank's stream and the received handle is released only
/// after the copy ran, so no buffer is ever written by one rank while another still uses it.
pub(crate) fn adopt<B: Backend>(
    ctx: &RankCtx<B>,
    received: Vec<B::FloatTensorPrimitive>,
) -> Vec<B::FloatTensorPrimitive> {
    if !ctx.copies_on_receive() {
        return received;
    }
    let own = received
        .iter()
        .map(|t| B::float_mul_scalar(t.clone(), burn::tensor::Scalar::Float(1.0)))
        .collect();
    fence(ctx);
    drop(received);
    own
}

/// Sends an inner tensor and waits until the buffer may be reused.
pub(crate) fn send<B: Backend>(
    ctx: &RankCtx<B>,
    to: usize,
    header: Header,
    t: B::FloatTensorPrimitive,
) {
    fence(ctx);
    let payload = to_payload(ctx, t);
    let handle = ctx.check(ctx.transport.isend(to, header, payload));
    ctx.check(handle.wait());
}

/// Receives an inner tensor.
pub(crate) fn recv<B: Backend>(
    ctx: &RankCtx<B>,
    from: usize,
    expect: Header,
) -> B::FloatTensorPrimitive {
    let handle = ctx.check(ctx.transport.irecv(from, expect));
    let payload = ctx.check(handle.wait());
    adopt(ctx, vec![from_payload(ctx, payload)]).remove(0)
}

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
    for step in 1..n {
        send(ctx, (rank + step) % n, header(rank), t.inner.clone());
    }
    let mut parts = Vec::with_capacity(n);
    for src in 0..n {
        if src == rank {
            parts.push(t.inner.clone());
        } else {
            let shard = recv(ctx, src, header(src));
            ctx.check(check_shape::<B>(
                ctx,
                src,
                op,
                seq,
                &shard,
                &spec.shard_shape(src),
            ));
            parts.push(shard);
        }
    }
    let last = spec.full.num_dims() - 1;
    let full = burn_rtp_kernels::assemble_columns::<B>(parts, last);
    fence(ctx);
    full
}

fn check_shape<B: Backend>(
    ctx: &RankCtx<B>,
    peer: usize,
    op: &str,
    seq: u64,
    t: &B::FloatTensorPrimitive,
    expected: &Shape,
) -> crate::RtpResult<()> {
    if &t.shape() == expected {
        Ok(())
    } else {
        Err(crate::RtpError::Desync {
            rank: ctx.rank,
            peer,
            op: op.to_string(),
            seq,
            expected: format!("shape {:?}", expected.to_vec()),
            got: format!("shape {:?}", t.shape().to_vec()),
        })
    }
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
    let data = TensorData::new(values.clone(), [len]);
    for step in 1..n {
        let handle = ctx.check(ctx.transport.isend(
            (rank + step) % n,
            header(rank),
            Payload::Host(data.clone()),
        ));
        ctx.check(handle.wait());
    }
    let mut sum = vec![0f32; len];
    for src in 0..n {
        let contribution = if src == rank {
            values.clone()
        } else {
            let handle = ctx.check(ctx.transport.irecv(src, header(src)));
            match ctx.check(handle.wait()) {
                Payload::Host(d) => d.convert::<f32>().into_vec::<f32>().unwrap(),
                Payload::Device(t) => read_host::<B>(t)
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .unwrap(),
            }
        };
        for (s, c) in sum.iter_mut().zip(contribution) {
            *s += c;
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
