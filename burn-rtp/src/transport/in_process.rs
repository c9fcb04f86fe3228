//! The embedded default: ranks are threads of one process and shards are handed over.

use super::{BufferKind, Header, Payload, RecvHandle, SendHandle, Transport};
use crate::error::{RtpError, RtpResult};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often a receiver yields before it blocks.
const SPIN_YIELDS: usize = 64;

struct Envelope<T> {
    header: Header,
    payload: Payload<T>,
}

struct Inbox<T> {
    /// One FIFO per sender; ranks issue ops in the same order, so FIFO order is op order.
    queues: Mutex<Vec<VecDeque<Envelope<T>>>>,
    arrived: Condvar,
}

/// Why the world stopped, as first reported.
#[derive(Debug, Clone)]
pub(crate) struct AbortRecord {
    pub rank: usize,
    pub reason: String,
}

/// Shared state of an in-process world: one inbox per rank and the failure record.
pub struct InProcessHub<T> {
    inboxes: Vec<Inbox<T>>,
    aborted: AtomicBool,
    first_failure: Mutex<Option<AbortRecord>>,
    exited: Vec<AtomicBool>,
    timeout: Duration,
}

impl<T: Send + 'static> InProcessHub<T> {
    /// Creates the hub of a world of `world_size` ranks.
    pub fn new(world_size: usize, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            inboxes: (0..world_size)
                .map(|_| Inbox {
                    queues: Mutex::new((0..world_size).map(|_| VecDeque::new()).collect()),
                    arrived: Condvar::new(),
                })
                .collect(),
            aborted: AtomicBool::new(false),
            first_failure: Mutex::new(None),
            exited: (0..world_size).map(|_| AtomicBool::new(false)).collect(),
            timeout,
        })
    }

    /// The transport endpoint of `rank`.
    pub fn endpoint(self: &Arc<Self>, rank: usize) -> InProcessTransport<T> {
        InProcessTransport {
            rank,
            hub: self.clone(),
        }
    }

    pub(crate) fn first_failure(&self) -> Option<AbortRecord> {
        self.first_failure.lock().unwrap().clone()
    }

    fn wake_all(&self) {
        for inbox in &self.inboxes {
            let _guard = inbox.queues.lock().unwrap();
            inbox.arrived.notify_all();
        }
    }
}

/// One rank's endpoint of an [`InProcessHub`].
pub struct InProcessTransport<T> {
    rank: usize,
    hub: Arc<InProcessHub<T>>,
}

struct Done;
impl SendHandle for Done {
    fn wait(self: Box<Self>) -> RtpResult<()> {
        Ok(())
    }
}

struct PendingRecv<T> {
    rank: usize,
    from: usize,
    expect: Header,
    hub: Arc<InProcessHub<T>>,
}

impl<T: Send + 'static> RecvHandle<T> for PendingRecv<T> {
    fn wait(self: Box<Self>) -> RtpResult<Payload<T>> {
        let hub = &self.hub;
        let inbox = &hub.inboxes[self.rank];
        let start = Instant::now();
        // Peers usually answer within microseconds; yielding a few times lets them run
        // without paying for a sleep and a wake-up.
        for _ in 0..SPIN_YIELDS {
            if !inbox.queues.lock().unwrap()[self.from].is_empty() {
                break;
            }
            std::thread::yield_now();
        }
        let mut queues = inbox.queues.lock().unwrap();
        loop {
            if let Some(env) = queues[self.from].pop_front() {
                if env.header != self.expect {
                    return Err(RtpError::Desync {
                        rank: self.rank,
                        peer: self.from,
                        op: self.expect.op.to_string(),
                        seq: self.expect.seq,
                        expected: self.expect.to_string(),
                        got: env.header.to_string(),
                    });
                }
                return Ok(env.payload);
            }
            if hub.aborted.load(Ordering::Acquire) {
                let rec = hub.first_failure().unwrap_or(AbortRecord {
                    rank: self.from,
                    reason: "unknown".into(),
                });
                return Err(RtpError::PeerFailed {
                    rank: self.rank,
                    op: self.expect.op.to_string(),
                    failed_rank: rec.rank,
                    reason: rec.reason,
                });
            }
            if hub.exited[self.from].load(Ordering::Acquire) {
                return Err(RtpError::PeerExited {
                    rank: self.rank,
                    op: self.expect.op.to_string(),
                    peer: self.from,
                });
            }
            let waited = start.elapsed();
            if waited >= hub.timeout {
                return Err(RtpError::Timeout {
                    rank: self.rank,
                    op: self.expect.op.to_string(),
                    peer: self.from,
                    secs: waited.as_secs_f64(),
                });
            }
            let slice = (hub.timeout - waited).min(Duration::from_millis(200));
            queues = inbox.arrived.wait_timeout(queues, slice).unwrap().0;
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

    fn isend(
        &self,
        to: usize,
        header: Header,
        payload: Payload<T>,
    ) -> RtpResult<Box<dyn SendHandle>> {
        let world_size = self.world_size();
        let inbox = self.hub.inboxes.get(to).ok_or(RtpError::RankOutOfRange {
            rank: to,
            world_size,
        })?;
        let mut queues = inbox.queues.lock().unwrap();
        queues[self.rank].push_back(Envelope { header, payload });
        inbox.arrived.notify_all();
        Ok(Box::new(Done))
    }

    fn irecv(&self, from: usize, expect: Header) -> RtpResult<Box<dyn RecvHandle<T>>> {
        if from >= self.world_size() {
            return Err(RtpError::RankOutOfRange {
                rank: from,
                world_size: self.world_size(),
            });
        }
        Ok(Box::new(PendingRecv {
            rank: self.rank,
            from,
            expect,
            hub: self.hub.clone(),
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
