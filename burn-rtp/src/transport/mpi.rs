//! One rank per process: the MPI transport, on Open MPI through the `mpi` crate (rsmpi).
//!
//! Open MPI moves a large (rendezvous-protocol) message only while some thread is inside an
//! MPI call. A rank that computes for 50 ms between posting a receive and waiting for it would
//! therefore move nothing during those 50 ms. So one communication thread per process owns
//! every MPI call (`MPI_THREAD_FUNNELED`: it initialised MPI) and keeps testing its requests
//! while the rank computes; the rank talks to it through a channel.
//!
//! A message is one MPI byte message: a little-endian `u32` length, the JSON of the
//! [`Header`] and the element type, then the tensor's bytes. Messages between two ranks use
//! one tag and are matched in the order they were posted, which MPI's non-overtaking rule
//! preserves; the header check then catches programs that diverged.

use super::{BufferKind, Header, Payload, RecvHandle, SendHandle, Transport};
use crate::error::{RtpError, RtpResult};
use burn::tensor::{DType, TensorData};
use mpi::point_to_point::{Destination, Source};
use mpi::request::{Request, StaticScope};
use mpi::topology::Communicator;
use mpi::traits::Equivalence;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Tag of tensor messages.
const DATA: i32 = 0;
/// Tag of the notice a failing rank sends to every other rank.
const ABORT: i32 = 1;
/// Longest sleep of the communication thread between two tests of its requests.
const MAX_IDLE: Duration = Duration::from_micros(200);
/// How long after a peer's abort notice transfers with the other peers may still complete:
/// data already on its way (e.g. the rest of the start-up agreement, which lets every rank
/// report the disagreement itself) is delivered, then everything pending fails.
const GRACE: Duration = Duration::from_secs(1);
/// How often a waiting rank wakes to check for its timeout.
const WAKE: Duration = Duration::from_millis(100);

/// The element type and header of a message, as sent before its bytes.
#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope {
    header: Header,
    dtype: DType,
}

/// Why a request failed: a peer sent the abort notice, naming itself and its reason.
#[derive(Debug, Clone)]
struct Fault {
    peer: usize,
    reason: String,
}

type Reply<T> = Sender<Result<T, Fault>>;

/// Requests from the ranks' side to the communication thread.
enum Command {
    Send {
        to: i32,
        tag: i32,
        bytes: Vec<u8>,
        done: Reply<()>,
    },
    Recv {
        from: i32,
        done: Reply<Vec<u8>>,
    },
    /// Completes what is in flight, then finalises MPI.
    Finalize {
        done: Sender<()>,
    },
}

/// A byte buffer lent to MPI for the life of a request.
///
/// rsmpi ties a request to the lifetime of its buffer. Requests here outlive any stack frame
/// (the thread tests them in a loop), so the buffer is leaked to `'static` for the request
/// and taken back once the request completed: MPI no longer touches it then.
struct Lent(*mut [u8]);

// SAFETY: the pointer is owned by this value alone (MPI only reads or writes it until the
// request completes, and the communication thread reclaims it only after that).
unsafe impl Send for Lent {}

impl Lent {
    fn new(bytes: Vec<u8>) -> Self {
        Self(Box::into_raw(bytes.into_boxed_slice()))
    }
    /// The buffer as MPI sees it.
    ///
    /// # Safety
    /// Call once per buffer, and hand the view only to the request that [`Lent::reclaim`]
    /// waits for: the allocation lives until then, and nothing else may touch it.
    unsafe fn view(&self) -> &'static mut [u8] {
        // SAFETY: see above.
        unsafe { &mut *self.0 }
    }
    /// Takes the bytes back. Only call once the request that used the view has completed.
    fn reclaim(self) -> Vec<u8> {
        // SAFETY: created by `Box::into_raw` in `new`, and reclaimed once.
        unsafe { Box::from_raw(self.0) }.into_vec()
    }
}

