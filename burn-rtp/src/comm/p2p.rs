//! Point-to-point exchanges between ranks, on top of the [`Transport`](crate::comm::transport).
//!
//! The one rule that keeps every pattern deadlock-free on transports that do not buffer (MPI's
//! rendezvous protocol for large messages, NCCL): a rank posts all receives of an exchange
//! before it starts its sends, and waits for its sends only after that. [`exchange`] and
//! [`swap`] (which is an `exchange`, or on a transport that buffers sends, a send completed
//! before its receive is posted) are the only ways the rest of the crate moves tensors, so
//! the rule holds everywhere:
//!
//! 1. post the receives;
//! 2. start the sends (and flush the transport, which may hold posted calls to issue them
//!    together);
//! 3. run the caller's compute;
//! 4. wait for the sends and the receives.
//!
//! Every message carries a header made from a [`Seq`](crate::comm::context::Seq), which only
//! `Comm::next_seq` hands out. Rotation and collectives are built on this module; it knows
//! nothing of either.

use crate::comm::context::{Comm, Stamped};
use crate::comm::transport::{BufferKind, Header, Payload, RecvHandle, SendHandle};
use crate::state::accounting::Float;
use crate::state::accounting::{bytes_of, bytes_of_shapes, Category, Charge};
use crate::state::timeline::IntervalKind;
use burn::tensor::backend::Backend;
use burn::tensor::{try_read_sync, TensorData, TensorMetadata};
use std::sync::Arc;

/// Reads an inner tensor to the host.
pub(crate) fn read_host<B: Backend>(t: Float<B>) -> TensorData {
    try_read_sync(B::float_into_data(t))
        .expect("blocking reads are supported on native targets")
        .expect("reading a tensor from the inner backend failed")
}

/// A copy of `t` in a buffer of its own, at memory speed (`x · 1 = x` for every float,
/// −0 and infinities included).
fn fresh_copy<B: Backend>(t: &Float<B>) -> Float<B> {
    B::float_mul_scalar(t.clone(), burn::tensor::Scalar::Float(1.0))
}

/// One message's payload per tensor, and the charge of the host copies they carry.
struct Payloads<B: Backend> {
    payloads: Vec<Payload<Float<B>>>,
    /// A byte transport sends from a host copy of each tensor it cannot read in place, which
    /// lives until the last send of it completes (device handles and in-place views are the
    /// tensors' own buffers: no charge).
    copies: Option<Arc<Charge>>,
}

impl<B: Backend> Clone for Payloads<B> {
    fn clone(&self) -> Self {
        Self {
            payloads: self.payloads.clone(),
            copies: self.copies.clone(),
        }
    }
}

/// Wraps inner tensors as payloads for this transport.
fn to_payloads<B: Backend>(ctx: &Comm<B>, tensors: &[Float<B>]) -> Payloads<B> {
    if ctx.transport.buffer_kind() == BufferKind::Device {
        return Payloads {
            payloads: tensors.iter().cloned().map(Payload::Device).collect(),
            copies: None,
        };
    }
    // The rank still holds each tensor. Where the backend allows it, the send reads it in
    // place (`host_view`). Elsewhere its buffer is shared, and burn-ndarray reads a shared
    // buffer to the host element by element through a dynamic-rank iterator (measured: most
    // of an MPI rank's CPU time); a fresh copy, made at memory speed, is read without another
    // copy.
    let mut copied = 0;
    let payloads = tensors
        .iter()
        .map(|t| match crate::comm::host_view::view::<B>(t) {
            Some(bytes) => Payload::Borrowed(bytes),
            None => {
                let data = read_host::<B>(fresh_copy::<B>(t));
                copied += data.as_bytes().len();
                Payload::Host(Arc::new(data))
            }
        })
        .collect();
    Payloads {
        payloads,
        copies: (copied > 0).then(|| ctx.ledger.charge(Category::InFlight, copied)),
    }
}

