//! The embedded default: ranks are threads of one process and shards are handed over.
//!
//! Messages are matched the way MPI matches them: per sender, in order, against posted
//! receives. A message that arrives before its receive is posted waits in the sender's lane
//! of the receiver's inbox; a receive posted before its message waits in the same lane.
//!
//! Two delivery modes ([`Delivery`]): buffered sends complete at once; rendezvous sends
//! complete only once a posted receive has taken them, as MPI's rendezvous protocol and NCCL
//! do, so a call site that relies on buffering times out instead of passing by luck. A
//! seeded [`Chaos`] mode injects yields and sleeps around every send, receive and hand-over.

use super::{BufferKind, Header, Payload, RecvHandle, SendHandle, Transport};
use crate::config::{Chaos, Delivery};
use crate::error::{RtpError, RtpResult};
use crate::state::accounting::Charge;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often a receiver yields before it blocks.
const SPIN_YIELDS: usize = 64;

/// The longest a blocked rank sleeps before it looks at the abort and exit flags again.
const POLL: Duration = Duration::from_millis(200);

/// Completion of one rendezvous send.
#[derive(Default)]
struct SendDone {
    taken: Mutex<bool>,
    cv: Condvar,
}

impl SendDone {
    fn set(&self) {
        *self.taken.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

struct Envelope<T> {
    header: Header,
    payload: Payload<T>,
    /// Set once a posted receive took the message (rendezvous sends only).
    done: Option<Arc<SendDone>>,
    /// The sender's charges for the buffer, kept alive until a receive takes the message.
    _hold: Vec<Arc<Charge>>,
}

impl<T> Envelope<T> {
    fn taken(self) -> (Header, Payload<T>) {
        if let Some(done) = &self.done {
            done.set();
        }
        (self.header, self.payload)
    }
}

/// A posted receive; the inbox's lock guards its contents.
type Slot<T> = Arc<Mutex<Option<(Header, Payload<T>)>>>;

/// Messages from one sender to one receiver, matched in order against posted receives.
struct Lane<T> {
    /// Arrived before their receive was posted.
    unexpected: VecDeque<Envelope<T>>,
    /// Posted before their message arrived.
    posted: VecDeque<Slot<T>>,
}

struct Inbox<T> {
    /// One lane per sender; ranks issue ops in the same order, so lane order is op order.
    lanes: Mutex<Vec<Lane<T>>>,
    arrived: Condvar,
}

/// Why the world stopped, as first reported.
#[derive(Debug, Clone)]
pub(crate) struct AbortRecord {
    pub rank: usize,
    pub reason: String,
}

/// Options of an in-process world beyond its size and timeout.
#[derive(Debug, Clone, Copy, Default)]
pub struct HubOptions {
    /// Buffered or rendezvous sends.
    pub delivery: Delivery,
    /// Seeded perturbation of every send, receive and hand-over (`None`: off).
    pub chaos: Option<Chaos>,
}

/// Shared state of an in-process world: one inbox per rank and the failure record.
pub struct InProcessHub<T> {
    inboxes: Vec<Inbox<T>>,
    aborted: AtomicBool,
    first_failure: Mutex<Option<AbortRecord>>,
    exited: Vec<AtomicBool>,
    timeout: Duration,
    options: HubOptions,
}

impl<T: Send + 'static> InProcessHub<T> {
    /// Creates the hub of a world of `world_size` ranks with rendezvous sends and no chaos.
    pub fn new(world_size: usize, timeout: Duration) -> Arc<Self> {
        Self::with_options(world_size, timeout, HubOptions::default())
    }

    /// Creates the hub of a world of `world_size` ranks.
    pub fn with_options(world_size: usize, timeout: Duration, options: HubOptions) -> Arc<Self> {
        Arc::new(Self {
            inboxes: (0..world_size)
                .map(|_| Inbox {
                    lanes: Mutex::new(
                        (0..world_size)
                            .map(|_| Lane {
                                unexpected: VecDeque::new(),
                                posted: VecDeque::new(),
                            })
                            .collect(),
                    ),
                    arrived: Condvar::new(),
                })
                .collect(),
            aborted: AtomicBool::new(false),
            first_failure: Mutex::new(None),
            exited: (0..world_size).map(|_| AtomicBool::new(false)).collect(),
            timeout,
            options,
        })
    }

    /// The transport endpoint of `rank`.
    pub fn endpoint(self: &Arc<Self>, rank: usize) -> InProcessTransport<T> {
        let chaos = self.options.chaos.map(|c| {
            Arc::new(ChaosRng {
                state: Mutex::new(splitmix(
                    c.seed ^ (rank as u64).wrapping_mul(0xA076_1D64_78BD_642F),
                )),
                max_delay_us: c.max_delay.as_micros().max(1) as u64,
            })
        });
        InProcessTransport {
            rank,
            hub: self.clone(),
            chaos,
        }
    }

    pub(crate) fn first_failure(&self) -> Option<AbortRecord> {
        self.first_failure.lock().unwrap().clone()
    }

    fn wake_all(&self) {
        for inbox in &self.inboxes {
            let _guard = inbox.lanes.lock().unwrap();
            inbox.arrived.notify_all();
        }
    }

    /// Why a rank waiting on `peer` must stop waiting, if it must.
    fn stop_reason(
        &self,
        rank: usize,
        peer: usize,
        op: &str,
        started: Instant,
    ) -> Option<RtpError> {
        if self.aborted.load(Ordering::Acquire) {
            let rec = self.first_failure().unwrap_or(AbortRecord {
                rank: peer,
                reason: "unknown".into(),
            });
            return Some(RtpError::PeerFailed {
                rank,
                op: op.to_string(),
                failed_rank: rec.rank,
                reason: rec.reason,
            });
        }
        if self.exited[peer].load(Ordering::Acquire) {
            return Some(RtpError::PeerExited {
                rank,
                op: op.to_string(),
                peer,
            });
        }
        let waited = started.elapsed();
        (waited >= self.timeout).then(|| RtpError::Timeout {
            rank,
            op: op.to_string(),
            peer,
            secs: waited.as_secs_f64(),
        })
    }

    /// How long a blocked rank may sleep before it looks at the flags again.
    fn slice(&self, started: Instant) -> Duration {
        self.timeout.saturating_sub(started.elapsed()).min(POLL)
    }
}

/// SplitMix64: a tiny, well-mixed generator; one stream per rank.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A rank's chaos generator: each draw decides whether to do nothing, yield or sleep.
struct ChaosRng {
    state: Mutex<u64>,
    max_delay_us: u64,
}

impl ChaosRng {
    fn perturb(&self) {
        let draw = {
            let mut s = self.state.lock().unwrap();
            *s = splitmix(*s);
            *s
        };
        match draw % 8 {
            0..=3 => {}
            4..=6 => {
                for _ in 0..(draw >> 8) % 4 + 1 {
                    std::thread::yield_now();
                }
            }
            _ => std::thread::sleep(Duration::from_micros((draw >> 16) % self.max_delay_us)),
        }
    }
}

/// One rank's endpoint of an [`InProcessHub`].
pub struct InProcessTransport<T> {
    rank: usize,
    hub: Arc<InProcessHub<T>>,
    chaos: Option<Arc<ChaosRng>>,
}

/// Draws one perturbation, if chaos is on. A rank's thread draws in program order, so a
/// seed gives the same sequence of perturbations on every run.
fn perturb(chaos: &Option<Arc<ChaosRng>>) {
    if let Some(chaos) = chaos {
        chaos.perturb();
    }
}

/// A send that is complete: buffered, or already taken.
struct Done;
impl SendHandle for Done {
    fn wait(self: Box<Self>) -> RtpResult<()> {
        Ok(())
    }
}

/// A rendezvous send waiting for its receive.
struct PendingSend<T> {
    rank: usize,
    to: usize,
    op: std::borrow::Cow<'static, str>,
    done: Arc<SendDone>,
    hub: Arc<InProcessHub<T>>,
}

impl<T: Send + 'static> SendHandle for PendingSend<T> {
    fn wait(self: Box<Self>) -> RtpResult<()> {
        let started = Instant::now();
        let mut taken = self.done.taken.lock().unwrap();
        loop {
            if *taken {
                return Ok(());
            }
            if let Some(err) = self.hub.stop_reason(self.rank, self.to, &self.op, started) {
                return Err(err);
            }
            let slice = self.hub.slice(started);
            taken = self.done.cv.wait_timeout(taken, slice).unwrap().0;
        }
    }
}