/// One request in flight on the communication thread.
struct Active<T> {
    request: Request<'static, [u8], StaticScope>,
    buffer: Lent,
    /// Taken when a peer's failure was reported to the waiting rank before MPI completed
    /// the request (the buffer stays lent until MPI does).
    done: Option<Reply<T>>,
    /// When its bytes started to move: the send was started, or the receive was matched.
    since: Instant,
}

/// When received bytes were moving, while a rank records its timeline.
type WireLog = Arc<Mutex<Option<Vec<(Instant, Instant)>>>>;

/// The state the communication thread keeps.
struct Engine {
    world: mpi::topology::SimpleCommunicator,
    rank: usize,
    sends: Vec<Active<()>>,
    /// Per source, the receives posted and not yet matched, in posting order.
    waiting: Vec<VecDeque<Reply<Vec<u8>>>>,
    receiving: Vec<Active<Vec<u8>>>,
    failed: Option<(usize, String)>,
    /// When pending transfers fail after an abort notice.
    fail_at: Option<Instant>,
    wire: WireLog,
}

impl Engine {
    fn fault(&self) -> Option<Fault> {
        self.failed.as_ref().map(|(peer, reason)| Fault {
            peer: *peer,
            reason: reason.clone(),
        })
    }

    fn accept(&mut self, command: Command) -> Option<Sender<()>> {
        match command {
            Command::Send {
                to,
                tag,
                bytes,
                done,
            } => {
                let buffer = Lent::new(bytes);
                // SAFETY: the one view of this buffer, lent to this request only.
                let view = unsafe { buffer.view() };
                let request = self.world.process_at_rank(to).immediate_send_with_tag(
                    StaticScope,
                    &*view,
                    tag,
                );
                self.sends.push(Active {
                    request,
                    buffer,
                    done: Some(done),
                    since: Instant::now(),
                });
            }
            Command::Recv { from, done } => match (self.fault(), self.grace_over()) {
                (Some(f), true) => {
                    let _ = done.send(Err(f));
                }
                _ => self.waiting[from as usize].push_back(done),
            },
            Command::Finalize { done } => return Some(done),
        }
        None
    }

    fn grace_over(&self) -> bool {
        self.fail_at.is_some_and(|t| Instant::now() >= t)
    }

    /// Tests every request once; returns whether anything happened.
    fn progress(&mut self) -> bool {
        let mut moved = self.take_abort_notices();
        if self.grace_over() {
            moved |= self.fail_pending();
        }
        for source in 0..self.waiting.len() {
            while !self.waiting[source].is_empty() {
                let process = self.world.process_at_rank(source as i32);
                let Some((message, status)) = process.immediate_matched_probe_with_tag(DATA) else {
                    break;
                };
                let len = status.count(u8::equivalent_datatype()) as usize;
                let buffer = Lent::new(vec![0u8; len]);
                // SAFETY: the one view of this buffer, lent to this request only.
                let request =
                    message.immediate_matched_receive_into(StaticScope, unsafe { buffer.view() });
                let done = self.waiting[source].pop_front().expect("checked non-empty");
                self.receiving.push(Active {
                    request,
                    buffer,
                    done: Some(done),
                    since: Instant::now(),
                });
                moved = true;
            }
        }
        moved |= test_all(&mut self.sends, |_| (), |_| {});
        let wire = &self.wire;
        moved |= test_all(
            &mut self.receiving,
            |bytes| bytes,
            |since| {
                if let Some(log) = wire.lock().unwrap().as_mut() {
                    log.push((since, Instant::now()));
                }
            },
        );
        moved
    }

    /// Receives abort notices; once one came, every waiting receive fails with its reason.
    fn take_abort_notices(&mut self) -> bool {
        let Some((message, status)) = self
            .world
            .any_process()
            .immediate_matched_probe_with_tag(ABORT)
        else {
            return false;
        };
        let mut reason = vec![0u8; status.count(u8::equivalent_datatype()) as usize];
        let peer = status.source_rank() as usize;
        message.matched_receive_into(&mut reason[..]);
        if self.failed.is_none() {
            self.failed = Some((peer, String::from_utf8_lossy(&reason).into_owned()));
            self.fail_at = Some(Instant::now() + GRACE);
        }
        // Nothing more will come from the failed rank; the others get the grace period.
        let fault = self.fault().expect("just set");
        for done in self.waiting[peer].drain(..) {
            let _ = done.send(Err(fault.clone()));
        }
        true
    }

