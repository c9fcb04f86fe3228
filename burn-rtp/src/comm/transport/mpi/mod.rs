//! One rank per process: the MPI transport, on Open MPI through the `mpi` crate (rsmpi).
//!
//! Open MPI moves a large (rendezvous-protocol) message only while some thread is inside an
//! MPI call. A rank that computes for 50 ms between posting a receive and waiting for it would
//! therefore move nothing during those 50 ms. So one communication thread per process owns
//! every MPI call (`MPI_THREAD_FUNNELED`: it initialised MPI) and keeps testing its requests
//! while the rank computes; the rank talks to it through a channel.
//!
//! A message is two MPI messages: the envelope (the JSON of the [`Header`] and the element
//! type, under tag `ENVELOPE`), then the tensor's bytes (tag `DATA`). The bytes go out
//! straight from the tensor itself where the sender can lend it (`Payload::Borrowed`), else
//! from its host copy. They arrive straight into a buffer allocated as elements of the
//! envelope's size, which becomes the received tensor's data with no further copy (Burn adopts
//! a buffer whose alignment is its element type's). Per peer and tag, MPI's non-overtaking
//! rule keeps messages in the order they were sent, so the k-th envelope from a peer describes
//! its k-th data message; the header check then catches programs that diverged.

mod buffer;
mod engine;
mod wire;

use super::{transport_error, BufferKind, Header, Payload, RecvHandle, SendHandle, Transport};
use crate::config::MpiProgress;
use crate::error::{RtpError, RtpResult};
use buffer::Owner;
use engine::{run, Command, WireLog};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wire::{decode, Arrival, Envelope, Fault, Undecodable, ABORT, DATA, ENVELOPE};

/// How often a waiting rank wakes to check for its timeout.
const WAKE: Duration = Duration::from_millis(100);

/// This process's rank of an MPI world: sends and receives go through the communication
/// thread, which owns every MPI call.
pub struct MpiTransport {
    rank: usize,
    size: usize,
    timeout: Duration,
    commands: Mutex<Option<Sender<Command>>>,
    /// Receives and sends posted since the last flush, wait or finalisation: they reach the
    /// communication thread together, in one [`Command::Batch`].
    pending: Mutex<Vec<Command>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    finalized: AtomicBool,
    wire: WireLog,
    /// Bytes of tensor data handed to MPI for sending since the start (envelopes not counted).
    sent: AtomicU64,
    /// The communication thread's pacing, as reports show it.
    policy: Arc<Mutex<String>>,
}

impl std::fmt::Debug for MpiTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiTransport(rank {} of {})", self.rank, self.size)
    }
}

impl MpiTransport {
    /// Initialises MPI on a new communication thread, which paces its tests of transfers in
    /// flight as `progress` asks; fails if MPI was initialised before. With
    /// `one_malloc_arena`, glibc is first asked for one malloc arena for the whole process
    /// ([`RtpConfig::with_one_malloc_arena`](crate::RtpConfig::with_one_malloc_arena)); with
    /// `keep_freed_pages`, to keep freed tensors' pages for reuse
    /// ([`RtpConfig::with_keep_freed_pages`](crate::RtpConfig::with_keep_freed_pages)).
    pub fn start(
        peer_timeout: Duration,
        progress: MpiProgress,
        one_malloc_arena: bool,
        keep_freed_pages: bool,
    ) -> RtpResult<Self> {
        let (commands, inbox) = mpsc::channel();
        let (ready, started) = mpsc::channel();
        let wire = WireLog::default();
        let log = wire.clone();
        let policy = Arc::new(Mutex::new(String::new()));
        let shown = policy.clone();
        // Before the thread starts, so that it allocates received buffers where this thread
        // frees them.
        let arena = super::arena::describe(
            one_malloc_arena
                .then(super::arena::share_one_arena)
                .flatten(),
            keep_freed_pages
                .then(super::arena::keep_freed_pages)
                .flatten(),
        );
        let thread = std::thread::Builder::new()
            .name("rtp-mpi".into())
            .spawn(move || run(inbox, ready, log, progress, arena, shown))
            .map_err(|e| transport_error(0, "MPI_Init", e.to_string()))?;
        let (rank, size) = match started.recv() {
            Ok(Ok(world)) => world,
            Ok(Err(reason)) => return Err(transport_error(0, "MPI_Init", reason)),
            Err(_) => {
                return Err(transport_error(
                    0,
                    "MPI_Init",
                    "the MPI thread ended during initialisation",
                ))
            }
        };
        Ok(Self {
            rank,
            size,
            timeout: peer_timeout,
            commands: Mutex::new(Some(commands)),
            pending: Mutex::new(Vec::new()),
            thread: Mutex::new(Some(thread)),
            finalized: AtomicBool::new(false),
            wire,
            sent: AtomicU64::new(0),
            policy,
        })
    }