struct PendingRecv<T> {
    rank: usize,
    from: usize,
    expect: Header,
    slot: Slot<T>,
    hub: Arc<InProcessHub<T>>,
    chaos: Option<Arc<ChaosRng>>,
}

impl<T: Send + 'static> PendingRecv<T> {
    fn check(&self, header: Header, payload: Payload<T>) -> RtpResult<Payload<T>> {
        self.expect.check(&header, self.rank, self.from)?;
        Ok(payload)
    }
}

impl<T: Send + 'static> RecvHandle<T> for PendingRecv<T> {
    fn wait(self: Box<Self>) -> RtpResult<Payload<T>> {
        perturb(&self.chaos);
        let inbox = &self.hub.inboxes[self.rank];
        let started = Instant::now();
        // Peers usually answer within microseconds; yielding a few times lets them run
        // without paying for a sleep and a wake-up.
        for _ in 0..SPIN_YIELDS {
            if self.slot.lock().unwrap().is_some() {
                break;
            }
            std::thread::yield_now();
        }
        let mut lanes = inbox.lanes.lock().unwrap();
        loop {
            if let Some((header, payload)) = self.slot.lock().unwrap().take() {
                drop(lanes);
                perturb(&self.chaos);
                return self.check(header, payload);
            }
            if let Some(err) = self
                .hub
                .stop_reason(self.rank, self.from, &self.expect.op, started)
            {
                return Err(err);
            }
            let slice = self.hub.slice(started);
            lanes = inbox.arrived.wait_timeout(lanes, slice).unwrap().0;
        }
    }
}

