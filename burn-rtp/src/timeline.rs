//! A per-rank timeline of rotation compute and transfer intervals, to measure how much of the
//! transfer time hides behind compute.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What a rank was doing during an interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum IntervalKind {
    /// Computing with the shard on hand.
    Compute,
    /// A shard or travelling gradient in transit: from posting the receive to its arrival.
    Transfer,
    /// Received bytes really moving, by the transport's own clock (MPI: from the start of the
    /// matched receive, which copies them, to the moment it completed). Posting a receive is
    /// not a transfer.
    Wire,
    /// Blocked until a transfer completed: the wait for a receive's data or for a send's
    /// buffer to be free again.
    Wait,
}

/// One interval, in seconds since recording started.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Interval {
    /// What it was.
    pub kind: IntervalKind,
    /// Start, in seconds.
    pub start: f64,
    /// End, in seconds.
    pub end: f64,
}

/// Records intervals while enabled.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    /// Checked first, so that the rotation's hot path takes no lock while recording is off.
    on: AtomicBool,
    state: Mutex<Option<(Instant, Vec<Interval>)>>,
}

impl Timeline {
    pub(crate) fn enable(&self, on: bool) {
        *self.state.lock().unwrap() = on.then(|| (Instant::now(), Vec::new()));
        self.on.store(on, Ordering::Release);
    }

    /// The intervals recorded so far, with the transport's `wire` intervals placed on the
    /// same clock.
    pub(crate) fn take(&self, wire: Vec<(Instant, Instant)>) -> Vec<Interval> {
        match &mut *self.state.lock().unwrap() {
            Some((epoch, v)) => {
                let at = |t: Instant| t.saturating_duration_since(*epoch).as_secs_f64();
                let mut out = std::mem::take(v);
                out.extend(wire.into_iter().map(|(start, end)| Interval {
                    kind: IntervalKind::Wire,
                    start: at(start),
                    end: at(end),
                }));
                out
            }
            None => Vec::new(),
        }
    }

    /// Starts an interval; `None` when recording is off, so the hot path costs one lock.
    pub(crate) fn start(&self) -> Option<Instant> {
        self.on.load(Ordering::Acquire).then(Instant::now)
    }

    pub(crate) fn finish(&self, kind: IntervalKind, started: Option<Instant>) {
        let Some(started) = started else { return };
        if let Some((epoch, v)) = &mut *self.state.lock().unwrap() {
            v.push(Interval {
                kind,
                start: started.duration_since(*epoch).as_secs_f64(),
                end: epoch.elapsed().as_secs_f64(),
            });
        }
    }
}

/// The fraction of transfer time that overlapped compute (`None` without transfers).
///
/// Where the transport logged when bytes were really moving ([`IntervalKind::Wire`]), those
/// intervals are the transfers; otherwise (in-process, where nothing moves) the waits for a
/// shard are, which models a transfer rather than measuring one.
pub fn hidden_transfer_fraction(intervals: &[Interval]) -> Option<f64> {
    transfer_share_during(intervals, IntervalKind::Compute)
}

/// The fraction of transfer time (as in [`hidden_transfer_fraction`]) that fell inside
/// intervals of `kind`: with [`IntervalKind::Wait`], how much of it the rank spent blocked
/// on its transfers instead of working.
pub fn transfer_share_during(intervals: &[Interval], kind: IntervalKind) -> Option<f64> {
    let transfer = if intervals.iter().any(|i| i.kind == IntervalKind::Wire) {
        IntervalKind::Wire
    } else {
        IntervalKind::Transfer
    };
    // One thread records a rank's compute and waits, so these intervals never overlap each
    // other and their overlaps with a transfer add up.
    let during: Vec<(f64, f64)> = intervals
        .iter()
        .filter(|i| i.kind == kind)
        .map(|i| (i.start, i.end))
        .collect();
    let mut total = 0.0;
    let mut inside = 0.0;
    for t in intervals.iter().filter(|i| i.kind == transfer) {
        total += t.end - t.start;
        for (s, e) in &during {
            let overlap = t.end.min(*e) - t.start.max(*s);
            if overlap > 0.0 {
                inside += overlap;
            }
        }
    }
    (total > 0.0).then(|| (inside / total).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_counts_only_the_shared_time() {
        let iv = |kind, start, end| Interval { kind, start, end };
        let timeline = [
            iv(IntervalKind::Transfer, 0.0, 2.0),
            iv(IntervalKind::Compute, 0.5, 1.5),
            iv(IntervalKind::Transfer, 3.0, 4.0),
        ];
        let f = hidden_transfer_fraction(&timeline).unwrap();
        assert!((f - 1.0 / 3.0).abs() < 1e-12, "{f}");
        assert_eq!(hidden_transfer_fraction(&[]), None);
    }

    #[test]
    fn wire_time_is_split_between_compute_and_waits() {
        let iv = |kind, start, end| Interval { kind, start, end };
        // Wire intervals replace the posted-to-arrival transfers once the transport logs them.
        let timeline = [
            iv(IntervalKind::Transfer, 0.0, 10.0),
            iv(IntervalKind::Compute, 0.0, 2.0),
            iv(IntervalKind::Wait, 2.0, 3.0),
            iv(IntervalKind::Wire, 1.0, 4.0),
            iv(IntervalKind::Compute, 5.0, 6.0),
            iv(IntervalKind::Wire, 5.5, 6.5),
        ];
        let share = |kind| transfer_share_during(&timeline, kind).unwrap();
        // 4 s of wire: 1.5 s during compute, 1 s during the wait, 1.5 s elsewhere.
        assert!((share(IntervalKind::Compute) - 1.5 / 4.0).abs() < 1e-12);
        assert!((share(IntervalKind::Wait) - 1.0 / 4.0).abs() < 1e-12);
        assert_eq!(
            hidden_transfer_fraction(&timeline),
            Some(share(IntervalKind::Compute))
        );
    }
}
