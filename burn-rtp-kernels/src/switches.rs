//! The process-wide switch between this crate's kernels and the compositions they replace,
//! and the counters of steps run on this crate's kernels: a leaf every kernel may use.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static FUSED_LAUNCHES: AtomicU64 = AtomicU64::new(0);
static FUSED_OFF: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Steps run on this crate's kernels by the current thread.
    static THREAD_LAUNCHES: Cell<u64> = const { Cell::new(0) };
}

/// Turns the fused kernels (and NdArray's native steps) off, or back on, for the whole
/// process: every backend then runs the generic compositions. It exists to measure one
/// against the other in one run (the trainer's `--kernels generic`); results agree either
/// way to rounding.
pub fn set_fused_kernels(on: bool) {
    FUSED_OFF.store(!on, Ordering::Relaxed);
}

/// Whether cube backends run the fused kernels and NdArray its native steps (the default).
pub fn fused_kernels_enabled() -> bool {
    !FUSED_OFF.load(Ordering::Relaxed)
}

/// Steps the whole process has run on this crate's own kernels so far (fused `#[cube]`
/// launches and NdArray's native steps), for reports. Tests that must prove which path ran
/// read [`fused_launches_on_this_thread`], which steps on other threads cannot move.
pub fn fused_launches() -> u64 {
    FUSED_LAUNCHES.load(Ordering::Relaxed)
}

/// Steps the calling thread has run on this crate's own kernels so far. A rank runs its
/// steps on its own thread, so a rank (or a single-threaded test) can tell that its steps
/// took this crate's kernels however many other threads run steps at the same time.
pub fn fused_launches_on_this_thread() -> u64 {
    THREAD_LAUNCHES.with(Cell::get)
}

/// Counts one step run on this crate's own kernels, by the calling thread.
pub(crate) fn count_fused_launch() {
    FUSED_LAUNCHES.fetch_add(1, Ordering::Relaxed);
    THREAD_LAUNCHES.with(|n| n.set(n.get() + 1));
}
