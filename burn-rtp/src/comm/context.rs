//! What the communication layers read: who this rank is, how it reaches its peers, and what
//! it counts while bytes move.
//!
//! [`Comm`] holds no op-level state (no Linear pairing, no parameter streams, no shard IO):
//! `p2p`, `rotation` and `collectives` take a `&Comm`, so they cannot reach what the backend's
//! ops decide, and the op layer owns one `Comm` inside its rank context.

use crate::comm::background::Background;
use crate::comm::transport::{Header, Transport};
use crate::config::RtpConfig;
use crate::error::{raise, RtpResult};
use crate::state::accounting::Ledger;
use crate::state::timeline::{IntervalKind, Timeline};
use burn::tensor::backend::Backend;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One rank's communication context: identity, transport, sequence numbers and counters.
pub(crate) struct Comm<B: Backend> {
    /// This rank's index in the world.
    pub(crate) rank: usize,
    /// The number of ranks.
    pub(crate) world_size: usize,
    /// The world this rank belongs to (distinct for worlds alive at the same time).
    pub(crate) world_id: u64,
    /// The inner backend's device, where received tensors are made.
    pub(crate) inner: B::Device,
    /// How tensors reach the other ranks.
    pub(crate) transport: Arc<dyn Transport<B::FloatTensorPrimitive>>,
    /// The world's settings (rotation mode, timeouts, strategy).
    pub(crate) config: RtpConfig,
    /// This rank's memory ledger; buffers in flight are charged to it.
    pub(crate) ledger: Arc<Ledger>,
    /// Compute, transfer and wait intervals of the rotation.
    pub(crate) timeline: Timeline,
    /// Exchanges with the ring neighbours (each one synchronisation).
    pub(crate) exchanges: AtomicU64,
    /// Bytes of tensor data this rank's messages carried to its peers, on any transport (an
    /// in-process one hands the tensors over instead of moving bytes, and counts them too).
    pub(crate) message_bytes: AtomicU64,
    /// Collectives running behind the rank's compute (DDP's bucket all-reduces).
    pub(crate) background: Background,
    seq: AtomicU64,
    copy_on_receive: bool,
}

impl<B: Backend> Comm<B> {
    /// The context of `rank` of a world configured by `config`; whether received tensors are
    /// copied into the rank's own buffers is decided here, once.
    pub(crate) fn new(
        rank: usize,
        world_id: u64,
        inner: B::Device,
        transport: Arc<dyn Transport<B::FloatTensorPrimitive>>,
        config: RtpConfig,
    ) -> RtpResult<Self> {
        crate::config::check_rank(rank, config.world_size)?;
        let ledger = Ledger::for_rank(rank, config.memory_cap);
        let copy_on_receive = config
            .copy_on_receive
            .unwrap_or_else(|| !B::name(&inner).starts_with("ndarray"));
        Ok(Self {
            rank,
            world_size: config.world_size,
            world_id,
            inner,
            transport,
            config,
            ledger,
            timeline: Timeline::default(),
            exchanges: AtomicU64::new(0),
            message_bytes: AtomicU64::new(0),
            background: Background::default(),
            seq: AtomicU64::new(0),
            copy_on_receive,
        })
    }

    /// Next collective sequence number; equal on every rank that runs the same program.
    ///
    /// Every collective starts here, so this is where the rank's thread waits for its
    /// background collectives first: their messages and sequence numbers then come before its
    /// own on every rank alike (see `comm::background`). [`Seq`] has no other constructor, so
    /// no message can skip this wait.
    pub(crate) fn next_seq(&self) -> Seq {
        self.wait_background();
        Seq(self.seq.fetch_add(1, Ordering::Relaxed))
    }

    /// Waits until the rank's background collectives are done (recorded as a wait: it is the
    /// part of their time the rank's compute did not hide). A no-op on the worker itself.
    pub(crate) fn wait_background(&self) {
        if self.background.idle() || crate::state::timeline::on_background_thread() {
            return;
        }
        let started = self.timeline.start();
        self.background.drain();
        self.timeline.finish(IntervalKind::Wait, started);
    }

    /// Whether received shards are copied into this rank's own buffers (see
    /// [`RtpConfig::copy_on_receive`](crate::RtpConfig)).
    pub(crate) fn copies_on_receive(&self) -> bool {
        self.copy_on_receive
    }

    /// Unwraps a transport result inside a backend op, where errors can only unwind.
    pub(crate) fn check<T>(&self, result: RtpResult<T>) -> T {
        match result {
            Ok(v) => v,
            Err(e) => raise(e),
        }
    }
}

/// A collective's sequence number. Only [`Comm::next_seq`] makes one, and a message header
/// can only be made from one ([`Seq::header`]), so every message `p2p` moves carries a number
/// taken after the rank's thread waited for its background worker: the two never interleave
/// their messages, which would pair different collectives on different ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seq(u64);

impl Seq {
    /// The header of part `part` of this collective, named `op`, a tensor of `shape`.
    pub(crate) fn header(self, op: &'static str, part: usize, shape: Vec<usize>) -> Stamped {
        Stamped(Header {
            seq: self.0,
            op: op.into(),
            part,
            shape,
        })
    }
}

/// A message header made from a [`Seq`]: what `p2p` sends under and expects.
#[derive(Clone, Debug)]
pub(crate) struct Stamped(Header);

impl Stamped {
    /// The header as the transport carries it.
    pub(crate) fn header(&self) -> &Header {
        &self.0
    }

    /// The header, for the transport to carry.
    pub(crate) fn into_header(self) -> Header {
        self.0
    }
}

impl<B: Backend> std::fmt::Debug for Comm<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {}/{} of world {} on {:?}",
            self.rank, self.world_size, self.world_id, self.inner
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::transport::InProcessHub;
    use burn::backend::NdArray;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// A sequence number is only handed out once the background worker is idle, so a
    /// collective the rank's thread starts never interleaves with one still running behind it.
    #[test]
    fn a_sequence_number_waits_for_the_background_worker() {
        let hub = InProcessHub::new(1, Duration::from_secs(5));
        let transport = Arc::new(hub.endpoint(0));
        let comm =
            Comm::<NdArray>::new(0, 0, Default::default(), transport, RtpConfig::new(1)).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        comm.background.submit(
            0,
            Box::new(move || {
                std::thread::sleep(Duration::from_millis(50));
                flag.store(true, Ordering::SeqCst);
            }),
        );
        let first = comm.next_seq();
        assert!(
            done.load(Ordering::SeqCst),
            "a number was handed out mid-job"
        );
        assert_eq!(first.header("op", 0, vec![1]).header().seq, 0);
        assert_eq!(comm.next_seq().header("op", 0, vec![1]).header().seq, 1);
    }
}