    fn submit(&self, command: Command, op: &str) -> RtpResult<()> {
        let guard = self.commands.lock().unwrap();
        let Some(commands) = guard.as_ref() else {
            return Err(self.finalised(op));
        };
        commands
            .send(command)
            .map_err(|_| transport_error(self.rank, op, "the MPI thread is gone"))
    }

    fn finalised(&self, op: &str) -> RtpError {
        transport_error(
            self.rank,
            op,
            "MPI has already been finalised for this process",
        )
    }

    /// Holds `command` until the next [`flush`](Self::flush).
    fn queue(&self, command: Command, op: &str) -> RtpResult<()> {
        if self.commands.lock().unwrap().is_none() {
            return Err(self.finalised(op));
        }
        self.pending.lock().unwrap().push(command);
        Ok(())
    }

    /// Hands every held command to the communication thread at once. The lock is held until
    /// the batch is in the channel, so that batches arrive in the order they were taken.
    fn flush(&self, op: &str) -> RtpResult<()> {
        let mut pending = self.pending.lock().unwrap();
        if pending.is_empty() {
            return Ok(());
        }
        self.submit(Command::Batch(std::mem::take(&mut *pending)), op)
    }

    /// Completes every transfer and finalises MPI; later sends and receives fail.
    pub fn finalize(&self) -> RtpResult<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (done, finished) = mpsc::channel();
        self.flush("MPI_Finalize")?;
        self.submit(
            Command::Finalize {
                done,
                within: self.timeout,
            },
            "MPI_Finalize",
        )?;
        let outcome = finished.recv();
        self.commands.lock().unwrap().take();
        if let Some(thread) = self.thread.lock().unwrap().take() {
            let _ = thread.join();
        }
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(transport_error(self.rank, "MPI_Finalize", reason)),
            Err(_) => Err(transport_error(
                self.rank,
                "MPI_Finalize",
                "the MPI thread ended before finalising",
            )),
        }
    }

    /// Waits for the communication thread's reply, failing at `deadline` (a wait that
    /// started at `started`).
    fn await_reply<T>(
        &self,
        reply: Receiver<Result<T, Fault>>,
        peer: usize,
        op: &str,
        started: Instant,
    ) -> RtpResult<T> {
        // The reply may depend on commands still held here (this rank's own receive).
        self.flush(op)?;
        let deadline = started + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RtpError::Timeout {
                    rank: self.rank,
                    op: op.to_string(),
                    peer,
                    secs: started.elapsed().as_secs_f64(),
                });
            }
            match reply.recv_timeout(left.min(WAKE)) {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(Fault {
                    peer: failed,
                    reason,
                })) => {
                    return Err(RtpError::PeerFailed {
                        rank: self.rank,
                        op: op.to_string(),
                        failed_rank: failed,
                        reason,
                    })
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(transport_error(
                        self.rank,
                        op,
                        "the MPI thread ended before the transfer completed",
                    ))
                }
            }
        }
    }
}

/// Turns an arrival into the tensor data it carries, checking that its length is the one its
/// envelope announces. The receive buffer becomes the data: no copy.
struct MpiSend {
    transport: Arc<MpiTransport>,
    to: usize,
    op: String,
    /// The envelope's and the data's completions.
    replies: [Receiver<Result<(), Fault>>; 2],
    /// The sender's charges for the payload: MPI reads its bytes until the send completes, so
    /// the ledger keeps counting them until then.
    _hold: Vec<Arc<crate::state::accounting::Charge>>,
}

