//! The communication thread: it owns every MPI call, takes the ranks' commands, starts and
//! tests their requests at the pace `progress.rs` sets, and answers each when it completes.

use super::super::progress::{Pace, MAX_IDLE};
use super::buffer::{Elems, InFlight, Owner};
use super::wire::{Arrival, Envelope, Fault, Reply, ABORT, DATA, ENVELOPE};
use crate::config::MpiProgress;
use mpi::point_to_point::Source;
use mpi::topology::Communicator;
use mpi::traits::Equivalence;
use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long after a peer's abort notice transfers with the other peers may still complete:
/// data already on its way (e.g. the rest of the start-up agreement, which lets every rank
/// report the disagreement itself) is delivered, then everything pending fails.
const GRACE: Duration = Duration::from_secs(1);
/// Requests from the ranks' side to the communication thread.
pub(super) enum Command {
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
    /// Completes what is in flight, then finalises MPI; if requests are still in flight after
    /// `within`, leaves MPI unfinalised and says how many.
    Finalize {
        done: Sender<Result<(), String>>,
        within: Duration,
    },
}

/// A finalisation asked for: where to answer, and how long to wait for requests in flight.
type Finalizing = (Sender<Result<(), String>>, Duration);

/// One request in flight on the communication thread.
struct Active<T> {
    transfer: InFlight,
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
pub(super) type WireLog = Arc<Mutex<Option<Vec<(Instant, Instant)>>>>;

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

    fn accept(&mut self, command: Command) -> Option<Finalizing> {
        match command {
            Command::Send {
                to,
                tag,
                buffer,
                done,
            } => {
                let transfer = InFlight::send(&self.world.process_at_rank(to), tag, buffer);
                self.sends.push(Active {
                    transfer,
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
            Command::Finalize { done, within } => return Some((done, within)),
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
                    // MPI's count of a byte message is never negative; 0 if it were.
                    let count = status.count(u8::equivalent_datatype()).max(0) as usize;
                    let mut raw = vec![0u8; count];
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
                let len = status.count(u8::equivalent_datatype()).max(0) as usize;
                let size = envelope.as_ref().map_or(1, |e| e.dtype.size());
                // The bytes move from here on: over a single-copy transport (Open MPI's vader
                // with CMA) this call itself copies them from the sender's memory, so the wire
                // interval starts before it, not after.
                let matched = Instant::now();
                let transfer = InFlight::receive(message, Elems::zeroed(size, len), len);
                let done = self.waiting[source].pop_front().expect("checked non-empty");
                self.receiving.push(Active {
                    transfer,
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
            || self
                .sends
                .iter()
                .any(|a| a.done.is_some() && a.transfer.sends_tensor())
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

    /// Completes every request in flight (sends must finish before MPI may be finalised), or gives up at `deadline`; returns how many are
    /// left (0 when all completed).
    fn drain(&mut self, deadline: Instant) -> usize {
        while !self.sends.is_empty() || !self.receiving.is_empty() {
            if Instant::now() >= deadline {
                return self.sends.len() + self.receiving.len();
            }
            if !self.progress() {
                if self.pace.wait(self.data_in_flight()).is_zero() {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(MAX_IDLE);
                }
            }
        }
        0
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
            transfer,
            arrival,
            done,
            since,
            tested,
        } = active.swap_remove(i);
        match transfer.test() {
            Ok(owner) => {
                completed(since);
                if let Some(done) = done {
                    let _ = done.send(Ok(done_value(owner, arrival)));
                }
                moved = true;
            }
            Err(transfer) => {
                if let (false, Some((_, len))) = (tested, &arrival) {
                    outlived = outlived.max(*len);
                }
                let last = active.len();
                active.push(Active {
                    transfer,
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
pub(super) fn run(
    commands: Receiver<Command>,
    ready: Sender<Result<(usize, usize), String>>,
    wire: WireLog,
    progress: MpiProgress,
    arena: Option<String>,
    policy: Arc<Mutex<String>>,
) {
    // Before MPI starts its own threads, which inherit it: they too work in short bursts.
    let slice = super::super::sched::request_short_slice();
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
    let finalize: Option<Finalizing> = loop {
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
    let Some((done, within)) = finalize else {
        return;
    };
    let left = engine.drain(Instant::now() + within);
    if left > 0 {
        // A peer never took or sent what this rank still waits for. Finalising would block
        // on it; leaving MPI as it is lets mpirun end the job when this process exits, and
        // requests still in flight must not be dropped (rsmpi panics), so they are forgotten.
        let rank = engine.rank;
        std::mem::forget(engine);
        std::mem::forget(universe);
        let _ = done.send(Err(format!(
            "rank {rank}: {left} transfer(s) still in flight {:.1} s after finalisation began; MPI left unfinalised",
            within.as_secs_f64()
        )));
        return;
    }
    tracing::debug!(rank = engine.rank, "rtp: finalising MPI");
    drop(engine);
    drop(universe);
    let _ = done.send(Ok(()));
}
