//! Per-rank memory accounting of the tensors the decorator holds.
//!
//! Every tensor the decorator creates carries a [`Charge`]; the charge is released when the
//! last handle to it drops. When an op consumes a uniquely held input of the same size, the
//! charge moves to the output, as the inner backend reuses the buffer in that case.

use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

/// The inner backend's float tensor: what the ledger counts.
pub(crate) type Float<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

/// Bytes of tensors of the given shapes with `elem`-byte elements: the one byte count that
/// charges, messages and the planner share.
pub(crate) fn bytes_of_shapes(shapes: &[Vec<usize>], elem: usize) -> usize {
    shapes
        .iter()
        .map(|s| s.iter().product::<usize>() * elem)
        .sum()
}

/// Bytes of one tensor's elements.
pub(crate) fn bytes_of<T: TensorMetadata>(t: &T) -> usize {
    bytes_of_shapes(&[t.shape().to_vec()], t.dtype().size())
}

/// Charges inner tensors that an op holds only briefly (partial results) as local memory.
pub(crate) fn transient<B: Backend>(ledger: &Arc<Ledger>, tensors: &[Float<B>]) -> Arc<Charge> {
    ledger.charge(Category::Local, tensors.iter().map(bytes_of).sum())
}

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

/// The two phases of a training step whose peaks the ledger keeps apart, because they are
/// made of different things: the forward and backward passes hold activations, the update
/// holds the whole model state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// From the end of one update to the start of the next: forward and backward.
    Compute,
    /// Inside the optimizer's update.
    Update,
}

