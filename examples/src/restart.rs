//! Restarts: a run whose world fails resumes from its newest complete checkpoint, up to a
//! number of times, and the test hook that makes a rank fail on purpose.
//!
//! In-process, [`train`](crate::train) restarts its world itself (`TrainConfig::max_restarts`,
//! `gpt --max-restarts K`). Under MPI a dead rank ends the whole job, so `gpt supervise
//! --max-restarts K -- mpirun ...` runs the job and starts it again from the newest
//! checkpoint; it tells each attempt its number in [`ATTEMPT`].

use crate::checkpoint::Checkpoint;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where a restart resumes: the newest complete checkpoint under `root` and its step, or,
/// when none is whole yet, `start` (the run's own `--resume`, if any) at `first_step`.
pub fn resume_point(
    root: &Path,
    start: Option<PathBuf>,
    first_step: usize,
) -> (Option<PathBuf>, usize) {
    match Checkpoint::newest(root) {
        Ok(newest) => (
            Some(newest.checkpoint.dir().to_path_buf()),
            newest.checkpoint.manifest().step as usize,
        ),
        Err(_) => (start, first_step),
    }
}

/// The test hook: a comma-separated list of `STEP@RANK`; entry `i` makes rank `RANK` fail
/// as it starts step `STEP` (counted from 1) of attempt `i` (the first run is attempt 0).
/// In-process the rank panics; under MPI its process is killed (SIGKILL).
pub const FAIL_AT: &str = "RTP_TEST_FAIL_AT";

/// The attempt a supervised MPI job is (0 for the first), set by `gpt supervise`.
pub const ATTEMPT: &str = "RTP_ATTEMPT";

/// The in-process attempt, counted by the restart loop of `train`.
static IN_PROCESS_ATTEMPT: AtomicUsize = AtomicUsize::new(0);

/// Sets the in-process attempt number (the restart loop of `train`).
pub(crate) fn set_attempt(attempt: usize) {
    IN_PROCESS_ATTEMPT.store(attempt, Ordering::SeqCst);
}

/// The attempt this process runs: the supervisor's number under MPI, else the loop's.
fn attempt() -> usize {
    std::env::var(ATTEMPT)
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| IN_PROCESS_ATTEMPT.load(Ordering::SeqCst))
}

/// The failure `spec` injects in `attempt`: `(step, rank)`.
fn injected(spec: &str, attempt: usize) -> Option<(usize, usize)> {
    let entry = spec.split(',').nth(attempt)?;
    let (step, rank) = entry.trim().split_once('@')?;
    Some((step.trim().parse().ok()?, rank.trim().parse().ok()?))
}

/// Fails `rank` here if the test hook asks for it at step `step` of this attempt.
pub(crate) fn maybe_fail(rank: usize, step: usize, one_process_per_rank: bool) {
    let Ok(spec) = std::env::var(FAIL_AT) else {
        return;
    };
    let attempt = attempt();
    if injected(&spec, attempt) != Some((step, rank)) {
        return;
    }
    eprintln!("rank {rank}: failing at step {step} of attempt {attempt}, as {FAIL_AT} asks");
    if one_process_per_rank {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        loop {
            std::thread::park();
        }
    }
    panic!("rank {rank}: injected failure at step {step} ({FAIL_AT})");
}

#[cfg(test)]
mod tests {
    use super::injected;

    #[test]
    fn each_attempt_takes_its_own_entry() {
        let spec = "12@1, 30@0,45@3";
        assert_eq!(injected(spec, 0), Some((12, 1)));
        assert_eq!(injected(spec, 1), Some((30, 0)));
        assert_eq!(injected(spec, 2), Some((45, 3)));
        assert_eq!(injected(spec, 3), None);
        assert_eq!(injected("x", 0), None);
    }
}
