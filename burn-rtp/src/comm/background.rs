//! A rank's background worker: collectives the rank starts and does not wait for (DDP's
//! bucket all-reduces), run one at a time in the order they were started, on a thread of
//! their own, while the rank's thread goes on computing.
//!
//! Every rank starts the same jobs in the same order, so the workers' messages match each
//! other. The rank's own thread must not exchange while a job runs: its messages would
//! interleave with the worker's in a different order on each rank. So `Comm::next_seq`, where
//! every collective begins, first waits for the worker to be idle ([`Background::drain`]).
//! A job that fails (a peer timed out) is re-raised on the rank's thread at that wait, so an
//! error is never lost in the worker.

use std::any::Any;
use std::sync::{mpsc, Arc, Condvar, Mutex};

/// A collective to run in the background.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// What the rank's thread and its worker share.
#[derive(Default)]
struct State {
    /// Jobs started and not yet finished.
    pending: usize,
    /// The panic of the first job that failed; later jobs are skipped.
    failure: Option<Box<dyn Any + Send>>,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// One rank's background worker, started at its first job.
#[derive(Default)]
pub(crate) struct Background {
    shared: Shared,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
}

impl Background {
    /// Starts `job` after the jobs already started.
    pub(crate) fn submit(&self, rank: usize, job: Job) {
        self.submit_with(rank, job, spawn);
    }

    /// [`Background::submit`], starting the worker with `start` if there is none yet.
    ///
    /// A job is counted only once a worker exists to finish it, and uncounted if the worker
    /// cannot take it: a job counted for no thread would make [`Background::drain`] wait for
    /// ever.
    fn submit_with(
        &self,
        rank: usize,
        job: Job,
        start: impl FnOnce(usize, Shared) -> std::io::Result<mpsc::Sender<Job>>,
    ) {
        let mut queue = self.queue.lock().unwrap();
        if queue.is_none() {
            let sender = start(rank, self.shared.clone())
                .unwrap_or_else(|e| panic!("rank {rank}: cannot start its background worker: {e}"));
            *queue = Some(sender);
        }
        let sender = queue.as_ref().expect("started above");
        self.shared.0.lock().unwrap().pending += 1;
        if sender.send(job).is_err() {
            let (lock, done) = &*self.shared;
            lock.lock().unwrap().pending -= 1;
            done.notify_all();
            panic!("rank {rank}: its background worker is gone");
        }
    }

    /// Whether no job is pending and none failed.
    pub(crate) fn idle(&self) -> bool {
        let state = self.shared.0.lock().unwrap();
        state.pending == 0 && state.failure.is_none()
    }

    /// Blocks until every started job has finished; re-raises the first failure. A no-op on
    /// the worker itself (its own job is running).
    pub(crate) fn drain(&self) {
        if crate::state::timeline::on_background_thread() {
            return;
        }
        let (lock, done) = &*self.shared;
        let mut state = lock.lock().unwrap();
        while state.pending > 0 {
            state = done.wait(state).unwrap();
        }
        if let Some(failure) = state.failure.take() {
            drop(state);
            std::panic::resume_unwind(failure);
        }
    }
}

/// The worker thread of `rank`: runs jobs in order until the rank drops its sender.
fn spawn(rank: usize, shared: Shared) -> std::io::Result<mpsc::Sender<Job>> {
    let (sender, jobs) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name(format!("rtp-rank{rank}-background"))
        .spawn(move || {
            crate::state::timeline::mark_background_thread();
            for job in jobs {
                let failed = shared.0.lock().unwrap().failure.is_some();
                // A job that panics (a transport error) must still count as finished, or the
                // rank's thread would wait for it for ever.
                let outcome = if failed {
                    Ok(())
                } else {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                };
                let (lock, done) = &*shared;
                let mut state = lock.lock().unwrap();
                if let Err(panic) = outcome {
                    state.failure.get_or_insert(panic);
                }
                state.pending -= 1;
                done.notify_all();
            }
        })?;
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn jobs_run_in_order_and_drain_waits_for_all() {
        let bg = Background::default();
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..5 {
            let log = log.clone();
            bg.submit(
                0,
                Box::new(move || {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    log.lock().unwrap().push(i);
                }),
            );
        }
        bg.drain();
        assert!(bg.idle());
        assert_eq!(*log.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_failed_job_is_raised_at_the_drain_and_later_jobs_are_skipped() {
        let bg = Background::default();
        let ran = Arc::new(AtomicUsize::new(0));
        bg.submit(0, Box::new(|| std::panic::panic_any("peer 2 timed out")));
        let r = ran.clone();
        bg.submit(
            0,
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        );
        let raised = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bg.drain()))
            .expect_err("the failure reaches the rank's thread");
        assert_eq!(raised.downcast_ref::<&str>(), Some(&"peer 2 timed out"));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "a job after a failure ran");
    }

    /// A worker that cannot start leaves nothing counted: the rank's panic names it, and a
    /// later wait for the worker returns at once instead of waiting for a job no thread runs.
    #[test]
    fn a_worker_that_cannot_start_leaves_no_job_to_wait_for() {
        let bg = Background::default();
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            bg.submit_with(3, Box::new(|| ()), |_, _| {
                Err(std::io::Error::other("no threads left"))
            })
        }))
        .expect_err("the failed start is raised");
        let message = refused.downcast_ref::<String>().expect("a formatted panic");
        assert!(
            message.contains("rank 3") && message.contains("no threads left"),
            "{message}"
        );
        assert!(bg.idle());
        let (done, waited) = mpsc::channel();
        std::thread::spawn(move || {
            bg.drain();
            let _ = done.send(());
        });
        waited
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("drain returned");
    }
}