/// Live and peak bytes per category of one rank.
#[derive(Debug, Default)]
pub struct Ledger {
    live: [AtomicI64; 3],
    peak: [AtomicI64; 3],
    total_live: AtomicI64,
    total_peak: AtomicI64,
    /// Each category's live bytes at the moment the total last reached its peak: what the
    /// peak is made of, which the memory planner scales to other world sizes.
    at_peak: Mutex<[i64; 3]>,
    /// The peak of the current phase (see [`Phase`]) and its make-up.
    window_peak: AtomicI64,
    window_at: Mutex<[i64; 3]>,
    /// The highest peak of each phase so far, with its make-up.
    phases: Mutex<[MemoryStats; 2]>,
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
        // At a new peak, remember its make-up (read after the fact, so approximate when
        // another thread charges this rank at the same instant).
        let snapshot = || [0, 1, 2].map(|i| self.live[i].load(Ordering::Acquire));
        if total > self.total_peak.fetch_max(total, Ordering::AcqRel) {
            *self.at_peak.lock().unwrap_or_else(|e| e.into_inner()) = snapshot();
        }
        if total > self.window_peak.fetch_max(total, Ordering::AcqRel) {
            *self.window_at.lock().unwrap_or_else(|e| e.into_inner()) = snapshot();
        }
    }

    /// Ends the current phase: if its peak is the highest of `phase` so far, it becomes that
    /// phase's peak. The next phase starts at the current live level.
    pub fn end_phase(&self, phase: Phase) {
        let mut at = self.window_at.lock().unwrap_or_else(|e| e.into_inner());
        let total = self.window_peak.load(Ordering::Acquire);
        let slot = match phase {
            Phase::Compute => 0,
            Phase::Update => 1,
        };
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        if total.max(0) as u64 > phases[slot].total {
            let get = |v: i64| v.max(0) as u64;
            phases[slot] = MemoryStats {
                sharded: get(at[0]),
                local: get(at[1]),
                in_flight: get(at[2]),
                total: get(total),
            };
        }
        *at = [0, 1, 2].map(|i| self.live[i].load(Ordering::Acquire));
        self.window_peak
            .store(self.total_live.load(Ordering::Acquire), Ordering::Release);
    }

    /// The make-up of the highest peak of each phase since the last reset: `(compute,
    /// update)`. [`RtpOptimizer`](crate::RtpOptimizer) marks the phases; without it both
    /// are empty.
    pub fn phase_peaks(&self) -> (MemoryStats, MemoryStats) {
        let phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        (phases[0], phases[1])
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

    /// What the highest total since the last reset was made of: each category's live bytes
    /// at that moment (`total` is the peak itself).
    pub fn at_peak(&self) -> MemoryStats {
        let at = *self.at_peak.lock().unwrap_or_else(|e| e.into_inner());
        let get = |v: i64| v.max(0) as u64;
        MemoryStats {
            sharded: get(at[0]),
            local: get(at[1]),
            in_flight: get(at[2]),
            total: self.total_peak.load(Ordering::Acquire).max(0) as u64,
        }
    }

    /// Starts a new peak window at the current live level.
    pub fn reset_peak(&self) {
        let live = [0, 1, 2].map(|i| self.live[i].load(Ordering::Acquire));
        *self.at_peak.lock().unwrap_or_else(|e| e.into_inner()) = live;
        *self.window_at.lock().unwrap_or_else(|e| e.into_inner()) = live;
        *self.phases.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
        self.window_peak
            .store(self.total_live.load(Ordering::Acquire), Ordering::Release);
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

/// Reads a byte count as people write it: `64MiB`, `2 GiB`, `1.5GB`, `500kB`, `4096`.
/// Binary units (`KiB`, `MiB`, `GiB`, `TiB`) are powers of 1024, decimal ones (`kB`, `MB`,
/// `GB`, `TB`) powers of 1000.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a byte count such as 64MiB or 2GB"))?;
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "t" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`: use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB"
            ))
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(format!("`{text}` must be at least one byte"));
    }
    Ok(bytes.round() as u64)
}

fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// This process's peak resident set (`VmHWM` in `/proc/self/status`): the operating system's
/// own figure, to stand beside the ledger's. `None` where the kernel does not report it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_kib("VmHWM:").map(|kib| kib * 1024)
}

/// The minor page faults this process has taken so far (`minflt`, the tenth field of
/// `/proc/self/stat`): each is a page the kernel had to map on first touch, which a VM pays
/// dearly for. The difference across steps says whether the steady state allocates fresh
/// pages. `None` where the kernel does not report it.
pub fn minor_page_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from its end.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(7)?.parse().ok()
}

/// An inner tensor outside any wrapper (taken out for an op, gathered, or assembled), still
/// charged to its rank: the ledger must see every buffer an op keeps alive, not only those
/// wrapped in an [`RtpTensor`]. The charge ends when the `Held` drops.
pub(crate) struct Held<B: Backend> {
    tensor: Float<B>,
    charge: Arc<Charge>,
}

impl<B: Backend> std::ops::Deref for Held<B> {
    type Target = Float<B>;

    fn deref(&self) -> &Float<B> {
        &self.tensor
    }
}

impl<B: Backend> Held<B> {
    /// Charges a freshly computed inner tensor to `cat` on `ledger`.
    pub(crate) fn new(ledger: &Arc<Ledger>, tensor: Float<B>, cat: Category) -> Self {
        let charge = ledger.charge(cat, bytes_of(&tensor));
        Self { tensor, charge }
    }

    /// A handle to the tensor for an op that reads it; the charge stays with `self`.
    pub(crate) fn get(&self) -> Float<B> {
        self.tensor.clone()
    }

    /// Gives the tensor to `f`, which consumes it, and releases the charge only once `f`
    /// returned (and charged its result), so the input and the output are never both unseen.
    pub(crate) fn consume<R>(self, f: impl FnOnce(Float<B>) -> R) -> R {
        let Held { tensor, charge } = self;
        let out = f(tensor);
        drop(charge);
        out
    }

    /// Ends the charge and returns the tensor, for a result that leaves the decorator (host
    /// data read out of it): from here on it is not the rank's device memory to count.
    pub(crate) fn release(self) -> Float<B> {
        self.tensor
    }

    /// A tensor with the charge it already carries (taken out of a wrapper).
    pub(crate) fn from_parts(tensor: Float<B>, charge: Arc<Charge>) -> Self {
        Self { tensor, charge }
    }

    /// Applies an op that returns a tensor of the same size (an in-place update on backends
    /// that reuse a uniquely held buffer), keeping the charge.
    pub(crate) fn map(self, f: impl FnOnce(Float<B>) -> Float<B>) -> Self {
        let Held { tensor, charge } = self;
        let out = f(tensor);
        debug_assert_eq!(bytes_of(&out), charge.bytes(), "Held::map changed the size");
        Self {
            tensor: out,
            charge,
        }
    }

    /// A second handle to the same tensor under the same charge: the bytes are counted once,
    /// until the last handle drops.
    pub(crate) fn share(&self) -> Self {
        Self {
            tensor: self.tensor.clone(),
            charge: self.charge.clone(),
        }
    }

    /// Whether `other` is a handle to the same charge (the same tensor or a clone of it).
    pub(crate) fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.charge, &other.charge)
    }

    /// Whether this is the only handle to the tensor's charge (no wrapper or other `Held`
    /// holds it any more).
    pub(crate) fn alone(&self) -> bool {
        Arc::strong_count(&self.charge) == 1
    }

    /// What the tensor is charged as.
    pub(crate) fn category(&self) -> Category {
        self.charge.category()
    }

    /// Splits into the tensor and its charge, for a wrapper that takes the charge over.
    pub(crate) fn into_parts(self) -> (Float<B>, Arc<Charge>) {
        (self.tensor, self.charge)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_read_as_written() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("MiB").is_err());
    }

    #[test]
    fn the_make_up_of_the_peak_is_remembered() {
        let ledger = Ledger::new();
        let a = ledger.charge(Category::Sharded, 100);
        let b = ledger.charge(Category::Local, 40);
        drop(b);
        let _c = ledger.charge(Category::InFlight, 10);
        let at = ledger.at_peak();
        assert_eq!(
            (at.sharded, at.local, at.in_flight, at.total),
            (100, 40, 0, 140)
        );
        drop(a);
        ledger.reset_peak();
        assert_eq!(ledger.at_peak().in_flight, 10);
    }

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
