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

use super::progress::{Pace, MAX_IDLE};
use super::{BufferKind, Header, HostBytes, Payload, RecvHandle, SendHandle, Transport};
use crate::config::MpiProgress;
use crate::error::{RtpError, RtpResult};
use burn::tensor::{Bytes, DType, TensorData};
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

/// Tag of tensor bytes.
const DATA: i32 = 0;
/// Tag of the notice a failing rank sends to every other rank.
const ABORT: i32 = 1;
/// Tag of the envelope sent before each tensor's bytes.
const ENVELOPE: i32 = 2;
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

/// A received tensor message: its envelope (or why it could not be read), the buffer its
/// bytes landed in, and how many bytes came.
struct Arrival {
    envelope: Result<Envelope, String>,
    elems: Elems,
    len: usize,
}

/// Requests from the ranks' side to the communication thread.
enum Command {
    Send {
        to: i32,
        tag: i32,
        buffer: Owner,
        done: Reply<()>,
    },
    Recv {
        from: i32,
        done: Reply<Arrival>,
    },
    /// Commands issued together: the thread takes them all before it tests anything, so an
    /// exchange's send is started before the thread spends a single-copy transport's time
    /// copying the message that arrived for the same exchange.
    Batch(Vec<Command>),
    /// Completes what is in flight, then finalises MPI.
    Finalize {
        done: Sender<()>,
    },
}

/// A receive buffer allocated as elements of the message's element size, so that its
/// allocation has the element type's alignment and Burn takes it as a tensor's data without
/// copying it.
enum Elems {
    B1(Vec<u8>),
    B2(Vec<u16>),
    B4(Vec<u32>),
    B8(Vec<u64>),
}

impl Elems {
    /// Room for `len` bytes as elements of `size` bytes (any other size: bytes).
    fn zeroed(size: usize, len: usize) -> Self {
        match size {
            2 => Self::B2(vec![0; len.div_ceil(2)]),
            4 => Self::B4(vec![0; len.div_ceil(4)]),
            8 => Self::B8(vec![0; len.div_ceil(8)]),
            _ => Self::B1(vec![0; len]),
        }
    }

    /// The allocation's bytes.
    fn bytes_mut(&mut self) -> &mut [u8] {
        fn raw<E>(v: &mut [E]) -> &mut [u8] {
            // SAFETY: plain integers, every byte initialised; the view covers the same
            // allocation with the same lifetime.
            unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), size_of_val(v)) }
        }
        match self {
            Self::B1(v) => raw(v),
            Self::B2(v) => raw(v),
            Self::B4(v) => raw(v),
            Self::B8(v) => raw(v),
        }
    }

    /// The buffer as a tensor's bytes, keeping its allocation (and so its alignment).
    fn into_bytes(self) -> Bytes {
        match self {
            Self::B1(v) => Bytes::from_elems(v),
            Self::B2(v) => Bytes::from_elems(v),
            Self::B4(v) => Bytes::from_elems(v),
            Self::B8(v) => Bytes::from_elems(v),
        }
    }
}

/// What owns the memory of a request's buffer.
enum Owner {
    /// Small messages: envelopes and abort notices.
    Bytes(Vec<u8>),
    /// A tensor's host copy, sent without copying it again (shared by every peer it goes to).
    Data(Arc<TensorData>),
    /// A tensor the sender still holds, read in place (`host_view.rs`).
    Borrowed(Arc<dyn HostBytes>),
    /// A receive buffer.
    Elems(Elems),
}

/// A buffer lent to MPI for the life of a request.
///
/// rsmpi ties a request to the lifetime of its buffer. Requests here outlive any stack frame
/// (the thread tests them in a loop), so the request gets a `'static` view of memory that
/// this value keeps alive (moving the owner does not move its heap allocation), and the owner
/// is handed back once the request completed: MPI no longer touches it then.
struct Lent {
    owner: Owner,
    view: *mut [u8],
}