/// Turns a received payload into an inner tensor: host payloads on this rank's device, a
/// device payload where its sender left it ([`adopt`] moves it).
fn from_payload<B: Backend>(ctx: &Comm<B>, p: Payload<Float<B>>) -> Float<B> {
    match p {
        Payload::Device(t) => t,
        // A received message's data is its own (the `Arc` is unique): no copy.
        Payload::Host(data) => B::float_from_data(
            Arc::try_unwrap(data).unwrap_or_else(|shared| (*shared).clone()),
            &ctx.inner,
        ),
        // Only sends borrow; a transport that hands a send over as it is gets a copy.
        Payload::Borrowed(bytes) => B::float_from_data(
            TensorData::from_bytes_vec(bytes.bytes().to_vec(), bytes.shape(), bytes.dtype()),
            &ctx.inner,
        ),
    }
}

/// Waits until this rank's queued device work is done.
///
/// Handing a tensor to another rank's thread is only safe once the work that wrote it is
/// complete, and dropping a received tensor only once the work that read it is: an
/// asynchronous backend (wgpu, CUDA) runs each thread's work on its own stream, and the owner
/// may otherwise overwrite a shard in place while a peer's read is still queued. A no-op on
/// synchronous backends such as NdArray.
pub(crate) fn fence<B: Backend>(ctx: &Comm<B>) {
    if let Err(e) = B::sync(&ctx.inner) {
        crate::error::raise(crate::RtpError::Transport {
            rank: ctx.rank,
            op: "sync".into(),
            reason: e.to_string(),
        });
    }
}

/// Takes ownership of received tensors, each on this rank's device.
///
/// A tensor from a rank on another device (another GPU, another wgpu client) is copied here
/// through the host: this rank's kernels cannot read another device's handles. On backends
/// that run ranks on separate streams of one device, each one is copied into a buffer of this
/// rank's stream and the received handle is released only after the copy ran, so no buffer is
/// ever written by one rank while another still uses it. The rank's background worker runs on
/// a stream of its own too, so what it computed is taken over the same way.
pub(crate) fn adopt<B: Backend>(ctx: &Comm<B>, received: Vec<Float<B>>) -> Vec<Float<B>> {
    let mut copied_from = Vec::new();
    let own = received
        .into_iter()
        .map(|t| {
            if B::float_device(&t) != ctx.inner {
                // Through the host: Burn 0.21's `float_to_device` on cubecl backends needs the
                // runtime's server-to-server transfers, which cubecl-wgpu does not implement.
                B::float_from_data(read_host::<B>(t), &ctx.inner)
            } else if ctx.copies_on_receive() {
                let own = fresh_copy::<B>(&t);
                copied_from.push(t);
                own
            } else {
                t
            }
        })
        .collect();
    if !copied_from.is_empty() {
        fence(ctx);
        drop(copied_from);
    }
    own
}

/// A posted receive with the header it expects.
type PostedRecv<B> = (Header, Box<dyn RecvHandle<Float<B>>>);

/// Receives posted from one peer, charged as in flight until their tensors are dropped.
pub(crate) struct Posted<B: Backend> {
    from: usize,
    handles: Vec<PostedRecv<B>>,
    charges: Vec<Arc<Charge>>,
    started: Option<std::time::Instant>,
}

/// Received tensors with the in-flight charge of their buffers.
pub(crate) struct Received<B: Backend> {
    /// The tensors, in the order their headers were posted.
    pub tensors: Vec<Float<B>>,
    /// One per tensor, held as long as it is.
    pub charges: Vec<Arc<Charge>>,
}