    /// Fails everything this rank still waits for: receives not yet matched, and transfers
    /// under way (whose buffers stay lent until MPI completes them).
    fn fail_pending(&mut self) -> bool {
        let Some(fault) = self.fault() else {
            return false;
        };
        let mut failed = false;
        for queue in &mut self.waiting {
            for done in queue.drain(..) {
                let _ = done.send(Err(fault.clone()));
                failed = true;
            }
        }
        for done in self.sends.iter_mut().filter_map(|a| a.done.take()) {
            let _ = done.send(Err(fault.clone()));
            failed = true;
        }
        for done in self.receiving.iter_mut().filter_map(|a| a.done.take()) {
            let _ = done.send(Err(fault.clone()));
            failed = true;
        }
        failed
    }

    /// Completes what is in flight (sends must finish before MPI may be finalised).
    fn drain(&mut self) {
        while !self.sends.is_empty() || !self.receiving.is_empty() {
            if !self.progress() {
                std::thread::sleep(MAX_IDLE);
            }
        }
    }
}

/// Tests each request; completed ones are logged (`completed(since)`) and hand their buffer
/// (mapped by `done_value`) to the rank.
fn test_all<T>(
    active: &mut Vec<Active<T>>,
    done_value: impl Fn(Vec<u8>) -> T,
    completed: impl Fn(Instant),
) -> bool {
    let mut moved = false;
    let mut i = 0;
    while i < active.len() {
        let Active {
            request,
            buffer,
            done,
            since,
        } = active.swap_remove(i);
        match request.test() {
            Ok(_) => {
                completed(since);
                let bytes = buffer.reclaim();
                if let Some(done) = done {
                    let _ = done.send(Ok(done_value(bytes)));
                }
                moved = true;
            }
            Err(request) => {
                let last = active.len();
                active.push(Active {
                    request,
                    buffer,
                    done,
                    since,
                });
                active.swap(i, last);
                i += 1;
            }
        }
    }
    moved
}

/// Runs MPI on this thread until asked to finalise.
fn run(commands: Receiver<Command>, ready: Sender<Result<(usize, usize), String>>, wire: WireLog) {
    let Some((universe, threading)) = mpi::initialize_with_threading(mpi::Threading::Funneled)
    else {
        let _ = ready.send(Err(
            "MPI is already initialised in this process: one launch per process under mpirun"
                .into(),
        ));
        return;
    };
    if threading < mpi::Threading::Funneled {
        let _ = ready.send(Err(format!(
            "this MPI library offers thread level {threading:?}; burn-rtp needs Funneled"
        )));
        return;
    }
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let mut engine = Engine {
        world,
        rank,
        sends: Vec::new(),
        waiting: (0..size).map(|_| VecDeque::new()).collect(),
        receiving: Vec::new(),
        failed: None,
        fail_at: None,
        wire,
    };
    let _ = ready.send(Ok((rank, size)));
    let mut idle = Duration::from_micros(1);
    let finalize: Option<Sender<()>> = loop {
        let busy = !engine.sends.is_empty()
            || !engine.receiving.is_empty()
            || engine.waiting.iter().any(|q| !q.is_empty());
        // With nothing in flight the thread sleeps until a rank asks for something; with
        // requests in flight it polls, backing off while nothing moves so that an idle wait
        // costs little CPU, and wakes at once for a new command.
        let next = if busy {
            commands.recv_timeout(idle)
        } else {
            commands.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        let mut finalize = None;
        match next {
            Ok(command) => {
                finalize = engine.accept(command);
                while let Ok(command) = commands.try_recv() {
                    finalize = finalize.or(engine.accept(command));
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                // The rank dropped its transport without finalising (it failed): leave MPI
                // as it is, so that mpirun ends the job when this process exits. Requests
                // still in flight must not be dropped (rsmpi panics), so they are forgotten.
                std::mem::forget(engine);
                std::mem::forget(universe);
                return;
            }
        }
        if engine.progress() {
            idle = Duration::from_micros(1);
        } else {
            idle = (idle * 2).min(MAX_IDLE);
        }
        if finalize.is_some() {
            break finalize;
        }
    };
    engine.drain();
    tracing::debug!(rank = engine.rank, "rtp: finalising MPI");
    drop(engine);
    drop(universe);
    if let Some(done) = finalize {
        let _ = done.send(());
    }
}

/// This process's rank of an MPI world: sends and receives go through the communication
/// thread, which owns every MPI call.
pub struct MpiTransport {
    rank: usize,
    size: usize,
    timeout: Duration,
    commands: Mutex<Option<Sender<Command>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    finalized: AtomicBool,
    wire: WireLog,
}

impl std::fmt::Debug for MpiTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiTransport(rank {} of {})", self.rank, self.size)
    }
}

