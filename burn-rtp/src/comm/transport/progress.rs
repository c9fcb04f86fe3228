//! How the MPI communication thread paces its tests of the requests in flight.
//!
//! Open MPI moves a large message only while a thread of each process is inside an MPI call,
//! except where the receiver can copy the whole message from the sender's memory in the call
//! that matches it (shared memory with single-copy support: CMA, XPMEM, KNEM). Elsewhere
//! (shared memory without it; TCP between hosts) each test moves a fragment or a socket's
//! worth. A thread that sleeps between tests then moves a fragment per wake-up. On a 16-core
//! VM whose transfers looked like that (most likely no single copy; not checked there),
//! config B at N=4 moved about 0.4 GB/s, so a step spent more time on the wire than
//! computing. Here, with single copy turned off (`btl_vader_single_copy_mechanism=none`, B,
//! N=2), testing back to back cut the step time to 0.44 of what it was. But a spinning thread
//! takes a core, which a host with more threads than cores needs for compute: with single
//! copy on, 4 ranks on 2 cores ran 7% slower when their threads spun. So
//! [`MpiProgress::Auto`] spins only where it pays.

use crate::config::MpiProgress;
use crate::human_bytes;
use std::time::Duration;

/// Longest sleep between two tests while backing off.
pub(crate) const MAX_IDLE: Duration = Duration::from_micros(200);

/// Receives at least this large show whether the transport needs this process's calls to move
/// bytes: they are above the eager limits of Open MPI's transports (shared memory 4 KiB, TCP
/// 64 KiB), whose messages have fully arrived when they are matched.
pub(crate) const LARGE_RECEIVE: usize = 256 << 10;

/// The pacing of one communication thread.
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    asked: MpiProgress,
    local_ranks: usize,
    cores: usize,
    /// The size of the first large receive still in flight after the call that matched it.
    needed_calls: Option<usize>,
    /// The sleep before the next test while backing off.
    idle: Duration,
    /// The scheduler slice the thread obtained (`sched.rs`); `None`: the kernel's own.
    slice: Option<Duration>,
    /// The process's malloc arenas (`arena.rs`); `None`: not asked.
    arena: Option<String>,
}

impl Pace {
    /// The pacing `asked` for, with `cores` cores available to this process (its CPU
    /// affinity: Open MPI's `mpirun` binds a process to one core at `-np` 1-2, more widely
    /// above) and `local_ranks` processes on this host.
    pub(crate) fn new(asked: MpiProgress, local_ranks: usize, cores: usize) -> Self {
        Self {
            asked,
            local_ranks,
            cores,
            needed_calls: None,
            idle: Duration::from_micros(1),
            slice: None,
            arena: None,
        }
    }

    /// Notes the process's malloc arenas, for reports.
    pub(crate) fn set_arena(&mut self, arena: Option<String>) {
        self.arena = arena;
    }

    /// Notes the scheduler slice the thread obtained, for reports.
    pub(crate) fn set_slice(&mut self, slice: Option<Duration>) {
        self.slice = slice;
    }

    /// Whether this process's cores number at least two per rank on the host: a core for
    /// each rank's compute and communication threads. Conservative where a launcher binds
    /// several ranks to a shared set (each is then counted against the whole host).
    fn cores_to_spare(&self) -> bool {
        2 * self.local_ranks <= self.cores
    }

    /// Whether to test back to back while data is in flight.
    pub(crate) fn spins(&self) -> bool {
        match self.asked {
            MpiProgress::Spin => true,
            MpiProgress::Backoff => false,
            MpiProgress::Auto => self.cores_to_spare() || self.needed_calls.is_some(),
        }
    }

    /// Notes a receive of `bytes` still in flight after the call that matched it; returns
    /// whether this is news (the first large one).
    pub(crate) fn receive_outlived_match(&mut self, bytes: usize) -> bool {
        if bytes < LARGE_RECEIVE || self.needed_calls.is_some() {
            return false;
        }
        self.needed_calls = Some(bytes);
        true
    }

    /// How long to wait for a command before the next test: zero means yield the core and
    /// test at once.
    pub(crate) fn wait(&self, data_in_flight: bool) -> Duration {
        if data_in_flight && self.spins() {
            Duration::ZERO
        } else {
            self.idle
        }
    }