/// Posts the receives of `expect` from `from`.
pub(crate) fn post<B: Backend>(
    ctx: &Comm<B>,
    from: usize,
    expect: Vec<Stamped>,
    elem: usize,
) -> Posted<B> {
    let shapes: Vec<Vec<usize>> = expect.iter().map(|h| h.header().shape.clone()).collect();
    let started = ctx.timeline.start();
    let handles = expect
        .into_iter()
        .map(|h| {
            let h = h.into_header();
            (h.clone(), ctx.check(ctx.transport.irecv(from, h)))
        })
        .collect();
    // Charged after posting: a message already waiting in the inbox stayed charged to its
    // sender until the receive took it, so the two never count the same buffer twice.
    let charges = shapes
        .iter()
        .map(|s| {
            ctx.ledger.charge(
                Category::InFlight,
                bytes_of_shapes(std::slice::from_ref(s), elem),
            )
        })
        .collect();
    Posted {
        from,
        handles,
        charges,
        started,
    }
}

/// Waits for posted receives; checks that each tensor has the shape its header announced.
pub(crate) fn complete<B: Backend>(ctx: &Comm<B>, posted: Posted<B>) -> Received<B> {
    let from = posted.from;
    let received = posted
        .handles
        .into_iter()
        .map(|(header, h)| {
            let waited = ctx.timeline.start();
            let got = h.wait();
            ctx.timeline.finish(IntervalKind::Wait, waited);
            let t = from_payload(ctx, ctx.check(got));
            if t.shape().to_vec() != header.shape {
                crate::error::raise(crate::RtpError::Desync {
                    rank: ctx.rank,
                    peer: from,
                    op: header.op.to_string(),
                    seq: header.seq,
                    expected: format!("shape {:?}", header.shape),
                    got: format!("shape {:?}", t.shape().to_vec()),
                });
            }
            t
        })
        .collect();
    ctx.timeline.finish(IntervalKind::Transfer, posted.started);
    Received {
        tensors: adopt(ctx, received),
        charges: posted.charges,
    }
}

/// Sends started to one or more peers; wait before reusing or dropping their buffers.
pub(crate) struct Started(Vec<Box<dyn SendHandle>>);

/// Starts sending `payloads` to `to`, one message per payload under the matching header.
/// `hold` are the charges of the tensors' buffers, which a waiting message keeps alive (with
/// the charge of the host copies it is sent from).
/// The caller fenced the tensors (they must be written before another rank reads them).
fn start<B: Backend>(
    ctx: &Comm<B>,
    to: usize,
    headers: Vec<Stamped>,
    payloads: Payloads<B>,
    hold: &[Arc<Charge>],
) -> Started {
    let mut hold = hold.to_vec();
    hold.extend(payloads.copies);
    let bytes: usize = (payloads.payloads.iter())
        .map(|p| match p {
            Payload::Device(t) => bytes_of(t),
            Payload::Host(data) => data.bytes.len(),
            Payload::Borrowed(b) => b.bytes().len(),
        })
        .sum();
    ctx.message_bytes
        .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
    Started(
        headers
            .into_iter()
            .zip(payloads.payloads)
            .map(|(h, payload)| {
                ctx.check(
                    ctx.transport
                        .isend(to, h.into_header(), payload, hold.clone()),
                )
            })
            .collect(),
    )
}

/// Waits until every started send's buffer may be reused.
pub(crate) fn finish<B: Backend>(ctx: &Comm<B>, started: Started) {
    let waited = ctx.timeline.start();
    for h in started.0 {
        ctx.check(h.wait());
    }
    ctx.timeline.finish(IntervalKind::Wait, waited);
}

/// One message of an exchange: the peer and, per tensor, its header.
pub(crate) struct Leg<'a, B: Backend> {
    /// The peer rank.
    pub peer: usize,
    /// One header per tensor, each from the collective's [`Seq`](crate::comm::context::Seq).
    pub headers: Vec<Stamped>,
    /// The tensors to send (empty for a receive).
    pub tensors: &'a [Float<B>],
    /// The charges of the tensors sent, kept alive while a message waits to be taken.
    pub hold: Vec<Arc<Charge>>,
}

