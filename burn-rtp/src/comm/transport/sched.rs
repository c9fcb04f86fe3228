//! Asks the kernel to give the MPI communication thread a core as soon as it wakes.
//!
//! The thread works in short bursts: it posts a rank's requests, tests them and, over shared
//! memory with single copy, copies an arriving message. Each burst starts or finishes a ring
//! transfer, so a burst that waits for a core delays a transfer that could have moved during
//! the compute. Linux's EEVDF scheduler (6.6 and later) lets a running thread finish its slice
//! (0.75 ms times 1 + log2 of the core count, counting up to 8 cores: 1.5 ms on 2) before a
//! thread that wakes gets its core. Where the compute threads keep every core busy, the
//! communication thread thus waited for a compute step to end: 4 ranks on 2 cores, config B,
//! took a median 1.2 ms to pick up a receive their rank had posted, two times in three only
//! after the compute it was meant to overlap. A thread can ask for a shorter slice
//! (`sched_setattr`'s `sched_runtime`, taken for normal threads since Linux 6.12); a waking
//! thread with a shorter slice than the running one then usually takes the core at once (the
//! scheduler's `PREEMPT_SHORT`, on by default). With 100 µs the median fell to 40-55 µs.
//! Where each process's two threads share one core (B at N=2), steps took 9% less time;
//! elsewhere on 2 cores the step changed by less than its spread (README: "The communication
//! thread's scheduler slice").
//!
//! The request keeps the thread's policy, nice value and reset-on-fork flag, and needs no
//! privilege. Threads the communication thread starts afterwards (the MPI library's own)
//! inherit the slice. It is not made under real-time or idle policies, and other systems do
//! not make it; kernels before 6.12 accept it but keep their own slice, which the read-back
//! shows.

use std::time::Duration;

/// The slice the communication thread asks for: the shortest Linux accepts.
pub(crate) const SLICE: Duration = Duration::from_micros(100);

/// Asks for [`SLICE`] for the calling thread. Returns the slice the kernel reports for the
/// thread afterwards when it is the one asked for, `None` where the request was not taken.
pub(crate) fn request_short_slice() -> Option<Duration> {
    imp::request(SLICE)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::time::Duration;

    /// `struct sched_attr` of `sched_setattr(2)`, first version (48 bytes).
    #[repr(C)]
    #[derive(Default)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
    }

    pub(super) const SCHED_OTHER: u32 = 0;
    pub(super) const SCHED_BATCH: u32 = 3;
    const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

    /// The calling thread's scheduling policy and slice (`sched_runtime`).
    #[cfg(test)]
    pub(super) fn policy_and_slice() -> Option<(u32, u64)> {
        get().map(|a| (a.policy, a.runtime))
    }

    /// The calling thread's scheduling attributes.
    fn get() -> Option<SchedAttr> {
        let mut attr = SchedAttr::default();
        // SAFETY: the kernel writes at most `size` bytes into `attr`, which has that size.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut attr as *mut SchedAttr,
                std::mem::size_of::<SchedAttr>() as u32,
                0u32,
            )
        };
        (rc == 0).then_some(attr)
    }

    pub(super) fn request(slice: Duration) -> Option<Duration> {
        let mut attr = get()?;
        if !matches!(attr.policy, SCHED_OTHER | SCHED_BATCH) {
            return None;
        }
        attr.size = std::mem::size_of::<SchedAttr>() as u32;
        attr.flags &= SCHED_FLAG_RESET_ON_FORK;
        attr.runtime = slice.as_nanos() as u64;
        // SAFETY: `attr` is a valid `sched_attr` of the size it states; the kernel only reads it.
        let rc =
            unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
        if rc != 0 {
            return None;
        }
        // Kernels before 6.12 accept the call but keep their own slice for normal threads.
        let now = get()?;
        (now.runtime == attr.runtime).then(|| Duration::from_nanos(now.runtime))
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::time::Duration;

    pub(super) fn request(_slice: Duration) -> Option<Duration> {
        None
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The running kernel's (major, minor) version.
    fn kernel() -> (u32, u32) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|p| p.parse().ok());
        (parts.next().unwrap(), parts.next().unwrap())
    }

    /// Linux 6.12 and later take the request from a normal thread and report the slice back;
    /// older ones keep their own. The thread's nice value (raised here first, as `nice
    /// mpirun` would) stays as it was.
    #[test]
    fn the_slice_is_taken_where_the_kernel_supports_it_and_nice_is_kept() {
        let (before, got, nice, asked) = std::thread::spawn(|| {
            // SAFETY: plain syscalls on the calling thread; raising one's own nice value
            // needs no privilege.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::id_t;
            let asked = (unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) } + 1).min(19);
            assert_eq!(
                unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, asked) },
                0
            );
            let before = imp::policy_and_slice();
            let got = request_short_slice();
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
            (before, got, nice, asked)
        })
        .join()
        .unwrap();
        assert_eq!(nice, asked, "the request must keep the thread's nice value");
        let Some((policy, _)) = before else {
            return; // `sched_getattr` is refused here (a seccomp filter): nothing to check.
        };
        let normal = matches!(policy, imp::SCHED_OTHER | imp::SCHED_BATCH);
        let expected = (kernel() >= (6, 12) && normal).then_some(SLICE);
        assert_eq!(got, expected, "kernel {:?}, policy {policy}", kernel());
    }
}
