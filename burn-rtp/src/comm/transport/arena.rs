//! Gives an MPI process one glibc malloc arena, shared by the rank's thread and the
//! communication thread.
//!
//! The communication thread allocates the buffer of every tensor a rank receives (its size
//! comes with the message), and the rank's thread frees it when the tensor dies. With glibc's
//! defaults the communication thread allocates from an arena of its own, which glibc trims
//! once the buffers in it are freed, so the next buffer is faulted in again page by page, by
//! the kernel, on the rank's time. With one arena the freed buffers are reused. Measured with
//! `MALLOC_ARENA_MAX=1` against glibc's default (3 jobs each, alternating, 4 processes on 2
//! cores): RTP's step fell 5% at A, N = 4 and 10% at B, N = 4, where its hidden share of wire
//! time rose from 0.25 to 0.33; a process's minor page faults fell by a third; DDP's step and
//! every peak resident set stayed within their spread.
//!
//! It also keeps freed tensors' pages for reuse ([`keep_freed_pages`]): glibc's defaults
//! return a large freed block to the kernel (an `munmap`, or a trim of the heap's top), so the
//! next step's tensor of that size is faulted in again, page by page. Measured on config A,
//! one process with one thread (`scaling-report --speed`'s single cell, by hand with
//! `GLIBC_TUNABLES`): about 3,000-4,000 minor faults per step fell to about 100, and the step
//! by 2-4%.
//!
//! A `MALLOC_ARENA_MAX` of the user's wins: nothing is asked then; likewise the thresholds
//! where `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` or `GLIBC_TUNABLES` is set. Other
//! C libraries are left as they are.

/// Asks glibc for one arena for the threads that allocate from now on. Call it on the rank's
/// thread before the communication thread starts. Returns what the process runs with, for
/// reports; `None` where nothing applies (not glibc).
pub(crate) fn share_one_arena() -> Option<&'static str> {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return Some("malloc arenas as MALLOC_ARENA_MAX sets");
    }
    imp::one_arena().then_some("one malloc arena")
}

/// The largest block glibc serves from its heap instead of a fresh mapping: glibc's own
/// ceiling for the mmap threshold on 64-bit targets (32 MiB). Larger tensors still get a
/// mapping of their own, and their pages are faulted in at each allocation.
const MMAP_THRESHOLD: usize = 32 << 20;

/// How much free memory at the top of a heap glibc keeps instead of trimming it: enough for
/// a step's transient tensors at the sizes this crate trains.
const TRIM_THRESHOLD: usize = 1 << 30;

/// Asks glibc to keep freed blocks of up to [`MMAP_THRESHOLD`] in its heaps, and up to
/// [`TRIM_THRESHOLD`] of free memory at their tops, so that a step after warm-up reuses the
/// pages the previous step freed instead of faulting fresh ones in. The resident set then
/// stays near its peak between steps, as a caching allocator's does; the peak itself is the
/// same. Returns what the process runs with, for reports; `None` where nothing applies.
pub(crate) fn keep_freed_pages() -> Option<&'static str> {
    let set_by_user = [
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "GLIBC_TUNABLES",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some());
    if set_by_user {
        return Some("malloc thresholds as the environment sets");
    }
    imp::keep_pages().then_some("freed pages kept")
}

/// The note for reports of both settings together.
pub(crate) fn describe(arena: Option<&'static str>, pages: Option<&'static str>) -> Option<String> {
    match (arena, pages) {
        (Some(a), Some(p)) => Some(format!("{a}; {p}")),
        (a, p) => a.or(p).map(str::to_string),
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    pub(super) fn one_arena() -> bool {
        // SAFETY: mallopt only sets an allocator parameter; later arena choices read it.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
    }

    pub(super) fn keep_pages() -> bool {
        let (mmap, trim) = (
            super::MMAP_THRESHOLD as libc::c_int,
            super::TRIM_THRESHOLD as libc::c_int,
        );
        // SAFETY: as above: mallopt sets allocator parameters, read by later allocations
        // and frees; blocks already allocated keep how they were made.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    pub(super) fn one_arena() -> bool {
        false
    }

    pub(super) fn keep_pages() -> bool {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    #[test]
    fn glibc_takes_the_one_arena() {
        // A user's own setting is left alone (and then nothing is asked).
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            assert_eq!(super::share_one_arena(), Some("one malloc arena"));
        }
    }

    #[test]
    fn glibc_takes_both_thresholds() {
        // glibc refuses an mmap threshold above its ceiling: ours must be within it.
        if std::env::var_os("GLIBC_TUNABLES").is_none()
            && std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none()
            && std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_none()
        {
            assert_eq!(super::keep_freed_pages(), Some("freed pages kept"));
        }
    }
}