// SAFETY: the view points into memory the owner alone keeps alive; MPI reads or writes it
// only until the request completes, and the owner is released only after that. Sent data
// (`Owner::Data`, `Owner::Borrowed`) is only ever read, by MPI, by other sends of the same
// `Arc` and, for a borrowed tensor, by the rank's compute, which writes it only once no other
// handle shares it.
unsafe impl Send for Lent {}

impl Lent {
    /// Lends the first `len` bytes of a receive buffer.
    fn receive(mut elems: Elems, len: usize) -> Self {
        let view: *mut [u8] = &mut elems.bytes_mut()[..len];
        Self {
            owner: Owner::Elems(elems),
            view,
        }
    }

    /// Lends a send buffer.
    fn send(owner: Owner) -> Self {
        let bytes: &[u8] = match &owner {
            Owner::Bytes(b) => b,
            Owner::Data(d) => d.as_bytes(),
            Owner::Borrowed(b) => b.bytes(),
            Owner::Elems(_) => unreachable!("receive buffers are lent through `receive`"),
        };
        let view = std::ptr::slice_from_raw_parts_mut(bytes.as_ptr().cast_mut(), bytes.len());
        Self { owner, view }
    }

    /// The buffer as MPI sees it, for a send.
    ///
    /// # Safety
    /// Hand the view only to the request whose completion releases this value.
    unsafe fn view(&self) -> &'static [u8] {
        // SAFETY: see above; the memory lives as long as `self.owner`.
        unsafe { &*self.view }
    }

    /// The buffer as MPI sees it, for a receive.
    ///
    /// # Safety
    /// Call once, and hand the view only to the request whose completion releases this value;
    /// nothing else touches the memory until then.
    unsafe fn view_mut(&mut self) -> &'static mut [u8] {
        // SAFETY: see above.
        unsafe { &mut *self.view }
    }

    /// Takes the buffer back. Only call once the request that used the view has completed.
    fn reclaim(self) -> Owner {
        self.owner
    }
}

/// One request in flight on the communication thread.
struct Active<T> {
    request: Request<'static, [u8], StaticScope>,
    buffer: Lent,
    /// A receive's envelope and length (sends: none).
    arrival: Option<(Result<Envelope, String>, usize)>,
    /// Taken when a peer's failure was reported to the waiting rank before MPI completed
    /// the request (the buffer stays lent until MPI does).
    done: Option<Reply<T>>,
    /// When its bytes started to move: the send was started, or the matched receive was.
    since: Instant,
    /// Whether it was tested before (a receive still in flight at its first test, right after
    /// the call that matched it, needs this process's calls to move its bytes).
    tested: bool,
}

/// When received bytes were moving, while a rank records its timeline.
type WireLog = Arc<Mutex<Option<Vec<(Instant, Instant)>>>>;