impl<T: Send + 'static> Transport<T> for InProcessTransport<T> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.hub.inboxes.len()
    }

    fn buffer_kind(&self) -> BufferKind {
        BufferKind::Device
    }

    fn buffers_sends(&self) -> bool {
        self.hub.options.delivery == Delivery::Buffered
    }

    fn isend(
        &self,
        to: usize,
        header: Header,
        payload: Payload<T>,
        hold: Vec<Arc<Charge>>,
    ) -> RtpResult<Box<dyn SendHandle>> {
        let world_size = self.world_size();
        let inbox = self.hub.inboxes.get(to).ok_or(RtpError::RankOutOfRange {
            rank: to,
            world_size,
        })?;
        perturb(&self.chaos);
        let rendezvous = self.hub.options.delivery == Delivery::Rendezvous;
        let done = rendezvous.then(Arc::<SendDone>::default);
        // A borrowed name: no allocation on the send path.
        let op = header.op.clone();
        let envelope = Envelope {
            header,
            payload,
            done: done.clone(),
            _hold: hold,
        };
        {
            let mut lanes = inbox.lanes.lock().unwrap();
            let lane = &mut lanes[self.rank];
            match lane.posted.pop_front() {
                Some(slot) => *slot.lock().unwrap() = Some(envelope.taken()),
                None => lane.unexpected.push_back(envelope),
            }
            inbox.arrived.notify_all();
        }
        perturb(&self.chaos);
        Ok(match done {
            Some(done) => Box::new(PendingSend {
                rank: self.rank,
                to,
                op,
                done,
                hub: self.hub.clone(),
            }),
            None => Box::new(Done),
        })
    }

    fn irecv(&self, from: usize, expect: Header) -> RtpResult<Box<dyn RecvHandle<T>>> {
        if from >= self.world_size() {
            return Err(RtpError::RankOutOfRange {
                rank: from,
                world_size: self.world_size(),
            });
        }
        perturb(&self.chaos);
        let slot: Slot<T> = Arc::new(Mutex::new(None));
        {
            let inbox = &self.hub.inboxes[self.rank];
            let mut lanes = inbox.lanes.lock().unwrap();
            let lane = &mut lanes[from];
            match lane.unexpected.pop_front() {
                Some(envelope) => *slot.lock().unwrap() = Some(envelope.taken()),
                None => lane.posted.push_back(slot.clone()),
            }
        }
        Ok(Box::new(PendingRecv {
            rank: self.rank,
            from,
            expect,
            slot,
            hub: self.hub.clone(),
            chaos: self.chaos.clone(),
        }))
    }

    fn abort(&self, reason: &str) {
        {
            let mut first = self.hub.first_failure.lock().unwrap();
            if first.is_none() {
                *first = Some(AbortRecord {
                    rank: self.rank,
                    reason: reason.to_string(),
                });
            }
        }
        self.hub.aborted.store(true, Ordering::Release);
        self.hub.wake_all();
    }

    fn mark_exited(&self) {
        self.hub.exited[self.rank].store(true, Ordering::Release);
        self.hub.wake_all();
    }
}
