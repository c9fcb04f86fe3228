//! A per-rank timeline of rotation compute and transfer intervals, to measure how much of the
//! transfer time hides behind compute.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

thread_local! {
    /// Whether this thread is a rank's background worker (see `comm::background`).
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a rank's background worker: its compute and wait intervals
/// are not the rank's, which computes (or waits for the worker) on its own thread meanwhile,
/// so only its transfers are recorded.
pub(crate) fn mark_background_thread() {
    BACKGROUND.with(|b| b.set(true));
}

/// Whether the calling thread is a rank's background worker.
pub(crate) fn on_background_thread() -> bool {
    BACKGROUND.with(Cell::get)
}

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
    /// Blocked until a transfer completed: the wait for a receive's data, for a send's
    /// buffer to be free again, or for the rank's background collectives (DDP's bucket
    /// all-reduces) to finish.
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
        if kind != IntervalKind::Transfer && on_background_thread() {
            return;
        }
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
    let during = Covered::new(
        intervals
            .iter()
            .filter(|i| i.kind == kind)
            .map(|i| (i.start, i.end)),
    );
    let mut total = 0.0;
    let mut inside = 0.0;
    for t in intervals.iter().filter(|i| i.kind == transfer) {
        total += t.end - t.start;
        inside += during.within(t.start, t.end);
    }
    (total > 0.0).then(|| (inside / total).min(1.0))
}

/// The union of a set of intervals, sorted, so that the time it shares with any interval is
/// found by binary search. Comparing every transfer with every interval instead took time that
/// grows with the square of the run's length (a 3-step job records thousands of each).
struct Covered {
    /// Disjoint intervals, in order.
    spans: Vec<(f64, f64)>,
    /// `before[i]`: the total length of `spans[..i]`.
    before: Vec<f64>,
}

impl Covered {
    fn new(intervals: impl Iterator<Item = (f64, f64)>) -> Self {
        let mut sorted: Vec<(f64, f64)> = intervals.filter(|(s, e)| e > s).collect();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut spans: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
        for (s, e) in sorted {
            match spans.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => spans.push((s, e)),
            }
        }
        let mut before = Vec::with_capacity(spans.len() + 1);
        let mut sum = 0.0;
        before.push(sum);
        for (s, e) in &spans {
            sum += e - s;
            before.push(sum);
        }
        Self { spans, before }
    }

    /// Covered time up to `x`.
    fn up_to(&self, x: f64) -> f64 {
        let k = self.spans.partition_point(|(s, _)| *s <= x);
        match k.checked_sub(1) {
            None => 0.0,
            Some(i) => {
                let (s, e) = self.spans[i];
                self.before[i] + (x.min(e) - s)
            }
        }
    }

    /// Covered time within `[start, end]`.
    fn within(&self, start: f64, end: f64) -> f64 {
        if end <= start {
            return 0.0;
        }
        self.up_to(end) - self.up_to(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(kind: IntervalKind, start: f64, end: f64) -> Interval {
        Interval { kind, start, end }
    }

    #[test]
    fn overlap_counts_only_the_shared_time() {
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

    /// The shares agree with a direct comparison of every transfer with every interval, on
    /// timelines of disjoint compute and wait intervals (as one rank's thread records them)
    /// and transfers that start and end anywhere, including inside, across and between them.
    #[test]
    fn shares_match_the_pairwise_overlap() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for case in 0..50 {
            let mut timeline = Vec::new();
            let mut at = 0.0;
            for _ in 0..(case * 7 % 40 + 1) {
                at += next();
                let kind = if next() < 0.6 {
                    IntervalKind::Compute
                } else {
                    IntervalKind::Wait
                };
                let end = at + next() * 2.0;
                timeline.push(iv(kind, at, end));
                at = end;
            }
            for _ in 0..(case % 13 + 1) {
                let start = next() * (at + 1.0);
                timeline.push(iv(IntervalKind::Wire, start, start + next() * 3.0));
            }
            for kind in [IntervalKind::Compute, IntervalKind::Wait] {
                let (mut total, mut inside) = (0.0, 0.0);
                for t in timeline.iter().filter(|i| i.kind == IntervalKind::Wire) {
                    total += t.end - t.start;
                    for d in timeline.iter().filter(|i| i.kind == kind) {
                        inside += (t.end.min(d.end) - t.start.max(d.start)).max(0.0);
                    }
                }
                let want = (total > 0.0).then(|| (inside / total).min(1.0));
                let got = transfer_share_during(&timeline, kind);
                match (got, want) {
                    (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "case {case}: {g} vs {w}"),
                    _ => assert_eq!(got, want, "case {case}"),
                }
            }
        }
    }

    #[test]
    fn overlapping_intervals_of_one_kind_count_once() {
        let timeline = [
            iv(IntervalKind::Compute, 0.0, 2.0),
            iv(IntervalKind::Compute, 1.0, 3.0),
            iv(IntervalKind::Wire, 0.0, 4.0),
        ];
        let f = hidden_transfer_fraction(&timeline).unwrap();
        assert!((f - 0.75).abs() < 1e-12, "{f}");
    }
}
