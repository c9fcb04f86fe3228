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
mod tests;