impl SendHandle for MpiSend {
    fn wait(self: Box<Self>) -> RtpResult<()> {
        // One peer timeout bounds the whole send, envelope and data together.
        let started = Instant::now();
        for reply in self.replies {
            self.transport
                .await_reply(reply, self.to, &self.op, started)?;
        }
        Ok(())
    }
}

struct MpiRecv {
    transport: Arc<MpiTransport>,
    from: usize,
    expect: Header,
    reply: Receiver<Result<Arrival, Fault>>,
}

impl<T: Send + 'static> RecvHandle<T> for MpiRecv {
    fn wait(self: Box<Self>) -> RtpResult<Payload<T>> {
        let rank = self.transport.rank;
        let arrival =
            self.transport
                .await_reply(self.reply, self.from, &self.expect.op, Instant::now())?;
        let (header, data) = decode(arrival).map_err(|why| match why {
            Undecodable::Malformed(reason) => transport_error(
                rank,
                &self.expect.op,
                format!("from rank {}: {reason}", self.from),
            ),
            Undecodable::Shape { header, shape } => RtpError::Desync {
                rank,
                peer: self.from,
                op: header.op.to_string(),
                seq: header.seq,
                expected: format!("a payload of the header's shape {:?}", header.shape),
                got: format!("a payload of shape {shape:?}"),
            },
        })?;
        self.expect.check(&header, rank, self.from)?;
        Ok(Payload::Host(Arc::new(data)))
    }
}

/// The handle ranks hold: shared, so that send and receive handles can outlive the call.
#[derive(Debug, Clone)]
pub struct MpiEndpoint(pub Arc<MpiTransport>);