/// The state the communication thread keeps.
struct Engine {
    world: mpi::topology::SimpleCommunicator,
    rank: usize,
    sends: Vec<Active<()>>,
    /// Per source, the receives posted and not yet matched, in posting order.
    waiting: Vec<VecDeque<Reply<Arrival>>>,
    /// Per source, the envelope taken whose data message has not been matched yet.
    envelopes: Vec<Option<Result<Envelope, String>>>,
    receiving: Vec<Active<Arrival>>,
    failed: Option<(usize, String)>,
    /// When pending transfers fail after an abort notice.
    fail_at: Option<Instant>,
    wire: WireLog,
    pace: Pace,
    /// The pacing in force, as reports show it.
    policy: Arc<Mutex<String>>,
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
                buffer,
                done,
            } => {
                let buffer = Lent::send(buffer);
                // SAFETY: lent to this request only; released when it completed.
                let view = unsafe { buffer.view() };
                let request =
                    self.world
                        .process_at_rank(to)
                        .immediate_send_with_tag(StaticScope, view, tag);
                self.sends.push(Active {
                    request,
                    buffer,
                    arrival: None,
                    done: Some(done),
                    since: Instant::now(),
                    tested: false,
                });
            }
            Command::Recv { from, done } => match (self.fault(), self.grace_over()) {
                (Some(f), true) => {
                    let _ = done.send(Err(f));
                }
                _ => self.waiting[from as usize].push_back(done),
            },
            Command::Batch(commands) => {
                let mut finalize = None;
                for command in commands {
                    finalize = finalize.or(self.accept(command));
                }
                return finalize;
            }
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
                if self.envelopes[source].is_none() {
                    // Envelopes are small (sent eagerly): once matched, they are here.
                    let Some((message, status)) =
                        process.immediate_matched_probe_with_tag(ENVELOPE)
                    else {
                        break;
                    };
                    let mut raw = vec![0u8; status.count(u8::equivalent_datatype()) as usize];
                    message.matched_receive_into(&mut raw[..]);
                    self.envelopes[source] = Some(
                        serde_json::from_slice(&raw).map_err(|e| format!("unreadable header: {e}")),
                    );
                    moved = true;
                }
                let Some((message, status)) = process.immediate_matched_probe_with_tag(DATA) else {
                    break;
                };
                let envelope = self.envelopes[source].take().expect("taken above");
                let len = status.count(u8::equivalent_datatype()) as usize;
                let size = envelope.as_ref().map_or(1, |e| e.dtype.size());
                let mut buffer = Lent::receive(Elems::zeroed(size, len), len);
                // The bytes move from here on: over a single-copy transport (Open MPI's vader
                // with CMA) this call itself copies them from the sender's memory, so the wire
                // interval starts before it, not after.
                let matched = Instant::now();
                // SAFETY: the one view of this buffer, lent to this request only.
                let request = message
                    .immediate_matched_receive_into(StaticScope, unsafe { buffer.view_mut() });
                let done = self.waiting[source].pop_front().expect("checked non-empty");
                self.receiving.push(Active {
                    request,
                    buffer,
                    arrival: Some((envelope, len)),
                    done: Some(done),
                    since: matched,
                    tested: false,
                });
                moved = true;
            }
        }
        moved |= test_all(&mut self.sends, |_, _| (), |_| {}).0;
        let wire = &self.wire;
        let (received, outlived) = test_all(
            &mut self.receiving,
            |owner, arrival| {
                let (envelope, len) = arrival.expect("receives carry their envelope");
                let Owner::Elems(elems) = owner else {
                    unreachable!("receives lend element buffers")
                };
                Arrival {
                    envelope,
                    elems,
                    len,
                }
            },
            |since| {
                if let Some(log) = wire.lock().unwrap().as_mut() {
                    log.push((since, Instant::now()));
                }
            },
        );
        if self.pace.receive_outlived_match(outlived) {
            let policy = self.pace.describe();
            tracing::debug!(rank = self.rank, %policy, "rtp: MPI progress");
            *self.policy.lock().unwrap() = policy;
        }
        moved | received
    }

    /// Whether bytes of this rank's may be moving: a matched receive or a tensor's send is
    /// in flight (envelopes are sent eagerly; unmatched receives wait for their sender).
    /// Requests already failed after a peer's abort notice do not count: to a dead peer they
    /// never complete, and spinning on them would only take CPU from the surviving ranks.
    fn data_in_flight(&self) -> bool {
        self.receiving.iter().any(|a| a.done.is_some())
            || self.sends.iter().any(|a| {
                a.done.is_some() && matches!(a.buffer.owner, Owner::Data(_) | Owner::Borrowed(_))
            })
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
                if self.pace.wait(self.data_in_flight()).is_zero() {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(MAX_IDLE);
                }
            }
        }
    }
}