impl MpiTransport {
    /// Initialises MPI on a new communication thread; fails if MPI was initialised before.
    pub fn start(peer_timeout: Duration) -> RtpResult<Self> {
        let (commands, inbox) = mpsc::channel();
        let (ready, started) = mpsc::channel();
        let wire = WireLog::default();
        let log = wire.clone();
        let thread = std::thread::Builder::new()
            .name("rtp-mpi".into())
            .spawn(move || run(inbox, ready, log))
            .map_err(|e| transport_error(0, "MPI_Init", e.to_string()))?;
        let (rank, size) = match started.recv() {
            Ok(Ok(world)) => world,
            Ok(Err(reason)) => return Err(transport_error(0, "MPI_Init", reason)),
            Err(_) => {
                return Err(transport_error(
                    0,
                    "MPI_Init",
                    "the MPI thread ended during initialisation".into(),
                ))
            }
        };
        Ok(Self {
            rank,
            size,
            timeout: peer_timeout,
            commands: Mutex::new(Some(commands)),
            thread: Mutex::new(Some(thread)),
            finalized: AtomicBool::new(false),
            wire,
        })
    }

    fn submit(&self, command: Command, op: &str) -> RtpResult<()> {
        let guard = self.commands.lock().unwrap();
        let Some(commands) = guard.as_ref() else {
            return Err(transport_error(
                self.rank,
                op,
                "MPI has already been finalised for this process".into(),
            ));
        };
        commands
            .send(command)
            .map_err(|_| transport_error(self.rank, op, "the MPI thread is gone".into()))
    }

    /// Completes every transfer and finalises MPI; later sends and receives fail.
    pub fn finalize(&self) -> RtpResult<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (done, finished) = mpsc::channel();
        self.submit(Command::Finalize { done }, "MPI_Finalize")?;
        let _ = finished.recv();
        self.commands.lock().unwrap().take();
        if let Some(thread) = self.thread.lock().unwrap().take() {
            let _ = thread.join();
        }
        Ok(())
    }

    /// Waits for the communication thread's reply, failing after the peer timeout.
    fn await_reply<T>(
        &self,
        reply: Receiver<Result<T, Fault>>,
        peer: usize,
        op: &str,
    ) -> RtpResult<T> {
        let started = Instant::now();
        loop {
            let left = self.timeout.saturating_sub(started.elapsed());
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
                        "the MPI thread ended before the transfer completed".into(),
                    ))
                }
            }
        }
    }
}

fn transport_error(rank: usize, op: &str, reason: String) -> RtpError {
    RtpError::Transport {
        rank,
        op: op.to_string(),
        reason,
    }
}

