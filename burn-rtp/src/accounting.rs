//! Per-rank memory accounting of the tensors the decorator holds.
//!
//! Every tensor the decorator creates carries a [`Charge`]; the charge is released when the
//! last handle to it drops. When an op consumes a uniquely held input of the same size, the
//! charge moves to the output, as the inner backend reuses the buffer in that case.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// What a tensor is, for accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// Persistent model state: parameter shards, their gradients and optimizer state.
    Sharded,
    /// Activations and temporaries.
    Local,
    /// Rotation buffers: shards and travelling gradients of other ranks.
    InFlight,
}

const CATEGORIES: [Category; 3] = [Category::Sharded, Category::Local, Category::InFlight];

fn slot(cat: Category) -> usize {
    match cat {
        Category::Sharded => 0,
        Category::Local => 1,
        Category::InFlight => 2,
    }
}

/// Live and peak bytes per category of one rank.
#[derive(Debug, Default)]
pub struct Ledger {
    live: [AtomicI64; 3],
    peak: [AtomicI64; 3],
    total_live: AtomicI64,
    total_peak: AtomicI64,
    rank: usize,
    cap: Option<u64>,
}

/// A snapshot of one rank's memory, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryStats {
    /// Persistent model state (parameters, gradients, optimizer state).
    pub sharded: u64,
    /// Activations and temporaries.
    pub local: u64,
    /// Rotation buffers.
    pub in_flight: u64,
    /// All three at once (the peak of the sum, not the sum of the peaks).
    pub total: u64,
}

impl Ledger {
    /// Creates an empty ledger.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Creates the ledger of `rank`, which refuses to hold more than `cap` bytes at once.
    pub fn for_rank(rank: usize, cap: Option<u64>) -> Arc<Self> {
        Arc::new(Self {
            rank,
            cap,
            ..Self::default()
        })
    }

    fn add(&self, cat: Category, bytes: i64) {
        let i = slot(cat);
        let now = self.live[i].fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.peak[i].fetch_max(now, Ordering::AcqRel);
        let total = self.total_live.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.total_peak.fetch_max(total, Ordering::AcqRel);
    }

    /// Charges `bytes` to `cat` until the returned charge drops.
    ///
    /// A ledger with a cap raises [`RtpError::OutOfMemory`](crate::RtpError::OutOfMemory)
    /// instead of going over it, as a device would fail an allocation.
    pub fn charge(self: &Arc<Self>, cat: Category, bytes: usize) -> Arc<Charge> {
        if let Some(cap) = self.cap {
            let live = self.total_live.load(Ordering::Acquire).max(0) as u64;
            if live + bytes as u64 > cap {
                crate::error::raise(crate::RtpError::OutOfMemory {
                    rank: self.rank,
                    requested: bytes as u64,
                    live,
                    cap,
                });
            }
        }
        self.add(cat, bytes as i64);
        Arc::new(Charge {
            ledger: self.clone(),
            cat,
            bytes: bytes as i64,
        })
    }

    /// Bytes held right now.
    pub fn live(&self) -> MemoryStats {
        self.read(&self.live, &self.total_live)
    }

    /// Highest bytes held since the last reset.
    pub fn peak(&self) -> MemoryStats {
        self.read(&self.peak, &self.total_peak)
    }

    /// Starts a new peak window at the current live level.
    pub fn reset_peak(&self) {
        for cat in CATEGORIES {
            let i = slot(cat);
            self.peak[i].store(self.live[i].load(Ordering::Acquire), Ordering::Release);
        }
        self.total_peak
            .store(self.total_live.load(Ordering::Acquire), Ordering::Release);
    }

    fn read(&self, per: &[AtomicI64; 3], total: &AtomicI64) -> MemoryStats {
        let get = |a: &AtomicI64| a.load(Ordering::Acquire).max(0) as u64;
        MemoryStats {
            sharded: get(&per[0]),
            local: get(&per[1]),
            in_flight: get(&per[2]),
            total: get(total),
        }
    }
}

/// Bytes held by one buffer; released on drop.
#[derive(Debug)]
pub struct Charge {
    ledger: Arc<Ledger>,
    cat: Category,
    bytes: i64,
}

impl Charge {
    /// The category charged.
    pub fn category(&self) -> Category {
        self.cat
    }

    /// The bytes charged.
    pub fn bytes(&self) -> usize {
        self.bytes as usize
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.ledger.add(self.cat, -self.bytes);
    }
}

/// Formats a byte count for people: `1.50 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// This process's peak resident set (`VmHWM` in `/proc/self/status`): the operating system's
/// own figure, to stand beside the ledger's. `None` where the kernel does not report it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_release_on_drop_and_peaks_stay() {
        let ledger = Ledger::new();
        let a = ledger.charge(Category::Sharded, 100);
        let b = ledger.charge(Category::InFlight, 50);
        assert_eq!(ledger.live().total, 150);
        drop(a);
        assert_eq!(ledger.live().sharded, 0);
        assert_eq!(ledger.peak().sharded, 100);
        assert_eq!(ledger.peak().total, 150);
        drop(b);
        ledger.reset_peak();
        assert_eq!(ledger.peak(), MemoryStats::default());
    }

    #[test]
    fn human_bytes_picks_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024), "3.00 MiB");
    }
}