/// Tests each request; completed ones are logged (`completed(since)`) and hand their buffer
/// (mapped by `done_value`) to the rank. Returns whether any completed, and the size of the
/// largest receive still in flight at its first test (0 if none).
fn test_all<T>(
    active: &mut Vec<Active<T>>,
    done_value: impl Fn(Owner, Option<(Result<Envelope, String>, usize)>) -> T,
    completed: impl Fn(Instant),
) -> (bool, usize) {
    let mut moved = false;
    let mut outlived = 0;
    let mut i = 0;
    while i < active.len() {
        let Active {
            request,
            buffer,
            arrival,
            done,
            since,
            tested,
        } = active.swap_remove(i);
        match request.test() {
            Ok(_) => {
                completed(since);
                let owner = buffer.reclaim();
                if let Some(done) = done {
                    let _ = done.send(Ok(done_value(owner, arrival)));
                }
                moved = true;
            }
            Err(request) => {
                if let (false, Some((_, len))) = (tested, &arrival) {
                    outlived = outlived.max(*len);
                }
                let last = active.len();
                active.push(Active {
                    request,
                    buffer,
                    arrival,
                    done,
                    since,
                    tested: true,
                });
                active.swap(i, last);
                i += 1;
            }
        }
    }
    (moved, outlived)
}