/// Encodes a message: envelope length, envelope JSON, tensor bytes.
fn encode(header: Header, data: &TensorData) -> Vec<u8> {
    let envelope = serde_json::to_vec(&Envelope {
        header,
        dtype: data.dtype,
    })
    .expect("a header serialises");
    let payload = data.as_bytes();
    let mut bytes = Vec::with_capacity(4 + envelope.len() + payload.len());
    bytes.extend_from_slice(&(envelope.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&envelope);
    bytes.extend_from_slice(payload);
    bytes
}

/// Decodes a message into its header and tensor data, reusing the message's buffer for the
/// data (a received shard is not copied a second time).
fn decode(mut bytes: Vec<u8>) -> Result<(Header, TensorData), String> {
    let short = || format!("a message of {} bytes is too short", bytes.len());
    let len = u32::from_le_bytes(bytes.get(..4).ok_or_else(short)?.try_into().unwrap()) as usize;
    let envelope = bytes.get(4..4 + len).ok_or_else(short)?;
    let envelope: Envelope =
        serde_json::from_slice(envelope).map_err(|e| format!("unreadable header: {e}"))?;
    bytes.drain(..4 + len);
    let payload = bytes;
    let expected = envelope.header.shape.iter().product::<usize>() * envelope.dtype.size();
    if payload.len() != expected {
        return Err(format!(
            "{} carries {} bytes, not the {expected} of {:?} {:?}",
            envelope.header,
            payload.len(),
            envelope.dtype,
            envelope.header.shape
        ));
    }
    let shape = envelope.header.shape.clone();
    Ok((
        envelope.header,
        TensorData::from_bytes_vec(payload, shape, envelope.dtype),
    ))
}

struct MpiSend {
    transport: Arc<MpiTransport>,
    to: usize,
    op: String,
    reply: Receiver<Result<(), Fault>>,
    /// The sender's charges for the payload: MPI holds a copy of its bytes until the send
    /// completes, so the ledger keeps counting them until then.
    _hold: Vec<Arc<crate::accounting::Charge>>,
}

impl SendHandle for MpiSend {
    fn wait(self: Box<Self>) -> RtpResult<()> {
        self.transport.await_reply(self.reply, self.to, &self.op)
    }
}

struct MpiRecv {
    transport: Arc<MpiTransport>,
    from: usize,
    expect: Header,
    reply: Receiver<Result<Vec<u8>, Fault>>,
}

impl<T: Send + 'static> RecvHandle<T> for MpiRecv {
    fn wait(self: Box<Self>) -> RtpResult<Payload<T>> {
        let rank = self.transport.rank;
        let bytes = self
            .transport
            .await_reply(self.reply, self.from, &self.expect.op)?;
        let (header, data) = decode(bytes).map_err(|reason| {
            transport_error(
                rank,
                &self.expect.op,
                format!("from rank {}: {reason}", self.from),
            )
        })?;
        self.expect.check(&header, rank, self.from)?;
        Ok(Payload::Host(data))
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
        // The payload is copied into the bytes MPI sends, which live until the send
        // completes: the sender's charges stay with the handle until then.
        hold: Vec<Arc<crate::accounting::Charge>>,
    ) -> RtpResult<Box<dyn SendHandle>> {
        let op = header.op.to_string();
        crate::config::check_rank(to, self.0.size)?;
        let Payload::Host(data) = payload else {
            return Err(transport_error(
                self.0.rank,
                &op,
                "the MPI transport moves host buffers only".into(),
            ));
        };
        let bytes = encode(header, &data);
        if bytes.len() > i32::MAX as usize {
            return Err(transport_error(
                self.0.rank,
                &op,
                format!(
                    "a message of {} exceeds MPI's limit of 2 GiB per message",
                    crate::human_bytes(bytes.len() as u64)
                ),
            ));
        }
        let (done, reply) = mpsc::channel();
        self.0.submit(
            Command::Send {
                to: to as i32,
                tag: DATA,
                bytes,
                done,
            },
            &op,
        )?;
        Ok(Box::new(MpiSend {
            transport: self.0.clone(),
            to,
            op,
            reply,
            _hold: hold,
        }))
    }

    fn irecv(&self, from: usize, expect: Header) -> RtpResult<Box<dyn RecvHandle<T>>> {
        crate::config::check_rank(from, self.0.size)?;
        let (done, reply) = mpsc::channel();
        self.0.submit(
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
                    bytes: notice.clone().into_bytes(),
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
}
