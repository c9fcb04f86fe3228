//! Graceful stop: the first SIGINT, SIGTERM or SIGUSR1 asks every rank to finish its step and
//! save; a second one ends the process at once.
//!
//! SIGUSR1 is there for `mpirun`: Open MPI's `mpirun` answers SIGTERM by killing the job
//! (SIGTERM, then SIGKILL one second later, with its output already cut off), but forwards
//! SIGUSR1 to every rank and lets the job end by itself. Slurm's `scancel` and
//! `--signal=USR1@<secs>` signal the ranks themselves, which works either way.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// The flag that the first SIGINT, SIGTERM or SIGUSR1 raises, for
/// [`TrainConfig::stop`](crate::TrainConfig::stop). A second signal ends the process at once with status
/// 128 + the signal's number, as a shell reports a process killed by it.
///
/// The handlers are installed once per process; later calls return the same flag.
pub fn stop_on_signals() -> std::io::Result<Arc<AtomicBool>> {
    static STOP: Mutex<Option<Arc<AtomicBool>>> = Mutex::new(None);
    let mut installed = STOP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(stop) = &*installed {
        return Ok(stop.clone());
    }
    use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM, SIGUSR1] {
        // Registered before the flag, so that it sees the flag as an earlier signal left it.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, stop.clone())?;
        signal_hook::flag::register(sig, stop.clone())?;
    }
    *installed = Some(stop.clone());
    Ok(stop)
}
