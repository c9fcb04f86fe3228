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
    let transfer = if intervals.iter().any(|i| i.kind == IntervalKind::Wire) {
        IntervalKind::Wire
    } else {
        IntervalKind::Transfer
    };
    let mut compute: Vec<(f64, f64)> = intervals
        .iter()
        .filter(|i| i.kind == IntervalKind::Compute)
        .map(|i| (i.start, i.end))
        .collect();
    compute.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut hidden = 0.0;
    for t in intervals.iter().filter(|i| i.kind == transfer) {
        total += t.end - t.start;
        for (s, e) in &compute {
            let overlap = t.end.min(*e) - t.start.max(*s);
            if overlap > 0.0 {
                hidden += overlap;
            }
        }
    }
    (total > 0.0).then(|| (hidden / total).min(1.0))
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
}