/// Runs MPI on this thread until asked to finalise.
fn run(
    commands: Receiver<Command>,
    ready: Sender<Result<(usize, usize), String>>,
    wire: WireLog,
    progress: MpiProgress,
    arena: Option<&'static str>,
    policy: Arc<Mutex<String>>,
) {
    // Before MPI starts its own threads, which inherit it: they too work in short bursts.
    let slice = super::sched::request_short_slice();
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
    let local_ranks = crate::config::mpi_launch().map_or(size, |l| l.local_size);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut pace = Pace::new(progress, local_ranks, cores);
    pace.set_slice(slice);
    pace.set_arena(arena);
    *policy.lock().unwrap() = pace.describe();
    let mut engine = Engine {
        world,
        rank,
        sends: Vec::new(),
        waiting: (0..size).map(|_| VecDeque::new()).collect(),
        envelopes: (0..size).map(|_| None).collect(),
        receiving: Vec::new(),
        failed: None,
        fail_at: None,
        wire,
        pace,
        policy,
    };
    let _ = ready.send(Ok((rank, size)));
    let finalize: Option<Sender<()>> = loop {
        let busy = !engine.sends.is_empty()
            || !engine.receiving.is_empty()
            || engine.waiting.iter().any(|q| !q.is_empty());
        // With nothing in flight the thread sleeps until a rank asks for something; with
        // requests in flight it tests them at the pace `progress.rs` sets, and wakes at once
        // for a new command.
        let wait = engine.pace.wait(engine.data_in_flight());
        let next = if !busy {
            commands.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else if wait.is_zero() {
            std::thread::yield_now();
            commands.try_recv().map_err(|e| match e {
                mpsc::TryRecvError::Empty => RecvTimeoutError::Timeout,
                mpsc::TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            })
        } else {
            commands.recv_timeout(wait)
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
        let moved = engine.progress();
        engine.pace.tested(moved);
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
    /// Receives and sends posted since the last flush, wait or finalisation: they reach the
    /// communication thread together, in one [`Command::Batch`].
    pending: Mutex<Vec<Command>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    finalized: AtomicBool,
    wire: WireLog,
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
    /// flight as `progress` asks; fails if MPI was initialised before.
    pub fn start(peer_timeout: Duration, progress: MpiProgress) -> RtpResult<Self> {
        let (commands, inbox) = mpsc::channel();
        let (ready, started) = mpsc::channel();
        let wire = WireLog::default();
        let log = wire.clone();
        let policy = Arc::new(Mutex::new(String::new()));
        let shown = policy.clone();
        // Before the thread starts, so that it allocates received buffers where this thread
        // frees them.
        let arena = super::arena::share_one_arena();
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
                    "the MPI thread ended during initialisation".into(),
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
            .map_err(|_| transport_error(self.rank, op, "the MPI thread is gone".into()))
    }

    fn finalised(&self, op: &str) -> RtpError {
        transport_error(
            self.rank,
            op,
            "MPI has already been finalised for this process".into(),
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
        // The reply may depend on commands still held here (this rank's own receive).
        self.flush(op)?;
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

/// Turns an arrival into the tensor data it carries, checking that its length is the one its
/// envelope announces. The receive buffer becomes the data: no copy.
fn decode(arrival: Arrival) -> Result<(Header, TensorData), String> {
    let Arrival {
        envelope,
        elems,
        len,
    } = arrival;
    let envelope = envelope?;
    let expected = envelope.header.shape.iter().product::<usize>() * envelope.dtype.size();
    if len != expected {
        return Err(format!(
            "{} carries {len} bytes, not the {expected} of {:?} {:?}",
            envelope.header, envelope.dtype, envelope.header.shape
        ));
    }
    let shape = envelope.header.shape.clone();
    Ok((
        envelope.header,
        TensorData::from_bytes(elems.into_bytes(), shape, envelope.dtype),
    ))
}

struct MpiSend {
    transport: Arc<MpiTransport>,
    to: usize,
    op: String,
    /// The envelope's and the data's completions.
    replies: [Receiver<Result<(), Fault>>; 2],
    /// The sender's charges for the payload: MPI reads its bytes until the send completes, so
    /// the ledger keeps counting them until then.
    _hold: Vec<Arc<crate::accounting::Charge>>,
}

impl SendHandle for MpiSend {
    fn wait(self: Box<Self>) -> RtpResult<()> {
        for reply in self.replies {
            self.transport.await_reply(reply, self.to, &self.op)?;
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
        let arrival = self
            .transport
            .await_reply(self.reply, self.from, &self.expect.op)?;
        let (header, data) = decode(arrival).map_err(|reason| {
            transport_error(
                rank,
                &self.expect.op,
                format!("from rank {}: {reason}", self.from),
            )
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
        hold: Vec<Arc<crate::accounting::Charge>>,
    ) -> RtpResult<Box<dyn SendHandle>> {
        let op = header.op.to_string();
        crate::config::check_rank(to, self.0.size)?;
        let (dtype, size, data) = match payload {
            Payload::Host(data) => (data.dtype, data.as_bytes().len(), Owner::Data(data)),
            Payload::Borrowed(b) => (b.dtype(), b.bytes().len(), Owner::Borrowed(b)),
            Payload::Device(_) => {
                return Err(transport_error(
                    self.0.rank,
                    &op,
                    "the MPI transport moves host buffers only".into(),
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
        let envelope =
            serde_json::to_vec(&Envelope { header, dtype }).expect("a header serialises");
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

    fn progress_policy(&self) -> Option<String> {
        Some(self.0.policy.lock().unwrap().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn arrival(dtype: DType, shape: Vec<usize>, elems: Elems, len: usize) -> Arrival {
        Arrival {
            envelope: Ok(Envelope {
                header: Header {
                    seq: 3,
                    op: Cow::Borrowed("test"),
                    part: 1,
                    shape,
                },
                dtype,
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
            MpiTransport::start(Duration::from_secs(20), MpiProgress::Auto)
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
        #[derive(Debug)]
        struct Held(TensorData);
        // SAFETY: the data is owned and never written.
        unsafe impl HostBytes for Held {
            fn bytes(&self) -> &[u8] {
                self.0.as_bytes()
            }
            fn dtype(&self) -> burn::tensor::DType {
                self.0.dtype
            }
            fn shape(&self) -> Vec<usize> {
                self.0.shape.to_vec()
            }
        }
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
        transport.finalize().unwrap();
        let late = Transport::<()>::irecv(&endpoint, 0, header(2));
        assert!(
            late.is_err(),
            "a receive posted after finalisation must fail"
        );
    }

    /// A length other than the envelope's, or an unreadable envelope, is an error, not data.
    #[test]
    fn a_message_that_disagrees_with_its_envelope_is_refused() {
        let short = decode(arrival(DType::F32, vec![3], Elems::zeroed(4, 8), 8));
        assert!(short.unwrap_err().contains("carries 8 bytes, not the 12"));
        let mut bad = arrival(DType::F32, vec![3], Elems::zeroed(4, 12), 12);
        bad.envelope = Err("unreadable header: EOF".into());
        assert!(decode(bad).unwrap_err().contains("unreadable header"));
    }
}