/// Exchanges messages with any set of peers and runs `compute` while they move: posts every
/// receive, starts every send, computes, then waits for all of them. Returns the result of
/// `compute` and, per receive leg in order, the received tensors.
pub(crate) fn exchange<B: Backend, R>(
    ctx: &Comm<B>,
    receives: Vec<Leg<'_, B>>,
    sends: Vec<Leg<'_, B>>,
    elem: usize,
    compute: impl FnOnce() -> R,
) -> (R, Vec<Received<B>>) {
    ctx.exchanges
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let posted: Vec<Posted<B>> = receives
        .into_iter()
        .map(|leg| post(ctx, leg.peer, leg.headers, elem))
        .collect();
    // The tensors must be written before another rank's thread may read them.
    if !sends.is_empty() {
        fence(ctx);
    }
    // Legs that send the same tensors (an all-gather sends one shard to every peer) share
    // their payloads: one view or one host copy.
    let mut read: Option<(&[Float<B>], Payloads<B>)> = None;
    let started: Vec<Started> = sends
        .into_iter()
        .map(|leg| {
            let payloads = match &read {
                Some((sent, payloads)) if std::ptr::eq(*sent, leg.tensors) => payloads.clone(),
                _ => {
                    let payloads = to_payloads(ctx, leg.tensors);
                    read = Some((leg.tensors, payloads.clone()));
                    payloads
                }
            };
            start(ctx, leg.peer, leg.headers, payloads, &leg.hold)
        })
        .collect();
    drop(read);
    // Every receive and send of the exchange is issued before the compute starts.
    ctx.check(ctx.transport.flush());
    let out = compute();
    for s in started {
        finish(ctx, s);
    }
    let received = posted.into_iter().map(|p| complete(ctx, p)).collect();
    (out, received)
}

/// Swaps a buffer with the ring neighbours: sends `buffer` to `to` and receives the buffer
/// from `from`. Where the transport buffers sends, this rank lets go of its own buffer before
/// it posts the receive (the message keeps the `held` charges until the neighbour takes it);
/// otherwise this is an [`exchange`], and both buffers exist while the messages move.
#[allow(clippy::too_many_arguments)]
pub(crate) fn swap<B: Backend>(
    ctx: &Comm<B>,
    from: usize,
    incoming: Vec<Stamped>,
    to: usize,
    outgoing: Vec<Stamped>,
    buffer: Vec<Float<B>>,
    held: Vec<Arc<Charge>>,
    elem: usize,
) -> Received<B> {
    if ctx.transport.buffers_sends() {
        ctx.exchanges
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        fence(ctx);
        let started = start(ctx, to, outgoing, to_payloads(ctx, &buffer), &held);
        finish(ctx, started);
        drop(buffer);
        drop(held);
        return complete(ctx, post(ctx, from, incoming, elem));
    }
    let recv = Leg {
        peer: from,
        headers: incoming,
        tensors: &[],
        hold: Vec::new(),
    };
    let send = Leg {
        peer: to,
        headers: outgoing,
        tensors: &buffer,
        hold: held,
    };
    let (_, mut received) = exchange(ctx, vec![recv], vec![send], elem, || ());
    received.remove(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::tensor::ops::FloatTensorOps;

    /// A byte transport sends the fresh copy's bits, so the copy must keep every bit: −0,
    /// infinities, subnormals and the extremes (adding 0 instead would turn −0 into +0).
    #[test]
    fn a_fresh_copy_keeps_every_bit() {
        let values = [
            -0.0f32,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE / 8.0,
            -f32::MIN_POSITIVE / 3.0,
            f32::MAX,
            f32::MIN,
            1.5,
            -2.25e-30,
        ];
        let device = Default::default();
        let t = NdArray::<f32>::float_from_data(TensorData::new(values.to_vec(), [2, 5]), &device);
        let copy = read_host::<NdArray<f32>>(fresh_copy::<NdArray<f32>>(&t));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(copy.as_slice::<f32>().unwrap()), bits(&values));
        assert_eq!(copy.shape.dims::<2>(), [2, 5]);
        // The original is untouched and still readable.
        let original = read_host::<NdArray<f32>>(t);
        assert_eq!(bits(original.as_slice::<f32>().unwrap()), bits(&values));
    }
}