impl<T: Send + 'static> Transport<T> for MpiEndpoint {
    fn rank(&self) -> usize {
        self.0.rank
    }

    fn world_size(&self) -> usize {
        self.0.size
    }

    fn buffer_kind(&self) -> BufferKind {
        BufferKind::Host
    }

    fn isend(
        &self,
        to: usize,
        header: Header,
        payload: Payload<T>,
        // MPI reads the payload's bytes until the send completes: the sender's charges
        // stay with the handle until then.
        hold: Vec<Arc<crate::state::accounting::Charge>>,
    ) -> RtpResult<Box<dyn SendHandle>> {
        let op = header.op.to_string();
        crate::config::check_rank(to, self.0.size)?;
        let (dtype, shape, size, data) = match payload {
            Payload::Host(data) => (
                data.dtype,
                data.shape.to_vec(),
                data.as_bytes().len(),
                Owner::Data(data),
            ),
            Payload::Borrowed(b) => (b.dtype(), b.shape(), b.bytes().len(), Owner::Borrowed(b)),
            Payload::Device(_) => {
                return Err(transport_error(
                    self.0.rank,
                    &op,
                    "the MPI transport moves host buffers only",
                ))
            }
        };
        if size > i32::MAX as usize {
            return Err(transport_error(
                self.0.rank,
                &op,
                format!(
                    "a message of {} exceeds MPI's limit of 2 GiB per message",
                    crate::human_bytes(size as u64)
                ),
            ));
        }
        let envelope = serde_json::to_vec(&Envelope {
            header,
            dtype,
            shape,
        })
        .expect("a header serialises");
        // The envelope goes first: the receiver sizes and aligns the data's buffer from it.
        let replies = [(ENVELOPE, Owner::Bytes(envelope)), (DATA, data)].map(|(tag, buffer)| {
            let (done, reply) = mpsc::channel();
            let queued = self.0.queue(
                Command::Send {
                    to: to as i32,
                    tag,
                    buffer,
                    done,
                },
                &op,
            );
            (queued, reply)
        });
        let [(envelope_queued, envelope), (data_queued, data)] = replies;
        envelope_queued?;
        data_queued?;
        self.0.sent.fetch_add(size as u64, Ordering::Relaxed);
        Ok(Box::new(MpiSend {
            transport: self.0.clone(),
            to,
            op,
            replies: [envelope, data],
            _hold: hold,
        }))
    }

    fn irecv(&self, from: usize, expect: Header) -> RtpResult<Box<dyn RecvHandle<T>>> {
        crate::config::check_rank(from, self.0.size)?;
        let (done, reply) = mpsc::channel();
        self.0.queue(
            Command::Recv {
                from: from as i32,
                done,
            },
            &expect.op,
        )?;
        Ok(Box::new(MpiRecv {
            transport: self.0.clone(),
            from,
            expect,
            reply,
        }))
    }

    fn abort(&self, reason: &str) {
        // Every other rank learns who failed and why, and stops waiting; the notices are
        // small (sent eagerly), so they leave before this process exits.
        // Capped well under Open MPI's eager limit, so that the notice never waits for its
        // receiver to post.
        let mut notice = reason.to_string();
        if notice.len() > 1000 {
            let mut cut = 1000;
            while !notice.is_char_boundary(cut) {
                cut -= 1;
            }
            notice.truncate(cut);
            notice.push('…');
        }
        let mut replies = Vec::new();
        for peer in (0..self.0.size).filter(|&p| p != self.0.rank) {
            let (done, reply) = mpsc::channel();
            let sent = self.0.submit(
                Command::Send {
                    to: peer as i32,
                    tag: ABORT,
                    buffer: Owner::Bytes(notice.clone().into_bytes()),
                    done,
                },
                "abort",
            );
            if sent.is_ok() {
                replies.push(reply);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for reply in replies {
            let _ = reply.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        }
    }

    fn mark_exited(&self) {
        if let Err(e) = self.0.finalize() {
            tracing::warn!("rtp: {e}");
        }
    }

    fn record_wire(&self, on: bool) {
        *self.0.wire.lock().unwrap() = on.then(Vec::new);
    }

    fn take_wire(&self) -> Vec<(Instant, Instant)> {
        self.0
            .wire
            .lock()
            .unwrap()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn flush(&self) -> RtpResult<()> {
        self.0.flush("flush")
    }

    fn sent_bytes(&self) -> u64 {
        self.0.sent.load(Ordering::Relaxed)
    }

    fn progress_policy(&self) -> Option<String> {
        Some(self.0.policy.lock().unwrap().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::buffer::{Elems, Held};
    use super::*;
    use burn::tensor::{DType, TensorData};
    use std::borrow::Cow;

    fn arrival(dtype: DType, shape: Vec<usize>, elems: Elems, len: usize) -> Arrival {
        Arrival {
            envelope: Ok(Envelope {
                header: Header {
                    seq: 3,
                    op: Cow::Borrowed("test"),
                    part: 1,
                    shape: shape.clone(),
                },
                dtype,
                shape,
            }),
            elems,
            len,
        }
    }

    /// The receive buffer becomes the tensor's data: NdArray takes the same allocation.
    #[test]
    fn received_bytes_become_the_tensor_without_a_copy() {
        let values = [1.5f32, -2.0, 3.25];
        let mut elems = Elems::zeroed(DType::F32.size(), 12);
        for (chunk, v) in elems.bytes_mut().chunks_mut(4).zip(values) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
        let at = elems.bytes_mut().as_ptr() as usize;
        let (header, data) = decode(arrival(DType::F32, vec![3], elems, 12)).unwrap();
        assert_eq!(header.shape, vec![3]);
        let vec = data.into_vec::<f32>().unwrap();
        assert_eq!(vec, values);
        assert_eq!(vec.as_ptr() as usize, at, "the received bytes were copied");
    }

    /// Each element size gets a buffer of its own alignment (f64 as u64, f16 as u16).
    #[test]
    fn receive_buffers_take_the_element_s_alignment() {
        for (dtype, align) in [(DType::F64, 8), (DType::F32, 4), (DType::F16, 2)] {
            let mut elems = Elems::zeroed(dtype.size(), 5 * dtype.size());
            assert_eq!(elems.bytes_mut().len(), 5 * dtype.size(), "{dtype:?}");
            assert_eq!(elems.bytes_mut().as_ptr() as usize % align, 0, "{dtype:?}");
            let (_, data) = decode(arrival(dtype, vec![5], elems, 5 * dtype.size())).unwrap();
            assert_eq!(data.as_bytes().len(), 5 * dtype.size());
        }
    }

    /// A singleton MPI world (this process alone, without `mpirun`) sending to itself: a wait
    /// issues the calls the transport still holds (without it, the receive would never be
    /// posted and the wait would time out), batches reach MPI in the order they were flushed,
    /// and once MPI is finalised, posting fails instead of being held.
    #[test]
    fn waits_issue_held_calls_and_batches_keep_their_order() {
        let transport = Arc::new(
            MpiTransport::start(Duration::from_secs(20), MpiProgress::Auto, true, true)
                .expect("a singleton MPI world starts without mpirun"),
        );
        assert_eq!((transport.rank, transport.size), (0, 1));
        let endpoint = MpiEndpoint(transport.clone());
        let header = |part| Header {
            seq: 1,
            op: Cow::Borrowed("test"),
            part,
            shape: vec![2],
        };
        let data = |v: f32| TensorData::new(vec![v, -v], [2]);
        let send = |part, payload| {
            Transport::<()>::isend(&endpoint, 0, header(part), payload, Vec::new()).unwrap()
        };
        let first = send(0, Payload::Host(Arc::new(data(1.0))));
        Transport::<()>::flush(&endpoint).unwrap();
        // The second sends borrowed bytes, as ranks send the shards they hold.
        let second = send(1, Payload::Borrowed(Arc::new(Held(data(2.0)))));
        let receives =
            [0, 1].map(|part| Transport::<()>::irecv(&endpoint, 0, header(part)).unwrap());
        // No flush: the first wait must issue the second send and both receives.
        for (received, v) in receives.into_iter().zip([1.0f32, 2.0]) {
            let Payload::Host(data) = received.wait().unwrap() else {
                panic!("MPI receives host data")
            };
            assert_eq!(
                data.to_vec::<f32>().unwrap(),
                vec![v, -v],
                "batches kept their order, and borrowed bytes arrived as sent"
            );
        }
        first.wait().unwrap();
        second.wait().unwrap();
        assert_eq!(
            Transport::<()>::sent_bytes(&endpoint),
            16,
            "two messages of 2 f32 each, envelopes not counted"
        );
        // A payload whose shape is not its header's (the same 2 elements as [1, 2]) reaches
        // the receiver as a desynchronisation, not as data of the header's shape.
        let reshaped = Payload::Host(Arc::new(TensorData::new(vec![3.0f32, -3.0], [1, 2])));
        let sent = send(3, reshaped);
        let received = Transport::<()>::irecv(&endpoint, 0, header(3)).unwrap();
        match received.wait() {
            Err(RtpError::Desync { expected, got, .. }) => {
                assert!(
                    expected.contains("[2]") && got.contains("[1, 2]"),
                    "{expected} / {got}"
                )
            }
            other => panic!("expected RtpError::Desync, got {other:?}"),
        }
        sent.wait().unwrap();
        transport.finalize().unwrap();
        let late = Transport::<()>::irecv(&endpoint, 0, header(2));
        assert!(
            late.is_err(),
            "a receive posted after finalisation must fail"
        );
    }

    /// A length other than the envelope's, or an unreadable envelope, is an error, not data;
    /// a payload whose own shape is not its header's is a shape disagreement.
    #[test]
    fn a_message_that_disagrees_with_its_envelope_is_refused() {
        let malformed = |arrival| match decode(arrival) {
            Err(Undecodable::Malformed(reason)) => reason,
            other => panic!("expected a malformed message, got {other:?}"),
        };
        let short = arrival(DType::F32, vec![3], Elems::zeroed(4, 8), 8);
        assert!(malformed(short).contains("carries 8 bytes, not the 12"));
        let mut bad = arrival(DType::F32, vec![3], Elems::zeroed(4, 12), 12);
        bad.envelope = Err("unreadable header: EOF".into());
        assert!(malformed(bad).contains("unreadable header"));
        let mut reshaped = arrival(DType::F32, vec![3], Elems::zeroed(4, 12), 12);
        if let Ok(envelope) = &mut reshaped.envelope {
            envelope.shape = vec![1, 3];
        }
        match decode(reshaped) {
            Err(Undecodable::Shape { header, shape }) => {
                assert_eq!((header.shape, shape), (vec![3], vec![1, 3]))
            }
            other => panic!("expected a shape disagreement, got {other:?}"),
        }
    }
}