    /// After a round of tests: back to short sleeps if something completed, else doubled
    /// sleeps, so that a long wait costs little CPU.
    pub(crate) fn tested(&mut self, moved: bool) {
        self.idle = if moved {
            Duration::from_micros(1)
        } else {
            (self.idle * 2).min(MAX_IDLE)
        };
    }

    /// The policy in force and why, for reports.
    pub(crate) fn describe(&self) -> String {
        let host = format!(
            "{} core(s) for {} local rank(s)",
            self.cores, self.local_ranks
        );
        let slice = match self.slice {
            Some(slice) => format!("{} µs scheduler slice", slice.as_micros()),
            None => "the kernel's scheduler slice".to_string(),
        };
        let policy = self.policy(&host);
        match &self.arena {
            Some(arena) => format!("{policy}; {slice}; {arena}"),
            None => format!("{policy}; {slice}"),
        }
    }

    /// The policy in force and why, without the scheduler slice.
    fn policy(&self, host: &str) -> String {
        match (self.asked, self.spins()) {
            (MpiProgress::Auto, true) => match self.needed_calls {
                Some(bytes) if !self.cores_to_spare() => format!(
                    "spin (auto: a {} receive needed progress calls; {host})",
                    human_bytes(bytes as u64)
                ),
                _ => format!("spin (auto: {host})"),
            },
            (MpiProgress::Auto, false) => {
                format!("backoff (auto: {host}; no large receive needed progress calls so far)")
            }
            (asked, _) => format!("{asked} (asked; {host})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_spins_with_a_core_per_thread_or_once_the_transport_needs_calls() {
        assert!(Pace::new(MpiProgress::Auto, 4, 16).spins());
        assert!(Pace::new(MpiProgress::Auto, 1, 2).spins());
        let mut pace = Pace::new(MpiProgress::Auto, 4, 2);
        assert!(!pace.spins(), "4 ranks on 2 cores back off");
        assert!(
            !pace.receive_outlived_match(LARGE_RECEIVE - 1),
            "small: eager"
        );
        assert!(!pace.spins());
        assert!(pace.receive_outlived_match(LARGE_RECEIVE));
        assert!(
            !pace.receive_outlived_match(LARGE_RECEIVE * 2),
            "noted once"
        );
        assert!(pace.spins());
        assert!(pace
            .describe()
            .starts_with("spin (auto: a 256.00 KiB receive"));
    }

    #[test]
    fn asked_policies_hold_whatever_the_host() {
        let mut spin = Pace::new(MpiProgress::Spin, 8, 2);
        let mut backoff = Pace::new(MpiProgress::Backoff, 1, 64);
        backoff.receive_outlived_match(LARGE_RECEIVE);
        spin.receive_outlived_match(LARGE_RECEIVE);
        assert!(spin.spins());
        assert!(!backoff.spins());
        backoff.set_slice(Some(Duration::from_micros(100)));
        assert_eq!(
            spin.describe(),
            "spin (asked; 2 core(s) for 8 local rank(s)); the kernel's scheduler slice"
        );
        assert_eq!(
            backoff.describe(),
            "backoff (asked; 64 core(s) for 1 local rank(s)); 100 µs scheduler slice"
        );
        backoff.set_arena(Some("one malloc arena".into()));
        assert_eq!(
            backoff.describe(),
            "backoff (asked; 64 core(s) for 1 local rank(s)); 100 µs scheduler slice; one malloc arena"
        );
    }

    #[test]
    fn spinning_waits_only_while_data_is_in_flight() {
        let mut pace = Pace::new(MpiProgress::Spin, 1, 1);
        assert_eq!(pace.wait(true), Duration::ZERO);
        assert_eq!(pace.wait(false), Duration::from_micros(1));
        for _ in 0..20 {
            pace.tested(false);
        }
        assert_eq!(
            pace.wait(false),
            MAX_IDLE,
            "the sleep doubles up to its cap"
        );
        pace.tested(true);
        assert_eq!(pace.wait(false), Duration::from_micros(1));
    }
}
