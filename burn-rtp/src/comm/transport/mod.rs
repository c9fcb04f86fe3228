//! Point-to-point transport between the ranks of a ring, plus the abort signal.
//!
//! Collectives (all-gather, all-reduce, barrier) are built on top of these primitives in
//! `crate::comm::collectives`, so a new transport (MPI, NCCL) only has to move buffers.

#[cfg(feature = "mpi")]
mod arena;
mod in_process;
#[cfg(feature = "mpi")]
mod mpi;
// The control messages' encoding is pure, and tested without CUDA.
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
mod nccl;
// Pure pacing logic: compiled (and tested) without MPI too.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
mod progress;
#[cfg(feature = "mpi")]
mod sched;

pub use in_process::{HubOptions, InProcessHub, InProcessTransport};
#[cfg(feature = "mpi")]
pub use mpi::{MpiEndpoint, MpiTransport};
#[cfg(feature = "nccl")]
pub use nccl::{NcclEndpoint, NcclTransport};

/// The launcher's environment is configuration; it is named here too, where MPI users look.
pub use crate::config::{mpi_launch, MpiLaunch};

use crate::error::RtpResult;
use crate::state::accounting::Charge;
use burn::tensor::TensorData;
use std::borrow::Cow;
use std::sync::Arc;

/// The failure of a transport's `op` on `rank`.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn transport_error(rank: usize, op: &str, reason: impl Into<String>) -> crate::RtpError {
    crate::RtpError::Transport {
        rank,
        op: op.to_string(),
        reason: reason.into(),
    }
}

/// Which kind of buffer a transport moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferKind {
    /// Backend tensor handles (same-host hand-over, or device-to-device such as NCCL).
    Device,
    /// Host bytes (MPI and other byte transports).
    Host,
}

/// One message's payload: a backend tensor or host data.
#[derive(Debug, Clone)]
pub enum Payload<T> {
    /// A backend tensor primitive, handed over without a copy where possible.
    Device(T),
    /// Host data, shared: a tensor sent to several peers (an all-gather) is read to the host
    /// once, and every send reads its bytes from that one copy.
    Host(Arc<TensorData>),
    /// A tensor the sender still holds, read in place by a byte transport (no host copy).
    /// Only sent: a receive yields [`Payload::Host`].
    Borrowed(Arc<dyn HostBytes>),
}

/// A tensor's bytes, read where they lie: the value keeps the tensor alive, and nobody writes
/// a tensor while it is shared (copy-on-write), so a byte transport may send from them.
///
/// # Safety
/// A byte transport hands `bytes`' memory to MPI, which reads it from another thread until the
/// send completes. For as long as the value lives, `bytes` must return the same slice (pointer
/// and length), and nothing may write or free that memory.
pub unsafe trait HostBytes: Send + Sync + std::fmt::Debug {
    /// The elements' bytes, in row-major order.
    fn bytes(&self) -> &[u8];
    /// The element type.
    fn dtype(&self) -> burn::tensor::DType;
    /// The shape.
    fn shape(&self) -> Vec<usize>;
}

/// Identifies a message so that the receiver can check both sides run the same op.
///
/// It crosses process boundaries (serde), so the op name is owned once deserialised and
/// borrowed (no allocation) when built in-process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Header {
    /// Collective sequence number of the op on the sending rank.
    pub seq: u64,
    /// Name of the op.
    pub op: Cow<'static, str>,
    /// Step or shard index inside the op.
    pub part: usize,
    /// Shape of the payload.
    pub shape: Vec<usize>,
}

impl Header {
    /// Checks that the message `got` from `peer` is the one this (expected) header describes;
    /// a difference means the two ranks' programs diverged.
    pub fn check(&self, got: &Header, rank: usize, peer: usize) -> RtpResult<()> {
        if got == self {
            return Ok(());
        }
        Err(crate::RtpError::Desync {
            rank,
            peer,
            op: self.op.to_string(),
            seq: self.seq,
            expected: self.to_string(),
            got: got.to_string(),
        })
    }
}

impl std::fmt::Display for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` #{} part {} shape {:?}",
            self.op, self.seq, self.part, self.shape
        )
    }
}

/// Completion handle of a posted receive.
pub trait RecvHandle<T>: Send {
    /// Blocks until the message arrives, the peer fails, or the timeout passes.
    fn wait(self: Box<Self>) -> RtpResult<Payload<T>>;
}

/// Completion handle of a posted send.
pub trait SendHandle: Send {
    /// Blocks until the send buffer may be reused.
    fn wait(self: Box<Self>) -> RtpResult<()>;
}

/// The ring transport a rank talks through. One instance per rank.
pub trait Transport<T: Send + 'static>: Send + Sync {
    /// This rank's index.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Which buffers this transport wants.
    fn buffer_kind(&self) -> BufferKind;
    /// Whether a send completes without waiting for its receive (the message then owns the
    /// buffer until it is taken). In-place rotation then lets go of its buffer before it posts
    /// its receive; on transports that do not buffer (MPI's rendezvous protocol, NCCL) it
    /// must exchange.
    fn buffers_sends(&self) -> bool {
        false
    }
    /// Starts sending `payload` to rank `to`. `hold` are the sender's charges for the
    /// payload's buffer: a transport that hands the buffer itself over keeps them alive until
    /// the receiver takes the message, so a message waiting in an inbox stays counted (once,
    /// to its sender) even after the sender has moved on.
    fn isend(
        &self,
        to: usize,
        header: Header,
        payload: Payload<T>,
        hold: Vec<Arc<Charge>>,
    ) -> RtpResult<Box<dyn SendHandle>>;
    /// Posts a receive of the message `expect` from rank `from`.
    fn irecv(&self, from: usize, expect: Header) -> RtpResult<Box<dyn RecvHandle<T>>>;
    /// Issues the receives and sends posted since the last flush. A transport may hold them
    /// until then (or until a wait), to issue an exchange's calls together; MPI's does, so
    /// that its communication thread starts the send before it copies the message that
    /// arrived for the same exchange.
    fn flush(&self) -> RtpResult<()> {
        Ok(())
    }
    /// Tells every rank that this one failed, so that nobody waits for it.
    fn abort(&self, reason: &str);
    /// Tells every rank that this one finished its program.
    fn mark_exited(&self);
    /// Starts (or stops) logging when received bytes were really moving, by the transport's
    /// own clock. Transports that hand buffers over without moving bytes log nothing.
    fn record_wire(&self, _on: bool) {}
    /// The intervals logged since the last call: from the moment a message's bytes started
    /// to arrive (MPI matched it) to the moment the last byte landed.
    fn take_wire(&self) -> Vec<(std::time::Instant, std::time::Instant)> {
        Vec::new()
    }
    /// Bytes of tensor data this rank has sent since the transport started, counted where
    /// they are handed to the wire (message envelopes not included). Transports that hand
    /// buffers over without moving bytes count nothing.
    fn sent_bytes(&self) -> u64 {
        0
    }
    /// How this transport waits while bytes are in flight, and why, for reports (`None`:
    /// nothing to choose, as in-process).
    fn progress_policy(&self) -> Option<String> {
        None
    }
}
